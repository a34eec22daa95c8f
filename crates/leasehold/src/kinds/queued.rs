//! The engine of the queued lock kinds ([`FairMutex`](crate::FairMutex), [`RwLock`](crate::RwLock),
//! [`Semaphore`](crate::Semaphore)): one acquire-and-wait written once, each kind bringing only its hold's tag (what
//! it asks for) and, for the semaphore, its permit count. The admission rule lives in `scripts/set.lua`.
//!
//! Unlike the [`Mutex`](crate::Mutex), whose queue has one entry per client, every waiting *task* has its own entry
//! in the lock's queue, so that grants follow the order of arrival at Redis across every waiter of every process.
//! What follows a grant (the lease, its keeper, the loss signal, the guard, release, hand-off routing) is the mutex's,
//! unchanged: a hold `"<tag> <token>"` travels where a mutex's token does.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::redis::batch::{self, Coalescer, Failure, Item};
use crate::backend::redis::conn::{ReplicaAcks, Sent};
use crate::backend::redis::foreign::{explain_foreign, foreign, not_a_lock};
use crate::backend::redis::keys::{millis, LockKeys};
use crate::backend::redis::scripts::{Numbers, ScriptCall, CLAIM, HEARTBEAT, LEAVE, SET_ACQUIRE};
use crate::backend::redis::store::RedisStore;
use crate::backend::redis::wake::Expecting;
use crate::client::{Client, LockInfo};
use crate::error::{Error, InvalidArgument};
use crate::fence::new_token;
use crate::kinds::guard::{add_lock_keys, release_in_background, Guard as MutexGuard};
use crate::kinds::mutex::{
    acquire_call_outcomes, check_options, is_server_error, new_guard, release_orphaned,
    take_hand_off, unreplicated, until, AcquireReply, Expiry, Outage, Renewal,
};

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::queued=debug`).
const TARGET: &str = "leasehold::queued";

/// The options every queued kind shares, and the lock it names.
#[derive(Clone, Debug)]
pub(crate) struct Queued {
    pub(crate) client: Client,
    pub(crate) keys: Result<Arc<LockKeys>, InvalidArgument>,
    pub(crate) ttl: Duration,
    pub(crate) renewal: Renewal,
    pub(crate) description: Option<Arc<str>>,
    pub(crate) fail_fast: bool,
}

/// What one acquisition asks for: its hold's tag (`x`, `r`, `w`, `s<k>`: see `set.lua`) and the permit count it
/// counts against (semaphores; 0 otherwise).
#[derive(Clone, Debug)]
pub(crate) struct Ask {
    pub(crate) tag: String,
    pub(crate) limit: u64,
}

/// How an attempt relates to waiting (`set_acquire.lua`'s mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Try,
    First,
    Again,
}

enum Attempt {
    Granted(MutexGuard),
    Busy(Option<Duration>),
}

impl Queued {
    pub(crate) fn new(client: Client, name: &str) -> Queued {
        let keys = LockKeys::new(client.prefix(), name);
        Queued {
            client,
            keys,
            ttl: crate::kinds::mutex::DEFAULT_TTL,
            renewal: Renewal::Auto,
            description: None,
            fail_fast: false,
        }
    }

    pub(crate) fn name(&self) -> &str {
        match &self.keys {
            Ok(keys) => keys.name(),
            Err(_) => "",
        }
    }

    pub(crate) fn renew_interval(&self) -> Option<Duration> {
        match self.renewal {
            Renewal::Auto => Some(self.ttl / 3),
            Renewal::Every(every) => Some(every),
            Renewal::Off => None,
        }
    }

    pub(crate) fn checked(&self) -> Result<Arc<LockKeys>, Error> {
        check_options(
            &self.keys,
            self.ttl,
            self.description.as_deref(),
            self.renew_interval(),
        )
    }

    /// Waits for `ask`, runs `work` under the grant and releases it (see `guard::run_held`).
    pub(crate) async fn run<F, Fut>(&self, ask: &Ask, work: F) -> Result<Fut::Output, Error>
    where
        F: FnOnce(crate::Lease) -> Fut,
        Fut: std::future::Future,
    {
        crate::kinds::guard::run_held(self.acquire(ask, None).await?, work).await
    }

    /// The lock's state, as [`Client::inspect`] reads it.
    pub(crate) async fn inspect(&self) -> Result<LockInfo, Error> {
        self.keys.clone()?;
        self.client.inspect(self.name()).await
    }

    /// Removes every hold, as [`Client::force_release`] does.
    pub(crate) async fn force_release(&self) -> Result<Option<String>, Error> {
        self.keys.clone()?;
        self.client.force_release(self.name()).await
    }

    /// One try: granted only when the lock admits `ask` and nobody live waits.
    pub(crate) async fn try_acquire(&self, ask: &Ask) -> Result<MutexGuard, Error> {
        let keys = self.checked()?;
        #[cfg(feature = "etcd")]
        if let Some(etcd) = self.client.etcd() {
            return self
                .on_etcd(etcd, keys, ask, crate::backend::etcd::store::Wait::Try)
                .await;
        }
        match self.attempt(&keys, ask, Mode::Try, None, "", None).await? {
            Attempt::Granted(guard) => Ok(guard),
            Attempt::Busy(remaining) => Err(Error::Busy {
                name: keys.name().to_owned(),
                remaining,
            }),
        }
    }

    /// Waits in the lock's queue until `ask` is granted, or `deadline`.
    pub(crate) async fn acquire(
        &self,
        ask: &Ask,
        deadline: Option<Instant>,
    ) -> Result<MutexGuard, Error> {
        let keys = self.checked()?;
        let (kind, what) = crate::engine::trace::of_tag(&ask.tag);
        let span =
            crate::engine::trace::kind_span!(kind, "acquire", lock = %keys.name(), hold = %what);
        let started = Instant::now();
        let result =
            tracing::Instrument::instrument(self.wait(keys.clone(), ask, deadline), span).await;
        match &result {
            Ok(_) => crate::engine::metrics::granted(started.elapsed()),
            Err(Error::Timeout { .. }) => crate::engine::metrics::timed_out(),
            Err(_) => {}
        }
        result
    }

    /// An acquisition on etcd: a waiter key of the kind `ask` maps to, whose value is the hold.
    #[cfg(feature = "etcd")]
    async fn on_etcd(
        &self,
        etcd: &crate::backend::etcd::store::EtcdStore,
        keys: Arc<LockKeys>,
        ask: &Ask,
        wait: crate::backend::etcd::store::Wait,
    ) -> Result<MutexGuard, Error> {
        if self.renewal == Renewal::Off {
            return Err(crate::backend::etcd::store::no_fixed_lease(keys.name()));
        }
        let kind = crate::backend::etcd::store::kind_of_tag(&ask.tag, ask.limit, keys.name())?;
        let hold = format!("{} {}", ask.tag, new_token(self.description.as_deref())?);
        etcd.acquire(&self.client, keys, kind, hold, wait, self.fail_fast)
            .await
    }

    async fn wait(
        &self,
        keys: Arc<LockKeys>,
        ask: &Ask,
        deadline: Option<Instant>,
    ) -> Result<MutexGuard, Error> {
        #[cfg(feature = "etcd")]
        if let Some(etcd) = self.client.etcd() {
            return self
                .on_etcd(
                    etcd,
                    keys,
                    ask,
                    crate::backend::etcd::store::Wait::Until(deadline),
                )
                .await;
        }
        let started = Instant::now();
        let inner = self.client.redis()?;
        let wakeups = &inner.wakeups;
        let timed_out = |outage: &mut Outage| {
            outage.take().unwrap_or_else(|| Error::Timeout {
                name: keys.name().to_owned(),
                waited: started.elapsed(),
            })
        };
        let mut outage = Outage::default();
        // Subscribed before the first attempt: a release that finds nobody listening on our channel skips our entry.
        let waiting = wakeups.join(&keys.lock);
        let mut wake = waiting.wakeups();
        if until(deadline, wakeups.ready(&keys.lock)).await.is_none() {
            return Err(timed_out(&mut outage));
        }
        let wid = format!(
            "{}/{}",
            wakeups.client_id(),
            inner.waits.fetch_add(1, Ordering::Relaxed)
        );
        let mut leave = Leave {
            inner: Arc::clone(inner),
            keys: Arc::clone(&keys),
            wid: wid.clone(),
            armed: true,
        };
        let mut expecting = wakeups.expecting(&keys);
        let mut mode = Mode::First;
        loop {
            let mut prev = expecting.last().map(str::to_owned);
            if let Some((handed, sent)) = expecting.handed() {
                match take_hand_off(
                    &self.client,
                    &keys,
                    &mut expecting,
                    handed,
                    sent,
                    (self.ttl, self.renew_interval()),
                ) {
                    Ok(guard) => {
                        leave.armed = false;
                        return Ok(guard);
                    }
                    Err(hold) => prev = Some(hold),
                }
            }
            wake.borrow_and_update();
            let attempt = self.attempt(
                &keys,
                ask,
                mode,
                prev.as_deref(),
                &wid,
                Some(&mut expecting),
            );
            let remaining = match until(deadline, attempt).await {
                Some(Ok(Attempt::Granted(guard))) => {
                    leave.armed = false;
                    outage.over(&keys);
                    return Ok(guard);
                }
                Some(Ok(Attempt::Busy(remaining))) => {
                    outage.over(&keys);
                    if let Some(hold) = prev.as_deref() {
                        expecting.drop_handed(hold);
                    }
                    mode = Mode::Again;
                    remaining
                }
                Some(Err(err)) => outage.ride(err, &keys, self.fail_fast)?,
                None => return Err(timed_out(&mut outage)),
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(timed_out(&mut outage));
            }
            // Granted by a release (a message), or look again when the first hold's lease ends, and at least every
            // heartbeat, which keeps our queue entry live and bounds the cost of a lost message.
            let next = now
                + remaining
                    .unwrap_or(HEARTBEAT)
                    .clamp(Duration::from_millis(1), HEARTBEAT);
            let wake_at = deadline.map_or(next, |d| d.min(next));
            tokio::select! {
                () = expecting.arrived() => {}
                _ = wake.changed() => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// One attempt with a fresh hold (coalesced with other tasks' attempts when calls are out: see `batch.rs`).
    async fn attempt(
        &self,
        keys: &Arc<LockKeys>,
        ask: &Ask,
        mode: Mode,
        prev: Option<&str>,
        wid: &str,
        expecting: Option<&mut Expecting>,
    ) -> Result<Attempt, Error> {
        let inner = self.client.redis()?;
        let hold = format!("{} {}", ask.tag, new_token(self.description.as_deref())?);
        let sent = crate::engine::clock::now();
        let expecting = match expecting {
            Some(expecting) if mode != Mode::Try => {
                expecting.add(&hold, sent);
                Some(expecting)
            }
            _ => None,
        };
        let item = SetAcquireItem {
            keys: Arc::clone(keys),
            hold: hold.clone(),
            ttl: self.ttl,
            mode,
            prev: prev.map(str::to_owned),
            wid: wid.to_owned(),
            limit: ask.limit,
        };
        let (code, value, run, left) = match batch::run(inner, item).await {
            Ok(outcome) => outcome,
            Err(Failure { err, reached }) => {
                let err = not_a_lock(err, &keys.lock);
                // As for the mutex: an attempt that may have run may have granted, or stored the hold for a release
                // to grant later. It is released, and never taken by this wait from now on.
                if reached && !matches!(err, Error::NotALock { .. }) && !is_server_error(&err) {
                    if let Some(expecting) = expecting {
                        expecting.drop_handed(&hold);
                    }
                    release_in_background(Arc::clone(inner), Arc::clone(keys), hold, self.ttl);
                }
                return Err(explain_foreign(&inner.conn, &keys.lock, err).await);
            }
        };
        let expiry = |handed: bool| Expiry::replied(sent, left, run, handed);
        let granted = |hold: String, handed: bool, route: Option<u128>| {
            Attempt::Granted(new_guard(
                &self.client,
                keys,
                hold,
                value,
                (self.ttl, self.renew_interval()),
                expiry(handed),
                route,
            ))
        };
        match code {
            1 => {
                let route = expecting.and_then(|e| e.taken(&hold));
                Ok(granted(hold, false, route))
            }
            2 => {
                let prev = prev.unwrap_or_default().to_owned();
                let route = expecting.and_then(|e| e.taken(&prev));
                Ok(granted(prev, true, route))
            }
            0 => {
                crate::engine::metrics::busy();
                Ok(Attempt::Busy(
                    u64::try_from(value).ok().map(Duration::from_millis),
                ))
            }
            101 | 102 => {
                let granted = if code == 101 {
                    hold
                } else {
                    prev.unwrap_or_default().to_owned()
                };
                Err(unreplicated(
                    inner, keys, expecting, granted, self.ttl, value,
                ))
            }
            -2 => Err(Error::NotALock {
                key: keys.fence().to_string(),
                detail: "the fence counter is not a number".to_owned(),
            }),
            -5 => Err(Error::WrongPermits {
                name: keys.name().to_owned(),
                asked: ask.limit,
                stored: u64::try_from(value).unwrap_or(0),
            }),
            // -1, -3: the name holds a lock of another kind, or something leasehold did not write.
            _ => Err(explain_foreign(&inner.conn, &keys.lock, foreign(&keys.lock, "")).await),
        }
    }
}

/// A wait that ended without a grant leaves the lock's queue at once, in the background (a drop guard, so a dropped
/// wait leaves too). A hold a release granted it meanwhile is released by the hand-off routing (`Expecting`'s drop,
/// or the subscriber when the message comes later) or by the coalescer (an attempt that was out).
struct Leave {
    inner: Arc<RedisStore>,
    keys: Arc<LockKeys>,
    wid: String,
    armed: bool,
}

impl Drop for Leave {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the entry stops counting after its liveness window
        };
        let inner = Arc::clone(&self.inner);
        let keys = Arc::clone(&self.keys);
        let wid = std::mem::take(&mut self.wid);
        runtime.spawn(async move {
            let mut invocation = ScriptCall::new(&LEAVE, 5);
            add_lock_keys(&mut invocation, &keys);
            invocation
                .arg(inner.wakeups.channel_prefix())
                .arg(millis(inner.fence_retention))
                .arg(wid.as_str());
            let reply: redis::RedisResult<i64> = inner.conn.invoke_idempotent(&invocation).await;
            if let Err(err) = reply {
                tracing::debug!(target: TARGET, lock = %keys.name(), error = %err, "leaving the queue failed; the entry lapses");
            }
        });
    }
}

/// One attempt of a queued kind, as the coalescer carries it.
pub(crate) struct SetAcquireItem {
    keys: Arc<LockKeys>,
    hold: String,
    ttl: Duration,
    mode: Mode,
    prev: Option<String>,
    wid: String,
    limit: u64,
}

impl Item for SetAcquireItem {
    /// As `acquire.lua`'s: code, fence (or ms until the first hold ends), server µs, ms left.
    type Outcome = AcquireReply;

    fn coalescer(inner: &RedisStore) -> &Coalescer<Self> {
        &inner.set_acquires
    }

    fn slot(&self) -> u16 {
        self.keys.slot()
    }

    fn script(inner: &RedisStore, items: &[Self]) -> ScriptCall {
        let mut invocation = ScriptCall::new(&SET_ACQUIRE, 4 * items.len());
        for item in items {
            invocation
                .key(&item.keys.lock)
                .key(item.keys.fence())
                .key(item.keys.queue())
                .key(item.keys.waiters());
        }
        invocation
            .arg(millis(inner.fence_retention))
            .arg(inner.wakeups.client_id())
            .arg(inner.wakeups.channel_prefix());
        for item in items {
            invocation
                .arg(item.hold.as_str())
                .arg(millis(item.ttl))
                .arg(match item.mode {
                    Mode::Try => "0",
                    Mode::First => "1",
                    Mode::Again => "2",
                })
                .arg(millis(item.ttl.min(CLAIM)))
                .arg(item.prev.as_deref().unwrap_or(""))
                .arg(item.wid.as_str())
                .arg(item.limit);
        }
        invocation
    }

    fn acks(inner: &RedisStore) -> Option<ReplicaAcks> {
        inner.replicas
    }

    fn outcomes(
        items: &[Self],
        sent: Sent<Numbers>,
        inner: &RedisStore,
    ) -> Result<Vec<AcquireReply>, Failure> {
        acquire_call_outcomes(items.len(), sent, inner)
    }

    fn orphaned(self, inner: &Arc<RedisStore>, outcome: Option<AcquireReply>) {
        release_orphaned(inner, &self.keys, self.hold, self.prev, self.ttl, outcome);
    }
}

/// The options every queued kind's handle has, as the [`Mutex`](crate::Mutex)'s, and the name-level calls (`inspect`,
/// `is_locked`, `force_release`), written once.
macro_rules! queued_options {
    ($kind:ident) => {
        impl $kind {
            /// Ends a wait at the first Redis error instead of riding it out, as
            /// [`Mutex::fail_fast`](crate::Mutex::fail_fast) does.
            pub fn fail_fast(mut self) -> $kind {
                self.queued.fail_fast = true;
                self
            }

            /// Attaches a short description of the holder to every grant of this handle, as
            /// [`Mutex::describe`](crate::Mutex::describe) does (1 to 256 bytes, no control characters).
            pub fn describe(mut self, description: impl Into<String>) -> $kind {
                self.queued.description = Some(std::sync::Arc::from(description.into()));
                self
            }

            /// The lease of each grant: between [`MIN_TTL`](crate::MIN_TTL) (10 ms) and
            /// [`MAX_TTL`](crate::MAX_TTL) (30 days). Defaults to 30 s.
            pub fn ttl(mut self, ttl: std::time::Duration) -> $kind {
                self.queued.ttl = ttl;
                self
            }

            /// How often the keeper renews a held lease; shorter than the lease minus its drift allowance.
            /// Defaults to a third of the lease.
            pub fn renew_every(mut self, every: std::time::Duration) -> $kind {
                self.queued.renewal = crate::kinds::mutex::Renewal::Every(every);
                self
            }

            /// No watchdog: each grant ends after its lease unless [`Guard::extend`](crate::Guard::extend) moves
            /// it.
            pub fn fixed_lease(mut self) -> $kind {
                self.queued.renewal = crate::kinds::mutex::Renewal::Off;
                self
            }

            /// The lock's name.
            pub fn name(&self) -> &str {
                self.queued.name()
            }

            /// The lock's state (every live hold, the last fence, the live waiters, a semaphore's capacity), read in
            /// one atomic step: the same as [`Client::inspect`](crate::Client::inspect) for this lock's name.
            ///
            /// # Errors
            ///
            /// As [`Client::inspect`](crate::Client::inspect).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only reads.
            pub async fn inspect(&self) -> Result<crate::LockInfo, crate::Error> {
                self.queued.inspect().await
            }

            /// Whether the lock has a live hold right now (for a read-write lock or a semaphore: any reader, writer
            /// or permit holder), in one read; by the time you act on it, that may have changed.
            ///
            /// # Errors
            ///
            /// As [`Client::inspect`](crate::Client::inspect).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only reads.
            pub async fn is_locked(&self) -> Result<bool, crate::Error> {
                Ok(self.queued.inspect().await?.holder.is_some())
            }

            /// Removes every hold of the lock whoever holds it and serves its queue: the same as
            /// [`Client::force_release`](crate::Client::force_release) for this lock's name (an operator's escape
            /// hatch; each holder, if alive, loses its lease at its next renewal). Returns the token of the hold
            /// whose lease would have ended first, or `None` when the lock was free.
            ///
            /// # Errors
            ///
            /// As [`Client::force_release`](crate::Client::force_release).
            ///
            /// # Cancel safety
            ///
            /// Not cancel safe in the sense that a dropped call may still have removed the holds.
            pub async fn force_release(&self) -> Result<Option<String>, crate::Error> {
                self.queued.force_release().await
            }
        }
    };
}
pub(crate) use queued_options;

/// The deadline `timeout` from now (`None`: too far to represent, i.e. never).
pub(crate) fn deadline_in(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}
