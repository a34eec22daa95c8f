//! Coalesced requests: acquires (and releases) that tasks of one client make while its calls are out travel as one
//! script call covering many locks, each lock with its own outcome.

use std::time::Duration;

use leasehold_tests::RedisServer;

use crate::{connect, pause, redis_conn, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_requests_of_one_client_share_calls_and_keep_their_own_outcomes() {
    const LOCKS: usize = 60;
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let other = connect(&server).await;
    crate::lock_and_release(&locks, "warm").await;
    // Two of the locks are held by another client (busy), one key is not a lock at all (a hash).
    let held: Vec<_> = [
        other.mutex("batch:7").try_lock().await.unwrap(),
        other.mutex("batch:8").try_lock().await.unwrap(),
    ]
    .into();
    let mut conn = redis_conn(&server).await;
    let _: () = redis::cmd("HSET")
        .arg("leasehold:{batch:9}")
        .arg("f")
        .arg("v")
        .query_async(&mut conn)
        .await
        .unwrap();
    server.config_resetstat();

    // The server holds every command for 200 ms: the client's first calls stay out, and the rest queue behind them.
    pause(&server, 200).await;
    let attempts: Vec<_> = (0..LOCKS)
        .map(|i| {
            let mutex = locks.mutex(&format!("batch:{i}"));
            tokio::spawn(async move { mutex.try_lock().await })
        })
        .collect();
    let mut guards = Vec::new();
    for (i, attempt) in attempts.into_iter().enumerate() {
        let outcome = within(Duration::from_secs(10), "acquire", attempt)
            .await
            .unwrap();
        match i {
            7 | 8 => assert!(
                outcome.as_ref().is_err_and(|e| e.is_busy()),
                "{i}: {outcome:?}"
            ),
            9 => assert!(
                matches!(outcome, Err(leasehold::Error::NotALock { .. })),
                "{i}: {outcome:?}"
            ),
            _ => guards.push(outcome.unwrap()),
        }
    }
    assert_eq!(guards.len(), LOCKS - 3);
    let acquire_calls = server.command_calls("evalsha");
    // The first calls went out at once, one lock each; everything that queued meanwhile followed in one call.
    let at_once = leasehold::__private::MAX_IN_FLIGHT as u64;
    assert!(
        acquire_calls <= at_once + 2,
        "{LOCKS} acquires took {acquire_calls} script calls"
    );

    server.config_resetstat();
    pause(&server, 200).await;
    let releases: Vec<_> = guards
        .into_iter()
        .map(|guard| tokio::spawn(guard.release()))
        .collect();
    for release in releases {
        within(Duration::from_secs(10), "release", release)
            .await
            .unwrap()
            .unwrap();
    }
    let release_calls = server.command_calls("evalsha");
    assert!(
        release_calls <= at_once + 2,
        "{} releases took {release_calls} script calls",
        LOCKS - 3
    );
    for i in (0..LOCKS).filter(|i| ![7, 8, 9].contains(i)) {
        assert!(locks
            .inspect(&format!("batch:{i}"))
            .await
            .unwrap()
            .holder
            .is_none());
    }
    drop(held);
}

#[tokio::test]
async fn a_lone_request_is_sent_at_once() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    crate::lock_and_release(&locks, "warm").await;
    server.config_resetstat();
    // One request at a time: each is its own call, none waits for another.
    for i in 0..20 {
        crate::lock_and_release(&locks, &format!("lone:{i}")).await;
    }
    assert_eq!(server.command_calls("evalsha"), 40);
}
