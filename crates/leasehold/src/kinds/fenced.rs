//! The fenced transaction on a [`Guard`]: the user's own transaction, on the user's own connection, committed only
//! while the grant is live (how, and the statements that do it: `backend/sql/fenced.rs`). Here the guard's side: the
//! refusal on a store without it, the lease's state, and the error of a grant found gone; the store runs the check.

use crate::backend::session::Hold;
use crate::backend::sql::fenced::{self, SqlCommitCheck};
use crate::backend::sql::store::Sql;
use crate::capability::Capability;
use crate::error::Error;
use crate::kinds::guard::Guard;
use crate::kinds::store::SessionHold;
use crate::LossReason;

impl Guard {
    /// The SQL side of this grant, if the lock is in a SQL database.
    fn sql_hold(&self) -> Option<&Hold<Sql>> {
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
        self.sql_hold().map(SqlCommitCheck::of)
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
        crate::error::require_runtime()?;
        let check = self.check_on(Capability::PostgresTransaction);
        if fenced::commit_postgres(transaction, check).await? {
            Ok(())
        } else {
            Err(self.gone())
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
        transaction: mysql_async::Transaction<'_>,
    ) -> Result<(), Error> {
        crate::error::require_runtime()?;
        let check = self.check_on(Capability::MysqlTransaction);
        if fenced::commit_mysql(transaction, check).await? {
            Ok(())
        } else {
            Err(self.gone())
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
