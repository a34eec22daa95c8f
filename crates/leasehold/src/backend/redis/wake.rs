//! Event-driven waiting with direct hand-off: a release grants the lock to the oldest live waiting client and tells
//! it so on that client's own channel.
//!
//! # Protocol
//!
//! A client that finds a lock busy and means to wait puts its id at the end of the lock's queue (a Redis list, one
//! entry per client however many of its tasks wait), and stores, per client id, the token of its latest attempt with
//! a liveness deadline in server time (`acquire.lua`). A release pops ids, oldest first, until one is live, makes that
//! client's stored token the owner (a short claim lease, the fence drawn in the same step) and publishes the grant on
//! `PREFIX:wake:<id>` (`hand_off.lua`). The subscriber here routes the grant to the waiting task that sent that token
//! (its [`Mailbox`]); the task starts its critical section at once, with a validity deadline derived from the instant
//! it sent the attempt that stored the token (see DESIGN.md, "Direct hand-off"). A grant for a token nobody here waits
//! with any more (the wait was given up) is released at once, which hands the lock to the next waiting client.
//!
//! # Why pub/sub and not a hand-off list
//!
//! A hand-off list (`BLPOP` on a per-lock list that the release pushes to) needs a blocking connection per waiting
//! lock, and a pushed token outlives a waiter that gave up. Here one subscriber connection per client serves every
//! lock it waits for, is subscribed once for the client's life, and leaves nothing behind in Redis but the queue,
//! which expires. Lost messages (a reconnect) are bounded: every waiter also looks again at the holder's lease end
//! and at least every heartbeat, an attempt finds a lock that was handed to the wait's previous token and takes it,
//! and the subscriber wakes every local waiter after it reconnects, since a grant may have been missed meanwhile.
//!
//! # No stampede
//!
//! A release hands over to one client, and inside it waiters of one lock queue on a local FIFO semaphore
//! ([`LocalLock::queue`]): only its head contends in Redis. A release costs O(1) acquire attempts in all.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{oneshot, watch, Notify, Semaphore};
use tokio::time::Instant;

