//! What [`Client::inspect`](crate::Client::inspect) and [`Client::held_locks`](crate::Client::held_locks) report
//! about a lock, on every store: below the stores, which fill it in, and the client, which returns it.

use std::fmt;
use std::time::Duration;

use crate::fence::Fence;

/// What [`Client::inspect`](crate::Client::inspect) found.
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// The kind of lock the name holds now, as its key shows it; `None` when nothing holds it.
    pub kind: Option<LockKind>,
    /// The current holder (for a queued kind, the hold whose lease ends first), or `None` when the lock is free.
    pub holder: Option<Holder>,
    /// Every current holder: one for a mutex, any number of readers or permit holders for the queued kinds.
    pub holders: Vec<Holder>,
    /// The fence of the most recent grant, when the counter still exists.
    pub last_fence: Option<Fence>,
    /// How many live waiters the lock has: waiting clients (processes, usually) for a [`Mutex`](crate::Mutex), waiting tasks for
    /// the queued kinds. A waiter counts while its queue entry is live, that is for 3 s after its last attempt (it
    /// makes one at least every second): one that gave up, was killed or froze stops counting then, even while its
    /// entry still sits in the queue for the next release to skip.
    pub waiting_clients: u64,
    /// A [`Semaphore`](crate::Semaphore)'s capacity, as it stores it while a permit is held (see its "The permit
    /// count" section); `None` for a free semaphore and for the other kinds.
    pub permits: Option<u64>,
}

/// The kinds of lock a name can hold: in `error.rs`, which names it, below the engine.
pub use crate::error::LockKind;

/// What one holder holds.
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum HoldMode {
    /// The whole lock: a [`Mutex`](crate::Mutex) or [`FairMutex`](crate::FairMutex) grant.
    Exclusive,
    /// A read share of a [`RwLock`](crate::RwLock).
    Read,
    /// The write lock of a [`RwLock`](crate::RwLock).
    Write,
    /// This many permits of a [`Semaphore`](crate::Semaphore).
    Permits(u64),
    /// The root grant of a [`ReentrantMutex`](crate::ReentrantMutex).
    Reentrant,
    /// A nested hold of a [`ReentrantMutex`](crate::ReentrantMutex), taken with its holder's token.
    Nested,
}

impl HoldMode {
    /// The mode of a hold as stored: a mutex's bare token, or `"<tag> <token>"` (see `scripts/set.lua`).
    pub(crate) fn of(hold: &str) -> HoldMode {
        match hold.split_once(' ').map(|(tag, _)| tag) {
            Some("r") => HoldMode::Read,
            Some("w") => HoldMode::Write,
            Some("e") => HoldMode::Reentrant,
            Some("n") => HoldMode::Nested,
            Some(tag) if tag.starts_with('s') => tag[1..]
                .parse()
                .map_or(HoldMode::Exclusive, HoldMode::Permits),
            _ => HoldMode::Exclusive,
        }
    }

    pub(crate) fn kind(self) -> LockKind {
        match self {
            HoldMode::Exclusive => LockKind::Fair,
            HoldMode::Read | HoldMode::Write => LockKind::ReadWrite,
            HoldMode::Permits(_) => LockKind::Semaphore,
            HoldMode::Reentrant | HoldMode::Nested => LockKind::Reentrant,
        }
    }
}

impl fmt::Display for HoldMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldMode::Exclusive => f.write_str("exclusive"),
            HoldMode::Read => f.write_str("read"),
            HoldMode::Write => f.write_str("write"),
            HoldMode::Permits(1) => f.write_str("1 permit"),
            HoldMode::Permits(n) => write!(f, "{n} permits"),
            HoldMode::Reentrant => f.write_str("reentrant"),
            HoldMode::Nested => f.write_str("nested"),
        }
    }
}

/// The holder of a lock, as [`Client::inspect`](crate::Client::inspect) saw it.
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Holder {
    /// The holder's owner token (with its description, when it gave one: see [`Mutex::describe`](crate::Mutex::describe)).
    pub token: String,
    /// What the holder said about itself ([`Mutex::describe`](crate::Mutex::describe)); the command gives host, pid, user, start time and
    /// program.
    pub description: Option<String>,
    /// The value an election's leader publishes ([`Election::campaign`](crate::Election::campaign),
    /// [`Leadership::proclaim`](crate::Leadership::proclaim)); for a holder another client wrote on etcd or
    /// ZooKeeper, what its entry stores (an `etcdctl elect` proposal, a kazoo `Election`'s identifier), when not
    /// empty; `None` for every other hold.
    pub value: Option<String>,
    /// The number of the election term it leads, once its campaign counted the term
    /// ([`Leadership::term`](crate::Leadership::term)); `None` for every other hold.
    #[cfg_attr(feature = "serde", serde(default))]
    pub term: Option<u64>,
    /// What it holds.
    pub mode: HoldMode,
    /// The remaining lease on the server, when the key has an expiry (on etcd, the session lease's TTL; `None` on
    /// ZooKeeper, which does not tell one client how long another's session has left).
    pub remaining: Option<Duration>,
}
