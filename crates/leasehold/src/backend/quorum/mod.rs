//! Redlock done right: a mutex held on a majority of independent Redis primaries, with a fence that never goes back.
//!
//! Each node runs small owner-checked scripts: `quorum_acquire.lua` grants on one node and draws that node's fence
//! (`max(counter + 1, server µs)`, as on one server) or takes the round's proposal, `fence_up.lua` raises a counter,
//! `renew.lua` extends (the single-server script), `quorum_release.lua` deletes and announces. What is new is how
//! their answers combine (see DESIGN.md, "Redlock"):
//!
//! - **Acquire**: every node at once, each under the per-node timeout, answered as soon as the outcome is known (the
//!   slower nodes' requests finish in the background). Granted iff a majority granted and validity is left:
//!   `ttl − elapsed − drift`, measured on the lease clock from before the first request left (every node set its
//!   expiry after that instant). Otherwise the round is undone on *every* node (a reply may have been lost) and,
//!   when waiting, retried after a random delay longer than a round.
//! - **Fence**: the round proposes a fence `p` a little ahead of the nodes' clocks; a node takes it with its grant,
//!   in the same step, when `p` is at least its own draw and at most [`PROPOSAL_LEAD`] past its clock. When a
//!   majority took it, `p` is the fence: one round trip. Otherwise `f = max` of the fences the granting nodes drew,
//!   written back (`fence_up.lua`) on each node that still holds the caller's token, never lowering a counter, and
//!   `f` counts only once a majority confirmed the write-back within the validity. Either way a majority's counters
//!   reached the fence while they held the caller's token; two such majorities share a node, which saw the earlier
//!   fence before it granted the later lock: fences increase with the order of the critical sections.
//! - **Renew**: the quorum's keeper (keeper.rs) renews every lease of the quorum in batches, one call per node. The
//!   lease orders each node's replies by that node's clock, as on one server (a node may run them in another order
//!   than they were sent), and its deadline is the one a majority of the nodes supports. Nothing ever re-creates a lapsed key
//!   or deletes one on a failed renewal. Nodes that report the key gone or taken, so many that no majority remains,
//!   end the lease at once.
//! - **Release**: every node, owner-checked, announced on each in the same step; the lease reads released before
//!   the requests leave.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionManagerConfig;
use tokio::time::Instant;

