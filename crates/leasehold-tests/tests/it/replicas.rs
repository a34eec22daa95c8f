//! Replica-acknowledged grants (`Builder::replicas`): `WAIT` pipelined after every acquire and renewal.

use std::time::Duration;

use leasehold::{Error, LossReason};
use leasehold_tests::RedisServer;

use crate::within;

/// Without it a primary waits 5 s for more replicas before it starts a diskless full sync.
const FAST_SYNC: [&str; 2] = ["--repl-diskless-sync-delay", "0"];

/// A primary and one replica of it, linked.
fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start_with(&FAST_SYNC);
    let port = primary.port().to_string();
    let replica =
        RedisServer::start_with(&[&FAST_SYNC[..], &["--replicaof", "127.0.0.1", &port]].concat());
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

/// Asserts that `outcome` is the refusal of a grant (or extension) no replica acknowledged, one being required.
#[track_caller]
fn assert_unreplicated<T: std::fmt::Debug>(outcome: Result<T, Error>, what: &str) {
    match outcome {
        Err(Error::NotReplicated {
            acked: 0,
            required: 1,
            ..
        }) => {}
        other => panic!("{what}: expected NotReplicated with 0 of 1, got {other:?}"),
    }
}

async fn client(server: &RedisServer, replicas: u32) -> leasehold::Client {
    leasehold::Client::builder(&server.url())
        .unwrap()
        .replicas(replicas)
        // Generous: on a loaded machine a replica that just synced was seen to take over 200 ms for its first ack.
        .replica_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_grant_its_replica_acknowledges_is_granted_and_kept() {
    let (primary, _replica) = primary_with_replica();
    let locks = client(&primary, 1).await;
    // A lease well above the replica timeout: each renewal may wait that long for its acknowledgement.
    let guard = match locks
        .mutex("acked")
        .ttl(Duration::from_millis(1500))
        .try_lock()
        .await
    {
        Ok(guard) => guard,
        Err(err) => panic!("{err}"),
    };
    // Renewals are acknowledged too: the lease outlives two of its lengths.
    tokio::time::sleep(Duration::from_millis(3200)).await; // time passing is what is tested
    assert!(guard.is_held(), "{:?}", guard.loss());
    // Every kind's grants wait for the replica.
    let fair = locks.fair_mutex("acked-fair").try_lock().await.unwrap();
    let read = locks.rw_lock("acked-rw").try_read().await.unwrap();
    let permit = locks.semaphore("acked-sem", 2).try_acquire().await.unwrap();
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
            .try_acquire()
            .await
            .map(drop),
    ] {
        assert_unreplicated(attempt, "a grant on a primary without replicas");
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
    assert_unreplicated(
        within(Duration::from_secs(10), "the waiter's answer", waiter)
            .await
            .unwrap(),
        "the waiter",
    );
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

#[tokio::test]
async fn in_a_split_brain_the_old_primary_grants_without_wait_and_refuses_with_it() {
    // A failover done by hand, as Sentinel does it, with the old primary left running and reachable by clients that
    // still talk to it: a replica is promoted and the other replica follows it.
    let (old, promoted) = primary_with_replica();
    let port = old.port().to_string();
    let other =
        RedisServer::start_with(&[&FAST_SYNC[..], &["--replicaof", "127.0.0.1", &port]].concat());
    let wait_for = |server: &RedisServer, field: &str, value: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while server.info_field("replication", field).as_deref() != Some(value) {
            assert!(
                std::time::Instant::now() < deadline,
                "{field} never became {value}"
            );
            std::thread::sleep(Duration::from_millis(10)); // polls server state
        }
    };
    wait_for(&old, "connected_slaves", "2");
    let stale_acked = client(&old, 1).await;
    let stale_plain = leasehold::Client::connect(&old.url()).await.unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut promoted.connection())
        .unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(promoted.port())
        .query(&mut other.connection())
        .unwrap();
    wait_for(&old, "connected_slaves", "0");
    wait_for(&other, "master_link_status", "up");
    // A client of the new primary holds the lock.
    let fresh = client(&promoted, 1).await;
    let owner = fresh
        .mutex("brain")
        .ttl(Duration::from_secs(10))
        .try_lock()
        .await
        .unwrap();
    // Without `WAIT`, the old primary grants it too: two owners.
    let second = stale_plain.mutex("brain").try_lock().await.unwrap();
    assert!(owner.is_held() && second.is_held(), "two owners at once");
    second.release().await.unwrap();
    // With it, the old primary's grant finds no replica and is refused.
    assert_unreplicated(
        stale_acked.mutex("brain").try_lock().await,
        "the old primary's grant",
    );
    owner.release().await.unwrap();
}

