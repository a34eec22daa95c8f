//! The session engine: what etcd, ZooKeeper, PostgreSQL and MySQL/MariaDB share, written once.
//!
//! On those stores a grant is an entry (a key, a node, a row) that lives as long as the client's session: an etcd
//! lease, a ZooKeeper session, a session row. The engine runs everything around the entries:
//!
//! - **the session's life** ([`life`]): opened, kept alive every fraction of its TTL by one task, its deadline moved by
//!   each answered keep-alive (from the keep-alive's send time, less the drift allowance), lost at that deadline at the
//!   latest or at once when the store says the session ended, closed at exit;
//! - **the grants following it** ([`state`]): each grant's lease registers every keep-alive before it leaves and is
//!   confirmed by its answer, so its deadline arithmetic and loss timers are the Redis leases'; after each answered
//!   keep-alive every grant's entry is read back (batched, off the keeper's loop), and a grant whose entry is gone
//!   ends as [`LossReason::Gone`](crate::LossReason::Gone);
//! - **a client's sessions** ([`sessions`]): one per lease TTL, opened lazily, replaced when lost, closed together;
//! - **the clean-ups** ([`Background`]): releases of dropped guards, entries of abandoned acquisitions and dropped
//!   sessions, counted so that [`Client::flush_releases`](crate::Client::flush_releases) and
//!   [`Client::close`](crate::Client::close) wait for every one;
//! - **an acquisition** ([`recipe`], [`wait`], [`engine`]): the entry claimed and written in the lock's order, the
//!   kinds' rules over the entries ahead, the wait for a change, a store error ridden out keeping the entry's place;
//!   the lease's TTL mapped to a session, the retries of whole attempts, the grant turned into a lease that follows
//!   its session, the release;
//! - **what `inspect` and `held_locks` report** ([`info`]).
//!
//! A store brings only its primitives, the [`Primitives`] trait: open, renew and close a session; read back the
//! entries of grants; claim, write, read ahead of, wait on, release and abandon an entry; and its error. The engine is generic over it (static
//! dispatch: no boxed future on the lock path, as `Client`'s `Store` enum is an enum for the same reason).

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::lease::LeaseShared;
use crate::error::Error;
use crate::fence::Fence;

pub(crate) mod engine;
pub(crate) mod info;
pub(crate) mod life;
pub(crate) mod recipe;
pub(crate) mod sessions;
pub(crate) mod state;
pub(crate) mod wait;

pub(crate) use engine::{Engine, Hold};
pub(crate) use info::Admitted;
pub(crate) use life::Shared;
pub(crate) use state::Background;

/// Why a session is lost, on any store with sessions (public for etcd's recipe tests: `leasehold::__etcd`).
#[cfg_attr(not(feature = "etcd"), allow(unreachable_pub))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionLoss {
    /// The local deadline passed without a newer answered keep-alive: the store may have ended the session.
    Expired,
    /// The store said the session ended (expired or revoked on the server): its entries are gone, or anyone may
    /// delete them.
    Ended,
    /// The session was closed by its client.
    Closed,
}

impl fmt::Display for SessionLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SessionLoss::Expired => "no keep-alive was answered before the local deadline",
            SessionLoss::Ended => "the store ended the session (it expired or was revoked there)",
            SessionLoss::Closed => "the session was closed",
        })
    }
}

/// An acquisition's entry, just written by [`Primitives::enqueue`].
pub(crate) struct Enqueued<W> {
    pub(crate) waiter: W,
    /// Nothing was ahead of it when it was written: granted in this one round trip, whatever its kind.
    pub(crate) first: bool,
}

/// A session just opened by [`Primitives::open`].
pub(crate) struct Opened<C> {
    /// What the session holds on the store: its connection and id.
    pub(crate) conn: C,
    /// When the request that opened it was sent: its validity counts from then.
    pub(crate) sent: Instant,
    /// The session's TTL as the store granted it (etcd's granted TTL, ZooKeeper's negotiated timeout).
    pub(crate) ttl: Duration,
    /// How long after an answered keep-alive's send time the store cannot have ended the session: the lease every
    /// grant of the session counts on (the TTL on etcd and SQL; 5/8 of the timeout on ZooKeeper).
    pub(crate) validity: Duration,
    /// How often the keeper sends a keep-alive.
    pub(crate) renew_every: Duration,
    /// How soon after a keep-alive that got no answer the next one goes, when sooner than `renew_every`.
    pub(crate) retry_after: Duration,
}

