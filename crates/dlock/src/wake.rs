//! Event-driven waiting: one subscriber connection per client fans release wake-ups out to local waiters.
//!
//! # Why pub/sub and not a hand-off list
//!
//! A hand-off list (`BLPOP` on a per-lock list that the release pushes to) wakes exactly one waiter, but it needs a
//! blocking connection per waiting lock, and pushed tokens outlive waiters that gave up (a later waiter then wakes
//! for a release that happened long ago). Pub/sub needs one connection per client however many locks it waits for,
//! costs the release one `PUBLISH`, and leaves nothing behind in Redis. Its weakness, lost messages (a reconnect, a
//! slow subscriber), is bounded: every waiter also sleeps at most the holder's remaining lease, which the failed
//! acquire reported, so a lost message costs at most one lease, never a hang.
//!
//! # No stampede
//!
//! Waiters of one lock in one process queue on a local FIFO semaphore ([`LocalLock::queue`]): only its head
//! contends in Redis, so a release costs O(1) acquire attempts per process however many tasks wait.
//!
//! # Lifecycle
//!
//! The task connects lazily on the first wait, re-subscribes every channel after a reconnect and then wakes
//! every waiter (a release may have been missed while it was away), pings the connection to notice a dead peer,
//! and unsubscribes a lock's channel once no local task has waited on it for [`LINGER`]. It ends when the client
//! is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::time::Instant;

