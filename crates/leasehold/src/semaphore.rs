//! The counting semaphore: at most N permits held at once across every process, each permit a leased grant.

use std::time::Duration;

use crate::client::Client;
use crate::error::{Error, InvalidArgument};
use crate::guard::Guard;
use crate::queued::{deadline_in, queued_options, Ask, Queued};

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
/// The count is the handle's: every acquisition carries it, and a waiter is admitted while the permits in use plus
/// its own are at most the count *it* carries. To change the count while the semaphore is in use, give the new count
/// to the handles (a new deployment, a configuration reload): lowering it never revokes a held permit, it only stops
/// new grants until the holders drop below it; raising it takes effect with the next acquisition or release. During
/// the change, each waiter is judged by its own count.
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

    fn ask(&self, k: u64) -> Result<Ask, Error> {
        if self.permits == 0 || self.permits > MAX_PERMITS || k == 0 || k > self.permits {
            return Err(InvalidArgument::BadPermits {
                asked: k,
                permits: self.permits,
            }
            .into());
        }
        Ok(Ask {
            tag: format!("s{k}"),
            limit: self.permits,
        })
    }

    /// Waits for one permit.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock); [`InvalidArgument::BadPermits`] for a count of 0 or above
    /// [`MAX_PERMITS`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue at once and leaves no permit behind.
    pub async fn acquire(&self) -> Result<Guard, Error> {
        self.acquire_many(1).await
    }

    /// Waits for `k` permits, granted together as one hold (released together).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Semaphore::acquire); [`InvalidArgument::BadPermits`] when `k` is 0 or more than the count.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Semaphore::acquire).
    pub async fn acquire_many(&self, k: u64) -> Result<Guard, Error> {
        let ask = self.ask(k)?;
        self.queued.acquire(&ask, None).await
    }

    /// Waits at most `timeout` for `k` permits.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time ran out; otherwise as [`acquire_many`](Semaphore::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Semaphore::acquire).
    pub async fn acquire_timeout(&self, k: u64, timeout: Duration) -> Result<Guard, Error> {
        let ask = self.ask(k)?;
        self.queued.acquire(&ask, deadline_in(timeout)).await
    }

    /// Tries once for `k` permits: granted only when they are free and nobody live waits.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when they are not; otherwise as [`acquire_many`](Semaphore::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a grant that lands after the future was dropped is released in the background.
    pub async fn try_acquire(&self, k: u64) -> Result<Guard, Error> {
        let ask = self.ask(k)?;
        self.queued.try_acquire(&ask).await
    }
}
