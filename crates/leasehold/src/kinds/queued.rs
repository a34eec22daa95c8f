//! What the queued lock kinds share ([`FairMutex`](crate::FairMutex), [`RwLock`](crate::RwLock),
//! [`Semaphore`](crate::Semaphore), [`ReentrantMutex`](crate::ReentrantMutex)): their options, their acquire and wait
//! calls, written once, each kind bringing only its hold's tag (what it asks for) and, for the semaphore, its permit
//! count; and their name-level calls (`inspect`, `is_locked`, `force_release`, `run`). The store carries out each
//! acquisition: on Redis (`backend/redis/queued.rs`) every waiting *task* has its own entry in the lock's queue, and
//! the admission rule lives in `scripts/set.lua`. What follows a grant (the lease, its keeper, the loss signal, the
//! guard, release) is the mutex's, unchanged: a hold `"<tag> <token>"` travels where a mutex's token does.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Ask, Handle, LockKeys};
use crate::client::{Client, LockInfo};
use crate::error::{Error, InvalidArgument};
use crate::kinds::guard::Guard as MutexGuard;
use crate::kinds::mutex::{check_options, Renewal};

/// The options every queued kind shares, and the lock it names.
#[derive(Clone, Debug)]
pub(crate) struct Queued {
    pub(crate) client: Client,
    pub(crate) keys: Result<Arc<LockKeys>, InvalidArgument>,
    /// `None`: the client's default lease.
    pub(crate) ttl: Option<Duration>,
    pub(crate) renewal: Renewal,
    pub(crate) description: Option<Arc<str>>,
    pub(crate) fail_fast: bool,
}

impl Queued {
    pub(crate) fn new(client: Client, name: &str) -> Queued {
        let keys = LockKeys::new(client.prefix(), name);
        Queued {
            client,
            keys,
            ttl: None,
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

    /// The lease each grant asks for: the handle's `ttl`, or the client's default.
    pub(crate) fn lease_ttl(&self) -> Duration {
        self.ttl.unwrap_or_else(|| self.client.default_ttl())
    }

    pub(crate) fn renew_interval(&self) -> Option<Duration> {
        match self.renewal {
            Renewal::Auto => Some(self.lease_ttl() / 3),
            Renewal::Every(every) => Some(every),
            Renewal::Off => None,
        }
    }

    pub(crate) fn checked(&self) -> Result<Arc<LockKeys>, Error> {
        check_options(
            &self.keys,
            self.lease_ttl(),
            self.description.as_deref(),
            self.renew_interval(),
        )
    }

    /// What each grant of this handle asks for, as a store sees it.
    pub(crate) fn handle(&self) -> Handle<'_> {
        Handle {
            ttl: self.lease_ttl(),
            renew_every: self.renew_interval(),
            description: self.description.as_deref(),
            fail_fast: self.fail_fast,
        }
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
        self.client.try_acquire(&self.handle(), keys, ask).await
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
        let result = tracing::Instrument::instrument(
            self.client
                .acquire(&self.handle(), keys.clone(), ask, deadline),
            span,
        )
        .await;
        match &result {
            Ok(_) => crate::engine::metrics::granted(started.elapsed()),
            Err(Error::Timeout { .. }) => crate::engine::metrics::timed_out(),
            Err(_) => {}
        }
        result
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
            /// [`MAX_TTL`](crate::MAX_TTL) (30 days). Defaults to the client's default lease, 30 s unless
            /// [`Builder::session_ttl`](crate::Builder::session_ttl) set another. On the stores with sessions it
            /// chooses the session the grant lives under, as [`Mutex::ttl`](crate::Mutex::ttl) says.
            pub fn ttl(mut self, ttl: std::time::Duration) -> $kind {
                self.queued.ttl = Some(ttl);
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
