//! Release: the lease ends before the request leaves, a release survives a restart and a retry, and the ordinary
//! end of a program releases its locks.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use futures_util::FutureExt;
use leasehold::LossReason;
use leasehold_tests::RedisServer;

use crate::{connect, pause, redis_conn, within, worker};

#[tokio::test]
async fn the_lease_reads_released_before_the_release_request_leaves() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let guard = locks.mutex("window").try_lock().await.unwrap();
    let lease = guard.lease();
    // The server holds every request for 500 ms: the release below is sent but not answered meanwhile.
    pause(&server, 500).await;
    let mut release = Box::pin(guard.release());
    tokio::select! {
        biased;
        _ = &mut release => panic!("the release was answered while the server was paused"),
        () = std::future::ready(()) => {}
    }
    // The script may run at any moment from here on and hand the lock to someone else: the lease must be over.
    assert!(!lease.is_held(), "a released lease still reads held");
    assert_eq!(lease.loss(), Some(LossReason::Released));
    assert_eq!(lease.lost().now_or_never(), Some(LossReason::Released));
    within(Duration::from_secs(5), "release reply", release)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_after_a_restart_succeeds() {
    let mut server = RedisServer::start();
    let locks = connect(&server).await;
    let guard = locks
        .mutex("restarted")
        .ttl(Duration::from_secs(30))
        .try_lock()
        .await
        .unwrap();
    // The lock survives the restart (a snapshot), but the client's connection does not.
    let _: () = redis::cmd("SAVE")
        .query_async(&mut redis_conn(&server).await)
        .await
        .unwrap();
    tokio::task::block_in_place(|| server.restart());
    assert!(locks.inspect("restarted").await.unwrap().holder.is_some());
    // The first request meets the dead connection; release retries it once on a fresh one.
    guard.release().await.unwrap();
    assert!(locks.inspect("restarted").await.unwrap().holder.is_none());
}

/// The script `name` as the library loads it (constants and helpers included).
fn script(name: &str) -> redis::Script {
    redis::Script::new(&leasehold::__private::script_source(name).unwrap())
}

/// The integers of a reply from `acquire.lua` or `release.lua`: one string of them, separated by spaces.
fn numbers(reply: &str) -> Vec<i64> {
    reply.split(' ').map(|n| n.parse().unwrap()).collect()
}

#[tokio::test]
async fn a_resent_acquire_reports_its_own_grant() {
    let server = RedisServer::start();
    let mut conn = redis_conn(&server).await;
    let acquire = script("acquire");
    let run = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut invocation = acquire.key("leasehold:{twice}");
        invocation
            .key("leasehold:{twice}:fence")
            .key("leasehold:{twice}:queue")
            .key("leasehold:{twice}:waiters")
            .arg(86_400_000)
            .arg("client-a")
            .arg("dl1:00000000000000000000000000000001")
            .arg(30_000)
            .arg("0")
            .arg(2_000)
            .arg("");
        let mut conn = conn.clone();
        async move {
            let reply: String = invocation.invoke_async(&mut conn).await?;
            Ok::<_, redis::RedisError>(numbers(&reply))
        }
    };
    // {server µs, code, fence, ms left}
    let first = run(&mut conn).await.unwrap();
    assert_eq!(first[1], 1, "granted");
    // The same request again, as a retry after a lost reply would send it: the grant stands, with its fence.
    let again = run(&mut conn).await.unwrap();
    assert_eq!(
        again[1..3],
        first[1..3],
        "a retried acquire must report its own grant"
    );
    assert!(
        again[3] > 0 && again[3] <= 30_000,
        "with the time left on it"
    );
}

#[tokio::test]
async fn a_resent_release_reports_success_and_leaves_the_next_owner_alone() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let guard = locks.mutex("twice").try_lock().await.unwrap();
    let token = guard.token().to_owned();
    let mut conn = redis_conn(&server).await;
    let release = script("release");
    let run = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut invocation = release.key("leasehold:{twice}");
        invocation
            .key("leasehold:{twice}:queue")
            .key("leasehold:{twice}:waiters")
            .key("leasehold:{twice}:released")
            .key("leasehold:{twice}:fence")
            .arg("leasehold:wake:")
            .arg(86_400_000)
            .arg(&token);
        let mut conn = conn.clone();
        async move {
            let reply: String = invocation.invoke_async(&mut conn).await?;
            Ok::<_, redis::RedisError>(numbers(&reply)[0])
        }
    };
    assert_eq!(run(&mut conn).await.unwrap(), 1, "released");
    let next = locks.mutex("twice").try_lock().await.unwrap();
    // The first release's reply was "lost" and it is sent again: it must not report a loss, nor touch `next`.
    assert_eq!(
        run(&mut conn).await.unwrap(),
        1,
        "a retried release is a success"
    );
    let holder = locks.inspect("twice").await.unwrap().holder.unwrap();
    assert_eq!(holder.token, next.token());
    next.release().await.unwrap();
    drop(guard);
}

/// A program whose `main` returns while a guard is alive (dropped with the runtime) leaves the lock free.
fn drop_at_end_frees_the_lock(flavor: &str) {
    let server = RedisServer::start();
    let mut process = worker(&["drop-at-end", &server.url(), "ending", flavor]);
    let mut out = BufReader::new(process.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("acquired "), "{line:?}");
    let status = process.wait_timeout(Duration::from_secs(10)).unwrap();
    assert!(status.success(), "{status}");
    // The process has exited: its locks must already be free, not held for the rest of their 30 s lease.
    for key in ["leasehold:{ending}", "leasehold:{ending-2}"] {
        let holder: Option<String> = redis::cmd("GET")
            .arg(key)
            .query(&mut server.connection())
            .unwrap();
        assert_eq!(
            holder, None,
            "{key} outlived the program ({flavor} runtime)"
        );
    }
}

#[test]
fn the_end_of_main_releases_a_live_guard_on_a_current_thread_runtime() {
    drop_at_end_frees_the_lock("current");
}

#[test]
fn the_end_of_main_releases_a_live_guard_on_a_multi_thread_runtime() {
    drop_at_end_frees_the_lock("multi");
}
