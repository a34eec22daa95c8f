//! The rig: the servers, the proxies, the worker processes, and the scheduler that injects faults.
//!
//! The lock lives on one server, on a Redis Cluster or on a quorum of independent servers ([`Topology`]). On one
//! server each worker reaches it through a proxy of its own, which the scheduler can cut or slow down. A proxy cannot
//! sit in front of a cluster (a cluster client learns the nodes' addresses from the cluster itself), so there the
//! workers connect with the cluster URL, and the faults of the path give way to faults of the topology: a manual
//! failover and a migration of the lock's slot where one server is restarted from a snapshot, the loss of the lock's
//! primary where it is killed. On a quorum each node sits behind one proxy that every worker goes through, so that
//! cutting or slowing a proxy partitions or slows that node for everyone; the node faults hit one or two nodes at a
//! time, never more, so that a majority always stays healthy ([`NodeFault`]). On etcd and on ZooKeeper (one member
//! or three) each worker reaches each member through a proxy of its own, as on one server, and the faults of the
//! Redis server give way to the store's own, one member at a time. On a SQL server (PostgreSQL, MariaDB) the same with
//! one member, and the SQL stores' own faults: [`members::fault`] for all of them.

use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::future::join_all;

use leasehold_tests::{
    slot_of, ChildGuard, RedisCluster, RedisServer, TcpProxy, TempDir, XorShift as Rng,
};
use nix::sys::signal::Signal;

use crate::check::{check, Report, Rule};
use crate::etcd::Etcd;
use crate::history::{read_all, Fault, Stats, Window};
use crate::members::{self, Aim, Members};
use crate::sql::Sql;
use crate::zookeeper::Zk;
use crate::Topology;

/// The lock's name.
const NAME: &str = "torture";
/// The election observer's log, in the run's directory (kind `election`).
const OBSERVER_LOG: &str = "observer.log";

/// The longest `DEBUG SLEEP` of a cluster primary: well inside the cluster's node timeout (2 s), past which its
/// replica would be elected and the sleeper, on waking, would run what queued up meanwhile as a second primary.
const CLUSTER_SLEEP_MAX: Duration = Duration::from_millis(1200);

/// How many independent servers a quorum has.
const QUORUM_NODES: usize = 5;
/// The most quorum nodes that are faulty at once: fewer than half, so that a majority always stays healthy.
const MAX_FAULTY_NODES: usize = 2;

fn now_ns() -> u64 {
    leasehold_tests::monotonic_ns()
}

/// The lock's main key; all of its keys share its slot.
fn lock_key() -> String {
    format!("leasehold:{{{NAME}}}")
}

struct Worker {
    child: ChildGuard,
    incarnation: usize,
}

/// Where the lock lives.
enum Lock {
    /// One redis-server.
    Single(RedisServer),
    /// Three primaries and three replicas.
    Cluster(RedisCluster),
    /// Independent redis-servers, without persistence.
    Quorum(Vec<RedisServer>),
    /// One etcd member, or three.
    Etcd(Etcd),
    /// One ZooKeeper server, or an ensemble of three.
    Zk(Zk),
    /// One PostgreSQL or MariaDB server.
    Sql(Sql),
}

impl Lock {
    fn start(topology: Topology, workers: usize) -> Lock {
        let debuggable = || RedisServer::start_with(&["--enable-debug-command", "local"]);
        match topology {
            Topology::Single => Lock::Single(debuggable()),
            Topology::Cluster => Lock::Cluster(RedisCluster::start()),
            Topology::Quorum => Lock::Quorum((0..QUORUM_NODES).map(|_| debuggable()).collect()),
            Topology::Etcd | Topology::Etcd3 => Lock::Etcd(Etcd::start(topology)),
            Topology::Zk | Topology::Zk3 => Lock::Zk(Zk::start(topology)),
            Topology::Pg | Topology::Mysql => Lock::Sql(Sql::start(topology, workers)),
        }
    }

    /// The URL a client reaches the lock with, bypassing any proxy (a quorum's: its nodes', comma-separated).
    fn url(&self) -> String {
        match self {
            Lock::Single(server) => server.url(),
            Lock::Cluster(cluster) => cluster.url(),
            Lock::Quorum(nodes) => nodes
                .iter()
                .map(RedisServer::url)
                .collect::<Vec<_>>()
                .join(","),
            Lock::Etcd(etcd) => etcd.url(),
            Lock::Zk(zk) => zk.url(),
            Lock::Sql(sql) => sql.url(),
        }
    }

    /// On etcd, ZooKeeper and a SQL server, the members (the SQL server is one), which each worker reaches through a
    /// proxy of its own to each.
    fn members(&self) -> Option<&dyn Members> {
        match self {
            Lock::Etcd(etcd) => Some(etcd),
            Lock::Zk(zk) => Some(zk),
            Lock::Sql(sql) => Some(sql),
            Lock::Single(_) | Lock::Cluster(_) | Lock::Quorum(_) => None,
        }
    }

