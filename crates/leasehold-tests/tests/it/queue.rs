//! The wait queue: no number of dead entries, no bystander subscriber, no change of runtime and no entry lost from
//! the queue list keeps a live waiter from a free lock.

use std::time::Duration;

use futures_util::StreamExt;
use leasehold_tests::RedisServer;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::family::wait_for_queue_len;
use crate::{connect, redis_conn, within, worker};

/// Queues `ids` ahead of everyone as clients that are gone: queued once, never heard of again.
async fn queue_dead_clients(
    server: &RedisServer,
    name: &str,
    ids: &[String],
    expired_liveness: bool,
) {
    let mut conn = redis_conn(server).await;
    for id in ids {
        let _: () = redis::cmd("RPUSH")
            .arg(format!("leasehold:{{{name}}}:queue"))
            .arg(id)
            .query_async(&mut conn)
            .await
            .unwrap();
        if expired_liveness {
            // Its liveness deadline (server time, ms) passed long ago.
            let _: () = redis::cmd("HSET")
                .arg(format!("leasehold:{{{name}}}:waiters"))
                .arg(id)
                .arg(1)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
}

/// Queues a live waiter behind whatever is queued, and returns the task that waits and the moment it got the lock.
async fn live_waiter(server: &RedisServer, name: &'static str) -> tokio::task::JoinHandle<Instant> {
    let locks = connect(server).await;
    let before: u64 = server.command_calls("pttl");
    let task = tokio::spawn(async move {
        let guard = locks.mutex(name).lock().await.unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    // Waiting for good: a fresh client makes its first attempt, subscribes to its wake-up channel, then looks once
    // more; both attempts find the lock busy (each busy attempt calls PTTL).
    within(Duration::from_secs(5), "waiter queued", async {
        while server.command_calls("pttl") < before + 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    task
}

/// A release must reach the live waiter in far less than a heartbeat (1 s), which would otherwise mask a stall.
const PROMPT: Duration = Duration::from_millis(300);

/// A holder with a 60 s lease, `dead` clients queued first (with expired liveness when `expired`), a live waiter
/// behind them, then the release: how long the live waiter took to get the lock.
async fn hand_off_past_dead_clients(
    server: &RedisServer,
    name: &'static str,
    dead: usize,
    expired: bool,
) -> Duration {
    let holder_client = connect(server).await;
    let holder = holder_client
        .mutex(name)
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();
    let ids: Vec<String> = (0..dead).map(|i| format!("gone{i:02}")).collect();
    queue_dead_clients(server, name, &ids, expired).await;
    let waiter = live_waiter(server, name).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let granted = within(Duration::from_secs(10), "grant", waiter)
        .await
        .unwrap();
    granted.duration_since(released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_waiter_behind_many_dead_clients_gets_the_lock_at_once() {
    let server = RedisServer::start();
    let delay = hand_off_past_dead_clients(&server, "crowd", 40, false).await;
    assert!(
        delay < PROMPT,
        "a live waiter behind 40 dead ids waited {delay:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_subscriber_does_not_make_dead_clients_look_alive() {
    let server = RedisServer::start();
    // A bystander listening to everything (monitoring, debugging): every PUBLISH now counts one receiver.
    let mut bystander = server.client().get_async_pubsub().await.unwrap();
    bystander.psubscribe("*").await.unwrap();
    let delay = hand_off_past_dead_clients(&server, "watched", 3, true).await;
    assert!(
        delay < PROMPT,
        "a pattern subscriber stalled the hand-off for {delay:?}"
    );
    // The bystander did see the wake-up of the live client, so the test exercised PUBLISH counting it.
    let mut messages = bystander.on_message();
    within(Duration::from_secs(1), "bystander message", messages.next()).await;
}

#[test]
fn a_client_used_from_a_second_runtime_still_receives_wake_ups() {
    let server = RedisServer::start();
    let first = tokio::runtime::Runtime::new().unwrap();
    // A client kept across runtimes (a `static` shared by several `#[tokio::test]`s is the usual case).
    let shared = first.block_on(async {
        let shared = connect(&server).await;
        let other = connect(&server).await;
        // Wait once, so that this runtime runs the client's subscriber.
        let held = other.mutex("first").try_lock().await.unwrap();
        let waiter = {
            let shared = shared.clone();
            tokio::spawn(async move { shared.mutex("first").lock().await.unwrap() })
        };
        held.release().await.unwrap();
        within(Duration::from_secs(5), "first wait", waiter)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        shared
    });
    drop(first);

    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        let holder_client = connect(&server).await;
        let holder = holder_client
            .mutex("second")
            .ttl(Duration::from_secs(60))
            .try_lock()
            .await
            .unwrap();
        let waiter = {
            let shared = shared.clone();
            tokio::spawn(async move {
                let guard = shared.mutex("second").lock().await.unwrap();
                let at = Instant::now();
                guard.release().await.unwrap();
                at
            })
        };
        // Queued: its attempt found the lock busy.
        within(Duration::from_secs(5), "queued", async {
            while holder_client
                .inspect("second")
                .await
                .unwrap()
                .waiting_clients
                == 0
            {
                tokio::task::yield_now().await;
            }
        })
        .await;
        let released = Instant::now();
        holder.release().await.unwrap();
        let granted = within(Duration::from_secs(10), "grant", waiter)
            .await
            .unwrap();
        let delay = granted.duration_since(released);
        assert!(
            delay < PROMPT,
            "woken after {delay:?}: no wake-ups in the second runtime"
        );
    });
}

/// The wait ids in the queue list of the lock `name`, oldest first.
async fn queue_list(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(format!("leasehold:{{{name}}}:queue"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_waiter_whose_id_left_the_queue_list_is_queued_again_and_served() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mut conn = redis_conn(&server).await;
    let holder = locks.fair_mutex("roster").lock().await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for label in ["lost", "listed"] {
        let fair = connect(&server).await.fair_mutex("roster");
        let order_tx = order_tx.clone();
        waiters.push(tokio::spawn(async move {
            let guard = fair.lock().await.unwrap();
            order_tx.send(label).unwrap();
            guard.release().await.unwrap();
        }));
        wait_for_queue_len(&server, "roster", waiters.len()).await;
    }
    // The list loses the first waiter's id (one key evicted, a hand edit, a partial restore) while its entry stays in
    // the waiters hash and its task keeps heartbeating.
    let lost = queue_list(&mut conn, "roster").await.remove(0);
    let removed: i64 = redis::cmd("LREM")
        .arg("leasehold:{roster}:queue")
        .arg(0)
        .arg(&lost)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(removed, 1);

    holder.release().await.unwrap();
    // Its place in the queue was lost with its id: it is queued again at the back, never ahead of a listed waiter.
    let first = within(
        Duration::from_secs(3),
        "the listed waiter served",
        order_rx.recv(),
    )
    .await;
    assert_eq!(first, Some("listed"));
    // Served within a heartbeat (1 s) of the lock becoming free, with room for a busy machine.
    let second = within(
        Duration::from_secs(3),
        "the lost waiter served",
        order_rx.recv(),
    )
    .await;
    assert_eq!(second, Some("lost"));
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let left: usize = redis::cmd("HLEN")
        .arg("leasehold:{roster}:waiters")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0, "no entry left behind");
    assert!(queue_list(&mut conn, "roster").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_entry_of_a_gone_waiter_whose_id_left_the_queue_list_is_dropped() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mut conn = redis_conn(&server).await;
    let fair = locks.fair_mutex("roster");
    let holder = fair.lock().await.unwrap();
    let waiting = tokio::spawn({
        let fair = fair.clone();
        async move { fair.lock().await.unwrap() }
    });
    wait_for_queue_len(&server, "roster", 1).await;
    let listed = queue_list(&mut conn, "roster").await;
    // A waiter process behind it, killed: its entry stays until its liveness is over, and nothing serves it while
    // the lock is held and the live waiter is ahead of it.
    let mut gone = worker(&["fair-wait", &server.url(), "roster", "1"]);
    wait_for_queue_len(&server, "roster", 2).await;
    let gone_id = queue_list(&mut conn, "roster").await.remove(1);
    gone.signal(Signal::SIGKILL).unwrap();
    let _ = tokio::task::block_in_place(|| gone.wait());
    let entry: String = redis::cmd("HGET")
        .arg("leasehold:{roster}:waiters")
        .arg(&gone_id)
        .query_async(&mut conn)
        .await
        .unwrap();
    let alive_until: u64 = entry.split(' ').next().unwrap().parse().unwrap();
    within(
        Duration::from_secs(5),
        "the gone waiter's liveness over",
        async {
            loop {
                let (secs, micros): (u64, u64) =
                    redis::cmd("TIME").query_async(&mut conn).await.unwrap();
                if secs * 1000 + micros / 1000 > alive_until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await; // polls the server's clock: no event to await
            }
        },
    )
    .await;
    // Now the list loses its id: no serving will ever pop it, so only the live waiter's heartbeat can clear it.
    let _: i64 = redis::cmd("LREM")
        .arg("leasehold:{roster}:queue")
        .arg(0)
        .arg(&gone_id)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Within a heartbeat (1 s) of the live waiter, with room for a busy machine.
    within(
        Duration::from_secs(3),
        "the gone waiter's entry dropped",
        async {
            loop {
                let ids: Vec<String> = redis::cmd("HKEYS")
                    .arg("leasehold:{roster}:waiters")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if ids == listed {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await; // polls server state: no event to await
            }
        },
    )
    .await;
    // Not put back in the list either: the live waiter is alone in the queue and next.
    assert_eq!(queue_list(&mut conn, "roster").await, listed);
    holder.release().await.unwrap();
    let next = within(Duration::from_secs(3), "the live waiter served", waiting)
        .await
        .unwrap();
    next.release().await.unwrap();
}
