//! The session: one row in `PREFIX_session` (a client has one per lease TTL: `backend/sessions.rs`), every grant and
//! waiter of the client under that TTL an entry of it, and a local deadline after which the server may count the
//! session expired, with a loss signal that fires at that deadline at the latest.
//!
//! # The deadline
//!
//! The keeper renews the row every quarter of the TTL `t` with one statement, `UPDATE … SET expires_at =
//! GREATEST(expires_at, now() + t) WHERE id = … AND expires_at > now()`, sent without waiting for the one before. The
//! server evaluates `now()` when the statement starts, which is after the client sent it at `S`: so the renewal leaves
//! the row's expiry at least `S + t` on the server's clock, and since no renewal lowers it (`GREATEST`), so does every
//! renewal that lands after it, in whatever order. Nobody can delete the session (the only way another client takes
//! its locks) before then. The deadline of an answered renewal is therefore
//!
//! ```text
//! S + t − drift        (drift: 1 % + 2 ms of t, as for every lease)
//! ```
//!
//! on the lease clock: the server's clock and the client's must run at the same rate within that drift, as on Redis;
//! neither needs to agree with the other on the time.
//!
//! **Why `GREATEST`.** A renewal may start, then wait (for a lock on the table: an operator's `ALTER TABLE`, a
//! backup's `FLUSH TABLES WITH READ LOCK`; for the row), and land after the next one, which started later and was
//! answered first. Writing its own `now() + t` it would move the expiry back below the deadline the client counts
//! from the later renewal: another client could take over before the loss signal fires. MySQL bounds only row-lock
//! waits (`innodb_lock_wait_timeout`), not metadata-lock waits; PostgreSQL's `statement_timeout` (the per-call
//! deadline, as long as the renewal period at most) bounds how long a renewal runs, not the order renewals land in (the
//! earlier one may have been slower to arrive). Serialising the renewals would not do: a renewal the client gave up on
//! (its per-call deadline) still runs on the server, and waiting for each answer without a deadline would let one
//! renewal held up hold up every later one. Tested by
//! `sql_client`'s `renewal::a_renewal_applied_late_never_moves_the_expiry_back`, on both stores, and end to end by
//! `renewal::renewals_landing_out_of_order_let_nobody_in_before_the_loss`.
//!
//! A renewal that finds the row expired or gone renews nothing (its `WHERE` fails: tested by
//! `renewal::a_session_expired_on_the_server_is_not_renewed`), so a session never comes back from the dead: the
//! keeper then ends the session and every grant that follows it. One that started before the expiry and waited past
//! it still renews: its client counts from its send time, before its start, and a takeover, which deletes the
//! session, serialises with it on the row and re-checks the expiry the renewal wrote.
//!
//! The same statement returns the holds of the session's entries: a grant whose entry is missing was deleted by
//! someone else (`release --force`), and its lease ends as [`LossReason::Gone`]; an entry no acquisition of the client
//! knows (one whose acquisition was abandoned while its insert was on its way) is deleted.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::{Db, SqlError};
use crate::backend::session::{passed, Background, SessionState};
use crate::engine::clock;
use crate::engine::lease::LossReason;
use crate::engine::ttl::drift;

/// The session TTL of the locks that set none, unless [`Builder::session_ttl`](crate::Builder::session_ttl) sets
/// one: the default lease of every store ([`crate::DEFAULT_TTL`], 30 s).
pub(crate) const DEFAULT_TTL: Duration = crate::kinds::mutex::DEFAULT_TTL;

/// The shortest session TTL accepted: the keeper renews every quarter of it, and each renewal is a write.
pub(crate) const MIN_TTL: Duration = Duration::from_secs(1);

/// The longest any one statement may take, client side and (as `statement_timeout`, `max_statement_time`) server
/// side, unless a quarter of the TTL is shorter.
const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The deadline of each statement of a store whose sessions last `ttl`: a quarter of it, at most
/// [`MAX_CALL_TIMEOUT`].
pub(crate) fn call_timeout(ttl: Duration) -> Duration {
    (ttl / 4).min(MAX_CALL_TIMEOUT)
}

/// Why a session is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum SessionLoss {
    /// The local deadline passed without a newer answered renewal: the server may count the session expired.
    Expired,
    /// A renewal found the session expired or deleted on the server.
    ExpiredOnServer,
    /// The session was closed by its client.
    Closed,
}

impl fmt::Display for SessionLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SessionLoss::Expired => "no renewal was answered before the local deadline",
            SessionLoss::ExpiredOnServer => "the server found the session expired",
            SessionLoss::Closed => "the session was closed",
        })
    }
}

