//! Batched renewal: many held locks cost few commands.

use std::time::Duration;

use dlock_tests::RedisServer;
use futures_util::future::try_join_all;

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
        .map(|g| format!("dlock:{{{}}}", g.name()))
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
