//! The torture test: worker processes loop lock → critical section → release on one lock while a scheduler injects
//! faults at random, and a checker reads everything they observed and reports one line.
//!
//! - Each worker (`torture-worker`, a real OS process) talks to the lock and to a separate store server (an occupancy
//!   marker and a fenced write per critical section). It logs its grants, its `is_held() == true` samples (stamped
//!   before each call, also while its release is in flight), its loss signals and its releases on `CLOCK_MONOTONIC`,
//!   which all processes share (`history.rs`).
//! - The lock lives on one redis-server (topology `single`), which each worker reaches through its own [`TcpProxy`],
//!   on a Redis Cluster of three primaries and three replicas (topology `cluster`), which the workers reach with
//!   the cluster URL (a cluster client learns the nodes' addresses from the cluster, so no proxy can sit in between),
//!   or on a quorum of five independent redis-servers without persistence (topology `quorum`, Redlock), each behind
//!   one proxy that all workers go through (the workers get the five proxy URLs; worker kind `quorum`), or on etcd:
//!   one member (topology `etcd`) or a Raft cluster of three (`etcd3`), each worker through a proxy of its own to each
//!   member, with a session TTL of 2 s ([`ETCD_TTL`]: every grant lives under its worker's session), or on ZooKeeper:
//!   one standalone server (topology `zk`) or an ensemble of three (`zk3`), each worker through a proxy of its own to
//!   each server, with a session timeout of 2 s ([`ZK_TTL`]: every grant is an ephemeral node of its worker's
//!   session), or on a SQL store: one PostgreSQL server (topology `pg`) or one MariaDB server (`mysql`), each worker
//!   through a proxy of its own and under a name of its own on the server (an `application_name`, a user), with a
//!   session TTL of 2 s ([`SQL_TTL`]: every grant is an entry of its worker's session row).
//! - The scheduler (`chaos.rs`) picks faults from a seeded generator: SIGSTOP past the lease, SIGKILL and respawn,
//!   `DEBUG SLEEP`, `CLIENT PAUSE` and `FLUSHALL` of the lock's node, deletion of the fence counter, and clients that
//!   queue and die; on one server also blackholed and delayed proxies and crashes restarted from an older snapshot,
//!   with a `PSUBSCRIBE '*'` bystander throughout; on a cluster instead a manual failover, a migration of the lock's
//!   slot to another primary and back, and `kill -9` of the lock's primary, restarted once its replica is elected;
//!   on a quorum the node faults hit one or two of the five nodes at once, each its own: `kill -9` and a restart
//!   without data only after longer than the lease (the Redlock restart rule, enforced), `DEBUG SLEEP`,
//!   `CLIENT PAUSE`, a blackholed or delayed node proxy, `FLUSHALL`, deletion of the node's fence counter.
//!   On etcd the faults of the Redis server give way to etcd's, one member at a time (so `etcd3` keeps a quorum):
//!   a worker's paths blackholed (on `etcd3` sometimes to one member only), delayed or reset, a member (on `etcd3`
//!   any, or the leader) stopped with `SIGSTOP` or killed and restarted with its data, and the history compacted.
//!   On ZooKeeper the same, one server at a time, with a worker's session expired (its paths cut past the session
//!   timeout) in place of the compaction. On a SQL server the same on its one server, with a worker's session expired
//!   (its path cut past the TTL) and every connection of a worker killed by the server (`pg_terminate_backend`,
//!   `KILL CONNECTION`) in the slots of the compaction and of the leader's faults.
//!   Faults come in bursts; each burst ends with more than 16 clients that queue and die (on a quorum: die in the
//!   middle of their rounds), and is followed by a calm spell in which a free lock must reach a waiter within the
//!   stall bound. It records when each fault was in force.
//! - The checker (`check.rs`) counts overlaps, fence regressions, late losses and stalls, and the test adds keys left
//!   without a TTL on the lock's server (every primary of a cluster, every node of a quorum; on etcd, keys without a
//!   lease; on ZooKeeper, lock nodes still there once every session is gone; on a SQL server, sessions still live
//!   once every client has been dead for longer than a session lives). Any of them fails the test, with the seed in
//!   the message. etcd, ZooKeeper and the SQL stores lose nothing across their faults, so they get none of the
//!   data-loss excuses.
//!
//! Every lock kind goes through it in turn (`TORTURE_KINDS`, default `mutex,fair,semaphore:2,rw,reentrant,multi,election`;
//! `multi` is a set of two mutexes taken as one, `election` a campaign whose leader proclaims new values; the checker
//! holds both to the mutex's rule), each with
//! its own servers and workers, for `TORTURE_SECONDS` each (default 6) with `TORTURE_SEED` (default: drawn from the
//! clock), on each topology of `TORTURE_TOPOLOGY` (`single`, the default, `cluster`, `quorum`, `etcd`, `etcd3`, `zk`,
//! `zk3`, `pg`, `mysql`, or a list such as `single,cluster,quorum,etcd,etcd3,zk,zk3,pg,mysql`); a quorum has only the
//! mutex and the read-write lock, and skips the other kinds with a note. Six shorter tests put the cluster
//! (`mutex,fair`: one kind of each engine), the quorum (`mutex,rw`), one etcd member, one ZooKeeper server, one
//! PostgreSQL server and one MariaDB server (`rw` on each: the exclusive and the shared rule of their recipes) through
//! it for CI, 8 s each, unless `TORTURE_TOPOLOGY` leaves them out (or `LEASEHOLD_TEST_STORES` leaves out their store);
//! the other variables mean the same there. No two runs at once.
//! `scripts/torture.sh SECONDS SEED [KINDS] [TOPOLOGY]` runs the first in release mode. A run with violations keeps its
//! workers' histories and fault windows (on etcd, ZooKeeper and SQL also the servers' logs) and prints where;
//! `TORTURE_KEEP=1` keeps those of every run.

