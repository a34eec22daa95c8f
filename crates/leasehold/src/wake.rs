//! Event-driven waiting: each client listens on its own channel, and a release wakes the oldest waiting client.
//!
//! # Protocol
//!
//! A client that finds a lock busy and means to wait puts its id at the end of the lock's queue (a Redis list, one
//! entry per client however many of its tasks wait). A release pops ids, oldest first, and publishes the lock key on
//! `PREFIX:wake:<id>` until a client is still listening (`PUBLISH` counts the receivers), then leaves the lock key
//! holding a reservation for that client for [`RESERVATION`](crate::scripts::RESERVATION): a releaser that loops
//! cannot barge ahead of it, so
//! processes are served in arrival order. The woken client's first local waiter takes the lock; if none is left,
//! the client passes its turn to the next one (`pass_on.lua`).
//!
//! # Why pub/sub and not a hand-off list
//!
//! A hand-off list (`BLPOP` on a per-lock list that the release pushes to) needs a blocking connection per waiting
//! lock, and a pushed token outlives a waiter that gave up. Here one subscriber connection per client serves every
//! lock it waits for, is subscribed once for the client's life, and leaves nothing behind in Redis but the queue,
//! which expires. Lost messages (a reconnect, a client that stalls while reserved) are bounded: every waiter also
//! sleeps at most the holder's remaining lease, which the failed acquire reported, and the subscriber wakes every
//! local waiter after it reconnects, since a wake-up may have been missed while it was away.
//!
//! # No stampede
//!
//! A release wakes one client, and inside it waiters of one lock queue on a local FIFO semaphore
//! ([`LocalLock::queue`]): only its head contends in Redis. A release costs O(1) acquire attempts in all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::time::Instant;

use crate::conn::Conn;
use crate::keys::{queue_of, waiters_of};
use crate::scripts::PASS_ON;

/// Reconnect backoff bounds for the subscriber connection.
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(1);
/// How often the subscriber pings its connection, to notice a peer that went silent without closing.
const PING_EVERY: Duration = Duration::from_secs(2);

/// This process's view of one lock's waiters.
pub(crate) struct LocalLock {
    /// One permit: the local waiter holding it is the only one contending in Redis.
    pub(crate) queue: Semaphore,
    /// Bumped on every wake-up for the lock (and after a subscriber reconnect).
    wake: watch::Sender<u64>,
    /// Local tasks between [`Wakeups::join`] and the drop of their [`Waiting`]; changed under the map lock.
    waiters: AtomicUsize,
    /// A wake-up (and so a reservation in Redis) arrived that no local grant has used yet.
    woken: AtomicBool,
}

impl LocalLock {
    fn bump(&self) {
        self.wake.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// The client's side of the subscriber task.
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
    redis: redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// Dropped with the client, which ends the task.
    task: Mutex<Option<oneshot::Sender<()>>>,
}

struct Shared {
    /// Lock key → local waiters, for every lock some local task waits on now.
    locals: Mutex<HashMap<String, Arc<LocalLock>>>,
    /// True while our channel is subscribed on a live connection.
    subscribed: watch::Sender<bool>,
    /// Counts every wake-up delivered and every reconnect, for [`Wakeups::epoch`].
    epoch: AtomicU64,
    client_id: String,
    /// Every client's channel starts with this; ours is `channel_prefix + client_id`.
    channel_prefix: String,
    conn: Conn,
}

impl Shared {
    fn locals(&self) -> MutexGuard<'_, HashMap<String, Arc<LocalLock>>> {
        self.locals.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for local in self.locals().values() {
            local.bump();
        }
    }

    /// Hands the reservation this client got for `lock_key` to the next waiting client (in the background).
    fn pass_on(self: &Arc<Self>, lock_key: &str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = Arc::clone(self);
        let lock_key = lock_key.to_owned();
        runtime.spawn(async move {
            let reply: redis::RedisResult<i64> = PASS_ON
                .key(&lock_key)
                .key(queue_of(&lock_key))
                .key(waiters_of(&lock_key))
                .arg(&shared.client_id)
                .arg(&shared.channel_prefix)
                .invoke_async(&mut shared.conn.clone())
                .await;
            if let Err(err) = reply {
                tracing::debug!(lock = %lock_key, error = %err, "passing a wake-up on failed; it lapses");
            }
        });
    }
}

/// A local task's registration as a waiter of one lock.
pub(crate) struct Waiting {
    pub(crate) local: Arc<LocalLock>,
    lock_key: String,
    shared: Arc<Shared>,
}

impl Waiting {
    /// A receiver of the lock's wake-ups. Mark it seen *before* each acquire attempt, then wait on `changed()`.
    pub(crate) fn wakeups(&self) -> watch::Receiver<u64> {
        self.local.wake.subscribe()
    }

