//! The reentrant mutex: a holder takes the lock again through its own guard (in one process) or by presenting its
//! token (from another process), never implicitly.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Ask;
use crate::client::Client;
use crate::error::Error;
use crate::kinds::guard::Guard;
use crate::kinds::queued::{deadline_in, queued_options, Queued};

pub use crate::backend::redis::kinds::MAX_DEPTH;

/// A distributed mutex its holder can take again: explicitly, through the guard it holds
/// ([`ReentrantGuard::reenter`]), or from another process by presenting that guard's token
/// ([`ReentrantMutex::lock_as`]).
///
/// Created by [`Client::reentrant_mutex`]. Grants are fenced, leased, kept and queued (strict FIFO) as the
/// [`FairMutex`](crate::FairMutex)'s.
///
/// # Why never implicit
///
/// Async Rust has no thread that owns a lock, and a task is no substitute: the branches of one `join!` or `select!`
/// run in one task, so a lock that let "the same task" in again would let two concurrent branches both hold it:
///
/// ```no_run
/// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
/// let ledger = locks.reentrant_mutex("ledger");
/// // If lock() re-entered for "the same task", both branches would be inside at once. They are not: the second
/// // waits for the first, as two tasks would.
/// let (a, b) = tokio::join!(ledger.lock(), ledger.lock_timeout(std::time::Duration::from_millis(100)));
/// # Ok(()) }
/// ```
///
/// So re-entry needs proof of holding: the guard itself, or its token.
///
/// # Across processes
///
/// A holder hands its token (`guard.token()`, `LEASEHOLD_TOKEN` for a program run by `leasehold run`) to another
/// process, which calls [`lock_as`](ReentrantMutex::lock_as): granted at once, with the group's fence, as a nested
/// hold with a lease of its own. The lock stays held while any hold of the group is live: the nested holder's release
/// does not free the outer one's lock, the outer one's release leaves the lock to the nested holder until it releases,
/// and a nested holder that crashes frees its level after its lease (the lock never stays held by a dead process
/// beyond a lease).
///
/// # In one process
///
/// [`ReentrantGuard::reenter`] returns another guard of the same grant, without a round trip: same token, fence and
/// lease (renewed once, however deep), and the lock is released when the last of them is released or dropped.
#[derive(Clone, Debug)]
pub struct ReentrantMutex {
    queued: Queued,
}

queued_options!(ReentrantMutex);

fn root_ask() -> Ask {
    Ask {
        tag: "e".to_owned(),
        limit: 0,
    }
}

impl ReentrantMutex {
    pub(crate) fn new(client: Client, name: &str) -> ReentrantMutex {
        ReentrantMutex {
            queued: Queued::new(client, name),
        }
    }

    /// Waits for the lock as a new holder (a root grant).
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue at once and leaves no lock behind.
    pub async fn lock(&self) -> Result<ReentrantGuard, Error> {
        let guard = self.queued.acquire(&root_ask(), None).await?;
        Ok(ReentrantGuard::root(guard))
    }

