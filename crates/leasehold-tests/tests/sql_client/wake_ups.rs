//! Wake-ups that must reach a waiter after its path to the server failed and came back.

use crate::{long_session_client, waiters, Db, EVENT};

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
