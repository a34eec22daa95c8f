//! `leasehold bench`: leasehold against the raw-Redis floor and a peer's recipe, on any Redis, in one run.
//!
//! | scenario | what runs |
//! |---|---|
//! | `floor-1` | 1 task: `SET NX PX` + owner-checked delete script, on a redis-rs `ConnectionManager` |
//! | `uncontended-1` | 1 task: leasehold `lock()` + `release()` on its own key |
//! | `floor-64` / `uncontended-64` | the same with 64 tasks in this process, distinct keys |
//! | `floor-8p` | 8 worker processes spinning on ONE key: `SET NX PX` until granted, then the owner-checked delete |
//! | `peer-1`, `peer-64`, `peer-8p` | rslock's recipe, the best Rust peer's: the floor's commands on a redis-rs `MultiplexedConnection`; when busy, the delete of its own token and a random sleep below 2 ms |
//! | `contended-8p` | 8 worker processes looping on ONE lock (leasehold), empty critical section |
//! | `handoff` | 2 worker processes taking turns: release → the waiting other holds it |
//! | `renew-10k` | one worker process holds 10,000 locks through 3 renewal periods (1 s) of a 3 s lease |
//!
//! Every scenario runs on a Redis Cluster too (`--store redis+cluster://h:p,h:p,…`): the floor then uses redis-rs's
//! cluster connection, the server's CPU time and script calls are summed over every primary, and the in-process
//! scenarios say how their keys spread over slots and primaries (`bench:N`, which leasehold uses as the hash tag).
//!
//! On a quorum of independent servers (`--store` given three times or more, or `--quorum N` private servers), the
//! scenarios are the quorum's, each beside its single-node figure on the first node:
//!
//! | scenario | what runs |
//! |---|---|
//! | `quorum-floor-1` | 1 task: `SET NX PX` to every node at once, done at a majority's OK; the delete on every node |
//! | `quorum-1` | 1 task: leasehold `QuorumMutex` `try_lock()` + `release()`, p50 beside each node's round trip |
//! | `uncontended-1` | as above, on the first node alone |
//! | `quorum-64` | `quorum-1` with 64 tasks, distinct keys |
//! | `quorum-contended-8p` | 8 worker processes looping `lock()` + `release()` on ONE quorum mutex |
//! | `contended-8p` | as above, on the first node alone |
//!
//! The server CPU of a quorum scenario is summed over every node.
//!
//! On etcd (`--store etcd://host:port[,host:port…]`), the scenarios that make sense there, against etcd's own floor
//! (see [`etcd`]), with the server CPU read from every member's `/metrics` page:
//!
//! | scenario | what runs |
//! |---|---|
//! | `etcd-lock-1`, `etcd-lock-64` | 1 or 64 tasks: etcd's `Lock` RPC under a lease, then `Unlock` (what a Go user gets) |
//! | `etcd-lock-8p` | 8 worker processes waiting in etcd's `Lock` RPC on ONE name |
//! | `uncontended-1`, `-64`, `contended-8p`, `handoff`, `fair-8p`, `fair-handoff`, `rw-8p`, `semaphore-8p` | as on Redis, leasehold on etcd; the first four against the etcd floor |
//! | `renew-10k` | as on Redis: the 10,000 locks follow one session lease, so its renewal calls are the session's keep-alives |
//!
//! `floor-*` and `peer-*` (raw Redis, rslock) are skipped there, with a note.
//!
//! On ZooKeeper (`--store zk://host:port[,host:port…][/chroot]`), likewise, against ZooKeeper's floor (see
//! [`zookeeper`]):
//!
//! | scenario | what runs |
//! |---|---|
//! | `zk-floor-1`, `zk-floor-64` | 1 or 64 tasks of one session: create an ephemeral sequential node, then delete it |
//! | `zk-floor-8p` | 8 worker processes on ONE name: the same node, which waits for the node ahead to go (the textbook recipe's wait) |
//! | `uncontended-1`, `-64`, `contended-8p`, `handoff`, `fair-8p`, `fair-handoff`, `rw-8p`, `semaphore-8p` | as on Redis, leasehold on ZooKeeper; the first four against the ZooKeeper floor |
//! | `renew-10k` | as on etcd: the 10,000 locks follow one session, so its renewal calls are the requests the server received (the session's `sync`s) |
//!
//! The server CPU is that of the server processes on this machine (ZooKeeper reports none itself).
//!
//! On PostgreSQL (`--store postgres://user@host:port/database`, or `postgresql://`), likewise, against its session
//! advisory lock (see [`postgres`]):
//!
//! | scenario | what runs |
//! |---|---|
//! | `pg-floor-1`, `pg-floor-64` | 1 or 64 tasks, each on a connection of its own: `SELECT pg_advisory_lock(key)`, then `pg_advisory_unlock(key)`, the key a 64-bit hash of the name |
//! | `pg-floor-8p` | 8 worker processes on ONE name: `pg_advisory_lock` waits in the server until the holder unlocks |
//! | `pg-row-1`, `pg-row-64` | 1 or 64 tasks, each on a connection of its own: `INSERT` of the lock's row (its name the primary key), then its `DELETE`, each a durable transaction: what any lease row costs (ShedLock's JDBC provider, say); the uncontended rows' `× row floor` |
//! | `uncontended-1`, `-64`, `contended-8p`, `handoff`, `fair-8p`, `fair-handoff`, `rw-8p`, `semaphore-8p` | as on Redis, leasehold on PostgreSQL; the first four against the PostgreSQL floor |
//! | `renew-10k` | as on Redis; its renewal calls are the transactions the server ran (`pg_stat_database`) |
//!
//! On MySQL or MariaDB (`--store mysql://user@host:port/database`, or `mariadb://`), likewise, against their named
//! lock (see [`mysql`]):
//!
//! | scenario | what runs |
//! |---|---|
//! | `my-floor-1`, `my-floor-64` | 1 or 64 tasks, each on a connection of its own: `SELECT GET_LOCK(name, 10)`, then `RELEASE_LOCK(name)` |
//! | `my-floor-8p` | 8 worker processes on ONE name: `GET_LOCK` waits in the server until the holder releases |
//! | `my-row-1`, `my-row-64` | as `pg-row-1`, `-64`: `INSERT` of the lock's row in an InnoDB table (its name a `VARBINARY(512)` primary key), then its `DELETE`, each autocommitted, prepared |
//! | `uncontended-1`, `-64`, `contended-8p`, `handoff`, `fair-8p`, `fair-handoff`, `rw-8p`, `semaphore-8p` | as on Redis, leasehold on MySQL; the first four against the MySQL floor |
//! | `renew-10k` | as on Redis; its renewal calls are the statements the server received (`Questions`) |
//!
//! Neither reports its CPU time: it is that of the server on this machine (PostgreSQL's with its backends), from
//! `/proc` (see [`local`]).