    /// Waits at most `timeout` for the lock as a new holder.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time ran out; otherwise as [`lock`](ReentrantMutex::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](ReentrantMutex::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<ReentrantGuard, Error> {
        let guard = self
            .queued
            .acquire(&root_ask(), deadline_in(timeout))
            .await?;
        Ok(ReentrantGuard::root(guard))
    }

    /// Waits for the lock as a new holder, runs `work` while holding it, and releases it, as
    /// [`Mutex::run`](crate::Mutex::run) does: `work` gets the [`Lease`](crate::Lease) (its
    /// [`token`](crate::Lease::token) lets another process enter with [`lock_as`](ReentrantMutex::lock_as)) and is
    /// dropped the moment the lease is lost.
    ///
    /// # Errors
    ///
    /// As [`lock`](ReentrantMutex::lock); [`Error::LeaseLost`] when the lease ended during the work;
    /// [`Error::NotOwner`] when the release found the lock no longer ours (the work's output is then discarded).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it drops the work and releases the lock in the background.
    pub async fn run<F, Fut>(&self, work: F) -> Result<Fut::Output, Error>
    where
        F: FnOnce(crate::Lease) -> Fut,
        Fut: std::future::Future,
    {
        self.queued.run(&root_ask(), work).await
    }

    /// Tries once as a new holder.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when it is held or waited for; otherwise as [`lock`](ReentrantMutex::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a grant that lands after the future was dropped is released in the background.
    pub async fn try_lock(&self) -> Result<ReentrantGuard, Error> {
        let guard = self.queued.try_acquire(&root_ask()).await?;
        Ok(ReentrantGuard::root(guard))
    }

    /// Enters the lock that the holder of `token` holds (its root grant, or a nested hold): at once, however many
    /// wait, as a nested hold with the group's fence and a lease of its own. `token` is an owner token as
    /// [`Lease::token`](crate::Lease::token) gives it (a description after it is ignored).
    ///
    /// # Errors
    ///
    /// [`Error::NotOwner`] when `token` holds nothing live on this lock (its holder released it, or lost it);
    /// [`Error::TooDeep`] when the lock has [`MAX_DEPTH`] holds already; [`Error::WrongKind`] when the name holds
    /// another kind of lock; [`Error::Redis`] when Redis could not be asked; [`Error::Unsupported`] on every store but
    /// Redis ([`Capability::NestedHold`](crate::Capability::NestedHold)).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a nested hold that lands after the future was dropped is released in the background.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// // In a program started under the lock by another process, which passed its token on:
    /// let token = std::env::var("LEASEHOLD_TOKEN").unwrap_or_default();
    /// let inner = locks.reentrant_mutex("ledger").lock_as(&token).await?;
    /// // ... the nested section; the outer holder keeps the lock when this one releases ...
    /// inner.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock_as(&self, token: &str) -> Result<ReentrantGuard, Error> {
        let queued = &self.queued;
        let keys = queued.checked()?;
        let guard = queued.client.lock_as(&queued.handle(), keys, token).await?;
        Ok(ReentrantGuard::root(guard))
    }
}

/// A grant of a [`ReentrantMutex`], and each re-entry of it in this process: they share one [`Guard`] (dereferenced
/// to), and the lock is released when the last of them is released or dropped.
#[must_use = "the lock is released as soon as the last guard of the grant is dropped"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct ReentrantGuard {
    grant: Arc<Guard>,
}

impl ReentrantGuard {
    fn root(guard: Guard) -> ReentrantGuard {
        ReentrantGuard {
            grant: Arc::new(guard),
        }
    }

    /// Enters again: another guard of the same grant (same token, fence and lease), at once and without a round
    /// trip. The lease is kept once for all of them.
    ///
    /// # Errors
    ///
    /// [`Error::TooDeep`] when [`MAX_DEPTH`] guards of this grant are alive already.
    pub fn reenter(&self) -> Result<ReentrantGuard, Error> {
        if Arc::strong_count(&self.grant) >= MAX_DEPTH {
            return Err(Error::TooDeep {
                name: self.grant.name().to_owned(),
                depth: MAX_DEPTH,
            });
        }
        Ok(ReentrantGuard {
            grant: Arc::clone(&self.grant),
        })
    }

    /// The grant's [`Guard`] when this is its last level in this process, or this guard back when other levels are
    /// alive.
    pub fn into_guard(self) -> Result<Guard, ReentrantGuard> {
        Arc::try_unwrap(self.grant).map_err(|grant| ReentrantGuard { grant })
    }

    /// How many guards of this grant are alive in this process (1 for a grant not re-entered).
    pub fn depth(&self) -> usize {
        Arc::strong_count(&self.grant)
    }

    /// Leaves one level: the last guard of the grant releases the lock (as [`Guard::release`]); the others only let
    /// go of their level and return `Ok`.
    ///
    /// # Errors
    ///
    /// From the last guard, as [`Guard::release`].
    ///
    /// # Cancel safety
    ///
    /// As [`Guard::release`].
    #[doc(alias = "unlock")]
    pub async fn release(self) -> Result<(), Error> {
        match Arc::try_unwrap(self.grant) {
            Ok(guard) => guard.release().await,
            // Another level is still held; if it goes at the same moment, its drop releases the grant.
            Err(_) => Ok(()),
        }
    }
}

impl ReentrantGuard {
    /// Leaves one level without releasing: the last guard of the grant lets the lock run out after its lease, as
    /// [`Guard::leave_to_expire`] does.
    pub fn leave_to_expire(self) {
        if let Ok(guard) = Arc::try_unwrap(self.grant) {
            guard.leave_to_expire();
        }
    }
}

impl Deref for ReentrantGuard {
    type Target = Guard;

    fn deref(&self) -> &Guard {
        &self.grant
    }
}