/// The answer to one keep-alive.
pub(crate) enum Renewal<E> {
    /// Answered: the store cannot end the session before `validity` after the keep-alive's send time. `entries`: the
    /// grants' entries the store reported alive in the same answer, when it does (SQL's renewal returns them);
    /// otherwise the engine reads them back with [`Primitives::read_entries`].
    Renewed {
        validity: Duration,
        entries: Option<Vec<E>>,
    },
    /// The store says the session is gone.
    Ended,
    /// No answer, or an error: the deadline decides.
    Failed,
}

/// What the engine itself refuses or lacks, the same on every store with sessions: each store's error carries it as
/// one variant (`Engine`), shown as it is (public for etcd's recipe tests: `leasehold::__etcd`).
#[cfg_attr(not(feature = "etcd"), allow(unreachable_pub))]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The session ended (or may have ended, by the local deadline): every entry of it is gone, or about to be.
    #[error("the lock session is lost: {0}")]
    SessionLost(SessionLoss),

    /// The check after a wait (or before a grant) found the acquisition's entry gone or recreated: deleted by
    /// someone else (`release --force`), or its session ended, while it waited.
    #[error("the entry {entry} was gone when its turn came")]
    LostWhileWaiting {
        /// The entry: its key, its node, or its lock's name.
        entry: String,
    },

    /// A permit request whose count differs from that of a permit entry ahead of it: a semaphore's count is the same
    /// for everyone. Its entry is deleted.
    #[error("the semaphore is in use with {stored} permits")]
    WrongPermits {
        /// The count of the oldest permit entry ahead.
        stored: u32,
    },

    /// The OS had no randomness for an id (a grant's, a session's).
    #[error("no randomness for an id: {0}")]
    Entropy(String),
}

/// `N` random bytes from the OS: the ids of grants and sessions.
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], EngineError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| EngineError::Entropy(e.to_string()))?;
    Ok(bytes)
}

/// What the engine needs of a store's error.
pub(crate) trait StoreError:
    std::error::Error + From<EngineError> + Send + Sync + Sized + 'static
{
    /// The store's name in [`Error::Store`], on the store at the URL shown as `shown`.
    fn store(shown: &str) -> &'static str;
    /// Whether the store did not answer, or answered that it cannot answer now (a member going away): what says
    /// nothing about the request itself.
    fn transient(&self) -> bool;
    /// The engine's own error it carries, when it is one.
    fn as_engine(&self) -> Option<&EngineError>;
    /// The error a lost session makes.
    fn session_lost(loss: SessionLoss) -> Self {
        EngineError::SessionLost(loss).into()
    }
    /// The error of an acquisition whose entry was gone when its turn came (`entry` names it).
    fn lost_while_waiting(entry: String) -> Self {
        EngineError::LostWhileWaiting { entry }.into()
    }
    /// Whether it says the acquisition's entry or its session is gone (a wait cannot go on with that entry).
    fn is_lost(&self) -> bool {
        matches!(
            self.as_engine(),
            Some(EngineError::SessionLost(_) | EngineError::LostWhileWaiting { .. })
        )
    }
    /// Whether a wait rides it out: a transient error, or a lost session or entry (a new one is written).
    fn passes(&self) -> bool {
        self.is_lost() || self.transient()
    }
    /// The crate's error for any other: [`Error::Store`] on the store at the URL shown as `shown`, unless the store
    /// has a better one.
    fn into_store_error(self, shown: &str) -> Error {
        Error::Store {
            store: Self::store(shown),
            url: shown.to_owned(),
            source: Box::new(self),
        }
    }
    /// The crate's error for it, on the store at the URL shown as `shown`.
    fn into_error(self, shown: &str) -> Error {
        if let Some(EngineError::Entropy(why)) = self.as_engine() {
            return Error::Entropy(why.clone());
        }
        self.into_store_error(shown)
    }
}

