//! The everyday contract: grants, fences, busy, release, drop, inspect, and the ways to connect.

use std::time::Duration;

use leasehold::{Error, Fence};
use leasehold_tests::{RedisServer, TempDir};

use crate::{connect, redis_conn};

#[tokio::test]
async fn try_lock_is_busy_while_held_and_free_after_release() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mutex = locks.mutex("orders:42");

    let guard = mutex.try_lock().await.unwrap();
    assert!(guard.is_held());
    assert_eq!(guard.name(), "orders:42");

    let busy = mutex.try_lock().await.unwrap_err();
    match &busy {
        Error::Busy { name, remaining } => {
            assert_eq!(name, "orders:42");
            let remaining = remaining.expect("leasehold keys always expire");
            assert!(remaining <= Duration::from_secs(30) && remaining > Duration::from_secs(20));
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(busy.is_busy() && !busy.is_redis());

    guard.release().await.unwrap();
    mutex.try_lock().await.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn fences_strictly_increase_across_grants_and_clients() {
    let server = RedisServer::start();
    let a = connect(&server).await;
    let b = connect(&server).await;
    let mut last = Fence::new(0);
    for i in 0..50 {
        let client = if i % 2 == 0 { &a } else { &b };
        let guard = client.mutex("fenced").try_lock().await.unwrap();
        assert!(guard.fence() > last, "{} then {}", last, guard.fence());
        last = guard.fence();
        guard.release().await.unwrap();
    }
    // Fences belong to one lock: another name has its own counter, which is never below the time floor either.
    let other = a.mutex("other").try_lock().await.unwrap();
    assert!(
        other.fence().get() > 1_000_000_000_000_000,
        "seeded from server time in µs"
    );
}

#[tokio::test]
async fn fences_keep_increasing_after_the_counter_is_lost() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let before = locks.mutex("x").try_lock().await.unwrap();
    let old = before.fence();
    before.release().await.unwrap();
    // A restart without persistence loses the counter: FLUSHALL has the same effect on the data.
    server.flushall();
    let after = locks.mutex("x").try_lock().await.unwrap();
    assert!(after.fence() > old, "{} after {}", after.fence(), old);
}

#[tokio::test]
async fn dropping_a_guard_releases_in_the_background() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mutex = locks.mutex("dropped");
    let guard = mutex.try_lock().await.unwrap();
    let lease = guard.lease();
    drop(guard);
    assert_eq!(lease.loss(), Some(leasehold::LossReason::Released));
    // The waiter is woken by the background release's publish, long before the 30 s lease would end.
    let again = crate::within(
        Duration::from_secs(5),
        "re-acquire after drop",
        mutex.lock(),
    )
    .await;
    again.unwrap().release().await.unwrap();
}

#[test]
fn dropping_a_guard_outside_a_runtime_does_not_panic_and_leaves_the_ttl() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (locks, guard) = runtime.block_on(async {
        let locks = connect(&server).await;
        let guard = locks
            .mutex("outside")
            .ttl(Duration::from_secs(5))
            .fixed_lease()
            .try_lock()
            .await
            .unwrap();
        (locks, guard)
    });
    // Dropped on this plain thread, with no runtime entered: no panic, the key stays until its lease ends.
    drop(guard);
    let info = runtime.block_on(locks.inspect("outside")).unwrap();
    assert!(info.holder.is_some(), "the key is left to its TTL");
}

#[tokio::test]
async fn inspect_and_force_release_report_what_they_see() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let free = locks.inspect("job").await.unwrap();
    assert!(free.holder.is_none() && free.last_fence.is_none());

    let guard = locks.mutex("job").try_lock().await.unwrap();
    let held = locks.inspect("job").await.unwrap();
    let holder = held.holder.clone().unwrap();
    assert_eq!(holder.token, guard.token());
    assert!(holder.remaining.unwrap() > Duration::from_secs(20));
    assert_eq!(held.last_fence, Some(guard.fence()));

    let removed = locks.force_release("job").await.unwrap();
    assert_eq!(removed.as_deref(), Some(guard.token()));
    assert_eq!(locks.force_release("job").await.unwrap(), None);
    // The former holder's release must not touch anything now.
    assert!(matches!(guard.release().await, Err(Error::NotOwner { .. })));
}

