//! Failover, slot migration and a killed primary while a lock is held and waited for. Each test leaves the cluster
//! whole. The figures each prints (`measured: …`) are what DESIGN.md ("Failover on Redis") and the closing notes quote.

use std::time::{Duration, Instant};

use leasehold::Error;
use leasehold_tests::cluster::slot_of;
use leasehold_tests::RedisCluster;
use tokio::task::JoinHandle;

use crate::{connect, eventually, get, within};

fn lock_key(name: &str) -> String {
    format!("leasehold:{{{name}}}")
}

/// A task of `client` waiting for `name` (at most 60 s).
fn waiter(client: &leasehold::Client, name: &str) -> JoinHandle<Result<leasehold::Guard, Error>> {
    let client = client.clone();
    let name = name.to_owned();
    tokio::spawn(async move {
        client
            .mutex(&name)
            .lock_timeout(Duration::from_secs(60))
            .await
    })
}

/// Waits until the waiter's sharded wake-up channel for `name` is subscribed on the node that now serves the lock's
/// slot. The subscriber's cluster connection sends nothing else, so after a failover or a migration only its own
/// active re-subscription can bring the channel back (redis-rs alone restores it at the next command to the slot).
async fn resubscribed(cluster: &RedisCluster, name: &str, since: Instant) {
    let pattern = format!("{}:wake:*", lock_key(name));
    eventually(
        Duration::from_secs(10),
        "the wake-up channel re-subscribed",
        || {
            let node = cluster.primary_of_slot(slot_of(&lock_key(name)));
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("SHARDCHANNELS")
                .arg(&pattern)
                .query(&mut cluster.connection(node))
                .unwrap_or_default();
            !channels.is_empty()
        },
    )
    .await;
    println!(
        "measured: wake-up channel back on the slot's node {:.1?} after the fault",
        since.elapsed()
    );
}

/// Waits until `name`'s queue has an entry (the waiter reached the server).
async fn queued(cluster: &RedisCluster, name: &str) {
    let queue = format!("{}:queue", lock_key(name));
    eventually(Duration::from_secs(10), "the waiter queued", || {
        let node = cluster.primary_of_slot(slot_of(&queue));
        redis::cmd("LLEN")
            .arg(&queue)
            .query::<u64>(&mut cluster.connection(node))
            .unwrap()
            > 0
    })
    .await;
}

pub async fn a_lock_held_and_waited_for_survives_a_manual_failover(cluster: &mut RedisCluster) {
    let a = connect(cluster).await;
    let b = connect(cluster).await;
    let name = "failover";
    let held = a
        .mutex(name)
        .ttl(Duration::from_secs(2))
        .try_lock()
        .await
        .unwrap();
    let waiting = waiter(&b, name);
    queued(cluster, name).await;
    let primary = cluster.primary_of_slot(slot_of(&lock_key(name)));
    let replica = cluster.replica_of(primary);
    let started = Instant::now();
    cluster.failover(replica);
    println!(
        "measured: manual failover completed in {:.0?}",
        started.elapsed()
    );
    assert_eq!(cluster.primary_of_slot(slot_of(&lock_key(name))), replica);
    // The promoted replica has the lock (a manual failover waits for it to catch up), and the holder keeps renewing
    // it there: three leases later it is still held, by the same token.
    tokio::time::sleep(Duration::from_secs(6)).await; // three leases: the thing under test is time passing
    assert!(
        held.is_held(),
        "the holder lost its lease: {:?}",
        held.loss()
    );
    assert_eq!(get(cluster, &lock_key(name)).as_deref(), Some(held.token()));
    assert!(!waiting.is_finished(), "the waiter was granted a held lock");
    let fence = held.fence();
    let released = Instant::now();
    held.release().await.unwrap();
    let next = within(Duration::from_secs(10), "the waiter's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    println!(
        "measured: after the failover, the waiter got the lock {:.0?} after the release",
        released.elapsed()
    );
    // The grant exists on the slot's primary. (The waiter's subscription may still sit on the demoted primary, now a
    // replica, which delivers sharded messages too while the new primary counts no subscriber: a grant message must
    // never depend on that count, or it names a grant that was never stored.)
    assert_eq!(get(cluster, &lock_key(name)).as_deref(), Some(next.token()));
    assert!(next.fence() > fence);
    next.release().await.unwrap();
    cluster.wait_stable();
}

