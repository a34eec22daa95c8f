//! The Cluster and Sentinel harnesses do what they say: they start, route, migrate and fail
//! over. Each test builds its own topology, so run them one at a time on a small machine:
//! `cargo test -p leasehold-tests --test harness_topology -- --test-threads=1`.

use std::time::{Duration, Instant};

use leasehold_tests::{slot_of, RedisCluster, SentinelSet};
use redis::{ErrorKind, ServerErrorKind};

fn set(con: &mut redis::Connection, key: &str, value: &str) -> redis::RedisResult<()> {
    redis::cmd("SET").arg(key).arg(value).query(con)
}

fn get(con: &mut redis::Connection, key: &str) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET").arg(key).query(con)
}

/// The port a `MOVED` (or, with `ask`, an `ASK`) redirection points to.
fn redirected_to(err: redis::RedisError, ask: bool) -> u16 {
    let expected = if ask {
        ServerErrorKind::Ask
    } else {
        ServerErrorKind::Moved
    };
    assert_eq!(err.kind(), ErrorKind::Server(expected), "{err}");
    // `(address, slot)`
    let (addr, _) = err.redirect_node().unwrap();
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

fn role(con: &mut redis::Connection) -> String {
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(con).unwrap();
    match &role[0] {
        redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone()).unwrap(),
        other => panic!("unexpected ROLE reply {other:?}"),
    }
}

#[test]
fn cluster_routes_keys_to_their_owner_and_migrates_slots() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start();
    eprintln!("cluster ready in {:?}", started.elapsed());

    assert_eq!(cluster.primaries().len(), 3);
    assert_eq!(cluster.seeds().len(), 6);
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    let key = "{harness}:k";
    let slot = slot_of(key);
    let keyslot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut cluster.connection(0))
        .unwrap();
    assert_eq!(slot, keyslot);

    let owner = cluster.primary_of_slot(slot);
    set(&mut cluster.connection(owner), key, "v").unwrap();
    assert_eq!(
        get(&mut cluster.connection(owner), key).unwrap().as_deref(),
        Some("v")
    );
    let elsewhere = cluster
        .primaries()
        .into_iter()
        .find(|&i| i != owner)
        .unwrap();
    let moved = get(&mut cluster.connection(elsewhere), key).unwrap_err();
    assert_eq!(redirected_to(moved, false), cluster.port(owner));

    let started = Instant::now();
    cluster.migrate_slot(slot, elsewhere);
    eprintln!("slot migrated in {:?}", started.elapsed());
    assert_eq!(cluster.primary_of_slot(slot), elsewhere);
    assert_eq!(
        get(&mut cluster.connection(elsewhere), key)
            .unwrap()
            .as_deref(),
        Some("v")
    );
    let moved = get(&mut cluster.connection(owner), key).unwrap_err();
    assert_eq!(redirected_to(moved, false), cluster.port(elsewhere));

    // In two steps: while the slot migrates, a key not yet created is redirected with ASK.
    cluster.begin_migration(slot, owner);
    let asked = set(&mut cluster.connection(elsewhere), "{harness}:new", "x").unwrap_err();
    assert_eq!(redirected_to(asked, true), cluster.port(owner));
    cluster.finish_migration(slot, owner);
    assert_eq!(
        get(&mut cluster.connection(owner), key).unwrap().as_deref(),
        Some("v")
    );

    cluster.flushall();
    assert_eq!(get(&mut cluster.connection(owner), key).unwrap(), None);
}

#[test]
fn cluster_failover_and_kill_promote_the_replica() {
    let mut cluster = RedisCluster::start();
    let slot = slot_of("{harness}:k");
    let primary = cluster.primary_of_slot(slot);
    let replica = cluster.replica_of(primary);
    set(&mut cluster.connection(primary), "{harness}:k", "v").unwrap();

    let started = Instant::now();
    cluster.failover(replica);
    eprintln!("manual failover settled in {:?}", started.elapsed());
    assert!(cluster.is_primary(replica));
    assert!(!cluster.is_primary(primary));
    assert_eq!(cluster.primary_of_slot(slot), replica);
    assert_eq!(cluster.replica_of(replica), primary);
    assert_eq!(
        get(&mut cluster.connection(replica), "{harness}:k")
            .unwrap()
            .as_deref(),
        Some("v")
    );

    // Now kill the promoted node: its replica (the old primary) takes over again.
    let pid = cluster.pid(replica).unwrap();
    cluster.kill(replica);
    assert_eq!(cluster.pid(replica), None);
    let started = Instant::now();
    let elected = cluster.wait_primary_elected(slot);
    eprintln!("primary elected {:?} after kill", started.elapsed());
    assert_eq!(elected, primary);

    let started = Instant::now();
    cluster.restart(replica);
    eprintln!("restarted node rejoined in {:?}", started.elapsed());
    assert_ne!(cluster.pid(replica), Some(pid));
    assert_eq!(role(&mut cluster.connection(replica)), "slave");
    assert_eq!(cluster.replica_of(primary), replica);
}

#[test]
fn sentinel_set_fails_over_to_a_replica() {
    let started = Instant::now();
    let mut group = SentinelSet::start();
    eprintln!("sentinel set ready in {:?}", started.elapsed());

    assert_eq!(group.primary(), 0);
    assert_eq!(group.sentinel_addrs().len(), 3);
    assert!(group.url().ends_with(&format!("/{}", group.service())));
    set(&mut group.connection(0), "k", "v").unwrap();

    let started = Instant::now();
    let new = group.failover();
    eprintln!("sentinel failover in {:?}", started.elapsed());
    assert_ne!(new, 0);
    assert_eq!(group.primary(), new);
    assert_eq!(role(&mut group.connection(new)), "master");
    assert_eq!(
        get(&mut group.connection(new), "k").unwrap().as_deref(),
        Some("v")
    );

    // A sleeping primary cannot answer; the handle returns once it wakes.
    let mut con = group.connection(new);
    con.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let sleeper = group.debug_sleep(new, Duration::from_millis(200));
    assert!(get(&mut con, "k").is_err());
    sleeper.join().unwrap();

    // A killed primary is replaced too; restarted, it comes back empty, as a primary.
    group.kill(new);
    let started = Instant::now();
    let newer = group.wait_new_primary(new);
    eprintln!("sentinel failover after kill in {:?}", started.elapsed());
    assert_ne!(newer, new);
    group.restart(new);
    assert_eq!(role(&mut group.connection(new)), "master");
    assert_eq!(get(&mut group.connection(new), "k").unwrap(), None);
    assert_eq!(group.primary(), newer);
}
