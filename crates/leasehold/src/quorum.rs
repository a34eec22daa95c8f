//! Redlock done right: a mutex held on a majority of independent Redis primaries, with a fence that never goes back.
//!
//! Each node runs the single-server scripts unchanged: `acquire.lua` grants on one node (and draws that node's fence,
//! `max(counter + 1, server µs)`), `renew.lua` extends, `release.lua` deletes, each owner-checked. What is new is how
//! their answers combine (see DESIGN.md, "Redlock"):
//!
//! - **Acquire**: every node at once, each under the per-node timeout. Granted iff a majority granted and validity is
//!   left: `ttl − elapsed − drift`, measured on the lease clock from before the first request left (every node set
//!   its expiry after that instant). Otherwise the round is undone on *every* node (a reply may have been lost) and,
//!   when waiting, retried after a random delay longer than a round.
//! - **Fence**: `f = max` of the fences the granting nodes drew, written back (`fence_up.lua`) on each node that still
//!   holds the caller's token, never lowering a counter; `f` counts only once a majority confirmed the write-back
//!   within the validity. Two such majorities share a node, which saw the earlier write-back before it granted the
//!   later lock: fences increase with the order of the critical sections.
//! - **Renew**: every node; the lease moves only when a majority confirmed, within the current validity. Nothing
//!   ever re-creates a lapsed key or deletes one on a failed renewal. A majority that reports the key gone or taken
//!   ends the lease at once.
//! - **Release**: every node, owner-checked; the lease reads released before the requests leave.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use redis::aio::ConnectionManagerConfig;
use tokio::time::Instant;

use crate::conn::Conn;
use crate::error::{require_runtime, Error, InvalidArgument};
use crate::fence::{new_token, Fence};
use crate::guard::release_invocation;
use crate::keys::{check_prefix, check_ttl, drift, millis, LockKeys, DEFAULT_PREFIX};
use crate::lease::{Lease, LeaseShared, LossReason};
use crate::scripts::{ACQUIRE, FENCE_UP, RENEW};

/// The default time one node has to answer one request: far below the default lease (30 s), so that a slow node costs
/// a round little of its validity, and above the stalls of a loaded machine, so that a busy node is not taken for a
/// dead one.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(250);
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
    channel_prefix: String,
    /// Where releases are announced on every node: `P:freed`, the message is the lock key.
    freed_channel: String,
    wakers: Wakers,
    /// How long the last acquire round took, µs: the scale of the delays that keep waiters from colliding.
    round_us: AtomicU64,
}

impl QuorumInner {
    /// How long one request to one node may take in all: the node timeout, which the node's connection applies to
    /// its replies, plus a quarter. The connection's own timeout fires first, so that it counts the silence and opens
    /// a new connection to a node that went quiet (`conn.rs`); this bound covers the lazy connect and the retry.
    fn call_bound(&self) -> Duration {
        self.node_timeout + self.node_timeout / 4
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
    let mut backoff = Duration::from_millis(50);
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
            backoff = Duration::from_millis(50);
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
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
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
                fence_retention: crate::client::DEFAULT_FENCE_RETENTION,
                channel_prefix: format!("{prefix}:wake:"),
                freed_channel: format!("{prefix}:freed"),
                wakers: Wakers::default(),
                round_us: AtomicU64::new(1_000),
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
            quorum: self.clone(),
            keys: LockKeys::new(&self.inner.prefix, name),
            ttl: Duration::from_secs(30),
        }
    }
}

/// A mutex held on a majority of a [`Quorum`]'s nodes.
#[derive(Debug, Clone)]
pub struct QuorumMutex {
    quorum: Quorum,
    keys: Result<Arc<LockKeys>, InvalidArgument>,
    ttl: Duration,
}

/// One node's answer to one round's acquire.
enum Vote {
    /// Granted, with the fence the node drew.
    Granted(i64),
    /// Held by someone else, for this much longer (when the key has an expiry).
    Busy(Option<Duration>),
    /// No answer in time, or an error.
    Silent,
}