mod chaos;
mod check;
mod etcd;
mod history;
mod members;
mod sql;
mod zookeeper;

use std::fmt;
use std::time::Duration;

use chaos::Rig;

/// The lease the workers take: short, so that a run sees many grants, renewals, expiries and faults, and long
/// enough next to the stall bound that a waiter left to its lease-end timer shows as a stall.
const TTL: Duration = Duration::from_secs(1);
/// The lease on etcd: the workers' session TTL, the shortest etcd grants, so that a stopped worker, a cut path or a
/// stopped member outlasts it often.
const ETCD_TTL: Duration = Duration::from_secs(2);
/// The lease on ZooKeeper: the session timeout the workers ask for, which the harness's servers grant as it is (they
/// allow 1 to 10 s), so that a stopped worker, a cut path or a stopped server outlasts it often, as on etcd.
const ZK_TTL: Duration = Duration::from_secs(2);
/// The lease on PostgreSQL and MySQL: the workers' session TTL (the SQL stores take 1 s and more), as on etcd and
/// ZooKeeper, so that a stopped worker, a cut path or a stopped server outlasts it often.
const SQL_TTL: Duration = Duration::from_secs(2);
const WORKERS: usize = 5;
/// The kinds a run goes through by default.
const KINDS: &str = "mutex,fair,semaphore:2,rw,reentrant,multi,election";
/// The kinds of the cluster run in CI: the mutex, and the fair mutex for the queued kinds' engine.
const CLUSTER_KINDS: &str = "mutex,fair";
/// The kinds a quorum has: the mutex and the read-write lock (a semaphore cannot be counted on majorities, and the
/// fair kinds need one queue order, which independent nodes do not share).
const QUORUM_KINDS: &str = "mutex,rw";
/// The kinds of the etcd run in CI: the read-write lock, whose writes take the recipe's exclusive rule and whose reads
/// its shared one (each kind's run on etcd lasts at least 15 s: two TTLs before the first fault, a burst, the calm
/// spell).
const ETCD_KINDS: &str = "rw";
/// The kinds of the ZooKeeper run in CI: the read-write lock, for the same reason as on etcd (the rules are the same,
/// over sequential nodes).
const ZK_KINDS: &str = "rw";
/// The kinds of the PostgreSQL and MySQL runs in CI: the read-write lock, for the same reason (the rules are the same,
/// over the entries of one table).
const SQL_KINDS: &str = "rw";