use crate::backend::redis::conn::Conn;
use crate::backend::redis::scripts::{FENCE_UP, QUORUM_ACQUIRE, QUORUM_RELEASE, QUORUM_WITHDRAW};
use crate::engine::info::LockKind;
use crate::engine::keeper::{Keeper, Renews};
use crate::engine::keys::{check_prefix, millis, LockKeys, DEFAULT_PREFIX};
use crate::engine::lease::{Lease, LeaseShared, LossReason, Settled};
use crate::engine::ttl::{check_ttl, drift};
use crate::error::{require_runtime, Error, InvalidArgument};
use crate::fence::{check_description, new_token, Fence};

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::quorum=debug`).
const TARGET: &str = "leasehold::quorum";

/// The default time one node has to answer one request: far below the default lease (30 s), so that a slow node costs
/// a round little of its validity, and above the stalls of a loaded machine, so that a busy node is not taken for a
/// dead one.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(250);
/// How far past a node's own clock a round's proposed fence may be for that node to take it. It bounds how far
/// fences can run ahead of the nodes' clocks, which the restart rule relies on (see DESIGN.md, "Redlock"): a node
/// restarted without its counter, and kept out for longer than this and the longest lease, draws above every fence
/// granted before.
pub const PROPOSAL_LEAD: Duration = Duration::from_secs(1);
/// What a proposed fence adds to the expected clock of the fastest node, µs, besides two rounds: a client stalled
/// this long between choosing a proposal and the nodes running it still gets its fence in one round trip. Fences
/// run ahead of the nodes' clocks by about this much, which costs nothing.
const PROPOSAL_MARGIN_US: i64 = 50_000;
/// The fewest nodes a quorum takes.
pub const MIN_NODES: usize = 3;

/// A lock service made of independent Redis primaries (not replicas of each other, not a cluster): a lock is held when
/// a majority of them hold it. Cheap to clone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), leasehold::Error> {
/// let quorum = leasehold::Quorum::connect([
///     "redis://10.0.0.1:6379",
///     "redis://10.0.0.2:6379",
///     "redis://10.0.0.3:6379",
/// ])
/// .await?;
/// let guard = quorum.mutex("orders:42").try_lock().await?;
/// // ... pass guard.fence() to the store ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Quorum {
    inner: Arc<QuorumInner>,
}

struct QuorumInner {
    nodes: Vec<Conn>,
    /// The nodes' clients, for the subscribers that hear of releases.
    clients: Vec<redis::Client>,
    prefix: String,
    node_timeout: Duration,
    fence_retention: Duration,
    /// Where releases are announced on every node: `P:freed`, the message is the lock key.
    freed_channel: String,
    wakers: Wakers,
    /// How long the last acquire round took, µs: the scale of the delays that keep waiters from colliding.
    round_us: AtomicU64,
    /// Per node, its clock less the local one, µs (`i64::MIN` until it answered): see [`QuorumInner::proposal`].
    offsets: Vec<AtomicI64>,
    /// The largest fence this client saw drawn or granted.
    last_fence: AtomicI64,
    /// The origin of [`QuorumInner::local_us`].
    epoch: std::time::Instant,
    /// Renews every lease of this quorum, in batches per node (keeper.rs).
    keeper: Arc<Keeper>,
}

impl Drop for QuorumInner {
    fn drop(&mut self) {
        self.keeper.close();
    }
}

impl QuorumInner {
    /// How long one request to one node may take in all: the node timeout, which the node's connection applies to
    /// its replies, plus a quarter. The connection's own timeout fires first, so that it counts the silence and opens
    /// a new connection to a node that went quiet (`conn.rs`); this bound covers the lazy connect and the retry.
    fn call_bound(&self) -> Duration {
        self.node_timeout + self.node_timeout / 4
    }

    /// The local monotonic clock, µs.
    fn local_us(&self) -> i64 {
        i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX)
    }

    /// The fence a round proposes: what the fastest node's clock will read when the request runs there (its last
    /// known offset, plus two rounds for the way there and the error of the offset, plus
    /// [`PROPOSAL_MARGIN_US`] for a stall in between), and above
    /// every fence this client saw. A node whose counter or clock is ahead of it, or whose clock is more than
    /// [`PROPOSAL_LEAD`] behind it, does not take it, and the round writes its fence back instead: a good guess
    /// saves a round trip, a bad one costs that round trip, never monotonicity. Before any node answered, the
    /// local wall clock stands in.
    fn proposal(&self) -> i64 {
        let margin = i64::try_from(self.round_us.load(Ordering::Relaxed))
            .unwrap_or(0)
            .saturating_mul(2)
            .saturating_add(PROPOSAL_MARGIN_US);
        let offset = self
            .offsets
            .iter()
            .map(|o| o.load(Ordering::Relaxed))
            .filter(|&o| o != i64::MIN)
            .max();
        let clock = match offset {
            Some(offset) => self.local_us().saturating_add(offset),
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(0)),
        };
        clock
            .saturating_add(margin)
            .max(self.last_fence.load(Ordering::Relaxed).saturating_add(1))
    }
}

/// The local side of event-driven waiting: one subscriber per node (started by the first wait), and a wake-up per
/// lock some local task waits for. A release on the quorum is announced on every node it released on; a message
/// from any node wakes the lock's waiters, which then make a round at once (after a short random delay, so that
/// waiters of several processes do not split the votes in step). A lost message costs at most the poll that waiting
/// keeps anyway (the holder's remaining lease, at most 1 s).
#[derive(Default)]
struct Wakers {
    locks: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Notify>>>,
    started: std::sync::atomic::AtomicBool,
    /// Locks this client released while others listened, and when (see [`Wakers::yield_to_waiters`]).
    yields: std::sync::Mutex<std::collections::HashMap<String, Instant>>,
}

impl Wakers {
    /// The wake-up of the lock at `lock_key`.
    fn of(&self, lock_key: &str) -> Arc<tokio::sync::Notify> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(locks.entry(lock_key.to_owned()).or_default())
    }

    fn wake(&self, lock_key: &str) {
        let locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(notify) = locks.get(lock_key) {
            notify.notify_waiters();
        }
    }

    /// Someone else waits for the lock at `lock_key`, which this client just released: this client's next round on
    /// it waits a little (see [`Wakers::yielding`]), so that a woken waiter can take its turn.
    fn yield_to_waiters(&self, lock_key: &str) {
        let mut yields = self.yields.lock().unwrap_or_else(|e| e.into_inner());
        yields.insert(lock_key.to_owned(), Instant::now());
    }

    /// How long this client should still hold back before its next round on `lock_key`: three rounds after its own
    /// release, while others were listening (a woken waiter needs the announcement, its jitter and its own round).
    fn yielding(&self, lock_key: &str, round: Duration) -> Option<Instant> {
        let mut yields = self.yields.lock().unwrap_or_else(|e| e.into_inner());
        let released = *yields.get(lock_key)?;
        let until = released + round * 3 + Duration::from_micros(500);
        if Instant::now() >= until {
            yields.remove(lock_key);
            return None;
        }
        Some(until)
    }

    fn wake_all(&self) {
        let locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        for notify in locks.values() {
            notify.notify_waiters();
        }
    }
}

/// Starts one subscriber per node, once per quorum. Each holds the quorum weakly and ends with it.
fn start_subscribers(inner: &Arc<QuorumInner>) {
    if inner.wakers.started.swap(true, Ordering::AcqRel) {
        return;
    }
    for client in &inner.clients {
        tokio::spawn(subscribe(Arc::downgrade(inner), client.clone()));
    }
}

/// Listens to one node's release announcements, reconnecting with backoff; after each (re)connect every waiter looks
/// again, since an announcement may have been missed meanwhile.
async fn subscribe(inner: std::sync::Weak<QuorumInner>, client: redis::Client) {
    use futures_util::StreamExt;
    let mut backoff = crate::engine::backoff::Backoff::new();
    loop {
        let Some(this) = inner.upgrade() else { return };
        let channel = this.freed_channel.clone();
        let timeout = this.node_timeout.max(Duration::from_millis(200));
        drop(this);
        let connected = tokio::time::timeout(timeout, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            redis::RedisResult::Ok(pubsub)
        })
        .await;
        if let Ok(Ok(pubsub)) = connected {
            backoff.reset();
            if let Some(this) = inner.upgrade() {
                this.wakers.wake_all();
            }
            let mut messages = pubsub.into_on_message();
            loop {
                // Looks up now and then whether the quorum is still there: a quiet channel must not keep the
                // subscriber (and its connection) alive after the quorum was dropped.
                let message = tokio::time::timeout(Duration::from_secs(1), messages.next()).await;
                let Some(this) = inner.upgrade() else { return };
                match message {
                    Ok(Some(message)) => {
                        if let Ok(lock_key) = message.get_payload::<String>() {
                            this.wakers.wake(&lock_key);
                        }
                    }
                    Ok(None) => break,
                    Err(_) => {}
                }
            }
        }
        tokio::time::sleep(backoff.next()).await;
    }
}

impl std::fmt::Debug for Quorum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quorum")
            .field("nodes", &self.inner.nodes.len())
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl Quorum {
    /// Connects to every node (`redis://` URLs, at least [`MIN_NODES`]; an odd number is best) with the defaults.
    ///
    /// Nodes that cannot be reached now are tried again by every request: a quorum starts as long as the URLs are
    /// valid, and each lock call says how many nodes answered.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a malformed URL or fewer than [`MIN_NODES`] nodes.
    pub async fn connect<I, U>(urls: I) -> Result<Quorum, Error>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        Quorum::connect_with(urls, DEFAULT_PREFIX, DEFAULT_NODE_TIMEOUT).await
    }

    /// [`Quorum::connect`] with a key prefix and a per-node timeout of your choice.
    ///
    /// # Errors
    ///
    /// As [`Quorum::connect`]; also [`Error::InvalidArgument`] for a bad prefix or a zero timeout.
    pub async fn connect_with<I, U>(
        urls: I,
        prefix: &str,
        node_timeout: Duration,
    ) -> Result<Quorum, Error>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        require_runtime()?;
        check_prefix(prefix)?;
        if node_timeout.is_zero() || node_timeout > Duration::from_secs(60) {
            return Err(InvalidArgument::BadDuration {
                what: "node timeout",
                value: node_timeout,
                why: "must be above zero and at most 1 min",
            }
            .into());
        }
        let mut clients: Vec<redis::Client> = Vec::new();
        for url in urls {
            let client = redis::Client::open(url.as_ref())
                .map_err(|e| InvalidArgument::BadUrl(e.to_string()))?;
            clients.push(client);
        }
        if clients.len() < MIN_NODES {
            return Err(InvalidArgument::BadUrl(format!(
                "a quorum needs at least {MIN_NODES} independent nodes, got {}",
                clients.len()
            ))
            .into());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(node_timeout.max(Duration::from_millis(200))))
            .set_response_timeout(Some(node_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let n = clients.len();
        // Connected lazily: a node down now must not keep the quorum from starting.
        let nodes = clients
            .iter()
            .map(|client| Conn::lazy(client.clone(), config.clone()))
            .collect();
        Ok(Quorum {
            inner: Arc::new(QuorumInner {
                nodes,
                clients,
                prefix: prefix.to_owned(),
                node_timeout,
                fence_retention: crate::backend::DEFAULT_FENCE_RETENTION,
                freed_channel: format!("{prefix}:freed"),
                wakers: Wakers::default(),
                round_us: AtomicU64::new(1_000),
                offsets: (0..n).map(|_| AtomicI64::new(i64::MIN)).collect(),
                last_fence: AtomicI64::new(0),
                epoch: std::time::Instant::now(),
                keeper: Arc::new(Keeper::new()),
            }),
        })
    }

    /// How many nodes the quorum has.
    pub fn nodes(&self) -> usize {
        self.inner.nodes.len()
    }

    /// How many nodes make a majority.
    pub fn majority(&self) -> usize {
        self.inner.nodes.len() / 2 + 1
    }

    /// A handle for the mutex called `name` on the quorum (lease 30 s, renewed every 10 s). Cheap; nothing is sent
    /// until it is used.
    pub fn mutex(&self, name: &str) -> QuorumMutex {
        QuorumMutex {
            lock: self.lock(name),
        }
    }

    /// A handle for the read-write lock called `name` on the quorum (lease 30 s, renewed every third of it): any
    /// number of readers, or one writer, each holding a share on a majority. Cheap; nothing is sent until it is used.
    ///
    /// Exclusion follows from quorum intersection as for the mutex: a writer's majority and a reader's share a node,
    /// which never holds a write share beside any other. A waiting writer keeps new readers out (on each node it
    /// asked, until its wait ends, or 3 s after its last round if it vanished), so that a stream of overlapping
    /// readers cannot starve it; of several waiting writers the one that began first wins that place on every node,
    /// so that they do not split the nodes between them. Fences
    /// increase across sections that exclude each other (a write and anything else); two readers that overlap are
    /// not ordered. A lock name is either a mutex or a read-write lock: when more nodes than a majority can spare hold
    /// the other kind, a round fails with [`Error::WrongKind`] naming it.
    pub fn rw_lock(&self, name: &str) -> QuorumRwLock {
        QuorumRwLock {
            lock: self.lock(name),
        }
    }

    fn lock(&self, name: &str) -> QuorumLock {
        QuorumLock {
            quorum: self.clone(),
            keys: LockKeys::new(&self.inner.prefix, name),
            ttl: Duration::from_secs(30),
            description: None,
        }
    }
}