mod etcd;
mod local;
mod mysql;
mod plot;
mod postgres;
mod quorum;
mod raw;
mod scenario;
mod stats;
mod table;
pub mod worker;
mod zookeeper;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::exit;
use crate::server::PrivateServer;
use crate::stores::Store;
use quorum::Nodes;
use scenario::{Recipe, Setup};
use stats::{OnQuorum, Outcome};
use table::{result_line, table};

/// Every scenario of one server or cluster, in the order they run.
pub const SCENARIOS: [&str; 15] = [
    "floor-1",
    "peer-1",
    "uncontended-1",
    "floor-64",
    "peer-64",
    "uncontended-64",
    "floor-8p",
    "peer-8p",
    "contended-8p",
    "handoff",
    "fair-8p",
    "fair-handoff",
    "rw-8p",
    "semaphore-8p",
    "renew-10k",
];

/// Every scenario of a quorum, in the order they run: each of the quorum's beside its figure on the first node alone.
pub const QUORUM_SCENARIOS: [&str; 6] = [
    "quorum-floor-1",
    "quorum-1",
    "uncontended-1",
    "quorum-64",
    "quorum-contended-8p",
    "contended-8p",
];

/// Every scenario on etcd, in the order they run: etcd's own floor (its `Lock` RPC) in place of the Redis floor, and
/// no peer (rslock's recipe is Redis's).
pub const ETCD_SCENARIOS: [&str; 12] = [
    "etcd-lock-1",
    "uncontended-1",
    "etcd-lock-64",
    "uncontended-64",
    "etcd-lock-8p",
    "contended-8p",
    "handoff",
    "fair-8p",
    "fair-handoff",
    "rw-8p",
    "semaphore-8p",
    "renew-10k",
];