    /// On a cluster, the primary that serves the lock's slot.
    fn primary(&self) -> Option<usize> {
        match self {
            Lock::Single(_) | Lock::Quorum(_) | Lock::Etcd(_) | Lock::Zk(_) | Lock::Sql(_) => None,
            Lock::Cluster(cluster) => Some(cluster.primary_of_slot(slot_of(&lock_key()))),
        }
    }

    /// A connection to the node that serves the lock: the server, or the primary of the lock's slot.
    fn node(&self) -> redis::Connection {
        match self {
            Lock::Single(server) => server.connection(),
            Lock::Cluster(cluster) => {
                cluster.connection(cluster.primary_of_slot(slot_of(&lock_key())))
            }
            Lock::Quorum(_) => unreachable!("a quorum's faults pick their nodes (NodeFault)"),
            Lock::Etcd(_) => unreachable!("etcd has faults of its own (members::fault)"),
            Lock::Zk(_) => unreachable!("ZooKeeper has faults of its own (members::fault)"),
            Lock::Sql(_) => unreachable!("a SQL server has faults of its own (members::fault)"),
        }
    }

    /// Keys that would never expire, on the server, on any primary, on any node of a quorum, on etcd (keys without a
    /// lease), on ZooKeeper (nodes of the lock left once every session of workers whose sessions were `ttl` long
    /// has gone), or on a SQL server (sessions still live once their clients have been killed for longer than a
    /// session lives).
    async fn keys_without_ttl(&self, ttl: Duration) -> Vec<String> {
        let nodes = match self {
            Lock::Single(server) => vec![server.connection()],
            Lock::Cluster(cluster) => cluster
                .primaries()
                .into_iter()
                .map(|i| cluster.connection(i))
                .collect(),
            Lock::Quorum(nodes) => nodes.iter().map(RedisServer::connection).collect(),
            // An election's term count is kept on purpose, one key per election (as the SQL stores' lock rows).
            Lock::Etcd(etcd) => {
                return etcd
                    .keys_without_lease()
                    .into_iter()
                    .filter(|key| !key.trim_matches('"').starts_with("leasehold.terms/"))
                    .collect()
            }
            Lock::Zk(zk) => return zk.nodes_without_session(NAME, ttl).await,
            Lock::Sql(sql) => return sql.sessions_outliving_clients().await,
        };
        nodes.into_iter().flat_map(keys_without_ttl).collect()
    }
}

pub struct Rig {
    /// On one server, listens to every channel; replaced after each restart.
    bystander: Option<redis::aio::PubSub>,
    lock: Lock,
    topology: Topology,
    store: RedisServer,
    /// One per worker, on one server; none on a cluster; one per node, shared by every worker, on a quorum; one per
    /// worker and member on etcd, ZooKeeper and a SQL server, worker by worker (see [`Rig::paths`]).
    proxies: Vec<TcpProxy>,
    workers: Vec<Worker>,
    /// An election's observer (kind `election`).
    observer: Option<ChildGuard>,
    dir: TempDir,
    ttl: Duration,
    rng: Rng,
    seed: u64,
    windows: Vec<Window>,
    /// The lock kind (`mutex`, `fair`, `semaphore:N`, `rw`, `reentrant`).
    kind: String,
    /// The lock kind as the worker takes it: the kind, or `quorum` for the mutex on a quorum.
    worker_kind: String,
}

