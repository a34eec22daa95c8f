//! The one error type of the crate, and how its messages print durations.
//!
//! How the errors print: each one states its own part and returns what it wraps as [`source`](
//! std::error::Error::source), without repeating it in its text. A chain printer (anyhow's `{:#}`, `tracing`'s error
//! chains, a loop over `source()`) then shows every cause once: `Redis request failed: Connection refused (os error
//! 111)`. A `RedisError` prints the text of the error under it, so for the variants that carry one, `source()` is
//! that inner error (the I/O error, the server's reply, the parse error) when there is one, and the `RedisError`
//! itself otherwise; the `RedisError` is also the variant's field and [`Error::redis_error`] returns it.

use std::fmt;
use std::time::Duration;

/// Everything that can go wrong when taking, keeping or giving back a lock.
///
/// The variants let a caller tell apart "someone else holds it" ([`Error::Busy`]), "I gave up waiting"
/// ([`Error::Timeout`]), "I had it and lost it" ([`Error::LeaseLost`], [`Error::NotOwner`]), "I asked for
/// something that makes no sense" ([`Error::InvalidArgument`]), "that key is not a lock" ([`Error::NotALock`])
/// and "the store is down or refused" ([`Error::Connect`], [`Error::Redis`] on Redis; [`Error::Store`] on etcd,
/// ZooKeeper, PostgreSQL and MySQL/MariaDB).
///
/// Its text says what happened and leaves the cause to [`source`](std::error::Error::source): print it with a chain
/// printer (`{:#}` of an `anyhow::Error`, or a loop over `source()`) to see both, each once.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The lock is held by another owner and the call did not wait (`try_lock`).
    Busy {
        /// The lock's name.
        name: String,
        /// The holder's remaining lease as Redis reported it, when the key has an expiry.
        remaining: Option<Duration>,
    },

    /// Waiting for the lock ended at the caller's deadline without a grant.
    Timeout {
        /// The lock's name.
        name: String,
        /// How long the call waited.
        waited: Duration,
    },

    /// The lease ended while the caller still relied on it: it was not renewed in time, or the key was gone or
    /// held by another owner when the renewal looked.
    LeaseLost {
        /// The lock's name.
        name: String,
        /// Why the lease ended.
        reason: LossReason,
    },

    /// A release or an extension found that the lock was no longer ours (it expired, was force-released, or another
    /// owner holds it now). Nothing was changed in Redis.
    NotOwner {
        /// The lock's name.
        name: String,
    },

    /// An argument is outside what leasehold accepts (see [`InvalidArgument`]).
    InvalidArgument(InvalidArgument),

    /// The name holds a lock of another kind (a [`Mutex`](crate::Mutex) asked for as a
    /// [`Semaphore`](crate::Semaphore), say): a name is used by one lock kind. Nothing was changed.
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
    WrongPermits {
        /// The semaphore's name.
        name: String,
        /// The count the request carried.
        asked: u64,
        /// The capacity the semaphore stores.
        stored: u64,
    },

    /// A [`ReentrantMutex`](crate::ReentrantMutex) would nest deeper than [`MAX_DEPTH`](crate::MAX_DEPTH).
    TooDeep {
        /// The lock's name.
        name: String,
        /// The limit.
        depth: usize,
    },

    /// The lock was granted, but fewer replicas than the client requires acknowledged the grant within the replica
    /// timeout (see [`Builder::replicas`](crate::Builder::replicas)). The grant was released: a failover now could
    /// have lost it and granted the lock again.
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
    NoQuorum {
        /// The lock's name.
        name: String,
        /// How many nodes answered in time.
        answered: usize,
        /// How many nodes the quorum has.
        nodes: usize,
    },

    /// The store cannot do what was asked: a [`Capability`](crate::Capability) it lacks (a fixed lease, `extend`,
    /// `downgrade`… off Redis; [`Builder::replicas_on_disk`](crate::Builder::replicas_on_disk) on a Redis without
    /// `WAITAOF`, found when the client connects). Refused before anything was sent or taken;
    /// [`Client::supports`](crate::Client::supports) gives the same answer at start-up.
    Unsupported {
        /// What is missing.
        detail: String,
    },

    /// The key that a lock uses exists but was not written by leasehold (another type, or a foreign value). leasehold left
    /// it untouched.
    NotALock {
        /// The Redis key.
        key: String,
        /// What was found there.
        detail: String,
    },

    /// The store's user may not do something leasehold needs, found when the client connected: on Redis an ACL rule
    /// is missing; on PostgreSQL and MySQL/MariaDB a right on the lease tables (or, when they are missing, the right
    /// to create them). The README lists the minimal ACL rule and the SQL `GRANT`s.
    NotPermitted {
        /// What is missing, and the rule or statement that grants it.
        detail: String,
        /// The server's refusal (Redis); `None` when leasehold asked the server which rights the user has and found
        /// one missing (PostgreSQL, MySQL/MariaDB).
        source: Option<redis::RedisError>,
    },

    /// The client could not connect to the server at `url`: it was not reachable within the connection timeout,
    /// refused the credentials or the TLS handshake, closed the connection, or did not answer as Redis does. Found
    /// by [`Builder::connect`](crate::Builder::connect) (and [`Client::connect`](crate::Client::connect)).
    Connect {
        /// The server's URL, with the password replaced by `***` (`redis://app:***@10.0.0.1:6379`).
        url: String,
        /// What the failure most likely means and what to do, when leasehold can tell: `rediss://` for a server that
        /// speaks TLS, another service on the port, a client certificate that is not X.509 v3.
        hint: Option<String>,
        /// What redis-rs reported.
        source: redis::RedisError,
    },

    /// Redis could not be reached, timed out, or answered with an error.
    Redis(redis::RedisError),

    /// A store other than Redis (etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB, each with its cargo feature) could
    /// not be reached within the per-call deadline on any member, refused a request, or lost the session the
    /// client's grants lived in.
    Store {
        /// Which store: `"etcd"`, `"zookeeper"`, `"postgres"` or `"mysql"`.
        store: &'static str,
        /// The URL the client was connected with.
        url: String,
        /// What the store's client reported.
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The client talks to one server, and that server answered a lock's request with a Redis Cluster redirection
    /// (`MOVED` or `ASK`): it is a Redis Cluster node. [`Client::connect`](crate::Client::connect) recognises a
    /// cluster node behind a `redis://` URL and uses the cluster client instead; this error is left for a server
    /// that became a cluster node later, a connection given to [`Builder::connection`](crate::Builder::connection),
    /// and a Redis user that may run neither `INFO` nor `CLUSTER SLOTS`. It is not retried: the call fails at once.
    ClusterNode {
        /// The URL to connect with instead: `redis+cluster://host:port` for this node, password hidden.
        url: String,
        /// The server's answer (`MOVED 14415 10.0.0.3:7002`).
        answer: String,
    },

    /// Called outside a tokio runtime. leasehold runs on tokio (its connection, timers and background tasks need
    /// one): call it from inside `#[tokio::main]`, a `Runtime::block_on`, or a task.
    NoRuntime,

    /// The operating system could not supply random bytes for an owner token.
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

    /// True for [`Error::Redis`] and [`Error::Connect`]: a connection, timeout or server error.
    pub fn is_redis(&self) -> bool {
        matches!(self, Error::Redis(_) | Error::Connect { .. })
    }

    /// True for [`Error::Redis`], [`Error::Connect`] and [`Error::Store`]: the store (whichever it is) could not be
    /// reached, timed out, or failed a request.
    pub fn is_store(&self) -> bool {
        matches!(
            self,
            Error::Redis(_) | Error::Connect { .. } | Error::Store { .. }
        )
    }

    /// True for [`Error::NotPermitted`]: the store's user lacks a permission leasehold needs (a Redis ACL rule, a SQL
    /// right).
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

impl Error {
    /// The `RedisError` this error carries ([`Error::Connect`], [`Error::Redis`], [`Error::NotPermitted`]), if any.
    pub fn redis_error(&self) -> Option<&redis::RedisError> {
        match self {
            Error::Connect { source, .. } | Error::Redis(source) => Some(source),
            Error::NotPermitted { source, .. } => source.as_ref(),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Busy { name, .. } => write!(f, "lock {name:?} is held by another owner"),
            Error::Timeout { name, waited } => {
                write!(f, "gave up waiting for lock {name:?} after {}", human(*waited))
            }
            Error::LeaseLost { name, reason } => write!(f, "lease on lock {name:?} was lost: {reason}"),
            Error::NotOwner { name } => write!(f, "lock {name:?} is no longer held by this owner"),
            Error::InvalidArgument(_) => f.write_str("invalid argument"),
            Error::WrongKind { name, found } => {
                write!(f, "lock {name:?} is a {found}: a name is used by one lock kind")
            }
            Error::WrongPermits {
                name,
                asked,
                stored,
            } => write!(
                f,
                "semaphore {name:?} is in use with {stored} permits, and this request counts {asked}: ask with \
                 {stored}, or change the count with set_permits"
            ),
            Error::TooDeep { name, depth } => write!(
                f,
                "lock {name:?} is nested {depth} deep already, the most a reentrant mutex allows"
            ),
            Error::NotReplicated {
                name,
                acked,
                required,
            } => write!(
                f,
                "lock {name:?} was granted but only {acked} of the {required} required replicas acknowledged it; \
                 released"
            ),
            Error::NoQuorum {
                name,
                answered,
                nodes,
            } => write!(
                f,
                "lock {name:?}: only {answered} of {nodes} nodes answered, fewer than a majority"
            ),
            Error::Unsupported { detail } => write!(f, "not supported: {detail}"),
            Error::NotALock { key, detail } => {
                write!(f, "key {key:?} exists but is not a leasehold lock ({detail})")
            }
            Error::NotPermitted { detail, .. } => write!(f, "not permitted: {detail}"),
            Error::Connect { url, hint, .. } => {
                write!(f, "cannot connect to Redis at {url}")?;
                match hint {
                    Some(hint) => write!(f, " ({hint})"),
                    None => Ok(()),
                }
            }
            Error::Redis(_) => f.write_str("Redis request failed"),
            Error::Store { store, url, .. } => write!(f, "{store} at {url} failed"),
            Error::ClusterNode { url, answer } => write!(
                f,
                "this is a Redis Cluster node: use {url} (it answered a lock's request with {answer:?})"
            ),
            Error::NoRuntime => {
                f.write_str("leasehold needs a tokio runtime, and this call was made outside one")
            }
            Error::Entropy(why) => write!(f, "no randomness for an owner token: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::InvalidArgument(source) => Some(source),
            Error::Connect { source, .. } | Error::Redis(source) => Some(cause_of(source)),
            Error::NotPermitted { source, .. } => source.as_ref().map(cause_of),
            Error::Store { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// What a chain printer should show under an error that carries `err`: the error under `err` when it has one (a
/// `RedisError` prints its inner error's text, so showing both would say it twice), else `err` itself.
fn cause_of(err: &redis::RedisError) -> &(dyn std::error::Error + 'static) {
    use std::error::Error as _;
    err.source().unwrap_or(err)
}

impl From<InvalidArgument> for Error {
    fn from(err: InvalidArgument) -> Self {
        Error::InvalidArgument(err)
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        match cluster_node(&err) {
            Some((url, answer)) => Error::ClusterNode {
                url: url.to_owned(),
                answer: answer.to_owned(),
            },
            None => Error::Redis(err),
        }
    }
}

/// Why a lease ended.
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum LossReason {
    /// No renewal was confirmed before the validity deadline (Redis down or slow, network cut, process paused).
    /// The key may still exist on the server for a moment; nobody else can hold it before it expires there.
    Expired,
    /// The store no longer had the grant: on Redis a renewal found the key gone (it expired on the server, was
    /// force-released, or Redis lost it in a restart without persistence or a failover); on etcd, ZooKeeper, PostgreSQL and
    /// MySQL/MariaDB the grant's entry was deleted (a force release) or its session ended on the server.
    Gone,
    /// A renewal found the key held by another owner.
    Taken,
    /// Not a failure: the guard was released or dropped.
    Released,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::Expired => "not renewed before its validity deadline",
            LossReason::Gone => "the lock was gone from the store",
            LossReason::Taken => "another owner holds the lock",
            LossReason::Released => "released by its holder",
        })
    }
}

/// The kinds of lock a name can hold.
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum LockKind {
    /// [`Mutex`](crate::Mutex).
    Mutex,
    /// [`FairMutex`](crate::FairMutex).
    Fair,
    /// [`RwLock`](crate::RwLock).
    ReadWrite,
    /// [`Semaphore`](crate::Semaphore).
    Semaphore,
    /// [`ReentrantMutex`](crate::ReentrantMutex).
    Reentrant,
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LockKind::Mutex => "mutex",
            LockKind::Fair => "fair mutex",
            LockKind::ReadWrite => "read-write lock",
            LockKind::Semaphore => "semaphore",
            LockKind::Reentrant => "reentrant mutex",
        })
    }
}

