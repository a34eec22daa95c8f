//! Wake-ups: those that must reach a waiter after its path to the server failed and came back, or that enqueued while
//! the release was under way; and on PostgreSQL, no notification where nobody can be woken.

use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::{granted, long_session_client, waiters, Db, EVENT};

/// The listener's connection goes silent, the listener notices (its ping goes unanswered) and reconnects while the
/// path is still down: that new connection is accepted by the proxy but never reaches the server, so its start-up
/// is never answered. Once the path is back, the listener must connect again, and a waiter that queued after the
/// partition must hear the release.
pub async fn a_waiter_whose_listener_reconnected_into_a_partition_still_hears_the_release(
    db: &mut Db,
) {
    let prefix = db.fresh_prefix();
    let proxy = leasehold_tests::TcpProxy::start(db.addr()).await;
    let a = long_session_client(&db.url(), &prefix).await;
    let mut b_url = db.url_at(proxy.addr());
    if let Db::Postgres(_) = db {
        // Named, to find its listener among the server's connections.
        b_url.push_str(&format!("?application_name={prefix}_b"));
    }
    let b = long_session_client(&b_url, &prefix).await;
    if let Db::Postgres(server) = db {
        // `b`'s listener is up (its last statement `LISTEN`, or the empty one it pings with): its next connection
        // is a reconnect.
        let listening = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{prefix}_b' \
             AND query IN ('LISTEN \"{prefix}\"', '') AND state = 'idle'"
        );
        crate::eventually("the waiter's listener listens", || async {
            server.psql(&listening).trim() == "1"
        })
        .await;
        let before = proxy.accepted();
        proxy.blackhole();
        // The first connection `b` makes in the partition is its listener's: its ping fails within two call
        // deadlines (4 s), while the keeper, every 15 s, first renews on a connection it already has, and nothing
        // else of `b` runs.
        tokio::time::timeout(EVENT, proxy.accepted_at_least(before + 1))
            .await
            .expect("the listener reconnected in the partition");
    } else {
        // MySQL has no listener (its waiters poll): the partition only costs the pool its connections.
        proxy.blackhole();
    }
    proxy.restore();
    // Its pool's connections of before the partition are dead: a statement finds out, and the next one reconnects.
    crate::eventually("the waiter's client reaches the server again", || async {
        b.inspect("partitioned").await.is_ok()
    })
    .await;
    let held = a.mutex("partitioned").lock().await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("partitioned").lock_timeout(EVENT).await }
    });
    waiters(&a, "partitioned", 1).await;
    held.release().await.unwrap();
    let next = waiting.await.unwrap().expect(
        "the waiter heard of the release, though its listener had reconnected into a partition",
    );
    next.release().await.unwrap();
}

/// A release notifies only when an entry may be behind it: acquisitions and releases of a lock nobody waits for send
/// no notification (each would cost the server its notification queue's lock and every listener's work); a release
/// with a waiter behind it sends one.
pub async fn only_a_release_with_an_entry_behind_it_notifies(db: &mut Db) {
    let Db::Postgres(_) = db else {
        // MySQL has no notifications: its waiters poll.
        return;
    };
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let a = long_session_client(&url, &prefix).await;
    let b = long_session_client(&url, &prefix).await;
    let (listener, mut heard) = connect(&url).await;
    let channel = format!("\"{prefix}\"");
    listener
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .unwrap();
    for _ in 0..20 {
        let guard = a.mutex("quiet").lock().await.unwrap();
        guard.release().await.unwrap();
    }
    // Notifications come in the order their transactions committed: the listener's own, sent after every release
    // above committed, is the first it hears if they sent none.
    listener
        .batch_execute(&format!("NOTIFY {channel}, 'mark'"))
        .await
        .unwrap();
    assert_eq!(next(&mut heard).await, "mark");
    let held = a.mutex("quiet").lock().await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("quiet").lock_timeout(EVENT).await }
    });
    waiters(&a, "quiet", 1).await;
    held.release().await.unwrap();
    assert_eq!(next(&mut heard).await, "quiet");
    granted(waiting).await.release().await.unwrap();
}

/// A waiter that enqueues while the holder's release is under way, and reads the holder's entry still there, is woken
/// by that release (not at the holder's expiry, a minute away). The release's statement is held up, its snapshot
/// taken, by a row lock on the holder's entry that a connection of the test's own holds in an open transaction; the
/// waiter enqueues and checks meanwhile; then the test commits. On PostgreSQL, the release finds the waiter's newer
/// fence only by reading the lock's row with a row lock: in its snapshot the waiter is not there, and it would not
/// notify.
pub async fn a_waiter_enqueued_while_the_release_runs_is_woken_by_it(db: &mut Db) {
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let with_name = |who: &str| match db {
        // Named, to find each client's connections among the server's.
        Db::Postgres(_) => format!("{url}?application_name={prefix}_{who}"),
        Db::MySql(_) => url.clone(),
    };
    let a = long_session_client(&with_name("a"), &prefix).await;
    let b = long_session_client(&with_name("b"), &prefix).await;
    let held = a.mutex("in-flight").lock().await.unwrap();
    let Db::Postgres(_) = db else {
        // MySQL's waiters poll: the same race costs a waiter one poll at most.
        held.release().await.unwrap();
        return;
    };
    let (blocker, _) = connect(&url).await;
    let (watcher, _) = connect(&url).await;
    // `count(*)` of the named client's connections in a state.
    let count = |who: &str, state: &str| {
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{prefix}_{who}' AND {state}"
        );
        let watcher = &watcher;
        async move { watcher.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .batch_execute(&format!(
            "SELECT 1 FROM \"{prefix}_entry\" WHERE name = 'in-flight' FOR UPDATE"
        ))
        .await
        .unwrap();
    // How many times a client ran the check of this prefix's locks (the holder ran none: its acquisition was granted
    // by the read behind its enqueue).
    let pattern = format!("%\"{prefix}_entry\" e %e.fence <= $2 ORDER BY e.fence");
    let checks = || async {
        watcher
            .query_one(
                "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements WHERE query LIKE $1",
                &[&pattern],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let checked = checks().await;
    let releasing = tokio::spawn(held.release());
    crate::eventually("the release waits for the row lock", || async {
        count("a", "wait_event_type = 'Lock'").await == 1
    })
    .await;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("in-flight").lock_timeout(EVENT).await }
    });
    // The waiter's check (the engine's, after the read behind its enqueue) found the holder's entry: it waits. Counted
    // by the server, as the last query of one of its connections would not say it (the keeper's first renewal may run
    // on that connection right after).
    crate::eventually("the waiter checked and waits", || async {
        checks().await > checked
    })
    .await;
    blocker.batch_execute("COMMIT").await.unwrap();
    releasing.await.unwrap().unwrap();
    granted(waiting).await.release().await.unwrap();
}

/// A connection of the test's own to the PostgreSQL server at `url`, its I/O driven by a task; and the payloads of
/// the notifications it hears.
async fn connect(url: &str) -> (tokio_postgres::Client, mpsc::UnboundedReceiver<String>) {
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    (client, rx)
}

/// The payload of the next notification heard, within `EVENT`.
async fn next(heard: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(EVENT, heard.recv())
        .await
        .expect("a notification within EVENT")
        .expect("the listening connection is open")
}