    /// The wait ended in a grant: any reservation for this client was used.
    pub(crate) fn granted(&self) {
        self.local.woken.store(false, Ordering::Release);
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        // Under the map lock, as in `Task::deliver`: a wake-up either finds this lock's entry (and sets `woken`
        // before we look at it here) or finds it gone (and passes the turn on itself). Never neither.
        let unused_wakeup = {
            let mut map = self.shared.locals();
            let last = self.local.waiters.fetch_sub(1, Ordering::AcqRel) == 1;
            if last {
                map.remove(&self.lock_key);
            }
            last && self.local.woken.swap(false, Ordering::AcqRel)
        };
        // The last local waiter leaves with a reservation unused: give the turn to the next client now rather
        // than let it lapse.
        if unused_wakeup {
            self.shared.pass_on(&self.lock_key);
        }
    }
}

impl Wakeups {
    pub(crate) fn new(
        redis: redis::Client,
        conn: Conn,
        prefix: &str,
        client_id: String,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Wakeups {
        Wakeups {
            shared: Arc::new(Shared {
                locals: Mutex::new(HashMap::new()),
                subscribed: watch::channel(false).0,
                epoch: AtomicU64::new(0),
                client_id,
                channel_prefix: format!("{prefix}:wake:"),
                conn,
            }),
            redis,
            connect_timeout,
            response_timeout,
            task: Mutex::new(None),
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

    /// A value that changes whenever a wake-up could have been missed by a task that was not yet registered with
    /// [`Wakeups::join`]: any delivery, any reconnect. `None` while not subscribed.
    pub(crate) fn epoch(&self) -> Option<u64> {
        let epoch = self.shared.epoch.load(Ordering::Acquire);
        (*self.shared.subscribed.borrow()).then_some(epoch)
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
                    woken: AtomicBool::new(false),
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

    /// Returns once this client's channel is subscribed, or after the response timeout if it cannot be (then
    /// waiters still wake at the holder's lease end). Starts the subscriber task on first use.
    ///
    /// Must run inside a tokio runtime.
    pub(crate) async fn ready(&self) {
        let mut subscribed = self.shared.subscribed.subscribe();
        if *subscribed.borrow_and_update() {
            return;
        }
        self.start();
        let wait = subscribed.wait_for(|&s| s);
        if tokio::time::timeout(self.response_timeout, wait)
            .await
            .is_err()
        {
            tracing::debug!("wake-up channel not subscribed in time; waiting on lease ends");
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
            redis: self.redis.clone(),
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
        };
        tokio::spawn(async move {
            // Whatever ends this task (the client dropped, or its runtime shutting down and dropping it), the flag
            // must not keep saying "subscribed": a client used from another runtime later starts a new task.
            let _unsubscribed = Unsubscribed(Arc::clone(&task.shared));
            tokio::select! {
                () = task.run() => {}
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
        self.0.bump_all();
    }
}

struct Task {
    shared: Arc<Shared>,
    redis: redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Task {
    async fn run(self) {
        let channel = format!("{}{}", self.shared.channel_prefix, self.shared.client_id);
        let mut backoff = RECONNECT_MIN;
        loop {
            match tokio::time::timeout(self.connect_timeout, self.redis.get_async_pubsub()).await {
                Ok(Ok(pubsub)) => {
                    backoff = RECONNECT_MIN;
                    self.serve(pubsub, &channel).await;
                    self.shared.subscribed.send_replace(false);
                    // Wake-ups sent while we were away are lost: let every waiter look again.
                    self.shared.bump_all();
                }
                Ok(Err(err)) => tracing::debug!(error = %err, "subscriber connection failed"),
                Err(_) => tracing::debug!("subscriber connection timed out"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RECONNECT_MAX);
        }
    }

    /// Serves one connection until it fails.
    async fn serve(&self, pubsub: redis::aio::PubSub, channel: &str) {
        let (mut sink, mut stream) = pubsub.split();
        if !self.confirm(sink.subscribe(channel)).await {
            return;
        }
        self.shared.subscribed.send_replace(true);
        // Anything published before this subscription was missed: let every waiter look again.
        self.shared.bump_all();
        let mut pings = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
        loop {
            tokio::select! {
                message = stream.next() => match message {
                    Some(message) => match message.get_payload::<String>() {
                        Ok(lock_key) => self.deliver(&lock_key),
                        Err(err) => tracing::warn!(error = %err, "unreadable wake-up message"),
                    },
                    None => return,
                },
                _ = pings.tick() => {
                    // A blackholed connection never reports its end: a ping notices it.
                    if !self.confirm(sink.ping::<redis::Value>()).await {
                        return;
                    }
                }
            }
        }
    }

    fn deliver(&self, lock_key: &str) {
        self.shared.epoch.fetch_add(1, Ordering::AcqRel);
        // `woken` is set under the map lock, so the last local waiter leaving (see `Waiting::drop`) either sees it
        // set and passes the turn on, or has already removed the entry, and then we pass it on here.
        let found = {
            let map = self.shared.locals();
            match map.get(lock_key) {
                Some(local) => {
                    local.woken.store(true, Ordering::Release);
                    local.bump();
                    true
                }
                None => false,
            }
        };
        if !found {
            self.shared.pass_on(lock_key);
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
