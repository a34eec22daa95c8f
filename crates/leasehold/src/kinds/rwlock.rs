//! The read-write lock: many readers or one writer, with waiting writers ahead of new readers.

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Ask;
use crate::capability::Capability;
use crate::client::Client;
use crate::error::{require_runtime, Error};
use crate::kinds::guard::Guard;
use crate::kinds::queued::{deadline_in, queued_options, Queued};

/// A distributed read-write lock: any number of readers at once, or one writer alone.
///
/// Created by [`Client::rw_lock`]. Every read or write grant is a hold of its own, with its own owner token, fence and
/// lease, kept alive by the client's keeper: a crashed reader frees its share after its lease, and one reader's loss
/// does not end the others'. Waiters are served in order of arrival at Redis, so a waiting writer blocks the readers
/// that come after it (no writer starvation under a stream of readers), and when a writer releases, the readers
/// queued behind it are all admitted together, up to the next queued writer.
///
/// # Fences
///
/// Every grant, read or write, draws the next fence of the lock. A fenced store should remember the highest fence it
/// saw *with a write* and refuse a write carrying a lower fence; a reader's fence is higher than that of every writer
/// before it, so a store can also refuse a read whose fence is lower than the last write's (a reader paused across a
/// writer's whole grant).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
/// let config = locks.rw_lock("config");
/// let reading = config.read().await?;   // shared with other readers
/// reading.release().await?;
/// let writing = config.write().await?;  // alone
/// writing.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RwLock {
    queued: Queued,
}

queued_options!(RwLock);

fn read_ask() -> Ask {
    Ask {
        tag: "r".to_owned(),
        limit: 0,
    }
}

fn write_ask() -> Ask {
    Ask {
        tag: "w".to_owned(),
        limit: 0,
    }
}

impl RwLock {
    pub(crate) fn new(client: Client, name: &str) -> RwLock {
        RwLock {
            queued: Queued::new(client, name),
        }
    }

    /// Waits for a read share: granted while no writer holds the lock or waits ahead.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue at once and leaves no share behind.
    pub async fn read(&self) -> Result<Guard, Error> {
        self.queued.acquire(&read_ask(), None).await
    }

    /// Waits at most `timeout` for a read share.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time ran out; otherwise as [`read`](RwLock::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`read`](RwLock::read).
    pub async fn read_timeout(&self, timeout: Duration) -> Result<Guard, Error> {
        self.queued.acquire(&read_ask(), deadline_in(timeout)).await
    }

    /// Tries once for a read share.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when a writer holds the lock or anyone waits; otherwise as [`read`](RwLock::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a grant that lands after the future was dropped is released in the background.
    pub async fn try_read(&self) -> Result<Guard, Error> {
        self.queued.try_acquire(&read_ask()).await
    }

    /// Waits for a read share, runs `work` while holding it, and releases it, as [`Mutex::run`](crate::Mutex::run)
    /// does: `work` gets the share's [`Lease`](crate::Lease) and is dropped the moment the lease is lost.
    ///
    /// # Errors
    ///
    /// As [`read`](RwLock::read); [`Error::LeaseLost`] when the lease ended during the work; [`Error::NotOwner`]
    /// when the release found the share no longer ours (the work's output is then discarded).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it drops the work and releases the share in the background.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// let config = locks.rw_lock("config");
    /// let seen = config.run_read(|lease| async move { lease.fence() }).await?;
    /// config.run_write(|lease| async move { /* write, fenced with lease.fence() */ }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_read<F, Fut>(&self, work: F) -> Result<Fut::Output, Error>
    where
        F: FnOnce(crate::Lease) -> Fut,
        Fut: Future,
    {
        self.queued.run(&read_ask(), work).await
    }

    /// Waits for the write lock, runs `work` while holding it, and releases it, as [`run_read`](RwLock::run_read)
    /// does for a share.
    ///
    /// # Errors
    ///
    /// As [`run_read`](RwLock::run_read).
    ///
    /// # Cancel safety
    ///
    /// As [`run_read`](RwLock::run_read).
    pub async fn run_write<F, Fut>(&self, work: F) -> Result<Fut::Output, Error>
    where
        F: FnOnce(crate::Lease) -> Fut,
        Fut: Future,
    {
        self.queued.run(&write_ask(), work).await
    }

    /// Waits for the write lock: granted when nobody holds the lock.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`read`](RwLock::read).
    pub async fn write(&self) -> Result<WriteGuard, Error> {
        let guard = self.queued.acquire(&write_ask(), None).await?;
        Ok(self.write_guard(guard))
    }

