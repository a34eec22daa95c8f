//! Cancel safety: acquire futures dropped at random points leave no lock behind.

use std::time::Duration;

use leasehold_tests::{RedisServer, XorShift};
use tokio::time::Instant;

use crate::connect;

async fn assert_no_lock_left(locks: &leasehold::Client, names: &[String]) {
    // Every grant, seen or not, must be released by its background release long before the 30 s lease ends.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut held = Vec::new();
        for name in names {
            let info = locks.inspect(name).await.unwrap();
            if info.holder.is_some() {
                held.push(info);
            }
        }
        if held.is_empty() {
            break;
        }
        // The whole view of each (token, time left, fence, queue): a full lease left means a grant to an attempt
        // nobody released, a claim (2 s at most) a hand-off to a waiter that left.
        assert!(Instant::now() < deadline, "orphaned locks {held:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        locks.kept_leases(),
        0,
        "the keeper still renews leases nobody holds"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_that_land_after_the_caller_gave_up_are_released() {
    let server = RedisServer::start();
    let names: Vec<String> = (0..20).map(|i| format!("late:{i}")).collect();
    // One client per acquire: one client's acquires queue behind the calls it has out and are never sent once their
    // callers gave up (see `a_queued_acquire_dropped_before_it_was_sent_is_never_sent`); here every one is sent.
    let mut clients = Vec::new();
    for _ in &names {
        clients.push(connect(&server).await);
    }
    let locks = clients[0].clone();
    // Load the scripts first: a NOSCRIPT reply after the pause would otherwise end the attempts without a grant.
    crate::lock_and_release(&locks, "warm").await;
    server.config_resetstat();
    // The server holds every client's commands for 300 ms: each acquire below is sent, waits in the server, and is
    // granted only after its caller gave up at 50 ms.
    crate::pause(&server, 300).await;
    let attempts: Vec<_> = names
        .iter()
        .zip(&clients)
        .map(|(name, client)| {
            let mutex = client.mutex(name).ttl(Duration::from_secs(30));
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(50), mutex.lock()).await
            })
        })
        .collect();
    for attempt in attempts {
        assert!(
            attempt.await.unwrap().is_err(),
            "an attempt finished while the server was paused"
        );
    }
    for client in &clients {
        assert_no_lock_left(client, &names).await;
    }
    // Every attempt was granted after its caller left: each lock drew a fence.
    for name in &names {
        assert!(
            locks.inspect(name).await.unwrap().last_fence.is_some(),
            "{name} was never granted: the test proves nothing"
        );
    }
}

// One thread: the tasks start in the order they are spawned, so the first ones are the calls sent at once.
#[tokio::test(flavor = "current_thread")]
async fn a_queued_acquire_dropped_before_it_was_sent_is_never_sent() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    crate::lock_and_release(&locks, "warm").await;
    let names: Vec<String> = (0..3 * leasehold::__private::MAX_IN_FLIGHT)
        .map(|i| format!("queued:{i}"))
        .collect();
    // While the server is paused, this client's first calls stay out and the other acquires queue behind them.
    crate::pause(&server, 300).await;
    // The queued callers give up first; then those whose calls are out (which frees their slots, with nothing left
    // to send).
    let sent_at_once = leasehold::__private::MAX_IN_FLIGHT;
    let attempts: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mutex = locks.mutex(name).ttl(Duration::from_secs(30));
            let patience = Duration::from_millis(if i < sent_at_once { 100 } else { 30 });
            tokio::spawn(async move { tokio::time::timeout(patience, mutex.lock()).await })
        })
        .collect();
    for attempt in attempts {
        assert!(attempt.await.unwrap().is_err());
    }
    assert_no_lock_left(&locks, &names).await;
    // The calls that were out were granted after their callers left (and released); the queued ones never left.
    let mut granted = Vec::new();
    for name in &names {
        if locks.inspect(name).await.unwrap().last_fence.is_some() {
            granted.push(name.clone());
        }
    }
    assert_eq!(granted, names[..sent_at_once]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_cut_off_at_random_points_leave_no_orphaned_lock() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ttl = Duration::from_secs(30);
    let mut rng = XorShift::new(0x5eed_1234_abcd_ef01);
    let mut cut_off = 0;
    for _round in 0..3 {
        let attempts: Vec<_> = (0..300)
            .map(|_| {
                // Few names, so many attempts contend and some are cut off while queued or waiting.
                let name = format!("cancel:{}", rng.next_u64() % 8);
                let cut = Duration::from_micros(rng.next_u64() % 3000);
                let locks = locks.clone();
                tokio::spawn(async move {
                    let mutex = locks.mutex(&name).ttl(ttl);
                    tokio::time::timeout(cut, mutex.lock()).await
                })
            })
            .collect();
        for attempt in attempts {
            match attempt.await.unwrap() {
                Ok(guard) => drop(guard.unwrap()),
                Err(_) => cut_off += 1,
            }
        }
    }
    assert!(
        cut_off > 0,
        "no attempt was cut off; the test proves nothing"
    );
    let names: Vec<String> = (0..8).map(|i| format!("cancel:{i}")).collect();
    assert_no_lock_left(&locks, &names).await;
}