/// What the session, its keeper and its grants share.
pub(crate) struct Shared {
    pub(crate) db: Arc<Db>,
    /// The session row's id.
    pub(crate) id: String,
    /// The session TTL.
    pub(crate) ttl: Duration,
    /// The deadline of each statement.
    pub(crate) call_timeout: Duration,
    /// The deadline, the loss, and the grants that follow the session, each with its hold.
    pub(crate) state: SessionState<SessionLoss, String>,
    /// The holds of the entries this client knows in the session: its grants, and the acquisitions under way.
    known: std::sync::Mutex<HashSet<String>>,
    background: Arc<Background>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("id", &self.id)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Marks the session lost (the first reason sticks), and ends the lease of every grant that follows it.
    pub(crate) fn lose(&self, reason: SessionLoss) {
        if self.state.lose(reason, LossReason::Expired) {
            tracing::debug!(target: "leasehold::sql", session = %self.id, %reason, "SQL lock session lost");
        }
    }

    /// Why the session is lost, or `None` while it holds.
    pub(crate) fn loss(&self) -> Option<SessionLoss> {
        self.state.loss()
    }

    /// `Ok` while the session holds; the loss as an error otherwise.
    pub(crate) fn check_alive(&self) -> Result<(), SqlError> {
        self.loss()
            .map_or(Ok(()), |loss| Err(SqlError::SessionLost(loss)))
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `hold` as an entry of the session this client knows, before its insert is sent.
    pub(crate) fn know(&self, hold: &str) {
        self.known().insert(hold.to_owned());
    }

    /// Forgets `hold`: its entry is deleted, or to be deleted as an orphan.
    pub(crate) fn forget(&self, hold: &str) {
        self.known().remove(hold);
    }

    /// Deletes, in the background, the session's entry holding `hold` (an acquisition abandoned or given up after its
    /// insert may have landed), then forgets it.
    pub(crate) fn abandon(self: &Arc<Self>, hold: String) {
        let shared = Arc::clone(self);
        self.background.spawn(async move {
            let holds = [hold];
            let deleted = tokio::time::timeout(
                shared.call_timeout * 2,
                shared.db.delete_entries(&shared.id, &holds),
            )
            .await;
            if !matches!(deleted, Ok(Ok(()))) {
                tracing::debug!(target: "leasehold::sql", session = %shared.id, "an abandoned entry was not deleted; the keeper deletes it at its next renewal");
            }
            let [hold] = holds;
            shared.forget(&hold);
        });
    }

    /// Records a renewal sent at `sent`, number `round`, as answered.
    fn extend(&self, sent: Instant, round: i64) {
        self.state
            .extend(sent, round, sent + self.ttl - drift(self.ttl));
    }

    /// Runs `statement` under the per-call deadline; `op` names it in errors.
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        statement: impl std::future::Future<Output = Result<T, SqlError>>,
    ) -> Result<T, SqlError> {
        within(self.db.label(), op, self.call_timeout, statement).await
    }
}

/// `statement`'s answer, or a timeout of `store`'s `op` after `after`.
pub(crate) async fn within<T>(
    store: &'static str,
    op: &'static str,
    after: Duration,
    statement: impl std::future::Future<Output = Result<T, SqlError>>,
) -> Result<T, SqlError> {
    tokio::time::timeout(after, statement)
        .await
        .unwrap_or(Err(SqlError::Timeout { store, op, after }))
}

/// One session, kept alive in the background; every grant and waiter of the client is an entry of it.
///
/// Dropping it stops the keeper, marks the session closed, and deletes its row (and entries) in the background; a
/// session whose row is not deleted expires on the server one TTL after its last renewal.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) shared: Arc<Shared>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Session {
    /// Opens a session of `ttl` on `db`.
    pub(crate) async fn open(
        db: Arc<Db>,
        ttl: Duration,
        background: Arc<Background>,
    ) -> Result<Session, SqlError> {
        let id = super::new_session_id()?;
        let call_timeout = call_timeout(ttl);
        let sent = clock::now();
        match tokio::time::timeout(call_timeout.max(ttl / 2), db.open_session(&id, ttl)).await {
            Ok(opened) => opened?,
            Err(_) => {
                return Err(SqlError::Timeout {
                    store: db.label(),
                    op: "open session",
                    after: call_timeout,
                })
            }
        }
        let shared = Arc::new(Shared {
            db,
            id,
            ttl,
            call_timeout,
            state: SessionState::new(sent, sent + ttl - drift(ttl), SessionLoss::Expired),
            known: std::sync::Mutex::new(HashSet::new()),
            background,
        });
        let keeper = tokio::spawn(keep(Arc::downgrade(&shared)));
        Ok(Session { shared, keeper })
    }

    /// Why the session is lost, or `None` while it holds.
    pub(crate) fn loss(&self) -> Option<SessionLoss> {
        self.shared.loss()
    }

    /// Closes the session: stops the keeper, ends every grant, and deletes the session's row and entries.
    pub(crate) async fn close(&self) -> Result<(), SqlError> {
        self.keeper.abort();
        self.shared.lose(SessionLoss::Closed);
        close_row(&self.shared).await
    }
}