impl Rig {
    pub async fn start(
        topology: Topology,
        workers: usize,
        ttl: Duration,
        seed: u64,
        kind: &str,
    ) -> Rig {
        // One path more than workers: an election's observer goes through the last (no fault picks it; the store's
        // own faults reach it).
        let paths = workers + 1;
        let lock = tokio::task::block_in_place(|| Lock::start(topology, paths));
        let store = RedisServer::start();
        let (bystander, proxies) = match &lock {
            Lock::Single(server) => {
                // A bystander listening to every channel (monitoring, a debugging session): every PUBLISH counts it,
                // so a queue whose liveness were judged by PUBLISH's count would wake dead clients. (A cluster's
                // wake-ups go on sharded channels, which no pattern matches.)
                let listener = bystander(server).await;
                let mut proxies = Vec::new();
                for _ in 0..paths {
                    proxies.push(TcpProxy::start(server.addr()).await);
                }
                (Some(listener), proxies)
            }
            Lock::Cluster(_) => (None, Vec::new()),
            Lock::Etcd(_) | Lock::Zk(_) | Lock::Sql(_) => {
                let members = lock
                    .members()
                    .expect("etcd, ZooKeeper and a SQL server have members");
                let mut proxies = Vec::new();
                for _ in 0..paths {
                    for member in 0..members.members() {
                        proxies.push(TcpProxy::start(members.addr(member)).await);
                    }
                }
                (None, proxies)
            }
            Lock::Quorum(nodes) => {
                let mut proxies = Vec::new();
                for node in nodes {
                    proxies.push(TcpProxy::start(node.addr()).await);
                }
                (None, proxies)
            }
        };
        let worker_kind = match topology {
            Topology::Quorum => match kind {
                "mutex" => "quorum".to_owned(),
                "rw" => "quorum-rw".to_owned(),
                _ => panic!("a quorum has only the mutex and the read-write lock"),
            },
            Topology::Single
            | Topology::Cluster
            | Topology::Etcd
            | Topology::Etcd3
            | Topology::Zk
            | Topology::Zk3
            | Topology::Pg
            | Topology::Mysql => kind.to_owned(),
        };
        let mut rig = Rig {
            bystander,
            lock,
            topology,
            store,
            proxies,
            workers: Vec::new(),
            observer: None,
            dir: TempDir::new("torture"),
            ttl,
            rng: Rng::new(seed),
            seed,
            windows: Vec::new(),
            kind: kind.to_owned(),
            worker_kind,
        };
        for i in 0..workers {
            let child = rig.spawn(i, 0);
            rig.workers.push(Worker {
                child,
                incarnation: 0,
            });
        }
        if kind == "election" {
            rig.observer = Some(rig.spawn_observer(workers));
        }
        rig
    }

    /// The URL a worker (or the observer, on path `worker`) reaches the lock with.
    fn lock_url(&self, worker: usize) -> String {
        match &self.lock {
            Lock::Single(_) => self.proxies[worker].url(),
            Lock::Cluster(cluster) => cluster.url(),
            Lock::Quorum(_) => self
                .proxies
                .iter()
                .map(TcpProxy::url)
                .collect::<Vec<_>>()
                .join(","),
            Lock::Etcd(_) => format!("etcd://{}", self.path_list(worker)),
            Lock::Zk(_) => format!("zk://{}", self.path_list(worker)),
            Lock::Sql(sql) => sql.worker_url(worker, self.paths(worker)[0].addr()),
        }
    }

    /// An observer of the election, on path `path`, logging into `observer.log` (see `check::observer`).
    fn spawn_observer(&self, path: usize) -> ChildGuard {
        let child = Command::new(env!("CARGO_BIN_EXE_torture-worker"))
            .arg("observe")
            .arg(self.lock_url(path))
            .arg(NAME)
            .arg(self.ttl.as_millis().to_string())
            .arg(self.dir.path().join(OBSERVER_LOG))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start torture-worker observe");
        ChildGuard::new(child)
    }

    /// The proxies of worker `worker`'s own path to the lock: its proxy on one server (Redis or SQL), its proxy to
    /// each member (in member order) on etcd and ZooKeeper.
    fn paths(&self, worker: usize) -> &[TcpProxy] {
        let per_worker = self.lock.members().map_or(1, |members| members.members());
        &self.proxies[worker * per_worker..(worker + 1) * per_worker]
    }

    /// [`Rig::paths`]' addresses, comma-separated: the servers of a worker's `etcd://` or `zk://` URL.
    fn path_list(&self, worker: usize) -> String {
        let paths: Vec<String> = self
            .paths(worker)
            .iter()
            .map(|p| p.addr().to_string())
            .collect();
        paths.join(",")
    }

    fn spawn(&self, worker: usize, incarnation: usize) -> ChildGuard {
        let log = self
            .dir
            .path()
            .join(format!("worker-{worker}-{incarnation}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_torture-worker"))
            .arg("run")
            .arg(self.lock_url(worker))
            .arg(self.store.url())
            .arg(NAME)
            .arg(worker.to_string())
            .arg(self.ttl.as_millis().to_string())
            .arg((self.seed ^ ((worker as u64 + 1) << 32) ^ incarnation as u64).to_string())
            .arg(&log)
            .arg(&self.worker_kind)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start torture-worker");
        ChildGuard::new(child)
    }

    fn record(&mut self, fault: Fault, worker: Option<usize>, start: u64) {
        self.windows.push(Window {
            fault,
            worker,
            node: None,
            erased: Vec::new(),
            start,
            end: now_ns(),
        });
    }

