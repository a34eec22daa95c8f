//! The command connection recovers from a silently dead flow, and one bad key fails only its own lease.

use std::time::Duration;

use futures_util::future::try_join_all;
use leasehold::LossReason;
use leasehold_tests::{RedisServer, TcpProxy};
use tokio::time::Instant;

use crate::{connect, redis_conn, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_recovers_from_a_silently_dead_connection() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.addr()).await;
    let locks = leasehold::Client::builder(&proxy.url())
        .unwrap()
        .response_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    crate::lock_and_release(&locks, "flow").await;
    // A NAT or load balancer forgets the flow: nothing arrives, nothing is closed.
    proxy.blackhole();
    for _ in 0..3 {
        let err = locks.mutex("flow").try_lock().await.unwrap_err();
        assert!(err.is_redis(), "{err:?}");
    }
    // The path works again for new connections: the client must find that out by itself.
    proxy.restore();
    let recovered = within(Duration::from_secs(5), "recovery", async {
        loop {
            match locks.mutex("flow").try_lock().await {
                Ok(guard) => return guard,
                Err(e) if e.is_redis() => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
    })
    .await;
    recovered.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_replaced_by_another_type_fails_only_its_own_lease() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ttl = Duration::from_millis(1500);
    let every = Duration::from_millis(200);
    // Taken together, so the keeper renews them in one call.
    let guards = try_join_all((0..5).map(|i| {
        let mutex = locks
            .mutex(&format!("batch:{i}"))
            .ttl(ttl)
            .renew_every(every);
        async move { mutex.try_lock().await }
    }))
    .await
    .unwrap();
    // Someone replaces one lock key with a hash.
    let mut conn = redis_conn(&server).await;
    let _: () = redis::cmd("DEL")
        .arg("leasehold:{batch:0}")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("leasehold:{batch:0}")
        .arg("field")
        .arg("value")
        .query_async(&mut conn)
        .await
        .unwrap();
    let reason = within(
        Duration::from_secs(2),
        "loss of the replaced lock",
        guards[0].lost(),
    )
    .await;
    assert_eq!(reason, LossReason::Taken);
    // Well past the leases' validity: the others were renewed all along.
    let until = Instant::now() + ttl * 2;
    while Instant::now() < until {
        tokio::time::sleep(every).await;
        for guard in &guards[1..] {
            assert!(guard.is_held(), "{} lost with the bad key", guard.name());
        }
    }
    let kind: String = redis::cmd("TYPE")
        .arg("leasehold:{batch:0}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "hash", "the foreign key was left untouched");
    for guard in guards.into_iter().skip(1) {
        guard.release().await.unwrap();
    }
}