pub async fn a_lock_whose_slot_migrates_while_held_and_waited_for_stays_exclusive(
    cluster: &mut RedisCluster,
) {
    let a = connect(cluster).await;
    let b = connect(cluster).await;
    let name = "migrating";
    let slot = slot_of(&lock_key(name));
    let from = cluster.primary_of_slot(slot);
    let to = *cluster.primaries().iter().find(|&&p| p != from).unwrap();
    let held = a
        .mutex(name)
        .ttl(Duration::from_secs(2))
        .try_lock()
        .await
        .unwrap();
    let waiting = waiter(&b, name);
    queued(cluster, name).await;
    // Half-way (IMPORTING / MIGRATING, nothing moved yet): the holder keeps renewing and nobody else gets in.
    cluster.begin_migration(slot, to);
    tokio::time::sleep(Duration::from_secs(3)).await; // renewals must cross the half-migrated slot
    assert!(
        held.is_held(),
        "lost during the migration: {:?}",
        held.loss()
    );
    assert!(matches!(
        b.mutex(name).try_lock().await,
        Err(Error::Busy { .. }) | Err(Error::Redis(_))
    ));
    let moved = Instant::now();
    cluster.finish_migration(slot, to);
    assert_eq!(cluster.primary_of_slot(slot), to);
    resubscribed(cluster, name, moved).await;
    tokio::time::sleep(Duration::from_secs(3)).await; // renewals now follow MOVED to the new owner
    assert!(
        held.is_held(),
        "lost after the migration: {:?}",
        held.loss()
    );
    assert_eq!(get(cluster, &lock_key(name)).as_deref(), Some(held.token()));
    assert!(!waiting.is_finished(), "the waiter was granted a held lock");
    let fence = held.fence();
    let released = Instant::now();
    held.release().await.unwrap();
    let next = within(Duration::from_secs(10), "the waiter's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    println!(
        "measured: after the migration, the waiter got the lock {:.0?} after the release",
        released.elapsed()
    );
    assert!(
        next.fence() > fence,
        "the fence counter moved with the slot"
    );
    next.release().await.unwrap();
    // Put the slot back, so that later tests find the layout they expect.
    cluster.migrate_slot(slot, from);
}

pub async fn kill_9_of_the_locks_primary_never_gives_two_owners(cluster: &mut RedisCluster) {
    let a = connect(cluster).await;
    let b = connect(cluster).await;
    let name = "killed-primary";
    let key = lock_key(name);
    let slot = slot_of(&key);
    let held = a
        .mutex(name)
        .ttl(Duration::from_secs(10))
        .try_lock()
        .await
        .unwrap();
    let fence = held.fence();
    let waiting = waiter(&b, name);
    queued(cluster, name).await;
    let primary = cluster.primary_of_slot(slot);
    let replica = cluster.replica_of(primary);
    // The replica has the grant before the crash (replication is asynchronous: this is the ordinary case, and the
    // one a crash loses nothing in; `WAIT` makes it the only case).
    eventually(Duration::from_secs(5), "the replica has the lock", || {
        let mut con = cluster.connection(replica);
        let _: () = redis::cmd("READONLY").query(&mut con).unwrap();
        redis::cmd("GET")
            .arg(&key)
            .query::<Option<String>>(&mut con)
            .unwrap()
            .as_deref()
            == Some(held.token())
    })
    .await;
    let killed = Instant::now();
    cluster.kill(primary);
    let promoted = cluster.wait_primary_elected(slot);
    println!(
        "measured: kill -9 of the primary, replica promoted after {:.1?}",
        killed.elapsed()
    );
    assert_eq!(promoted, replica);
    resubscribed(cluster, name, killed).await;
    // The lock is reachable again once a call succeeds on the promoted replica.
    let mut unavailable = None;
    while unavailable.is_none() {
        match a.inspect(name).await {
            Ok(info) => {
                unavailable = Some(killed.elapsed());
                assert_eq!(
                    info.holder.map(|h| h.token),
                    held.is_held().then(|| held.token().to_owned()),
                    "the promoted replica has the holder's grant"
                );
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await, // a poll of a recovering cluster
        }
    }
    println!(
        "measured: the lock was unavailable for {:.1?}",
        unavailable.unwrap()
    );
    // The holder was never told it lost (10 s lease, renewals resumed on the new primary) and nobody else got in.
    tokio::time::sleep(Duration::from_secs(2)).await; // renewals on the promoted replica
    assert!(
        held.is_held(),
        "the holder lost its lease: {:?}",
        held.loss()
    );
    if waiting.is_finished() {
        let outcome = waiting.await.unwrap();
        panic!("the waiter ended while the lock was held: {outcome:?}");
    }
    held.release().await.unwrap();
    let next = within(Duration::from_secs(10), "the waiter's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        next.fence() > fence,
        "fences keep increasing across the failover"
    );
    next.release().await.unwrap();
    // The killed node comes back as a replica of the promoted one.
    cluster.restart(primary);
    assert!(!cluster.is_primary(primary));
    cluster.wait_stable();
}
