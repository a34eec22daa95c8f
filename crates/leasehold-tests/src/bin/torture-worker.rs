//! A worker of the torture test (`tests/torture/`): one real OS process that loops lock → critical section → release
//! on one lock, through its own fault proxy (on a quorum: through each node's proxy), and logs everything it observes
//! on the machine's monotonic clock (shared by all processes), one line per event, flushed at once so that a killed
//! worker's history survives.
//!
//! ```text
//! torture-worker run LOCK_URL STORE_URL NAME WORKER TTL_MS SEED LOG KIND  # the loop, until killed
//! torture-worker observe LOCK_URL NAME TTL_MS LOG                         # an election's observer, until killed
//! torture-worker queue-and-die LOCK_URL NAME KIND                         # start waiting, then vanish
//! ```
//!
//! On a cluster (`LOCK_URL` is `redis+cluster://…`) the worker also holds locks in other slots (see
//! [`hold_side_locks`]), so that its own lock's renewals travel in per-node pipelines.
//!
//! On etcd (`LOCK_URL` is `etcd://…`, one proxy per member), on ZooKeeper (`zk://…`, one proxy per server) and on
//! the SQL stores (`postgres://…`, `mysql://…`, through one proxy), the stores with sessions, `TTL_MS` is the client's
//! session TTL (on etcd whole seconds, at least 2 s; on ZooKeeper the session timeout it asks for; on SQL at least
//! 1 s), which every grant lives under; extensions, which none of them has, are left out, and the reentrant kind's
//! nested hold is an in-process re-entry ([`leasehold::ReentrantGuard::reenter`]) instead of `lock_as`, which none of
//! them has either. A semaphore grant is one permit on every store.
//!
//! `KIND` is the lock kind: `mutex`, `fair`, `semaphore:N` (one permit per grant), `rw` (a write in three grants,
//! reads otherwise), `reentrant` (a nested hold taken with the grant's token in three sections in ten), `multi` (a
//! [`leasehold::MultiLock`] of the mutexes NAME and NAME-also, added in a random order; the log speaks of the set as
//! one grant with NAME's fence and token, held while both are, lost when the first is, and the section sets an
//! occupancy marker for each), `quorum`
//! (the mutex on a [`leasehold::Quorum`]: `LOCK_URL` is then the nodes' URLs, comma-separated), or `quorum-rw` (the
//! read-write lock on a quorum, a write in three grants).
//!
//! Log lines (`T` is `CLOCK_MONOTONIC` in ns, read *before* the step it stamps):
//!
//! ```text
//! want T                      about to wait for the lock
//! grant T FENCE MODE TOKEN    lock() returned a grant: x (exclusive), w (write), r (read), s (a permit); TOKEN is
//!                             the owner token the lock's keys hold (so that data loss can be matched to grants)
//! held T FENCE                is_held() was true (T read before the call); written at most every 2 ms, and last
//!                             right before the release is sent
//! lost T FENCE REASON         the loss signal resolved
//! write T FENCE 0|1           the fenced write to the store was refused (0) or accepted (1)
//! occupied T FENCE            the store's occupancy marker was set by another worker (a visible overlap)
//! released T FENCE OUTCOME    release() returned: ok, lost, notowner, or err
//! error T WHAT                anything else that failed (Redis down, timeouts): the worker retries
//! term T FENCE NUMBER         (election) the term's number, right after its grant line
//! ```
//!
//! The observer logs `observed T leader FENCE NUMBER|-`, `observed T vacant` and `observed T missed N|?` for each
//! change it is told, in order.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_tests::XorShift as Rng;

/// The store's fenced write: refuses a fence lower than the highest accepted.
const FENCED_WRITE: &str = r"
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
";

/// Clears the occupancy marker only if it is ours.
const LEAVE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

fn now_ns() -> u64 {
    leasehold_tests::monotonic_ns()
}

#[derive(Clone)]
struct Log(Arc<Mutex<File>>);

