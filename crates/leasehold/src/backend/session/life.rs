//! A session's life, on every store with sessions: opened by the store's [`Primitives::open`], kept alive by one task
//! (the keeper), lost at its local deadline at the latest, closed at exit.
//!
//! # The deadline
//!
//! A keep-alive the store answered renewed the session at some instant after it was *sent*, so the store cannot end
//! the session before `send time + validity`; the deadline is that, less the drift allowance
//! ([`crate::engine::ttl::drift`]), on the lease clock ([`crate::engine::clock::now`], which counts suspended time),
//! as for a Redis lease. The validity is the store's: the TTL on etcd and SQL, 5/8 of the negotiated timeout on
//! ZooKeeper (`backend/zookeeper/session.rs` says why).
//!
//! # The keeper
//!
//! A keep-alive every [`Opened::renew_every`], each on its own without waiting for the one before (an answer moves
//! the deadline from its own send time, so a slow answer holds up no later one), and one sooner after a keep-alive
//! that got no answer when the store asks ([`Opened::retry_after`]: etcd's keep-alive stream moves to the next
//! member). Before each keep-alive leaves it is registered with every grant that follows the session (as the Redis
//! keeper registers a renewal), and its answer confirms them. Then the grants' entries are read back (the second
//! check: [`SessionState::check_entries`]). The session is lost when the deadline passes without a newer answer, when
//! the store answers that the session is gone, or when the store's client says it ended ([`Primitives::ended`]);
//! every grant that follows it ends at that moment.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::state::{passed, Background, SessionState};
use super::{Opened, Primitives, Renewal, SessionLoss, StoreError};
use crate::engine::clock;
use crate::engine::lease::LossReason;
use crate::engine::ttl::drift;

/// The tracing target of the engine's events (each names its store's session).
const TARGET: &str = "leasehold::session";

/// What a session, its keeper and its grants share.
pub(crate) struct Shared<P: Primitives> {
    /// The session on the store: its connection and id.
    pub(crate) conn: P::Conn,
    /// The session's TTL as the store granted it.
    pub(crate) ttl: Duration,
    /// What a grant counts on after each answered keep-alive (see [`Opened::validity`]).
    pub(crate) validity: Duration,
    renew_every: Duration,
    retry_after: Duration,
    /// The deadline, the loss, and the grants that follow the session, each with its entry.
    pub(crate) state: SessionState<SessionLoss, P::Entry>,
    /// Where the clean-ups of the session's grants and abandoned acquisitions run: the client's.
    pub(crate) background: Arc<Background>,
}

impl<P: Primitives> std::fmt::Debug for Shared<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("session", &P::SESSION)
            .field("ttl", &self.ttl)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<P: Primitives> Shared<P> {
    /// Marks the session lost (the first reason sticks) and ends the lease of every grant that follows it: as
    /// [`LossReason::Gone`] when the store ended the session (its entries are gone, or anyone may delete them),
    /// [`LossReason::Expired`] otherwise.
    pub(crate) fn lose(&self, reason: SessionLoss) {
        let ends_as = match reason {
            SessionLoss::Ended => LossReason::Gone,
            SessionLoss::Expired | SessionLoss::Closed => LossReason::Expired,
        };
        if self.state.lose(reason, ends_as) {
            tracing::debug!(target: TARGET, store = P::SESSION, session = %P::id(&self.conn), %reason, "{} lost", P::SESSION);
        }
        P::on_lost(&self.conn);
    }

    /// Why the session is lost, or `None` while it holds (its deadline not passed, no loss recorded).
    pub(crate) fn loss(&self) -> Option<SessionLoss> {
        self.state.loss()
    }

    /// `Ok` while the session holds; the loss as the store's error otherwise.
    pub(crate) fn check_alive(&self) -> Result<(), P::Error> {
        self.loss()
            .map_or(Ok(()), |loss| Err(P::Error::session_lost(loss)))
    }

    /// Resolves when the session is lost: on the keeper's word, or when the deadline passes, whichever is first, even
    /// if the keeper is stuck.
    pub(crate) async fn lost(&self) -> SessionLoss {
        self.state.lost().await
    }

    /// Records the keep-alive sent at `sent`, number `round`, answered with `validity`.
    fn extend(&self, sent: Instant, round: i64, validity: Duration) {
        self.state
            .extend(sent, round, sent + validity - drift(validity));
    }
}

/// One session, kept alive in the background; every grant and waiter of the client under its TTL is an entry of it.
///
/// Dropping it stops the keeper, ends every grant, and ends the session on the store in the background (counted in
/// the client's [`Background`]); a session that is not ended there expires on the store a TTL after its last
/// keep-alive.
pub(crate) struct Session<P: Primitives> {
    pub(crate) shared: Arc<Shared<P>>,
    keeper: tokio::task::JoinHandle<()>,
}

impl<P: Primitives> std::fmt::Debug for Session<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