    /// Injects faults for `length`: bursts of faults one after another, then a calm spell long enough for the
    /// recovery allowance to run out, in which the tight stall bound applies.
    pub async fn torture(&mut self, length: Duration) {
        let end = tokio::time::Instant::now() + length;
        // Let the workers get going before the first fault.
        tokio::time::sleep(self.ttl * 2).await;
        while tokio::time::Instant::now() < end {
            // A snapshot now: a restart in this burst comes back from it, with a stale fence counter, stale keys
            // and a stale queue (stock redis-server persists to RDB snapshots by default).
            // (Not on a cluster: a lost primary comes back as a replica, which takes its primary's data.)
            if let Lock::Single(server) = &self.lock {
                let _: redis::RedisResult<()> = redis::cmd("SAVE").query(&mut server.connection());
            }
            let burst = tokio::time::Instant::now()
                + self
                    .rng
                    .between(Duration::from_secs(2), Duration::from_secs(6));
            // Faults come at the same pace on every store (0.2 to 2 s apart), though the sessions of etcd, ZooKeeper
            // and the SQL stores are twice Redis's lease.
            let pace = match self.lock {
                Lock::Etcd(_) | Lock::Zk(_) | Lock::Sql(_) => self.ttl / 2,
                _ => self.ttl,
            };
            while tokio::time::Instant::now() < burst.min(end) {
                let gap = self.rng.between(pace / 5, pace * 2);
                tokio::time::sleep(gap).await;
                self.one_fault().await;
            }
            // More dead clients than a release once gave up after (16): in the calm spell that follows, once they
            // are past their liveness, no release may stall on them.
            let dead = 17 + self.rng.below(8);
            self.queue_and_die(dead);
            tokio::time::sleep(crate::check::CALM).await;
        }
    }

    /// One fault, drawn from the mix of the lock's topology: the same ten slots on all of them, the faults of one
    /// server's path and restart (2, 3, 6) replaced on a cluster by a failover, a slot migration and the loss of the
    /// primary, the faults of the lock's server (2 to 8) replaced on a quorum by faults of one or two nodes, and on
    /// etcd, ZooKeeper and a SQL server by faults of a worker's paths and of one member, or the store's own
    /// ([`members::fault`]).
    async fn one_fault(&mut self) {
        let ttl = self.ttl;
        let worker = self.rng.below(self.workers.len() as u64) as usize;
        let start = now_ns();
        let cluster = matches!(self.lock, Lock::Cluster(_));
        let quorum = matches!(self.lock, Lock::Quorum(_));
        let replicated = self.lock.members().is_some();
        match self.rng.below(10) {
            0 => {
                let pause = self.rng.between(ttl * 3 / 2, ttl * 3);
                let _ = self.workers[worker].child.signal(Signal::SIGSTOP);
                tokio::time::sleep(pause).await;
                let _ = self.workers[worker].child.signal(Signal::SIGCONT);
                self.record(Fault::Stop, Some(worker), start);
            }
            1 => {
                let _ = self.workers[worker].child.signal(Signal::SIGKILL);
                let _ = self.workers[worker].child.wait();
                let incarnation = self.workers[worker].incarnation + 1;
                self.workers[worker] = Worker {
                    child: self.spawn(worker, incarnation),
                    incarnation,
                };
                self.record(Fault::Kill, Some(worker), start);
            }
            2..=8 if quorum => self.node_faults().await,
            slot @ 2..=8 if replicated => {
                // `self.paths(worker)`, but beside the lock borrowed for the fault.
                let per_worker = self.paths(worker).len();
                let paths = &self.proxies[worker * per_worker..(worker + 1) * per_worker];
                let aim = Aim {
                    slot,
                    worker,
                    paths,
                    ttl,
                };
                let rng = &mut self.rng;
                let window = match &mut self.lock {
                    Lock::Etcd(etcd) => members::fault(etcd, &aim, rng).await,
                    Lock::Zk(zk) => members::fault(zk, &aim, rng).await,
                    Lock::Sql(sql) => members::fault(sql, &aim, rng).await,
                    _ => unreachable!("member faults are drawn for etcd, ZooKeeper and SQL only"),
                };
                self.windows.push(window);
            }
            2 if cluster => self.failover().await,
            2 => {
                let cut = self.rng.between(ttl / 2, ttl * 2);
                self.paths(worker)[0].blackhole();
                tokio::time::sleep(cut).await;
                self.paths(worker)[0].restore();
                self.record(Fault::Blackhole, Some(worker), start);
            }
            3 if cluster => self.migrate().await,
            3 => {
                let delay = self.rng.between(Duration::from_millis(2), ttl / 3);
                let length = self.rng.between(ttl, ttl * 4);
                self.paths(worker)[0].delay(delay);
                tokio::time::sleep(length).await;
                self.paths(worker)[0].delay(Duration::ZERO);
                self.record(Fault::Delay, Some(worker), start);
            }
            4 => {
                let longest = if cluster {
                    (ttl * 3 / 2).min(CLUSTER_SLEEP_MAX)
                } else {
                    ttl * 3 / 2
                };
                let sleep = self.rng.between(ttl / 5, longest);
                let primary = self.lock.primary();
                let mut con = self.lock.node();
                tokio::task::block_in_place(|| {
                    let _: redis::RedisResult<()> = redis::cmd("DEBUG")
                        .arg("SLEEP")
                        .arg(sleep.as_secs_f64())
                        .query(&mut con);
                });
                self.record(Fault::DebugSleep, None, start);
                if cluster {
                    self.check_primary_kept(primary, start);
                }
            }
            5 => {
                let pause = self.rng.between(ttl / 5, ttl * 2);
                let _: redis::RedisResult<()> = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(pause.as_millis() as u64)
                    .query(&mut self.lock.node());
                tokio::time::sleep(pause).await;
                self.record(Fault::Pause, None, start);
            }
            6 if cluster => self.lose_primary().await,
            6 => {
                let Lock::Single(server) = &mut self.lock else {
                    unreachable!("a cluster and a quorum take the arms above")
                };
                // A crash (SIGKILL), and a restart from the snapshot taken at the start of the burst.
                tokio::task::block_in_place(|| server.restart());
                self.bystander = Some(bystander(server).await);
                self.record(Fault::Restart, None, start);
            }
            7 => {
                // On a cluster the replica follows through replication: the lock's data is gone from both.
                let _: () = redis::cmd("FLUSHALL")
                    .query(&mut self.lock.node())
                    .expect("FLUSHALL");
                self.record(Fault::Flushall, None, start);
            }
            8 => {
                let _: redis::RedisResult<()> = redis::cmd("DEL")
                    .arg(format!("{}:fence", lock_key()))
                    .query(&mut self.lock.node());
                self.record(Fault::DelFence, None, start);
            }
            _ => {
                let n = 1 + self.rng.below(20);
                self.queue_and_die(n);
            }
        }
    }

