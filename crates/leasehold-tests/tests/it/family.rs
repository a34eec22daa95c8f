//! The queued kinds in one process: the fair mutex, the read-write lock and the semaphore (admission, queue order,
//! leaving the queue, leases). Across processes: `exclusion.rs`.

use std::time::Duration;

use leasehold::Error;
use leasehold_tests::RedisServer;

use crate::{connect, redis_conn, within};

/// Waits until the queue of the lock `name` has `n` entries (a server-side state: polled, no event to await).
pub async fn wait_for_queue_len(server: &RedisServer, name: &str, n: usize) {
    let mut conn = redis_conn(server).await;
    within(Duration::from_secs(10), "waiters queued", async {
        loop {
            let len: usize = redis::cmd("LLEN")
                .arg(format!("leasehold:{{{name}}}:queue"))
                .query_async(&mut conn)
                .await
                .unwrap();
            if len == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

async fn exists(server: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(&mut redis_conn(server).await)
        .await
        .unwrap()
        == 1
}

#[tokio::test]
async fn a_semaphore_grants_its_permits_and_no_more() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let sem = locks.semaphore("pool", 3);
    let a = sem.try_acquire().await.unwrap();
    let b = sem.try_acquire_many(2).await.unwrap();
    assert!(sem.try_acquire().await.unwrap_err().is_busy());
    assert!(b.fence() > a.fence(), "every grant draws its own fence");
    b.release().await.unwrap();
    let c = sem.try_acquire_many(2).await.unwrap();
    assert!(sem.try_acquire().await.unwrap_err().is_busy());
    a.release().await.unwrap();
    c.release().await.unwrap();
    assert!(
        !exists(&server, "leasehold:{pool}").await,
        "nothing held, nothing left"
    );
}

#[tokio::test]
async fn bad_permit_counts_are_typed_errors() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    for (permits, k) in [(0, 1), (3, 0), (3, 4), (leasehold::MAX_PERMITS + 1, 1)] {
        let err = locks
            .semaphore("pool", permits)
            .try_acquire_many(k)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidArgument(leasehold::InvalidArgument::BadPermits { .. })
            ),
            "{permits} permits, {k} asked: {err}"
        );
    }
}

#[tokio::test]
async fn a_large_request_at_the_head_holds_back_the_smaller_ones_behind_it() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let sem = locks.semaphore("pool", 2);
    let held = sem.try_acquire().await.unwrap();
    let big = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire_many(2).await.unwrap() }
    });
    wait_for_queue_len(&server, "pool", 1).await;
    // One permit is free, but the request for two came first.
    assert!(sem.try_acquire().await.unwrap_err().is_busy());
    let small = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.unwrap() }
    });
    wait_for_queue_len(&server, "pool", 2).await;
    held.release().await.unwrap();
    let big = within(Duration::from_secs(5), "the large request granted", big)
        .await
        .unwrap();
    assert!(!small.is_finished(), "the small request waits its turn");
    big.release().await.unwrap();
    let small = within(Duration::from_secs(5), "the small request granted", small)
        .await
        .unwrap();
    small.release().await.unwrap();
}