impl QuorumMutex {
    /// The lease of every grant (default 30 s): renewed every third of it while the guard lives.
    pub fn ttl(mut self, ttl: Duration) -> QuorumMutex {
        self.ttl = ttl;
        self
    }

    /// One round: the lock if a majority grants it now.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when enough nodes answered but too few granted; [`Error::NoQuorum`] when too few answered
    /// (nothing is left behind on any node either way); [`Error::InvalidArgument`] for a bad name or lease.
    pub async fn try_lock(&self) -> Result<QuorumGuard, Error> {
        let keys = self.checked()?;
        self.round(&keys).await
    }

    /// Rounds until one grants the lock, however long that takes (see [`lock_timeout`](QuorumMutex::lock_timeout)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name or lease; anything but a busy lock or unreachable nodes (which it
    /// waits out) ends the wait with that error.
    pub async fn lock(&self) -> Result<QuorumGuard, Error> {
        // A century: no deadline in practice, and no overflow on the lease clock.
        self.lock_timeout(Duration::from_secs(100 * 365 * 24 * 3600))
            .await
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
        let keys = self.checked()?;
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
            let outcome = tokio::time::timeout_at(deadline, self.round(&keys)).await;
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
        Ok(keys)
    }

    async fn round(&self, keys: &Arc<LockKeys>) -> Result<QuorumGuard, Error> {
        let inner = &self.quorum.inner;
        // Just released it while others waited: let one of them go first (a releaser that asks again at once would win
        // every time, being nearest).
        let last = Duration::from_micros(inner.round_us.load(Ordering::Relaxed));
        if let Some(until) = inner.wakers.yielding(&keys.lock, last) {
            tokio::time::sleep_until(until).await;
        }
        let token = new_token(None)?;
        // Undoes this round on every node unless it ends in a guard (also when the caller drops the future).
        let mut undo = UndoRound {
            inner: Arc::clone(inner),
            keys: Arc::clone(keys),
            token: Some(token.clone()),
        };
        let sent = crate::clock::now();
        let votes = join_all(
            inner
                .nodes
                .iter()
                .map(|node| vote(inner, node, keys, &token, self.ttl)),
        )
        .await;
        let took = sent.elapsed();
        inner.round_us.store(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
        let granted: Vec<(usize, i64)> = votes
            .iter()
            .enumerate()
            .filter_map(|(i, v)| match v {
                Vote::Granted(fence) => Some((i, *fence)),
                _ => None,
            })
            .collect();
        let answered = votes.iter().filter(|v| !matches!(v, Vote::Silent)).count();
        let majority = self.quorum.majority();
        let valid_until = sent + self.ttl - drift(self.ttl);
        if granted.len() < majority || crate::clock::now() >= valid_until {
            if answered < majority {
                return Err(Error::NoQuorum {
                    name: keys.name().to_owned(),
                    answered,
                    nodes: inner.nodes.len(),
                });
            }
            // Some nodes granted, too few: a split vote between contenders (or a lock just released on some nodes),
            // not a held lock. Said as "no remaining lease", which makes a waiter try again within a few rounds
            // instead of waiting on the leases of the competing rounds, which are undone at once.
            let remaining = if granted.is_empty() {
                votes
                    .iter()
                    .filter_map(|v| match v {
                        Vote::Busy(left) => *left,
                        _ => None,
                    })
                    .min()
            } else {
                None
            };
            return Err(Error::Busy {
                name: keys.name().to_owned(),
                remaining,
            });
        }
        // The fence: the largest any granting node drew, written back on a majority while each still holds our token.
        let fence = granted.iter().map(|&(_, f)| f).max().unwrap_or(0);
        let confirmed = join_all(
            granted
                .iter()
                .map(|&(i, _)| fence_up(inner, &inner.nodes[i], keys, &token, fence)),
        )
        .await
        .into_iter()
        .filter(|&ok| ok)
        .count();
        if confirmed < majority || crate::clock::now() >= valid_until {
            return Err(Error::Busy {
                name: keys.name().to_owned(),
                remaining: None,
            });
        }
        undo.token = None;
        let fence = Fence::new(u64::try_from(fence).unwrap_or(0));
        let shared = LeaseShared::new(Arc::clone(keys), token, fence, self.ttl, sent, self.ttl, 0);
        tracing::debug!(lock = %keys.name(), fence = fence.get(), nodes = granted.len(), "quorum granted");
        let renewer = tokio::spawn(keep(
            Arc::clone(inner),
            Arc::clone(&shared),
            self.ttl,
            majority,
        ));
        Ok(QuorumGuard {
            lease: Lease { shared },
            inner: Arc::clone(inner),
            renewer,
            settled: false,
        })
    }
}

/// One node's vote: `acquire.lua` without waiting, under the per-node timeout.
async fn vote(
    inner: &QuorumInner,
    node: &Conn,
    keys: &LockKeys,
    token: &str,
    ttl: Duration,
) -> Vote {
    let mut invocation = ACQUIRE.prepare_invoke();
    invocation
        .arg(millis(inner.fence_retention))
        .arg("quorum")
        .key(&keys.lock)
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.waiters())
        .arg(token)
        .arg(millis(ttl))
        .arg("0")
        .arg(millis(ttl.min(crate::scripts::CLAIM)))
        .arg("");
    let reply = tokio::time::timeout(
        inner.call_bound(),
        node.invoke_idempotent::<Vec<i64>>(&invocation),
    )
    .await;
    match reply {
        Ok(Ok(reply)) => match reply.as_slice() {
            [_, 1, fence, _] => Vote::Granted(*fence),
            [_, 0, left, _] => Vote::Busy(u64::try_from(*left).ok().map(Duration::from_millis)),
            _ => Vote::Silent,
        },
        _ => Vote::Silent,
    }
}