    /// The cluster, for the faults only a cluster has.
    fn cluster(&mut self) -> &mut RedisCluster {
        match &mut self.lock {
            Lock::Cluster(cluster) => cluster,
            Lock::Single(_) | Lock::Quorum(_) | Lock::Etcd(_) | Lock::Zk(_) | Lock::Sql(_) => {
                unreachable!("a cluster fault drawn elsewhere")
            }
        }
    }

    /// Faults of one or two quorum nodes (never more: [`MAX_FAULTY_NODES`]), each node with a fault of its own drawn
    /// from the node mix, in force at the same time; the next fault comes only once all of them are over.
    async fn node_faults(&mut self) {
        let ttl = self.ttl;
        let count = 1 + self.rng.below(MAX_FAULTY_NODES as u64) as usize;
        let mut picked: Vec<usize> = Vec::new();
        while picked.len() < count {
            let node = self.rng.below(QUORUM_NODES as u64) as usize;
            if !picked.contains(&node) {
                picked.push(node);
            }
        }
        let plans: Vec<(usize, NodeFault)> = picked
            .into_iter()
            .map(|node| (node, NodeFault::draw(&mut self.rng, ttl)))
            .collect();
        let Lock::Quorum(nodes) = &mut self.lock else {
            unreachable!("node faults are drawn for a quorum only")
        };
        let proxies = &self.proxies;
        let runs = nodes.iter_mut().enumerate().filter_map(|(i, server)| {
            let (_, fault) = plans.iter().find(|(node, _)| *node == i)?;
            Some(fault.inflict(i, server, &proxies[i], ttl))
        });
        let windows = join_all(runs).await;
        self.windows.extend(windows);
    }

    /// `CLUSTER FAILOVER` on the replica of the lock's primary: the replica catches up, then takes over the slot
    /// while the workers hold and wait for the lock.
    async fn failover(&mut self) {
        let start = now_ns();
        let cluster = self.cluster();
        tokio::task::block_in_place(|| {
            let primary = cluster.primary_of_slot(slot_of(&lock_key()));
            cluster.failover(cluster.replica_of(primary));
        });
        self.record(Fault::Failover, None, start);
    }

    /// Migrates the lock's slot to another primary and back, each way pausing half-way (the source still serves the
    /// keys it has, redirects with `ASK` for the ones it does not, and answers `TRYAGAIN` to a script whose keys are
    /// split) and between the two.
    async fn migrate(&mut self) {
        let start = now_ns();
        let ttl = self.ttl;
        let pauses: Vec<Duration> = (0..3).map(|_| self.rng.between(ttl / 5, ttl * 2)).collect();
        let pick = self.rng.next_u64();
        let slot = slot_of(&lock_key());
        let cluster = self.cluster();
        let (from, to) = tokio::task::block_in_place(|| {
            let from = cluster.primary_of_slot(slot);
            let others: Vec<usize> = cluster
                .primaries()
                .into_iter()
                .filter(|&p| p != from)
                .collect();
            (from, others[(pick % others.len() as u64) as usize])
        });
        tokio::task::block_in_place(|| cluster.begin_migration(slot, to));
        tokio::time::sleep(pauses[0]).await;
        tokio::task::block_in_place(|| cluster.finish_migration(slot, to));
        tokio::time::sleep(pauses[1]).await;
        tokio::task::block_in_place(|| cluster.begin_migration(slot, from));
        tokio::time::sleep(pauses[2]).await;
        tokio::task::block_in_place(|| cluster.finish_migration(slot, from));
        self.record(Fault::Migrate, None, start);
    }

