//! The one error type of the crate.

use std::time::Duration;

use crate::lease::LossReason;

/// Everything that can go wrong when taking, keeping or giving back a lock.
///
/// The variants let a caller tell apart "someone else holds it" ([`Error::Busy`]), "I gave up waiting"
/// ([`Error::Timeout`]), "I had it and lost it" ([`Error::LeaseLost`], [`Error::NotOwner`]), "I asked for
/// something that makes no sense" ([`Error::InvalidArgument`]), "that key is not a lock" ([`Error::NotALock`])
/// and "Redis is down or refused" ([`Error::Redis`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock is held by another owner and the call did not wait (`try_lock`).
    #[error("lock {name:?} is held by another owner")]
    Busy {
        /// The lock's name.
        name: String,
        /// The holder's remaining lease as Redis reported it, when the key has an expiry.
        remaining: Option<Duration>,
    },

    /// Waiting for the lock ended at the caller's deadline without a grant.
    #[error("gave up waiting for lock {name:?} after {waited:?}")]
    Timeout {
        /// The lock's name.
        name: String,
        /// How long the call waited.
        waited: Duration,
    },

    /// The lease ended while the caller still relied on it: it was not renewed in time, or the key was gone or
    /// held by another owner when the renewal looked.
    #[error("lease on lock {name:?} was lost: {reason}")]
    LeaseLost {
        /// The lock's name.
        name: String,
        /// Why the lease ended.
        reason: LossReason,
    },

    /// A release or an extension found that the lock was no longer ours (it expired, was force-released, or another
    /// owner holds it now). Nothing was changed in Redis.
    #[error("lock {name:?} is no longer held by this owner")]
    NotOwner {
        /// The lock's name.
        name: String,
    },

    /// An argument is outside what leasehold accepts (see [`InvalidArgument`]).
    #[error("invalid argument: {0}")]
    InvalidArgument(#[from] InvalidArgument),

    /// The name holds a lock of another kind (a [`Mutex`](crate::Mutex) asked for as a
    /// [`Semaphore`](crate::Semaphore), say): a name is used by one lock kind. Nothing was changed.
    #[error("lock {name:?} is a {found}: a name is used by one lock kind")]
    WrongKind {
        /// The lock's name.
        name: String,
        /// The kind it holds now.
        found: crate::LockKind,
    },

    /// A [`Semaphore`](crate::Semaphore) request carried a permit count other than the capacity the semaphore
    /// stores while it is in use. Nothing was granted and the request left no queue entry. Use the stored count, or
    /// change the capacity with [`Semaphore::set_permits`](crate::Semaphore::set_permits); the capacity is forgotten
    /// when the last permit is given back, and the next grant stores its own count.
    #[error(
        "semaphore {name:?} is in use with {stored} permits, and this request counts {asked}: \
         ask with {stored}, or change the count with set_permits"
    )]
    WrongPermits {
        /// The semaphore's name.
        name: String,
        /// The count the request carried.
        asked: u64,
        /// The capacity the semaphore stores.
        stored: u64,
    },

    /// A [`ReentrantMutex`](crate::ReentrantMutex) would nest deeper than [`MAX_DEPTH`](crate::MAX_DEPTH).
    #[error("lock {name:?} is nested {depth} deep already, the most a reentrant mutex allows")]
    TooDeep {
        /// The lock's name.
        name: String,
        /// The limit.
        depth: usize,
    },

    /// The lock was granted, but fewer replicas than the client requires acknowledged the grant within the replica
    /// timeout (see [`Builder::replicas`](crate::Builder::replicas)). The grant was released: a failover now could
    /// have lost it and granted the lock again.
    #[error("lock {name:?} was granted but only {acked} of the {required} required replicas acknowledged it; released")]
    NotReplicated {
        /// The lock's name.
        name: String,
        /// How many replicas acknowledged the grant.
        acked: u32,
        /// How many the client requires.
        required: u32,
    },

    /// Too few of a [`Quorum`](crate::Quorum)'s nodes answered for a majority to grant, renew or refuse: a lock call
    /// on the quorum cannot be decided. Nothing was left behind on the nodes that did answer.
    #[error("lock {name:?}: only {answered} of {nodes} nodes answered, fewer than a majority")]
    NoQuorum {
        /// The lock's name.
        name: String,
        /// How many nodes answered in time.
        answered: usize,
        /// How many nodes the quorum has.
        nodes: usize,
    },

    /// The server lacks something a setting needs (found when the client connected): `WAITAOF` for
    /// [`Builder::replicas_on_disk`](crate::Builder::replicas_on_disk) needs Redis 7.2 and the append-only file.
    #[error("not supported by this server: {detail}")]
    Unsupported {
        /// What is missing.
        detail: String,
    },

    /// The key that a lock uses exists but was not written by leasehold (another type, or a foreign value). leasehold left
    /// it untouched.
    #[error("key {key:?} exists but is not a leasehold lock ({detail})")]
    NotALock {
        /// The Redis key.
        key: String,
        /// What was found there.
        detail: String,
    },

    /// The Redis user may not do something leasehold needs (an ACL rule is missing), found when the client connected.
    /// The README lists the minimal ACL rule.
    #[error("not permitted: {detail}")]
    NotPermitted {
        /// What is missing, and the rule that grants it.
        detail: String,
        /// The server's refusal.
        #[source]
        source: redis::RedisError,
    },

    /// Redis could not be reached, timed out, or answered with an error.
    #[error("redis error: {0}")]
    Redis(#[source] redis::RedisError),

    /// Called outside a tokio runtime. leasehold runs on tokio (its connection, timers and background tasks need
    /// one): call it from inside `#[tokio::main]`, a `Runtime::block_on`, or a task.
    #[error("leasehold needs a tokio runtime, and this call was made outside one")]
    NoRuntime,

    /// The operating system could not supply random bytes for an owner token.
    #[error("no randomness for an owner token: {0}")]
    Entropy(String),
}