/// Raises `node`'s fence counter to `fence` if the node still holds `token`; true when it did (or the counter was
/// already at least `fence`).
async fn fence_up(
    inner: &QuorumInner,
    node: &Conn,
    keys: &LockKeys,
    token: &str,
    fence: i64,
) -> bool {
    let mut invocation = FENCE_UP.key(&keys.lock);
    invocation
        .key(keys.fence())
        .arg(token)
        .arg(fence)
        .arg(millis(inner.fence_retention));
    matches!(
        tokio::time::timeout(
            inner.call_bound(),
            node.invoke_idempotent::<i64>(&invocation)
        )
        .await,
        Ok(Ok(1))
    )
}

/// Releases `token` on every node, owner-checked, and announces the release on each node that released it (its
/// waiters hear it from whichever node reaches them first); how many released it.
async fn release_all(inner: &QuorumInner, keys: &LockKeys, token: &str) -> usize {
    join_all(inner.nodes.iter().map(|node| async move {
        let invocation =
            release_invocation(keys, token, &inner.channel_prefix, inner.fence_retention);
        // `release.lua` answers one code per release of the call: `[1]` when this one released.
        let released = matches!(
            tokio::time::timeout(
                inner.call_bound(),
                node.invoke_idempotent::<Vec<i64>>(&invocation)
            )
            .await
            .as_ref()
            .map(|reply| reply.as_ref().map(Vec::as_slice)),
            Ok(Ok([1]))
        );
        if released {
            let mut cmd = redis::cmd("PUBLISH");
            cmd.arg(&inner.freed_channel).arg(&keys.lock);
            let mut conn = node.clone();
            let announce = cmd.query_async::<i64>(&mut conn);
            if let Ok(Ok(listeners)) = tokio::time::timeout(inner.call_bound(), announce).await {
                // Our own subscriber, when this client ever waited, is one of them.
                let own = i64::from(inner.wakers.started.load(Ordering::Acquire));
                if listeners > own {
                    inner.wakers.yield_to_waiters(&keys.lock);
                }
            }
        }
        released
    }))
    .await
    .into_iter()
    .filter(|&released| released)
    .count()
}