    fn write_guard(&self, guard: Guard) -> WriteGuard {
        WriteGuard {
            guard,
            lease: (self.queued.lease_ttl(), self.queued.renew_interval()),
        }
    }

    /// Waits at most `timeout` for the write lock.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time ran out; otherwise as [`write`](RwLock::write).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`read`](RwLock::read).
    pub async fn write_timeout(&self, timeout: Duration) -> Result<WriteGuard, Error> {
        let guard = self
            .queued
            .acquire(&write_ask(), deadline_in(timeout))
            .await?;
        Ok(self.write_guard(guard))
    }

    /// Tries once for the write lock.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when anyone holds the lock or waits; otherwise as [`write`](RwLock::write).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`try_read`](RwLock::try_read).
    pub async fn try_write(&self) -> Result<WriteGuard, Error> {
        let guard = self.queued.try_acquire(&write_ask()).await?;
        Ok(self.write_guard(guard))
    }
}

/// The write grant of a [`RwLock`]: a [`Guard`] (it dereferences to one) that can also
/// [`downgrade`](WriteGuard::downgrade) to a read share.
#[must_use = "the lock is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct WriteGuard {
    guard: Guard,
    /// The lease a downgraded grant keeps, and how often it is renewed.
    lease: (Duration, Option<Duration>),
}

impl Deref for WriteGuard {
    type Target = Guard;

    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl WriteGuard {
    /// The plain [`Guard`] of this grant (it can no longer downgrade).
    pub fn into_guard(self) -> Guard {
        self.guard
    }

    /// Releases the write lock, as [`Guard::release`] does.
    ///
    /// # Errors
    ///
    /// As [`Guard::release`].
    ///
    /// # Cancel safety
    ///
    /// As [`Guard::release`].
    #[doc(alias = "unlock")]
    pub async fn release(self) -> Result<(), Error> {
        self.guard.release().await
    }

    /// Lets the grant run out without releasing it, as [`Guard::leave_to_expire`] does.
    pub fn leave_to_expire(self) {
        self.guard.leave_to_expire();
    }

    /// Runs `work` while the lease holds, as [`Guard::run_until_lost`] does.
    ///
    /// # Errors
    ///
    /// As [`Guard::run_until_lost`].
    ///
    /// # Cancel safety
    ///
    /// As [`Guard::run_until_lost`].
    pub async fn run_until_lost<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        self.guard.run_until_lost(work).await
    }

    /// Turns the write lock into a read share in one atomic step: no other writer can take the lock in between, and
    /// readers waiting at the head of the queue are admitted alongside. The share keeps the grant's token, fence and
    /// expiry, and is kept alive as the write lock was.
    ///
    /// The write grant's [`Lease`](crate::Lease) (and its clones) ends here as released; the share has a lease of its own
    /// ([`Guard::lease`] on the returned guard).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] first, whatever the state of the grant, on a store without
    /// [`Capability::Downgrade`](crate::Capability::Downgrade) (every store but Redis, whose grants cannot change kind
    /// in place): the write grant is then released before the error returns, so nothing is held and another client
    /// can take the lock at once. Ask [`Client::supports`](crate::Client::supports) before [`RwLock::write`] to keep
    /// the write lock instead (tested by the conformance test `caps::a_refused_downgrade_leaves_nothing_held`).
    /// [`Error::LeaseLost`] when the write lease had already ended; [`Error::NotOwner`] when Redis no longer has the
    /// write grant; [`Error::Redis`] when Redis could not be asked (then both the write grant and the share it may
    /// have become are released in the background).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call releases, in the background, whichever of the two holds Redis has (on a store
    /// that refuses, the write grant).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// let config = locks.rw_lock("config");
    /// let writing = config.write().await?;
    /// // ... write the new configuration ...
    /// let reading = writing.downgrade().await?; // no writer can slip in before we read it back
    /// // ... read it back, alongside other readers ...
    /// reading.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn downgrade(self) -> Result<Guard, Error> {
        require_runtime()?;
        let WriteGuard { guard, lease } = self;
        let keys = Arc::clone(&guard.lease().shared.keys);
        let store = guard.client().store.clone();
        // Refused first, as `Client::supports` answers; the refused call leaves nothing held: the write grant is
        // released before the refusal returns, not in the background as a dropped guard's.
        if let Err(refused) = store.require(Capability::Downgrade, keys.name()) {
            // A grant already lost has nothing left to release: the refusal is the answer either way.
            let _ = guard.release().await;
            return Err(refused);
        }
        if let Some(reason) = guard.loss() {
            return Err(Error::LeaseLost {
                name: keys.name().to_owned(),
                reason,
            });
        }
        store.downgrade(guard, keys, lease).await
    }
}
