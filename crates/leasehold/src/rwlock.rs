//! The read-write lock: many readers or one writer, with waiting writers ahead of new readers.

use std::time::Duration;

use crate::client::Client;
use crate::error::Error;
use crate::guard::Guard;
use crate::queued::{deadline_in, queued_options, Ask, Queued};

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

    /// Waits for the write lock: granted when nobody holds the lock.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`read`](RwLock::read).
    pub async fn write(&self) -> Result<Guard, Error> {
        self.queued.acquire(&write_ask(), None).await
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
    pub async fn write_timeout(&self, timeout: Duration) -> Result<Guard, Error> {
        self.queued
            .acquire(&write_ask(), deadline_in(timeout))
            .await
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
    pub async fn try_write(&self) -> Result<Guard, Error> {
        self.queued.try_acquire(&write_ask()).await
    }
}
