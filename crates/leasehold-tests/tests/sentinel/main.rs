//! leasehold through Redis Sentinel: one primary, two replicas and three sentinels, started once for this whole binary
//! (about 2.3 s) and killed when it ends.
//!
//! The binary has its own `main` (`harness = false`), as the cluster tests do: the tests share the set and fail it
//! over, so they run one after the other, in an order where each leaves a primary with linked replicas for the next
//! (the `kill -9` test comes last). Run one with `cargo test --test sentinel -- NAME_PART`.

use std::future::Future;
use std::time::{Duration, Instant};

use leasehold::Error;
use leasehold_tests::SentinelSet;
use tokio::task::JoinHandle;

type TestFn = leasehold_tests::sequence::SharedTest<SentinelSet>;

const TESTS: &[(&str, TestFn)] = leasehold_tests::sequence_tests![
    every_kind_locks_and_waits_through_the_sentinels,
    a_forced_failover_moves_holder_and_waiter_to_the_new_primary,
    in_a_split_brain_wait_refuses_the_grant_of_the_old_primary,
    kill_9_of_the_primary_keeps_the_lock_and_gives_no_second_owner,
];

fn main() {
    leasehold_tests::sequence::trace_from_env();
    // A failed test leaves whatever it broke: the later ones are written to cope with the primary they find.
    leasehold_tests::sequence::run_in_sequence("sentinel set", TESTS, SentinelSet::start, |_| {});
}

async fn connect(set: &SentinelSet) -> leasehold::Client {
    leasehold::Client::connect(&set.url()).await.unwrap()
}

/// Bounds a test step in time so a hang fails the test instead of stalling the suite.
async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not happen within {limit:?}"),
    }
}

/// The lock key's value on data node `i`.
fn get(set: &SentinelSet, i: usize, name: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(format!("leasehold:{{{name}}}"))
        .query(&mut set.connection(i))
        .unwrap()
}

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

/// Waits until `name`'s queue on the primary has an entry (the waiter reached the server).
async fn queued(set: &SentinelSet, name: &str) {
    let queue = format!("leasehold:{{{name}}}:queue");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let len: u64 = redis::cmd("LLEN")
            .arg(&queue)
            .query(&mut set.connection(set.primary()))
            .unwrap();
        if len > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await; // polls server state
    }
}