/// The code of the error a single-server connection returns for a cluster redirection (see `redirected` in `backend/redis/conn.rs`).
pub(crate) const CLUSTER_NODE_CODE: &str = "LEASEHOLD_CLUSTER_NODE";

/// The URL to use and the server's answer, for an error made by `redirected` (`backend/redis/conn.rs`).
pub(crate) fn cluster_node(err: &redis::RedisError) -> Option<(&str, &str)> {
    if err.code() != Some(CLUSTER_NODE_CODE) {
        return None;
    }
    err.detail()?.split_once(' ')
}

/// `duration` as people write it: `252ms`, `1.5s`, `2m30s`, `1h`, `30d` (`Debug` would print `252.417ms`). Below a
/// second it is cut to whole milliseconds (or microseconds, below one millisecond); from a second up it keeps
/// milliseconds only in its seconds (`1.25s`, `1m0.5s`).
pub(crate) fn human(duration: Duration) -> impl fmt::Display {
    Human(duration)
}

struct Human(Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d < Duration::from_micros(1) {
            return write!(f, "{}ns", d.as_nanos());
        }
        if d < Duration::from_millis(1) {
            return write!(f, "{}µs", d.as_micros());
        }
        if d < Duration::from_secs(1) {
            return write!(f, "{}ms", d.as_millis());
        }
        let secs = d.as_secs();
        let (days, hours, minutes, seconds) =
            (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
        let millis = d.subsec_millis();
        for (value, unit) in [(days, "d"), (hours, "h"), (minutes, "m")] {
            if value > 0 {
                write!(f, "{value}{unit}")?;
            }
        }
        match (seconds, millis) {
            (0, 0) => Ok(()),
            (seconds, 0) => write!(f, "{seconds}s"),
            (seconds, millis) => {
                let fraction = format!("{millis:03}");
                write!(f, "{seconds}.{}s", fraction.trim_end_matches('0'))
            }
        }
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
    /// The key prefix breaks the store's rule, which `rule` states: on Redis and etcd non-empty, at most 64 bytes,
    /// and free of `{` and `}` (the braces are the lock's hash tag); on PostgreSQL and MySQL/MariaDB it names the
    /// lease tables, so ASCII letters, digits and `_`, not starting with a digit, at most 40 bytes; on ZooKeeper it
    /// must also make a valid node path.
    #[error("key prefix {prefix:?} is not allowed: {rule}")]
    BadPrefix {
        /// The prefix given.
        prefix: String,
        /// The rule it broke, for this store.
        rule: String,
    },
    /// A lease must lie within [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL).
    #[error("lease {} is outside {}..={}", human(*.ttl), human(*.min), human(*.max))]
    BadTtl {
        /// The lease asked for.
        ttl: Duration,
        /// Smallest accepted lease.
        min: Duration,
        /// Largest accepted lease.
        max: Duration,
    },
    /// The renewal interval must be non-zero and shorter than the lease's validity (lease minus drift allowance).
    #[error(
        "renewal every {} does not fit a lease of {}; it must be non-zero and below {}",
        human(*.every),
        human(*.ttl),
        human(*.limit)
    )]
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
    #[error("{what} of {} is not allowed ({why})", human(*.value))]
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
    /// The URL's scheme is none leasehold knows (`postgress://`, or `http://` as `etcdctl --endpoints` writes an etcd
    /// member). The message lists the schemes this build takes and those a cargo feature would add.
    #[error("the scheme {scheme:?} is not one leasehold knows{}; {known}", did_you_mean(*.nearest))]
    UnknownScheme {
        /// The scheme written (before `://`), cut to 32 characters.
        scheme: String,
        /// The known scheme nearest to it, if one is near.
        nearest: Option<&'static str>,
        /// The schemes this build takes, and those a feature would add.
        known: String,
    },
    /// A holder description must be 1 to [`MAX_DESCRIPTION_LEN`](crate::MAX_DESCRIPTION_LEN) bytes of text
    /// without control characters.
    #[error("holder description {description:?} is not allowed: {why}")]
    BadDescription {
        /// The description, cut to 64 characters.
        description: String,
        /// The rule it broke.
        why: &'static str,
    },
    /// A value an election's leader publishes must be 1 to [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN) bytes of text
    /// without control characters.
    #[error("election value {value:?} is not allowed: {why}")]
    BadValue {
        /// The value, cut to 64 characters.
        value: String,
        /// The rule it broke.
        why: &'static str,
    },
    /// A [`MultiLock`](crate::MultiLock) was asked for with no member.
    #[error("a set of locks needs at least one member")]
    EmptySet,
    /// A [`MultiLock`](crate::MultiLock) names the same lock twice (one member per name, whatever the kinds).
    #[error("lock name {name:?} is in the set twice")]
    DuplicateName {
        /// The name, cut to 64 characters.
        name: String,
    },
    /// The TLS settings cannot be used: a CA or client certificate that is not PEM or holds nothing usable, or
    /// certificates given for a URL without TLS (`redis://` instead of `rediss://`, `etcd://` instead of `etcds://`, a
    /// `zk://` URL).
    #[error("TLS settings are not usable: {0}")]
    BadTls(String),
}

