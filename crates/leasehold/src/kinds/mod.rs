//! The lock kinds a user takes: `Mutex`, `FairMutex`, `RwLock`, `Semaphore`, `ReentrantMutex`, their guards, and
//! `queued`, what the four kinds that keep a queue share. A kind says what it asks for; its store (reached through
//! `store.rs`, the seam, which alone names the stores) does the asking.

pub(crate) mod election;
pub(crate) mod fair;
#[cfg(sql_stores)]
pub(crate) mod fenced;
pub(crate) mod guard;
pub(crate) mod multi;
pub(crate) mod mutex;
pub(crate) mod queued;
pub(crate) mod reentrant;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
pub(crate) mod store;

use crate::client::Client;

/// The handles to each kind of lock, made from a client (here, above the client, so that `client.rs` needs none of
/// the kinds).
impl Client {
    /// A handle for the non-reentrant mutex called `name`. Creating it does no I/O; the name is checked by the
    /// first operation, which reports a bad name as [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    pub fn mutex(&self, name: &str) -> crate::Mutex {
        crate::Mutex::new(self.clone(), name)
    }

    /// A handle to the strictly fair mutex called `name` (see [`FairMutex`](crate::FairMutex)). Cheap; nothing is sent until it is
    /// used.
    pub fn fair_mutex(&self, name: &str) -> crate::FairMutex {
        crate::FairMutex::new(self.clone(), name)
    }

    /// A handle to the reentrant mutex called `name` (see [`ReentrantMutex`](crate::ReentrantMutex)).
    pub fn reentrant_mutex(&self, name: &str) -> crate::ReentrantMutex {
        crate::ReentrantMutex::new(self.clone(), name)
    }

    /// A handle to the read-write lock called `name` (see [`RwLock`](crate::RwLock)).
    pub fn rw_lock(&self, name: &str) -> crate::RwLock {
        crate::RwLock::new(self.clone(), name)
    }

    /// The election called `name` (see [`Election`](crate::Election)): campaign to lead it, or observe who leads.
    pub fn election(&self, name: &str) -> crate::Election {
        crate::Election::new(self.clone(), name)
    }

    /// A set of locks to take as one (see [`MultiLock`](crate::MultiLock)): add its members, then `lock()`.
    pub fn multi_lock(&self) -> crate::MultiLock {
        crate::MultiLock::new(self.clone())
    }

    /// A handle to the counting semaphore called `name` with `permits` permits (see [`Semaphore`](crate::Semaphore)).
    /// The count is checked by the first operation ([`crate::InvalidArgument::BadPermits`]).
    pub fn semaphore(&self, name: &str, permits: u64) -> crate::Semaphore {
        crate::Semaphore::new(self.clone(), name, permits)
    }
}
