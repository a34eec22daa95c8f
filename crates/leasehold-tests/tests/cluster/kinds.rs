//! Every lock kind on the cluster: grants, exclusion, waiting, wake-ups on sharded channels, renewals and coalesced
//! calls in per-node pipelines of per-slot calls (through a moved slot), bounded calls.

use std::time::{Duration, Instant};

use leasehold::{Error, HoldMode, LockKind};
use leasehold_tests::cluster::slot_of;
use leasehold_tests::RedisCluster;

use crate::{connect, connect_with, eventually, get, waiter_ready, within};

/// Lock names whose keys land on `n` different primaries (the cluster has 3).
fn names_on_every_primary(cluster: &RedisCluster, stem: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut names = Vec::new();
    for i in 0.. {
        let name = format!("{stem}-{i}");
        let primary = cluster.primary_of_slot(slot_of(&format!("leasehold:{{{name}}}")));
        if !seen.contains(&primary) {
            seen.push(primary);
            names.push(name);
        }
        if seen.len() == 3 {
            break;
        }
    }
    names
}

/// Fails the test naming the first guard whose lease ended.
fn assert_all_held(guards: &[leasehold::Guard]) {
    for guard in guards {
        assert!(
            guard.is_held(),
            "{} lost its lease: {:?}",
            guard.name(),
            guard.loss()
        );
    }
}

