//! The strictly fair mutex: one holder at a time, granted in order of arrival at Redis across every waiter of every
//! process.

use std::future::Future;
use std::time::Duration;

use crate::backend::Ask;
use crate::client::Client;
use crate::engine::lease::Lease;
use crate::error::Error;
use crate::kinds::guard::Guard;
use crate::kinds::queued::{deadline_in, queued_options, Queued};

/// A distributed mutex that grants strictly in order of arrival: every waiting task of every process has its own
/// place in one queue kept by Redis, and a newcomer never takes the lock while someone live waits.
///
/// Created by [`Client::fair_mutex`]. Its grants are fenced, leased and kept like the [`Mutex`](crate::Mutex)'s,
/// and a release hands the lock directly to the oldest live waiter. Where the plain mutex queues *clients* (and a
/// client's own tasks in FIFO among themselves), this queues *tasks*: the order is that of the waiters' first
/// attempts as Redis ran them. A waiter that gives up (timeout, dropped future) leaves the queue at once; one whose
/// process died is skipped by the next grant when its connection is gone, and otherwise once its entry's liveness
/// (3 s after its last heartbeat) runs out; a grant handed to a waiter that died within that window lapses after its
/// claim lease (2 s at most). See DESIGN.md, "The queued kinds".
///
/// A name is used by one lock kind: the same name as a [`Mutex`](crate::Mutex), a [`RwLock`](crate::RwLock) or a
/// [`Semaphore`](crate::Semaphore) fails with [`Error::NotALock`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
/// let guard = locks.fair_mutex("ledger").lock().await?;
/// // ... the critical section, with guard.fence() ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FairMutex {
    queued: Queued,
}

queued_options!(FairMutex);

impl FairMutex {
    pub(crate) fn new(client: Client, name: &str) -> FairMutex {
        FairMutex {
            queued: Queued::new(client, name),
        }
    }

    fn ask() -> Ask {
        Ask {
            tag: "x".to_owned(),
            limit: 0,
        }
    }

    /// Tries once: granted only when the lock is free and nobody live waits for it.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when it is held or waited for; [`Error::InvalidArgument`], [`Error::NotALock`],
    /// [`Error::Redis`] as their docs say.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a grant that lands after the future was dropped is released in the background.
    pub async fn try_lock(&self) -> Result<Guard, Error> {
        self.queued.try_acquire(&Self::ask()).await
    }

    /// Waits in the queue as long as it takes.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue at once and leaves no lock behind.
    pub async fn lock(&self) -> Result<Guard, Error> {
        self.queued.acquire(&Self::ask(), None).await
    }

    /// Waits at most `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time ran out; otherwise as [`lock`](FairMutex::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](FairMutex::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Guard, Error> {
        self.queued
            .acquire(&Self::ask(), deadline_in(timeout))
            .await
    }

    /// Waits for the lock in its turn, runs `work` while holding it, and releases it, as
    /// [`Mutex::run`](crate::Mutex::run) does: `work` gets the [`Lease`] and is dropped the moment the lease is lost.
    ///
    /// # Errors
    ///
    /// As [`lock`](FairMutex::lock); [`Error::LeaseLost`] when the lease ended during the work; [`Error::NotOwner`]
    /// when the release found the lock no longer ours (the work's output is then discarded).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it drops the work and releases the lock in the background.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// let entry = locks.fair_mutex("ledger").run(|lease| async move { lease.fence().get() }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<F, Fut>(&self, work: F) -> Result<Fut::Output, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future,
    {
        self.queued.run(&Self::ask(), work).await
    }
}
