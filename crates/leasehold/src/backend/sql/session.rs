//! The SQL stores' session primitives: one row in `PREFIX_session` (a client has one per lease TTL), every grant and
//! waiter of the client under that TTL an entry of it; opened, renewed (the renewal also reads back the session's
//! entries), closed. The engine (`backend/session/`) runs its life; what is the SQL stores' own is why the deadline
//! holds on the server's clock.
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
use std::sync::Arc;
use std::time::Duration;

use super::store::Sql;
use super::{Db, SqlError};
use crate::backend::session::{self as engine, Opened, Renewal};
use crate::engine::clock;

/// The session TTL of the locks that set none, unless [`Builder::session_ttl`](crate::Builder::session_ttl) sets
/// one: the default lease of every store ([`crate::DEFAULT_TTL`], 30 s).
pub(crate) const DEFAULT_TTL: Duration = crate::engine::ttl::DEFAULT_TTL;

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

/// What a SQL session holds.
pub(crate) struct Conn {
    pub(crate) db: Arc<Db>,
    /// The session row's id.
    pub(crate) id: String,
    /// The deadline of each statement.
    pub(crate) call_timeout: Duration,
    /// The holds of the entries this client knows in the session: its grants, and the acquisitions under way.
    known: std::sync::Mutex<HashSet<String>>,
}

/// What a session, its keeper and its grants share, on the SQL stores.
pub(crate) type Shared = engine::Shared<Sql>;

impl Shared {
    fn known(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.conn.known.lock().unwrap_or_else(|e| e.into_inner())
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
                shared.conn.call_timeout * 2,
                shared.conn.db.delete_entries(&shared.conn.id, &holds),
            )
            .await;
            if !matches!(deleted, Ok(Ok(()))) {
                tracing::debug!(target: "leasehold::sql", session = %shared.conn.id, "an abandoned entry was not deleted; the keeper deletes it at its next renewal");
            }
            let [hold] = holds;
            shared.forget(&hold);
        });
    }

    /// Runs `statement` under the per-call deadline; `op` names it in errors.
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        statement: impl std::future::Future<Output = Result<T, SqlError>>,
    ) -> Result<T, SqlError> {
        within(self.conn.db.label(), op, self.conn.call_timeout, statement).await
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

/// Opens a session of `ttl` on `db`.
pub(crate) async fn open(db: Arc<Db>, ttl: Duration) -> Result<Opened<Conn>, SqlError> {
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
    Ok(Opened {
        conn: Conn {
            db,
            id,
            call_timeout,
            known: std::sync::Mutex::new(HashSet::new()),
        },
        sent,
        ttl,
        validity: ttl,
        renew_every: ttl / 4,
        retry_after: ttl / 4,
    })
}

/// Deletes the session's row and entries; the session then counts as closed on the server too.
pub(crate) async fn close(shared: &Shared) -> Result<(), SqlError> {
    let conn = &shared.conn;
    shared
        .call("close session", conn.db.close_session(&conn.id))
        .await
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
            .call("reap expired", s.conn.db.reap_expired(s.ttl, REAP_LIMIT))
            .await
        {
            tracing::debug!(target: "leasehold::sql", error = %e, "deleting expired sessions failed; the next renewals try again");
        }
    });
}

/// One renewal, number `round` (every [`REAP_EVERY`]th, from the first, also starts a clean-up of expired sessions:
/// [`reap_expired`]). The statement returns the holds of the session's entries: the engine ends the grant of any hold
/// missing (someone else deleted its entry), and an entry no acquisition of the client knows (one whose acquisition
/// was abandoned while its insert was on its way) is deleted here.
/// Renews the session; its entries come back as their tokens' ids, which name a grant whatever its hold's text says
/// after a leader's proclamation rewrote it.
pub(crate) async fn renew(shared: &Arc<Shared>, round: i64) -> Renewal<u128> {
    if round % i64::from(REAP_EVERY) == 1 {
        reap_expired(shared);
    }
    let conn = &shared.conn;
    match shared
        .call("renew", conn.db.renew(&conn.id, shared.ttl))
        .await
    {
        Ok(Some(holds)) => {
            let orphans: Vec<String> = {
                let known: HashSet<u128> = shared
                    .known()
                    .iter()
                    .filter_map(|h| crate::fence::token_id(h))
                    .collect();
                holds
                    .iter()
                    .filter(|h| crate::fence::token_id(h).is_none_or(|id| !known.contains(&id)))
                    .cloned()
                    .collect()
            };
            if !orphans.is_empty() {
                let s = Arc::clone(shared);
                shared.background.spawn(async move {
                    let _ = s
                        .call(
                            "delete orphans",
                            s.conn.db.delete_entries(&s.conn.id, &orphans),
                        )
                        .await;
                });
            }
            Renewal::Renewed {
                validity: shared.validity,
                entries: Some(
                    holds
                        .iter()
                        .filter_map(|h| crate::fence::token_id(h))
                        .collect(),
                ),
            }
        }
        Ok(None) => Renewal::Ended,
        Err(e) => {
            tracing::debug!(target: "leasehold::sql", error = %e, "SQL lock session renewal failed");
            Renewal::Failed
        }
    }
}