    /// `kill -9` of the lock's primary; once its replica is elected and a moment later, the killed node started
    /// again (it rejoins as the elected one's replica).
    async fn lose_primary(&mut self) {
        let start = now_ns();
        let down = self.rng.between(Duration::ZERO, self.ttl);
        let slot = slot_of(&lock_key());
        let cluster = self.cluster();
        let primary = tokio::task::block_in_place(|| {
            let primary = cluster.primary_of_slot(slot);
            cluster.kill(primary);
            cluster.wait_primary_elected(slot);
            primary
        });
        self.record(Fault::PrimaryLost, None, start);
        tokio::time::sleep(down).await;
        let start = now_ns();
        let cluster = self.cluster();
        tokio::task::block_in_place(|| cluster.restart(primary));
        self.record(Fault::Rejoin, None, start);
    }

    /// After a `DEBUG SLEEP` from `start` of the lock's primary, which was `before`: if the replica was elected
    /// meanwhile (the sleep outlasted the node timeout on a loaded machine), the sleeper ran what it had queued as a
    /// second primary on waking, which is the loss of a primary, not a sleep.
    fn check_primary_kept(&mut self, before: Option<usize>, start: u64) {
        let cluster = self.cluster();
        let after = tokio::task::block_in_place(|| {
            cluster.wait_stable();
            cluster.primary_of_slot(slot_of(&lock_key()))
        });
        if before != Some(after) {
            eprintln!(
                "torture: DEBUG SLEEP of node {before:?} outlasted the node timeout: node {after} was elected"
            );
            self.record(Fault::PrimaryLost, None, start);
        }
    }

