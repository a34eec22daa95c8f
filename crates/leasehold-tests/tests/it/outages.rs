//! A wait rides out a Redis restart or outage (unless it fails fast), and says so once.

use std::time::Duration;

use leasehold_tests::RedisServer;

use crate::{capture_traces, connect, traced, within};

/// No release is running in the background for `locks` (checked without waiting).
async fn locks_flushed(locks: &leasehold::Client) -> bool {
    locks.flush_releases(Duration::ZERO).await
}

// Current-thread: the trace capture is per thread, and every task runs on this one.
#[tokio::test]
async fn a_wait_survives_a_redis_restart_and_logs_it_once() {
    let (captured, _default) = capture_traces();
    let mut server = RedisServer::start();
    let holder = connect(&server).await;
    let waiter = connect(&server).await;
    let granted_client = waiter.clone();
    let held = holder.mutex("job").try_lock().await.unwrap();
    server.kill();
    // The waiter's client finds its connection dead on a read-only call: from here on its requests are refused
    // before anything is sent.
    assert!(waiter.inspect("job").await.unwrap_err().is_redis());
    let waiting = tokio::spawn(async move { waiter.mutex("job").lock().await });
    // The waiter's attempt failed while the server was down, and it is still waiting.
    traced(
        &captured,
        "Redis unavailable while waiting for lock \"job\"",
    )
    .await;
    assert!(!waiting.is_finished());
    // Its attempts could not reach Redis at all (connection refused): they left no background release behind. (An
    // attempt whose connection broke under it may have run, and does leave one, for its lease at most.)
    assert!(
        locks_flushed(&granted_client).await,
        "a background release for an attempt that never reached Redis"
    );
    // A restart without persistence: the holder's lock is gone, so the waiter gets it.
    server.restart();
    let granted = within(
        Duration::from_secs(10),
        "the grant after the restart",
        waiting,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(granted.is_held());
    let text = captured.text();
    assert_eq!(
        text.matches("Redis unavailable while waiting").count(),
        1,
        "one line per outage: {text}"
    );

    granted.release().await.unwrap();
    drop(held);
}

#[tokio::test]
async fn a_bounded_wait_during_an_outage_ends_with_the_redis_error_at_its_deadline() {
    let (captured, _default) = capture_traces();
    let mut server = RedisServer::start();
    let locks = connect(&server).await;
    server.kill();
    let timeout = Duration::from_millis(800);
    let started = tokio::time::Instant::now();
    let err = locks.mutex("job").lock_timeout(timeout).await.unwrap_err();
    assert!(err.is_redis(), "{err:?}");
    assert!(
        started.elapsed() >= timeout,
        "it gave up early: {:?}",
        started.elapsed()
    );
    assert!(captured.text().contains("Redis unavailable while waiting"));
}

#[tokio::test]
async fn fail_fast_ends_the_wait_at_the_first_redis_error() {
    let mut server = RedisServer::start();
    let locks = connect(&server).await;
    server.kill();
    // Without fail_fast this would wait for as long as the server stays down (forever, here).
    let err = within(
        Duration::from_secs(10),
        "the error",
        locks.mutex("job").fail_fast().lock(),
    )
    .await
    .unwrap_err();
    assert!(err.is_redis(), "{err:?}");
}
