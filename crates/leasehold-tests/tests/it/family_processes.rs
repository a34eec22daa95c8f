//! The queued kinds across real OS processes: arrival order, dead waiters, permits and shares under contention,
//! crashed holders.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use leasehold_tests::RedisServer;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::family::wait_for_queue_len;
use crate::{connect, redis_conn, within, worker};

fn read_line(reader: &mut impl BufRead) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    line.trim_end().to_owned()
}

fn finish(workers: &mut [leasehold_tests::ChildGuard]) {
    for w in workers {
        let status = w
            .wait_timeout(Duration::from_secs(120))
            .expect("worker finished in time");
        assert!(status.success(), "worker failed: {status}");
    }
}

async fn get_i64(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("GET")
        .arg(key)
        .query_async::<Option<i64>>(conn)
        .await
        .unwrap()
        .unwrap_or(0)
}

/// The waiters in the order Redis queued them, by description (`<pid>-<i>`): the queue's wait ids mapped through the
/// waiters hash, whose entries end with the hold (tag, token, and the description after a space).
async fn arrival_order(server: &RedisServer, name: &str) -> Vec<String> {
    let mut conn = redis_conn(server).await;
    let queue: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("leasehold:{{{name}}}:queue"))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut order = Vec::new();
    for wid in queue {
        let entry: String = redis::cmd("HGET")
            .arg(format!("leasehold:{{{name}}}:waiters"))
            .arg(&wid)
            .query_async(&mut conn)
            .await
            .unwrap();
        order.push(entry.rsplit(' ').next().unwrap().to_owned());
    }
    order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_of_fair_waiters_are_granted_in_order_of_arrival() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = connect(&server).await;
    let holder = locks.fair_mutex("fifo").lock().await.unwrap();
    let mut workers: Vec<_> = (0..8)
        .map(|_| worker(&["fair-wait", &url, "fifo", "3"]))
        .collect();
    wait_for_queue_len(&server, "fifo", 24).await;
    let arrived = arrival_order(&server, "fifo").await;
    holder.release().await.unwrap();
    tokio::task::block_in_place(|| finish(&mut workers));
    let granted: Vec<String> = redis::cmd("LRANGE")
        .arg("test:grants")
        .arg(0)
        .arg(-1)
        .query_async(&mut redis_conn(&server).await)
        .await
        .unwrap();
    assert_eq!(granted, arrived, "grants follow the order Redis queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_killed_in_the_middle_of_the_queue_is_skipped() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = connect(&server).await;
    let holder = locks.fair_mutex("fifo").lock().await.unwrap();
    let first = worker(&["fair-wait", &url, "fifo", "1"]);
    wait_for_queue_len(&server, "fifo", 1).await;
    let mut doomed = worker(&["fair-wait", &url, "fifo", "1"]);
    wait_for_queue_len(&server, "fifo", 2).await;
    let last = worker(&["fair-wait", &url, "fifo", "1"]);
    wait_for_queue_len(&server, "fifo", 3).await;
    doomed.signal(Signal::SIGKILL).unwrap();
    let _ = tokio::task::block_in_place(|| doomed.wait());
    let released = Instant::now();
    holder.release().await.unwrap();
    tokio::task::block_in_place(|| finish(&mut [first, last]));
    // The dead waiter's connection is gone, so the release skips it at once; the stated bound is its liveness
    // window (3 s) where a dead waiter's connection outlives it.
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "both live waiters served in {:?}",
        released.elapsed()
    );
    let granted: Vec<String> = redis::cmd("LRANGE")
        .arg("test:grants")
        .arg(0)
        .arg(-1)
        .query_async(&mut redis_conn(&server).await)
        .await
        .unwrap();
    assert_eq!(granted.len(), 2, "{granted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_never_hold_more_than_the_permits() {
    let server = RedisServer::start();
    let url = server.url();
    let mut workers: Vec<_> = (0..8)
        .map(|_| worker(&["sem-count", &url, "pool", "3", "40"]))
        .collect();
    tokio::task::block_in_place(|| finish(&mut workers));
    let mut conn = redis_conn(&server).await;
    let max = get_i64(&mut conn, "test:max").await;
    assert!(max <= 3, "{max} holders at once with 3 permits");
    assert!(max >= 2, "permits were never held together (max {max})");
    assert_eq!(get_i64(&mut conn, "test:inside").await, 0);
    // No permit left behind: all three are free.
    let locks = connect(&server).await;
    let all = locks
        .semaphore("pool", 3)
        .try_acquire_many(3)
        .await
        .unwrap();
    all.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_never_overlap_and_readers_do() {
    let server = RedisServer::start();
    let url = server.url();
    let mut workers: Vec<_> = (0..8)
        .map(|_| worker(&["rw-mix", &url, "doc", "40"]))
        .collect();
    tokio::task::block_in_place(|| finish(&mut workers));
    let mut conn = redis_conn(&server).await;
    assert_eq!(get_i64(&mut conn, "test:overlaps").await, 0);
    let max = get_i64(&mut conn, "test:max").await;
    assert!(max >= 2, "readers never shared the lock (max {max})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_gets_in_while_eight_reader_processes_loop() {
    let server = RedisServer::start();
    let url = server.url();
    let mut readers: Vec<_> = (0..8)
        .map(|_| worker(&["read-loop", &url, "doc"]))
        .collect();
    for r in &mut readers {
        let mut out = BufReader::new(r.stdout.take().unwrap());
        assert_eq!(
            tokio::task::block_in_place(|| read_line(&mut out)),
            "reading"
        );
    }
    let locks = connect(&server).await;
    let rw = locks.rw_lock("doc");
    for _ in 0..5 {
        // Readers hold 5 ms each; a waiting writer holds back new ones, so it waits for those inside only.
        let writing = within(Duration::from_secs(2), "the writer granted", rw.write())
            .await
            .unwrap();
        writing.release().await.unwrap();
    }
}

/// The server's clock, in milliseconds (the clock that waiters' liveness deadlines are written in).
async fn server_ms(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1000 + micros / 1000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_cannot_take_a_lapsed_fair_lock_ahead_of_a_frozen_queued_waiter() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mut conn = redis_conn(&server).await;
    let holder = locks
        .fair_mutex("turn")
        .ttl(Duration::from_millis(400))
        .lock()
        .await
        .unwrap();
    let mut waiter = worker(&["fair-wait", &server.url(), "turn", "1"]);
    let described = format!("{}-0", waiter.id());
    wait_for_queue_len(&server, "turn", 1).await;
    // Frozen, the waiter cannot take the lock when the lease lapses (it would, at its next attempt), but its entry
    // stays live for 3 s after its last attempt, which came less than a lease (400 ms) ago: a waiter looks again
    // when the first hold's lease would end.
    waiter.signal(Signal::SIGSTOP).unwrap();
    let entries: Vec<String> = redis::cmd("HVALS")
        .arg("leasehold:{turn}:waiters")
        .query_async(&mut conn)
        .await
        .unwrap();
    let [entry] = entries.as_slice() else {
        panic!("one queued waiter expected: {entries:?}");
    };
    let alive_until: u64 = entry.split(' ').next().unwrap().parse().unwrap();
    // Nobody releases: the lock becomes free when the 400 ms lease lapses on the server.
    holder.leave_to_expire();
    within(Duration::from_secs(5), "the lease lapsed", async {
        while locks.inspect("turn").await.unwrap().holder.is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await; // polls server state: no event to await
        }
    })
    .await;

    let newcomer = locks.fair_mutex("turn").try_lock().await;
    let tried_by = server_ms(&mut conn).await;
    assert!(
        tried_by < alive_until,
        "the test was too slow: the waiter's liveness ended {} ms before the newcomer's try was over",
        tried_by - alive_until
    );
    match newcomer {
        Err(err) if err.is_busy() => {}
        Err(err) => panic!("the newcomer's try failed: {err}"),
        Ok(guard) => panic!(
            "a newcomer took the free lock (fence {}) ahead of a live queued waiter",
            guard.fence()
        ),
    }
    // The try served the queue first: the free lock went to the frozen waiter, for its claim.
    let granted = locks.inspect("turn").await.unwrap().holder.unwrap();
    assert_eq!(granted.description.as_ref(), Some(&described));
    waiter.signal(Signal::SIGCONT).unwrap();
    tokio::task::block_in_place(|| finish(std::slice::from_mut(&mut waiter)));
    let grants: Vec<String> = redis::cmd("LRANGE")
        .arg("test:grants")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(grants, [described]);
}

/// Starts a process holding `kind` (`read`, `write`, `permits:N`) of lock `name` with a 1 s lease, and waits until it
/// holds.
fn holding_process(server: &RedisServer, name: &str, kind: &str) -> leasehold_tests::ChildGuard {
    let mut holder = worker(&["kind-hold", &server.url(), name, kind, "1000"]);
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let line = tokio::task::block_in_place(|| read_line(&mut out));
    assert!(line.starts_with("acquired "), "{line:?}");
    holder
}

/// Kills `holder` and returns when `acquire` got what it held: within its 1 s lease and a heartbeat.
async fn freed_after_kill<T>(
    holder: leasehold_tests::ChildGuard,
    acquire: impl std::future::Future<Output = T>,
) -> T {
    holder.signal(Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    let got = within(Duration::from_secs(5), "the share freed", acquire).await;
    assert!(
        killed.elapsed() <= Duration::from_millis(1000 + 1000),
        "granted {:?} after the kill: the share outlived its lease and a heartbeat",
        killed.elapsed()
    );
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_reader_frees_its_share_within_its_lease() {
    let server = RedisServer::start();
    let reader = holding_process(&server, "doc", "read");
    let locks = connect(&server).await;
    let rw = locks.rw_lock("doc");
    let other = rw.read().await.unwrap();
    assert!(rw.try_write().await.unwrap_err().is_busy());
    other.release().await.unwrap();
    let writing = freed_after_kill(reader, rw.write()).await.unwrap();
    writing.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_writer_frees_the_lock_within_its_lease() {
    let server = RedisServer::start();
    let writer = holding_process(&server, "doc", "write");
    let locks = connect(&server).await;
    let rw = locks.rw_lock("doc");
    assert!(rw.try_read().await.unwrap_err().is_busy());
    let reading = freed_after_kill(writer, rw.read()).await.unwrap();
    reading.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_permit_holder_gives_its_permit_back_within_its_lease() {
    let server = RedisServer::start();
    let holder = holding_process(&server, "pool", "permits:2");
    let locks = connect(&server).await;
    let sem = locks.semaphore("pool", 2);
    let mine = sem.try_acquire().await.unwrap();
    assert!(
        sem.try_acquire().await.unwrap_err().is_busy(),
        "both permits held"
    );
    let theirs = freed_after_kill(holder, sem.acquire()).await.unwrap();
    theirs.release().await.unwrap();
    mine.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_cut_off_acquires_leak_no_permit() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let sem = locks.semaphore("pool", 2);
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let sem = sem.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..2_500u64 {
                // Cut off at a point that moves through the whole acquire: before, during and after the call.
                let cut = Duration::from_micros((i * 37 + t * 101) % 900);
                if let Ok(Ok(permit)) = tokio::time::timeout(cut, sem.acquire()).await {
                    if i % 2 == 0 {
                        permit.release().await.unwrap();
                    } else {
                        drop(permit);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Background releases and queue leaves settle; then both permits are free and nobody waits.
    assert!(locks.flush_releases(Duration::from_secs(10)).await);
    let both = within(
        Duration::from_secs(10),
        "both permits free",
        sem.acquire_many(2),
    )
    .await
    .unwrap();
    both.release().await.unwrap();
    wait_for_queue_len(&server, "pool", 0).await;
}

/// Polls `inspect` until the lock `name` counts `n` live waiters (a server-side state that lapses with time: no event
/// to await), at most `limit`.
async fn await_waiting(locks: &leasehold::Client, name: &str, n: u64, limit: Duration) {
    within(limit, "the waiter count", async {
        while locks.inspect(name).await.unwrap().waiting_clients != n {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_waiter_stops_counting_once_its_liveness_passed() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mutex = locks.mutex("relay").lock().await.unwrap();
    let fair = locks.fair_mutex("ledger").lock().await.unwrap();
    let mut waiters = [
        worker(&["hold", &server.url(), "relay", "30000"]),
        worker(&["fair-wait", &server.url(), "ledger", "1"]),
    ];
    for name in ["relay", "ledger"] {
        await_waiting(&locks, name, 1, Duration::from_secs(10)).await;
    }
    for waiter in &mut waiters {
        waiter.signal(Signal::SIGKILL).unwrap();
        tokio::task::block_in_place(|| waiter.wait_timeout(Duration::from_secs(10)))
            .expect("the killed waiter is gone");
    }
    // Their entries stay in the queues until a release pops them, but they count only while live (3 s after the
    // last heartbeat), not until the holder lets go.
    let started = Instant::now();
    for name in ["relay", "ledger"] {
        await_waiting(&locks, name, 0, Duration::from_secs(10)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(mutex.is_held() && fair.is_held());
    mutex.release().await.unwrap();
    fair.release().await.unwrap();
}