#[tokio::test]
async fn acknowledgements_on_disk_are_refused_by_a_server_without_waitaof() {
    let server = RedisServer::start_with(&["--appendonly", "yes"]);
    let version = server.info_field("server", "redis_version").unwrap();
    let connected = leasehold::Client::builder(&server.url())
        .unwrap()
        .replicas(1)
        .replicas_on_disk(true)
        .connect()
        .await;
    let newer = {
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap()) >= (7, 2)
    };
    match connected {
        // Redis 7.0 (the Redis run of these tests) has no WAITAOF: the setting is refused when the client connects,
        // naming why.
        Err(Error::Unsupported { detail }) if !newer => {
            assert!(
                detail.contains(&version) && detail.contains("7.2"),
                "{detail}"
            );
        }
        // A newer server (Valkey 9.1, in the Valkey run, reports 7.2.4) runs it: the append-only file is on, so the
        // client connects.
        Ok(_) if newer => {}
        other => panic!("Redis {version}: unexpected {other:?}"),
    }
}

/// Waits until the replica has every write the primary has (nothing announces it: both offsets are polled).
async fn caught_up(primary: &RedisServer, replica: &RedisServer) {
    within(Duration::from_secs(10), "the replica caught up", async {
        loop {
            let ours = primary.info_field("replication", "master_repl_offset");
            let theirs = replica.info_field("replication", "slave_repl_offset");
            if ours.is_some() && ours == theirs {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_grant_counts_only_once_a_replica_has_it() {
    // Since Redis 7.2 (and on Valkey) `WAIT` counts only the connection's own writes: the attempt that confirms a
    // hand-off must write, or its `WAIT` answers for an older offset that the replica has.
    for fair in [false, true] {
        // The replica reaches the primary through a proxy, so that the link can be cut without either noticing.
        let primary = RedisServer::start_with(&FAST_SYNC);
        let link = leasehold_tests::TcpProxy::start(primary.addr()).await;
        let port = link.port().to_string();
        let replica = RedisServer::start_with(
            &[&FAST_SYNC[..], &["--replicaof", "127.0.0.1", &port]].concat(),
        );
        within(Duration::from_secs(10), "the replica linked", async {
            while replica
                .info_field("replication", "master_link_status")
                .as_deref()
                != Some("up")
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        let holder = leasehold::Client::connect(&primary.url()).await.unwrap();
        let waiting = client(&primary, 1).await;
        let name = "handed";
        let held = if fair {
            holder.fair_mutex(name).try_lock().await.unwrap()
        } else {
            holder.mutex(name).try_lock().await.unwrap()
        };
        let waiter = tokio::spawn(async move {
            let wait = Duration::from_secs(10);
            if fair {
                waiting.fair_mutex(name).lock_timeout(wait).await
            } else {
                waiting.mutex(name).lock_timeout(wait).await
            }
        });
        // The waiter is queued, and the replica has its queue entry (writes of the waiting client's own
        // connection): a `WAIT` for that offset would answer 1.
        within(Duration::from_secs(10), "the waiter queued", async {
            loop {
                let queued: i64 = redis::cmd("LLEN")
                    .arg(format!("leasehold:{{{name}}}:queue"))
                    .query(&mut primary.connection())
                    .unwrap();
                if queued == 1 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        caught_up(&primary, &replica).await;
        link.blackhole();
        // The release hands the lock to the waiter; no replica gets that write.
        held.release().await.unwrap();
        let answer = within(Duration::from_secs(10), "the waiter's answer", waiter).await;
        assert_unreplicated(answer.unwrap(), &format!("a hand-off (fair: {fair})"));
    }
}

#[tokio::test]
async fn an_extension_no_replica_acknowledges_does_not_move_the_deadline() {
    let (primary, mut replica) = primary_with_replica();
    let locks = client(&primary, 1).await;
    let guard = locks
        .mutex("extended")
        .ttl(Duration::from_secs(5))
        .fixed_lease()
        .try_lock()
        .await
        .unwrap();
    let before = guard.valid_until();
    replica.kill();
    assert_unreplicated(guard.extend(Duration::from_secs(60)).await, "the extension");
    // The primary extended the key, a promoted replica would not have: the deadline stays the acknowledged one.
    assert!(guard.valid_until() <= before);
    assert!(guard.is_held());
}