/// A mutex held on a majority of a [`Quorum`]'s nodes.
#[derive(Debug, Clone)]
pub struct QuorumMutex {
    lock: QuorumLock,
}

/// A read-write lock held on a majority of a [`Quorum`]'s nodes: see [`Quorum::rw_lock`].
#[derive(Debug, Clone)]
pub struct QuorumRwLock {
    lock: QuorumLock,
}

/// What a quorum lock's rounds ask each node for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ask {
    /// The mutex: the lock key holds the owner token.
    Mutex,
    /// A read share: the lock key is a set of holds (`set.lua`), this one tagged `r`.
    Read,
    /// The write share: alone in the set of holds, tagged `w`.
    Write,
}

impl Ask {
    /// A new token for one round: a mutex's owner token, or a share's hold (`"<tag> <token>"`).
    fn token(self, description: Option<&str>) -> Result<String, Error> {
        let token = new_token(description)?;
        Ok(match self {
            Ask::Mutex => token,
            Ask::Read => format!("r {token}"),
            Ask::Write => format!("w {token}"),
        })
    }
}

/// The rounds of one lock of a quorum, whatever its kind.
#[derive(Debug, Clone)]
struct QuorumLock {
    quorum: Quorum,
    keys: Result<Arc<LockKeys>, InvalidArgument>,
    ttl: Duration,
    description: Option<Arc<str>>,
}

/// One node's answer to one round's acquire.
enum Vote {
    /// Granted at `run` (the node's time, µs), with the fence the node drew, or the round's proposal when it `took`
    /// that.
    Granted { run: i64, fence: i64, took: bool },
    /// Held by someone else, for this much longer (when the key has an expiry).
    Busy(Option<Duration>),
    /// The key holds something leasehold did not write.
    Foreign,
    /// The key holds a lock of the other kind (a mutex where a read-write lock is asked for, or the reverse).
    OtherKind(LockKind),
    /// No answer in time, or an error.
    Silent,
}

impl QuorumMutex {
    /// The lease of every grant (default 30 s): renewed every third of it while the guard lives.
    pub fn ttl(mut self, ttl: Duration) -> QuorumMutex {
        self.lock.ttl = ttl;
        self
    }

