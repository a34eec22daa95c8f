//! The scenarios: in-process loops against the store's floor (raw Redis, etcd's own lock, ZooKeeper's bare nodes,
//! PostgreSQL's advisory lock, MySQL's `GET_LOCK`) and leasehold, and the multi-process ones that spawn
//! `leasehold bench-worker` processes.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use leasehold::redis;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::time::Instant;

use super::etcd::{Etcd, Floor as EtcdFloor};
use super::mysql::{self, MySql};
use super::postgres::{self, Pg};
use super::quorum::{Nodes, QuorumFloor};
use super::raw::{Conn, Meter, Raw};
use super::stats::{Outcome, Renewal, Samples};
use super::worker::{unix_ms, Role};
use super::zookeeper::{Floor as ZkFloor, Zk};
use crate::progress::Bar;
use crate::stores::Store;

/// What a scenario needs to know about the run.
#[derive(Clone)]
pub struct Setup {
    /// The server or cluster; on a quorum, its first node.
    pub url: String,
    /// The same server or cluster, for raw commands.
    pub raw: Raw,
    /// For the scenarios of a quorum: every node. The same scenario shapes then run on the quorum (see
    /// [`in_process`], [`contended`]), and the server CPU is summed over the nodes.
    pub quorum: Option<Arc<Nodes>>,
    pub warmup: Duration,
    pub duration: Duration,
    pub progress: bool,
}

/// The owner-checked delete every lock needs: the floor's release.
pub const RAW_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// Which lock an in-process or contended scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    /// The floor: `SET NX PX`, the owner-checked delete, on a redis-rs `ConnectionManager` in this process (on a
    /// multiplexed connection in the contended workers); a busy answer is retried at once. On etcd, etcd's own
    /// `Lock`/`Unlock` RPC under a lease (see [`super::etcd`]); on ZooKeeper, a bare ephemeral sequential node created
    /// and deleted (see [`super::zookeeper`]); on PostgreSQL, `pg_advisory_lock` + `pg_advisory_unlock` (see
    /// [`super::postgres`]); on MySQL, `GET_LOCK` + `RELEASE_LOCK` (see [`super::mysql`]), each task on a connection
    /// of its own.
    Floor,
    /// A peer's recipe, rslock's: the floor's two commands on a redis-rs `MultiplexedConnection`; a busy answer is
    /// followed by the owner-checked delete of its own token (rslock undoes a failed round on every server) and a
    /// random sleep below [`PEER_RETRY_DELAY`](super::worker::PEER_RETRY_DELAY). On PostgreSQL and MySQL, in its
    /// place, a durable lease row inserted and deleted, each task on a connection of its own (see
    /// [`super::postgres`], [`super::mysql`]).
    Peer,
    /// leasehold.
    Leasehold,
}

enum Engine {
    /// `SET key token NX PX 30000`, then the owner-checked delete script, on a redis-rs `ConnectionManager` (on a
    /// cluster, its cluster connection).
    Floor(Conn),
    /// The same commands on a redis-rs `MultiplexedConnection` (on a cluster, its cluster connection): rslock's
    /// recipe, which without contention never retries.
    Peer(Conn),
    /// leasehold `lock()` + `release()` (lease 30 s, watchdog on: the defaults).
    Leasehold(leasehold::Client),
    /// On a quorum: `SET NX PX` to every node at once, granted when a majority said OK; the delete on every node.
    QuorumFloor(QuorumFloor),
    /// On a quorum: leasehold `QuorumMutex::try_lock()` + `release()` (lease 30 s: the default).
    Quorum(leasehold::Quorum),
    /// On etcd: etcd's `Lock` RPC under a lease of this process, then `Unlock` (boxed: etcd's client is large).
    EtcdFloor(Box<EtcdFloor>),
    /// On ZooKeeper: an ephemeral sequential node of one session of this process, created and deleted.
    ZkFloor(ZkFloor),
    /// On PostgreSQL: a session advisory lock taken and released, or a lease row inserted and deleted, on a
    /// connection per task.
    PgFloor(postgres::Floor),
    /// On MySQL: a named lock (`GET_LOCK`) taken and released, or a lease row inserted and deleted, on a connection
    /// per task.
    MyFloor(mysql::Floor),
}