/// Undoes a round that did not end in a guard: releases its token on every node, in the background.
struct UndoRound {
    inner: Arc<QuorumInner>,
    keys: Arc<LockKeys>,
    token: Option<String>,
}

impl Drop for UndoRound {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the round's grants lapse with their lease
        };
        let inner = Arc::clone(&self.inner);
        let keys = Arc::clone(&self.keys);
        runtime.spawn(async move {
            release_all(&inner, &keys, &token).await;
        });
    }
}

/// Keeps a quorum lease: renews it on every node every third of the lease, and ends it when its deadline passes
/// without a majority's confirmation, or when a majority reports the key gone or taken.
async fn keep(inner: Arc<QuorumInner>, lease: Arc<LeaseShared>, ttl: Duration, majority: usize) {
    // Each node runs one client's requests in the order they were sent, so the send order is the run order.
    let sequence = AtomicI64::new(1);
    let every = ttl / 3;
    let mut next = crate::clock::now() + every;
    loop {
        let Some(valid_until) = lease.deadline() else {
            return;
        };
        let wake = next.min(valid_until);
        tokio::time::sleep_until(crate::clock::timer_for(wake)).await;
        if lease.expire_if_due(crate::clock::now()) || lease.deadline().is_none() {
            return;
        }
        if crate::clock::now() < next {
            continue;
        }
        let Some(request) = lease.begin(ttl) else {
            return;
        };
        let run = sequence.fetch_add(1, Ordering::Relaxed);
        let timeout = inner.call_bound();
        let codes = join_all(inner.nodes.iter().map(|node| {
            let lease = &lease;
            async move {
                let mut invocation = RENEW.prepare_invoke();
                invocation
                    .key(&lease.keys.lock)
                    .arg(&lease.token)
                    .arg(millis(ttl));
                match tokio::time::timeout(timeout, node.invoke_idempotent::<Vec<i64>>(&invocation))
                    .await
                {
                    Ok(Ok(reply)) => reply.get(1).copied(),
                    _ => None,
                }
            }
        }))
        .await;
        let renewed = codes.iter().filter(|&&c| c == Some(1)).count();
        let lost = codes
            .iter()
            .filter(|&&c| matches!(c, Some(c) if c <= 0))
            .count();
        if renewed >= majority {
            lease.confirm(request, run);
            next = request.sent + every;
        } else if lost > codes.len() - majority {
            // A majority can no longer be reached: the key is gone from, or taken on, too many nodes.
            let taken = codes.contains(&Some(-1));
            lease.end(if taken {
                LossReason::Taken
            } else {
                LossReason::Gone
            });
            return;
        } else {
            // Not confirmed: the lease keeps its deadline; try again soon.
            next = crate::clock::now() + (every / 4).max(Duration::from_millis(10));
        }
    }
}

/// A [`QuorumMutex`] grant: a [`Lease`] (fence, deadline, loss signal) kept alive on the quorum until it is released
/// or dropped (then released in the background).
pub struct QuorumGuard {
    lease: Lease,
    inner: Arc<QuorumInner>,
    renewer: tokio::task::JoinHandle<()>,
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
    /// Releases the lock on every node (owner-checked). The lease reads released before any request leaves.
    ///
    /// # Errors
    ///
    /// [`Error::NotOwner`] when the lease had already been lost (nothing was changed on any node then).
    pub async fn release(mut self) -> Result<(), Error> {
        self.settled = true;
        self.renewer.abort();
        let held = self.lease.shared.end(LossReason::Released);
        let keys = Arc::clone(&self.lease.shared.keys);
        release_all(&self.inner, &keys, &self.lease.shared.token).await;
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
        self.renewer.abort();
        if self.settled {
            return;
        }
        self.lease.shared.end(LossReason::Released);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // lapses with its lease
        };
        let inner = Arc::clone(&self.inner);
        let keys = Arc::clone(&self.lease.shared.keys);
        let token = self.lease.shared.token.clone();
        runtime.spawn(async move {
            release_all(&inner, &keys, &token).await;
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
