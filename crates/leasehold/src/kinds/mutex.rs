//! The non-reentrant mutex: its options, and its try and wait calls, which its store carries out (on Redis,
//! `backend/redis/acquire.rs`); the option checks every kind shares.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Handle, LockKeys};
use crate::client::{Client, LockInfo};
use crate::engine::lease::Lease;
use crate::engine::ttl::{check_ttl, drift};
use crate::error::{require_runtime, Error, InvalidArgument};
use crate::fence::check_description;
use crate::kinds::guard::MutexGuard;

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::mutex=debug`).
const TARGET: &str = "leasehold::mutex";

pub use crate::engine::ttl::DEFAULT_TTL;

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
/// may take as long as it needs and a crashed process frees the lock within 30 s, on every store.
/// [`ttl`](Mutex::ttl), [`renew_every`](Mutex::renew_every) and [`fixed_lease`](Mutex::fixed_lease) change that (on
/// the stores with sessions, `ttl` chooses the session the grant lives under, and the other two are refused or do
/// not apply).
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
    /// `None`: the client's default lease ([`Client::default_ttl`]).
    ttl: Option<Duration>,
    renewal: Renewal,
    description: Option<Arc<str>>,
    /// Whether `description` carries an election's value after the description ([`crate::fence::hold_text`]).
    publishes: bool,
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

impl Mutex {
    pub(crate) fn new(client: Client, name: &str) -> Mutex {
        let keys = LockKeys::new(client.prefix(), name);
        Mutex {
            client,
            keys,
            ttl: None,
            renewal: Renewal::Auto,
            description: None,
            publishes: false,
            fail_fast: false,
        }
    }

    /// Each grant of this handle carries `value` after its description: the value an election's leader publishes
    /// ([`crate::Election`]). Checked with the description by the first operation.
    pub(crate) fn publishing(mut self, value: &str) -> Mutex {
        let text = crate::fence::hold_text(self.description.as_deref(), value);
        self.description = Some(Arc::from(text));
        self.publishes = true;
        self
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
        self.publishes = false;
        self
    }

    /// The lease of each grant: between [`MIN_TTL`](crate::MIN_TTL) (10 ms) and [`MAX_TTL`](crate::MAX_TTL)
    /// (30 days). Defaults to the client's default lease: [`DEFAULT_TTL`] (30 s) on every store, unless
    /// [`Builder::session_ttl`](crate::Builder::session_ttl) set another on a store with sessions.
    ///
    /// On etcd, ZooKeeper, PostgreSQL and MySQL/MariaDB a grant lives as long as a session of the client: the
    /// client keeps one session per distinct TTL, opened by the first lock that asks for it and kept alive while the
    /// client lives, so a crashed holder's grant is freed this long after its last keep-alive, as on Redis. What each
    /// store grants ([`Lease::ttl`](crate::Lease::ttl) says what was used): etcd rounds up to whole seconds and takes
    /// no less than 2 s; ZooKeeper takes 1 s to 24 days as the session timeout asked for, which the ensemble
    /// negotiates within its bounds (the session runs with the negotiated one, logged when it differs); PostgreSQL
    /// and MySQL/MariaDB take at least 1 s. A TTL below a store's minimum is [`InvalidArgument::BadDuration`] at the
    /// first acquisition, before anything is taken. Tested by the conformance suite's
    /// `ttl::each_lock_is_granted_under_its_own_ttl` and `ttl::a_short_ttl_frees_a_cut_off_holder_within_it`.
    pub fn ttl(mut self, ttl: Duration) -> Mutex {
        self.ttl = Some(ttl);
        self
    }

    /// How often the keeper renews a held lease; it must be shorter than the lease minus its drift allowance.
    /// Defaults to a third of the lease (10 s for the default 30 s).
    pub fn renew_every(mut self, every: Duration) -> Mutex {
        self.renewal = Renewal::Every(every);
        self
    }

    /// No watchdog: the lease ends after its TTL unless [`MutexGuard::extend`] moves it. The guard still reports
    /// the loss at its validity deadline. Redis only: elsewhere every acquisition with it is refused with
    /// [`Error::Unsupported`] before anything is taken ([`Capability::FixedLease`](crate::Capability::FixedLease)).
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
        self.client.try_lock(&self.handle(), keys).await
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
        let description = match (&self.description, self.publishes) {
            (Some(text), true) => {
                crate::fence::check_hold_text(text)?;
                None
            }
            (description, _) => description.as_deref(),
        };
        check_options(
            &self.keys,
            self.lease_ttl(),
            description,
            self.renew_interval(),
        )
    }

    /// What each grant of this handle asks for, as a store sees it.
    fn handle(&self) -> Handle<'_> {
        Handle {
            ttl: self.lease_ttl(),
            renew_every: self.renew_interval(),
            description: self.description.as_deref(),
            fail_fast: self.fail_fast,
        }
    }

    /// The lease each grant asks for: the handle's [`ttl`](Mutex::ttl), or the client's default.
    fn lease_ttl(&self) -> Duration {
        self.ttl.unwrap_or_else(|| self.client.default_ttl())
    }

    pub(crate) fn renew_interval(&self) -> Option<Duration> {
        match self.renewal {
            Renewal::Auto => Some(self.lease_ttl() / 3),
            Renewal::Every(every) => Some(every),
            Renewal::Off => None,
        }
    }

    async fn acquire(&self, deadline: Option<Instant>) -> Result<MutexGuard, Error> {
        let keys = self.checked()?;
        let span = tracing::debug_span!(target: TARGET, "acquire", lock = %keys.name());
        let started = Instant::now();
        let result =
            tracing::Instrument::instrument(self.client.lock(&self.handle(), keys, deadline), span)
                .await;
        match &result {
            Ok(_) => crate::engine::metrics::granted(started.elapsed()),
            Err(Error::Timeout { .. }) => crate::engine::metrics::timed_out(),
            Err(_) => {}
        }
        result
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