/// One task's lock, made before its loop: only acquire and release are measured.
enum TaskLock<'a> {
    Floor(&'a Conn),
    Mutex(leasehold::Mutex),
    QuorumFloor(&'a QuorumFloor),
    Quorum(leasehold::QuorumMutex),
    EtcdFloor(&'a EtcdFloor),
    ZkFloor(&'a ZkFloor),
    PgFloor(&'a postgres::Session),
    MyFloor(&'a mysql::Session),
}

/// `tasks` tasks in this process, each on its own key, looping acquire + release; on a quorum setup, the quorum's
/// floor and lock.
pub async fn in_process(
    setup: &Setup,
    scenario: &'static str,
    tasks: usize,
    recipe: Recipe,
) -> anyhow::Result<Outcome> {
    let spread = if setup.raw.is_cluster() {
        let names: Vec<String> = (0..tasks).map(key_of).collect();
        setup.raw.multiplexed().await?.spread(&names).await?
    } else {
        None
    };
    let engine = Arc::new(match (&setup.quorum, recipe) {
        (None, Recipe::Floor) => match &setup.raw {
            Raw::Etcd(etcd) => Engine::EtcdFloor(Box::new(etcd.floor().await?)),
            Raw::ZooKeeper(zk) => Engine::ZkFloor(zk.floor().await?),
            // One connection per task, all open before the warm-up starts.
            Raw::Postgres(pg) => Engine::PgFloor(pg.floor(tasks).await?),
            Raw::MySql(mysql) => Engine::MyFloor(mysql.floor(tasks).await?),
            Raw::Single(_) | Raw::Cluster(_) => Engine::Floor(setup.raw.manager().await?),
        },
        // On the SQL stores the peer's place is the durable lease row, run as their floors are.
        (None, Recipe::Peer) => match &setup.raw {
            Raw::Postgres(pg) => Engine::PgFloor(pg.row_floor(tasks).await?),
            Raw::MySql(mysql) => Engine::MyFloor(mysql.row_floor(tasks).await?),
            _ => Engine::Peer(setup.raw.multiplexed().await?),
        },
        (None, Recipe::Leasehold) => {
            Engine::Leasehold(crate::connect::client(&setup.url, None).await?)
        }
        (Some(nodes), Recipe::Floor) => Engine::QuorumFloor(nodes.floor().await?),
        (Some(nodes), Recipe::Leasehold) => Engine::Quorum(nodes.leasehold().await?),
        (Some(_), Recipe::Peer) => bail!("the peer's recipe does not run on a quorum"),
    });
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let measure_from = start + setup.warmup;
    let end = measure_from + setup.duration;
    let workers: Vec<_> = (0..tasks)
        .map(|task| {
            let engine = Arc::clone(&engine);
            let count = Arc::clone(&count);
            tokio::spawn(async move { cycle_until(&engine, task, measure_from, end, &count).await })
        })
        .collect();
    let cpu = server_cpu_window(setup, measure_from, end);
    let client_cpu = client_cpu_window(measure_from, end);
    let note = || format!("{} acquisitions", count.load(Ordering::Relaxed));
    watch_progress(setup, scenario, start, end, note).await;
    let mut samples = Samples::default();
    for worker in workers {
        samples.extend(worker.await.context("a bench task panicked")??);
    }
    let (server_cpu_s, cpu_primaries) = cpu_of(cpu).await;
    let client_cpu_s = client_cpu.await.ok().and_then(Result::ok);
    Ok(Outcome {
        scenario,
        processes: 1,
        tasks,
        elapsed: setup.duration,
        acquisitions: samples.len() as u64,
        samples: samples.sorted(),
        per_process: Vec::new(),
        floor_rate: None,
        peer_rate: None,
        rtt_p50_us: None,
        renewal: None,
        server_cpu_s,
        cpu_primaries,
        client_cpu_s,
        write_p99_us: None,
        spread,
        on_quorum: None,
        node_rtts: None,
        store: Store::Redis,
    })
}

/// The key (leasehold: the lock name) of in-process task `task`. On a cluster the tasks spread over the slots:
/// leasehold's keys are tagged with the whole name, and the floor's key has no tag, so both hash `bench:N`.
fn key_of(task: usize) -> String {
    format!("bench:{task}")
}

async fn cycle_until(
    engine: &Engine,
    task: usize,
    measure_from: Instant,
    end: Instant,
    count: &AtomicU64,
) -> anyhow::Result<Samples> {
    let key = key_of(task);
    let mut samples = Samples::default();
    let release = redis::Script::new(RAW_RELEASE);
    let lock = match engine {
        Engine::Floor(conn) | Engine::Peer(conn) => TaskLock::Floor(conn),
        Engine::Leasehold(client) => TaskLock::Mutex(client.mutex(&key)),
        Engine::QuorumFloor(floor) => TaskLock::QuorumFloor(floor),
        Engine::Quorum(quorum) => TaskLock::Quorum(quorum.mutex(&key)),
        Engine::EtcdFloor(floor) => TaskLock::EtcdFloor(floor),
        Engine::ZkFloor(floor) => TaskLock::ZkFloor(floor),
        Engine::PgFloor(floor) => TaskLock::PgFloor(floor.session(task)),
        Engine::MyFloor(floor) => TaskLock::MyFloor(floor.session(task)),
    };
    let mut n: u64 = 0;
    loop {
        let started = Instant::now();
        if started >= end {
            return Ok(samples);
        }
        match &lock {
            TaskLock::Floor(conn) => {
                let mut conn = (*conn).clone();
                let token = format!("floor:{task}:{n}");
                let granted = floor_acquire(&mut conn, &key, &token).await?;
                let latency = started.elapsed();
                if !granted {
                    bail!("floor key {key} was taken");
                }
                let _: i64 = release
                    .key(&key)
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await?;
                record(&mut samples, started, measure_from, latency, count);
            }
            TaskLock::Mutex(mutex) => {
                let guard = mutex.lock().await?;
                let latency = started.elapsed();
                guard.release().await?;
                record(&mut samples, started, measure_from, latency, count);
            }
            TaskLock::QuorumFloor(floor) => {
                let token = format!("floor:{task}:{n}");
                let granted = floor.acquire(&key, &token).await?;
                let latency = started.elapsed();
                if !granted {
                    bail!("floor key {key} was taken on the quorum");
                }
                floor.release(&key, &token).await?;
                record(&mut samples, started, measure_from, latency, count);
            }
            TaskLock::Quorum(mutex) => {
                let guard = mutex.try_lock().await?;
                let latency = started.elapsed();
                guard.release().await?;
                record(&mut samples, started, measure_from, latency, count);
            }
            TaskLock::EtcdFloor(floor) => {
                let held = floor.lock(&key).await?;
                let latency = started.elapsed();
                floor.unlock(held).await?;
                record(&mut samples, started, measure_from, latency, count);
            }
            TaskLock::ZkFloor(floor) => {
                let node = floor.create(&key).await?;
                let latency = started.elapsed();
                floor.delete(node).await?;
                record(&mut samples, started, measure_from, latency, count);
            }
            TaskLock::PgFloor(session) => {
                session.lock(&key).await?;
                let latency = started.elapsed();
                session.unlock(&key).await?;
                record(&mut samples, started, measure_from, latency, count);
            }
            TaskLock::MyFloor(session) => {
                session.lock(&key).await?;
                let latency = started.elapsed();
                session.unlock(&key).await?;
                record(&mut samples, started, measure_from, latency, count);
            }
        }
        n += 1;
    }
}

/// The floor's acquire: `SET key token NX PX 30000`; whether it was granted.
pub async fn floor_acquire<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    key: &str,
    token: &str,
) -> redis::RedisResult<bool> {
    let granted: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await?;
    Ok(granted.is_some())
}

fn record(
    samples: &mut Samples,
    started: Instant,
    from: Instant,
    latency: Duration,
    count: &AtomicU64,
) {
    if started >= from {
        samples.push(latency);
        count.fetch_add(1, Ordering::Relaxed);
    }
}

/// Redraws the scenario's bar, followed by `note()` (what the scenario can tell while it runs), until `end`; then
/// erases it, for the scenario's result line (see `bench::result_line`).
async fn watch_progress(
    setup: &Setup,
    scenario: &str,
    start: Instant,
    end: Instant,
    note: impl Fn() -> String,
) {
    let mut bar = Bar::new(setup.progress, format!("{scenario:<15}"));
    if !bar.is_shown() {
        tokio::time::sleep_until(end).await;
        return;
    }
    let total = end.duration_since(start).as_millis() as i64;
    loop {
        let now = Instant::now();
        if now >= end {
            bar.clear();
            return;
        }
        let done = now.duration_since(start).as_millis() as i64;
        bar.show(done, total, &note());
        tokio::time::sleep(Duration::from_millis(100).min(end - now)).await;
    }
}

/// `leasehold bench-worker ROLE --store URL --name bench:SCENARIO ARGS…` (on a quorum, one `--store` per node),
/// stdout piped, killed on drop.
fn worker_command(
    setup: &Setup,
    scenario: &str,
    role: Role,
    args: &[String],
) -> anyhow::Result<tokio::process::Command> {
    let exe =
        std::env::current_exe().context("cannot find the leasehold executable to start workers")?;
    let role = match role {
        Role::Contend => "contend",
        Role::FloorContend => "floor-contend",
        Role::PeerContend => "peer-contend",
        Role::Handoff => "handoff",
        Role::Renew => "renew",
        Role::QuorumContend => "quorum-contend",
        Role::EtcdLockContend => "etcd-lock-contend",
        Role::ZkFloorContend => "zk-floor-contend",
        Role::PgFloorContend => "pg-floor-contend",
        Role::MyFloorContend => "my-floor-contend",
    };
    let urls = match &setup.quorum {
        Some(nodes) => nodes.urls.clone(),
        None => vec![setup.url.clone()],
    };
    let mut command = tokio::process::Command::new(exe);
    command.arg("bench-worker").arg(role);
    for url in urls {
        command.arg("--store").arg(url);
    }
    command
        .arg("--name")
        .arg(format!("bench:{scenario}"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    Ok(command)
}

/// Spawns `leasehold bench-worker ROLE` processes and collects their JSON lines. Returns each worker's lines, and
/// the server's CPU time over the measured window (see [`cpu_of`]).
async fn workers(
    setup: &Setup,
    scenario: &'static str,
    role: Role,
    processes: usize,
    extra: &[String],
) -> anyhow::Result<(Vec<Vec<Value>>, (Option<f64>, Option<usize>))> {
    // Processes start and connect during the first second; everyone measures the same wall-clock window.
    let from_ms = unix_ms() + 1000 + setup.warmup.as_millis() as u64;
    let to_ms = from_ms + setup.duration.as_millis() as u64;
    let cpu = server_cpu_window(
        setup,
        Instant::now() + Duration::from_millis(from_ms.saturating_sub(unix_ms())),
        Instant::now() + Duration::from_millis(to_ms.saturating_sub(unix_ms())),
    );
    let mut args = vec![
        "--from-ms".to_owned(),
        from_ms.to_string(),
        "--to-ms".to_owned(),
        to_ms.to_string(),
    ];
    args.extend_from_slice(extra);
    let mut children = Vec::new();
    for _ in 0..processes {
        let mut command = worker_command(setup, scenario, role, &args)?;
        children.push(command.spawn().context("cannot start a bench worker")?);
    }
    let start = Instant::now();
    let end = start + Duration::from_millis(to_ms.saturating_sub(unix_ms()));
    // The workers report only at the end: while they run, the bar can only say how many there are.
    let note = || format!("{processes} worker processes");
    let collect = async {
        let mut all = Vec::new();
        for child in &mut children {
            let stdout = child.stdout.take().context("worker without stdout")?;
            let mut lines = BufReader::new(stdout).lines();
            let mut parsed = Vec::new();
            while let Some(line) = lines.next_line().await? {
                parsed.push(
                    serde_json::from_str::<Value>(&line).context("a worker printed bad JSON")?,
                );
            }
            all.push(parsed);
        }
        anyhow::Ok(all)
    };
    let (_, all) = tokio::join!(watch_progress(setup, scenario, start, end, note), collect);
    let all = all?;
    for child in &mut children {
        let status = child.wait().await?;
        if !status.success() {
            bail!("a bench worker failed ({status})");
        }
    }
    Ok((all, cpu_of(cpu).await))
}

/// The server's CPU time (user + system, all its threads, from `INFO cpu`) between `from` and `to`, measured by a
/// task of its own; on a cluster, the sum over every primary, and how many there are; on a quorum, the sum over every
/// node; on etcd, the sum over the members the URL names (`process_cpu_seconds_total`), on ZooKeeper and PostgreSQL
/// over the server processes on this machine (on PostgreSQL with their children, the backends), and how many there
/// are when more than one; on MySQL the server process's. On a server shared with other clients it counts their work
/// too.
fn server_cpu_window(
    setup: &Setup,
    from: Instant,
    to: Instant,
) -> tokio::task::JoinHandle<anyhow::Result<(f64, Option<usize>)>> {
    let raws = match &setup.quorum {
        Some(nodes) => nodes.raws().to_vec(),
        None => vec![setup.raw.clone()],
    };
    let summed = setup.raw.summed();
    tokio::spawn(async move {
        let mut meters = Vec::new();
        for raw in &raws {
            meters.push(raw.meter().await?);
        }
        tokio::time::sleep_until(from).await;
        let before = servers_cpu_seconds(&mut meters).await?;
        tokio::time::sleep_until(to).await;
        let after = servers_cpu_seconds(&mut meters).await?;
        if before.keys().ne(after.keys()) {
            bail!("the primaries changed while the server CPU was measured");
        }
        let used = after.iter().map(|(node, cpu)| cpu - before[node]).sum();
        Ok((used, summed.then_some(after.len())))
    })
}

/// The CPU time of every worker process over the measured window together, when each reported it.
fn workers_cpu(results: &[Vec<Value>]) -> Option<f64> {
    results
        .iter()
        .map(|lines| last(lines).ok()?["window_cpu_s"].as_f64())
        .sum()
}

/// This process's CPU time (user + system, every thread) between `from` and `to`, read by a task of its own: the
/// client's cost of the scenarios that run in this process.
fn client_cpu_window(from: Instant, to: Instant) -> tokio::task::JoinHandle<anyhow::Result<f64>> {
    tokio::spawn(async move {
        tokio::time::sleep_until(from).await;
        let before = super::worker::cpu_seconds()?;
        tokio::time::sleep_until(to).await;
        Ok(super::worker::cpu_seconds()? - before)
    })
}

/// [`Meter::cpu_seconds`] of every meter's server(s), by meter and node.
async fn servers_cpu_seconds(
    meters: &mut [Meter],
) -> anyhow::Result<BTreeMap<(usize, String), f64>> {
    let mut seconds = BTreeMap::new();
    for (i, meter) in meters.iter_mut().enumerate() {
        for (node, cpu) in meter.cpu_seconds().await? {
            seconds.insert((i, node), cpu);
        }
    }
    Ok(seconds)
}

/// The seconds of [`server_cpu_window`], when it could read them, and on a cluster the number of primaries summed.
async fn cpu_of(
    window: tokio::task::JoinHandle<anyhow::Result<(f64, Option<usize>)>>,
) -> (Option<f64>, Option<usize>) {
    match window.await {
        Ok(Ok((seconds, primaries))) => (Some(seconds), primaries),
        _ => (None, None),
    }
}

fn last(lines: &[Value]) -> anyhow::Result<&Value> {
    lines.last().context("a worker printed nothing")
}

/// `processes` processes looping on ONE lock: leasehold, or (`floor`) spinning on `SET NX PX` (on etcd, waiting in
/// etcd's `Lock` RPC; on ZooKeeper, a bare node waiting for the one ahead; on PostgreSQL, waiting in
/// `pg_advisory_lock`; on MySQL, in `GET_LOCK`); on a quorum setup, leasehold's quorum mutex (`lock()`).
pub async fn contended(
    setup: &Setup,
    scenario: &'static str,
    processes: usize,
    recipe: Recipe,
    kind: &str,
) -> anyhow::Result<Outcome> {
    let role = match (&setup.quorum, recipe) {
        (None, Recipe::Floor) => match setup.raw {
            Raw::Etcd(_) => Role::EtcdLockContend,
            Raw::ZooKeeper(_) => Role::ZkFloorContend,
            Raw::Postgres(_) => Role::PgFloorContend,
            Raw::MySql(_) => Role::MyFloorContend,
            Raw::Single(_) | Raw::Cluster(_) => Role::FloorContend,
        },
        (None, Recipe::Peer) => Role::PeerContend,
        (None, Recipe::Leasehold) => Role::Contend,
        (Some(_), Recipe::Leasehold) if kind == "mutex" => Role::QuorumContend,
        (Some(_), _) => bail!("only leasehold's mutex runs contended on a quorum"),
    };
    let extra = ["--kind".to_owned(), kind.to_owned()];
    let (results, (server_cpu_s, cpu_primaries)) =
        workers(setup, scenario, role, processes, &extra).await?;
    let mut samples = Samples::default();
    let mut writes = Samples::default();
    let mut per_process = Vec::new();
    for lines in &results {
        let result = last(lines)?;
        let taken: Vec<u64> = serde_json::from_value(result["samples_ns"].clone())?;
        per_process.push(taken.len() as u64);
        samples.0.extend(taken);
        if let Some(w) = result.get("write_samples_ns") {
            writes
                .0
                .extend(serde_json::from_value::<Vec<u64>>(w.clone())?);
        }
    }
    let writes = writes.sorted();
    let client_cpu_s = workers_cpu(&results);
    Ok(Outcome {
        scenario,
        processes,
        tasks: processes,
        elapsed: setup.duration,
        acquisitions: samples.len() as u64,
        samples: samples.sorted(),
        per_process,
        floor_rate: None,
        peer_rate: None,
        rtt_p50_us: None,
        renewal: None,
        server_cpu_s,
        cpu_primaries,
        client_cpu_s,
        write_p99_us: (writes.len() > 0).then(|| writes.quantile_us(0.99)),
        spread: None,
        on_quorum: None,
        node_rtts: None,
        store: Store::Redis,
    })
}

/// Two processes taking turns: the time from one's release to the other's grant. Also measures the raw round
/// trip (PING, on a cluster to the lock's node) in this process for comparison.
pub async fn handoff(setup: &Setup, scenario: &'static str, kind: &str) -> anyhow::Result<Outcome> {
    let rtt_p50_us = round_trip_p50(setup, &format!("bench:{scenario}")).await?;
    let extra = ["--kind".to_owned(), kind.to_owned()];
    let (results, (server_cpu_s, cpu_primaries)) =
        workers(setup, scenario, Role::Handoff, 2, &extra).await?;
    // (acquired, released, worker) for every turn, in time order.
    let mut turns: Vec<(u64, u64, usize)> = Vec::new();
    for (worker, lines) in results.iter().enumerate() {
        let list: Vec<[u64; 2]> = serde_json::from_value(last(lines)?["turns"].clone())?;
        turns.extend(list.into_iter().map(|[a, r]| (a, r, worker)));
    }
    turns.sort_unstable();
    let mut samples = Samples::default();
    for pair in turns.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        // Only a grant to the *other* worker is a hand-off.
        if prev.2 != next.2 && next.0 >= prev.1 {
            samples.0.push(next.0 - prev.1);
        }
    }
    let client_cpu_s = workers_cpu(&results);
    Ok(Outcome {
        scenario,
        processes: 2,
        tasks: 2,
        elapsed: setup.duration,
        acquisitions: samples.len() as u64,
        samples: samples.sorted(),
        per_process: Vec::new(),
        floor_rate: None,
        peer_rate: None,
        rtt_p50_us: Some(rtt_p50_us),
        renewal: None,
        server_cpu_s,
        cpu_primaries,
        client_cpu_s,
        write_p99_us: None,
        spread: None,
        on_quorum: None,
        node_rtts: None,
        store: Store::Redis,
    })
}

/// The p50 of one raw round trip (`PING`) on the connection type leasehold uses, in µs; on a cluster, to the
/// primary of the lock `name`; on etcd, a linearizable read of one key; on ZooKeeper, a read of the root's `Stat`; on
/// PostgreSQL, `SELECT 1`; on MySQL, `COM_PING`.
async fn round_trip_p50(setup: &Setup, name: &str) -> anyhow::Result<f64> {
    let mut samples = Samples::default();
    let end = Instant::now() + (setup.duration / 5).max(Duration::from_millis(200));
    if let Some(etcd) = setup.raw.etcd() {
        let mut client = etcd.client().await?;
        while Instant::now() < end {
            let started = Instant::now();
            Etcd::round_trip(&mut client).await?;
            samples.push(started.elapsed());
        }
        return Ok(samples.sorted().quantile_us(0.5));
    }
    if let Some(zk) = setup.raw.zookeeper() {
        let client = zk.client().await?;
        while Instant::now() < end {
            let started = Instant::now();
            Zk::round_trip(&client).await?;
            samples.push(started.elapsed());
        }
        return Ok(samples.sorted().quantile_us(0.5));
    }
    if let Some(pg) = setup.raw.postgres() {
        let client = pg.connect().await?;
        while Instant::now() < end {
            let started = Instant::now();
            Pg::round_trip(&client).await?;
            samples.push(started.elapsed());
        }
        return Ok(samples.sorted().quantile_us(0.5));
    }
    if let Some(mysql) = setup.raw.mysql() {
        let mut conn = mysql.connect().await?;
        while Instant::now() < end {
            let started = Instant::now();
            MySql::round_trip(&mut conn).await?;
            samples.push(started.elapsed());
        }
        return Ok(samples.sorted().quantile_us(0.5));
    }
    let mut conn = setup.raw.manager().await?;
    while Instant::now() < end {
        let started = Instant::now();
        conn.ping(name).await?;
        samples.push(started.elapsed());
    }
    Ok(samples.sorted().quantile_us(0.5))
}

/// One process holds 10,000 locks through three renewal periods of a short lease; renewal calls are counted on
/// the server (on a cluster, summed over the primaries; on etcd, the keep-alives of the session all the locks follow;
/// on ZooKeeper, every request the servers received: the session's `sync`s and pings; on PostgreSQL, the transactions
/// of every database; on MySQL, the statements the server received, `Questions`).
pub async fn renew(setup: &Setup, scenario: &'static str) -> anyhow::Result<Outcome> {
    const LOCKS: usize = 10_000;
    const PERIODS: u32 = 3;
    let period = Duration::from_secs(1);
    // On ZooKeeper each grant sets a watch on its node in a task of its own, and the last of those 10,000 requests
    // may reach the server after the worker holds its locks; on PostgreSQL a backend reports its transactions up to a
    // second after it ran them, and the last grants' would count as renewals: one period passes before the count
    // starts (the worker's own CPU time, read over its whole hold, then covers that period too).
    let settle = if setup.raw.zookeeper().is_some() || setup.raw.postgres().is_some() {
        1
    } else {
        0
    };
    let mut stats = setup.raw.meter().await?;
    let args = [
        "--locks".to_owned(),
        LOCKS.to_string(),
        "--ttl-ms".to_owned(),
        (period.as_millis() * 3).to_string(),
        "--renew-ms".to_owned(),
        period.as_millis().to_string(),
        "--periods".to_owned(),
        (PERIODS + settle).to_string(),
    ];
    let mut child = worker_command(setup, scenario, Role::Renew, &args)?
        .spawn()
        .context("cannot start a bench worker")?;
    let stdout = child.stdout.take().context("worker without stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let start = Instant::now();
    let ready: Value = match lines.next_line().await? {
        Some(line) => serde_json::from_str(&line)?,
        None => bail!("the renew worker stopped before holding its locks"),
    };
    tokio::time::sleep(period * settle).await;
    let before = stats.renewal_calls().await?;
    let holding = Instant::now();
    let hold_end = holding + period * PERIODS + period / 4;
    let cpu = server_cpu_window(setup, holding, holding + period * PERIODS);
    // Renewal calls are counted on the server at the end; while they run, the bar says which period it is in.
    let note = || {
        let periods = holding.elapsed().as_millis() / period.as_millis();
        let current = (periods + 1).min(u128::from(PERIODS));
        format!("{LOCKS} locks held, renewal period {current} of {PERIODS}")
    };
    let (_, result) = tokio::join!(
        watch_progress(setup, scenario, start, hold_end, note),
        lines.next_line()
    );
    let result: Value = match result? {
        Some(line) => serde_json::from_str(&line)?,
        None => bail!("the renew worker stopped while holding its locks"),
    };
    let after = stats.renewal_calls().await?;
    let (server_cpu_s, cpu_primaries) = cpu_of(cpu).await;
    let status = child.wait().await?;
    if !status.success() {
        bail!("the renew worker failed ({status})");
    }
    let acquire_s = ready["acquire_s"].as_f64().unwrap_or(f64::NAN);
    Ok(Outcome {
        scenario,
        processes: 1,
        tasks: 1,
        elapsed: Duration::from_secs_f64(acquire_s.max(1e-9)),
        acquisitions: LOCKS as u64,
        samples: Samples::default(),
        per_process: Vec::new(),
        floor_rate: None,
        peer_rate: None,
        rtt_p50_us: None,
        renewal: Some(Renewal {
            locks: LOCKS,
            all_held: result["all_held"].as_bool().unwrap_or(false),
            periods: PERIODS,
            calls_per_period: after.saturating_sub(before) as f64 / f64::from(PERIODS),
            requests_per_period: result["cluster_requests"]
                .as_f64()
                .map(|requests| requests / f64::from(PERIODS)),
            cpu_seconds: result["cpu_s"].as_f64().unwrap_or(f64::NAN),
            bytes_per_lock: result["bytes_per_lock"].as_f64().unwrap_or(f64::NAN),
        }),
        server_cpu_s,
        cpu_primaries,
        client_cpu_s: None,
        write_p99_us: None,
        spread: None,
        on_quorum: None,
        node_rtts: None,
        store: Store::Redis,
    })
}