/// ` (did you mean postgres://?)`, or nothing.
fn did_you_mean(nearest: Option<&str>) -> String {
    nearest
        .map(|scheme| format!(" (did you mean {scheme}://?)"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_people_write_them() {
        let cases = [
            (Duration::ZERO, "0ns"),
            (Duration::from_nanos(700), "700ns"),
            (Duration::from_micros(250), "250µs"),
            (Duration::from_micros(252_417), "252ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(1250), "1.25s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_millis(60_500), "1m0.5s"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_secs(30 * 86_400), "30d"),
            (Duration::from_secs(86_400 + 2 * 3600 + 5), "1d2h5s"),
        ];
        for (duration, text) in cases {
            assert_eq!(human(duration).to_string(), text, "{duration:?}");
        }
    }

    /// The texts of `err`'s chain, as a chain printer walks it.
    fn chain(err: &Error) -> Vec<String> {
        let mut texts = Vec::new();
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(cause) = next {
            texts.push(cause.to_string());
            next = cause.source();
        }
        texts
    }

    #[test]
    fn no_error_repeats_its_cause() {
        let refused =
            || redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let errors = [
            Error::Redis(refused()),
            Error::Redis(redis::RedisError::from((redis::ErrorKind::Io, "timed out"))),
            Error::Connect {
                url: "redis://127.0.0.1:1".to_owned(),
                hint: None,
                source: refused(),
            },
            Error::from(InvalidArgument::EmptyName),
            Error::NotPermitted {
                detail: "grant +publish".to_owned(),
                source: Some(redis::make_extension_error(
                    "NOPERM".to_owned(),
                    Some("no".to_owned()),
                )),
            },
            Error::NotPermitted {
                detail: "PostgreSQL user app lacks INSERT on table leasehold_session".to_owned(),
                source: None,
            },
        ];
        for err in &errors {
            let texts = chain(err);
            for (i, text) in texts.iter().enumerate() {
                for earlier in &texts[..i] {
                    assert!(
                        !earlier.contains(text.as_str()),
                        "{texts:?} repeats {text:?}"
                    );
                }
            }
        }
        assert_eq!(
            chain(&errors[3]),
            ["invalid argument", "lock name is empty"]
        );
        assert_eq!(
            chain(&errors[1]),
            ["Redis request failed", "timed out - Io"]
        );
        assert_eq!(
            chain(&errors[2])[0],
            "cannot connect to Redis at redis://127.0.0.1:1"
        );
    }

    #[test]
    fn every_redis_carrying_variant_hands_out_its_redis_error() {
        let err = Error::from(redis::RedisError::from((redis::ErrorKind::Io, "x")));
        assert!(err.redis_error().is_some());
        assert!(Error::NoRuntime.redis_error().is_none());
    }
}