use crate::backend::redis::release::release_in_background;
use crate::backend::redis::store::RedisStore;
use crate::backend::redis::topology::{Cluster, Target};
use crate::engine::backoff::Backoff;
use crate::engine::ids::IdMap;
use crate::engine::keys::LockKeys;
use crate::fence::token_id;

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::wake=debug`).
const TARGET: &str = "leasehold::wake";

/// How often the subscriber pings its connection, to notice a peer that went silent without closing.
const PING_EVERY: Duration = Duration::from_secs(2);
/// How often a cluster subscriber drops the sharded channels of locks nobody here waits for any more. A channel is
/// kept this long after its last waiter left, so that a lock waited for again and again is subscribed once.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// The tokens one waiting task keeps registered: its latest attempts, any of which a release may grant (a reply
/// that was lost leaves its attempt's token possibly stored). A grant for an older one is released.
const KEPT_TOKENS: usize = 8;

/// This process's view of one lock's waiters.
pub(crate) struct LocalLock {
    /// One permit: the local waiter holding it is the only one contending in Redis.
    pub(crate) queue: Semaphore,
    /// Bumped after a subscriber reconnect (a grant may have been missed) and when the subscriber task ends.
    wake: watch::Sender<u64>,
    /// Local tasks between [`Wakeups::join`] and the drop of their [`Waiting`]; changed under the map lock.
    waiters: AtomicUsize,
    /// On a cluster: whether this lock's sharded channel is subscribed (see [`Wakeups::ready`]).
    subscribed: watch::Sender<bool>,
}

impl LocalLock {
    /// Makes the local waiters of this lock look again.
    pub(crate) fn bump(&self) {
        self.wake.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A grant a release handed to one of this client's tokens, as its wake-up message told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handed {
    pub(crate) token: String,
    pub(crate) fence: u64,
    /// The server time (µs) at which the release ran.
    pub(crate) run: i64,
    /// The claim lease the release set.
    pub(crate) claim: Duration,
}

impl Handed {
    /// Parses `g <fence> <now µs> <claim ms> <token>\n<lock key>` (see `hand_off.lua`).
    fn parse(message: &str) -> Option<(Handed, &str)> {
        let rest = message.strip_prefix("g ")?;
        let (head, lock_key) = rest.split_once('\n')?;
        let mut fields = head.splitn(4, ' ');
        let fence = fields.next()?.parse().ok()?;
        let run = fields.next()?.parse().ok()?;
        let claim = Duration::from_millis(fields.next()?.parse().ok()?);
        let token = fields.next()?.to_owned();
        token_id(&token)?;
        Some((
            Handed {
                token,
                fence,
                run,
                claim,
            },
            lock_key,
        ))
    }
}

/// Where a grant message for one of this client's tokens goes.
enum Route {
    /// To the mailbox of the waiting task that sent the token.
    Waiting(Arc<Mailbox>),
    /// Nowhere: the token holds the lock already, taken through an attempt's reply (the release ran before that
    /// attempt, and its message may still be on its way). Until that grant ends, a message for it is ignored, never
    /// given back: giving it back would release a lock in use.
    Taken,
}

/// Where the subscriber leaves a grant for the waiting task whose token it names.
#[derive(Default)]
pub(crate) struct Mailbox {
    handed: Mutex<Option<Handed>>,
    arrived: Notify,
}

impl Mailbox {
    /// Resolves when a grant arrives (at once if one arrived since the last call). Cancel safe.
    pub(crate) async fn arrived(&self) {
        self.arrived.notified().await;
    }

    fn slot(&self) -> MutexGuard<'_, Option<Handed>> {
        self.handed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The client's side of the subscriber task.
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
    target: Target,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// Dropped with the client, which ends the task.
    task: Mutex<Option<oneshot::Sender<()>>>,
    /// On a cluster: asks the task to subscribe a lock's sharded channel (by lock key).
    requests: Mutex<Option<tokio::sync::mpsc::UnboundedSender<String>>>,
}

struct Shared {
    /// Lock key → local waiters, for every lock some local task waits on now.
    locals: Mutex<HashMap<String, Arc<LocalLock>>>,
    /// Token id → where a grant to that token goes, for every token a release may grant.
    expected: Mutex<IdMap<u128, Route>>,
    /// True while our channel is subscribed on a live connection.
    subscribed: watch::Sender<bool>,
    /// Counts every wake-up delivered and every reconnect, for [`Wakeups::epoch`].
    epoch: AtomicU64,
    /// Set once the server refused a subscription for want of a permission, which is said once per client.
    refusal_said: AtomicBool,
    client_id: String,
    /// Every client's channel starts with this; ours is `channel_prefix + client_id`. Empty on a cluster, where
    /// the channel is per lock: `P:{N}:wake:<client id>` (see `notify` in `grant.lua`).
    channel_prefix: String,
    prefix: String,
    /// The client, to release grants nobody waits for (the client owns this: a weak reference).
    inner: Weak<RedisStore>,
}

impl Shared {
    fn locals(&self) -> MutexGuard<'_, HashMap<String, Arc<LocalLock>>> {
        self.locals.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn expected(&self) -> MutexGuard<'_, IdMap<u128, Route>> {
        self.expected.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for local in self.locals().values() {
            local.bump();
        }
    }

    /// Releases a grant nobody here will use, in the background: the release hands the lock to the next waiting
    /// client. Owner-checked, so harmless if the grant already lapsed.
    fn give_back(&self, keys: Arc<LockKeys>, handed: Handed) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        tracing::debug!(target: TARGET, lock = %keys.name(), fence = handed.fence, "handed a lock nobody waits for; passing it on");
        release_in_background(inner, keys, handed.token, handed.claim);
    }
}

/// A waiting task's tokens, registered so that a release can hand the lock to any of them; and its mailbox. When it
/// is dropped (the wait ended), a grant that arrived and was not taken is released, and one that arrives later
/// finds no mailbox and is released by the subscriber.
pub(crate) struct Expecting {
    shared: Arc<Shared>,
    keys: Arc<LockKeys>,
    mailbox: Arc<Mailbox>,
    /// Oldest first: token, its id, and the lease-clock instant read before its attempt was sent.
    tokens: VecDeque<(String, u128, Instant)>,
}

impl Expecting {
    /// Registers `token`, whose attempt is about to be sent at `sent`. Call it *before* sending: the release that
    /// grants it can run, and its message arrive, before the attempt's own reply does.
    pub(crate) fn add(&mut self, token: &str, sent: Instant) {
        let Some(id) = token_id(token) else { return };
        let mut expected = self.shared.expected();
        if self.tokens.len() == KEPT_TOKENS {
            if let Some((_, old, _)) = self.tokens.pop_front() {
                expected.remove(&old);
            }
        }
        expected.insert(id, Route::Waiting(Arc::clone(&self.mailbox)));
        self.tokens.push_back((token.to_owned(), id, sent));
    }

    /// The token of the latest attempt (a release may have handed the lock to it).
    pub(crate) fn last(&self) -> Option<&str> {
        self.tokens.back().map(|(token, ..)| token.as_str())
    }

    /// The send instant of `token`'s attempt, if it is one of ours.
    pub(crate) fn sent(&self, token: &str) -> Option<Instant> {
        self.tokens
            .iter()
            .find(|(t, ..)| t == token)
            .map(|&(_, _, sent)| sent)
    }

    /// A grant a release handed to one of our tokens, with the instant that token's attempt was sent. It stays in
    /// the mailbox (and is released if this wait ends) until [`Expecting::drop_handed`] takes it off.
    pub(crate) fn handed(&self) -> Option<(Handed, Instant)> {
        let handed = self.mailbox.slot().clone()?;
        match self.sent(&handed.token) {
            Some(sent) => Some((handed, sent)),
            // Not one of ours any more (only our tokens route here, but an old one may have been dropped from the
            // list meanwhile): never leave a grant unattended.
            None => {
                self.mailbox.slot().take();
                self.shared.give_back(Arc::clone(&self.keys), handed);
                None
            }
        }
    }

    /// The hand-off of `token` lapsed (an attempt found the lock no longer held by it): forget it.
    pub(crate) fn drop_handed(&mut self, token: &str) {
        self.unregister(token, false);
    }

    /// `token` holds the lock now, taken through an attempt's reply: a release may have handed it over with a message
    /// still on its way, which must be ignored until that grant ends. Returns the id to give
    /// [`Wakeups::untake`] when it does.
    pub(crate) fn taken(&mut self, token: &str) -> Option<u128> {
        self.unregister(token, true)
    }

    /// `token`'s grant was taken from the mailbox. Copies of its message may still arrive (a replica delivers what
    /// its primary published): until the grant ends they are ignored, never given back. Returns the id to give
    /// [`Wakeups::untake`] when it ends.
    pub(crate) fn handed_over(&mut self, token: &str) -> Option<u128> {
        self.unregister(token, true)
    }

    fn unregister(&mut self, token: &str, taken: bool) -> Option<u128> {
        let i = self.tokens.iter().position(|(t, ..)| t == token)?;
        let (_, id, _) = self.tokens.remove(i)?;
        {
            let mut expected = self.shared.expected();
            if taken {
                expected.insert(id, Route::Taken);
            } else {
                expected.remove(&id);
            }
        }
        let mut slot = self.mailbox.slot();
        if slot.as_ref().is_some_and(|h| h.token == token) {
            *slot = None;
        }
        taken.then_some(id)
    }

    /// Resolves when a grant arrives for one of our tokens. Cancel safe.
    pub(crate) async fn arrived(&self) {
        self.mailbox.arrived().await;
    }
}

impl Drop for Expecting {
    fn drop(&mut self) {
        // Under the registry lock, as in `Task::deliver`: a grant either finds our mailbox (and we release it here)
        // or finds no mailbox (and the subscriber releases it). Never neither.
        let handed = {
            let mut expected = self.shared.expected();
            for (_, id, _) in &self.tokens {
                expected.remove(id);
            }
            self.mailbox.slot().take()
        };
        if let Some(handed) = handed {
            self.shared.give_back(Arc::clone(&self.keys), handed);
        }
    }
}

/// A local task's registration as a waiter of one lock.
pub(crate) struct Waiting {
    pub(crate) local: Arc<LocalLock>,
    lock_key: String,
    shared: Arc<Shared>,
}

impl Waiting {
    /// A receiver of the lock's reconnect wake-ups. Mark it seen *before* each acquire attempt, then wait on
    /// `changed()`.
    pub(crate) fn wakeups(&self) -> watch::Receiver<u64> {
        self.local.wake.subscribe()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut map = self.shared.locals();
        if self.local.waiters.fetch_sub(1, Ordering::AcqRel) == 1 {
            map.remove(&self.lock_key);
        }
    }
}

impl Wakeups {
    pub(crate) fn new(
        inner: Weak<RedisStore>,
        target: Target,
        prefix: &str,
        client_id: String,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Wakeups {
        Wakeups {
            shared: Arc::new(Shared {
                locals: Mutex::new(HashMap::new()),
                expected: Mutex::new(IdMap::default()),
                subscribed: watch::channel(false).0,
                epoch: AtomicU64::new(0),
                refusal_said: AtomicBool::new(false),
                client_id,
                channel_prefix: target.channel_prefix(prefix),
                prefix: prefix.to_owned(),
                inner,
            }),
            target,
            connect_timeout,
            response_timeout,
            task: Mutex::new(None),
            requests: Mutex::new(None),
        }
    }

    /// This client's id, as it appears in lock queues.
    pub(crate) fn client_id(&self) -> &str {
        &self.shared.client_id
    }

    /// The prefix of every client's wake-up channel.
    pub(crate) fn channel_prefix(&self) -> &str {
        &self.shared.channel_prefix
    }

    /// Whether a release can reach this client's waiters now: on one server (or one Sentinel follows) once the
    /// subscriber is subscribed, since a release there takes a notification nobody heard for proof that the waiter
    /// is gone and passes it over; on Cluster always, where no count is taken for proof (see hand_off.lua).
    pub(crate) fn reachable(&self) -> bool {
        self.target.is_cluster() || *self.shared.subscribed.borrow()
    }

    /// A value that changes whenever a wake-up could have been missed by a task that was not yet registered with
    /// [`Wakeups::join`]: any delivery, any reconnect. `None` while not subscribed, and always on a cluster (where
    /// a lock's channel is subscribed only once a task waits for it).
    pub(crate) fn epoch(&self) -> Option<u64> {
        if self.target.is_cluster() {
            return None;
        }
        let epoch = self.shared.epoch.load(Ordering::Acquire);
        (*self.shared.subscribed.borrow()).then_some(epoch)
    }

    /// The grant of a token that [`Expecting::taken`] routed nowhere has ended: a message for it, if one is still on
    /// its way, may be given back from now on (releasing it is owner-checked).
    pub(crate) fn untake(&self, id: u128) {
        let mut expected = self.shared.expected();
        if matches!(expected.get(&id), Some(Route::Taken)) {
            expected.remove(&id);
        }
    }

    /// A registry of hand-off tokens for one waiting task on the lock `keys`.
    pub(crate) fn expecting(&self, keys: &Arc<LockKeys>) -> Expecting {
        Expecting {
            shared: Arc::clone(&self.shared),
            keys: Arc::clone(keys),
            mailbox: Arc::new(Mailbox::default()),
            tokens: VecDeque::new(),
        }
    }

    /// Registers the calling task as a waiter of the lock at `lock_key`.
    pub(crate) fn join(&self, lock_key: &str) -> Waiting {
        let mut map = self.shared.locals();
        let local = map
            .entry(lock_key.to_owned())
            .or_insert_with(|| {
                Arc::new(LocalLock {
                    queue: Semaphore::new(1),
                    wake: watch::channel(0).0,
                    waiters: AtomicUsize::new(0),
                    subscribed: watch::channel(false).0,
                })
            })
            .clone();
        local.waiters.fetch_add(1, Ordering::AcqRel);
        Waiting {
            local,
            lock_key: lock_key.to_owned(),
            shared: Arc::clone(&self.shared),
        }
    }

    /// Returns once wake-ups for the lock at `lock_key` reach this client (its channel is subscribed; on a cluster,
    /// the lock's sharded channel for this client), or after the response timeout if they cannot (then waiters still
    /// look again at the holder's lease end and every heartbeat). Starts the subscriber task on first use. The
    /// calling task must have [joined](Wakeups::join) the lock.
    ///
    /// Must run inside a tokio runtime.
    pub(crate) async fn ready(&self, lock_key: &str) {
        let mut subscribed = match &self.target {
            Target::Single(_) | Target::Followed(_) => self.shared.subscribed.subscribe(),
            Target::Cluster(_) => {
                let Some(local) = self.shared.locals().get(lock_key).cloned() else {
                    return;
                };
                local.subscribed.subscribe()
            }
        };
        if *subscribed.borrow_and_update() {
            return;
        }
        self.start();
        if self.target.is_cluster() {
            let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(requests) = requests.as_ref() {
                let _ = requests.send(lock_key.to_owned());
            }
        }
        let wait = subscribed.wait_for(|&s| s);
        if tokio::time::timeout(self.response_timeout, wait)
            .await
            .is_err()
        {
            tracing::debug!(target: TARGET, "wake-up channel not subscribed in time; waiting on lease ends");
        }
    }

    fn start(&self) {
        let mut slot = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|s| !s.is_closed()) {
            return;
        }
        let (stop, stopped) = oneshot::channel();
        let task = Task {
            shared: Arc::clone(&self.shared),
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
        };
        let run: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
            match &self.target {
                Target::Single(redis) => Box::pin(task.run(Source::Fixed(Box::new(redis.clone())))),
                Target::Followed(followed) => {
                    Box::pin(task.run(Source::Followed(Arc::clone(followed))))
                }
                Target::Cluster(cluster) => {
                    let (requests, received) = tokio::sync::mpsc::unbounded_channel();
                    *self.requests.lock().unwrap_or_else(|e| e.into_inner()) = Some(requests);
                    Box::pin(task.run_sharded(cluster.clone(), received))
                }
            };
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            // Whatever ends this task (the client dropped, or its runtime shutting down and dropping it), the flag
            // must not keep saying "subscribed": a client used from another runtime later starts a new task.
            let _unsubscribed = Unsubscribed(shared);
            tokio::select! {
                () = run => {}
                _ = stopped => {}
            }
        });
        *slot = Some(stop);
    }
}

/// Marks the channel unsubscribed, and lets every waiter look again, when the subscriber task ends.
struct Unsubscribed(Arc<Shared>);

impl Drop for Unsubscribed {
    fn drop(&mut self) {
        self.0.subscribed.send_replace(false);
        for local in self.0.locals().values() {
            local.subscribed.send_replace(false);
        }
        self.0.bump_all();
    }
}

struct Task {
    shared: Arc<Shared>,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Task {
    async fn run(self, source: Source) {
        let channel = format!("{}{}", self.shared.channel_prefix, self.shared.client_id);
        let mut backoff = Backoff::new();
        loop {
            let mut moved = source.changed();
            let redis = source.client();
            match tokio::time::timeout(self.connect_timeout, redis.get_async_pubsub()).await {
                Ok(Ok(pubsub)) => {
                    backoff.reset();
                    self.serve(pubsub, &channel, &mut moved).await;
                    self.shared.subscribed.send_replace(false);
                    // Wake-ups sent while we were away are lost: let every waiter look again.
                    self.shared.bump_all();
                }
                Ok(Err(err)) => {
                    tracing::debug!(target: TARGET, error = %err, "subscriber connection failed")
                }
                Err(_) => tracing::debug!(target: TARGET, "subscriber connection timed out"),
            }
            tokio::time::sleep(backoff.next()).await;
        }
    }

    /// Serves one connection until it fails, or until the primary it is connected to is no longer the primary
    /// (`moved`, with Sentinel).
    async fn serve(
        &self,
        pubsub: redis::aio::PubSub,
        channel: &str,
        moved: &mut Option<watch::Receiver<u64>>,
    ) {
        let (mut sink, mut stream) = pubsub.split();
        if !self.subscribed(sink.subscribe(channel), channel).await {
            return;
        }
        // Anything published before this subscription was missed: let every waiter look again. Before the flag goes
        // up, so that a waiter that waited for it has seen this bump already and does not attempt twice (the
        // subscription is confirmed by now: any attempt from here on runs while it is active).
        self.shared.bump_all();
        self.shared.subscribed.send_replace(true);
        let mut pings = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
        loop {
            tokio::select! {
                message = stream.next() => match message {
                    Some(message) => match message.get_payload::<String>() {
                        Ok(text) => self.deliver(&text),
                        Err(err) => tracing::warn!(target: TARGET, error = %err, "unreadable wake-up message"),
                    },
                    None => return,
                },
                _ = pings.tick() => {
                    // A blackholed connection never reports its end: a ping notices it.
                    if !self.confirm(sink.ping::<redis::Value>()).await {
                        return;
                    }
                }
                () = changed(moved) => {
                    tracing::debug!(target: TARGET, "the primary moved; subscribing there");
                    return;
                }
            }
        }
    }

    /// The cluster subscriber: one cluster connection (RESP3, pushes to this task) whose sharded channels are the
    /// locks this client waits for, `P:{N}:wake:<client id>`, each in its lock's slot. A channel is subscribed when
    /// a task first waits for its lock ([`Wakeups::ready`]) and dropped within [`SWEEP_EVERY`] after its last waiter
    /// left.
    ///
    /// After a node fails or a slot moves, redis-rs restores a sharded subscription only once that connection next
    /// sends a command to the slot, and wake-ups are lost until then (FIELD-NOTES). So this task subscribes every
    /// channel again at once when the connection reports a disconnection or the server drops a channel (a slot that
    /// moved away), retrying until each is back, and then lets every waiter look again.
    async fn run_sharded(
        self,
        cluster: Cluster,
        mut requests: tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        let mut backoff = Backoff::new();
        loop {
            let (push, mut pushes) = tokio::sync::mpsc::unbounded_channel();
            let connected = match cluster.client(Some(push)) {
                Ok(client) => {
                    tokio::time::timeout(self.connect_timeout, client.get_async_connection()).await
                }
                Err(err) => Ok(Err(err)),
            };
            match connected {
                Ok(Ok(conn)) => {
                    backoff.reset();
                    self.serve_sharded(conn, &mut pushes, &mut requests).await;
                    for local in self.shared.locals().values() {
                        local.subscribed.send_replace(false);
                    }
                    self.shared.bump_all();
                }
                Ok(Err(err)) => {
                    tracing::debug!(target: TARGET, error = %err, "cluster subscriber connection failed")
                }
                Err(_) => {
                    tracing::debug!(target: TARGET, "cluster subscriber connection timed out")
                }
            }
            tokio::time::sleep(backoff.next()).await;
        }
    }

    /// Serves one cluster connection until its pushes end.
    async fn serve_sharded(
        &self,
        mut conn: redis::cluster_async::ClusterConnection,
        pushes: &mut tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
        requests: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        let channel_of = |lock_key: &str| format!("{lock_key}:wake:{}", self.shared.client_id);
        // Lock key → subscribed (as far as this task knows).
        let mut channels: HashMap<String, bool> = HashMap::new();
        let mut resubscribe_at: Option<Instant> = None;
        let mut backoff = Backoff::new();
        let mut sweep = tokio::time::interval_at(Instant::now() + SWEEP_EVERY, SWEEP_EVERY);
        loop {
            tokio::select! {
                request = requests.recv() => {
                    let Some(lock_key) = request else { return };
                    if channels.get(&lock_key) == Some(&true) {
                        self.mark_subscribed(&lock_key);
                        continue;
                    }
                    let channel = channel_of(&lock_key);
                    if self.subscribed(conn.ssubscribe(&channel), &channel).await {
                        channels.insert(lock_key.clone(), true);
                        self.mark_subscribed(&lock_key);
                    } else {
                        // The waiter's `ready` gives up after its timeout and looks again on lease ends; the
                        // channel is tried again with the others.
                        channels.insert(lock_key, false);
                        resubscribe_at.get_or_insert_with(|| Instant::now() + backoff.peek());
                    }
                }
                push = pushes.recv() => {
                    let Some(push) = push else { return };
                    match push.kind {
                        redis::PushKind::SMessage => {
                            match push.data.get(1).cloned().map(redis::from_redis_value::<String>) {
                                Some(Ok(text)) => self.deliver(&text),
                                _ => tracing::warn!(target: TARGET, "unreadable wake-up message"),
                            }
                        }
                        redis::PushKind::Disconnection => {
                            tracing::debug!(target: TARGET, "cluster subscriber lost a node; subscribing again");
                            for subscribed in channels.values_mut() {
                                *subscribed = false;
                            }
                            resubscribe_at = Some(Instant::now());
                            // Wake-ups sent meanwhile are lost: let every waiter look again.
                            self.shared.bump_all();
                        }
                        redis::PushKind::SUnsubscribe => {
                            // The server dropped one of our channels (its slot moved to another node), or we did.
                            let channel = push
                                .data
                                .first()
                                .cloned()
                                .and_then(|c| redis::from_redis_value::<String>(c).ok());
                            let lock_key = channel.as_deref().and_then(|c| {
                                c.strip_suffix(&format!(":wake:{}", self.shared.client_id))
                            });
                            if let Some(subscribed) = lock_key.and_then(|k| channels.get_mut(k)) {
                                *subscribed = false;
                                resubscribe_at = Some(Instant::now());
                            }
                        }
                        _ => {}
                    }
                }
                () = sleep_until_some(resubscribe_at) => {
                    let mut all = true;
                    for (lock_key, subscribed) in channels.iter_mut().filter(|(_, s)| !**s) {
                        let channel = channel_of(lock_key);
                        *subscribed = self.subscribed(conn.ssubscribe(&channel), &channel).await;
                        if *subscribed {
                            self.mark_subscribed(lock_key);
                        }
                        all &= *subscribed;
                    }
                    if all {
                        resubscribe_at = None;
                        backoff.reset();
                        // A grant may have been published while a channel was down.
                        self.shared.bump_all();
                    } else {
                        resubscribe_at = Some(Instant::now() + backoff.next());
                    }
                }
                _ = sweep.tick() => {
                    let idle: Vec<String> = {
                        let locals = self.shared.locals();
                        channels.keys().filter(|k| !locals.contains_key(*k)).cloned().collect()
                    };
                    for lock_key in idle {
                        channels.remove(&lock_key);
                        if !self.confirm(conn.sunsubscribe(channel_of(&lock_key))).await {
                            tracing::debug!(target: TARGET, "could not drop an idle wake-up channel");
                        }
                    }
                }
            }
        }
    }

    /// The lock's sharded channel is subscribed: its waiters may rely on wake-ups.
    fn mark_subscribed(&self, lock_key: &str) {
        if let Some(local) = self.shared.locals().get(lock_key) {
            local.subscribed.send_replace(true);
        }
    }

    fn deliver(&self, message: &str) {
        self.shared.epoch.fetch_add(1, Ordering::AcqRel);
        let Some((handed, lock_key)) = Handed::parse(message) else {
            tracing::warn!(target: TARGET,
                message,
                "unreadable wake-up message; every waiter looks again"
            );
            self.shared.bump_all();
            return;
        };
        // Under the registry lock, so that the waiting task's `Expecting::drop` either finds the grant in its mailbox
        // or has already left (and then the grant is released here).
        let orphan = {
            let expected = self.shared.expected();
            let id = token_id(&handed.token).unwrap_or_default();
            match expected.get(&id) {
                Some(Route::Waiting(mailbox)) => {
                    let mut slot = mailbox.slot();
                    if slot
                        .as_ref()
                        .is_some_and(|waiting| waiting.token == handed.token)
                    {
                        // The same grant again: one message can arrive twice (a replica delivers what its primary
                        // published, and a subscription can sit on both). Giving the first copy back would release
                        // the grant the task is about to take.
                        None
                    } else {
                        let replaced = slot.replace(handed);
                        mailbox.arrived.notify_one();
                        // A second grant before the first was taken: the first has lapsed by now (the lock is
                        // exclusive), and releasing it is owner-checked.
                        replaced
                    }
                }
                // The grant is in use already (taken through an attempt's reply, or from the mailbox): this is its
                // message, or a copy of it, arriving late. The route stays until the grant ends, since more copies may
                // follow ([`Wakeups::untake`]).
                Some(Route::Taken) => None,
                None => Some(handed),
            }
        };
        // The lock named by the message (a key under our prefix, or nothing to release).
        if let (Some(handed), Some(keys)) =
            (orphan, LockKeys::of_key(&self.shared.prefix, lock_key))
        {
            self.shared.give_back(keys, handed);
        }
    }

    /// Whether a subscription to `channel` was confirmed in time. A server that refuses it for want of a permission
    /// (an ACL user without `+subscribe`, `+ssubscribe` or the channel) is said once, as a warning: a connect checks
    /// the channel with `PUBLISH` but not the subscribe commands (that would take a second connection), and without
    /// them waiters are never woken: each looks again only at its heartbeat.
    async fn subscribed<T>(
        &self,
        request: impl std::future::Future<Output = redis::RedisResult<T>>,
        channel: &str,
    ) -> bool {
        match tokio::time::timeout(self.response_timeout, request).await {
            Ok(Ok(_)) => true,
            Ok(Err(err)) => {
                if crate::backend::redis::checks::is_noperm(&err)
                    && !self.shared.refusal_said.swap(true, Ordering::Relaxed)
                {
                    tracing::warn!(
                        target: TARGET,
                        channel,
                        error = %err,
                        "the server refused the subscription to this client's wake-up channel: waiters are not woken \
                         by releases and look again only every second; give the user +subscribe (on a cluster \
                         +ssubscribe) and the channel pattern the README's ACL rule names"
                    );
                } else {
                    tracing::debug!(target: TARGET, channel, error = %err, "subscription failed");
                }
                false
            }
            Err(_) => false,
        }
    }

    async fn confirm<T>(
        &self,
        request: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> bool {
        matches!(
            tokio::time::timeout(self.response_timeout, request).await,
            Ok(Ok(_))
        )
    }
}

/// Where the one-server subscriber connects: a fixed server, or the primary the sentinels name now.
enum Source {
    Fixed(Box<redis::Client>),
    Followed(Arc<crate::backend::redis::sentinel::Followed>),
}

impl Source {
    fn client(&self) -> redis::Client {
        match self {
            Source::Fixed(redis) => (**redis).clone(),
            Source::Followed(followed) => followed.client(),
        }
    }

    /// Changes when the primary moves (never for a fixed server).
    fn changed(&self) -> Option<watch::Receiver<u64>> {
        match self {
            Source::Fixed(_) => None,
            Source::Followed(followed) => Some(followed.changed()),
        }
    }
}

/// Resolves when `moved` changes; never when it is `None` or its sender is gone.
async fn changed(moved: &mut Option<watch::Receiver<u64>>) {
    if let Some(moved) = moved {
        if moved.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// Sleeps until `at`; forever when it is `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_message_parses_with_the_lock_key_last() {
        let token = "dl1:0123456789abcdef0123456789abcdef host=a pid=1";
        // Lock names may hold spaces, newlines and braces: the key is everything after the first newline.
        let message = format!("g 1795480193111221 1795480193111221 2000 {token}\nlk:{{a b\nc}}");
        let (handed, lock_key) = Handed::parse(&message).unwrap();
        assert_eq!(
            handed,
            Handed {
                token: token.to_owned(),
                fence: 1_795_480_193_111_221,
                run: 1_795_480_193_111_221,
                claim: Duration::from_secs(2),
            }
        );
        assert_eq!(lock_key, "lk:{a b\nc}");
        // Anything else (an old plain wake-up, a token that is not one) is refused, never half-read.
        assert_eq!(Handed::parse("leasehold:{x}"), None);
        assert_eq!(Handed::parse("g 1 2 2000 not-a-token\nk"), None);
        assert_eq!(
            Handed::parse("g 1 2 x dl1:0123456789abcdef0123456789abcdef\nk"),
            None
        );
    }
}
