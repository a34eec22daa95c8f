//! The lock kinds a user takes: `Mutex`, `FairMutex`, `RwLock`, `Semaphore`, `ReentrantMutex`, their guards, and
//! `queued`, the engine of the four kinds that keep a queue.

pub(crate) mod fair;
pub(crate) mod guard;
pub(crate) mod mutex;
pub(crate) mod queued;
pub(crate) mod reentrant;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
