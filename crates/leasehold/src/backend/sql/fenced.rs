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

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::capability::Capability;
use crate::error::Error;
use crate::kinds::guard::Guard;
use crate::kinds::store::SessionHold;
use crate::LossReason;

/// The check of a fenced transaction, for a driver of your own ([`Guard::sql_commit_check`]): run
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

impl Guard {
    /// The SQL side of this grant, if the lock is in a SQL database.
    fn sql_hold(&self) -> Option<&crate::backend::session::Hold<super::store::Sql>> {
        match self.session_hold() {
            Some(SessionHold::Sql(hold)) => Some(hold),
            _ => None,
        }
    }

    /// `Err(LeaseLost)` when the lease already ended here.
    fn still_held(&self) -> Result<(), Error> {
        match self.lease().loss() {
            Some(reason) => Err(Error::LeaseLost {
                name: self.lease().name().to_owned(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// The statement a transaction of your own runs last, to commit only while this grant is live (the check
    /// [`commit_postgres`](Guard::commit_postgres) and [`commit_mysql`](Guard::commit_mysql) run, for another driver,
    /// `sqlx` say). `None` unless the lock is in a SQL database.
    pub fn sql_commit_check(&self) -> Option<SqlCommitCheck> {
        let hold = self.sql_hold()?;
        let shared = &hold.session.shared;
        Some(SqlCommitCheck {
            statement: shared.conn.db.commit_check().to_owned(),
            name: hold.grant.name.clone(),
            fence: hold.grant.fence,
            session: shared.conn.id.clone(),
        })
    }

    /// Commits `transaction`, your own transaction on your own PostgreSQL connection, only while this grant is live:
    /// its last statement checks the grant's entry and locks it against a takeover until the commit (see the crate
    /// docs, "The fenced transaction"). Your writes then never land after another holder was granted, however long
    /// the transaction ran or the process was paused (feature `postgres`).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the lease ended here or the check found the grant gone or expired on the server's
    /// clock: the transaction is rolled back. [`Error::Store`] when the check or the commit failed (a serialization
    /// failure at `REPEATABLE READ` if a takeover raced the transaction): nothing was committed, unless the commit
    /// itself was sent and its answer lost. [`Error::Unsupported`] unless the lock is on PostgreSQL
    /// ([`Capability::PostgresTransaction`](crate::Capability::PostgresTransaction); the transaction is rolled back).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use leasehold::tokio_postgres::{self, NoTls};
    ///
    /// let url = "postgres://app@db.internal/shop";
    /// let locks = leasehold::Client::connect(url).await?;
    /// let (mut db, connection) = tokio_postgres::connect(url, NoTls).await?;
    /// tokio::spawn(connection);
    ///
    /// let guard = locks.mutex("stock:42").lock().await?;
    /// let tx = db.transaction().await?;
    /// tx.execute("UPDATE stock SET units = units - 1 WHERE id = 42", &[]).await?;
    /// guard.commit_postgres(tx).await?; // commits only while the lock is still ours
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub async fn commit_postgres(
        &self,
        transaction: tokio_postgres::Transaction<'_>,
    ) -> Result<(), Error> {
        use tokio_postgres::types::Type;
        crate::error::require_runtime()?;
        let check = match self.check_on(Capability::PostgresTransaction) {
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
            Ok(rows) if !rows.is_empty() => transaction.commit().await.map_err(user_error),
            Ok(_) => {
                let _ = transaction.rollback().await;
                Err(self.gone())
            }
            Err(e) => {
                let _ = transaction.rollback().await;
                Err(user_error(e))
            }
        }
    }

    /// Commits `transaction`, your own transaction on your own MySQL or MariaDB connection, only while this grant is
    /// live: as [`commit_postgres`](Guard::commit_postgres), with `LOCK IN SHARE MODE` (feature `mysql`).
    ///
    /// # Errors
    ///
    /// As [`commit_postgres`](Guard::commit_postgres); [`Error::Unsupported`] unless the lock is in MySQL or MariaDB
    /// ([`Capability::MysqlTransaction`](crate::Capability::MysqlTransaction)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use leasehold::mysql_async::{prelude::Queryable, Pool, TxOpts};
    ///
    /// let url = "mysql://app@db.internal/shop";
    /// let locks = leasehold::Client::connect(url).await?;
    /// let mut db = Pool::new(url).get_conn().await?;
    ///
    /// let guard = locks.mutex("stock:42").lock().await?;
    /// let mut tx = db.start_transaction(TxOpts::default()).await?;
    /// tx.query_drop("UPDATE stock SET units = units - 1 WHERE id = 42").await?;
    /// guard.commit_mysql(tx).await?; // commits only while the lock is still ours
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "mysql")]
    pub async fn commit_mysql(
        &self,
        mut transaction: mysql_async::Transaction<'_>,
    ) -> Result<(), Error> {
        use mysql_async::prelude::Queryable;
        crate::error::require_runtime()?;
        let check = match self.check_on(Capability::MysqlTransaction) {
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
            Ok(Some(_)) => transaction.commit().await.map_err(user_error),
            Ok(None) => {
                let _ = transaction.rollback().await;
                Err(self.gone())
            }
            Err(e) => {
                let _ = transaction.rollback().await;
                Err(user_error(e))
            }
        }
    }

    /// The commit check, when the lock's store supports `capability` (the fenced transaction of one database) and
    /// its lease has not ended here.
    fn check_on(&self, capability: Capability) -> Result<SqlCommitCheck, Error> {
        self.client()
            .store
            .require(capability, self.lease().name())?;
        self.still_held()?;
        self.sql_commit_check().ok_or_else(|| self.gone())
    }

    /// The error of a check that found the grant gone or expired.
    fn gone(&self) -> Error {
        Error::LeaseLost {
            name: self.lease().name().to_owned(),
            reason: self.lease().loss().unwrap_or(LossReason::Gone),
        }
    }
}