#[tokio::test]
async fn a_fair_mutex_grants_in_order_of_arrival() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let fair = locks.fair_mutex("ledger");
    let holder = fair.lock().await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..6 {
        // Each waiter on a client of its own, queued only after the one before it.
        let locks = connect(&server).await;
        let order_tx = order_tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = locks.fair_mutex("ledger").lock().await.unwrap();
            order_tx.send(i).unwrap();
            guard.release().await.unwrap();
        }));
        wait_for_queue_len(&server, "ledger", i + 1).await;
    }
    // A newcomer cannot barge ahead of the queue.
    assert!(fair.try_lock().await.unwrap_err().is_busy());
    holder.release().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..6 {
        order.push(
            within(
                Duration::from_secs(10),
                "every waiter served",
                order_rx.recv(),
            )
            .await
            .unwrap(),
        );
    }
    assert_eq!(order, (0..6).collect::<Vec<_>>());
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test]
async fn a_waiter_that_gives_up_leaves_no_trace() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let fair = locks.fair_mutex("ledger");
    let holder = fair.lock().await.unwrap();
    let err = fair
        .lock_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    // A dropped wait leaves too.
    let dropped = tokio::spawn({
        let fair = fair.clone();
        async move { fair.lock().await }
    });
    wait_for_queue_len(&server, "ledger", 1).await;
    dropped.abort();
    wait_for_queue_len(&server, "ledger", 0).await;
    let waiters: usize = redis::cmd("HLEN")
        .arg("leasehold:{ledger}:waiters")
        .query_async(&mut redis_conn(&server).await)
        .await
        .unwrap();
    assert_eq!(waiters, 0, "no entry left behind");
    holder.release().await.unwrap();
    // The lock is free at once for a newcomer: nobody is queued.
    fair.try_lock().await.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn readers_share_and_a_waiting_writer_holds_back_new_readers() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let rw = locks.rw_lock("config");
    let r1 = rw.read().await.unwrap();
    let r2 = rw.try_read().await.unwrap();
    assert!(rw.try_write().await.unwrap_err().is_busy());
    let writer = tokio::spawn({
        let rw = rw.clone();
        async move { rw.write().await.unwrap() }
    });
    wait_for_queue_len(&server, "config", 1).await;
    assert!(
        rw.try_read().await.unwrap_err().is_busy(),
        "a new reader waits behind the writer"
    );
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let rw = rw.clone();
            tokio::spawn(async move { rw.read().await.unwrap() })
        })
        .collect();
    wait_for_queue_len(&server, "config", 4).await;
    r1.release().await.unwrap();
    assert!(!writer.is_finished(), "one reader still holds");
    r2.release().await.unwrap();
    let w = within(Duration::from_secs(5), "the writer granted", writer)
        .await
        .unwrap();
    assert!(readers.iter().all(|r| !r.is_finished()));
    w.release().await.unwrap();
    // The readers queued behind the writer are admitted together.
    let mut shares = Vec::new();
    for reader in readers {
        shares.push(
            within(Duration::from_secs(5), "readers granted", reader)
                .await
                .unwrap(),
        );
    }
    assert!(shares.iter().all(|s| s.is_held()));
    for share in shares {
        share.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_name_serves_one_kind() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mutex = locks.mutex("shared-name").try_lock().await.unwrap();
    let err = locks
        .semaphore("shared-name", 2)
        .try_acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::WrongKind { name, found: leasehold::LockKind::Mutex } if name == "shared-name"
        ),
        "{err}"
    );
    mutex.release().await.unwrap();
    let share = locks.rw_lock("other").read().await.unwrap();
    let err = locks.fair_mutex("other").try_lock().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongKind {
                found: leasehold::LockKind::ReadWrite,
                ..
            }
        ),
        "{err}"
    );
    let err = locks.mutex("other").try_lock().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongKind {
                found: leasehold::LockKind::ReadWrite,
                ..
            }
        ),
        "{err}"
    );
    share.release().await.unwrap();
}

#[tokio::test]
async fn a_queued_kind_hold_is_kept_alive_and_a_crashed_one_frees_its_permit() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ttl = Duration::from_millis(300);
    let sem = locks.semaphore("pool", 1).ttl(ttl);
    let kept = sem.acquire().await.unwrap();
    tokio::time::sleep(ttl * 3).await; // lets three leases pass: the keeper must have renewed it
    assert!(kept.is_held());
    assert!(sem.try_acquire().await.unwrap_err().is_busy());
    kept.release().await.unwrap();
    // A holder that stops renewing (as if it crashed) gives its permit back after its lease.
    let crashed = sem.try_acquire().await.unwrap();
    crashed.leave_to_expire();
    let next = within(Duration::from_secs(5), "the permit returns", sem.acquire())
        .await
        .unwrap();
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_writer_downgrades_without_letting_another_writer_in() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let rw = locks.rw_lock("config").ttl(Duration::from_secs(1));
    let writing = rw.write().await.unwrap();
    let fence = writing.fence();
    let reader = tokio::spawn({
        let rw = rw.clone();
        async move { rw.read().await.unwrap() }
    });
    wait_for_queue_len(&server, "config", 1).await;
    let writer = tokio::spawn({
        let rw = rw.clone();
        async move { rw.write().await.unwrap() }
    });
    wait_for_queue_len(&server, "config", 2).await;
    let old_lease = writing.lease();
    let reading = writing.downgrade().await.unwrap();
    assert!(!old_lease.is_held(), "the write grant's lease ended");
    assert_eq!(reading.fence(), fence, "the share keeps the grant's fence");
    // The reader at the head joins at once; the writer behind it still waits.
    let other = within(Duration::from_secs(5), "the queued reader admitted", reader)
        .await
        .unwrap();
    // Two renewals of the shares (each puts the shortest lease left back up): the downgraded share is renewed as its
    // own hold, past its first lease.
    let shortest = || async {
        let info = locks.inspect("config").await.unwrap();
        info.holders.iter().filter_map(|h| h.remaining).min()
    };
    within(
        Duration::from_secs(10),
        "two renewals of the shares",
        async {
            let (mut last, mut renewals) = (shortest().await, 0);
            while renewals < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await; // polls the server's leases: no event to await
                let now = shortest().await;
                if now > last {
                    renewals += 1;
                }
                last = now;
            }
        },
    )
    .await;
    assert!(reading.is_held() && other.is_held());
    assert!(!writer.is_finished());
    let info = locks.inspect("config").await.unwrap();
    assert_eq!(info.holders.len(), 2);
    assert!(info
        .holders
        .iter()
        .all(|h| h.mode == leasehold::HoldMode::Read));
    reading.release().await.unwrap();
    other.release().await.unwrap();
    let w = within(Duration::from_secs(5), "the writer granted", writer)
        .await
        .unwrap();
    assert!(w.fence() > fence);
    w.release().await.unwrap();
}