#[tokio::test]
async fn prefix_namespaces_every_key() {
    let server = RedisServer::start();
    let app = leasehold::Client::builder(&server.url())
        .unwrap()
        .prefix("billing")
        .connect()
        .await
        .unwrap();
    let guard = app.mutex("invoice:7").try_lock().await.unwrap();
    let mut conn = redis_conn(&server).await;
    let token: String = redis::cmd("GET")
        .arg("billing:{invoice:7}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(token, guard.token());
    // Another prefix is another namespace.
    let other = connect(&server).await;
    crate::lock_and_release(&other, "invoice:7").await;
    guard.release().await.unwrap();
}

#[tokio::test]
async fn connects_over_a_unix_socket() {
    let dir = TempDir::new("sock");
    let path = dir.path().join("redis.sock");
    let path = path.to_str().unwrap();
    let server = RedisServer::start_with(&["--unixsocket", path, "--unixsocketperm", "700"]);
    let locks = leasehold::Client::connect(&format!("unix://{path}"))
        .await
        .unwrap();
    crate::lock_and_release(&locks, "u").await;
    drop(server);
}

#[tokio::test]
async fn connects_as_an_acl_user_and_reports_bad_credentials() {
    let server =
        RedisServer::start_with(&["--user", "alice", "on", ">s3cret", "~*", "&*", "+@all"]);
    let url = format!("redis://alice:s3cret@127.0.0.1:{}", server.port());
    let locks = leasehold::Client::connect(&url).await.unwrap();
    crate::lock_and_release(&locks, "acl").await;

    let wrong = format!("redis://alice:nope@127.0.0.1:{}", server.port());
    let err = leasehold::Client::connect(&wrong).await.unwrap_err();
    assert!(err.is_redis(), "{err:?}");
}

#[tokio::test]
async fn works_over_a_connection_the_caller_already_has() {
    let server = RedisServer::start();
    let conn = redis_conn(&server).await;
    let locks = leasehold::Builder::new(server.client())
        .connection(conn)
        .connect()
        .await
        .unwrap();
    let guard = locks.mutex("brought").try_lock().await.unwrap();
    // Waiting works too: the wake-up subscriber opens its own connection from the redis::Client.
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.mutex("brought").lock().await.map(|g| g.fence()) })
    };
    let first = guard.fence();
    guard.release().await.unwrap();
    let second = crate::within(Duration::from_secs(5), "waiter grant", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(second > first);
}

#[tokio::test]
async fn an_unreachable_server_is_a_redis_error() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let err = leasehold::Client::connect(&url).await.unwrap_err();
    assert!(err.is_redis(), "{err:?}");
}

/// Polls `fut` once, from a plain thread with no runtime entered.
fn poll_once<F: std::future::Future>(fut: F) -> std::task::Poll<F::Output> {
    let mut fut = std::pin::pin!(fut);
    fut.as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

#[test]
fn calls_outside_a_tokio_runtime_fail_with_a_clear_error_instead_of_panicking() {
    let server = RedisServer::start();
    match poll_once(leasehold::Client::connect(&server.url())) {
        std::task::Poll::Ready(Err(Error::NoRuntime)) => {}
        other => panic!(
            "expected Ready(Err(NoRuntime)), got {:?}",
            other.map(|r| r.map(drop))
        ),
    }
    // A client made inside a runtime, then used from outside it.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let locks = runtime.block_on(connect(&server));
    let mutex = locks.mutex("outside");
    match poll_once(mutex.try_lock()) {
        std::task::Poll::Ready(Err(Error::NoRuntime)) => {}
        other => panic!(
            "expected Ready(Err(NoRuntime)), got {:?}",
            other.map(|r| r.map(drop))
        ),
    }
    assert!(
        runtime.block_on(mutex.try_lock()).is_ok(),
        "inside the runtime it works"
    );
}

#[tokio::test]
async fn a_mutex_handle_answers_about_its_own_lock() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mutex = locks.mutex("self");
    assert!(!mutex.is_locked().await.unwrap());
    let guard = mutex.try_lock().await.unwrap();
    assert!(mutex.is_locked().await.unwrap());
    let info = mutex.inspect().await.unwrap();
    assert_eq!(info.holder.unwrap().token, guard.token());
    assert_eq!(info.last_fence, Some(guard.fence()));
    assert_eq!(
        mutex.force_release().await.unwrap().as_deref(),
        Some(guard.token())
    );
    assert!(!mutex.is_locked().await.unwrap());
    // A bad name is reported by these too.
    let bad = locks.mutex("");
    assert!(bad.is_locked().await.unwrap_err().is_invalid_argument());
    drop(guard);
}
