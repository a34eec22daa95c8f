//! `leasehold bench-worker`: the other processes of `leasehold bench` (internal, hidden). Each prints one JSON line.

use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use serde_json::json;
use tokio::time::Instant;

use crate::connect;

/// What a worker process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Loop acquire + release on one lock, empty critical section.
    Contend,
    /// The contended floor: spin on one key with `SET NX PX` until granted, then the owner-checked delete script
    /// (what most peers do: no queue, no fence, no lease keeping).
    FloorContend,
    /// A peer's contended loop, rslock's: `SET NX PX` on a multiplexed connection; a busy answer is followed by the
    /// owner-checked delete of its own token and a random sleep below [`PEER_RETRY_DELAY`]; then the delete.
    PeerContend,
    /// Take turns with one other worker on one lock, recording release and acquire instants.
    Handoff,
    /// Hold many locks through several renewal periods.
    Renew,
    /// Loop `lock()` + release on one mutex of a quorum (one `--store` per node), empty critical section.
    QuorumContend,
    /// The contended floor on etcd: etcd's own `Lock` RPC (it waits in etcd) under this process's lease, then
    /// `Unlock`.
    EtcdLockContend,
    /// The contended floor on ZooKeeper: a bare ephemeral sequential node that waits for the node ahead of it to go,
    /// then is deleted.
    ZkFloorContend,
    /// The contended floor on PostgreSQL: `pg_advisory_lock` (it waits in the server) on this process's connection,
    /// then `pg_advisory_unlock`.
    PgFloorContend,
    /// The contended floor on MySQL and MariaDB: `GET_LOCK` (it waits in the server) on this process's connection,
    /// then `RELEASE_LOCK`.
    MyFloorContend,
}

/// `leasehold bench-worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The role.
    #[arg(value_enum)]
    pub role: Role,
    /// The store's URL (`redis+cluster://…` for a cluster, `etcd://…` for etcd, `zk://…` for ZooKeeper,
    /// `postgres://…`, `mysql://…`); for quorum-contend, once per node.
    #[arg(long, required = true)]
    pub store: Vec<String>,
    /// The lock (or lock-name prefix) to use.
    #[arg(long, default_value = "bench")]
    pub name: String,
    /// Unix time in ms at which measuring starts (warm-up before it).
    #[arg(long, default_value_t = 0)]
    pub from_ms: u64,
    /// Unix time in ms at which measuring stops.
    #[arg(long, default_value_t = 0)]
    pub to_ms: u64,
    /// Locks to hold (renew).
    #[arg(long, default_value_t = 10_000)]
    pub locks: usize,
    /// Lease in ms (renew).
    #[arg(long, default_value_t = 3000)]
    pub ttl_ms: u64,
    /// Renewal period in ms (renew).
    #[arg(long, default_value_t = 1000)]
    pub renew_ms: u64,
    /// Renewal periods to hold for (renew).
    #[arg(long, default_value_t = 3)]
    pub periods: u32,
    /// The lock kind (contend, handoff): mutex, fair, rw (one write in ten), semaphore:N.
    #[arg(long, default_value = "mutex")]
    pub kind: String,
}

/// A grant of the worker's lock kind; `write` for a write grant of the read-write lock.
async fn take(
    locks: &leasehold::Client,
    kind: &str,
    name: &str,
    n: u64,
) -> anyhow::Result<(leasehold::Guard, bool)> {
    Ok(match kind {
        "mutex" => (locks.mutex(name).lock().await?, false),
        "fair" => (locks.fair_mutex(name).lock().await?, false),
        "rw" if n.is_multiple_of(10) => (locks.rw_lock(name).write().await?.into_guard(), true),
        "rw" => (locks.rw_lock(name).read().await?, false),
        _ => {
            let permits = kind
                .strip_prefix("semaphore:")
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("unknown lock kind {kind:?}"))?;
            (locks.semaphore(name, permits).acquire().await?, false)
        }
    })
}