/// Deletes the session's row and entries; the session then counts as closed on the server too.
async fn close_row(shared: &Shared) -> Result<(), SqlError> {
    let closed = shared
        .call("close session", shared.db.close_session(&shared.id))
        .await;
    if let Err(e) = &closed {
        tracing::debug!(target: "leasehold::sql", session = %shared.id, error = %e, "closing the session failed; it expires on the server");
    }
    closed
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keeper.abort();
        if self.shared.state.recorded_loss() == Some(SessionLoss::Closed) {
            return;
        }
        self.shared.lose(SessionLoss::Closed);
        let shared = Arc::clone(&self.shared);
        self.shared.background.spawn(async move {
            let _ = close_row(&shared).await;
        });
    }
}

/// Every how many renewals the keeper also deletes expired sessions of any client ([`reap_expired`]): once per TTL,
/// from the session's first renewal, at its opening (a client that lives shorter than a TTL still cleans up once).
const REAP_EVERY: u32 = 4;

/// The most sessions one clean-up deletes: the work of one statement stays bounded whatever was left behind.
const REAP_LIMIT: u32 = 100;

/// Deletes, off the lock path, at most [`REAP_LIMIT`] sessions that expired more than one TTL of this client ago, and
/// their entries: the rows of clients that crashed, which otherwise stay until a waiter of one of their locks comes
/// (tested by `sql_client`'s `clean_up::a_crashed_clients_rows_go_though_nobody_waits_for_its_locks`). The grace keeps
/// it out of the way of the waiters behind a dead session, which take it over at its expiry; safety does not need it:
/// the delete re-checks each expiry on the newest row version, as the takeover does, so a renewal that raced it wins.
fn reap_expired(session: &Arc<Shared>) {
    let s = Arc::clone(session);
    tokio::spawn(async move {
        if let Err(e) = s
            .call("reap expired", s.db.reap_expired(s.ttl, REAP_LIMIT))
            .await
        {
            tracing::debug!(target: "leasehold::sql", error = %e, "deleting expired sessions failed; the next renewals try again");
        }
    });
}

/// The keeper: a renewal every quarter of the TTL, each on its own (an answer moves the deadline from its own send
/// time), and now and then a clean-up of expired sessions ([`reap_expired`]); ends when the session is dropped (it
/// holds only a `Weak`) or lost.
async fn keep(shared: Weak<Shared>) {
    let Some(every) = shared.upgrade().map(|s| s.ttl / 4) else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = FuturesUnordered::new();
    let mut round = 0;
    loop {
        let Some(deadline) = shared.upgrade().map(|s| s.state.deadline()) else {
            return;
        };
        tokio::select! {
            _ = tick.tick() => {
                let Some(session) = shared.upgrade() else { return };
                if session.loss().is_some() {
                    return;
                }
                round += 1;
                if round % i64::from(REAP_EVERY) == 1 {
                    reap_expired(&session);
                }
                let sent = clock::now();
                // Registered with each grant before the renewal leaves, as the Redis keeper registers a renewal.
                let begun = session.state.begin_round(session.ttl);
                let this_round = round;
                let weak = Weak::clone(&shared);
                in_flight.push(async move {
                    let answer = match weak.upgrade() {
                        Some(s) => Some(s.call("renew", s.db.renew(&s.id, s.ttl)).await),
                        None => None,
                    };
                    (sent, this_round, begun, answer)
                });
            }
            Some((sent, round, begun, answer)) = in_flight.next() => {
                let Some(session) = shared.upgrade() else { return };
                match answer {
                    Some(Ok(Some(holds))) => {
                        session.extend(sent, round);
                        let present: HashSet<&str> = holds.iter().map(String::as_str).collect();
                        for (lease, request, hold) in &begun {
                            if present.contains(hold.as_str()) {
                                lease.confirm(*request, round);
                            } else if lease.end(LossReason::Gone) {
                                tracing::debug!(target: "leasehold::sql", lock = %lease.keys.name(), "the lock's entry was deleted by someone else");
                            }
                        }
                        let orphans: Vec<String> = {
                            let known = session.known();
                            holds.into_iter().filter(|h| !known.contains(h)).collect()
                        };
                        if !orphans.is_empty() {
                            let s = Arc::clone(&session);
                            session.background.spawn(async move {
                                let _ = s.call("delete orphans", s.db.delete_entries(&s.id, &orphans)).await;
                            });
                        }
                    }
                    Some(Ok(None)) => {
                        session.lose(SessionLoss::ExpiredOnServer);
                        return;
                    }
                    Some(Err(e)) => tracing::debug!(target: "leasehold::sql", error = %e, "SQL lock session renewal failed"),
                    None => return,
                }
            }
            () = passed(deadline) => {
                if let Some(session) = shared.upgrade() {
                    session.lose(SessionLoss::Expired);
                }
                return;
            }
        }
    }
}