    /// Attaches a short description of the holder to every grant of this handle, as
    /// [`Mutex::describe`](crate::Mutex::describe) does on one server: each node's [`Client::inspect`](crate::Client::inspect) returns it,
    /// and `leasehold status` and `leasehold list` on a quorum print it. Checked by the first operation
    /// ([`InvalidArgument::BadDescription`]).
    pub fn describe(mut self, description: impl Into<String>) -> QuorumMutex {
        self.lock.description = Some(Arc::from(description.into()));
        self
    }

    /// One round: the lock if a majority grants it now.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when enough nodes answered but too few granted; [`Error::NoQuorum`] when too few answered
    /// (nothing is left behind on any node either way); [`Error::InvalidArgument`] for a bad name or lease.
    pub async fn try_lock(&self) -> Result<QuorumGuard, Error> {
        self.lock.try_acquire(Ask::Mutex).await
    }

    /// Rounds until one grants the lock, however long that takes (see [`lock_timeout`](QuorumMutex::lock_timeout)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name or lease; anything but a busy lock or unreachable nodes (which it
    /// waits out) ends the wait with that error.
    pub async fn lock(&self) -> Result<QuorumGuard, Error> {
        self.lock.acquire(Ask::Mutex, FOREVER).await
    }

    /// Rounds until one grants the lock or `timeout` passes, each after a random delay longer than a round (so that
    /// competing clients do not split the votes again), and no longer than the shortest remaining lease a busy node
    /// reported. The call ends on time even when every node is down.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time ran out while the lock was held; [`Error::NoQuorum`] when it ran out while too
    /// few nodes answered; [`Error::InvalidArgument`] as for [`try_lock`](QuorumMutex::try_lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<QuorumGuard, Error> {
        self.lock.acquire(Ask::Mutex, timeout).await
    }
}

impl QuorumRwLock {
    /// The lease of every grant (default 30 s): renewed every third of it while the guard lives.
    pub fn ttl(mut self, ttl: Duration) -> QuorumRwLock {
        self.lock.ttl = ttl;
        self
    }

    /// Attaches a short description of the holder to every share of this handle: see [`QuorumMutex::describe`].
    pub fn describe(mut self, description: impl Into<String>) -> QuorumRwLock {
        self.lock.description = Some(Arc::from(description.into()));
        self
    }

    /// One round for a read share.
    ///
    /// # Errors
    ///
    /// As [`QuorumMutex::try_lock`]: [`Error::Busy`] when a writer holds the lock or waits for it.
    pub async fn try_read(&self) -> Result<QuorumGuard, Error> {
        self.lock.try_acquire(Ask::Read).await
    }

    /// Rounds until a read share is granted (see [`QuorumMutex::lock`]).
    ///
    /// # Errors
    ///
    /// As [`QuorumMutex::lock`].
    pub async fn read(&self) -> Result<QuorumGuard, Error> {
        self.lock.acquire(Ask::Read, FOREVER).await
    }

    /// Rounds until a read share is granted or `timeout` passes (see [`QuorumMutex::lock_timeout`]).
    ///
    /// # Errors
    ///
    /// As [`QuorumMutex::lock_timeout`].
    pub async fn read_timeout(&self, timeout: Duration) -> Result<QuorumGuard, Error> {
        self.lock.acquire(Ask::Read, timeout).await
    }

    /// One round for the write share. A single try does not keep readers out.
    ///
    /// # Errors
    ///
    /// As [`QuorumMutex::try_lock`]: [`Error::Busy`] when anyone holds the lock, or another writer waits.
    pub async fn try_write(&self) -> Result<QuorumGuard, Error> {
        self.lock.try_acquire(Ask::Write).await
    }

    /// Rounds until the write share is granted; meanwhile new readers (and writers that began waiting later) are
    /// kept out (see [`Quorum::rw_lock`]).
    ///
    /// # Errors
    ///
    /// As [`QuorumMutex::lock`].
    pub async fn write(&self) -> Result<QuorumGuard, Error> {
        self.lock.acquire(Ask::Write, FOREVER).await
    }

    /// Rounds until the write share is granted or `timeout` passes.
    ///
    /// # Errors
    ///
    /// As [`QuorumMutex::lock_timeout`].
    pub async fn write_timeout(&self, timeout: Duration) -> Result<QuorumGuard, Error> {
        self.lock.acquire(Ask::Write, timeout).await
    }
}