/// How long a channel stays subscribed after its last local waiter left. Keeps a steadily contended lock from
/// paying a SUBSCRIBE round trip per wait.
pub(crate) const LINGER: Duration = Duration::from_secs(2);
/// Reconnect backoff bounds for the subscriber connection.
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// This process's view of one lock's waiters.
pub(crate) struct LocalLock {
    /// One permit: the local waiter holding it is the only one contending in Redis.
    pub(crate) queue: Semaphore,
    /// Bumped on every wake-up message for the lock (and after a subscriber reconnect).
    wake: watch::Sender<u64>,
    /// True while the channel is confirmed subscribed on the current subscriber connection.
    subscribed: AtomicBool,
    /// Local tasks between [`Wakeups::join`] and the drop of their [`Waiting`]; changed under the map lock.
    waiters: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl LocalLock {
    fn new() -> LocalLock {
        LocalLock {
            queue: Semaphore::new(1),
            wake: watch::channel(0).0,
            subscribed: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }

    fn bump(&self) {
        self.wake.send_modify(|n| *n = n.wrapping_add(1));
    }
}

enum Command {
    Subscribe {
        channel: String,
        local: Arc<LocalLock>,
        done: oneshot::Sender<()>,
    },
}

/// The client's side of the subscriber task.
pub(crate) struct Wakeups {
    redis: redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
    shared: Arc<Shared>,
    commands: Mutex<Option<mpsc::UnboundedSender<Command>>>,
}

struct Shared {
    /// Channel name → local state, for every lock some local task waits on or waited on within [`LINGER`].
    locals: Mutex<HashMap<String, Arc<LocalLock>>>,
}

impl Shared {
    fn locals(&self) -> MutexGuard<'_, HashMap<String, Arc<LocalLock>>> {
        self.locals.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A local task's registration as a waiter of one lock; leaving (drop) starts the linger clock.
pub(crate) struct Waiting {
    pub(crate) local: Arc<LocalLock>,
    shared: Arc<Shared>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let _map = self.shared.locals();
        if self.local.waiters.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self
                .local
                .idle_since
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    }
}

impl Waiting {
    /// A receiver of the lock's wake-ups. Mark it seen *before* each acquire attempt, then wait on `changed()`.
    pub(crate) fn wakeups(&self) -> watch::Receiver<u64> {
        self.local.wake.subscribe()
    }
}

impl Wakeups {
    pub(crate) fn new(
        redis: redis::Client,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Wakeups {
        Wakeups {
            redis,
            connect_timeout,
            response_timeout,
            shared: Arc::new(Shared {
                locals: Mutex::new(HashMap::new()),
            }),
            commands: Mutex::new(None),
        }
    }

    /// Registers the calling task as a waiter of the lock with this wake-up channel.
    pub(crate) fn join(&self, channel: &str) -> Waiting {
        let mut map = self.shared.locals();
        let local = match map.get(channel) {
            Some(local) => Arc::clone(local),
            None => {
                let local = Arc::new(LocalLock::new());
                map.insert(channel.to_owned(), Arc::clone(&local));
                local
            }
        };
        local.waiters.fetch_add(1, Ordering::AcqRel);
        Waiting {
            local,
            shared: Arc::clone(&self.shared),
        }
    }

    /// Makes sure wake-ups for `channel` reach `waiting`. Returns once the subscription is confirmed, or once it
    /// could not be made within the response timeout; then the waiter still wakes at the holder's lease end.
    ///
    /// Must run inside a tokio runtime (it may start the subscriber task).
    pub(crate) async fn subscribe(&self, channel: &str, waiting: &Waiting) {
        if waiting.local.subscribed.load(Ordering::Acquire) {
            return;
        }
        let (done, confirmed) = oneshot::channel();
        let command = Command::Subscribe {
            channel: channel.to_owned(),
            local: Arc::clone(&waiting.local),
            done,
        };
        if self.sender().send(command).is_err() {
            return;
        }
        if tokio::time::timeout(self.response_timeout, confirmed)
            .await
            .is_err()
        {
            tracing::debug!(
                channel,
                "wake-up subscription not confirmed in time; waiting on lease ends"
            );
        }
    }

    fn sender(&self) -> mpsc::UnboundedSender<Command> {
        let mut slot = self.commands.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            Some(sender) if !sender.is_closed() => sender.clone(),
            _ => {
                let (sender, receiver) = mpsc::unbounded_channel();
                let task = Task {
                    redis: self.redis.clone(),
                    connect_timeout: self.connect_timeout,
                    response_timeout: self.response_timeout,
                    shared: Arc::clone(&self.shared),
                    channels: HashMap::new(),
                };
                tokio::spawn(task.run(receiver));
                *slot = Some(sender.clone());
                sender
            }
        }
    }
}

struct Task {
    redis: redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
    shared: Arc<Shared>,
    /// Channels this task has been asked to deliver, subscribed or to be subscribed after a reconnect.
    channels: HashMap<String, Arc<LocalLock>>,
}

enum Outcome {
    Disconnected,
    Closed,
}

impl Task {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut backoff = RECONNECT_MIN;
        loop {
            let connected =
                tokio::time::timeout(self.connect_timeout, self.redis.get_async_pubsub()).await;
            match connected {
                Ok(Ok(pubsub)) => {
                    backoff = RECONNECT_MIN;
                    match self.serve(pubsub, &mut commands).await {
                        Outcome::Closed => return,
                        Outcome::Disconnected => self.disconnected(),
                    }
                }
                Ok(Err(err)) => tracing::debug!(error = %err, "subscriber connection failed"),
                Err(_) => tracing::debug!("subscriber connection timed out"),
            }
            // Keep answering subscribe requests while away, so no waiter blocks on us.
            let retry_at = Instant::now() + backoff;
            backoff = (backoff * 2).min(RECONNECT_MAX);
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(retry_at) => break,
                    command = commands.recv() => match command {
                        None => return,
                        Some(command) => self.accept(command),
                    },
                }
            }
        }
    }

    /// Records a subscribe request without a connection: it is served after the reconnect.
    fn accept(&mut self, command: Command) {
        let Command::Subscribe {
            channel,
            local,
            done,
        } = command;
        self.channels.insert(channel, local);
        let _ = done.send(());
    }

    fn disconnected(&mut self) {
        for local in self.channels.values() {
            local.subscribed.store(false, Ordering::Release);
            local.bump();
        }
    }

    async fn serve(
        &mut self,
        pubsub: redis::aio::PubSub,
        commands: &mut mpsc::UnboundedReceiver<Command>,
    ) -> Outcome {
        let (mut sink, mut stream) = pubsub.split();
        self.sweep_idle();
        if !self.channels.is_empty() {
            let all: Vec<&String> = self.channels.keys().collect();
            if !self.confirm(sink.subscribe(all)).await {
                return Outcome::Disconnected;
            }
        }
        // Anything published while we were away is lost: let every waiter look again.
        for local in self.channels.values() {
            local.subscribed.store(true, Ordering::Release);
            local.bump();
        }
        let mut ticks = tokio::time::interval(LINGER);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                message = stream.next() => match message {
                    Some(message) => {
                        if let Some(local) = self.channels.get(message.get_channel_name()) {
                            local.bump();
                        }
                    }
                    None => return Outcome::Disconnected,
                },
                command = commands.recv() => match command {
                    None => return Outcome::Closed,
                    Some(Command::Subscribe { channel, local, done }) => {
                        let ok = local.subscribed.load(Ordering::Acquire)
                            || self.confirm(sink.subscribe(&channel)).await;
                        if ok {
                            local.subscribed.store(true, Ordering::Release);
                        }
                        self.channels.insert(channel, local);
                        let _ = done.send(());
                        if !ok {
                            return Outcome::Disconnected;
                        }
                    }
                },
                _ = ticks.tick() => {
                    let idle = self.sweep_idle();
                    if !idle.is_empty() && !self.confirm(sink.unsubscribe(idle)).await {
                        return Outcome::Disconnected;
                    }
                    // A blackholed connection never reports its end: a ping notices it.
                    if !self.confirm(sink.ping::<()>()).await {
                        return Outcome::Disconnected;
                    }
                }
            }
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

    /// Drops the locks no local task has waited on for [`LINGER`]; returns their channels.
    fn sweep_idle(&mut self) -> Vec<String> {
        let mut map = self.shared.locals();
        let now = Instant::now();
        let mut idle = Vec::new();
        map.retain(|channel, local| {
            let linger_over = local.waiters.load(Ordering::Acquire) == 0
                && now.duration_since(*local.idle_since.lock().unwrap_or_else(|e| e.into_inner()))
                    >= LINGER;
            if linger_over {
                local.subscribed.store(false, Ordering::Release);
                if self.channels.remove(channel).is_some() {
                    idle.push(channel.clone());
                }
            }
            !linger_over
        });
        idle
    }
}
