//! The non-reentrant mutex: options, the acquire script call, and waiting.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::redis::batch::{self, Coalescer, Failure, Item};
use crate::backend::redis::conn::{ReplicaAcks, Sent};
use crate::backend::redis::foreign::{explain_foreign, foreign, not_a_lock};
use crate::backend::redis::keys::{millis, LockKeys};
use crate::backend::redis::scripts::{Numbers, ScriptCall, ACQUIRE, CLAIM, HEARTBEAT};
use crate::backend::redis::store::RedisStore;
use crate::backend::redis::wake::{Expecting, Handed};
use crate::client::{Client, LockInfo};
use crate::engine::lease::{Lease, LeaseShared};
use crate::engine::ttl::{check_ttl, drift};
use crate::error::{require_runtime, Error, InvalidArgument};
use crate::fence::{check_description, new_token, Fence};
use crate::kinds::guard::{release_in_background, MutexGuard};

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::mutex=debug`).
const TARGET: &str = "leasehold::mutex";

/// Default lease: kept alive by the watchdog while the guard lives.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// A waiter whose holder reported no expiry (never the case for keys leasehold writes) looks again after this long.
const NO_TTL_RECHECK: Duration = Duration::from_secs(1);

/// A distributed, non-reentrant mutex on one Redis server: a handle to the lock called `name`.
///
/// Created by [`Client::mutex`]. The handle holds no lock itself; [`lock`](Mutex::lock),
/// [`lock_timeout`](Mutex::lock_timeout) and [`try_lock`](Mutex::try_lock) return a [`MutexGuard`] for one
/// grant. Cheap to clone.
///
/// Non-reentrant: a second `lock()` on the same name from the same task waits for the first guard like any other
/// owner would. Waiting clients are served in the order they started waiting: a release hands the lock directly to
/// the oldest (see the [crate docs](crate#waiting)), so a holder that releases and asks again cannot barge ahead.
/// Inside one process, waiters are served in FIFO order. A newcomer can still take a lock that is free with nobody
/// queued.
///
/// # Lease
///
/// By default a grant is a 30 s lease that the client's keeper renews every 10 s while the guard lives, so the work
/// may take as long as it needs and a crashed process frees the lock within 30 s. [`ttl`](Mutex::ttl),
/// [`renew_every`](Mutex::renew_every) and [`fixed_lease`](Mutex::fixed_lease) change that.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
/// use std::time::Duration;
///
/// let mutex = locks.mutex("reports:nightly").ttl(Duration::from_secs(10));
/// match mutex.try_lock().await {
///     Ok(guard) => {
///         // ... the critical section ...
///         guard.release().await?;
///     }
///     Err(e) if e.is_busy() => println!("someone else is on it"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Mutex {
    client: Client,
    keys: Result<Arc<LockKeys>, InvalidArgument>,
    ttl: Duration,
    renewal: Renewal,
    description: Option<Arc<str>>,
    fail_fast: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Every third of the lease.
    Auto,
    Every(Duration),
    Off,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("keys", &self.keys)
            .field("ttl", &self.ttl)
            .field("renewal", &self.renewal)
            .field("description", &self.description)
            .field("fail_fast", &self.fail_fast)
            .finish()
    }
}

/// How an attempt relates to waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// A single try: never join the queue.
    No,
    /// The first attempt of a wait: join the queue when busy.
    First,
    /// A later attempt: this client may be queued already, so a grant also takes it out of the queue.
    Queued,
}

/// The outcome of one acquire script call.
enum Attempt {
    Granted(MutexGuard),
    /// Held by another owner, with its remaining lease when it has one.
    Busy(Option<Duration>),
}

impl Mutex {
    pub(crate) fn new(client: Client, name: &str) -> Mutex {
        let keys = LockKeys::new(client.prefix(), name);
        Mutex {
            client,
            keys,
            ttl: DEFAULT_TTL,
            renewal: Renewal::Auto,
            description: None,
            fail_fast: false,
        }
    }

    /// Ends a wait ([`lock`](Mutex::lock), [`lock_timeout`](Mutex::lock_timeout), [`run`](Mutex::run)) at the
    /// first Redis error instead of riding it out.
    ///
    /// By default a wait survives a Redis restart or a short outage: a connection error, a timeout, or a server
    /// that answers `LOADING`, `BUSY`, `TRYAGAIN`, `MASTERDOWN` or `READONLY` is logged once (a `tracing` warning
    /// with target `leasehold::outage`) and the attempt is repeated with backoff (50 ms doubling to 1 s) until
    /// Redis answers or the wait's own deadline passes. The client's queue entry outlives an outage shorter than
    /// its liveness bound (3 s); after a restart that lost the data, the first answered attempt queues it again.
    /// Other errors (refused credentials or ACL permissions, a key that is not a lock, any other server error) end
    /// the wait at once either way. [`try_lock`](Mutex::try_lock) never retries.
    pub fn fail_fast(mut self) -> Mutex {
        self.fail_fast = true;
        self
    }

    /// Attaches a short description of the holder to every grant of this handle (who, where, doing what), for
    /// operators: [`Client::inspect`] returns it in [`Holder::description`](crate::Holder::description) and
    /// `leasehold status` and `leasehold list` print it. 1 to [`MAX_DESCRIPTION_LEN`](crate::MAX_DESCRIPTION_LEN)
    /// (256) bytes, no control characters; checked by the first operation ([`InvalidArgument::BadDescription`]).
    ///
    /// The description travels inside the owner token (after a space), so it costs no extra key or command, is gone
    /// the moment the grant is, and cannot be wrong about who holds the lock.
    pub fn describe(mut self, description: impl Into<String>) -> Mutex {
        self.description = Some(Arc::from(description.into()));
        self
    }

    /// The lease of each grant: between [`MIN_TTL`](crate::MIN_TTL) (10 ms) and [`MAX_TTL`](crate::MAX_TTL)
    /// (30 days). Defaults to 30 s.
    pub fn ttl(mut self, ttl: Duration) -> Mutex {
        self.ttl = ttl;
        self
    }

    /// How often the keeper renews a held lease; it must be shorter than the lease minus its drift allowance.
    /// Defaults to a third of the lease (10 s for the default 30 s).
    pub fn renew_every(mut self, every: Duration) -> Mutex {
        self.renewal = Renewal::Every(every);
        self
    }

    /// No watchdog: the lease ends after its TTL unless [`MutexGuard::extend`] moves it. The guard still reports
    /// the loss at its validity deadline.
    pub fn fixed_lease(mut self) -> Mutex {
        self.renewal = Renewal::Off;
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        match &self.keys {
            Ok(keys) => keys.name(),
            Err(_) => "",
        }
    }

    /// Tries once, without waiting.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when another owner holds the lock (with its remaining lease); [`Error::InvalidArgument`],
    /// [`Error::NotALock`], [`Error::Redis`] as their docs say.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped after the request left, a grant that lands anyway is released in the
    /// background (or lapses after one lease without a runtime).
    pub async fn try_lock(&self) -> Result<MutexGuard, Error> {
        let keys = self.checked()?;
        #[cfg(feature = "etcd")]
        if let Some(etcd) = self.client.etcd() {
            return self
                .on_etcd(etcd, keys, crate::backend::etcd::store::Wait::Try)
                .await;
        }
        let started = Instant::now();
        match self.attempt(&keys, Wait::No, None, None).await? {
            Attempt::Granted(guard) => {
                crate::engine::metrics::granted(started.elapsed());
                Ok(guard)
            }
            Attempt::Busy(remaining) => {
                tracing::debug!(target: TARGET, lock = %keys.name(), holder_lease_left = ?remaining, "busy");
                Err(Error::Busy {
                    name: keys.name().to_owned(),
                    remaining,
                })
            }
        }
    }

    /// Waits as long as it takes. Waiters are woken by the holder's release (never by polling) and look again at
    /// the latest when the holder's lease would end, so a crashed holder costs at most one lease.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`], [`Error::NotALock`], [`Error::NotPermitted`], and [`Error::Redis`] for a Redis
    /// error that does not pass by itself (refused credentials, an unexpected server error). A restart or outage
    /// (connection errors, timeouts, `LOADING`, ...) is ridden out with backoff unless [`fail_fast`](Mutex::fail_fast)
    /// is set.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves no lock behind (see [`try_lock`](Mutex::try_lock)) and gives up the
    /// place in the local queue.
    pub async fn lock(&self) -> Result<MutexGuard, Error> {
        self.acquire(None).await
    }

    /// Waits at most `timeout` (measured from the call).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time ran out while the lock was held; [`Error::Redis`] (the last error) when it
    /// ran out while Redis was unavailable; otherwise as for [`lock`](Mutex::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Mutex::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard, Error> {
        let deadline = Instant::now().checked_add(timeout);
        self.acquire(deadline).await
    }

    /// Waits at most `wait` for the lock, then holds it for a fixed lease of `hold`, never renewed: the one-call form
    /// of `mutex.ttl(hold).fixed_lease().lock_timeout(wait)`, for "at most one of us does this in the next `hold`"
    /// (rate limits, once-per-interval jobs). The lock frees itself `hold` after the grant unless released first;
    /// the guard's [`lost`](Lease::lost) fires just before, as for any lease. `wait` may be zero: one try.
    ///
    /// # Errors
    ///
    /// As [`lock_timeout`](Mutex::lock_timeout), and [`Error::InvalidArgument`] for a `hold` outside
    /// [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Mutex::lock).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// use std::time::Duration;
    ///
    /// // At most one reminder e-mail per customer per hour, whoever sends it.
    /// match locks.mutex("remind:42").wait_and_hold(Duration::ZERO, Duration::from_secs(3600)).await {
    ///     Ok(guard) => {
    ///         // ... send the e-mail ...
    ///         guard.leave_to_expire(); // keep the lock for its whole hour
    ///     }
    ///     Err(e) if e.is_busy() || e.is_timeout() => {} // sent within the hour already
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn wait_and_hold(&self, wait: Duration, hold: Duration) -> Result<MutexGuard, Error> {
        let mutex = self.clone().ttl(hold).fixed_lease();
        if wait.is_zero() {
            mutex.try_lock().await
        } else {
            mutex.lock_timeout(wait).await
        }
    }

    /// Waits for the lock, runs `work` while holding it, and releases it. `work` gets the [`Lease`] (for its fence)
    /// and is **dropped the moment the lease is lost**, in which case `run` returns [`Error::LeaseLost`].
    ///
    /// Dropping only cancels at the work's next `.await`: keep blocking code out of it, or check
    /// [`Lease::is_held`] between steps.
    ///
    /// # Errors
    ///
    /// As [`lock`](Mutex::lock); [`Error::LeaseLost`] when the lease ended during the work;
    /// [`Error::NotOwner`] when the work finished but the release found the lock no longer ours (then the work's
    /// output is discarded, because it ran without the lock for some time).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it drops the work and releases the lock in the background.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// let rows = locks
    ///     .mutex("nightly-export")
    ///     .run(|lease| async move {
    ///         // write with lease.fence() so a late writer is rejected
    ///         42
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<F, Fut>(&self, work: F) -> Result<Fut::Output, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future,
    {
        crate::kinds::guard::run_held(self.lock().await?, work).await
    }

    /// Whether some owner holds the lock right now (one read; by the time you act on it, that may have changed).
    ///
    /// # Errors
    ///
    /// As [`Client::inspect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn is_locked(&self) -> Result<bool, Error> {
        Ok(self.inspect().await?.holder.is_some())
    }

    /// The lock's state (holder, remaining lease, last fence, waiting clients), read in one atomic step: the same as
    /// [`Client::inspect`] for this lock's name.
    ///
    /// # Errors
    ///
    /// As [`Client::inspect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect(&self) -> Result<LockInfo, Error> {
        self.keys.clone()?;
        self.client.inspect(self.name()).await
    }

    /// Deletes the lock whoever holds it and wakes its waiters: the same as [`Client::force_release`] for this
    /// lock's name (an operator's escape hatch; the holder, if alive, loses its lease at its next renewal).
    ///
    /// # Errors
    ///
    /// As [`Client::force_release`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that a dropped call may still have deleted the lock.
    pub async fn force_release(&self) -> Result<Option<String>, Error> {
        self.keys.clone()?;
        self.client.force_release(self.name()).await
    }

    fn checked(&self) -> Result<Arc<LockKeys>, Error> {
        check_options(
            &self.keys,
            self.ttl,
            self.description.as_deref(),
            self.renew_interval(),
        )
    }

    /// The lease a grant of this handle keeps, and how often it is renewed.
    fn lease(&self) -> (Duration, Option<Duration>) {
        (self.ttl, self.renew_interval())
    }

    pub(crate) fn renew_interval(&self) -> Option<Duration> {
        match self.renewal {
            Renewal::Auto => Some(self.ttl / 3),
            Renewal::Every(every) => Some(every),
            Renewal::Off => None,
        }
    }

    async fn acquire(&self, deadline: Option<Instant>) -> Result<MutexGuard, Error> {
        let keys = self.checked()?;
        let span = tracing::debug_span!(target: TARGET, "acquire", lock = %keys.name());
        let started = Instant::now();
        let result =
            tracing::Instrument::instrument(self.acquire_in_span(keys, deadline), span).await;
        match &result {
            Ok(_) => crate::engine::metrics::granted(started.elapsed()),
            Err(Error::Timeout { .. }) => crate::engine::metrics::timed_out(),
            Err(_) => {}
        }
        result
    }

    /// An acquisition on etcd: an exclusive waiter key whose value is the token.
    #[cfg(feature = "etcd")]
    async fn on_etcd(
        &self,
        etcd: &crate::backend::etcd::store::EtcdStore,
        keys: Arc<LockKeys>,
        wait: crate::backend::etcd::store::Wait,
    ) -> Result<MutexGuard, Error> {
        if self.renewal == Renewal::Off {
            return Err(crate::backend::etcd::store::no_fixed_lease(keys.name()));
        }
        let token = new_token(self.description.as_deref())?;
        etcd.acquire(
            &self.client,
            keys,
            crate::backend::etcd::Kind::Exclusive,
            token,
            wait,
            self.fail_fast,
        )
        .await
    }

    async fn acquire_in_span(
        &self,
        keys: Arc<LockKeys>,
        deadline: Option<Instant>,
    ) -> Result<MutexGuard, Error> {
        #[cfg(feature = "etcd")]
        if let Some(etcd) = self.client.etcd() {
            return self
                .on_etcd(
                    etcd,
                    keys,
                    crate::backend::etcd::store::Wait::Until(deadline),
                )
                .await;
        }
        let started = Instant::now();
        let timed_out = || Error::Timeout {
            name: keys.name().to_owned(),
            waited: started.elapsed(),
        };
        let wakeups = &self.client.redis()?.wakeups;
        let epoch = wakeups.epoch();
        let mut outage = Outage::default();
        // Every token this wait sends may be stored for a hand-off: registered before it leaves.
        let mut expecting = wakeups.expecting(&keys);
        let first = self.attempt_until(&keys, Wait::First, None, &mut expecting, deadline);
        let mut remaining = match first.await {
            Some(Ok(Attempt::Granted(guard))) => return Ok(guard),
            Some(Ok(Attempt::Busy(remaining))) => remaining,
            Some(Err(err)) => outage.ride(err, &keys, self.fail_fast)?,
            None => return Err(timed_out()),
        };
        let timed_out = |outage: &mut Outage| outage.take().unwrap_or_else(timed_out);

        tracing::debug!(target: TARGET, lock = %keys.name(), holder_lease_left = ?remaining, "busy; waiting");
        let waiting = wakeups.join(&keys.lock);
        // Bumped after a subscriber reconnect: a hand-off may have been missed.
        let mut wake = waiting.wakeups();
        // Only the head of the local queue contends in Redis: a release costs O(1) attempts per process. A release
        // may still hand the lock to the token of this task's first attempt while it queues here.
        let (permit, queued) = match waiting.local.queue.try_acquire() {
            Ok(permit) => (permit, false),
            Err(_) => {
                let queue = async {
                    loop {
                        tokio::select! {
                            permit = waiting.local.queue.acquire() => return permit.ok().map(Ok),
                            () = expecting.arrived() => {}
                        }
                        let Some((handed, sent)) = expecting.handed() else {
                            continue;
                        };
                        let token = match take_hand_off(
                            &self.client,
                            &keys,
                            &mut expecting,
                            handed,
                            sent,
                            self.lease(),
                        ) {
                            Ok(guard) => return Some(Err(guard)),
                            Err(token) => token,
                        };
                        // Too close to its end to start on: confirm it with one attempt, which finds the lock held
                        // by that token (or, if it lapsed, queues again).
                        let confirm =
                            self.attempt(&keys, Wait::Queued, Some(&token), Some(&mut expecting));
                        match confirm.await {
                            Ok(Attempt::Granted(guard)) => return Some(Err(guard)),
                            Ok(Attempt::Busy(_)) => expecting.drop_handed(&token),
                            // Left in the mailbox: released if this wait ends, else it lapses with its claim.
                            Err(_) => {}
                        }
                    }
                };
                match until(deadline, queue).await {
                    Some(Some(Ok(permit))) => (permit, true),
                    Some(Some(Err(guard))) => {
                        // The grant went to this client, which has left the Redis queue: the local head queues it
                        // again for the tasks still waiting.
                        waiting.local.bump();
                        return Ok(guard);
                    }
                    _ => return Err(timed_out(&mut outage)),
                }
            }
        };
        if until(deadline, wakeups.ready(&keys.lock)).await.is_none() {
            return Err(timed_out(&mut outage));
        }
        // The first attempt already queued this client; it need not be repeated if we were subscribed when it was
        // made, nothing was delivered since, and no local waiter went before us.
        let mut look_again = queued || epoch.is_none() || wakeups.epoch() != epoch;
        loop {
            // A release handed the lock to one of our tokens: start at once when the grant's deadline leaves room,
            // otherwise confirm it with the attempt below (which finds the lock held by that token).
            let mut prev = expecting.last().map(str::to_owned);
            if let Some((handed, sent)) = expecting.handed() {
                match take_hand_off(
                    &self.client,
                    &keys,
                    &mut expecting,
                    handed,
                    sent,
                    self.lease(),
                ) {
                    Ok(guard) => {
                        outage.over(&keys);
                        drop(permit);
                        return Ok(guard);
                    }
                    Err(token) => {
                        prev = Some(token);
                        look_again = true;
                    }
                }
            }
            if look_again {
                // Seen before the attempt: a wake-up that lands after it still wakes us below.
                wake.borrow_and_update();
                let attempt = self.attempt_until(
                    &keys,
                    Wait::Queued,
                    prev.as_deref(),
                    &mut expecting,
                    deadline,
                );
                remaining = match attempt.await {
                    Some(Ok(Attempt::Granted(guard))) => {
                        outage.over(&keys);
                        drop(permit);
                        return Ok(guard);
                    }
                    Some(Ok(Attempt::Busy(remaining))) => {
                        outage.over(&keys);
                        // A hand-off that was waiting for this confirmation has lapsed: forget it.
                        if let Some(token) = prev.as_deref() {
                            expecting.drop_handed(token);
                        }
                        remaining
                    }
                    Some(Err(err)) => outage.ride(err, &keys, self.fail_fast)?,
                    None => return Err(timed_out(&mut outage)),
                };
            }
            look_again = true;
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(timed_out(&mut outage));
            }
            // Handed the lock by a release; otherwise look again when the holder's lease ends, and at least every
            // heartbeat, which keeps this client's queue entry (and the token a release would grant) fresh and bounds
            // the cost of a lost message.
            let lease_end = now
                + remaining
                    .unwrap_or(NO_TTL_RECHECK)
                    .clamp(Duration::from_millis(1), HEARTBEAT);
            let wake_at = deadline.map_or(lease_end, |d| d.min(lease_end));
            tokio::select! {
                () = expecting.arrived() => look_again = false,
                _ = wake.changed() => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// One attempt, given up at `deadline` (`None` then): a paused or unreachable server cannot hold a bounded call
    /// past its bound. A grant that lands after the attempt was given up is released (see `AcquireItem::orphaned`).
    async fn attempt_until(
        &self,
        keys: &Arc<LockKeys>,
        wait: Wait,
        prev: Option<&str>,
        expecting: &mut Expecting,
        deadline: Option<Instant>,
    ) -> Option<Result<Attempt, Error>> {
        until(deadline, self.attempt(keys, wait, prev, Some(expecting))).await
    }

    /// One acquire attempt with a fresh token (coalesced with other tasks' attempts when calls are out: see
    /// `batch.rs`). A caller that will wait joins the lock's queue when busy, with this token registered for a
    /// hand-off (in `expecting`, before the request leaves); `prev` is the token of its previous attempt, which a
    /// release may have handed the lock to meanwhile.
    async fn attempt(
        &self,
        keys: &Arc<LockKeys>,
        wait: Wait,
        prev: Option<&str>,
        expecting: Option<&mut Expecting>,
    ) -> Result<Attempt, Error> {
        let inner = self.client.redis()?;
        let token = new_token(self.description.as_deref())?;
        // On the lease clock (see clock.rs), read before the request leaves.
        let sent = crate::engine::clock::now();
        let expecting = match expecting {
            Some(expecting) if wait != Wait::No => {
                expecting.add(&token, sent);
                Some(expecting)
            }
            _ => None,
        };
        let item = AcquireItem {
            keys: Arc::clone(keys),
            token,
            ttl: self.ttl,
            wait,
            prev: prev.map(str::to_owned),
        };
        // A request dropped on the way is undone by the coalescer (`AcquireItem::orphaned`); one that failed is
        // undone below. Retried once on a dropped connection with the same token: a retry that finds the grant of
        // its first run reports that grant (acquire.lua is idempotent per token).
        let token = item.token.clone();
        let (code, value, run, left) = match batch::run(inner, item).await {
            Ok(outcome) => outcome,
            Err(Failure { err, reached }) => {
                let err = not_a_lock(err, &keys.lock);
                // A server error means the script did not grant, and a request that never reached Redis (the
                // connection was refused) cannot have granted either; anything else (timeout, dropped connection)
                // may have granted, or stored the token for a release to hand the lock to later: released in the
                // background, owner-checked. (A wait riding out an outage thus leaves no background release behind
                // per refused attempt.)
                if reached && !matches!(err, Error::NotALock { .. }) && !is_server_error(&err) {
                    // From now on the token is being released: the wait must never take a grant to it (a hand-off
                    // whose message comes late, or an attempt that finds the lock held by it), or that release would
                    // free a lock in use. A late message for it is given back instead (a second, harmless release).
                    if let Some(expecting) = expecting {
                        expecting.drop_handed(&token);
                    }
                    release_in_background(Arc::clone(inner), Arc::clone(keys), token, self.ttl);
                }
                return Err(explain_foreign(&inner.conn, &keys.lock, err).await);
            }
        };
        let expiry = |left: i64, handed: bool| Expiry::replied(sent, left, run, handed);
        match code {
            1 => {
                // Routed nowhere until this grant ends: a message for it may still come (see `Expecting::taken`).
                let route = expecting.and_then(|e| e.taken(&token));
                Ok(Attempt::Granted(self.grant(
                    keys,
                    token,
                    value,
                    expiry(left, false),
                    route,
                )))
            }
            2 => {
                // A release handed the lock to our previous attempt's token; this attempt stored nothing.
                let prev = prev.unwrap_or_default().to_owned();
                let route = expecting.and_then(|e| e.taken(&prev));
                Ok(Attempt::Granted(self.grant(
                    keys,
                    prev,
                    value,
                    expiry(left, true),
                    route,
                )))
            }
            0 => {
                crate::engine::metrics::busy();
                Ok(Attempt::Busy(
                    u64::try_from(value).ok().map(Duration::from_millis),
                ))
            }
            101 | 102 => {
                let granted = if code == 101 {
                    token
                } else {
                    prev.unwrap_or_default().to_owned()
                };
                Err(unreplicated(
                    inner, keys, expecting, granted, self.ttl, value,
                ))
            }
            -1 => Err(explain_foreign(&inner.conn, &keys.lock, foreign(&keys.lock, "")).await),
            _ => Err(Error::NotALock {
                key: keys.fence().to_string(),
                detail: "the fence counter is not a number".to_owned(),
            }),
        }
    }

    /// A guard for a grant whose expiry `expiry` describes.
    fn grant(
        &self,
        keys: &Arc<LockKeys>,
        token: String,
        fence: i64,
        expiry: Expiry,
        route: Option<u128>,
    ) -> MutexGuard {
        new_guard(
            &self.client,
            keys,
            token,
            fence,
            self.lease(),
            expiry,
            route,
        )
    }
}

/// Checks a lock handle's options before its first request (every kind has the same ones): inside a runtime, a
/// valid name, a lease in range, a valid description, a renewal interval that fits the lease.
pub(crate) fn check_options(
    keys: &Result<Arc<LockKeys>, InvalidArgument>,
    ttl: Duration,
    description: Option<&str>,
    renew_every: Option<Duration>,
) -> Result<Arc<LockKeys>, Error> {
    require_runtime()?;
    let keys = keys.clone()?;
    check_ttl(ttl)?;
    if let Some(description) = description {
        check_description(description)?;
    }
    if let Some(every) = renew_every {
        let limit = ttl - drift(ttl);
        if every.is_zero() || every >= limit {
            return Err(InvalidArgument::BadRenewal { every, ttl, limit }.into());
        }
    }
    Ok(keys)
}

/// A guard for a grant of `hold` with fence `fence`, whose expiry `expiry` describes; `lease` is the lease to keep
/// and how often to renew it (never: `None`). Shared by every lock kind.
pub(crate) fn new_guard(
    client: &Client,
    keys: &Arc<LockKeys>,
    hold: String,
    fence: i64,
    lease: (Duration, Option<Duration>),
    expiry: Expiry,
    route: Option<u128>,
) -> MutexGuard {
    let (ttl, renew_every) = lease;
    let fence = Fence::new(u64::try_from(fence).unwrap_or(0));
    crate::engine::trace::kind_event!(crate::engine::trace::kind_of_hold(&hold), debug, lock = %keys.name(), hold = %crate::engine::trace::words(&hold), fence = fence.get(), ttl = ?ttl, handed = expiry.handed, "granted");
    let Expiry {
        sent,
        left,
        run,
        handed,
    } = expiry;
    let lease = LeaseShared::new(Arc::clone(keys), hold, fence, ttl, sent, left, run);
    let keeper = |every, once| {
        // Every grant that comes here is a Redis grant (etcd's leases follow their session).
        let inner = client.redis().ok()?;
        let weak = Arc::downgrade(inner);
        let renews: std::sync::Weak<dyn crate::engine::keeper::Renews> = weak;
        Some(
            inner
                .keeper
                .watch(renews, Arc::clone(&lease), sent, every, once),
        )
    };
    let kept = match renew_every {
        Some(every) => keeper(every, false),
        // A fixed lease handed over with a shorter claim: extended once to its whole lease, at once.
        None if handed && left < ttl => keeper(ttl / 3, true),
        None => None,
    };
    MutexGuard::new(client.clone(), Lease { shared: lease }, kept, route)
}

/// A grant (`token`, a mutex token or a hold) that too few replicas acknowledged: released in the background
/// (owner-checked), never taken by this wait, and reported.
pub(crate) fn unreplicated(
    inner: &Arc<RedisStore>,
    keys: &Arc<LockKeys>,
    expecting: Option<&mut Expecting>,
    token: String,
    ttl: Duration,
    acked: i64,
) -> Error {
    if let Some(expecting) = expecting {
        expecting.drop_handed(&token);
    }
    release_in_background(Arc::clone(inner), Arc::clone(keys), token, ttl);
    Error::NotReplicated {
        name: keys.name().to_owned(),
        acked: u32::try_from(acked).unwrap_or(0),
        required: inner.replicas.map_or(0, |r| r.count),
    }
}

/// A grant a release handed to `handed.token` (whose attempt was sent at `sent`), taken by a wait of any kind: a guard
/// keeping `lease`, when the deadline it gives leaves at least a quarter of the claim; otherwise the token, to be
/// confirmed by an attempt.
///
/// The deadline: the release ran after the attempt that stored the token, which ran after it was sent, so the claim
/// lease it set ends no earlier than `sent + claim` (less the drift allowance, as for every lease).
pub(crate) fn take_hand_off(
    client: &Client,
    keys: &Arc<LockKeys>,
    expecting: &mut Expecting,
    handed: Handed,
    sent: Instant,
    lease: (Duration, Option<Duration>),
) -> Result<MutexGuard, String> {
    // A grant whose replication nobody confirmed (the release that handed it did not wait for replicas) is confirmed
    // by an attempt first, when the client requires acknowledgements: that attempt's call waits for them.
    if client
        .redis()
        .map_or(true, |inner| inner.replicas.is_some())
        || !hand_off_usable(&handed, sent)
    {
        return Err(handed.token);
    }
    let route = expecting.handed_over(&handed.token);
    let expiry = Expiry::handed(&handed, sent);
    let fence = i64::try_from(handed.fence).unwrap_or(i64::MAX);
    Ok(new_guard(
        client,
        keys,
        handed.token,
        fence,
        lease,
        expiry,
        route,
    ))
}

/// When a grant a release handed to `handed.token` (whose attempt was sent at `sent`) can be started on at once: the
/// deadline it gives, if that leaves at least a quarter of the claim; otherwise it must be confirmed by an attempt.
///
/// The release ran after the attempt that stored the token, which ran after it was sent, so the claim lease it set
/// ends no earlier than `sent + claim` (less the drift allowance, as for every lease).
fn hand_off_usable(handed: &Handed, sent: Instant) -> bool {
    let valid_until = sent + handed.claim - drift(handed.claim);
    valid_until.saturating_duration_since(crate::engine::clock::now()) >= handed.claim / 4
}

/// One lock's answer from `acquire.lua`: code, fence (or the holder's time left), server µs when the call ran, the
/// grant's time left in ms.
pub(crate) type AcquireReply = (i64, i64, i64, i64);

/// One acquire attempt, as the coalescer carries it.
pub(crate) struct AcquireItem {
    keys: Arc<LockKeys>,
    token: String,
    ttl: Duration,
    wait: Wait,
    prev: Option<String>,
}

impl Item for AcquireItem {
    type Outcome = AcquireReply;

    fn coalescer(inner: &RedisStore) -> &Coalescer<Self> {
        &inner.acquires
    }

    fn slot(&self) -> u16 {
        self.keys.slot()
    }

    fn script(inner: &RedisStore, items: &[Self]) -> ScriptCall {
        let mut invocation = ScriptCall::new(&ACQUIRE, 4 * items.len());
        for item in items {
            invocation
                .key(&item.keys.lock)
                .key(item.keys.fence())
                .key(item.keys.queue())
                .key(item.keys.waiters());
        }
        invocation
            .arg(millis(inner.fence_retention))
            .arg(inner.wakeups.client_id());
        for item in items {
            invocation
                .arg(item.token.as_str())
                .arg(millis(item.ttl))
                .arg(match item.wait {
                    Wait::No => "0",
                    Wait::First => "1",
                    Wait::Queued => "2",
                })
                .arg(millis(item.ttl.min(CLAIM)))
                .arg(item.prev.as_deref().unwrap_or(""));
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
        release_orphaned(inner, &self.keys, self.token, self.prev, self.ttl, outcome);
    }
}

/// The code of an acquire outcome that granted (1: to this attempt's token, 2: to the previous attempt's) but whose
/// call too few replicas acknowledged: [`NOT_REPLICATED`] plus the original code.
pub(crate) const NOT_REPLICATED: i64 = 100;

/// How many replicas acknowledged a call, when that is fewer than the client requires: `(acked, required)`.
pub(crate) fn short_of(required: Option<ReplicaAcks>, acked: Option<u32>) -> Option<(u32, u32)> {
    let required = required?.count;
    let acked = acked.unwrap_or(0);
    (acked < required).then_some((acked, required))
}

/// [`acquire_outcomes`] of a coalesced acquire call of `n` locks, as [`Item::outcomes`] takes it.
pub(crate) fn acquire_call_outcomes(
    n: usize,
    (reply, reached, acked): Sent<Numbers>,
    inner: &RedisStore,
) -> Result<Vec<AcquireReply>, Failure> {
    acquire_outcomes(reply, reached, n, short_of(inner.replicas, acked))
}

/// Splits an acquire script's reply (`acquire.lua`, `set_acquire.lua`: `{now, code, value, ms, ...}`) for `n` locks
/// into one outcome each. When too few replicas acknowledged the call (`short`), every grant in it is marked
/// [`NOT_REPLICATED`], with the count of replicas that acknowledged as its value: the attempt releases it and reports
/// [`Error::NotReplicated`].
pub(crate) fn acquire_outcomes(
    reply: redis::RedisResult<Numbers>,
    reached: bool,
    n: usize,
    short: Option<(u32, u32)>,
) -> Result<Vec<AcquireReply>, Failure> {
    match reply {
        Ok(Numbers(reply)) if reply.len() == 1 + 3 * n => {
            let run = reply[0];
            Ok(reply[1..]
                .chunks(3)
                .map(|c| match (c[0], short) {
                    // The value is then the count of replicas that acknowledged (the fence is of no use).
                    (1 | 2, Some((acked, _))) => {
                        (NOT_REPLICATED + c[0], i64::from(acked), run, c[2])
                    }
                    (code, _) => (code, c[1], run, c[2]),
                })
                .collect())
        }
        Ok(_) => Err(Failure {
            err: redis::RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected reply to an acquire",
            )),
            reached: true,
        }),
        Err(err) => Err(Failure { err, reached }),
    }
}

