//! A client's sessions on a store with sessions (etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB): one per distinct lease
//! TTL, so that a lock's [`ttl`](crate::Mutex::ttl) is the lease its grants live under, as on Redis.
//!
//! A grant on these stores lives as long as the session its entry belongs to, so a lock asking for a 3 s lease must
//! be granted under a 3 s session. The client keeps one session per TTL asked for: the default one (the client's
//! default lease, [`Builder::session_ttl`](crate::Builder::session_ttl), 30 s unless set) opened at connect or by the
//! first lock, each other one opened lazily by the first lock that asks for its TTL, each kept alive by its own keeper
//! with its own loss signal, each replaced by a new one at the first acquisition after it was lost, and all closed by
//! [`Client::close`](crate::Client::close) or when the client is dropped. Their background clean-ups are counted in
//! the client's one [`Background`].
//!
//! The map, the replacement of a lost session and the closing are written once, here, for the engine's sessions.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::state::Background;

/// What the map needs to know of a store's session.
pub(crate) trait StoreSession: Send + Sync + 'static {
    /// Whether the session is lost (a new one must be opened for the next grant).
    fn is_lost(&self) -> bool;
    /// How many grants follow the session now.
    fn following(&self) -> usize;
}

/// The slot of one TTL: its current session, if one was opened; locked while a session is opened, so that
/// concurrent first acquisitions of one TTL open one session.
type Slot<S> = Arc<tokio::sync::Mutex<Option<Arc<S>>>>;

/// A client's sessions, one per TTL (as the store keys it: etcd rounds up to whole seconds first).
pub(crate) struct Sessions<S> {
    default_ttl: Duration,
    by_ttl: std::sync::Mutex<BTreeMap<Duration, Slot<S>>>,
    /// The clean-ups running in the background (dropped guards, abandoned acquisitions, dropped sessions), shared by
    /// every session, for [`Client::flush_releases`](crate::Client::flush_releases) and `close`.
    pub(crate) background: Arc<Background>,
}

impl<S: StoreSession> Sessions<S> {
    /// No session yet; a lock that sets no TTL asks for `default_ttl`.
    pub(crate) fn new(default_ttl: Duration) -> Self {
        Sessions {
            default_ttl,
            by_ttl: std::sync::Mutex::default(),
            background: Arc::default(),
        }
    }

    /// The TTL of the session a lock that sets none is granted under.
    pub(crate) fn default_ttl(&self) -> Duration {
        self.default_ttl
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<Duration, Slot<S>>> {
        self.by_ttl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live session of `ttl`, or a new one from `open` when there is none yet or the last one was lost. `open` is
    /// told whether it replaces a lost session (for its log line).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call leaves the slot as it was (or with the session it had opened by then).
    pub(crate) async fn get<E, Fut>(
        &self,
        ttl: Duration,
        open: impl FnOnce(bool) -> Fut,
    ) -> Result<Arc<S>, E>
    where
        Fut: Future<Output = Result<S, E>>,
    {
        let slot = Arc::clone(self.map().entry(ttl).or_default());
        let mut current = slot.lock().await;
        if let Some(session) = current.as_ref() {
            if !session.is_lost() {
                return Ok(Arc::clone(session));
            }
        }
        let session = Arc::new(open(current.is_some()).await?);
        *current = Some(Arc::clone(&session));
        Ok(session)
    }

    /// The grants every current session follows now (a session being opened or closed right now is not counted).
    pub(crate) fn following(&self) -> usize {
        let slots: Vec<Slot<S>> = self.map().values().cloned().collect();
        slots
            .iter()
            .filter_map(|slot| {
                let current = slot.try_lock().ok()?;
                current.as_ref().map(|session| session.following())
            })
            .sum()
    }

    /// Closes the client's sessions: takes every session out of its slot (so that the next acquisition opens a new
    /// one), ends each with `close` (etcd's lease revoked, ZooKeeper's session closed, the SQL session row deleted:
    /// every entry of the session goes at once), all at once, then waits for the background clean-ups. True when
    /// every `close` was answered; otherwise a session's entries go when it expires, which is logged.
    pub(crate) async fn close<E, Fut>(&self, close: impl Fn(Arc<S>) -> Fut) -> bool
    where
        E: std::fmt::Display,
        Fut: Future<Output = Result<(), E>>,
    {
        let slots: Vec<Slot<S>> = self.map().values().cloned().collect();
        let mut taken = Vec::new();
        for slot in slots {
            if let Some(session) = slot.lock().await.take() {
                taken.push(session);
            }
        }
        let closed = futures_util::future::join_all(taken.into_iter().map(&close)).await;
        let mut all = true;
        for e in closed.iter().filter_map(|c| c.as_ref().err()) {
            tracing::debug!(error = %e, "closing a session failed; its entries go when it expires");
            all = false;
        }
        self.background.settle().await;
        all
    }
}

impl<S> std::fmt::Debug for Sessions<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ttls: Vec<Duration> = self
            .by_ttl
            .lock()
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        f.debug_struct("Sessions")
            .field("default_ttl", &self.default_ttl)
            .field("ttls", &ttls)
            .finish_non_exhaustive()
    }
}