/// Every scenario on ZooKeeper, in the order they run: ZooKeeper's floor (a bare node created and deleted) in place of
/// the Redis floor, and no peer.
pub const ZK_SCENARIOS: [&str; 12] = [
    "zk-floor-1",
    "uncontended-1",
    "zk-floor-64",
    "uncontended-64",
    "zk-floor-8p",
    "contended-8p",
    "handoff",
    "fair-8p",
    "fair-handoff",
    "rw-8p",
    "semaphore-8p",
    "renew-10k",
];

/// The scenarios of a SQL store whose own scenarios are named `$store-…` (`pg`, `my`), in the order they run: the
/// store's own lock as the floor (`$store-floor-*`), and a durable lease row (`$store-row-*`, inserted and deleted)
/// in the peer's place (see `peers_of`).
macro_rules! sql_scenarios {
    ($store:literal) => {
        [
            concat!($store, "-floor-1"),
            concat!($store, "-row-1"),
            "uncontended-1",
            concat!($store, "-floor-64"),
            concat!($store, "-row-64"),
            "uncontended-64",
            concat!($store, "-floor-8p"),
            "contended-8p",
            "handoff",
            "fair-8p",
            "fair-handoff",
            "rw-8p",
            "semaphore-8p",
            "renew-10k",
        ]
    };
}

/// Every scenario on PostgreSQL, in the order they run: its session advisory lock as the floor, and a durable lease
/// row (`pg-row-*`) in the peer's place.
pub const PG_SCENARIOS: [&str; 14] = sql_scenarios!("pg");

/// Every scenario on MySQL or MariaDB, in the order they run: its named lock (`GET_LOCK`) as the floor, and a durable
/// lease row (`my-row-*`) in the peer's place.
pub const MY_SCENARIOS: [&str; 14] = sql_scenarios!("my");

/// The table of the SQL stores' row floors (`pg-row-*`, `my-row-*`): a lease row as a durable lock keeps one, its
/// column `name` the lock's name and the primary key, so that a second insert of a name fails.
const ROW_TABLE: &str = "leasehold_bench_rows";

/// What the bench runs on: the scenario list and the topology's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    /// One Redis server or cluster.
    One,
    /// A quorum of independent Redis servers.
    Quorum,
    /// An etcd cluster.
    Etcd,
    /// A ZooKeeper ensemble.
    ZooKeeper,
    /// A PostgreSQL server.
    Postgres,
    /// A MySQL or MariaDB server.
    MySql,
}

impl Topology {
    fn scenarios(self) -> &'static [&'static str] {
        match self {
            Topology::One => &SCENARIOS,
            Topology::Quorum => &QUORUM_SCENARIOS,
            Topology::Etcd => &ETCD_SCENARIOS,
            Topology::ZooKeeper => &ZK_SCENARIOS,
            Topology::Postgres => &PG_SCENARIOS,
            Topology::MySql => &MY_SCENARIOS,
        }
    }
}