/// A century: no deadline in practice, and no overflow on the lease clock.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl QuorumLock {
    async fn try_acquire(&self, ask: Ask) -> Result<QuorumGuard, Error> {
        let keys = self.checked()?;
        self.round(&keys, ask, None).await
    }

    /// Rounds until one grants, or `timeout` passes: see [`QuorumMutex::lock_timeout`].
    async fn acquire(&self, ask: Ask, timeout: Duration) -> Result<QuorumGuard, Error> {
        let keys = self.checked()?;
        // A waiting writer's id, the same in every round, sorting by when the wait began: the nodes keep new readers
        // (and younger writers) out while it waits. Withdrawn from every node when the wait ends, however it ends.
        let writer = match ask {
            Ask::Write => {
                let began = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros());
                Some(format!("{began:020}:{}", new_token(None)?))
            }
            Ask::Mutex | Ask::Read => None,
        };
        let _withdraw = writer.as_ref().map(|writer| Withdraw {
            inner: Arc::clone(&self.quorum.inner),
            keys: Arc::clone(&keys),
            writer: writer.clone(),
        });
        let started = Instant::now();
        let deadline = started + timeout;
        // Why the last complete round failed: too few nodes answered (reported as such at the deadline), or the lock
        // was held (a timeout).
        let mut no_quorum = None;
        let inner = &self.quorum.inner;
        start_subscribers(inner);
        let freed = inner.wakers.of(&keys.lock);
        loop {
            // Armed before the round: a release announced while it runs still wakes the wait below.
            let released = freed.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let outcome =
                tokio::time::timeout_at(deadline, self.round(&keys, ask, writer.as_deref())).await;
            let last = Duration::from_micros(inner.round_us.load(Ordering::Relaxed));
            let pause = match outcome {
                Ok(Ok(guard)) => return Ok(guard),
                // Held: until the holder's lease ends (or its release is announced), polling at least every second.
                Ok(Err(Error::Busy {
                    remaining: Some(left),
                    ..
                })) => {
                    no_quorum = None;
                    left.clamp(last, Duration::from_secs(1))
                }
                // A split vote: again within a few rounds, at random, so that the contenders fall out of step.
                Ok(Err(Error::Busy {
                    remaining: None, ..
                })) => {
                    no_quorum = None;
                    Duration::from_micros(random_below(3 * last.as_micros() as u64 + 1)) + last
                }
                // Too few nodes answered: again after a node timeout's worth of rounds.
                Ok(Err(err @ Error::NoQuorum { .. })) => {
                    no_quorum = Some(err);
                    (inner.node_timeout * 2).min(Duration::from_secs(1))
                }
                Ok(Err(err)) => return Err(err),
                // The round was cut at the deadline: whatever it granted is undone by its drop guard.
                Err(_) => Duration::ZERO,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(no_quorum.unwrap_or(Error::Timeout {
                    name: keys.name().to_owned(),
                    waited: started.elapsed(),
                }));
            }
            tokio::select! {
                () = &mut released => {}
                () = tokio::time::sleep_until((now + pause).min(deadline)) => {}
            }
            // A random delay within the last round's length: waiters of several processes woken by one release do not
            // all ask at once (the releaser itself waits longer before it asks again: see `Wakers::yielding`).
            let jitter = Duration::from_micros(random_below(last.as_micros() as u64 + 1));
            tokio::time::sleep_until((Instant::now() + jitter).min(deadline)).await;
        }
    }

    fn checked(&self) -> Result<Arc<LockKeys>, Error> {
        require_runtime()?;
        let keys = self.keys.clone()?;
        check_ttl(self.ttl)?;
        if let Some(description) = &self.description {
            check_description(description)?;
        }
        Ok(keys)
    }

    async fn round(
        &self,
        keys: &Arc<LockKeys>,
        ask: Ask,
        writer: Option<&str>,
    ) -> Result<QuorumGuard, Error> {
        let inner = &self.quorum.inner;
        // Just released it while others waited: let one of them go first (a releaser that asks again at once would win
        // every time, being nearest).
        let last = Duration::from_micros(inner.round_us.load(Ordering::Relaxed));
        if let Some(until) = inner.wakers.yielding(&keys.lock, last) {
            tokio::time::sleep_until(until).await;
        }
        let token = ask.token(self.description.as_deref())?;
        // Undoes this round on every node unless it ends in a guard (also when the caller drops the future).
        let mut undo = UndoRound {
            inner: Arc::clone(inner),
            keys: Arc::clone(keys),
            token: Some(token.clone()),
            round: Round::new(inner.nodes.len(), self.ttl),
        };
        let majority = self.quorum.majority();
        let proposal = inner.proposal();
        let sent = crate::engine::clock::now();
        let valid_until = sent + self.ttl - drift(self.ttl);
        let votes = Votes::collect(
            inner,
            keys,
            (&token, writer),
            self.ttl,
            proposal,
            majority,
            &undo.round,
        )
        .await;
        inner.round_us.store(
            u64::try_from(sent.elapsed().as_micros())
                .unwrap_or(u64::MAX)
                .max(1),
            Ordering::Relaxed,
        );
        if let Some(drawn) = votes.granted.iter().map(|g| g.fence).max() {
            inner.last_fence.fetch_max(drawn, Ordering::Relaxed);
        }
        let took = votes.granted.iter().filter(|g| g.took).count();
        if votes.granted.len() < majority || crate::engine::clock::now() >= valid_until {
            return Err(votes.failure(keys, inner.nodes.len(), majority));
        }
        let fence = if took >= majority {
            // A majority took the proposal with their grants: the fence is written where it must be.
            proposal
        } else {
            // The largest fence any granting node drew (or took), written back on a majority.
            let fence = votes.granted.iter().map(|g| g.fence).max().unwrap_or(0);
            let granted: Vec<usize> = votes.granted.iter().map(|g| g.node).collect();
            if !write_back(inner, keys, &token, fence, &granted, majority).await {
                return Err(Error::Busy {
                    name: keys.name().to_owned(),
                    remaining: None,
                });
            }
            fence
        };
        if crate::engine::clock::now() >= valid_until {
            return Err(Error::Busy {
                name: keys.name().to_owned(),
                remaining: None,
            });
        }
        inner.last_fence.fetch_max(fence, Ordering::Relaxed);
        undo.token = None;
        let fence = Fence::new(u64::try_from(fence).unwrap_or(0));
        // Each granting node's view of the expiry starts at its grant, ordered by its own clock from there on.
        let mut runs = vec![None; inner.nodes.len()];
        for grant in &votes.granted {
            runs[grant.node] = Some(grant.run);
        }
        let shared = LeaseShared::on_nodes(Arc::clone(keys), token, fence, self.ttl, sent, &runs);
        tracing::debug!(target: TARGET,
            lock = %keys.name(),
            fence = fence.get(),
            nodes = votes.granted.len(),
            one_round = took >= majority,
            "quorum granted"
        );
        let weak = Arc::downgrade(inner);
        let renews: std::sync::Weak<dyn Renews> = weak;
        let kept = inner
            .keeper
            .watch(renews, Arc::clone(&shared), sent, self.ttl / 3, false);
        Ok(QuorumGuard {
            lease: Lease { shared },
            inner: Arc::clone(inner),
            kept,
            round: Arc::clone(&undo.round),
            settled: false,
        })
    }
}

/// A node that granted in a round at `run` (its time, µs): the fence it drew, or the round's proposal when it `took`
/// that.
struct Grant {
    node: usize,
    run: i64,
    fence: i64,
    took: bool,
}

/// The answers of one round, gathered only until the outcome is known: a round does not wait for its slowest nodes.
struct Votes {
    granted: Vec<Grant>,
    /// Remaining leases reported by nodes held by someone else.
    busy: Vec<Option<Duration>>,
    /// Nodes whose key holds something else than a lock of this kind.
    foreign: usize,
    /// Of those, the nodes whose key holds a lock of the other kind, and that kind.
    other_kind: (usize, Option<LockKind>),
    answered: usize,
}

