//! Replica-acknowledged grants (`Builder::replicas`): `WAIT` pipelined after every acquire and renewal.

use std::time::Duration;

use leasehold::{Error, LossReason};
use leasehold_tests::RedisServer;

use crate::within;

/// A primary and one replica of it, linked.
fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while replica
        .info_field("replication", "master_link_status")
        .as_deref()
        != Some("up")
        || primary
            .info_field("replication", "connected_slaves")
            .as_deref()
            != Some("1")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never linked"
        );
        std::thread::sleep(Duration::from_millis(10)); // polls server state: nothing announces the link
    }
    (primary, replica)
}

async fn client(server: &RedisServer, replicas: u32) -> leasehold::Client {
    leasehold::Client::builder(&server.url())
        .unwrap()
        .replicas(replicas)
        .replica_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_grant_its_replica_acknowledges_is_granted_and_kept() {
    let (primary, _replica) = primary_with_replica();
    let locks = client(&primary, 1).await;
    let guard = locks
        .mutex("acked")
        .ttl(Duration::from_millis(600))
        .try_lock()
        .await
        .unwrap();
    // Renewals are acknowledged too: the lease outlives three of its lengths.
    tokio::time::sleep(Duration::from_millis(1800)).await; // time passing is what is tested
    assert!(guard.is_held(), "{:?}", guard.loss());
    // Every kind's grants wait for the replica.
    let fair = locks.fair_mutex("acked-fair").try_lock().await.unwrap();
    let read = locks.rw_lock("acked-rw").try_read().await.unwrap();
    let permit = locks
        .semaphore("acked-sem", 2)
        .try_acquire(1)
        .await
        .unwrap();
    let outer = locks.reentrant_mutex("acked-re").try_lock().await.unwrap();
    let nested = locks
        .reentrant_mutex("acked-re")
        .lock_as(outer.token())
        .await
        .unwrap();
    assert!(primary.command_calls("wait") >= 6);
    for guard in [guard, fair, read, permit] {
        guard.release().await.unwrap();
    }
    nested.release().await.unwrap();
    outer.release().await.unwrap();
}

#[tokio::test]
async fn a_grant_no_replica_acknowledges_is_released_and_reported_with_the_count() {
    let lonely = RedisServer::start();
    let locks = client(&lonely, 1).await;
    for attempt in [
        locks.mutex("unacked").try_lock().await.map(drop),
        locks.fair_mutex("unacked-fair").try_lock().await.map(drop),
        locks
            .semaphore("unacked-sem", 3)
            .try_acquire(1)
            .await
            .map(drop),
    ] {
        match attempt {
            Err(Error::NotReplicated {
                acked: 0,
                required: 1,
                ..
            }) => {}
            other => panic!("expected NotReplicated, got {other:?}"),
        }
    }
    // The grants were released: another client (that does not wait for replicas) gets each lock.
    let plain = leasehold::Client::connect(&lonely.url()).await.unwrap();
    within(
        Duration::from_secs(5),
        "the unacknowledged grants released",
        async {
            loop {
                let free = plain.inspect("unacked").await.unwrap().holder.is_none()
                    && plain
                        .inspect("unacked-fair")
                        .await
                        .unwrap()
                        .holder
                        .is_none()
                    && plain.inspect("unacked-sem").await.unwrap().holder.is_none();
                if free {
                    break;
                }
                // The releases run in the background: polled until the server shows them.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        },
    )
    .await;
    // A waiting acquire reports it too, instead of waiting on.
    let held = plain.mutex("unacked").try_lock().await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .mutex("unacked")
                .lock_timeout(Duration::from_secs(10))
                .await
        }
    });
    crate::wait_for_busy_attempts(&lonely, 1).await;
    held.release().await.unwrap();
    match within(Duration::from_secs(10), "the waiter's answer", waiter)
        .await
        .unwrap()
    {
        Err(Error::NotReplicated {
            acked: 0,
            required: 1,
            ..
        }) => {}
        other => panic!("expected NotReplicated, got {other:?}"),
    }
}

#[tokio::test]
async fn a_lease_whose_renewals_the_replica_stops_acknowledging_ends_at_its_deadline() {
    let (primary, mut replica) = primary_with_replica();
    let locks = client(&primary, 1).await;
    let guard = locks
        .mutex("orphaned-replica")
        .ttl(Duration::from_millis(900))
        .try_lock()
        .await
        .unwrap();
    let lost = guard.lost();
    replica.kill();
    // No renewal is acknowledged from now on: the lease ends at its last acknowledged deadline, and the holder is
    // told, although the primary itself kept extending the key.
    let reason = within(Duration::from_secs(5), "the loss signal", lost).await;
    assert_eq!(reason, LossReason::Expired);
    assert!(!guard.is_held());
}