impl Log {
    /// The log at `path`, appended to; `None` (said on stderr) when it cannot be opened.
    fn open(path: &str) -> Option<Log> {
        match OpenOptions::new().create(true).append(true).open(path) {
            Ok(file) => Some(Log(Arc::new(Mutex::new(file)))),
            Err(e) => {
                eprintln!("torture-worker: {path}: {e}");
                None
            }
        }
    }

    fn line(&self, text: std::fmt::Arguments<'_>) {
        let mut file = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(file, "{text}");
    }
}

type BoxResult<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["run", lock_url, store_url, name, worker, ttl_ms, seed, log, kind] => {
            let (Ok(ttl_ms), Ok(seed), Some(kind)) = (
                ttl_ms.parse::<u64>(),
                seed.parse::<u64>(),
                Kind::parse(kind),
            ) else {
                return usage();
            };
            let Some(log) = Log::open(log) else {
                return ExitCode::FAILURE;
            };
            let worker = worker.to_string();
            runtime.block_on(run(
                lock_url, store_url, name, worker, ttl_ms, seed, log, kind,
            ))
        }
        ["observe", lock_url, name, ttl_ms, log] => {
            let Ok(ttl_ms) = ttl_ms.parse::<u64>() else {
                return usage();
            };
            let Some(log) = Log::open(log) else {
                return ExitCode::FAILURE;
            };
            runtime.block_on(observe(lock_url, name, ttl_ms, log))
        }
        ["queue-and-die", lock_url, name, kind] => match Kind::parse(kind) {
            Some(kind) => runtime.block_on(queue_and_die(lock_url, name, kind)),
            None => return usage(),
        },
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("torture-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: torture-worker run LOCK_URL STORE_URL NAME WORKER TTL_MS SEED LOG KIND | observe LOCK_URL NAME TTL_MS LOG \
         | queue-and-die LOCK_URL NAME KIND"
    );
    ExitCode::from(2)
}

/// The lock kind a worker loops on.
#[derive(Clone, Copy)]
enum Kind {
    Mutex,
    Fair,
    Semaphore(u64),
    Rw,
    Reentrant,
    /// The mutex on a quorum of independent nodes.
    Quorum,
    /// The read-write lock on a quorum (a write in three grants, reads otherwise).
    QuorumRw,
    /// A set of two mutexes (NAME, NAME-also) taken as one.
    Multi,
    /// A campaign in the election NAME, publishing the worker's name; the section proclaims a new value sometimes.
    Election,
}

/// What a worker takes its locks from: one client (a server, a cluster), or a quorum of independent nodes.
enum Locks {
    One(leasehold::Client),
    Quorum(leasehold::Quorum),
}

/// One grant, of either.
enum Held {
    One(leasehold::Guard),
    Quorum(leasehold::QuorumGuard),
    /// A reentrant grant on a store with sessions, kept whole so that the section can re-enter it in this process.
    Reentrant(leasehold::ReentrantGuard),
    /// A set (`multi`).
    Set(leasehold::MultiGuard),
    /// A term of an election (`election`).
    Term(leasehold::Leadership),
}

/// What the worker logs of a grant: the fence, token and lease of its first lock; held while every lock of it is,
/// lost when the first of them is.
#[derive(Clone)]
struct View(Vec<leasehold::Lease>);

impl View {
    fn fence(&self) -> leasehold::Fence {
        self.0[0].fence()
    }

    fn token(&self) -> &str {
        self.0[0].token()
    }

    fn ttl(&self) -> Duration {
        self.0[0].ttl()
    }

    fn is_held(&self) -> bool {
        self.0.iter().all(leasehold::Lease::is_held)
    }

    async fn lost(&self) -> leasehold::LossReason {
        futures_util::future::select_all(self.0.iter().map(|lease| Box::pin(lease.lost())))
            .await
            .0
    }
}

