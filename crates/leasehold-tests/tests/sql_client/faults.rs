//! The database's own faults: a crash and restart, connections killed by the server, a holder frozen past its lease,
//! and the wake-up of a waiter in another client.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use leasehold::Client;
use leasehold_tests::ChildGuard;
use nix::sys::signal::Signal;

use crate::{client, granted, long_session_client, renewed_after, waiters, Db, EVENT};

pub async fn a_crashed_server_keeps_held_and_waited_locks_apart(db: &mut Db) {
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let (a, b) = (client(&url, &prefix).await, client(&url, &prefix).await);
    let held = a.mutex("crash").lock().await.unwrap();
    let (lease, first) = (held.lease(), held.fence());
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("crash").lock().await }
    });
    waiters(&a, "crash", 1).await;
    db.crash_and_restart();
    // The tables are on disk: the waiter's entry is still queued behind the holder's (the holder rode the restart out,
    // or its session expired and the waiter deletes it on its next check).
    crate::eventually("the waiter is still queued or granted", || async {
        match a.inspect("crash").await {
            Ok(info) => info.waiting_clients == 1 || waiting.is_finished(),
            Err(_) => false,
        }
    })
    .await;
    // Released by its holder if it still holds; otherwise its lease has ended here already.
    let _ = held.release().await;
    let next = granted(waiting).await;
    assert!(!lease.is_held(), "two holders: {:?}", lease.loss());
    assert!(next.fence() > first);
    next.release().await.unwrap();
}

pub async fn connections_killed_server_side_are_replaced(db: &mut Db) {
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let (a, b) = (client(&url, &prefix).await, client(&url, &prefix).await);
    let held = a.mutex("killed").lock().await.unwrap();
    let killed = db.kill_connections();
    assert!(killed >= 2, "only {killed} connections were killed");
    let after = tokio::time::Instant::now();
    // The session row is untouched: the keeper renews it on a new connection, and the grant holds throughout.
    renewed_after(&held.lease(), after).await;
    assert!(matches!(
        b.mutex("killed").try_lock().await,
        Err(leasehold::Error::Busy { .. })
    ));
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("killed").lock().await }
    });
    waiters(&a, "killed", 1).await;
    held.release().await.unwrap();
    let next = granted(waiting).await;
    next.release().await.unwrap();
}

pub async fn a_frozen_holder_is_lost_before_another_is_granted(db: &mut Db) {
    db.sql("CREATE TABLE IF NOT EXISTS fenced_writes (writer VARCHAR(64) NOT NULL)");
    db.sql("DELETE FROM fenced_writes");
    // The worker uses the default prefix: the lock's name keeps it apart from other tests'.
    let (name, url) = (format!("{}:frozen", db.fresh_prefix()), db.url());
    let mut worker = ChildGuard::new(
        Command::new(env!("CARGO_BIN_EXE_leasehold-worker"))
            .args(["hold-then-write", &url, &name, "2000"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    let acquired = lines.next().unwrap().unwrap();
    let stale: u64 = acquired
        .strip_prefix("acquired ")
        .unwrap_or_else(|| panic!("{acquired:?}"))
        .parse()
        .unwrap();
    worker.signal(Signal::SIGSTOP).unwrap();
    // Frozen, the worker renews nothing: its session expires on the server's clock, and the next holder deletes it.
    let b = Client::builder(&url)
        .unwrap()
        .session_ttl(crate::TTL)
        .connect()
        .await
        .unwrap();
    let next = b
        .mutex(&name)
        .lock_timeout(EVENT)
        .await
        .expect("granted once the frozen holder's session expired");
    assert!(next.fence().get() > stale);
    fenced_insert(db, &url, &next, "fresh-writer")
        .await
        .unwrap();
    // Thawed, the worker finds its lease lost, and its fenced transaction is refused.
    worker.signal(Signal::SIGCONT).unwrap();
    writeln!(worker.stdin.as_mut().unwrap(), "go").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "held=false");
    assert_eq!(lines.next().unwrap().unwrap(), "write=0");
    assert_eq!(
        db.sql("SELECT writer FROM fenced_writes").trim(),
        "fresh-writer"
    );
    next.release().await.unwrap();
    assert!(worker.wait_timeout(EVENT).is_some());
}

pub async fn a_release_wakes_another_clients_waiter(db: &mut Db) {
    // Sessions of a minute: a waiter that missed the release would sleep until the holder's expiry, past its wait.
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let a = long_session_client(&url, &prefix).await;
    let b = long_session_client(&url, &prefix).await;
    for round in 0..3 {
        let held = a.mutex("wake").lock().await.unwrap();
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.mutex("wake").lock_timeout(Duration::from_secs(30)).await }
        });
        waiters(&a, "wake", 1).await;
        held.release().await.unwrap();
        let next = waiting
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        next.release().await.unwrap();
    }
}

pub async fn a_waiter_whose_connections_went_silent_still_hears_the_release(db: &mut Db) {
    // Sessions of a minute: the waiter's only other way to learn of the release is the holder's expiry, past EVENT.
    let prefix = db.fresh_prefix();
    let proxy = leasehold_tests::TcpProxy::start(db.addr()).await;
    let a = long_session_client(&db.url(), &prefix).await;
    let b = long_session_client(&db.url_at(proxy.addr()), &prefix).await;
    let held = a.mutex("silent").lock().await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("silent").lock_timeout(EVENT).await }
    });
    waiters(&a, "silent", 1).await;
    // Every connection the waiter has goes silent (nothing closed: no error tells it); new ones get through.
    proxy.blackhole();
    proxy.restore();
    held.release().await.unwrap();
    let next = waiting
        .await
        .unwrap()
        .expect("the waiter heard of the release, though its connections went silent");
    next.release().await.unwrap();
}

/// Inserts `writer` into `fenced_writes` in a transaction committed through `guard`.
pub async fn fenced_insert(
    db: &Db,
    url: &str,
    guard: &leasehold::Guard,
    writer: &str,
) -> Result<(), leasehold::Error> {
    match db {
        Db::Postgres(_) => {
            use leasehold::tokio_postgres;
            let (mut conn, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            let tx = conn.transaction().await.unwrap();
            tx.execute("INSERT INTO fenced_writes (writer) VALUES ($1)", &[&writer])
                .await
                .unwrap();
            guard.commit_postgres(tx).await
        }
        Db::MySql(_) => {
            use leasehold::mysql_async::prelude::Queryable;
            let pool = leasehold::mysql_async::Pool::new(url);
            let mut conn = pool.get_conn().await.unwrap();
            let mut tx = conn
                .start_transaction(leasehold::mysql_async::TxOpts::default())
                .await
                .unwrap();
            tx.exec_drop("INSERT INTO fenced_writes (writer) VALUES (?)", (writer,))
                .await
                .unwrap();
            guard.commit_mysql(tx).await
        }
    }
}