impl Votes {
    /// Asks every node at once and gathers answers until a majority granted with the proposal taken, until no
    /// majority can grant any more, or until a majority granted and no majority can take the proposal any more. The
    /// requests still out go on in the background (a node still connecting gets its request too, so that the lock
    /// soon stands on every node that can grant it): a late grant is renewed and released with the others, and one
    /// that lands after the round was undone or the lock released (`round.over`) is released on its node at once.
    /// Each answer read is recorded in `round.heard`.
    async fn collect(
        inner: &Arc<QuorumInner>,
        keys: &Arc<LockKeys>,
        (token, writer): (&str, Option<&str>),
        ttl: Duration,
        proposal: i64,
        majority: usize,
        round: &Arc<Round>,
    ) -> Votes {
        let mut pending: FuturesUnordered<_> = (0..inner.nodes.len())
            .map(|node| {
                let (inner, keys, round) = (Arc::clone(inner), Arc::clone(keys), Arc::clone(round));
                let token = token.to_owned();
                let writer = writer.unwrap_or_default().to_owned();
                let late = tokio::spawn(async move {
                    let vote = vote(&inner, node, &keys, (&token, &writer), ttl, proposal).await;
                    if !matches!(vote, Vote::Silent) {
                        round.heard[node].store(true, Ordering::Release);
                    }
                    if matches!(vote, Vote::Granted { .. }) && round.over.load(Ordering::Acquire) {
                        release_on(&inner, &inner.nodes[node], &keys, &token, Duration::ZERO).await;
                    }
                    vote
                });
                async move { (node, late.await.unwrap_or(Vote::Silent)) }
            })
            .collect();
        let mut votes = Votes {
            granted: Vec::new(),
            busy: Vec::new(),
            foreign: 0,
            other_kind: (0, None),
            answered: 0,
        };
        while let Some((node, vote)) = pending.next().await {
            match vote {
                Vote::Granted { run, fence, took } => {
                    votes.answered += 1;
                    votes.granted.push(Grant {
                        node,
                        run,
                        fence,
                        took,
                    });
                }
                Vote::Busy(left) => {
                    votes.answered += 1;
                    votes.busy.push(left);
                }
                Vote::Foreign => {
                    votes.answered += 1;
                    votes.foreign += 1;
                }
                Vote::OtherKind(kind) => {
                    votes.answered += 1;
                    votes.foreign += 1;
                    votes.other_kind = (votes.other_kind.0 + 1, Some(kind));
                }
                Vote::Silent => {}
            }
            let left = pending.len();
            let took = votes.granted.iter().filter(|g| g.took).count();
            let granted = votes.granted.len();
            if took >= majority
                || granted + left < majority
                || (granted >= majority && took + left < majority)
            {
                break;
            }
        }
        votes
    }

    /// Why a round without a majority's grant failed.
    fn failure(&self, keys: &LockKeys, nodes: usize, majority: usize) -> Error {
        // So many nodes hold something else under the name that no majority can grant it.
        if let (n, Some(found)) = self.other_kind {
            if n > nodes - majority {
                return Error::WrongKind {
                    name: keys.name().to_owned(),
                    found,
                };
            }
        }
        if self.foreign > nodes - majority {
            return Error::NotALock {
                key: keys.lock.clone(),
                detail: "a majority of the quorum's nodes hold something else there: other lock kinds, or data \
                         leasehold did not write"
                    .to_owned(),
            };
        }
        if self.answered < majority {
            return Error::NoQuorum {
                name: keys.name().to_owned(),
                answered: self.answered,
                nodes,
            };
        }
        // Some nodes granted, too few: a split vote between contenders (or a lock just released on some nodes), not a
        // held lock. Said as "no remaining lease", which makes a waiter try again within a few rounds instead of
        // waiting on the leases of the competing rounds, which are undone at once.
        let remaining = if self.granted.is_empty() {
            self.busy.iter().flatten().min().copied()
        } else {
            None
        };
        Error::Busy {
            name: keys.name().to_owned(),
            remaining,
        }
    }
}

/// One node's vote: `quorum_acquire.lua` under the per-node timeout. Its server time, read at about the middle of
/// the request, tells the quorum how far that node's clock is from the local one (see [`QuorumInner::proposal`]).
async fn vote(
    inner: &QuorumInner,
    node: usize,
    keys: &LockKeys,
    (token, writer): (&str, &str),
    ttl: Duration,
    proposal: i64,
) -> Vote {
    let mut invocation = QUORUM_ACQUIRE.key(&keys.lock);
    invocation
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.void())
        .arg(token)
        .arg(millis(ttl))
        .arg(proposal)
        .arg(millis(inner.fence_retention))
        .arg(PROPOSAL_LEAD.as_micros() as u64)
        .arg(writer)
        .arg(millis(crate::backend::redis::scripts::LIVENESS));
    let asked = inner.local_us();
    let reply = tokio::time::timeout(
        inner.call_bound(),
        inner.nodes[node].invoke_idempotent::<Vec<i64>>(&invocation),
    )
    .await;
    let Ok(Ok(reply)) = reply else {
        return Vote::Silent;
    };
    if let Some(&now) = reply.first() {
        let middle = asked + (inner.local_us() - asked) / 2;
        inner.offsets[node].store(now - middle, Ordering::Relaxed);
    }
    match reply.as_slice() {
        [run, 1, fence, _, took] => Vote::Granted {
            run: *run,
            fence: *fence,
            took: *took == 1,
        },
        [_, 0, left, ..] => Vote::Busy(u64::try_from(*left).ok().map(Duration::from_millis)),
        [_, -1, ..] => Vote::Foreign,
        [_, -4, 1, ..] => Vote::OtherKind(LockKind::Mutex),
        [_, -4, ..] => Vote::OtherKind(LockKind::ReadWrite),
        _ => Vote::Silent,
    }
}