impl Held {
    /// The grant's view (fence, token, deadline, loss signal); for a set, NAME's lease first.
    fn view(&self, name: &str) -> View {
        match self {
            Held::One(guard) => View(vec![guard.lease()]),
            Held::Quorum(guard) => View(vec![leasehold::Lease::clone(guard)]),
            Held::Reentrant(guard) => View(vec![guard.lease()]),
            Held::Set(set) => {
                let mut leases = set.leases();
                leases.sort_by_key(|lease| lease.name() != name);
                View(leases)
            }
            Held::Term(term) => View(vec![term.lease()]),
        }
    }

    /// Extends the lease to `to`.
    async fn extend(&self, to: Duration) -> Option<Result<(), leasehold::Error>> {
        match self {
            Held::One(guard) => Some(guard.extend(to).await),
            Held::Quorum(guard) => Some(guard.extend(to).await),
            // Only on a store with sessions, which has no extensions.
            Held::Reentrant(_) => None,
            // A set and a term have none of their own.
            Held::Set(_) | Held::Term(_) => None,
        }
    }

    async fn release(self) -> Result<(), leasehold::Error> {
        match self {
            Held::One(guard) => guard.release().await,
            Held::Quorum(guard) => guard.release().await,
            Held::Reentrant(guard) => guard.release().await,
            Held::Set(set) => set.release().await,
            Held::Term(term) => term.resign().await,
        }
    }
}

impl Kind {
    fn parse(text: &str) -> Option<Kind> {
        match text {
            "mutex" => Some(Kind::Mutex),
            "fair" => Some(Kind::Fair),
            "rw" => Some(Kind::Rw),
            "reentrant" => Some(Kind::Reentrant),
            "quorum" => Some(Kind::Quorum),
            "quorum-rw" => Some(Kind::QuorumRw),
            "multi" => Some(Kind::Multi),
            "election" => Some(Kind::Election),
            _ => text
                .strip_prefix("semaphore:")
                .and_then(|n| n.parse().ok())
                .map(Kind::Semaphore),
        }
    }

    /// Waits at most `wait` for a grant of this kind (a write one time in three for `rw`), and says what it holds.
    async fn lock(
        self,
        locks: &Locks,
        name: &str,
        ttl: Duration,
        wait: Duration,
        rng: &mut Rng,
    ) -> (Result<Held, leasehold::Error>, char) {
        let locks = match (self, locks) {
            (Kind::Quorum, Locks::Quorum(quorum)) => {
                let grant = quorum.mutex(name).ttl(ttl).lock_timeout(wait).await;
                return (grant.map(Held::Quorum), 'x');
            }
            (Kind::QuorumRw, Locks::Quorum(quorum)) => {
                let rw = quorum.rw_lock(name).ttl(ttl);
                let (grant, mode) = if rng.chance(33) {
                    (rw.write_timeout(wait).await, 'w')
                } else {
                    (rw.read_timeout(wait).await, 'r')
                };
                return (grant.map(Held::Quorum), mode);
            }
            (Kind::Quorum | Kind::QuorumRw, Locks::One(_)) | (_, Locks::Quorum(_)) => {
                unreachable!("connect() opens a quorum exactly for the quorum kind")
            }
            (_, Locks::One(locks)) => locks,
        };
        let (grant, mode) = match self {
            Kind::Mutex => (locks.mutex(name).ttl(ttl).lock_timeout(wait).await, 'x'),
            Kind::Fair => (
                locks.fair_mutex(name).ttl(ttl).lock_timeout(wait).await,
                'x',
            ),
            Kind::Semaphore(n) => (
                locks
                    .semaphore(name, n)
                    .ttl(ttl)
                    .acquire_timeout(wait)
                    .await,
                's',
            ),
            Kind::Rw if rng.chance(33) => (
                locks
                    .rw_lock(name)
                    .ttl(ttl)
                    .write_timeout(wait)
                    .await
                    .map(leasehold::WriteGuard::into_guard),
                'w',
            ),
            Kind::Rw => (locks.rw_lock(name).ttl(ttl).read_timeout(wait).await, 'r'),
            Kind::Election => {
                let term = locks
                    .election(name)
                    .ttl(ttl)
                    .campaign_timeout(format!("worker {}", std::process::id()), wait)
                    .await;
                return (term.map(Held::Term), 'x');
            }
            Kind::Multi => {
                let also = format!("{name}-also");
                let set = locks.multi_lock().ttl(ttl);
                // Added in either order: the set takes them in name order whatever it was given.
                let set = if rng.chance(50) {
                    set.mutex(name).mutex(&also)
                } else {
                    set.mutex(&also).mutex(name)
                };
                return (set.lock_timeout(wait).await.map(Held::Set), 'x');
            }
            Kind::Reentrant => {
                let root = locks
                    .reentrant_mutex(name)
                    .ttl(ttl)
                    .lock_timeout(wait)
                    .await;
                if has_sessions(locks) {
                    return (root.map(Held::Reentrant), 'x');
                }
                // The only level in this process: its plain guard.
                (root.map(|g| g.into_guard().expect("one level")), 'x')
            }
            Kind::Quorum | Kind::QuorumRw => unreachable!("returned above"),
        };
        (grant.map(Held::One), mode)
    }
}