#[tokio::test]
async fn a_reentrant_guard_reenters_without_a_round_trip_and_the_last_release_frees() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ledger = locks.reentrant_mutex("ledger");
    let outer = ledger.lock().await.unwrap();
    let calls = server.command_calls("evalsha");
    let inner = outer.reenter().unwrap();
    assert_eq!(server.command_calls("evalsha"), calls, "no round trip");
    assert_eq!(
        (inner.fence(), inner.token()),
        (outer.fence(), outer.token())
    );
    assert_eq!(outer.depth(), 2);
    inner.release().await.unwrap();
    assert!(outer.is_held(), "the inner release leaves the lock held");
    assert!(ledger.try_lock().await.unwrap_err().is_busy());
    // A lock() is a new holder: it waits like any other, also from the holder's own task.
    let err = ledger
        .lock_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    let mut levels = vec![outer];
    while levels.len() < leasehold::MAX_DEPTH {
        levels.push(levels[0].reenter().unwrap());
    }
    assert!(matches!(
        levels[0].reenter().unwrap_err(),
        Error::TooDeep { .. }
    ));
    for level in levels {
        level.release().await.unwrap();
    }
    ledger.try_lock().await.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn a_token_enters_from_another_client_and_each_level_keeps_the_lock() {
    let server = RedisServer::start();
    let outer_client = connect(&server).await;
    let inner_client = connect(&server).await;
    let ttl = Duration::from_millis(400);
    let outer = outer_client
        .reentrant_mutex("ledger")
        .ttl(ttl)
        .lock()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let m = outer_client.reentrant_mutex("ledger");
        async move { m.lock().await.unwrap() }
    });
    wait_for_queue_len(&server, "ledger", 1).await;
    let nested_mutex = inner_client.reentrant_mutex("ledger").ttl(ttl);
    // At once, although someone waits: the group holds the lock.
    let inner = nested_mutex.lock_as(outer.token()).await.unwrap();
    assert_eq!(
        inner.fence(),
        outer.fence(),
        "a re-entry keeps the grant's fence"
    );
    assert_ne!(inner.token(), outer.token());
    let info = outer_client.inspect("ledger").await.unwrap();
    assert_eq!(info.kind, Some(leasehold::LockKind::Reentrant));
    assert_eq!(info.holders.len(), 2, "the hold count lives in Redis");
    // The outer one releases first: the nested holder keeps the lock (its lease is kept by its own client).
    outer.release().await.unwrap();
    tokio::time::sleep(ttl * 2).await; // two leases: the nested hold is renewed on its own
    assert!(inner.is_held());
    assert!(!waiter.is_finished());
    let (inner_fence, inner_token) = (inner.fence(), inner.token().to_owned());
    inner.release().await.unwrap();
    let next = within(Duration::from_secs(5), "the waiter granted", waiter)
        .await
        .unwrap();
    assert!(next.fence() > inner_fence);
    // A token that holds nothing enters nothing.
    let err = nested_mutex.lock_as(&inner_token).await.unwrap_err();
    assert!(matches!(err, Error::NotOwner { .. }), "{err}");
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_crashed_nested_holder_frees_its_level_within_its_lease() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ttl = Duration::from_millis(300);
    let mutex = locks.reentrant_mutex("ledger").ttl(ttl);
    let outer = mutex.lock().await.unwrap();
    let nested = mutex.lock_as(outer.token()).await.unwrap();
    // As if its process died: the nested hold is no longer renewed.
    nested.leave_to_expire();
    outer.release().await.unwrap();
    let next = within(
        Duration::from_secs(5),
        "the lock free after the nested lease",
        mutex.lock(),
    )
    .await
    .unwrap();
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_read_share_and_a_free_permit_cost_one_round_trip() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let rw = locks.rw_lock("doc");
    let sem = locks.semaphore("pool", 2);
    // Warm: the scripts loaded, the wake-up channel subscribed (once per client).
    rw.read().await.unwrap().release().await.unwrap();
    sem.acquire().await.unwrap().release().await.unwrap();
    let one_call = |before: u64| server.command_calls("evalsha") - before;

    let before = server.command_calls("evalsha");
    let first = rw.read().await.unwrap();
    assert_eq!(one_call(before), 1, "a read share with no writer: one call");
    let before = server.command_calls("evalsha");
    let second = rw.read().await.unwrap();
    assert_eq!(
        one_call(before),
        1,
        "a read share next to another: one call"
    );

    let before = server.command_calls("evalsha");
    let permit = sem.acquire().await.unwrap();
    assert_eq!(one_call(before), 1, "a free permit: one call");
    let before = server.command_calls("evalsha");
    let both = sem.try_acquire().await.unwrap();
    assert_eq!(one_call(before), 1);

    for guard in [first, second, permit, both] {
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_queued_kind_releases_cleanly_after_a_mutex_of_the_same_name() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    // The mutex's release leaves its token in the released key (a string) for the rest of its lease.
    locks
        .mutex("job")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for (permits, fair) in [(Some(2), false), (None, true)] {
        let guard = match permits {
            Some(n) => locks.semaphore("job", n).try_acquire().await.unwrap(),
            None => locks.fair_mutex("job").try_lock().await.unwrap(),
        };
        guard.release().await.unwrap();
        assert!(
            !exists(&server, "leasehold:{job}").await,
            "released in full (fair: {fair})"
        );
    }
}