/// Writes `fence` back on the `granted` nodes (`fence_up.lua`: only where the node still holds `token`, never
/// lowering a counter); true once a majority confirmed. Stops at the outcome, as a round does.
async fn write_back(
    inner: &QuorumInner,
    keys: &LockKeys,
    token: &str,
    fence: i64,
    granted: &[usize],
    majority: usize,
) -> bool {
    let mut pending: FuturesUnordered<_> = granted
        .iter()
        .map(|&node| async move {
            let mut invocation = FENCE_UP.key(&keys.lock);
            invocation
                .key(keys.fence())
                .arg(token)
                .arg(fence)
                .arg(millis(inner.fence_retention));
            matches!(
                tokio::time::timeout(
                    inner.call_bound(),
                    inner.nodes[node].invoke_idempotent::<i64>(&invocation)
                )
                .await,
                Ok(Ok(1))
            )
        })
        .collect();
    let mut confirmed = 0;
    while let Some(ok) = pending.next().await {
        confirmed += usize::from(ok);
        if confirmed >= majority || confirmed + pending.len() < majority {
            break;
        }
    }
    confirmed >= majority
}

/// Releases `token` on every node, owner-checked, each node announcing the release in the same step (waiters hear it
/// from whichever node reaches them first); how many released it. A node whose vote for `token` was never heard back
/// from voids the token there (see [`Round`]).
async fn release_all(inner: &QuorumInner, keys: &LockKeys, token: &str, round: &Round) -> usize {
    join_all(inner.nodes.iter().enumerate().map(|(i, node)| {
        let void = if round.heard[i].load(Ordering::Acquire) {
            Duration::ZERO
        } else {
            round.void_for
        };
        release_on(inner, node, keys, token, void)
    }))
    .await
    .into_iter()
    .filter(|&released| released)
    .count()
}

/// Releases `token` on one node, owner-checked, announcing the release there; true when that node released it. When
/// the node does not hold it, the token is voided there for `void` (zero: not at all), so that a vote for it that is
/// still on its way is refused when it arrives.
async fn release_on(
    inner: &QuorumInner,
    node: &Conn,
    keys: &LockKeys,
    token: &str,
    void: Duration,
) -> bool {
    let mut invocation = QUORUM_RELEASE.key(&keys.lock);
    invocation
        .key(keys.void())
        .arg(token)
        .arg(&inner.freed_channel)
        .arg(millis(void));
    let reply = tokio::time::timeout(
        inner.call_bound(),
        node.invoke_idempotent::<Vec<i64>>(&invocation),
    )
    .await;
    match reply.as_ref().map(|r| r.as_ref().map(Vec::as_slice)) {
        Ok(Ok([1, listeners])) => {
            // Our own subscriber, when this client ever waited, is one of the listeners.
            let own = i64::from(inner.wakers.started.load(Ordering::Acquire));
            if *listeners > own {
                inner.wakers.yield_to_waiters(&keys.lock);
            }
            true
        }
        _ => false,
    }
}

/// What the parts of one round share after it: whether its token is being released, and which nodes' votes were heard
/// back from.
///
/// A vote that timed out may still run on its node later: from a connection that was replaced in between (its
/// requests can run after the new connection's), or from a flow that stalled and recovers. Releasing the token there
/// before it arrives would leave the node held by nobody for a whole lease, so the release of a token on a node whose
/// vote was not heard back from voids the token there (`quorum_release.lua`), and the vote is refused when it comes.
struct Round {
    /// Set once the round's token is being released (undone, or released by its guard): a grant that lands later is
    /// released by the request that got it.
    over: AtomicBool,
    /// Per node, whether its vote's answer was read.
    heard: Box<[AtomicBool]>,
    /// How long a void lasts: two leases (a vote later than that still grants, and lapses with its lease).
    void_for: Duration,
}

impl Round {
    fn new(nodes: usize, ttl: Duration) -> Arc<Round> {
        Arc::new(Round {
            over: AtomicBool::new(false),
            heard: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
            void_for: ttl.saturating_mul(2),
        })
    }
}

/// A waiting writer's intent, withdrawn from every node in the background when its wait ends (granted, failed, or
/// dropped): readers held back by it need not wait for it to lapse.
struct Withdraw {
    inner: Arc<QuorumInner>,
    keys: Arc<LockKeys>,
    writer: String,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the intents lapse within their 3 s
        };
        let (inner, keys) = (Arc::clone(&self.inner), Arc::clone(&self.keys));
        let writer = std::mem::take(&mut self.writer);
        runtime.spawn(async move {
            join_all(inner.nodes.iter().map(|node| {
                let mut invocation = QUORUM_WITHDRAW.key(keys.queue());
                invocation
                    .key(&keys.lock)
                    .arg(&writer)
                    .arg(&inner.freed_channel);
                let call_bound = inner.call_bound();
                async move {
                    let _ = tokio::time::timeout(
                        call_bound,
                        node.invoke_idempotent::<i64>(&invocation),
                    )
                    .await;
                }
            }))
            .await;
        });
    }
}

/// Undoes a round that did not end in a guard: releases its token on every node, in the background.
struct UndoRound {
    inner: Arc<QuorumInner>,
    keys: Arc<LockKeys>,
    token: Option<String>,
    round: Arc<Round>,
}

impl Drop for UndoRound {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        self.round.over.store(true, Ordering::Release);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the round's grants lapse with their lease
        };
        let inner = Arc::clone(&self.inner);
        let keys = Arc::clone(&self.keys);
        let round = Arc::clone(&self.round);
        runtime.spawn(async move {
            release_all(&inner, &keys, &token, &round).await;
        });
    }
}