/// `leasehold bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Use this Redis server (or cluster: redis+cluster://host:port,host:port,…) instead of starting a private one.
    /// Given 3 times or more: a quorum of independent servers (Redlock), with the scenarios quorum-floor-1, quorum-1,
    /// quorum-64, quorum-contended-8p, and uncontended-1 and contended-8p on the first server alone. An etcd cluster:
    /// etcd://host:port[,host:port…], against etcd's own lock (etcd-lock-1, -64, -8p). A ZooKeeper ensemble:
    /// zk://host:port[,host:port…][/chroot], against bare ephemeral sequential nodes (zk-floor-1, -64, -8p). A
    /// PostgreSQL server: postgres://user@host:port/database, against its advisory lock (pg-floor-1, -64, -8p) and a
    /// durable lease row (pg-row-1, -64). A MySQL or MariaDB server: mysql:// or mariadb://user@host:port/database,
    /// against GET_LOCK (my-floor-1, -64, -8p) and a durable lease row (my-row-1, -64).
    #[arg(long = "store", visible_alias = "redis", value_name = "URL")]
    pub store: Vec<String>,

    /// Start N private servers (3 to 15) instead of one, and bench a quorum of them (as --store given N times).
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "store",
        value_parser = clap::value_parser!(u8).range(3..=15)
    )]
    pub quorum: Option<u8>,

    /// How long each scenario measures (after a short warm-up).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = crate::duration::parse)]
    pub duration: Duration,

    /// Print one JSON object per scenario instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Also draw the acquire-latency distribution (CDF, log-scale time) of every scenario into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,

    /// Run only these scenarios (comma-separated).
    #[arg(long, value_name = "A,B", value_delimiter = ',', value_parser = parse_scenario)]
    pub scenarios: Vec<String>,
}

fn parse_scenario(name: &str) -> Result<String, String> {
    if [
        &SCENARIOS[..],
        &QUORUM_SCENARIOS,
        &ETCD_SCENARIOS,
        &ZK_SCENARIOS,
        &PG_SCENARIOS,
        &MY_SCENARIOS,
    ]
    .iter()
    .any(|list| list.contains(&name))
    {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "unknown scenario {name:?}; known: {}; on a quorum: {}; on etcd: {}; on ZooKeeper: {}; on PostgreSQL: {}; \
             on MySQL: {}",
            SCENARIOS.join(", "),
            QUORUM_SCENARIOS.join(", "),
            ETCD_SCENARIOS.join(", "),
            ZK_SCENARIOS.join(", "),
            PG_SCENARIOS.join(", "),
            MY_SCENARIOS.join(", ")
        ))
    }
}

/// A usage error unless `--store` names one server (or cluster, etcd cluster, ZooKeeper ensemble), or the distinct
/// independent servers of a quorum.
fn check_servers(urls: &[String]) -> anyhow::Result<()> {
    let usage = |message: &str| Err(exit::fail(exit::USAGE, message));
    crate::stores::check_one_url(urls)?;
    match urls.len() {
        0 | 1 => return Ok(()),
        2 => return usage(
            "--store given twice: one server (or cluster) takes one --store, a quorum at least 3",
        ),
        _ => {}
    }
    for (i, url) in urls.iter().enumerate() {
        if urls[..i].contains(url) {
            return usage("a quorum's servers must be distinct: one given twice would vote twice");
        }
        if leasehold::__private::cluster_seeds(url).is_some() {
            return usage("a quorum is made of independent servers (redis://…), not of clusters");
        }
    }
    Ok(())
}

/// The servers of the run: `--store` as given, or private ones (kept running while the returned servers live).
fn servers(args: &BenchArgs) -> anyhow::Result<(Vec<String>, Vec<PrivateServer>)> {
    if !args.store.is_empty() {
        return Ok((args.store.clone(), Vec::new()));
    }
    let mut private = Vec::new();
    for _ in 0..args.quorum.map_or(1, usize::from) {
        private.push(
            PrivateServer::start().map_err(|e| exit::fail(exit::UNAVAILABLE, e.to_string()))?,
        );
    }
    Ok((private.iter().map(PrivateServer::url).collect(), private))
}