/// Runs the worker; its result is one JSON line on stdout. The roles that loop over the run's measured window also
/// say how much CPU this process used in it (`window_cpu_s`).
pub async fn worker(args: WorkerArgs) -> anyhow::Result<u8> {
    let window = (args.role != Role::Renew && args.to_ms > args.from_ms)
        .then(|| cpu_window(args.from_ms, args.to_ms));
    let result = match args.role {
        Role::FloorContend => Some(raw_contend(&args, false).await?),
        Role::PeerContend => Some(raw_contend(&args, true).await?),
        Role::QuorumContend => Some(quorum_contend(&args).await?),
        Role::EtcdLockContend => Some(etcd_lock_contend(&args).await?),
        Role::ZkFloorContend => Some(zk_floor_contend(&args).await?),
        Role::PgFloorContend => Some(pg_floor_contend(&args).await?),
        Role::MyFloorContend => Some(my_floor_contend(&args).await?),
        _ => None,
    };
    if let Some(mut result) = result {
        add_window_cpu(&mut result, window).await;
        println!("{result}");
        std::io::stdout().flush()?;
        return Ok(0);
    }
    let url = one_server(&args)?;
    // On the stores with sessions (all but Redis) the renewal period follows the session's, which the locks' own lease cannot change.
    let session = (args.role == Role::Renew && crate::stores::Store::of(url).has_sessions())
        .then(|| Duration::from_millis(args.ttl_ms));
    let locks = connect::client(url, session).await?;
    let result = match args.role {
        Role::FloorContend
        | Role::PeerContend
        | Role::QuorumContend
        | Role::EtcdLockContend
        | Role::ZkFloorContend
        | Role::PgFloorContend
        | Role::MyFloorContend => unreachable!("handled above"),
        Role::Contend => contend(&locks, &args).await?,
        Role::Handoff => handoff(&locks, &args).await?,
        Role::Renew => {
            let (result, held) = renew(&locks, &args).await?;
            println!("{result}");
            std::io::stdout().flush()?;
            // Released once the bench has read the store's count, which ends at that line: on every store but
            // Redis every release is a request of the session. Bounded, as `run` bounds its own.
            drop(held);
            locks.flush_releases(Duration::from_secs(5)).await;
            return Ok(0);
        }
    };
    let mut result = result;
    add_window_cpu(&mut result, window).await;
    println!("{result}");
    std::io::stdout().flush()?;
    Ok(0)
}

/// This process's CPU time between the Unix times `from_ms` and `to_ms`, read by a task of its own.
fn cpu_window(from_ms: u64, to_ms: u64) -> tokio::task::JoinHandle<anyhow::Result<f64>> {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(from_ms.saturating_sub(unix_ms()))).await;
        let before = cpu_seconds()?;
        tokio::time::sleep(Duration::from_millis(to_ms.saturating_sub(unix_ms()))).await;
        Ok(cpu_seconds()? - before)
    })
}

/// Adds the measured window's CPU time to a worker's result, when it was measured.
async fn add_window_cpu(
    result: &mut serde_json::Value,
    window: Option<tokio::task::JoinHandle<anyhow::Result<f64>>>,
) {
    let Some(window) = window else { return };
    if let (Some(object), Ok(Ok(cpu))) = (result.as_object_mut(), window.await) {
        object.insert("window_cpu_s".to_owned(), json!(cpu));
    }
}

/// The one server (or cluster) of every role but quorum-contend.
fn one_server(args: &WorkerArgs) -> anyhow::Result<&str> {
    match &args.store[..] {
        [url] => Ok(url),
        _ => anyhow::bail!("{:?} takes one --store", args.role),
    }
}

/// Milliseconds since the Unix epoch: the one clock all processes of a run share for start and stop.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// CLOCK_MONOTONIC in ns: comparable between processes on one host, unlike `Instant`.
fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        (t.tv_sec() as u64) * 1_000_000_000 + t.tv_nsec() as u64
    })
}

async fn contend(
    locks: &leasehold::Client,
    args: &WorkerArgs,
) -> anyhow::Result<serde_json::Value> {
    let mut samples = Vec::new();
    let mut writes = Vec::new();
    // Each process starts its one-in-ten writes at another point.
    let mut n = u64::from(std::process::id());
    loop {
        let now = unix_ms();
        if now >= args.to_ms {
            break;
        }
        let started = Instant::now();
        let (guard, write) = take(locks, &args.kind, &args.name, n).await?;
        n += 1;
        let latency = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if now >= args.from_ms {
            samples.push(latency);
            if write {
                writes.push(latency);
            }
        }
        guard.release().await?;
    }
    Ok(json!({ "acquisitions": samples.len(), "samples_ns": samples, "write_samples_ns": writes }))
}

/// The retry delay of `peer-8p`: rslock sleeps a random whole number of milliseconds below its retry delay after a
/// busy round. Its default (200 ms) would measure the sleeps; 2 ms is the shortest that still sleeps at all (0 or 1
/// ms), as a user tuning it for throughput would set it.
pub const PEER_RETRY_DELAY: Duration = Duration::from_millis(2);

