//! The counting semaphore: at most N permits held at once across every process, each permit a leased grant.

use std::future::Future;
use std::time::Duration;

use crate::backend::Ask;
use crate::client::{Client, HoldMode, LockKind};
use crate::engine::lease::Lease;
use crate::error::{require_runtime, Error, InvalidArgument};
use crate::kinds::guard::Guard;
use crate::kinds::queued::{deadline_in, queued_options, Queued};

/// The most permits a semaphore may have.
pub const MAX_PERMITS: u64 = 1 << 40;

/// A distributed counting semaphore: at most `permits` held at once by all processes together.
///
/// Created by [`Client::semaphore`]. Every acquisition (of one permit or of k at once, atomically) is a grant with its
/// own owner token, fence and lease, kept alive by the client's keeper; a holder that crashes gives its permits back
/// when its lease runs out, so permits never leak. Waiters are served in order of arrival at Redis: a waiter asking
/// for more permits than are free holds back the ones behind it (no starvation of large requests).
///
/// # The permit count
///
/// The semaphore stores its capacity while it is in use: the first grant on a free semaphore stores the count of the
/// handle that asked, and every later grant counts against that stored capacity, whatever count its own handle
/// carries. A request (a try, or a wait when it joins the queue) whose count differs from the stored capacity is
/// refused with [`Error::WrongPermits`], which names both numbers; it leaves nothing behind. A task already queued
/// keeps the count it queued with (or the one [`set_permits`](Semaphore::set_permits) gave the queue since), and its
/// heartbeats are judged by that. So two processes that disagree on the count find out at once, and the limit always
/// holds.
///
/// On etcd, ZooKeeper and the SQL stores no capacity is stored, but each grant's entry carries its count, and a
/// request behind an entry of another count (holding or waiting) is refused with the same [`Error::WrongPermits`]
/// (its entry deleted), so the limit holds there too (`conformance`
/// `kinds::a_semaphore_refuses_a_count_that_disagrees_with_its_holders`).
///
/// The capacity lives as long as a live permit does: it is forgotten with the last permit given back (or lapsed), and
/// the next grant stores its own count. To change the count of a semaphore in use, call
/// [`set_permits`](Semaphore::set_permits) on a handle with the new count, then give the new count to the other
/// handles. Lowering never revokes a held permit; it only holds back new grants until the holders drop below it.
/// Raising takes effect at once: the queue is served in the same step.
///
/// # Methods
///
/// As `tokio::sync::Semaphore`'s: [`acquire`](Semaphore::acquire) and [`try_acquire`](Semaphore::try_acquire) take
/// one permit, [`acquire_many`](Semaphore::acquire_many) and [`try_acquire_many`](Semaphore::try_acquire_many) take
/// n at once, [`acquire_timeout`](Semaphore::acquire_timeout) and
/// [`acquire_many_timeout`](Semaphore::acquire_many_timeout) give up at a deadline (as
/// [`Mutex::lock_timeout`](crate::Mutex::lock_timeout)), and [`available_permits`](Semaphore::available_permits)
/// reads how many are free.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
/// let exports = locks.semaphore("exports", 4);   // at most 4 exports at once, cluster-wide
/// let permit = exports.acquire().await?;
/// // ... one export ...
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    queued: Queued,
    permits: u64,
}

queued_options!(Semaphore);

impl Semaphore {
    pub(crate) fn new(client: Client, name: &str, permits: u64) -> Semaphore {
        Semaphore {
            queued: Queued::new(client, name),
            permits,
        }
    }