/// A usage error when a chosen scenario does not run on this topology.
fn check_scenarios(chosen: &[String], topology: Topology) -> anyhow::Result<()> {
    let runs = topology.scenarios();
    let Some(name) = chosen.iter().find(|name| !runs.contains(&name.as_str())) else {
        return Ok(());
    };
    let message = match topology {
        Topology::Quorum => format!(
            "{name} does not run on a quorum; there: {}",
            QUORUM_SCENARIOS.join(", ")
        ),
        Topology::Etcd | Topology::ZooKeeper | Topology::Postgres | Topology::MySql => format!(
            "{name} does not run on {} (the raw-Redis floor, rslock's recipe and the quorum are Redis's, each \
             store's floor its own); there: {}",
            match topology {
                Topology::Etcd => "etcd",
                Topology::ZooKeeper => "ZooKeeper",
                Topology::Postgres => "PostgreSQL",
                _ => "MySQL/MariaDB",
            },
            topology.scenarios().join(", ")
        ),
        Topology::One if name.starts_with("etcd-") => {
            format!("{name} needs an etcd store: --store etcd://host:port")
        }
        Topology::One if name.starts_with("zk-") => {
            format!("{name} needs a ZooKeeper store: --store zk://host:port")
        }
        Topology::One if name.starts_with("pg-") => format!(
            "{name} needs a PostgreSQL store: --store postgres://user@host:port/database"
        ),
        Topology::One if name.starts_with("my-") => format!(
            "{name} needs a MySQL or MariaDB store: --store mysql://user@host:port/database (or mariadb://)"
        ),
        Topology::One => {
            format!("{name} needs a quorum: --quorum N, or --store given 3 times or more")
        }
    };
    Err(exit::fail(exit::USAGE, message))
}

/// The note printed on etcd: what its floor is, and which scenarios of a Redis run it skips.
const ON_ETCD: &str = "on etcd: × floor is against etcd-lock-1, -64, -8p, etcd's own Lock RPC under a lease (in place \
                       of floor-1, -64, -8p, the raw-Redis floor); peer-1, -64, -8p (rslock's recipe, for Redis) are \
                       skipped";

/// The note printed on ZooKeeper, likewise.
const ON_ZOOKEEPER: &str = "on ZooKeeper: × floor is against zk-floor-1, -64, -8p, a bare ephemeral sequential node \
                            created and deleted (8p: waiting for the node ahead; in place of floor-1, -64, -8p, the \
                            raw-Redis floor); peer-1, -64, -8p (rslock's recipe, for Redis) are skipped";

/// The note printed on a SQL store, likewise: `$store` its name, `$id` its scenarios' prefix, `$floor` what its floor
/// takes and releases, `$wait` where the floor's 8 processes wait.
macro_rules! on_sql {
    ($store:literal, $id:literal, $floor:literal, $wait:literal) => {
        concat!(
            "on ",
            $store,
            ": × floor is against ",
            $id,
            "-floor-1, -64, -8p, ",
            $floor,
            " taken and released on a connection per task (8p: waiting in ",
            $wait,
            "; in place of floor-1, -64, -8p, the raw-Redis floor); × row floor is against ",
            $id,
            "-row-1, -64, a durable lease row inserted and deleted (in place of peer-1, -64, \
             rslock's recipe for Redis)"
        )
    };
}

/// The note printed on PostgreSQL, likewise.
const ON_POSTGRES: &str = on_sql!(
    "PostgreSQL",
    "pg",
    "a session advisory lock",
    "pg_advisory_lock"
);

/// The note printed on MySQL and MariaDB, likewise.
const ON_MYSQL: &str = on_sql!("MySQL/MariaDB", "my", "a named lock (GET_LOCK)", "GET_LOCK");

