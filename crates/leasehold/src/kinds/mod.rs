//! The lock kinds a user takes: `Mutex`, `FairMutex`, `RwLock`, `Semaphore`, `ReentrantMutex`, their guards, and
//! `queued`, what the four kinds that keep a queue share. A kind says what it asks for; its store (reached through
//! `store.rs`, the seam, which alone names the stores) does the asking.

pub(crate) mod fair;
#[cfg(sql_stores)]
pub(crate) mod fenced;
pub(crate) mod guard;
pub(crate) mod mutex;
pub(crate) mod queued;
pub(crate) mod reentrant;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
pub(crate) mod store;