    /// `n` clients join the lock's queue and vanish.
    fn queue_and_die(&mut self, n: u64) {
        let start = now_ns();
        let clients: Vec<ChildGuard> = (0..n)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_torture-worker"))
                    .args(["queue-and-die", &self.lock.url(), NAME, &self.worker_kind])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map(ChildGuard::new)
                    .expect("cannot start torture-worker")
            })
            .collect();
        tokio::task::block_in_place(|| {
            for mut client in clients {
                let _ = client.wait_timeout(Duration::from_secs(10));
            }
        });
        self.record(Fault::QueueAndDie, None, start);
    }

    /// The fault windows, one per line, for a verbose report.
    pub fn windows(&self) -> String {
        self.windows
            .iter()
            .map(|w| {
                format!(
                    "{:?} worker={:?} node={:?} erased={:?} {}..{}",
                    w.fault, w.worker, w.node, w.erased, w.start, w.end
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops the workers, reads their histories and checks them.
    pub async fn finish(mut self) -> Outcome {
        for worker in &mut self.workers {
            let _ = worker.child.signal(Signal::SIGKILL);
            let _ = worker.child.wait();
        }
        if let Some(observer) = &mut self.observer {
            let _ = observer.signal(Signal::SIGKILL);
            let _ = observer.wait();
        }
        let (grants, stats) = read_all(self.dir.path());
        let mut report = check(
            &grants,
            &self.windows,
            self.ttl,
            Rule::of(&self.kind),
            self.topology,
        );
        if self.observer.is_some() {
            let log =
                std::fs::read_to_string(self.dir.path().join(OBSERVER_LOG)).unwrap_or_default();
            report.observer = Some(crate::check::observer(&log, &grants, self.topology));
        }
        let keys_without_ttl = self.lock.keys_without_ttl(self.ttl).await;
        // Kept for a violation, or whenever TORTURE_KEEP is set (to read a clean run's timings too).
        let keep = report.violations() + keys_without_ttl.len() > 0
            || std::env::var_os("TORTURE_KEEP").is_some();
        let kept = keep.then(|| self.keep());
        Outcome {
            report,
            stats,
            faults: self.windows.len(),
            keys_without_ttl,
            kept,
        }
    }

    /// Copies the workers' histories and the fault windows (and on etcd, ZooKeeper and SQL the servers' logs) out of
    /// the run's temporary directory (removed when the rig is dropped), so that a violation can be read line by line
    /// afterwards. Returns where they went.
    fn keep(&self) -> std::path::PathBuf {
        let kind = self.kind.replace(':', "-");
        let kept = std::env::temp_dir().join(format!(
            "leasehold-torture-{}-{}-{kind}",
            std::process::id(),
            self.topology
        ));
        let copied = std::fs::create_dir_all(&kept).and_then(|()| {
            for entry in std::fs::read_dir(self.dir.path())? {
                let entry = entry?;
                if entry.file_type()?.is_file() {
                    std::fs::copy(entry.path(), kept.join(entry.file_name()))?;
                }
            }
            if let Lock::Etcd(etcd) = &self.lock {
                for member in 0..etcd.members() {
                    std::fs::write(kept.join(format!("etcd-{member}.log")), etcd.log(member))?;
                }
            }
            if let Lock::Zk(zk) = &self.lock {
                for server in 0..zk.members() {
                    std::fs::write(kept.join(format!("zk-{server}.log")), zk.log(server))?;
                }
            }
            if let Lock::Sql(sql) = &self.lock {
                let (file, log) = sql.log();
                std::fs::write(kept.join(file), log)?;
            }
            std::fs::write(kept.join("windows.txt"), self.windows())
        });
        if let Err(err) = copied {
            eprintln!(
                "torture: could not keep the histories in {}: {err}",
                kept.display()
            );
        }
        kept
    }
}

/// A fault of one quorum node, with its parameters drawn in advance (the nodes' faults run at once, and the seed
/// must replay them).
#[derive(Debug, Clone, Copy)]
enum NodeFault {
    /// `kill -9`, and a restart without data once the node was down for `down`, at least the Redlock restart rule's
    /// downtime (`leasehold_tests::restart_downtime`), which [`NodeFault::inflict`] enforces.
    Restart { down: Duration },
    /// `DEBUG SLEEP`: the node stops answering, and runs what queued up when it wakes.
    Sleep(Duration),
    /// `CLIENT PAUSE`: commands wait, and so does key expiry.
    Pause(Duration),
    /// The node's proxy swallows everything, both ways: the node is partitioned from every worker.
    Blackhole(Duration),
    /// The node's proxy holds every chunk back by `delay`, both ways, for `length`: a slow node.
    Delay { delay: Duration, length: Duration },
    /// `FLUSHALL` of the node: its lock key and fence counter gone, and it answers at once (a restart without the
    /// wait).
    Flushall,
    /// `DEL` of the node's fence counter.
    DelFence,
}

impl NodeFault {
    fn draw(rng: &mut Rng, ttl: Duration) -> NodeFault {
        match rng.below(7) {
            0 => {
                let rule = leasehold_tests::restart_downtime(ttl);
                NodeFault::Restart {
                    down: rng.between(rule, rule + ttl),
                }
            }
            1 => NodeFault::Sleep(rng.between(ttl / 5, ttl * 3 / 2)),
            2 => NodeFault::Pause(rng.between(ttl / 5, ttl * 2)),
            3 => NodeFault::Blackhole(rng.between(ttl / 2, ttl * 2)),
            4 => NodeFault::Delay {
                delay: rng.between(Duration::from_millis(2), ttl / 3),
                length: rng.between(ttl, ttl * 4),
            },
            5 => NodeFault::Flushall,
            _ => NodeFault::DelFence,
        }
    }

    /// Inflicts the fault on node `node` (its `server`, reached by the workers through `proxy`), for workers whose
    /// leases are `ttl` long, and says when it was in force.
    async fn inflict(
        self,
        node: usize,
        server: &mut RedisServer,
        proxy: &TcpProxy,
        ttl: Duration,
    ) -> Window {
        let start = now_ns();
        let (fault, erased) = match self {
            NodeFault::Restart { down } => {
                tokio::task::block_in_place(|| server.kill());
                let killed = tokio::time::Instant::now();
                tokio::time::sleep(down).await;
                // The restart rule: a node that forgot its grants answers again only once every lease it granted
                // has ended (or is held on a majority without it), and its clock is past every fence it saw.
                assert!(
                    killed.elapsed() >= leasehold_tests::restart_downtime(ttl),
                    "a node restarted without its data after {:?}, within the rule's downtime",
                    killed.elapsed()
                );
                tokio::task::block_in_place(|| server.restart());
                (Fault::NodeRestart, Vec::new())
            }
            NodeFault::Sleep(sleep) => {
                let _: redis::RedisResult<()> = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg(sleep.as_secs_f64())
                    .query_async(&mut node_connection(server).await)
                    .await;
                (Fault::DebugSleep, Vec::new())
            }
            NodeFault::Pause(pause) => {
                let _: redis::RedisResult<()> = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(pause.as_millis() as u64)
                    .query_async(&mut node_connection(server).await)
                    .await;
                tokio::time::sleep(pause).await;
                (Fault::Pause, Vec::new())
            }
            NodeFault::Blackhole(cut) => {
                proxy.blackhole();
                tokio::time::sleep(cut).await;
                proxy.restore();
                (Fault::Blackhole, Vec::new())
            }
            NodeFault::Delay { delay, length } => {
                proxy.delay(delay);
                tokio::time::sleep(length).await;
                proxy.delay(Duration::ZERO);
                (Fault::Delay, Vec::new())
            }
            NodeFault::Flushall => {
                // The tokens the node held (a mutex's, or a read-write lock's holds), read in the same atomic step:
                // the only grants this can take from the node.
                let (erased, ()): (Vec<String>, ()) = redis::pipe()
                    .atomic()
                    .cmd("EVAL")
                    .arg(HELD_TOKENS)
                    .arg(1)
                    .arg(lock_key())
                    .cmd("FLUSHALL")
                    .query_async(&mut node_connection(server).await)
                    .await
                    .expect("FLUSHALL");
                (Fault::Flushall, erased)
            }
            NodeFault::DelFence => {
                let _: redis::RedisResult<()> = redis::cmd("DEL")
                    .arg(format!("{}:fence", lock_key()))
                    .query_async(&mut node_connection(server).await)
                    .await;
                (Fault::DelFence, Vec::new())
            }
        };
        Window {
            fault,
            worker: None,
            node: Some(node),
            erased,
            start,
            end: now_ns(),
        }
    }
}

/// The tokens a lock key holds: a mutex's owner token, or every hold of a read-write lock's set.
const HELD_TOKENS: &str = "local t = redis.call('TYPE', KEYS[1]).ok \
    if t == 'string' then return {redis.call('GET', KEYS[1])} end \
    if t == 'zset' then return redis.call('ZRANGE', KEYS[1], 0, -1) end \
    return {}";

/// A connection of the rig's own to a quorum node, patient enough for a `DEBUG SLEEP`.
async fn node_connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    server
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("a healthy quorum node accepts the rig's connection")
}

/// A connection subscribed to every channel (`PSUBSCRIBE *`), as a monitoring tool would be.
async fn bystander(server: &RedisServer) -> redis::aio::PubSub {
    let mut pubsub = server.client().get_async_pubsub().await.unwrap();
    pubsub.psubscribe("*").await.unwrap();
    pubsub
}

/// Keys on one node that would never expire.
fn keys_without_ttl(mut con: redis::Connection) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    keys.into_iter()
        .filter(|key| redis::cmd("PTTL").arg(key).query::<i64>(&mut con).unwrap() == -1)
        .collect()
}

pub struct Outcome {
    report: Report,
    pub stats: Stats,
    faults: usize,
    keys_without_ttl: Vec<String>,
    /// Where the histories of a run with violations were kept.
    pub kept: Option<std::path::PathBuf>,
}

impl Outcome {
    pub fn violations(&self) -> usize {
        self.report.violations() + self.keys_without_ttl.len()
    }

    /// The one-line summary.
    pub fn line(&self, topology: Topology, kind: &str, seed: u64, seconds: u64) -> String {
        let r = &self.report;
        format!(
            "torture topology={topology} kind={kind} seed={seed} secs={seconds} sections={} faults={} overlaps={} fence_regressions={} late_losses={} \
             stalls={} keys_without_ttl={} | excused_overlaps={} writes={} refused={} occupied={} errors={}",
            self.stats.sections,
            self.faults,
            r.overlaps.len(),
            r.fence_regressions.len(),
            r.late_losses.len(),
            r.stalls.len(),
            self.keys_without_ttl.len(),
            r.excused_overlaps.len(),
            self.stats.writes,
            self.stats.refused,
            self.stats.occupied,
            self.stats.errors,
        ) + &self.report.observer.as_ref().map_or(String::new(), |o| {
            format!(
                " | observer: said={} missed={} count_lost={} violations={}",
                o.said,
                o.missed,
                o.count_lost,
                o.violations.len()
            )
        })
    }

    /// Every violation, one per line.
    pub fn details(&self) -> String {
        let r = &self.report;
        let mut lines = Vec::new();
        lines.extend(r.overlaps.iter().map(|v| format!("overlap: {v}")));
        lines.extend(
            r.fence_regressions
                .iter()
                .map(|v| format!("fence regression: {v}")),
        );
        lines.extend(r.late_losses.iter().map(|v| format!("late loss: {v}")));
        lines.extend(r.stalls.iter().map(|v| format!("stall: {v}")));
        if let Some(observer) = &r.observer {
            lines.extend(observer.violations.iter().map(|v| format!("observer: {v}")));
        }
        lines.extend(
            self.keys_without_ttl
                .iter()
                .map(|k| format!("key without TTL: {k}")),
        );
        lines.extend(
            r.excused_overlaps
                .iter()
                .map(|v| format!("(excused: data loss) overlap: {v}")),
        );
        lines.join("\n")
    }
}