impl<P: Primitives> Session<P> {
    /// Opens a session of `ttl` on `store` and starts its keeper.
    pub(crate) async fn open(
        store: &P,
        ttl: Duration,
        background: &Arc<Background>,
    ) -> Result<Session<P>, P::Error> {
        let Opened {
            conn,
            sent,
            ttl,
            validity,
            renew_every,
            retry_after,
        } = store.open(ttl, background).await?;
        let ended = P::ended(&conn);
        let shared = Arc::new(Shared {
            conn,
            ttl,
            validity,
            renew_every,
            retry_after: retry_after.min(renew_every),
            state: SessionState::new(
                sent,
                sent + validity - drift(validity),
                SessionLoss::Expired,
            ),
            background: Arc::clone(background),
        });
        let keeper = tokio::spawn(keep(Arc::downgrade(&shared), ended));
        Ok(Session { shared, keeper })
    }

    /// Why the session is lost, or `None` while it holds.
    pub(crate) fn loss(&self) -> Option<SessionLoss> {
        self.shared.loss()
    }

    /// Closes the session: stops the keeper, ends every grant, and ends the session on the store (every entry of the
    /// session goes at once).
    pub(crate) async fn close(&self) -> Result<(), P::Error> {
        self.keeper.abort();
        self.shared.lose(SessionLoss::Closed);
        P::close(&self.shared).await
    }
}

impl<P: Primitives> Drop for Session<P> {
    fn drop(&mut self) {
        self.keeper.abort();
        if self.shared.state.recorded_loss() == Some(SessionLoss::Closed) {
            return;
        }
        self.shared.lose(SessionLoss::Closed);
        let shared = Arc::clone(&self.shared);
        self.shared.background.spawn(async move {
            if let Err(e) = P::close(&shared).await {
                tracing::debug!(target: TARGET, store = P::SESSION, session = %P::id(&shared.conn), error = %e, "ending a dropped {} failed; it expires on the store", P::SESSION);
            }
        });
    }
}

/// The keeper (see the module docs); ends when the session is dropped (it holds only a `Weak`) or lost.
async fn keep<P: Primitives>(weak: Weak<Shared<P>>, ended: impl std::future::Future<Output = ()>) {
    let Some((every, retry_after)) = weak.upgrade().map(|s| (s.renew_every, s.retry_after)) else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = FuturesUnordered::new();
    let mut round = 0;
    tokio::pin!(ended);
    loop {
        let Some(deadline) = weak.upgrade().map(|s| s.state.deadline()) else {
            return;
        };
        tokio::select! {
            _ = tick.tick() => {
                let Some(shared) = weak.upgrade() else { return };
                if shared.loss().is_some() {
                    return;
                }
                round += 1;
                let sent = clock::now();
                // Registered with each grant before the keep-alive leaves, as the Redis keeper registers a renewal.
                let begun = shared.state.begin_round(shared.validity);
                let this_round = round;
                let weak = Weak::clone(&weak);
                drop(shared);
                in_flight.push(async move {
                    let answer = match weak.upgrade() {
                        Some(shared) => Some(P::renew(&shared, this_round).await),
                        None => None,
                    };
                    (sent, this_round, begun, answer)
                });
            }
            Some((sent, round, begun, answer)) = in_flight.next() => {
                let Some(shared) = weak.upgrade() else { return };
                match answer {
                    Some(Renewal::Renewed { validity, entries }) => {
                        shared.extend(sent, round, validity);
                        // A shorter validity than the session's (etcd answering with less TTL) confirms nothing: the
                        // leases keep their own deadline.
                        let confirms = validity >= shared.validity;
                        match entries {
                            Some(alive) => {
                                let alive: std::collections::HashSet<&P::Entry> = alive.iter().collect();
                                for (lease, request, entry) in &begun {
                                    if !alive.contains(entry) {
                                        if lease.end(LossReason::Gone) {
                                            tracing::debug!(target: TARGET, store = P::SESSION, ?entry, "a grant's entry is gone");
                                        }
                                    } else if confirms {
                                        lease.confirm(*request, round);
                                    }
                                }
                            }
                            None => {
                                if confirms {
                                    for (lease, request, _) in &begun {
                                        lease.confirm(*request, round);
                                    }
                                }
                                let reader = Arc::clone(&shared);
                                shared.state.check_entries(&begun, move |entries| {
                                    let shared = Arc::clone(&reader);
                                    async move { P::read_entries(&shared, entries).await }
                                });
                            }
                        }
                    }
                    Some(Renewal::Ended) => {
                        shared.lose(SessionLoss::Ended);
                        return;
                    }
                    Some(Renewal::Failed) => {
                        tracing::debug!(target: TARGET, store = P::SESSION, session = %P::id(&shared.conn), "a {} keep-alive got no answer", P::SESSION);
                        if retry_after < every {
                            tick.reset_after(retry_after);
                        }
                    }
                    None => return,
                }
            }
            () = &mut ended => {
                if let Some(shared) = weak.upgrade() {
                    shared.lose(SessionLoss::Ended);
                }
                return;
            }
            () = passed(deadline) => {
                if let Some(shared) = weak.upgrade() {
                    shared.lose(SessionLoss::Expired);
                }
                return;
            }
        }
    }
}