/// One run at a time: two rigs side by side on a small machine would stretch each other's hand-offs past the stall
/// bound.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Where the lock lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One redis-server, each worker behind a fault proxy of its own.
    Single,
    /// A Redis Cluster of three primaries and three replicas.
    Cluster,
    /// Five independent redis-servers (Redlock), each behind one fault proxy that every worker goes through.
    Quorum,
    /// One etcd member, each worker behind a fault proxy of its own.
    Etcd,
    /// Three etcd members (one Raft cluster), each worker behind a fault proxy of its own to each member.
    Etcd3,
    /// One standalone ZooKeeper server, each worker behind a fault proxy of its own.
    Zk,
    /// A ZooKeeper ensemble of three servers, each worker behind a fault proxy of its own to each server.
    Zk3,
    /// One PostgreSQL server, each worker behind a fault proxy of its own.
    Pg,
    /// One MariaDB server (the `mysql://` store), each worker behind a fault proxy of its own.
    Mysql,
}

impl Topology {
    /// The topologies `TORTURE_TOPOLOGY` names, in its order, if it is set.
    ///
    /// # Panics
    ///
    /// On a name other than `single`, `cluster`, `quorum`, `etcd`, `etcd3`, `zk`, `zk3`, `pg` and `mysql`.
    fn from_env() -> Option<Vec<Topology>> {
        let names = std::env::var("TORTURE_TOPOLOGY").ok()?;
        let topologies = names
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(|name| match name {
                "single" => Topology::Single,
                "cluster" => Topology::Cluster,
                "quorum" => Topology::Quorum,
                "etcd" => Topology::Etcd,
                "etcd3" => Topology::Etcd3,
                "zk" => Topology::Zk,
                "zk3" => Topology::Zk3,
                "pg" => Topology::Pg,
                "mysql" => Topology::Mysql,
                _ => panic!(
                    "TORTURE_TOPOLOGY: unknown topology {name:?} \
                     (single, cluster, quorum, etcd, etcd3, zk, zk3, pg, mysql)"
                ),
            })
            .collect();
        Some(topologies)
    }