pub async fn every_kind_locks_and_waits_on_the_cluster(cluster: &mut RedisCluster) {
    let a = connect(cluster).await;
    let b = connect(cluster).await;
    assert!(a.is_cluster());
    for name in names_on_every_primary(cluster, "kinds") {
        // Mutex: exclusive, fences increase, a waiter gets it after the release.
        let first = a.mutex(&name).try_lock().await.unwrap();
        assert!(matches!(
            b.mutex(&name).try_lock().await,
            Err(Error::Busy { .. })
        ));
        let fence = first.fence();
        let waiter = {
            let b = b.clone();
            let name = name.clone();
            tokio::spawn(async move { b.mutex(&name).lock_timeout(Duration::from_secs(10)).await })
        };
        first.release().await.unwrap();
        let second = within(Duration::from_secs(10), "the waiter's grant", waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(second.fence() > fence);
        second.release().await.unwrap();

        // Fair mutex.
        let fair = format!("{name}-fair");
        let held = a.fair_mutex(&fair).try_lock().await.unwrap();
        assert!(matches!(
            b.fair_mutex(&fair).try_lock().await,
            Err(Error::Busy { .. })
        ));
        held.release().await.unwrap();
        b.fair_mutex(&fair)
            .try_lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();

        // Read-write lock: two readers together, the writer after both.
        let rw = format!("{name}-rw");
        let r1 = a.rw_lock(&rw).try_read().await.unwrap();
        let r2 = b.rw_lock(&rw).try_read().await.unwrap();
        assert!(matches!(
            b.rw_lock(&rw).try_write().await,
            Err(Error::Busy { .. })
        ));
        let info = a.inspect(&rw).await.unwrap();
        assert_eq!(info.kind, Some(LockKind::ReadWrite));
        assert_eq!(info.holders.len(), 2);
        let writer = {
            let b = b.clone();
            let rw = rw.clone();
            tokio::spawn(async move { b.rw_lock(&rw).write_timeout(Duration::from_secs(10)).await })
        };
        let read_fence = r2.fence().max(r1.fence());
        r1.release().await.unwrap();
        r2.release().await.unwrap();
        let w = within(Duration::from_secs(10), "the writer's grant", writer)
            .await
            .unwrap()
            .unwrap();
        assert!(w.fence() > read_fence);
        w.release().await.unwrap();

        // Semaphore: two permits, the third request waits for one.
        let sem = format!("{name}-sem");
        let p1 = a.semaphore(&sem, 2).try_acquire().await.unwrap();
        let p2 = b.semaphore(&sem, 2).try_acquire().await.unwrap();
        assert!(matches!(
            a.semaphore(&sem, 2).try_acquire().await,
            Err(Error::Busy { .. })
        ));
        assert_eq!(
            a.inspect(&sem).await.unwrap().holders[0].mode,
            HoldMode::Permits(1)
        );
        p1.release().await.unwrap();
        a.semaphore(&sem, 2)
            .try_acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        p2.release().await.unwrap();

        // Reentrant mutex: re-entered in this process, and from another client with the holder's token.
        let re = format!("{name}-re");
        let outer = a.reentrant_mutex(&re).try_lock().await.unwrap();
        let inner = outer.reenter().unwrap();
        let nested = b.reentrant_mutex(&re).lock_as(outer.token()).await.unwrap();
        assert_eq!(nested.fence(), outer.fence());
        assert!(matches!(
            b.reentrant_mutex(&re).try_lock().await,
            Err(Error::Busy { .. })
        ));
        nested.release().await.unwrap();
        inner.release().await.unwrap();
        outer.release().await.unwrap();
        assert_eq!(a.inspect(&re).await.unwrap().holder, None);
    }
}

pub async fn a_release_hands_the_lock_to_a_waiter_on_its_sharded_channel(
    cluster: &mut RedisCluster,
) {
    let holder_client = connect(cluster).await;
    let waiter_client = connect(cluster).await;
    for name in names_on_every_primary(cluster, "handoff") {
        let holder = holder_client
            .mutex(&name)
            .ttl(Duration::from_secs(60))
            .try_lock()
            .await
            .unwrap();
        let waiter = {
            let client = waiter_client.clone();
            let name = name.clone();
            tokio::spawn(async move {
                client
                    .mutex(&name)
                    .lock_timeout(Duration::from_secs(30))
                    .await
            })
        };
        eventually(
            Duration::from_secs(10),
            "the waiter subscribed and queued",
            || waiter_ready(cluster, &name),
        )
        .await;
        holder.release().await.unwrap();
        // The release handed the lock over in the same script: SPUBLISH reached the waiter's subscription (a count
        // of 0 would have skipped it and left the lock free).
        let owner = get(cluster, &format!("leasehold:{{{name}}}"));
        let guard = within(Duration::from_secs(10), "the waiter's grant", waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            owner.as_deref(),
            Some(guard.token()),
            "the release granted the waiter"
        );
        guard.release().await.unwrap();
    }
}

pub async fn a_fair_release_hands_over_on_the_sharded_channel(cluster: &mut RedisCluster) {
    let holder_client = connect(cluster).await;
    let waiter_client = connect(cluster).await;
    let name = "fair-handoff";
    let holder = holder_client
        .fair_mutex(name)
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();
    let waiter = {
        let client = waiter_client.clone();
        tokio::spawn(async move {
            client
                .fair_mutex(name)
                .lock_timeout(Duration::from_secs(30))
                .await
        })
    };
    eventually(
        Duration::from_secs(10),
        "the waiter subscribed and queued",
        || waiter_ready(cluster, name),
    )
    .await;
    holder.release().await.unwrap();
    // The grant is a hold in the lock's sorted set, stored by the release itself.
    let lock = format!("leasehold:{{{name}}}");
    let mut con = cluster.connection(cluster.primary_of_slot(slot_of(&lock)));
    let holds: Vec<String> = redis::cmd("ZRANGE")
        .arg(&lock)
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .unwrap();
    let guard = within(Duration::from_secs(10), "the waiter's grant", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        holds,
        [format!("x {}", guard.token())],
        "the release granted the waiter"
    );
    guard.release().await.unwrap();
}

pub async fn leases_in_many_slots_are_renewed_and_released(cluster: &mut RedisCluster) {
    let locks = connect(cluster).await;
    // 60 locks over many slots and every primary, with leases far shorter than the wait below: only renewals (grouped
    // per slot, since a script's keys must share one) keep them.
    let mut guards = Vec::new();
    for i in 0..60 {
        let guard = locks
            .mutex(&format!("many-{i}"))
            .ttl(Duration::from_millis(300))
            .try_lock()
            .await
            .unwrap();
        guards.push(guard);
    }
    let slots: std::collections::HashSet<u16> = (0..60)
        .map(|i| slot_of(&format!("leasehold:{{many-{i}}}")))
        .collect();
    assert!(slots.len() > 50);
    tokio::time::sleep(Duration::from_millis(1500)).await; // five leases long: the thing under test is time passing
    assert_all_held(&guards);
    let held = locks.held_locks("many-*").await.unwrap();
    assert_eq!(held.len(), 60);
    futures_util::future::join_all(guards.into_iter().map(|g| g.release()))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
    assert!(locks.held_locks("many-*").await.unwrap().is_empty());
}

pub async fn one_pipeline_per_node_carries_many_slots_and_survives_a_moved_slot(
    cluster: &mut RedisCluster,
) {
    let locks = connect(cluster).await;
    let ttl = Duration::from_millis(400);
    let names: Vec<String> = (0..240).map(|i| format!("piped-{i}")).collect();
    // Taken at once: past the first few calls in flight the attempts queue, and go out as one call per slot, the
    // calls of one node in one pipeline.
    let mutexes: Vec<_> = names
        .iter()
        .map(|name| locks.mutex(name).ttl(ttl))
        .collect();
    let guards: Vec<leasehold::Guard> =
        futures_util::future::join_all(mutexes.iter().map(|mutex| mutex.try_lock()))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    let slots: std::collections::HashSet<u16> = names
        .iter()
        .map(|name| slot_of(&format!("leasehold:{{{name}}}")))
        .collect();
    assert!(slots.len() > 200);
    // Renewal rounds go by (the thing under test is time passing): each renews every lease, one script call per
    // slot, in one pipeline per node once the client knows which node serves which slot.
    tokio::time::sleep(ttl * 4).await;
    let (pipelines, calls, _) = locks.cluster_pipelines().unwrap();
    assert!(pipelines > 0, "no pipeline was sent");
    assert!(
        calls >= 20 * pipelines,
        "{calls} calls in {pipelines} pipelines: they should carry dozens each"
    );
    assert_all_held(&guards);
    // Each grant's fence is the one its lock's counter holds on the server: no outcome went to another lock's caller.
    for (name, guard) in names.iter().zip(&guards) {
        let counter = get(cluster, &format!("leasehold:{{{name}}}:fence"));
        assert_eq!(counter, Some(guard.fence().get().to_string()), "{name}");
    }
    // Attempts on held locks and free ones, interleaved, in pipelines again: every held one answers busy (the lock
    // lets no second holder in) and every free one is granted, each to its own caller.
    let free: Vec<String> = (0..240).map(|i| format!("piped-free-{i}")).collect();
    let mixed: Vec<_> = names
        .iter()
        .zip(&free)
        .flat_map(|(held, free)| [held, free])
        .map(|name| locks.mutex(name).ttl(ttl))
        .collect();
    let before = locks.cluster_pipelines().unwrap().0;
    let outcomes = futures_util::future::join_all(mixed.iter().map(|mutex| mutex.try_lock())).await;
    assert!(
        locks.cluster_pipelines().unwrap().0 > before,
        "the attempts were not pipelined"
    );
    let mut granted = Vec::new();
    for (mutex, outcome) in mixed.iter().zip(outcomes) {
        match outcome {
            Ok(guard) if mutex.name().starts_with("piped-free-") => granted.push(guard),
            Ok(guard) => panic!("{} granted twice (fence {})", mutex.name(), guard.fence()),
            Err(err) if mutex.name().starts_with("piped-free-") => {
                panic!("{}: {err}", mutex.name())
            }
            Err(err) => assert!(err.is_busy(), "{}: {err}", mutex.name()),
        }
    }
    assert_eq!(granted.len(), free.len());
    for guard in granted {
        let counter = get(cluster, &format!("leasehold:{{{}}}:fence", guard.name()));
        assert_eq!(
            counter,
            Some(guard.fence().get().to_string()),
            "{}",
            guard.name()
        );
        guard.release().await.unwrap();
    }
    // A slot moves to another node: its calls in a pipeline meet a redirection, are sent on their own, and the map
    // of slots is read again; every lease is still renewed.
    let moved = slot_of(&format!("leasehold:{{{}}}", names[0]));
    let from = cluster.primary_of_slot(moved);
    let to = *cluster.primaries().iter().find(|&&p| p != from).unwrap();
    cluster.migrate_slot(moved, to);
    let fence = guards[0].fence();
    tokio::time::sleep(ttl * 4).await;
    assert_all_held(&guards);
    assert!(get(cluster, &format!("leasehold:{{{}}}", names[0])).is_some());
    let (after, _, _) = locks.cluster_pipelines().unwrap();
    assert!(after > pipelines, "no pipeline after the slot moved");
    futures_util::future::join_all(guards.into_iter().map(|g| g.release()))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
    assert!(locks.held_locks("piped-*").await.unwrap().is_empty());
    // The moved lock is taken again with a fence above the one before: the counter moved with the slot.
    let again = locks.mutex(&names[0]).try_lock().await.unwrap();
    assert!(again.fence() > fence);
    again.release().await.unwrap();
    cluster.migrate_slot(moved, from);
}

pub async fn held_locks_walks_every_primary(cluster: &mut RedisCluster) {
    let locks = connect(cluster).await;
    let names = names_on_every_primary(cluster, "listed");
    let mut guards = Vec::new();
    for name in &names {
        guards.push(locks.mutex(name).try_lock().await.unwrap());
    }
    let listed: Vec<String> = locks
        .held_locks("listed-*")
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.name)
        .collect();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(listed, expected);
    for guard in guards {
        guard.release().await.unwrap();
    }
}