/// The contended loops of the floor and of the peer on one key, on a multiplexed connection (on a cluster, redis-rs's
/// cluster connection to the key's node). The floor retries a busy answer at once (the best a polling client can do
/// for throughput); the peer, as rslock does, deletes its own token and sleeps a random while below
/// [`PEER_RETRY_DELAY`] first.
async fn raw_contend(args: &WorkerArgs, peer: bool) -> anyhow::Result<serde_json::Value> {
    let mut conn = super::raw::Raw::open(one_server(args)?)?
        .multiplexed()
        .await?;
    let release = leasehold::redis::Script::new(super::scenario::RAW_RELEASE);
    // A small xorshift for the peer's sleeps, seeded per process: the delays only need to differ between processes.
    let mut state = u64::from(std::process::id()) ^ unix_ms().rotate_left(17) | 1;
    let mut random_below = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n.max(1)
    };
    let delay_ms = u64::try_from(PEER_RETRY_DELAY.as_millis()).unwrap_or(1);
    let recipe = if peer { "peer" } else { "floor" };
    let mut samples = Vec::new();
    let mut n: u64 = 0;
    loop {
        let now = unix_ms();
        if now >= args.to_ms {
            break;
        }
        let token = format!("{recipe}:{}:{n}", std::process::id());
        n += 1;
        let started = Instant::now();
        while !super::scenario::floor_acquire(&mut conn, &args.name, &token).await? {
            if unix_ms() >= args.to_ms {
                return Ok(json!({ "acquisitions": samples.len(), "samples_ns": samples }));
            }
            if peer {
                let _: i64 = release
                    .key(&args.name)
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await?;
                tokio::time::sleep(Duration::from_millis(random_below(delay_ms))).await;
            }
        }
        let latency = started.elapsed();
        if now >= args.from_ms {
            samples.push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
        }
        let _: i64 = release
            .key(&args.name)
            .arg(&token)
            .invoke_async(&mut conn)
            .await?;
    }
    Ok(json!({ "acquisitions": samples.len(), "samples_ns": samples }))
}

async fn quorum_contend(args: &WorkerArgs) -> anyhow::Result<serde_json::Value> {
    let quorum = leasehold::Quorum::connect(&args.store).await?;
    let mutex = quorum.mutex(&args.name);
    let to = Instant::now() + Duration::from_millis(args.to_ms.saturating_sub(unix_ms()));
    let mut samples = Vec::new();
    loop {
        let now = unix_ms();
        if now >= args.to_ms {
            break;
        }
        let started = Instant::now();
        // A waiter retries only every 0.5–1.5 s (by default), so the wait is cut at the end of the window rather than
        // keeping the scenario past it; a dropped round is undone on every node.
        let Ok(guard) = tokio::time::timeout_at(to, mutex.lock()).await else {
            break;
        };
        let guard = guard?;
        let latency = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if now >= args.from_ms {
            samples.push(latency);
        }
        guard.release().await?;
    }
    Ok(json!({ "acquisitions": samples.len(), "samples_ns": samples }))
}

/// [`Role::EtcdLockContend`]: waits in etcd's `Lock` RPC (cut at the end of the window, a late grant left to the
/// lease) and unlocks at once.
async fn etcd_lock_contend(args: &WorkerArgs) -> anyhow::Result<serde_json::Value> {
    let etcd = super::etcd::Etcd::parse(one_server(args)?)
        .context("etcd-lock-contend needs an etcd:// URL")?;
    let floor = etcd.floor().await?;
    floor_contend(
        args,
        async || floor.lock(&args.name).await,
        async |held| floor.unlock(held).await,
    )
    .await
}

/// [`Role::ZkFloorContend`]: a bare node waiting for the one ahead (cut at the end of the window, a late grant left to
/// the session), deleted at once.
async fn zk_floor_contend(args: &WorkerArgs) -> anyhow::Result<serde_json::Value> {
    let zk = super::zookeeper::Zk::parse(one_server(args)?)
        .context("zk-floor-contend needs a zk:// URL")?;
    let floor = zk.floor().await?;
    floor_contend(
        args,
        async || floor.lock(&args.name).await,
        async |node| floor.delete(node).await,
    )
    .await
}

/// [`Role::PgFloorContend`]: waits in `pg_advisory_lock` (cut at the end of the window: the process then ends, and
/// its connection with it) and unlocks at once.
async fn pg_floor_contend(args: &WorkerArgs) -> anyhow::Result<serde_json::Value> {
    let pg = super::postgres::Pg::parse(one_server(args)?)?
        .context("pg-floor-contend needs a postgres:// URL")?;
    let session = pg.session().await?;
    floor_contend(
        args,
        async || session.lock(&args.name).await,
        async |()| session.unlock(&args.name).await,
    )
    .await
}

/// [`Role::MyFloorContend`]: waits in `GET_LOCK` (cut at the end of the window, likewise) and releases at once.
async fn my_floor_contend(args: &WorkerArgs) -> anyhow::Result<serde_json::Value> {
    let mysql = super::mysql::MySql::parse(one_server(args)?)?
        .context("my-floor-contend needs a mysql:// or mariadb:// URL")?;
    let session = mysql.session().await?;
    floor_contend(
        args,
        async || session.lock(&args.name).await,
        async |()| session.unlock(&args.name).await,
    )
    .await
}