/// A plain mutex and a read-write lock taken and given back over and over on one name (what a plain `leasehold run`
/// beside `--shared` runs does): each must find the other as [`Error::WrongKind`] or busy, never as a key leasehold did
/// not write. The refusing script classifies the key itself; a later read found it gone whenever the other kind was
/// released in between, and said "it holds the string \"\"" (issue 33).
#[tokio::test]
async fn a_mutex_and_a_read_write_lock_on_one_name_never_see_each_other_as_foreign() {
    const ROUNDS: usize = 1500;
    let server = RedisServer::start();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let locks = connect(&server).await;
        tasks.push(tokio::spawn(async move {
            let mut other_kind = 0;
            for _ in 0..ROUNDS {
                let outcome = if i % 2 == 0 {
                    match locks.mutex("cfg").try_lock().await {
                        Ok(guard) => guard.release().await.map(|()| false),
                        Err(Error::WrongKind { found, .. }) => {
                            assert_eq!(found, leasehold::LockKind::ReadWrite);
                            Ok(true)
                        }
                        Err(e) => Err(e),
                    }
                } else {
                    match locks.rw_lock("cfg").try_read().await {
                        Ok(guard) => guard.release().await.map(|()| false),
                        Err(Error::WrongKind { found, .. }) => {
                            assert_eq!(found, leasehold::LockKind::Mutex);
                            Ok(true)
                        }
                        Err(e) => Err(e),
                    }
                };
                match outcome {
                    Ok(seen) => other_kind += usize::from(seen),
                    Err(e) if e.is_busy() => {}
                    Err(e) => panic!("task {i}: {e} ({e:?})"),
                }
            }
            other_kind
        }));
    }
    let mut other_kind = 0;
    for task in tasks {
        other_kind += task.await.unwrap();
    }
    // The two kinds did meet on the name.
    assert!(other_kind > 0);
}