    /// The lease the workers take on this topology.
    fn ttl(self) -> Duration {
        match self {
            Topology::Single | Topology::Cluster | Topology::Quorum => TTL,
            Topology::Etcd | Topology::Etcd3 => ETCD_TTL,
            Topology::Zk | Topology::Zk3 => ZK_TTL,
            Topology::Pg | Topology::Mysql => SQL_TTL,
        }
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Topology::Single => "single",
            Topology::Cluster => "cluster",
            Topology::Quorum => "quorum",
            Topology::Etcd => "etcd",
            Topology::Etcd3 => "etcd3",
            Topology::Zk => "zk",
            Topology::Zk3 => "zk3",
            Topology::Pg => "pg",
            Topology::Mysql => "mysql",
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_keeps_its_contract_under_random_faults() {
    let topologies = Topology::from_env().unwrap_or_else(|| vec![Topology::Single]);
    torture(&topologies, KINDS, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_on_a_cluster_keeps_its_contract_under_random_faults() {
    if Topology::from_env().is_some_and(|names| !names.contains(&Topology::Cluster)) {
        eprintln!("torture: the cluster run skipped (TORTURE_TOPOLOGY leaves it out)");
        return;
    }
    torture(&[Topology::Cluster], CLUSTER_KINDS, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_on_a_quorum_keeps_its_contract_under_random_faults() {
    if Topology::from_env().is_some_and(|names| !names.contains(&Topology::Quorum)) {
        eprintln!("torture: the quorum run skipped (TORTURE_TOPOLOGY leaves it out)");
        return;
    }
    torture(&[Topology::Quorum], QUORUM_KINDS, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_on_etcd_keeps_its_contract_under_random_faults() {
    if Topology::from_env().is_some_and(|names| !names.contains(&Topology::Etcd)) {
        eprintln!("torture: the etcd run skipped (TORTURE_TOPOLOGY leaves it out)");
        return;
    }
    if leasehold_tests::sequence::leaves_out("etcd") {
        return;
    }
    torture(&[Topology::Etcd], ETCD_KINDS, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_on_zookeeper_keeps_its_contract_under_random_faults() {
    if Topology::from_env().is_some_and(|names| !names.contains(&Topology::Zk)) {
        eprintln!("torture: the ZooKeeper run skipped (TORTURE_TOPOLOGY leaves it out)");
        return;
    }
    if leasehold_tests::sequence::leaves_out("zookeeper") {
        return;
    }
    torture(&[Topology::Zk], ZK_KINDS, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_on_postgres_keeps_its_contract_under_random_faults() {
    if Topology::from_env().is_some_and(|names| !names.contains(&Topology::Pg)) {
        eprintln!("torture: the PostgreSQL run skipped (TORTURE_TOPOLOGY leaves it out)");
        return;
    }
    if leasehold_tests::sequence::leaves_out("postgres") {
        return;
    }
    torture(&[Topology::Pg], SQL_KINDS, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_on_mysql_keeps_its_contract_under_random_faults() {
    if Topology::from_env().is_some_and(|names| !names.contains(&Topology::Mysql)) {
        eprintln!("torture: the MySQL run skipped (TORTURE_TOPOLOGY leaves it out)");
        return;
    }
    if leasehold_tests::sequence::leaves_out("mysql") {
        return;
    }
    torture(&[Topology::Mysql], SQL_KINDS, 8).await;
}

/// Puts every kind through the torture on every topology in turn: `TORTURE_KINDS` or else `kinds`, for
/// `TORTURE_SECONDS` or else `seconds` each.
async fn torture(topologies: &[Topology], kinds: &str, seconds: u64) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let seconds: u64 = std::env::var("TORTURE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seconds);
    let kinds = std::env::var("TORTURE_KINDS").unwrap_or_else(|_| kinds.to_owned());
    let seed: u64 = std::env::var("TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let mut failed = Vec::new();
    for kind in kinds.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        let known = matches!(
            kind,
            "mutex" | "fair" | "rw" | "reentrant" | "multi" | "election"
        ) || kind
            .strip_prefix("semaphore:")
            .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n > 0));
        assert!(
            known,
            "unknown torture kind {kind:?}: the kinds are mutex, fair, rw, reentrant, multi, election, semaphore:N"
        );
    }
    for &topology in topologies {
        for kind in kinds.split(',').map(str::trim).filter(|k| !k.is_empty()) {
            if topology == Topology::Quorum && !QUORUM_KINDS.split(',').any(|k| k == kind) {
                eprintln!(
                    "torture: topology=quorum kind={kind} skipped (a quorum has only {QUORUM_KINDS})"
                );
                continue;
            }
            eprintln!(
                "torture: topology={topology} kind={kind} seed={seed} secs={seconds} \
                 (rerun with scripts/torture.sh {seconds} {seed} {kind} {topology})"
            );
            let mut rig = Rig::start(topology, WORKERS, topology.ttl(), seed, kind).await;
            rig.torture(Duration::from_secs(seconds)).await;
            let verbose = std::env::var_os("TORTURE_VERBOSE").is_some();
            if verbose {
                eprintln!("{}", rig.windows());
            }
            let outcome = rig.finish().await;
            println!("{}", outcome.line(topology, kind, seed, seconds));
            if verbose || outcome.violations() > 0 {
                eprintln!("{}", outcome.details());
            }
            if let Some(kept) = &outcome.kept {
                eprintln!(
                    "torture: the workers' histories and the fault windows are kept in {}",
                    kept.display()
                );
            }
            if outcome.violations() > 0 {
                failed.push(format!("{topology} {kind}"));
            }
            // A run in which no worker finished a section tested nothing: the workers could not lock at all.
            if outcome.stats.sections == 0 {
                failed.push(format!("{topology} {kind}: no section completed"));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "torture seed={seed} found violations for {failed:?} (rerun with TORTURE_SEED={seed})"
    );
}