/// Settles an acquire whose caller went away: what may hold the lock for it is its token (granted, or unknown), or
/// the wait's previous token (a release handed the lock to it); each is released in the background. Releases are
/// owner-checked, so an unknown outcome costs nothing.
pub(crate) fn release_orphaned(
    inner: &Arc<RedisStore>,
    keys: &Arc<LockKeys>,
    token: String,
    prev: Option<String>,
    ttl: Duration,
    outcome: Option<AcquireReply>,
) {
    let tokens = match outcome.map(|(code, ..)| code) {
        Some(1 | 101) => [Some(token), None],
        Some(2 | 102) => [prev, None],
        Some(_) => [None, None],
        None => [Some(token), prev],
    };
    for token in tokens.into_iter().flatten() {
        release_in_background(Arc::clone(inner), Arc::clone(keys), token, ttl);
    }
}

/// What bounds a new grant's expiry from below: the request that made it possible left at `sent` (lease clock), and
/// the key had `left` to live when it ran (server time `run`, µs). `handed` when a release granted it (a claim lease).
pub(crate) struct Expiry {
    pub(crate) sent: Instant,
    pub(crate) left: Duration,
    pub(crate) run: i64,
    pub(crate) handed: bool,
}

impl Expiry {
    /// A grant whose request left at `sent` and ran at server time `run` (µs), `left_ms` before its lease ends.
    pub(crate) fn replied(sent: Instant, left_ms: i64, run: i64, handed: bool) -> Expiry {
        Expiry {
            sent,
            left: Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)),
            run,
            handed,
        }
    }

    /// A grant a release handed over, by its message; the attempt that stored its token left at `sent`.
    pub(crate) fn handed(handed: &Handed, sent: Instant) -> Expiry {
        Expiry {
            sent,
            left: handed.claim,
            run: handed.run,
            handed: true,
        }
    }
}

