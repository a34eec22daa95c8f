//! The fenced transaction: the user's own transaction, on the user's own connection, committed only while the grant
//! is live, which no other store can offer: the data and the lock live in one database, so the check and the commit
//! are one step.
//!
//! Just before the commit, the transaction runs one statement that finds the grant's entry in the lease table with
//! its session unexpired on the server's clock, and locks that entry in share mode. The lock is what closes the gap
//! between the check and the commit: another client takes the lock over only by deleting the entry (see
//! [`super`]), and that delete waits for the share lock, that is for this transaction to end. So the transaction
//! commits while the grant is live, or the check fails and it is rolled back: its writes never land after another
//! holder was granted. The check reads the clock at the moment it runs (`clock_timestamp()` on PostgreSQL,
//! `UTC_TIMESTAMP(6)` on MySQL), not at the transaction's start.
//!
//! Here: the check of a grant and the statements that run it in the caller's transaction. The guard's methods that
//! call them (`Guard::commit_postgres`, `Guard::commit_mysql`, `Guard::sql_commit_check`) are in `kinds/fenced.rs`.

use super::store::Sql;
use crate::backend::session::Hold;
use crate::error::Error;

/// The check of a fenced transaction, for a driver of your own ([`Guard::sql_commit_check`](crate::Guard::sql_commit_check)): run
/// [`statement`](Self::statement) with the parameters [`name`](Self::name), [`fence`](Self::fence) and
/// [`session`](Self::session) (in that order) as the last statement of your transaction, and commit only when it
/// returned a row; otherwise roll back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlCommitCheck {
    /// The statement, with the dialect's placeholders (`$1`… on PostgreSQL, `?` on MySQL).
    pub statement: String,
    /// The lock's name (a text parameter on PostgreSQL; bytes on MySQL, whose names are `VARBINARY`).
    pub name: String,
    /// The grant's fence (a 64-bit integer parameter).
    pub fence: i64,
    /// The client's session id (a text parameter).
    pub session: String,
}

impl SqlCommitCheck {
    /// The check of the grant `hold`.
    pub(crate) fn of(hold: &Hold<Sql>) -> SqlCommitCheck {
        let shared = &hold.session.shared;
        SqlCommitCheck {
            statement: shared.conn.db.commit_check().to_owned(),
            name: hold.grant.name.clone(),
            fence: hold.grant.fence,
            session: shared.conn.id.clone(),
        }
    }
}

/// Runs `check` as the last statement of `transaction`, the caller's, and commits it when the check found the grant
/// live: `Ok(true)`. `Ok(false)` when it found the grant gone or expired, and `Err` when the check or the commit
/// failed: the transaction is rolled back (a `check` that is already an error, a refusal, rolls it back at once).
#[cfg(feature = "postgres")]
pub(crate) async fn commit_postgres(
    transaction: tokio_postgres::Transaction<'_>,
    check: Result<SqlCommitCheck, Error>,
) -> Result<bool, Error> {
    use tokio_postgres::types::Type;
    let check = match check {
        Ok(check) => check,
        Err(e) => {
            let _ = transaction.rollback().await;
            return Err(e);
        }
    };
    let user_error = |source: tokio_postgres::Error| Error::Store {
        store: "postgres",
        url: "(the caller's transaction)".to_owned(),
        source: Box::new(source),
    };
    let rows = transaction
        .query_typed(
            &check.statement,
            &[
                (&check.name, Type::TEXT),
                (&check.fence, Type::INT8),
                (&check.session, Type::TEXT),
            ],
        )
        .await;
    match rows {
        Ok(rows) if !rows.is_empty() => transaction
            .commit()
            .await
            .map(|()| true)
            .map_err(user_error),
        Ok(_) => {
            let _ = transaction.rollback().await;
            Ok(false)
        }
        Err(e) => {
            let _ = transaction.rollback().await;
            Err(user_error(e))
        }
    }
}

/// As `commit_postgres`, on MySQL or MariaDB, with `LOCK IN SHARE MODE`.
#[cfg(feature = "mysql")]
pub(crate) async fn commit_mysql(
    mut transaction: mysql_async::Transaction<'_>,
    check: Result<SqlCommitCheck, Error>,
) -> Result<bool, Error> {
    use mysql_async::prelude::Queryable;
    let check = match check {
        Ok(check) => check,
        Err(e) => {
            let _ = transaction.rollback().await;
            return Err(e);
        }
    };
    let user_error = |source: mysql_async::Error| Error::Store {
        store: "mysql",
        url: "(the caller's transaction)".to_owned(),
        source: Box::new(source),
    };
    let row: Result<Option<i64>, _> = transaction
        .exec_first(
            &check.statement,
            (check.name.as_bytes(), check.fence, check.session.as_str()),
        )
        .await;
    match row {
        Ok(Some(_)) => transaction
            .commit()
            .await
            .map(|()| true)
            .map_err(user_error),
        Ok(None) => {
            let _ = transaction.rollback().await;
            Ok(false)
        }
        Err(e) => {
            let _ = transaction.rollback().await;
            Err(user_error(e))
        }
    }
}
