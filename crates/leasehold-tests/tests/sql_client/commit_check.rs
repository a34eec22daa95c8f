//! The check a fenced transaction runs before its commit: it reads the server's clock when it runs, not when the
//! transaction began, and the share lock it takes holds a takeover off until the transaction ends.

use std::time::Duration;

use leasehold::mysql_async::prelude::Queryable;
use leasehold::tokio_postgres::types::{ToSql, Type};
use leasehold::{mysql_async, tokio_postgres, Error, Guard, SqlCommitCheck};

use crate::admin::{on_table, Admin};
use crate::{client_with, Db, EVENT};

/// Sessions of two minutes: no renewal of the library's tells the holder anything while the test runs.
const MINUTES: Duration = Duration::from_secs(120);

/// A fresh `checked_writes` table.
fn empty_table(db: &Db) {
    db.sql("CREATE TABLE IF NOT EXISTS checked_writes (writer VARCHAR(64) NOT NULL)");
    db.sql("DELETE FROM checked_writes");
}

pub async fn a_transaction_checked_after_the_expiry_is_refused(db: &mut Db) {
    empty_table(db);
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let a = client_with(&url, &prefix, MINUTES).await;
    let held = a.mutex("late-commit").lock().await.unwrap();
    let lease = held.lease();
    let id = held.sql_commit_check().unwrap().session;
    let mut admin = Admin::connect(db).await;
    // The transaction begins while the session is live; the session then expires on the server's clock (its client,
    // renewing every 30 s, does not know), and only then does the transaction ask to commit.
    let mut conn = Admin::connect(db).await;
    let tx = writing(&mut conn, "late").await;
    admin.set_expiry(&prefix, &id, 0).await;
    assert!(lease.is_held(), "{:?}", lease.loss());
    let committed = tx.commit_under(&held).await;
    assert!(
        matches!(committed, Err(Error::LeaseLost { .. })),
        "a transaction checked after the session expired: {committed:?}"
    );
    assert_eq!(db.sql("SELECT count(*) FROM checked_writes").trim(), "0");
}

pub async fn the_commit_check_holds_a_takeover_off_until_the_commit(db: &mut Db) {
    empty_table(db);
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let a = client_with(&url, &prefix, MINUTES).await;
    let held = a.mutex("held-off").lock().await.unwrap();
    let check = held.sql_commit_check().unwrap();
    let id = check.session.clone();
    let mut watcher = Admin::connect(db).await;
    let mut taker = Admin::connect(db).await;
    // The check passed, the commit is still to come; a takeover (the delete of the holder's session, whose entry goes
    // with it) must wait for the transaction.
    let delete = on_table(db, "DELETE FROM", &prefix, "session");
    let takeover = format!("{delete} WHERE id = '{id}'");
    let mut conn = Admin::connect(db).await;
    let mut tx = writing(&mut conn, "holder").await;
    assert!(tx.check(&check).await, "the check found the live grant");
    let taking = tokio::spawn(async move { taker.run(&takeover).await });
    wait_held_off(&mut watcher, &delete, &taking).await;
    tx.commit().await;
    tokio::time::timeout(EVENT, taking).await.unwrap().unwrap();
    assert_eq!(db.sql("SELECT writer FROM checked_writes").trim(), "holder");
    assert!(watcher.expiry(&prefix, &id).await.is_none(), "taken over");
    drop(held);
}

/// Waits until the takeover `taking` (a statement containing `delete`) waits for a lock, and panics if it finished
/// first (it did not wait) or never waits.
async fn wait_held_off(watcher: &mut Admin, delete: &str, taking: &tokio::task::JoinHandle<()>) {
    let deadline = tokio::time::Instant::now() + EVENT;
    loop {
        let waits = watcher.running(delete, true).await >= 1;
        assert!(
            !taking.is_finished(),
            "the takeover did not wait for the transaction"
        );
        if waits {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "the takeover never waited; the server runs:\n{}",
                watcher.activity().await
            );
        }
        tokio::time::sleep(watcher.poll()).await;
    }
}

/// A transaction of the caller's, on a connection of its own.
enum UserTx<'a> {
    Postgres(tokio_postgres::Transaction<'a>),
    MySql(mysql_async::Transaction<'a>),
}

/// A transaction on `conn` that has inserted `writer` into `checked_writes`.
async fn writing<'a>(conn: &'a mut Admin, writer: &str) -> UserTx<'a> {
    let insert = format!("INSERT INTO checked_writes (writer) VALUES ('{writer}')");
    match conn {
        Admin::Postgres(client) => {
            let tx = client.transaction().await.unwrap();
            tx.batch_execute(&insert).await.unwrap();
            UserTx::Postgres(tx)
        }
        Admin::MySql(conn) => {
            let mut tx = conn
                .start_transaction(mysql_async::TxOpts::default())
                .await
                .unwrap();
            tx.query_drop(insert).await.unwrap();
            UserTx::MySql(tx)
        }
    }
}

impl UserTx<'_> {
    /// Runs the grant's commit `check` as a driver of the caller's own would: whether it found the grant live.
    async fn check(&mut self, check: &SqlCommitCheck) -> bool {
        match self {
            UserTx::Postgres(tx) => {
                let params: [(&(dyn ToSql + Sync), Type); 3] = [
                    (&check.name, Type::TEXT),
                    (&check.fence, Type::INT8),
                    (&check.session, Type::TEXT),
                ];
                !tx.query_typed(&check.statement, &params)
                    .await
                    .unwrap()
                    .is_empty()
            }
            UserTx::MySql(tx) => {
                let row: Option<i64> = tx
                    .exec_first(
                        &check.statement,
                        (check.name.as_bytes(), check.fence, check.session.as_str()),
                    )
                    .await
                    .unwrap();
                row.is_some()
            }
        }
    }

    async fn commit(self) {
        match self {
            UserTx::Postgres(tx) => tx.commit().await.unwrap(),
            UserTx::MySql(tx) => tx.commit().await.unwrap(),
        }
    }

    /// Commits through `guard`'s fenced commit.
    async fn commit_under(self, guard: &Guard) -> Result<(), Error> {
        match self {
            UserTx::Postgres(tx) => guard.commit_postgres(tx).await,
            UserTx::MySql(tx) => guard.commit_mysql(tx).await,
        }
    }
}