    /// The permit count this handle carries.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    fn ask(&self, n: u64) -> Result<Ask, Error> {
        if self.permits == 0 || self.permits > MAX_PERMITS || n == 0 || n > self.permits {
            return Err(InvalidArgument::BadPermits {
                asked: n,
                permits: self.permits,
            }
            .into());
        }
        Ok(Ask {
            tag: format!("s{n}"),
            limit: self.permits,
        })
    }

    /// Waits for one permit.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock); [`InvalidArgument::BadPermits`] for a count of 0 or above
    /// [`MAX_PERMITS`]; [`Error::WrongPermits`] when the semaphore is in use with another count.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue at once and leaves no permit behind.
    pub async fn acquire(&self) -> Result<Guard, Error> {
        self.acquire_many(1).await
    }

    /// Waits for `n` permits, granted together as one hold (released together).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Semaphore::acquire); [`InvalidArgument::BadPermits`] when `n` is 0 or more than the count;
    /// [`Error::Unsupported`] for more than 1 on every store but Redis
    /// ([`Capability::SeveralPermitsAtOnce`](crate::Capability::SeveralPermitsAtOnce)), before anything is taken.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Semaphore::acquire).
    pub async fn acquire_many(&self, n: u64) -> Result<Guard, Error> {
        let ask = self.ask(n)?;
        self.queued.acquire(&ask, None).await
    }

    /// Waits at most `timeout` for one permit (as [`Mutex::lock_timeout`](crate::Mutex::lock_timeout) waits for a
    /// mutex).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time ran out; otherwise as [`acquire`](Semaphore::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Semaphore::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Guard, Error> {
        self.acquire_many_timeout(1, timeout).await
    }

    /// Waits at most `timeout` for `n` permits.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time ran out; otherwise as [`acquire_many`](Semaphore::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Semaphore::acquire).
    pub async fn acquire_many_timeout(&self, n: u64, timeout: Duration) -> Result<Guard, Error> {
        let ask = self.ask(n)?;
        self.queued.acquire(&ask, deadline_in(timeout)).await
    }

    /// Tries once for one permit: granted only when one is free and nobody live waits.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when none is; otherwise as [`acquire`](Semaphore::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a grant that lands after the future was dropped is released in the background.
    pub async fn try_acquire(&self) -> Result<Guard, Error> {
        self.try_acquire_many(1).await
    }

    /// Tries once for `n` permits: granted only when they are free and nobody live waits.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when they are not; otherwise as [`acquire_many`](Semaphore::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`try_acquire`](Semaphore::try_acquire).
    pub async fn try_acquire_many(&self, n: u64) -> Result<Guard, Error> {
        let ask = self.ask(n)?;
        self.queued.try_acquire(&ask).await
    }

    /// Waits for one permit, runs `work` while holding it, and gives it back, as [`Mutex::run`](crate::Mutex::run)
    /// does: `work` gets the permit's [`Lease`] and is dropped the moment the lease is lost.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Semaphore::acquire); [`Error::LeaseLost`] when the lease ended during the work;
    /// [`Error::NotOwner`] when the release found the permit no longer ours (the work's output is then discarded).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it drops the work and gives the permit back in the background.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn export(fence: leasehold::Fence) -> u64 { 0 }
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// let rows = locks.semaphore("exports", 4).run(|permit| export(permit.fence())).await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<F, Fut>(&self, work: F) -> Result<Fut::Output, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future,
    {
        let ask = self.ask(1)?;
        self.queued.run(&ask, work).await
    }

    /// How many permits are free right now, in one read: the capacity the semaphore stores (see "The permit count")
    /// minus the permits its live holds take, and 0 when a lowered capacity is still exceeded. A free semaphore stores
    /// no capacity: then it is this handle's count, which the next grant would store. By the time you act on it,
    /// that may have changed; a free permit may also be promised to a waiter already (see
    /// [`inspect`](Semaphore::inspect)'s `waiting_clients`).
    ///
    /// # Errors
    ///
    /// [`InvalidArgument::BadPermits`] for a count of 0 or above [`MAX_PERMITS`]; [`Error::WrongKind`] when the
    /// name holds a lock of another kind; otherwise as [`Client::inspect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn available_permits(&self) -> Result<u64, Error> {
        self.ask(1)?;
        let info = self.queued.inspect().await?;
        match info.kind {
            None => Ok(self.permits),
            Some(LockKind::Semaphore) => {
                let used: u64 = info
                    .holders
                    .iter()
                    .map(|h| match h.mode {
                        HoldMode::Permits(n) => n,
                        _ => 0,
                    })
                    .sum();
                Ok(info.permits.unwrap_or(self.permits).saturating_sub(used))
            }
            Some(found) => Err(Error::WrongKind {
                name: info.name,
                found,
            }),
        }
    }

    /// Stores this handle's count as the capacity of the semaphore while it is in use, and returns the capacity it
    /// replaced. On a free semaphore nothing needs storing (the next grant stores its own count) and `None` is
    /// returned.
    ///
    /// Lowering the count never revokes a held permit: new grants wait until the holders are below it. Raising it
    /// grants the waiters it makes room for at once. The tasks queued when the count changes keep their place and
    /// are judged by the new count; new requests must carry it (the old count is refused with
    /// [`Error::WrongPermits`]), so give it to every handle too.
    ///
    /// # Errors
    ///
    /// [`InvalidArgument::BadPermits`] for a count of 0 or above [`MAX_PERMITS`]; [`Error::WrongKind`] when the
    /// name holds a lock of another kind; [`Error::NotALock`] and [`Error::Redis`] as their docs say;
    /// [`Error::Unsupported`] on every store but Redis ([`Capability::StoredPermits`](crate::Capability::StoredPermits)).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that a dropped call may still have stored the count.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// // Raise the limit of a semaphore in use from 4 to 6.
    /// let previous = locks.semaphore("exports", 6).set_permits().await?;
    /// assert!(matches!(previous, Some(4) | None));
    /// # Ok(()) }
    /// ```
    pub async fn set_permits(&self) -> Result<Option<u64>, Error> {
        require_runtime()?;
        self.ask(1)?;
        let keys = self.queued.keys.clone()?;
        self.queued
            .client
            .store
            .set_permits(&keys, self.permits)
            .await
    }
}