/// The floor scenario a leasehold scenario is set against, on each store (at most one of them runs).
fn floors_of(name: &str) -> &'static [&'static str] {
    match name {
        "uncontended-1" => &[
            "floor-1",
            "etcd-lock-1",
            "zk-floor-1",
            "pg-floor-1",
            "my-floor-1",
        ],
        "uncontended-64" => &[
            "floor-64",
            "etcd-lock-64",
            "zk-floor-64",
            "pg-floor-64",
            "my-floor-64",
        ],
        "contended-8p" | "fair-8p" => &[
            "floor-8p",
            "etcd-lock-8p",
            "zk-floor-8p",
            "pg-floor-8p",
            "my-floor-8p",
        ],
        "quorum-1" => &["quorum-floor-1"],
        _ => &[],
    }
}

/// Whether scenario `name` is a floor (the store's own primitive, on the store's own client) rather than leasehold.
fn is_floor(name: &str) -> bool {
    floors_of("uncontended-1")
        .iter()
        .chain(floors_of("uncontended-64"))
        .chain(floors_of("contended-8p"))
        .any(|floor| *floor == name)
}

/// The scenario a leasehold scenario's second ratio is against, on each store (at most one of them runs): on Redis
/// rslock's recipe (`× peer`), on the SQL stores in its place a durable lease row (`× row floor`).
fn peers_of(name: &str) -> &'static [&'static str] {
    match name {
        "uncontended-1" => &["peer-1", "pg-row-1", "my-row-1"],
        "uncontended-64" => &["peer-64", "pg-row-64", "my-row-64"],
        "contended-8p" => &["peer-8p"],
        _ => &[],
    }
}

/// Fails early, with the usual exit statuses, when a server cannot be used: connects the library's client to each
/// of `urls`. The PostgreSQL and MySQL floors run on the store's own driver, so there the floor's connection is tried
/// too, and the library's client only when a scenario of `chosen` runs leasehold.
async fn check_reachable(urls: &[String], store: Store, chosen: &[&str]) -> anyhow::Result<()> {
    let on_sql = matches!(store, Store::Postgres | Store::MySql);
    for url in urls {
        if on_sql {
            let shown = crate::connect::redact(url);
            // The driver's own words, under the bench's.
            let raw = raw::Raw::open(url).map_err(|err| {
                let why = err.root_cause();
                exit::fail(
                    exit::USAGE,
                    format!("{shown} is not {} URL: {why}", store.with_article()),
                )
            })?;
            raw.reach().await.map_err(|err| {
                let why = err.root_cause();
                exit::fail(
                    exit::UNAVAILABLE,
                    format!("cannot connect to {} at {shown}: {why}", store.name()),
                )
            })?;
            if chosen.iter().all(|name| is_floor(name)) {
                continue;
            }
        }
        crate::connect::client(url, None).await?;
    }
    Ok(())
}