/// The contended loop of a store's own floor: `lock` (which waits in the store while another process holds the
/// name) and `unlock` of what it returned, until the end of the window. A wait still running then is cut: the
/// process ends, and what it was waiting for is left to the store (the lease, the session, the connection).
async fn floor_contend<H>(
    args: &WorkerArgs,
    lock: impl AsyncFn() -> anyhow::Result<H>,
    unlock: impl AsyncFn(H) -> anyhow::Result<()>,
) -> anyhow::Result<serde_json::Value> {
    let to = Instant::now() + Duration::from_millis(args.to_ms.saturating_sub(unix_ms()));
    let mut samples = Vec::new();
    loop {
        let now = unix_ms();
        if now >= args.to_ms {
            break;
        }
        let started = Instant::now();
        let Ok(held) = tokio::time::timeout_at(to, lock()).await else {
            break;
        };
        let held = held?;
        let latency = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if now >= args.from_ms {
            samples.push(latency);
        }
        unlock(held).await?;
    }
    Ok(json!({ "acquisitions": samples.len(), "samples_ns": samples }))
}

async fn handoff(
    locks: &leasehold::Client,
    args: &WorkerArgs,
) -> anyhow::Result<serde_json::Value> {
    let mut turns = Vec::new();
    loop {
        let now = unix_ms();
        if now >= args.to_ms {
            break;
        }
        let (guard, _) = take(locks, &args.kind, &args.name, 1).await?;
        let acquired = monotonic_ns();
        // Hold until the other worker is queued, so that every release is a hand-off to a waiter.
        let patience = Instant::now() + Duration::from_millis(20);
        while Instant::now() < patience && locks.inspect(&args.name).await?.waiting_clients == 0 {}
        let released = monotonic_ns();
        guard.release().await?;
        if now >= args.from_ms {
            turns.push([acquired, released]);
        }
    }
    Ok(json!({ "turns": turns }))
}

/// Holds the locks through the renewal periods; returns the result line and the guards, still held.
async fn renew(
    locks: &leasehold::Client,
    args: &WorkerArgs,
) -> anyhow::Result<(serde_json::Value, Vec<leasehold::Guard>)> {
    let ttl = Duration::from_millis(args.ttl_ms);
    let every = Duration::from_millis(args.renew_ms);
    // Warm the connection, the scripts and the keeper before the memory baseline.
    locks
        .mutex(&format!("{}:warm", args.name))
        .lock()
        .await?
        .release()
        .await?;
    let rss_before = rss_bytes()?;
    // One create per lock on the session stores, each a write the store commits before it answers: fewer at once.
    let on_sessions = locks.store_name() != "redis";
    let started = Instant::now();
    let mut guards = Vec::with_capacity(args.locks);
    let names: Vec<String> = (0..args.locks)
        .map(|i| format!("{}:{i}", args.name))
        .collect();
    for chunk in names.chunks(if on_sessions { 100 } else { 500 }) {
        let batch = futures_util::future::join_all(chunk.iter().map(|name| {
            let mutex = locks.mutex(name).ttl(ttl).renew_every(every);
            async move { mutex.try_lock().await }
        }))
        .await;
        for guard in batch {
            guards.push(guard.with_context(|| "acquiring the locks to hold")?);
        }
    }
    let acquire_s = started.elapsed().as_secs_f64();
    drop(names);
    let rss_after = rss_bytes()?;
    println!("{}", json!({ "ready": true, "acquire_s": acquire_s }));
    std::io::stdout().flush()?;

    let cpu_before = cpu_seconds()?;
    let requests = || {
        locks
            .cluster_pipelines()
            .map(|(pipelines, _, alone)| pipelines + alone)
    };
    let requests_before = requests();
    tokio::time::sleep(every * args.periods + every / 4).await;
    let cpu = cpu_seconds()? - cpu_before;
    let requests = requests()
        .zip(requests_before)
        .map(|(after, before)| after - before);
    let all_held = guards.iter().all(|g| g.is_held());
    let bytes_per_lock = rss_after.saturating_sub(rss_before) as f64 / args.locks as f64;
    let result = json!({
        "acquire_s": acquire_s,
        "all_held": all_held,
        "cpu_s": cpu,
        "bytes_per_lock": bytes_per_lock,
        "cluster_requests": requests,
    });
    Ok((result, guards))
}

/// Resident memory of this process, from /proc.
fn rss_bytes() -> anyhow::Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("no VmRSS in /proc/self/status")?;
    Ok(kb * 1024)
}

/// User plus system CPU time of this process so far.
pub(super) fn cpu_seconds() -> anyhow::Result<f64> {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)?;
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Ok(secs(usage.user_time()) + secs(usage.system_time()))
}