impl QuorumInner {
    /// Runs a `renew.lua` call for `leases` leases on every node at once: each node's reply (its time when the call
    /// ran there, and a code per lease), `None` for a node that did not answer in time. What the replies add up to is
    /// the lease's to decide ([`LeaseShared::settle`]): each node's confirmations are ordered by that node's clock,
    /// and the deadline is the one a majority supports. Nothing ever re-creates a lapsed key, or deletes one on a
    /// failed renewal.
    async fn renew_on_nodes(
        &self,
        invocation: &impl crate::backend::redis::conn::Invocation,
        leases: usize,
    ) -> crate::engine::keeper::Renewed {
        let replies: Vec<Option<crate::engine::keeper::NodeReply>> =
            join_all(self.nodes.iter().map(|node| async move {
                match tokio::time::timeout(
                    self.call_bound(),
                    node.invoke_idempotent::<Vec<i64>>(invocation),
                )
                .await
                {
                    Ok(Ok(reply)) if reply.len() == leases + 1 => reply
                        .split_first()
                        .map(|(&run, codes)| (run, codes.to_vec())),
                    _ => None,
                }
            }))
            .await;
        if replies.iter().all(Option::is_none) {
            return Err("no quorum node answered".to_owned());
        }
        Ok(replies)
    }
}

impl Renews for QuorumInner {
    fn by_slot(&self) -> bool {
        false
    }

    /// The batch on every node at once, one call per node (see [`QuorumInner::renew_on_nodes`]).
    fn renew<'a>(
        &'a self,
        leases: &'a [Arc<LeaseShared>],
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = crate::engine::keeper::Renewed> + Send + 'a>,
    > {
        Box::pin(async move {
            let invocation = crate::backend::redis::scripts::renew_invocation(leases);
            self.renew_on_nodes(&invocation, leases.len()).await
        })
    }
}

/// A grant of a [`QuorumMutex`] or a share of a [`QuorumRwLock`]: a [`Lease`] (fence, deadline, loss signal) kept
/// alive on the quorum until it is released or dropped (then released in the background).
pub struct QuorumGuard {
    lease: Lease,
    inner: Arc<QuorumInner>,
    /// The lease's id in the quorum's keeper.
    kept: u64,
    /// The round that granted it: `over` is set before the release (a late grant of the round is then released by
    /// its own request), and the release voids the token where the vote was not heard back from.
    round: Arc<Round>,
    settled: bool,
}

impl std::fmt::Debug for QuorumGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuorumGuard")
            .field("lock", &self.lease.name())
            .field("fence", &self.lease.fence())
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for QuorumGuard {
    type Target = Lease;

    fn deref(&self) -> &Lease {
        &self.lease
    }
}

impl QuorumGuard {
    /// Moves the lease end to `ttl` from now on every node that still holds this grant; it counts once a majority
    /// confirmed. Later renewals go back to the mutex's lease. A lease that already ended cannot be extended back to
    /// life, and a failed extension deletes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the lease already ended locally; [`Error::NotOwner`] when so many nodes report the
    /// key gone or taken that no majority holds it (the lease then ends); [`Error::NoQuorum`] when too few nodes
    /// confirmed either way (the extension may have happened on some: the deadline assumes the worst, at most `ttl`
    /// from the call when that is sooner, until a later renewal is confirmed); [`Error::InvalidArgument`] for a TTL
    /// out of range.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, with the same rule as on one server ([`MutexGuard::extend`](crate::MutexGuard::extend)).
    pub async fn extend(&self, ttl: Duration) -> Result<(), Error> {
        let request = self.lease.begin_extension(ttl)?;
        let shared = &self.lease.shared;
        let mut invocation = crate::backend::redis::scripts::RENEW.key(&shared.keys.lock);
        invocation.arg(&shared.token).arg(millis(ttl));
        let replies = self
            .inner
            .renew_on_nodes(&invocation, 1)
            .await
            .unwrap_or_else(|_| vec![None; self.inner.nodes.len()]);
        // The keeper schedules renewals from the deadline: let it look again.
        self.inner.keeper.nudge();
        let answers = crate::engine::keeper::answers(&replies, 0);
        let answered = answers.iter().flatten().count();
        match shared.settle(request, &answers) {
            Settled::Renewed | Settled::Ended => self.lease.ended_extension(),
            Settled::Lost(_) => Err(Error::NotOwner {
                name: shared.keys.name().to_owned(),
            }),
            Settled::Unknown => Err(Error::NoQuorum {
                name: shared.keys.name().to_owned(),
                answered,
                nodes: self.inner.nodes.len(),
            }),
        }
    }

    /// Runs `work` while the lease holds, and drops it the moment the lease is lost (as
    /// [`MutexGuard::run_until_lost`](crate::MutexGuard::run_until_lost) does).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the lease ended before `work` finished (at the latest at the validity deadline).
    pub async fn run_until_lost<F: std::future::Future>(
        &self,
        work: F,
    ) -> Result<F::Output, Error> {
        self.lease.run_until_lost(work).await
    }

    /// Releases the lock on every node (owner-checked). The lease reads released before any request leaves.
    ///
    /// # Errors
    ///
    /// [`Error::NotOwner`] when the lease had already been lost (nothing was changed on any node then).
    #[doc(alias = "unlock")]
    pub async fn release(mut self) -> Result<(), Error> {
        self.settled = true;
        self.round.over.store(true, Ordering::Release);
        self.inner.keeper.forget(self.kept);
        let held = self.lease.shared.end(LossReason::Released);
        let keys = Arc::clone(&self.lease.shared.keys);
        release_all(&self.inner, &keys, &self.lease.shared.token, &self.round).await;
        if held {
            Ok(())
        } else {
            Err(Error::NotOwner {
                name: keys.name().to_owned(),
            })
        }
    }
}

impl Drop for QuorumGuard {
    fn drop(&mut self) {
        self.inner.keeper.forget(self.kept);
        if self.settled {
            return;
        }
        self.round.over.store(true, Ordering::Release);
        self.lease.shared.end(LossReason::Released);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // lapses with its lease
        };
        let inner = Arc::clone(&self.inner);
        let keys = Arc::clone(&self.lease.shared.keys);
        let token = self.lease.shared.token.clone();
        let round = Arc::clone(&self.round);
        runtime.spawn(async move {
            release_all(&inner, &keys, &token, &round).await;
        });
    }
}

/// A random number below `n` (from the OS; 0 if it has none).
fn random_below(n: u64) -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() || n == 0 {
        return 0;
    }
    u64::from_le_bytes(bytes) % n
}