/// Runs the benchmark and prints its results.
pub async fn bench(args: BenchArgs) -> anyhow::Result<u8> {
    if args.duration > Duration::from_secs(3600) {
        return Err(exit::fail(exit::USAGE, "--duration is limited to 1h"));
    }
    check_servers(&args.store)?;
    let is_quorum = args.quorum.is_some() || args.store.len() >= leasehold::MIN_NODES;
    let store = Store::of_all(&args.store);
    let topology = match (is_quorum, store) {
        (true, _) => Topology::Quorum,
        (false, Store::Etcd) => Topology::Etcd,
        (false, Store::ZooKeeper) => Topology::ZooKeeper,
        (false, Store::Postgres) => Topology::Postgres,
        (false, Store::MySql) => Topology::MySql,
        (false, Store::Redis) => Topology::One,
    };
    // What the table's × floor is against, on the stores with floors of their own.
    let note = match store {
        Store::Etcd => Some(ON_ETCD),
        Store::ZooKeeper => Some(ON_ZOOKEEPER),
        Store::Postgres => Some(ON_POSTGRES),
        Store::MySql => Some(ON_MYSQL),
        Store::Redis => None,
    };
    check_scenarios(&args.scenarios, topology)?;
    let wanted = |name: &str| args.scenarios.is_empty() || args.scenarios.iter().any(|s| s == name);
    let chosen: Vec<&'static str> = topology
        .scenarios()
        .iter()
        .copied()
        .filter(|n| wanted(n))
        .collect();
    let (urls, private) = servers(&args)?;
    check_reachable(&urls, store, &chosen).await?;
    let nodes = if is_quorum {
        Some(Arc::new(Nodes::open(&urls)?))
    } else {
        None
    };
    let url = urls[0].clone();
    // One server or cluster; on a quorum, its first node (the single-node comparisons).
    let setup = Setup {
        raw: raw::Raw::open(&url)?,
        url,
        quorum: None,
        warmup: (args.duration / 10).clamp(Duration::from_millis(100), Duration::from_secs(1)),
        duration: args.duration,
        progress: !args.json,
    };
    // The quorum scenarios' setup; without a quorum none of them is chosen.
    let all_nodes = Setup {
        quorum: nodes.clone(),
        ..setup.clone()
    };
    let rtt_time = (setup.duration / 5).max(Duration::from_millis(200));
    if let (Some(note), true) = (note, args.json) {
        exit::print_err(&format!("bench: {note}"));
    }
    let run = async {
        let mut outcomes: Vec<Outcome> = Vec::new();
        for (index, &name) in chosen.iter().enumerate() {
            let mut outcome = match name {
                "quorum-floor-1" | "quorum-1" => {
                    async {
                        let rtts = match &nodes {
                            Some(nodes) => Some(nodes.round_trips(rtt_time).await?),
                            None => None,
                        };
                        let recipe = if name == "quorum-floor-1" {
                            Recipe::Floor
                        } else {
                            Recipe::Leasehold
                        };
                        let mut outcome = scenario::in_process(&all_nodes, name, 1, recipe).await?;
                        outcome.node_rtts = rtts;
                        anyhow::Ok(outcome)
                    }
                    .await
                }
                "quorum-64" => scenario::in_process(&all_nodes, name, 64, Recipe::Leasehold).await,
                "quorum-contended-8p" => {
                    scenario::contended(&all_nodes, name, 8, Recipe::Leasehold, "mutex").await
                }
                "floor-1" | "etcd-lock-1" | "zk-floor-1" | "pg-floor-1" | "my-floor-1" => {
                    scenario::in_process(&setup, name, 1, Recipe::Floor).await
                }
                // The peer's recipe, or on the SQL stores the lease row in its place.
                _ if peers_of("uncontended-1").contains(&name) => {
                    scenario::in_process(&setup, name, 1, Recipe::Peer).await
                }
                "uncontended-1" => scenario::in_process(&setup, name, 1, Recipe::Leasehold).await,
                "floor-64" | "etcd-lock-64" | "zk-floor-64" | "pg-floor-64" | "my-floor-64" => {
                    scenario::in_process(&setup, name, 64, Recipe::Floor).await
                }
                _ if peers_of("uncontended-64").contains(&name) => {
                    scenario::in_process(&setup, name, 64, Recipe::Peer).await
                }
                "uncontended-64" => scenario::in_process(&setup, name, 64, Recipe::Leasehold).await,
                "floor-8p" | "etcd-lock-8p" | "zk-floor-8p" | "pg-floor-8p" | "my-floor-8p" => {
                    scenario::contended(&setup, name, 8, Recipe::Floor, "mutex").await
                }
                "peer-8p" => scenario::contended(&setup, name, 8, Recipe::Peer, "mutex").await,
                "contended-8p" => {
                    scenario::contended(&setup, name, 8, Recipe::Leasehold, "mutex").await
                }
                "handoff" => scenario::handoff(&setup, name, "mutex").await,
                "fair-8p" => scenario::contended(&setup, name, 8, Recipe::Leasehold, "fair").await,
                "fair-handoff" => scenario::handoff(&setup, name, "fair").await,
                "rw-8p" => scenario::contended(&setup, name, 8, Recipe::Leasehold, "rw").await,
                "semaphore-8p" => {
                    scenario::contended(&setup, name, 8, Recipe::Leasehold, "semaphore:4").await
                }
                _ => scenario::renew(&setup, name).await,
            }
            .with_context(|| format!("scenario {name}"))?;
            outcome.floor_rate = outcomes
                .iter()
                .find(|o| floors_of(name).contains(&o.scenario))
                .map(Outcome::rate);
            outcome.peer_rate = outcomes
                .iter()
                .find(|o| peers_of(name).contains(&o.scenario))
                .map(Outcome::rate);
            outcome.on_quorum = nodes.as_ref().map(|nodes| OnQuorum {
                nodes: nodes.len(),
                all_nodes: name.starts_with("quorum-"),
            });
            outcome.store = store;
            // On stderr whether it is a terminal or not (a CI log, a pipe): a long run is never silent.
            exit::print_err(&result_line(&outcome, index + 1, chosen.len()));
            if args.json {
                println!("{}", outcome.to_json());
            }
            outcomes.push(outcome);
        }
        anyhow::Ok(outcomes)
    };
    let outcomes = tokio::select! {
        outcomes = run => outcomes?,
        _ = tokio::signal::ctrl_c() => return Err(exit::fail(130, "interrupted")),
    };
    if !args.json {
        print!("{}", table(&outcomes));
        if let Some(note) = note {
            println!("{note}");
        }
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::svg(&outcomes))
            .with_context(|| format!("cannot write {}", path.display()))?;
        if !args.json {
            println!("latency plot written to {}", path.display());
        }
    }
    drop(private);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_store_sets_leasehold_against_its_own_floor_run_before() {
        let lists: [&[&str]; 5] = [
            &SCENARIOS,
            &ETCD_SCENARIOS,
            &ZK_SCENARIOS,
            &PG_SCENARIOS,
            &MY_SCENARIOS,
        ];
        for list in lists {
            let at = |name: &str| list.iter().position(|n| *n == name).unwrap();
            for name in ["uncontended-1", "uncontended-64", "contended-8p", "fair-8p"] {
                let floors: Vec<&str> = floors_of(name)
                    .iter()
                    .copied()
                    .filter(|floor| list.contains(floor))
                    .collect();
                assert_eq!(floors.len(), 1, "{name} in {list:?}");
                assert!(at(floors[0]) < at(name), "{name} in {list:?}");
                let peers: Vec<&str> = peers_of(name)
                    .iter()
                    .copied()
                    .filter(|peer| list.contains(peer))
                    .collect();
                assert!(peers.len() <= 1, "{name} in {list:?}");
                assert!(
                    peers.iter().all(|peer| at(peer) < at(name)),
                    "{name} in {list:?}"
                );
            }
        }
        // Each SQL store sets its uncontended rows beside its own lease row, and says so.
        for (list, note, id) in [
            (&PG_SCENARIOS, ON_POSTGRES, "pg"),
            (&MY_SCENARIOS, ON_MYSQL, "my"),
        ] {
            for (name, row) in [("uncontended-1", "row-1"), ("uncontended-64", "row-64")] {
                let row = format!("{id}-{row}");
                assert!(list.contains(&row.as_str()) && peers_of(name).contains(&row.as_str()));
            }
            assert!(
                note.contains(&format!("× row floor is against {id}-row-1, -64, ")),
                "{note}"
            );
        }
        assert!(is_floor("pg-floor-8p") && is_floor("my-floor-1") && is_floor("floor-64"));
        assert!(!is_floor("uncontended-1") && !is_floor("renew-10k"));
    }
}