/// A wait's view of a Redis outage: the last error while it lasts, and the backoff before the next attempt.
#[derive(Default)]
pub(crate) struct Outage {
    error: Option<Error>,
    backoff: crate::engine::backoff::Backoff,
}

impl Outage {
    /// An attempt failed with `err`: ends the wait (`Err`) unless the error is transient and the wait rides outages;
    /// otherwise returns how long to wait before the next attempt (a wake-up still cuts it short).
    pub(crate) fn ride(
        &mut self,
        err: Error,
        keys: &LockKeys,
        fail_fast: bool,
    ) -> Result<Option<Duration>, Error> {
        if fail_fast || !is_transient(&err) {
            return Err(err);
        }
        if self.error.is_none() {
            let cause = match &err {
                Error::Redis(cause) => cause.to_string(),
                other => other.to_string(),
            };
            tracing::warn!(target: "leasehold::outage", lock = %keys.name(),
                "Redis unavailable while waiting for lock {:?} ({cause}); retrying until it answers", keys.name());
            self.backoff.reset();
        }
        self.error = Some(err);
        Ok(Some(self.backoff.next()))
    }

    /// Redis answered again.
    pub(crate) fn over(&mut self, keys: &LockKeys) {
        if self.error.take().is_some() {
            tracing::info!(target: "leasehold::outage", lock = %keys.name(), "Redis answers again; still waiting");
        }
    }

    /// The error to end the wait with when its deadline passes during an outage.
    pub(crate) fn take(&mut self) -> Option<Error> {
        self.error.take()
    }
}

/// A reply the server gave as an error (the script did not run to a grant), as opposed to a lost or refused request.
pub(crate) fn is_server_error(err: &Error) -> bool {
    matches!(err, Error::Redis(e) if e.code().is_some())
}

/// Whether `err` may pass by itself: the connection (refused, dropped, timed out) or a server that is starting,
/// busy, or failing over.
fn is_transient(err: &Error) -> bool {
    let Error::Redis(err) = err else {
        return false;
    };
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.kind() == redis::ErrorKind::ClusterConnectionNotFound
        // MOVED and ASK reach us only when the cluster client gave up following them (a slot whose new owner is
        // not reachable yet, during a failover).
        || matches!(
            err.code(),
            Some(
                "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "READONLY" | "CLUSTERDOWN" | "MOVED"
                    | "ASK"
            )
        )
}

/// Runs `fut` until `deadline`; `None` when the deadline came first.
pub(crate) async fn until<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, fut).await.ok(),
        None => Some(fut.await),
    }
}
