//! Waiting is event-driven: woken by the release, bounded by the holder's lease, no stampede.

use std::sync::Arc;
use std::time::Duration;

use leasehold_tests::RedisServer;
use tokio::sync::Barrier;
use tokio::time::Instant;

use crate::{connect, wait_for_busy_attempts, within};

#[tokio::test]
async fn a_waiter_acquires_right_after_the_release_not_at_the_lease_end() {
    let server = RedisServer::start();
    let holder_client = connect(&server).await;
    let waiter_client = connect(&server).await;
    let holder = holder_client
        .mutex("slow")
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();

    let waiter = tokio::spawn(async move {
        let guard = waiter_client.mutex("slow").lock().await.unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    // Let the waiter reach its wait: it must have failed once, so the lock's busy counter moved.
    wait_for_busy_attempts(&server, 2).await;

    let released = Instant::now();
    holder.release().await.unwrap();
    let acquired = within(Duration::from_secs(10), "waiter grant", waiter)
        .await
        .unwrap();
    let delay = acquired.duration_since(released);
    // A poll or lease-bound wake would take 60 s here; a wake-up by the release takes one round trip or two.
    assert!(
        delay < Duration::from_millis(500),
        "waiter took {delay:?} after the release"
    );
}

#[tokio::test]
async fn many_local_waiters_cost_constant_attempts_per_release() {
    const WAITERS: usize = 40;
    let server = RedisServer::start();
    let holder_client = connect(&server).await;
    let waiters_client = connect(&server).await;
    let holder = holder_client
        .mutex("herd")
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();

    let ready = Arc::new(Barrier::new(WAITERS + 1));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let client = waiters_client.clone();
            let ready = Arc::clone(&ready);
            tokio::spawn(async move {
                ready.wait().await;
                let guard = client
                    .mutex("herd")
                    .ttl(Duration::from_secs(60))
                    .lock()
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
                guard.release().await.unwrap();
            })
        })
        .collect();
    ready.wait().await;
    // Every waiter made its first (fast-path) attempt, plus the queue head its subscribed one.
    wait_for_busy_attempts(&server, WAITERS as u64 + 1).await;
    server.config_resetstat();

    holder.release().await.unwrap();
    for task in tasks {
        within(Duration::from_secs(30), "all waiters served", task)
            .await
            .unwrap();
    }
    // Each release wakes one local contender; the next in the local queue makes one attempt that finds it busy.
    // (Every task finished with its guard, so there were exactly WAITERS grants.)
    let busy = server.command_calls("pttl");
    assert!(
        busy <= 2 * WAITERS as u64,
        "{busy} busy attempts for {WAITERS} releases: waiters stampede"
    );
}

#[tokio::test]
async fn a_crashed_holder_costs_a_waiter_at_most_its_lease() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    // A holder that vanishes without releasing: its key lapses after 300 ms and no wake-up is ever published.
    let mut conn = crate::redis_conn(&server).await;
    let _: () = redis::cmd("SET")
        .arg("leasehold:{orphan}")
        .arg("dl1:00000000000000000000000000000000")
        .arg("PX")
        .arg(300)
        .query_async(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    let guard = within(
        Duration::from_secs(5),
        "grant after lapse",
        locks.mutex("orphan").lock(),
    )
    .await
    .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "cannot win before the lease ends: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(1500),
        "slept past the lease end: {waited:?}"
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn lock_timeout_gives_up_at_the_deadline() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let _held = locks.mutex("busy").try_lock().await.unwrap();
    let started = Instant::now();
    let err = locks
        .mutex("busy")
        .lock_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    match err {
        leasehold::Error::Timeout {
            waited: reported, ..
        } => {
            assert!(reported >= Duration::from_millis(200));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(2));
}

#[tokio::test]
async fn a_releaser_cannot_barge_ahead_of_a_queued_waiter() {
    let server = RedisServer::start();
    let looper = connect(&server).await;
    let waiter_client = connect(&server).await;
    let held = looper.mutex("turns").try_lock().await.unwrap();
    let (done, until_done) = tokio::sync::oneshot::channel::<()>();
    let waiter = tokio::spawn(async move {
        let guard = waiter_client.mutex("turns").lock().await.unwrap();
        let fence = guard.fence();
        // Held until the looper has tried: the lock was handed over, so it must not be free meanwhile.
        until_done.await.unwrap();
        guard.release().await.unwrap();
        fence
    });
    wait_for_busy_attempts(&server, 1).await;

    let first = held.fence();
    held.release().await.unwrap();
    // The release handed the lock to the queued client: the releaser's immediate retry must not win.
    let retry = looper.mutex("turns").try_lock().await;
    assert!(
        retry.as_ref().is_err_and(|e| e.is_busy()),
        "the releaser barged in: {retry:?}"
    );
    done.send(()).unwrap();
    let waiter_fence = within(Duration::from_secs(5), "waiter's turn", waiter)
        .await
        .unwrap();
    assert!(waiter_fence > first);
    crate::lock_and_release(&looper, "turns").await;
}

#[tokio::test]
async fn a_woken_client_that_stopped_waiting_passes_its_turn_on() {
    let server = RedisServer::start();
    let holder_client = connect(&server).await;
    let quitter = connect(&server).await;
    let patient = connect(&server).await;
    let holder = holder_client
        .mutex("relay")
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();
    // The quitter queues first, then gives up; its place in the Redis queue stays behind.
    let err = quitter
        .mutex("relay")
        .lock_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    let waiter = tokio::spawn(async move { patient.mutex("relay").lock().await.unwrap() });
    wait_for_busy_attempts(&server, 3).await;
    assert_eq!(
        holder_client
            .inspect("relay")
            .await
            .unwrap()
            .waiting_clients,
        2
    );

    let released = Instant::now();
    holder.release().await.unwrap();
    // The quitter is woken first, has nobody waiting, and hands the turn on at once (not after a 60 s lease).
    let guard = within(Duration::from_secs(10), "relayed grant", waiter)
        .await
        .unwrap();
    let delay = released.elapsed();
    assert!(delay < Duration::from_millis(500), "took {delay:?}");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_queued_client_that_vanished_is_skipped() {
    let server = RedisServer::start();
    let holder_client = connect(&server).await;
    let holder = holder_client
        .mutex("skip")
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();
    {
        // A client queues and then disappears entirely (its process ended): its subscriber connection closes.
        let gone = connect(&server).await;
        let wait = tokio::spawn(async move { gone.mutex("skip").lock().await.map(drop) });
        wait_for_busy_attempts(&server, 2).await;
        wait.abort();
        assert!(wait.await.unwrap_err().is_cancelled());
    }
    // Redis sees its subscriber connection close.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut conn = crate::redis_conn(&server).await;
    loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg("leasehold:wake:*")
            .query_async(&mut conn)
            .await
            .unwrap();
        if channels.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the vanished client's subscription stayed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let patient = connect(&server).await;
    let waiter = tokio::spawn(async move { patient.mutex("skip").lock().await.unwrap() });
    wait_for_busy_attempts(&server, 4).await;

    let released = Instant::now();
    holder.release().await.unwrap();
    let guard = within(
        Duration::from_secs(10),
        "grant past a vanished client",
        waiter,
    )
    .await
    .unwrap();
    assert!(
        released.elapsed() < Duration::from_millis(500),
        "took {:?}",
        released.elapsed()
    );
    guard.release().await.unwrap();
}
