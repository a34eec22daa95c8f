//! The fenced transaction: the caller's own transaction, on the caller's own connection, commits only while the
//! grant is live.

use std::time::Duration;

use leasehold::{Client, Error, LossReason};
use leasehold_tests::TcpProxy;

use crate::faults::fenced_insert;
use crate::{client, Db, EVENT};

/// A fresh `fenced_writes` table.
fn empty_table(db: &Db) {
    db.sql("CREATE TABLE IF NOT EXISTS fenced_writes (writer VARCHAR(64) NOT NULL)");
    db.sql("DELETE FROM fenced_writes");
}

pub async fn a_transaction_commits_while_the_grant_is_live(db: &mut Db) {
    empty_table(db);
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let a = client(&url, &prefix).await;
    let held = a.mutex("txn").lock().await.unwrap();
    let check = held
        .sql_commit_check()
        .expect("a SQL grant has a commit check");
    assert_eq!(check.fence, i64::try_from(held.fence().get()).unwrap());
    fenced_insert(db, &url, &held, "holder").await.unwrap();
    assert_eq!(db.sql("SELECT writer FROM fenced_writes").trim(), "holder");
    // Force-released by an operator while the holder still believes it holds (a session of a minute: no renewal
    // tells it in between), the next transaction is refused by the server's check, and rolled back.
    let slow = Client::builder(&url)
        .unwrap()
        .prefix(&prefix)
        .session_ttl(Duration::from_secs(60))
        .connect()
        .await
        .unwrap();
    let held = slow.mutex("txn2").lock().await.unwrap();
    assert!(a.force_release("txn2").await.unwrap().is_some());
    assert!(held.is_held(), "no renewal ran in between");
    match fenced_insert(db, &url, &held, "forced-out").await {
        Err(Error::LeaseLost { reason, .. }) => assert_eq!(reason, LossReason::Gone),
        other => panic!("{other:?}"),
    }
    assert_eq!(db.sql("SELECT count(*) FROM fenced_writes").trim(), "1");
}

pub async fn a_transaction_outliving_the_lease_cannot_commit(db: &mut Db) {
    db.sql(
        "CREATE TABLE IF NOT EXISTS fenced_rows (id INT PRIMARY KEY, writer VARCHAR(64) NOT NULL)",
    );
    db.sql("DELETE FROM fenced_rows");
    db.sql("INSERT INTO fenced_rows (id, writer) VALUES (1, 'nobody')");
    let prefix = db.fresh_prefix();
    // The holder's library connections go through a proxy; its transaction does not.
    let proxy = TcpProxy::start(db.addr()).await;
    let a = client(&db.url_at(proxy.addr()), &prefix).await;
    let b = client(&db.url(), &prefix).await;
    let held = a.mutex("long").lock().await.unwrap();
    let lease = held.lease();
    let url = db.url();
    match db {
        Db::Postgres(_) => {
            use leasehold::tokio_postgres;
            let connect = || tokio_postgres::connect(&url, tokio_postgres::NoTls);
            let (mut mine, connection) = connect().await.unwrap();
            tokio::spawn(connection);
            let tx = mine.transaction().await.unwrap();
            tx.execute("UPDATE fenced_rows SET writer = 'stale' WHERE id = 1", &[])
                .await
                .unwrap();
            // The lease runs out while the transaction is open: the holder is cut off, the next holder is granted
            // and queues its own update behind the open transaction's row lock.
            proxy.blackhole();
            let next = b.mutex("long").lock_timeout(EVENT).await.unwrap();
            assert!(!lease.is_held());
            let theirs = tokio::spawn(async move {
                let (mut conn, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                let tx = conn.transaction().await.unwrap();
                tx.execute("UPDATE fenced_rows SET writer = 'fresh' WHERE id = 1", &[])
                    .await
                    .unwrap();
                next.commit_postgres(tx).await.unwrap();
                next
            });
            assert!(matches!(
                held.commit_postgres(tx).await,
                Err(Error::LeaseLost { .. })
            ));
            let next = tokio::time::timeout(EVENT, theirs).await.unwrap().unwrap();
            next.release().await.unwrap();
        }
        Db::MySql(_) => {
            use leasehold::mysql_async::prelude::Queryable;
            use leasehold::mysql_async::{Pool, TxOpts};
            let pool = Pool::new(url.as_str());
            let mut mine = pool.get_conn().await.unwrap();
            let mut tx = mine.start_transaction(TxOpts::default()).await.unwrap();
            tx.query_drop("UPDATE fenced_rows SET writer = 'stale' WHERE id = 1")
                .await
                .unwrap();
            proxy.blackhole();
            let next = b.mutex("long").lock_timeout(EVENT).await.unwrap();
            assert!(!lease.is_held());
            let theirs = tokio::spawn({
                let pool = pool.clone();
                async move {
                    let mut conn = pool.get_conn().await.unwrap();
                    let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
                    tx.query_drop("UPDATE fenced_rows SET writer = 'fresh' WHERE id = 1")
                        .await
                        .unwrap();
                    next.commit_mysql(tx).await.unwrap();
                    next
                }
            });
            assert!(matches!(
                held.commit_mysql(tx).await,
                Err(Error::LeaseLost { .. })
            ));
            let next = tokio::time::timeout(EVENT, theirs).await.unwrap().unwrap();
            next.release().await.unwrap();
        }
    }
    assert_eq!(
        db.sql("SELECT writer FROM fenced_rows WHERE id = 1").trim(),
        "fresh"
    );
}