async fn every_kind_locks_and_waits_through_the_sentinels(set: &mut SentinelSet) {
    let a = connect(set).await;
    let b = connect(set).await;
    let guard = a.mutex("basics").try_lock().await.unwrap();
    assert_eq!(
        get(set, set.primary(), "basics").as_deref(),
        Some(guard.token())
    );
    assert!(matches!(
        b.mutex("basics").try_lock().await,
        Err(Error::Busy { .. })
    ));
    let waiting = waiter(&b, "basics");
    queued(set, "basics").await;
    let fence = guard.fence();
    guard.release().await.unwrap();
    let next = within(Duration::from_secs(10), "the waiter's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
    a.fair_mutex("basics-fair")
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let read = a.rw_lock("basics-rw").try_read().await.unwrap();
    let read2 = b.rw_lock("basics-rw").try_read().await.unwrap();
    read.release().await.unwrap();
    read2.release().await.unwrap();
    a.semaphore("basics-sem", 2)
        .try_acquire_many(2)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let outer = a.reentrant_mutex("basics-re").try_lock().await.unwrap();
    b.reentrant_mutex("basics-re")
        .lock_as(outer.token())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    outer.release().await.unwrap();
}

async fn a_forced_failover_moves_holder_and_waiter_to_the_new_primary(set: &mut SentinelSet) {
    let a = connect(set).await;
    let b = connect(set).await;
    let name = "forced";
    let held = a
        .mutex(name)
        .ttl(Duration::from_secs(5))
        .try_lock()
        .await
        .unwrap();
    let waiting = waiter(&b, name);
    queued(set, name).await;
    let old = set.primary();
    let started = Instant::now();
    let new = set.failover();
    println!(
        "measured: SENTINEL FAILOVER, new primary after {:.1?}",
        started.elapsed()
    );
    // The holder follows the primary (on +switch-master, or on READONLY from the demoted one) and keeps renewing
    // there; nobody else gets in meanwhile.
    let followed = Instant::now();
    while get(set, new, name).as_deref() != Some(held.token())
        || held.extend(Duration::from_secs(5)).await.is_err()
    {
        assert!(
            held.is_held(),
            "the holder lost its lease: {:?}",
            held.loss()
        );
        assert!(
            followed.elapsed() < Duration::from_secs(10),
            "the holder never reached the new primary"
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // polls a recovering service
    }
    println!(
        "measured: the holder renewed on the new primary {:.1?} after the failover began",
        started.elapsed()
    );
    assert!(held.is_held(), "{:?}", held.loss());
    assert!(!waiting.is_finished(), "the waiter was granted a held lock");
    let fence = held.fence();
    let released = Instant::now();
    held.release().await.unwrap();
    let next = within(Duration::from_secs(10), "the waiter's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    println!(
        "measured: the waiter got the lock {:.0?} after the release",
        released.elapsed()
    );
    assert!(next.fence() > fence);
    // Sentinel demotes the old primary only after it promoted the new one, and the old one takes writes meanwhile: a
    // release and a grant that ran there (a client that had not followed yet) are lost when it is demoted. So the
    // waiter either holds the lock on the new primary, or is told it lost it, within its renewal interval, once the
    // old primary is a replica: never does it go on believing in a grant that no primary has.
    let demoted = Instant::now();
    loop {
        // The sentinels kill the node's client connections when they reconfigure it: a failed read is retried.
        let role: redis::RedisResult<Vec<redis::Value>> =
            redis::cmd("ROLE").query(&mut set.connection(old));
        let role = role
            .ok()
            .and_then(|r| r.first().cloned())
            .and_then(|r| redis::from_redis_value::<String>(r).ok());
        if role.as_deref() == Some("slave") {
            break;
        }
        assert!(
            demoted.elapsed() < Duration::from_secs(20),
            "the old primary was never demoted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // polls the sentinels' reconfiguration
    }
    let on_new_primary = get(set, new, name).as_deref() == Some(next.token());
    if on_new_primary {
        println!("measured: the waiter's grant is on the new primary");
        next.release().await.unwrap();
    } else {
        let reason = within(
            Duration::from_secs(15),
            "the loss signal of a grant the old primary made",
            next.lost(),
        )
        .await;
        println!("measured: the waiter was granted by the old primary before it was demoted, and told {reason:?}");
    }
    assert_ne!(old, new);
}

async fn in_a_split_brain_wait_refuses_the_grant_of_the_old_primary(set: &mut SentinelSet) {
    // Clients that wait long for replies (the old primary answers only when it wakes): one that requires a replica's
    // acknowledgement, one that does not.
    let patient = |replicas: u32| {
        let url = set.url();
        async move {
            leasehold::Client::builder(&url)
                .unwrap()
                .response_timeout(Duration::from_secs(10))
                .replicas(replicas)
                .replica_timeout(Duration::from_millis(500))
                .connect()
                .await
                .unwrap()
        }
    };
    let acked = patient(1).await;
    let plain = patient(0).await;
    let old = set.primary();
    let sleeping = set.debug_sleep(old, Duration::from_secs(5));
    // Sent to the sleeping primary: both run when it wakes, after the sentinels promoted another node.
    let refused = tokio::spawn(async move { acked.mutex("brain").try_lock().await });
    let unsafe_grant = tokio::spawn(async move { plain.mutex("brain").try_lock().await });
    let new = tokio::task::block_in_place(|| set.wait_new_primary(old));
    // Meanwhile a client of the new primary takes the lock.
    let other = connect(set).await;
    let owner = other
        .mutex("brain")
        .ttl(Duration::from_secs(10))
        .try_lock()
        .await
        .unwrap();
    assert_eq!(get(set, new, "brain").as_deref(), Some(owner.token()));
    // When the old primary wakes, either it runs the request while it still believes it is the primary (then `WAIT`
    // finds no replica: refused), or the sentinels' reconfiguration, sent while it slept, runs first and the request
    // meets a replica of the new primary (busy, or read-only). Both happen on this machine; a grant never.
    let acked_answer = within(Duration::from_secs(15), "the old primary's answer", refused)
        .await
        .unwrap();
    match &acked_answer {
        Err(
            Error::NotReplicated {
                acked: 0,
                required: 1,
                ..
            }
            | Error::Busy { .. }
            | Error::Redis(_),
        ) => {}
        other => panic!("the old primary's grant must not stand, got {other:?}"),
    }
    // Without `WAIT` the same request is granted when the old primary runs it first: two owners, which is what
    // `Builder::replicas` is for (it/replicas.rs shows both sides deterministically).
    let second = within(
        Duration::from_secs(15),
        "the old primary's answer",
        unsafe_grant,
    )
    .await
    .unwrap();
    println!(
        "measured: split brain: with WAIT the old primary answered {:?}; without, {:?}; the new primary granted fence {}",
        acked_answer.as_ref().map(|g| g.fence()).map_err(|e| e.to_string()),
        second.as_ref().map(|g| g.fence()).map_err(|e| e.to_string()),
        owner.fence()
    );
    tokio::task::block_in_place(|| sleeping.join().unwrap());
    owner.release().await.unwrap();
    drop(second);
}

async fn kill_9_of_the_primary_keeps_the_lock_and_gives_no_second_owner(set: &mut SentinelSet) {
    let a = connect(set).await;
    let b = connect(set).await;
    let name = "killed";
    let held = a
        .mutex(name)
        .ttl(Duration::from_secs(10))
        .try_lock()
        .await
        .unwrap();
    let waiting = waiter(&b, name);
    queued(set, name).await;
    let old = set.primary();
    let killed = Instant::now();
    set.kill(old);
    let new = tokio::task::block_in_place(|| set.wait_new_primary(old));
    println!(
        "measured: kill -9 of the primary, new primary after {:.1?}",
        killed.elapsed()
    );
    let mut unavailable = None;
    while unavailable.is_none() {
        if a.inspect(name).await.is_ok() && held.extend(Duration::from_secs(10)).await.is_ok() {
            unavailable = Some(killed.elapsed());
        } else {
            assert!(
                killed.elapsed() < Duration::from_secs(20),
                "the holder never reached the new primary"
            );
            tokio::time::sleep(Duration::from_millis(20)).await; // polls a recovering service
        }
    }
    println!(
        "measured: the lock was unavailable for {:.1?}",
        unavailable.unwrap()
    );
    assert!(held.is_held(), "{:?}", held.loss());
    assert_eq!(get(set, new, name).as_deref(), Some(held.token()));
    if waiting.is_finished() {
        panic!(
            "two owners: the waiter ended while the lock was held: {:?}",
            waiting.await.unwrap()
        );
    }
    let fence = held.fence();
    held.release().await.unwrap();
    let next = within(Duration::from_secs(10), "the waiter's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}