/// A store with sessions: its own settings (`Self`) and its primitives. Everything else is the engine's.
pub(crate) trait Primitives: Send + Sync + Sized + 'static {
    /// The store's error.
    type Error: StoreError;
    /// What a session holds on the store: its connection, its id.
    type Conn: Send + Sync + 'static;
    /// What the engine keeps of a grant to read its entry back after each keep-alive.
    type Entry: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static;
    /// What a release needs of a grant (its entry's name and version).
    type Grant: Send + Sync + 'static;

    /// How the store's sessions are named in logs ("etcd session", "ZooKeeper session").
    const SESSION: &'static str;

    /// The session TTL a lock asking for a lease of `ttl` is granted under (rounded to the store's unit), or the
    /// refusal when the store cannot honour it.
    fn session_ttl(ttl: Duration) -> Result<Duration, Error>;

    /// Where the lock `name`'s entries live (its path, prefix or name), or the refusal of a name the store cannot
    /// take.
    fn path(&self, name: &str) -> Result<String, Error>;

    /// Opens a session of `ttl` (as [`session_ttl`](Self::session_ttl) made it); its clean-ups run in `background`.
    fn open(
        &self,
        ttl: Duration,
        background: &Arc<Background>,
    ) -> impl Future<Output = Result<Opened<Self::Conn>, Self::Error>> + Send;

    /// The session's id on the store, for logs.
    fn id(conn: &Self::Conn) -> String;

    /// Logs what the store tells of a session just opened (a negotiated timeout other than the one asked for).
    fn opened(&self, _asked: Duration, _session: &Shared<Self>) {}

    /// One keep-alive, number `round` (from 1).
    fn renew(
        shared: &Arc<Shared<Self>>,
        round: i64,
    ) -> impl Future<Output = Renewal<Self::Entry>> + Send;

    /// Reads back a batch of grants' entries: for each, whether it is still the grant's (false: gone, or re-created);
    /// `None` when the store did not answer.
    fn read_entries(
        shared: &Arc<Shared<Self>>,
        entries: Vec<Self::Entry>,
    ) -> impl Future<Output = Option<Vec<bool>>> + Send;

    /// Resolves when the store's client says the session ended on its own (ZooKeeper's `Expired`); never, on stores
    /// whose client has no such word. Called once, when the keeper starts.
    fn ended(_conn: &Self::Conn) -> impl Future<Output = ()> + Send + 'static {
        std::future::pending()
    }

    /// Called when the session is lost, after its grants ended (ZooKeeper drops its client).
    fn on_lost(_conn: &Self::Conn) {}

    /// Ends the session on the store (revoke, close, delete its row): every entry of the session goes with it.
    fn close(shared: &Arc<Shared<Self>>) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// What names an acquisition's entry before it is written (drawn by [`claim`](Self::claim)), enough to delete it.
    type Claim: Send + Sync;
    /// An acquisition's entry, written: what its checks and waits need.
    type Waiter: Send + Sync;
    /// One entry ahead, as a check read it: what a wait on it needs.
    type Ahead: Send + Sync;
    /// What a check leaves for the wait after it (etcd: the revision it read at; SQL: the wake-ups subscribed to
    /// before it).
    type Seen: Send;
    /// What a wait keeps from one round to the next, per acquisition (SQL counts its polls).
    type WaitState: Default + Send;

    /// Draws what names the acquisition's entry (a refusal of a path the store cannot take).
    fn claim(
        session: &Arc<Shared<Self>>,
        path: &str,
        kind: crate::backend::admission::Kind,
        hold: &str,
    ) -> Result<Self::Claim, Self::Error>;

    /// Writes the acquisition's entry in the lock's order, storing `hold`; records in `claim` what its clean-up must
    /// know (a write whose answer was lost, and was tried again, may land late).
    fn enqueue(
        session: &Arc<Shared<Self>>,
        path: &str,
        kind: crate::backend::admission::Kind,
        hold: &str,
        claim: &mut Self::Claim,
    ) -> impl Future<Output = Result<Enqueued<Self::Waiter>, Self::Error>> + Send;

    /// Deletes, in the background (counted in the session's [`Background`]), the entry of an acquisition that ended
    /// without a grant.
    fn abandon(session: &Arc<Shared<Self>>, claim: Self::Claim);

    /// Reads the entries ahead of `waiter`, oldest first, each with its kind (checking that `waiter`'s entry is still
    /// there: the store's "lost while waiting" otherwise). `state` is what the last wait left (MySQL's wait reads the
    /// entries in its own round trip, for this check to use).
    #[allow(clippy::type_complexity)]
    fn ahead(
        session: &Arc<Shared<Self>>,
        path: &str,
        waiter: &Self::Waiter,
        kind: crate::backend::admission::Kind,
        state: &mut Self::WaitState,
    ) -> impl Future<
        Output = Result<
            (
                Vec<(crate::backend::admission::Kind, Self::Ahead)>,
                Self::Seen,
            ),
            Self::Error,
        >,
    > + Send;

    /// Waits for a change that may admit `waiter`: the entry `ahead[on]` gone (`None`: any entry ahead), or anything
    /// else the store cannot tell apart; at most a session's TTL. The session's loss is the engine's to watch.
    fn wait(
        session: &Arc<Shared<Self>>,
        path: &str,
        waiter: &Self::Waiter,
        ahead: &[(crate::backend::admission::Kind, Self::Ahead)],
        on: Option<usize>,
        seen: Self::Seen,
        state: &mut Self::WaitState,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The grant an admitted entry is.
    fn grant_of(waiter: &Self::Waiter) -> Self::Grant;

    /// The grant's fence.
    fn fence(grant: &Self::Grant) -> Fence;

    /// What the engine reads back of the grant after each keep-alive.
    fn entry(grant: &Self::Grant) -> Self::Entry;

    /// Called once a grant's lease follows its session (ZooKeeper sets a watch on the grant's node).
    fn granted(_session: &Arc<Shared<Self>>, _grant: &Self::Grant, _lease: &Arc<LeaseShared>) {}

    /// Deletes the grant's entry if it is still the grant's: true when it was.
    fn release(
        session: &Arc<Shared<Self>>,
        grant: &Self::Grant,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Stores `hold` as the grant's entry's hold if the entry is still the grant's (an election's leader publishing a
    /// new value), keeping its place and fence: true when it was.
    fn rewrite(
        session: &Arc<Shared<Self>>,
        grant: &Self::Grant,
        hold: &str,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Where the count of the terms of the election `name` lives (a key, a node, a lock row's name): apart from the
    /// lock's entries, since it outlives them.
    fn term_record(&self, name: &str) -> Result<String, Error>;

    /// Counts a new term for the grant (an election's campaign that just won): the count at `record` goes up by one,
    /// and the grant's entry's hold becomes `hold` followed by the new count, in one step and only if the entry is
    /// still the grant's. The term's number, or `None` when the entry was gone (nothing changed).
    fn begin_term(
        session: &Arc<Shared<Self>>,
        grant: &Self::Grant,
        record: &str,
        hold: &str,
    ) -> impl Future<Output = Result<Option<u64>, Self::Error>> + Send;

    /// The count at `record`: 0 when no term was counted.
    fn terms(
        engine: &Engine<Self>,
        record: &str,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Names the grant in the log line of a background release that failed.
    fn describe(grant: &Self::Grant) -> String;

    /// One entry of a lock as [`list`](Self::list) read it.
    type Listed: Send;

    /// Every live entry of lock `name`, in queue order, each with its kind (for `inspect`).
    #[allow(clippy::type_complexity)]
    fn list(
        engine: &Engine<Self>,
        name: &str,
    ) -> impl Future<Output = Result<Vec<(crate::backend::admission::Kind, Self::Listed)>, Error>> + Send;

    /// What `inspect` reports of the lock's admitted entries (`holders`, in queue order): each one's value, name,
    /// fence and time left; `None` for one gone since it was listed.
    fn holders(
        engine: &Engine<Self>,
        name: &str,
        holders: Vec<Self::Listed>,
    ) -> impl Future<Output = Result<Vec<Option<Admitted>>, Error>> + Send;

    /// The names of every lock with entries under the client's prefix (for `held_locks`).
    fn lock_names(engine: &Engine<Self>)
        -> impl Future<Output = Result<Vec<String>, Error>> + Send;
}