/// Whether the client talks to a store whose grants live under the client's session (etcd, ZooKeeper, PostgreSQL,
/// MySQL).
fn has_sessions(client: &leasehold::Client) -> bool {
    matches!(
        client.store_name(),
        "etcd" | "zookeeper" | "postgres" | "mysql"
    )
}

/// Whether `url` names a store with sessions (etcd, ZooKeeper, PostgreSQL, MySQL).
fn names_sessions(url: &str) -> bool {
    [
        "etcd://",
        "zk://",
        "postgres://",
        "postgresql://",
        "mysql://",
        "mariadb://",
    ]
    .iter()
    .any(|scheme| url.starts_with(scheme))
}

/// Connects, retrying while the path is cut (a respawned worker may start inside a fault). A quorum connects to its
/// nodes lazily, so it starts whatever state they are in. On the stores with sessions `ttl` is the session's TTL.
async fn connect(url: &str, kind: Kind, ttl: Duration, log: &Log) -> Locks {
    let timeout = (ttl / 4).clamp(Duration::from_millis(50), Duration::from_millis(250));
    if let Kind::Quorum | Kind::QuorumRw = kind {
        let quorum = leasehold::Quorum::connect_with(
            url.split(','),
            leasehold::DEFAULT_PREFIX,
            leasehold::DEFAULT_NODE_TIMEOUT.min(timeout),
        )
        .await
        .expect("valid node URLs");
        return Locks::Quorum(quorum);
    }
    loop {
        let builder = leasehold::Client::builder(url).expect("a valid URL");
        let builder = if names_sessions(url) {
            // The per-call deadline follows from the session TTL on the stores with sessions.
            builder.session_ttl(ttl)
        } else {
            builder
                .response_timeout(timeout)
                .connection_timeout(Duration::from_millis(500))
        };
        let attempt = builder.connect().await;
        match attempt {
            Ok(client) => return Locks::One(client),
            Err(e) => {
                log.line(format_args!("error {} connect:{}", now_ns(), one_word(&e)));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Observes the election NAME until killed, at the observer's default interval, logging each change it says.
async fn observe(url: &str, name: &str, ttl_ms: u64, log: Log) -> BoxResult<()> {
    let Locks::One(client) =
        connect(url, Kind::Election, Duration::from_millis(ttl_ms), &log).await
    else {
        unreachable!("an election is not on a quorum")
    };
    let mut observer = client.election(name).observe();
    loop {
        let observed = observer.next().await;
        let t = now_ns();
        match observed {
            Ok(leasehold::Observed::Leader(leader)) => log.line(format_args!(
                "observed {t} leader {} {}",
                leader.fence.map_or(0, leasehold::Fence::get),
                leader.term.map_or("-".to_owned(), |n| n.to_string())
            )),
            Ok(leasehold::Observed::Vacant) => log.line(format_args!("observed {t} vacant")),
            Ok(leasehold::Observed::Missed { terms }) => log.line(format_args!(
                "observed {t} missed {}",
                terms.map_or("?".to_owned(), |n| n.to_string())
            )),
            Ok(other) => log.line(format_args!("error {t} observed:{other:?}")),
            Err(e) => {
                log.line(format_args!("error {t} observe:{}", one_word(&e)));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// On a cluster, how many locks in other slots each worker holds beside the one under test.
const SIDE_LOCKS: u32 = 24;

/// Holds [`SIDE_LOCKS`] locks in other slots beside the worker's own, each taken again whenever it is lost. They are
/// renewed by the same keeper, and taken at times spread over one lease so that every renewal round carries some: the
/// lock under test is then renewed in per-node pipelines with them (one script call per slot), through every fault
/// the scheduler injects. The checker does not look at them.
fn hold_side_locks(client: &leasehold::Client, worker: &str, ttl: Duration) {
    for i in 0..SIDE_LOCKS {
        let client = client.clone();
        let name = format!("side-{worker}-{i}");
        tokio::spawn(async move {
            tokio::time::sleep(ttl * i / SIDE_LOCKS).await; // spread over a lease, not a synchronisation
            loop {
                match client.mutex(&name).ttl(ttl).lock().await {
                    Ok(guard) => {
                        guard.lost().await;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
    }
}

fn one_word(e: &dyn std::fmt::Display) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join("_")
}

#[allow(clippy::too_many_arguments)]
async fn run(
    lock_url: &str,
    store_url: &str,
    name: &str,
    worker: String,
    ttl_ms: u64,
    seed: u64,
    log: Log,
    kind: Kind,
) -> BoxResult<()> {
    let ttl = Duration::from_millis(ttl_ms);
    let mut rng = Rng::new(seed);
    let locks = connect(lock_url, kind, ttl, &log).await;
    // The grants of the stores with sessions live as long as the session: they have no extensions.
    let extends = !matches!(&locks, Locks::One(client) if has_sessions(client));
    if let Locks::One(client) = &locks {
        if lock_url.contains("+cluster://") {
            hold_side_locks(client, &worker, ttl);
        }
    }
    let store_config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(5)));
    let mut store = redis::Client::open(store_url)?
        .get_multiplexed_async_connection_with_config(&store_config)
        .await?;
    let fenced_write = redis::Script::new(FENCED_WRITE);
    let leave = redis::Script::new(LEAVE);
    loop {
        log.line(format_args!("want {}", now_ns()));
        let wait = Duration::from_millis(200 + rng.below(3 * ttl_ms));
        let (result, mode) = kind.lock(&locks, name, ttl, wait, &mut rng).await;
        let mut guard = match result {
            Ok(guard) => guard,
            Err(e) if e.is_timeout() => continue,
            Err(e) => {
                log.line(format_args!("error {} lock:{}", now_ns(), one_word(&e)));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let lease = guard.view(name);
        let fence = lease.fence().get();
        log.line(format_args!(
            "grant {} {fence} {mode} {}",
            now_ns(),
            lease.token()
        ));
        if let Held::Term(term) = &guard {
            log.line(format_args!("term {} {fence} {}", now_ns(), term.term()));
        }
        // The loss signal, logged the moment it resolves.
        let lost = {
            let (lease, log) = (lease.clone(), log.clone());
            tokio::spawn(async move {
                let reason = lease.lost().await;
                log.line(format_args!("lost {} {fence} {reason:?}", now_ns()));
            })
        };
        // Samples is_held() every ~100 µs for the whole grant, including while the release is in flight.
        let sampling = Arc::new(AtomicBool::new(true));
        let last_held = Arc::new(AtomicU64::new(0));
        let sampler = {
            let (lease, log, sampling, last_held) = (
                lease.clone(),
                log.clone(),
                Arc::clone(&sampling),
                Arc::clone(&last_held),
            );
            tokio::spawn(async move {
                let mut written = 0;
                while sampling.load(Ordering::Acquire) {
                    let t = now_ns();
                    if lease.is_held() {
                        last_held.store(t, Ordering::Release);
                        if t >= written + 2_000_000 {
                            log.line(format_args!("held {t} {fence}"));
                            written = t;
                        }
                    }
                    tokio::time::sleep(Duration::from_micros(100)).await;
                }
            })
        };
        let nest = match (&locks, kind) {
            (Locks::One(locks), Kind::Reentrant) if !has_sessions(locks) => {
                Some(locks.reentrant_mutex(name).ttl(ttl))
            }
            _ => None,
        };
        let section = critical_section(
            &mut guard,
            &lease,
            matches!(kind, Kind::Multi),
            nest.as_ref(),
            matches!(mode, 'x' | 'w'),
            extends,
            &mut store,
            &fenced_write,
            &leave,
            &worker,
            &mut rng,
            &log,
        )
        .await;
        if let Err(e) = section {
            log.line(format_args!("error {} store:{}", now_ns(), one_word(&e)));
        }
        // The last sample before the release leaves.
        let t = now_ns();
        if lease.is_held() {
            log.line(format_args!("held {t} {fence}"));
        }
        let outcome = match guard.release().await {
            Ok(()) => "ok",
            Err(leasehold::Error::LeaseLost { .. }) => "lost",
            Err(leasehold::Error::NotOwner { .. }) => "notowner",
            Err(_) => "err",
        };
        sampling.store(false, Ordering::Release);
        let _ = sampler.await;
        let seen = last_held.load(Ordering::Acquire);
        if seen > 0 {
            log.line(format_args!("held {seen} {fence}"));
        }
        log.line(format_args!("released {} {fence} {outcome}", now_ns()));
        lost.abort();
    }
}

/// Occupancy check and fenced write (for an exclusive grant: shared ones overlap by design), a nested hold of a
/// reentrant grant (by token with `nest`, or re-entered in this process on a store with sessions), some work
/// (sometimes longer than the lease, sometimes with an extension that shortens or lengthens it, where the lock has
/// one), then leaving the store as found.
#[allow(clippy::too_many_arguments)]
async fn critical_section(
    guard: &mut Held,
    lease: &View,
    two_markers: bool,
    nest: Option<&leasehold::ReentrantMutex>,
    exclusive: bool,
    extends: bool,
    store: &mut redis::aio::MultiplexedConnection,
    fenced_write: &redis::Script,
    leave: &redis::Script,
    worker: &str,
    rng: &mut Rng,
    log: &Log,
) -> BoxResult<()> {
    let fence = lease.fence().get();
    let ttl_ms = u64::try_from(lease.ttl().as_millis()).unwrap_or(u64::MAX);
    let markers: &[&str] = if two_markers {
        &["torture:occupant", "torture:occupant-also"]
    } else {
        &["torture:occupant"]
    };
    if exclusive {
        for marker in markers {
            let entered: Option<String> = redis::cmd("SET")
                .arg(*marker)
                .arg(worker)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms * 4)
                .query_async(store)
                .await?;
            if entered.is_none() && lease.is_held() {
                log.line(format_args!("occupied {} {fence}", now_ns()));
            }
        }
        let t = now_ns();
        let written: i64 = fenced_write
            .key("torture:record")
            .arg(fence)
            .arg(worker)
            .invoke_async(store)
            .await?;
        log.line(format_args!("write {t} {fence} {written}"));
    }
    // On a store with sessions, a re-entry of the grant in this process, released before the grant (which stays
    // held).
    // An election's leader publishes a new value now and then, which must not cost it the term.
    if let Held::Term(term) = guard {
        if rng.chance(30) {
            if let Err(e) = term.proclaim(format!("{worker} {}", now_ns())).await {
                log.line(format_args!("error {} proclaim:{}", now_ns(), one_word(&e)));
            }
        }
    }
    if let Held::Reentrant(root) = &*guard {
        if rng.chance(30) {
            match root.reenter() {
                Ok(nested) => {
                    tokio::time::sleep(Duration::from_millis(rng.below(ttl_ms / 2))).await;
                    if let Err(e) = nested.release().await {
                        log.line(format_args!(
                            "error {} nested-release:{}",
                            now_ns(),
                            one_word(&e)
                        ));
                    }
                }
                Err(e) => log.line(format_args!("error {} nested:{}", now_ns(), one_word(&e))),
            }
        }
    }
    // A nested hold of the same grant (as another process handed the token would take it), released before the grant.
    if let Some(nest) = nest.filter(|_| rng.chance(30)) {
        match nest.lock_as(lease.token()).await {
            Ok(nested) => {
                tokio::time::sleep(Duration::from_millis(rng.below(ttl_ms / 2))).await;
                if let Err(e) = nested.release().await {
                    log.line(format_args!(
                        "error {} nested-release:{}",
                        now_ns(),
                        one_word(&e)
                    ));
                }
            }
            Err(e) => log.line(format_args!("error {} nested:{}", now_ns(), one_word(&e))),
        }
    }
    // Mostly short sections (many hand-offs), sometimes longer than the lease (the watchdog must keep it).
    let steps = 1 + rng.below(3);
    for _ in 0..steps {
        let work = match rng.below(100) {
            0..=2 => Duration::from_millis(ttl_ms + rng.below(ttl_ms)),
            3..=17 => Duration::from_millis(rng.below(ttl_ms / 2)),
            _ => Duration::from_micros(rng.below(2_000)),
        };
        tokio::time::sleep(work).await;
        if extends && rng.chance(15) && lease.is_held() {
            let to = Duration::from_millis(ttl_ms / 4 + rng.below(ttl_ms * 2));
            if let Some(Err(e)) = guard.extend(to).await {
                log.line(format_args!("error {} extend:{}", now_ns(), one_word(&e)));
            }
        }
        if !lease.is_held() {
            break;
        }
    }
    if exclusive {
        for marker in markers {
            let _: i64 = leave.key(*marker).arg(worker).invoke_async(store).await?;
        }
    }
    Ok(())
}

/// Starts waiting for the lock (joining its queue), then exits without a word: a dead client in the queue. On a
/// quorum, which has no queue, a client that dies in the middle of its rounds: whatever it was granted stays on the
/// nodes until its lease ends.
///
/// On etcd the dead client's waiter key lives under the session of its lock's TTL, the shortest etcd grants (2 s):
/// once the lock reaches it, it holds the lock until that lease runs out, as a crashed holder would. On ZooKeeper its
/// waiter node lives as long as its session, of the same 2 s timeout, the same way, and on the SQL stores its entry
/// as long as its session row, of the same 2 s TTL.
async fn queue_and_die(lock_url: &str, name: &str, kind: Kind) -> BoxResult<()> {
    let locks = match kind {
        Kind::Quorum | Kind::QuorumRw => {
            Locks::Quorum(leasehold::Quorum::connect(lock_url.split(',')).await?)
        }
        _ if names_sessions(lock_url) => Locks::One(
            leasehold::Client::builder(lock_url)?
                .session_ttl(Duration::from_secs(2))
                .connect()
                .await?,
        ),
        _ => Locks::One(leasehold::Client::connect(lock_url).await?),
    };
    let mut rng = Rng::new(u64::from(std::process::id()));
    let wait = Duration::from_secs(30);
    // A lock's TTL is its session's on the stores with sessions, where 2 s is the shortest every one grants.
    let ttl = if names_sessions(lock_url) {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(1)
    };
    let _ = tokio::time::timeout(
        Duration::from_millis(30),
        kind.lock(&locks, name, ttl, wait, &mut rng),
    )
    .await;
    std::process::exit(0)
}
