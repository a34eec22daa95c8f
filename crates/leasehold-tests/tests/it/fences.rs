//! Fences never go backwards, also when the counter comes back stale: a restore from an older snapshot, or a
//! replica promoted before it caught up.

use leasehold::Fence;
use leasehold_tests::RedisServer;

use crate::{connect, patient_conn, redis_conn};

/// Grants and releases `name` `n` times, returning the highest fence.
async fn grant(locks: &leasehold::Client, name: &str, n: usize) -> Fence {
    let mut last = Fence::new(0);
    for _ in 0..n {
        let guard = locks.mutex(name).try_lock().await.unwrap();
        assert!(guard.fence() > last);
        last = guard.fence();
        guard.release().await.unwrap();
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_increasing_after_a_restore_from_an_older_snapshot() {
    let mut server = RedisServer::start();
    let locks = connect(&server).await;
    grant(&locks, "restored", 5).await;
    // The snapshot has the counter as it is now; five more grants follow that it does not have.
    let _: () = redis::cmd("SAVE")
        .query_async(&mut redis_conn(&server).await)
        .await
        .unwrap();
    let newest = grant(&locks, "restored", 5).await;
    // A crash, and a restart from the snapshot (the default persistence of a stock redis-server).
    tokio::task::block_in_place(|| server.restart());
    let after = connect(&server).await;
    let next = after.mutex("restored").try_lock().await.unwrap();
    assert!(
        next.fence() > newest,
        "fence went backwards after the restore: {} after {newest}",
        next.fence()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_increasing_on_a_replica_promoted_before_it_caught_up() {
    // Without the default 5 s delay before a diskless full sync.
    let primary = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    let locks = connect(&primary).await;
    grant(&locks, "promoted", 5).await;
    // Wait until the replica has everything so far.
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5_000)
        .query_async(&mut patient_conn(&primary).await)
        .await
        .unwrap();
    assert_eq!(acked, 1, "the replica never caught up");
    // The link stalls: the replica stops following, and the primary grants on without it.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut redis_conn(&replica).await)
        .await
        .unwrap();
    let newest = grant(&locks, "promoted", 5).await;
    // Failover: clients now talk to the promoted replica, whose counter is present but stale.
    let promoted = connect(&replica).await;
    let next = promoted.mutex("promoted").try_lock().await.unwrap();
    assert!(
        next.fence() > newest,
        "fence went backwards after the promotion: {} after {newest}",
        next.fence()
    );
}

/// A leader's value and its term's number live in keys that expire `fence_retention` after their last write (so that
/// names used once do not leak); a term may outlast that, and its leadership writes them again every third of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_longer_than_the_fence_retention_keeps_its_value_and_number() {
    let server = RedisServer::start();
    let retention = std::time::Duration::from_secs(1);
    let locks = leasehold::Client::builder(&server.url())
        .unwrap()
        .fence_retention(retention)
        .connect()
        .await
        .unwrap();
    let election = locks.election("long");
    let mut term = election.campaign("a").await.unwrap();
    term.proclaim("b").await.unwrap();
    // Three retentions: without the leadership's writes, the value key and the count would both have expired.
    tokio::time::sleep(retention * 3).await;
    let leader = election.leader().await.unwrap().unwrap();
    assert_eq!((leader.value.as_deref(), leader.term), (Some("b"), Some(1)));
    assert_eq!(election.terms().await.unwrap(), 1);
    term.resign().await.unwrap();
    // Once the term ended nothing writes them: they expire, and nothing is left behind.
    let mut conn = redis_conn(&server).await;
    crate::within(
        std::time::Duration::from_secs(10),
        "the value key and the count expire",
        async {
            loop {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg("leasehold:{long}:*")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if keys
                    .iter()
                    .all(|k| !k.ends_with(":value") && !k.ends_with(":terms"))
                {
                    break;
                }
                tokio::time::sleep(retention / 4).await;
            }
        },
    )
    .await;
}