pub async fn a_call_to_a_sleeping_primary_is_bounded(cluster: &mut RedisCluster) {
    let locks = connect_with(cluster, Duration::from_millis(300)).await;
    let name = "sleeper";
    locks
        .mutex(name)
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let primary = cluster.primary_of_slot(slot_of(&format!("leasehold:{{{name}}}")));
    let port = cluster.port(primary);
    // DEBUG SLEEP from a thread of its own: the node answers nobody for 2 s.
    let sleeper = std::thread::spawn(move || {
        let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(2)
            .query(&mut con)
            .unwrap();
    });
    eventually(Duration::from_secs(5), "the node is asleep", || {
        redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_connection_with_timeout(Duration::from_millis(100))
            .and_then(|mut c| {
                c.set_read_timeout(Some(Duration::from_millis(50)))?;
                redis::cmd("PING").query::<String>(&mut c)
            })
            .is_err()
    })
    .await;
    let started = Instant::now();
    let attempt = locks.mutex(name).try_lock().await;
    let took = started.elapsed();
    assert!(attempt.is_err(), "a sleeping primary cannot grant");
    // The bound is the client's response timeout (300 ms); generous slack for a loaded machine, far below the 2 s
    // sleep and the minutes an unbounded cluster request was seen to hang.
    assert!(took < Duration::from_millis(1500), "the call took {took:?}");
    sleeper.join().unwrap();
    let guard = locks.mutex(name).try_lock().await.unwrap();
    guard.release().await.unwrap();
}

pub async fn grants_wait_for_replicas_on_the_locks_own_node(cluster: &mut RedisCluster) {
    let with = |replicas: u32| {
        let url = cluster.url();
        async move {
            leasehold::Client::builder(&url)
                .unwrap()
                .replicas(replicas)
                .replica_timeout(Duration::from_millis(200))
                .connect()
                .await
                .unwrap()
        }
    };
    // Each primary has one replica. `WAIT` goes with the script to the lock's node: a bare `WAIT` would go to every
    // primary and answer the minimum.
    let one = with(1).await;
    for name in names_on_every_primary(cluster, "acked") {
        let guard = one.mutex(&name).try_lock().await.unwrap();
        let permit = one
            .semaphore(&format!("{name}-sem"), 2)
            .try_acquire()
            .await
            .unwrap();
        guard.release().await.unwrap();
        permit.release().await.unwrap();
    }
    let two = with(2).await;
    match two.mutex("acked-two").try_lock().await {
        Err(Error::NotReplicated {
            acked: 1,
            required: 2,
            ..
        }) => {}
        other => panic!("expected NotReplicated with 1 of 2, got {other:?}"),
    }
}