impl Error {
    /// True for [`Error::Busy`]: the lock is held by someone else.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }

    /// True for [`Error::Timeout`]: the wait ended at the deadline.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// True for [`Error::LeaseLost`] and [`Error::NotOwner`]: the caller no longer holds the lock.
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. } | Error::NotOwner { .. })
    }

    /// True for [`Error::Redis`]: a connection, timeout or server error.
    pub fn is_redis(&self) -> bool {
        matches!(self, Error::Redis(_))
    }

    /// True for [`Error::NotPermitted`]: the Redis user lacks an ACL permission leasehold needs.
    pub fn is_not_permitted(&self) -> bool {
        matches!(self, Error::NotPermitted { .. })
    }

    /// True for [`Error::WrongPermits`]: a semaphore request whose permit count disagrees with the stored capacity.
    pub fn is_wrong_permits(&self) -> bool {
        matches!(self, Error::WrongPermits { .. })
    }

    /// True for [`Error::InvalidArgument`].
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::InvalidArgument(_))
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        Error::Redis(err)
    }
}

/// Fails with [`Error::NoRuntime`] outside a tokio runtime, so that callers get an error rather than tokio's panic.
pub(crate) fn require_runtime() -> Result<(), Error> {
    tokio::runtime::Handle::try_current()
        .map(drop)
        .map_err(|_| Error::NoRuntime)
}

/// An argument leasehold refuses, with the limit it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidArgument {
    /// Lock names must not be empty.
    #[error("lock name is empty")]
    EmptyName,
    /// Lock names are limited to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes.
    #[error("lock name is {len} bytes long; the limit is {max}")]
    NameTooLong {
        /// The name's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The name cannot be used as given. Today: a name that starts with `}` (Redis Cluster would take the empty
    /// text between the key's `{` and that `}` as the hash tag and spread the lock's keys over several slots).
    #[error("lock name {name:?} is not allowed: {why}")]
    BadName {
        /// The name, cut to 64 characters.
        name: String,
        /// The rule it broke.
        why: &'static str,
    },
    /// The key prefix must be non-empty, at most 64 bytes, and free of `{` and `}` (the braces are the lock's
    /// hash tag).
    #[error("key prefix {0:?} is not allowed: non-empty, at most 64 bytes, no braces")]
    BadPrefix(String),
    /// A lease must lie within [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL).
    #[error("lease {ttl:?} is outside {min:?}..={max:?}")]
    BadTtl {
        /// The lease asked for.
        ttl: Duration,
        /// Smallest accepted lease.
        min: Duration,
        /// Largest accepted lease.
        max: Duration,
    },
    /// The renewal interval must be non-zero and shorter than the lease's validity (lease minus drift allowance).
    #[error("renewal every {every:?} does not fit a lease of {ttl:?}; it must be non-zero and below {limit:?}")]
    BadRenewal {
        /// The interval asked for.
        every: Duration,
        /// The lease.
        ttl: Duration,
        /// The exclusive upper bound.
        limit: Duration,
    },
    /// A semaphore's permit count must be 1 to [`MAX_PERMITS`](crate::MAX_PERMITS), and an acquisition asks for 1 to
    /// that many.
    #[error("cannot acquire {asked} of {permits} permits: the count must be 1 to 2^40 and a request 1 to the count")]
    BadPermits {
        /// The permits asked for at once.
        asked: u64,
        /// The semaphore's count.
        permits: u64,
    },
    /// A duration option (timeout, retention) was zero or too large to use.
    #[error("{what} of {value:?} is not allowed ({why})")]
    BadDuration {
        /// Which option.
        what: &'static str,
        /// The value given.
        value: Duration,
        /// The rule it broke.
        why: &'static str,
    },
    /// The Redis URL could not be parsed (the message says why; it does not repeat the URL, which may hold a
    /// password).
    #[error("redis URL is not valid: {0}")]
    BadUrl(String),
    /// A holder description must be 1 to [`MAX_DESCRIPTION_LEN`](crate::MAX_DESCRIPTION_LEN) bytes of text
    /// without control characters.
    #[error("holder description {description:?} is not allowed: {why}")]
    BadDescription {
        /// The description, cut to 64 characters.
        description: String,
        /// The rule it broke.
        why: &'static str,
    },
    /// The TLS settings cannot be used: a CA or client certificate that is not PEM or holds nothing usable, or
    /// certificates given for a URL without TLS (`redis://` instead of `rediss://`).
    #[error("TLS settings are not usable: {0}")]
    BadTls(String),
}
