//! Batched renewal: many held locks cost few commands.

use std::time::Duration;

use futures_util::future::try_join_all;
use leasehold_tests::RedisServer;

use crate::connect;

const LOCKS: usize = 10_000;
/// What the keeper promises: at most this many renewal calls per renewal period for 10,000 leases.
const CALLS_PER_PERIOD: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_locks_stay_held_with_batched_renewals() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ttl = Duration::from_millis(1500);
    let period = Duration::from_millis(500);

    let mut guards = Vec::with_capacity(LOCKS);
    for chunk in (0..LOCKS).collect::<Vec<_>>().chunks(500) {
        let batch = try_join_all(chunk.iter().map(|i| {
            let mutex = locks
                .mutex(&format!("bulk:{i}"))
                .ttl(ttl)
                .renew_every(period);
            async move { mutex.try_lock().await }
        }))
        .await
        .unwrap();
        guards.extend(batch);
    }
    assert_eq!(locks.kept_leases(), LOCKS);

    server.config_resetstat();
    // Three renewal periods: only the keeper talks to Redis in this time.
    tokio::time::sleep(period * 3 + period / 2).await;
    let calls = server.command_calls("evalsha") + server.command_calls("eval");
    let renewed = server.command_calls("pexpire");

    assert!(guards.iter().all(|g| g.is_held()), "a lease was lost");
    let mut conn = server.connection();
    let keys: Vec<String> = guards
        .iter()
        .map(|g| format!("leasehold:{{{}}}", g.name()))
        .collect();
    let tokens: Vec<Option<String>> = redis::cmd("MGET").arg(&keys).query(&mut conn).unwrap();
    for (guard, token) in guards.iter().zip(&tokens) {
        assert_eq!(
            token.as_deref(),
            Some(guard.token()),
            "{} not held in Redis",
            guard.name()
        );
    }
    // Without renewals the 1.5 s leases would have lapsed by now; with them, every lease was renewed each period.
    assert!(
        renewed >= 3 * LOCKS as u64,
        "only {renewed} lease renewals in three periods"
    );
    assert!(
        calls <= 3 * CALLS_PER_PERIOD,
        "{calls} renewal calls for {LOCKS} leases over three periods"
    );
    for guard in guards {
        drop(guard);
    }
}

#[test]
fn a_renewal_cut_off_by_its_runtime_ending_is_retried_from_the_next_runtime() {
    let server = RedisServer::start();
    let first = tokio::runtime::Runtime::new().unwrap();
    let ttl = Duration::from_millis(1200);
    let every = Duration::from_millis(300);
    let (locks, guard) = first.block_on(async {
        let locks = connect(&server).await;
        let guard = locks
            .mutex("carried")
            .ttl(ttl)
            .renew_every(every)
            .try_lock()
            .await
            .unwrap();
        // The server holds the renewal due at 300 ms; the runtime ends while it is out.
        tokio::time::sleep(every - Duration::from_millis(100)).await;
        crate::pause(&server, 400).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        (locks, guard)
    });
    drop(first);

    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        // Any new lease restarts the keeper in this runtime.
        let other = locks.mutex("other").try_lock().await.unwrap();
        // Three leases later, the carried lease must still be renewed, not stuck "in flight" forever.
        tokio::time::sleep(ttl * 3).await;
        assert!(guard.is_held(), "the carried lease was never renewed again");
        let holder = locks.inspect("carried").await.unwrap().holder.unwrap();
        assert_eq!(holder.token, guard.token());
        other.release().await.unwrap();
        guard.release().await.unwrap();
    });
}
