//! The SQL store behind a [`crate::Client`] connected with a `postgres://` or `mysql://` URL: the session and its
//! entries, turned into the crate's guards, leases and lock information.
//!
//! - **One session per lease TTL** (see [`crate::backend::sessions`]): a grant's entry belongs to the session row
//!   of its lock's TTL; each session is replaced by a new one at the first acquisition after it was lost. Every
//!   grant's [`Lease`] follows its session: its deadline is the session's, its loss the session's loss, or its own
//!   entry found deleted by a renewal.
//! - **An acquisition** inserts its entry once and keeps its place through every check: it reads the entries up to
//!   its own, deletes the dead sessions ahead (a delete, not a skip: see [`super`]), and applies its kind's rule.
//!   Between checks it sleeps until a wake-up for the lock (PostgreSQL's `NOTIFY`, or a release by this client), the
//!   expiry of the entry it waits for, or on MySQL the next poll. A store error while it waits is ridden out with
//!   backoff, keeping the entry; an acquisition abandoned or given up deletes its entry in the background.

use std::sync::Arc;
use std::time::Duration;

use super::rights::Use;
use super::session::{Session, SessionLoss, Shared};
use super::{Db, Entry, SqlError};
use crate::backend::admission::{admit, Admission, Kind};
use crate::backend::redis::keys::LockKeys;
use crate::backend::session::{lock_info, passed, Admitted, Background};
use crate::backend::sessions::{Sessions, StoreSession};
use crate::backend::{Terms, Wait};
use crate::client::{Client, LockInfo};
use crate::engine::clock;
use crate::engine::lease::{Lease, LeaseShared};
use crate::error::Error;
use crate::fence::Fence;
use crate::kinds::guard::Guard;

/// The tracing target of this file's events.
const TARGET: &str = "leasehold::sql";

/// The first pause after a store error inside a wait; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How long after the entry it waits for expires a waiter checks again: the server's clock and the client's sleep
/// round differently.
const EXPIRY_MARGIN: Duration = Duration::from_millis(2);

/// A client's SQL side: its database, its tables' prefix, and its sessions (one per lease TTL).
pub(crate) struct SqlStore {
    pub(crate) db: Arc<Db>,
    /// The URL as shown in errors and logs: password hidden.
    shown: Arc<str>,
    pub(crate) prefix: String,
    sessions: Sessions<Session>,
    /// Set once the user is known to have every right a lock needs: at connect, or for a read-only client (whose
    /// connect checked only `SELECT`) at its first write, before that write.
    writable: tokio::sync::OnceCell<()>,
    /// The releases running in the background (dropped guards, abandoned entries, dropped sessions), for
    /// [`Client::flush_releases`] and [`Client::close`]: the sessions' own.
    background: Arc<Background>,
}

impl StoreSession for Session {
    fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    fn following(&self) -> usize {
        self.shared.state.following()
    }
}

/// The session TTL a lock asking for `ttl` is granted under: `ttl` itself, refused below
/// [`MIN_TTL`](super::session::MIN_TTL) (1 s; the keeper renews the row every quarter of it, each renewal a write).
pub(crate) fn session_ttl(ttl: Duration) -> Result<Duration, Error> {
    if ttl < super::session::MIN_TTL {
        return Err(crate::error::InvalidArgument::BadDuration {
            what: "lease",
            value: ttl,
            why: "must be at least 1s on PostgreSQL and MySQL/MariaDB (the session row is renewed every quarter of it)",
        }
        .into());
    }
    Ok(ttl)
}

/// What a guard of a SQL grant needs to release it: the session its entry belongs to, and the entry.
pub(crate) struct SqlHold {
    shown: Arc<str>,
    pub(crate) session: Arc<Session>,
    pub(crate) name: String,
    pub(crate) fence: i64,
    pub(crate) hold: String,
    background: Arc<Background>,
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("url", &self.shown)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// An acquisition's entry until it is granted: dropped before that (given up, or the acquisition's future dropped),
/// it deletes the entry in the background.
struct Pending {
    shared: Arc<Shared>,
    hold: Option<String>,
}

impl Pending {
    /// The entry is granted: it stays.
    fn keep(mut self) {
        self.hold = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            self.shared.abandon(hold);
        }
    }
}

impl SqlStore {
    /// Connects: creates the tables when they are missing (or finds them), and checks that the user has every right a
    /// lock needs on them ([`super::rights`]), so that an unreachable database or a missing `GRANT` fails here and not
    /// at the first lock. The first session is opened by the first acquisition: a client that only reads (`inspect`,
    /// `held_locks`: the command's `status` and `list`) writes nothing. A `read_only` client's connect checks only the
    /// right to read the tables (tested by `sql_client`'s `reads::reads_write_nothing_and_need_only_select`); the rest
    /// is checked at its first write, before it.
    pub(crate) async fn connect(
        url: &str,
        prefix: String,
        ttl: Duration,
        connection_timeout: Duration,
        tls: &super::TlsMaterial,
        read_only: bool,
    ) -> Result<SqlStore, Error> {
        let shown: Arc<str> = crate::backend::url::redacted(url).into();
        super::check_prefix(&prefix)?;
        let call_timeout = super::session::call_timeout(ttl);
        let used = if read_only { Use::Read } else { Use::Lock };
        let db = Db::connect(url, &prefix, connection_timeout, call_timeout, tls, used)
            .await
            .map_err(|e| store_error(db_name(url), &shown, e))?;
        let sessions = Sessions::new(ttl);
        let writable = if read_only {
            tokio::sync::OnceCell::new()
        } else {
            tokio::sync::OnceCell::new_with(Some(()))
        };
        let store = SqlStore {
            db: Arc::new(db),
            shown,
            prefix,
            background: Arc::clone(&sessions.background),
            sessions,
            writable,
        };
        Ok(store)
    }

    fn error(&self, e: SqlError) -> Error {
        store_error(self.db.name(), &self.shown, e)
    }

    /// Checks, once, that the user has every right a lock needs: a read-only client's first write does, before it
    /// writes anything.
    async fn writable(&self) -> Result<(), SqlError> {
        self.writable
            .get_or_try_init(|| self.db.check_rights(Use::Lock))
            .await
            .map(drop)
    }

    /// The live session of TTL `ttl`, or a new one when there is none yet or the last one was lost.
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>, SqlError> {
        self.writable().await?;
        self.sessions
            .get(ttl, |replacing| async move {
                let session =
                    Session::open(Arc::clone(&self.db), ttl, Arc::clone(&self.background)).await?;
                if replacing {
                    tracing::info!(target: TARGET, "the {} lock session was lost; opened a new one", self.db.label());
                }
                Ok(session)
            })
            .await
    }

    /// The default lease: of the locks that set no TTL.
    pub(crate) fn default_ttl(&self) -> Duration {
        self.sessions.default_ttl()
    }

    /// Grants the client's sessions follow now.
    pub(crate) fn kept_leases(&self) -> usize {
        self.sessions.following()
    }

    /// Waits as `wait` says until lock `keys` admits `kind`, storing `hold` in the grant's entry, and returns the
    /// grant's guard.
    pub(crate) async fn acquire(
        &self,
        client: &Client,
        keys: Arc<LockKeys>,
        kind: Kind,
        hold: String,
        terms: Terms,
    ) -> Result<Guard, Error> {
        let Terms {
            ttl,
            wait,
            fail_fast,
        } = terms;
        let ttl = session_ttl(ttl)?;
        let waits = matches!(wait, Wait::Until(_));
        // Each attempt's entry has a hold of its own: an earlier attempt's entry may still be on its way to
        // deletion (by its hold) when the next is inserted.
        let attempts = std::sync::atomic::AtomicUsize::new(0);
        let attempt = || async {
            let hold = match attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed) {
                0 => hold.clone(),
                _ => crate::fence::redrawn(&hold).map_err(|e| SqlError::Entropy(e.to_string()))?,
            };
            let session = self.session(ttl).await?;
            match grant(&session.shared, keys.name(), kind, &hold, waits, fail_fast).await? {
                Some(fence) => self.hold(client, &keys, hold, session, fence).map(Some),
                None => Ok(None),
            }
        };
        crate::backend::until_granted(
            keys.name(),
            wait,
            fail_fast,
            attempt,
            SqlError::passes,
            |e| match e {
                SqlError::WrongPermits { stored } => {
                    crate::backend::admission::wrong_permits(keys.name(), kind, stored)
                }
                e => self.error(e),
            },
        )
        .await
    }

    /// The guard of a grant: a lease that follows the session from its last answered renewal. An error when the
    /// session was lost by then: the entry is given back and the wait goes on.
    fn hold(
        &self,
        client: &Client,
        keys: &Arc<LockKeys>,
        hold: String,
        session: Arc<Session>,
        fence: i64,
    ) -> Result<Guard, SqlError> {
        let ttl = session.shared.ttl;
        let (sent, round) = session.shared.state.acked();
        let lease = LeaseShared::new(
            Arc::clone(keys),
            hold.clone(),
            Fence::new(fence.unsigned_abs()),
            ttl,
            sent,
            ttl,
            round,
        );
        let following = session.shared.state.follow(&lease, hold.clone());
        let guard = Guard::on_session(
            client.clone(),
            Lease {
                shared: Arc::clone(&lease),
            },
            crate::backend::SessionHold::Sql(SqlHold {
                shown: Arc::clone(&self.shown),
                session: Arc::clone(&session),
                name: keys.name().to_owned(),
                fence,
                hold,
                background: Arc::clone(&self.background),
            }),
        );
        if !following || !guard.is_held() {
            drop(guard);
            return Err(SqlError::SessionLost(
                session.loss().unwrap_or(SessionLoss::Expired),
            ));
        }
        crate::engine::trace::kind_event!(crate::engine::trace::kind_of_hold(&lease.token), debug, lock = %keys.name(), hold = %crate::engine::trace::words(&lease.token), fence = lease.fence.get(), "granted");
        Ok(guard)
    }

    /// The lock's state: its live entries in queue order, each admitted or waiting by the rules.
    pub(crate) async fn inspect(&self, name: &str) -> Result<LockInfo, Error> {
        let entries = self
            .call("inspect", self.db.entries(name, None))
            .await
            .map_err(|e| self.error(e))?;
        let live: Vec<&Entry> = entries.iter().filter(|e| e.live).collect();
        let kinds: Vec<Kind> = live.iter().map(|e| e.kind).collect();
        let admitted = live
            .iter()
            .enumerate()
            .filter(|(i, e)| admit(e.kind, &kinds[..*i]) == Admission::Granted)
            .map(|(_, e)| Admitted {
                value: e.hold.clone(),
                entry: e.fence.to_string(),
                kind: e.kind,
                fence: Fence::new(e.fence.unsigned_abs()),
                remaining: Some(e.left),
            })
            .collect();
        Ok(lock_info(name, admitted, live.len()))
    }

    /// The held locks whose names match the glob `pattern`.
    pub(crate) async fn held_locks(&self, pattern: &str) -> Result<Vec<LockInfo>, Error> {
        let names = self
            .call("list", self.db.names())
            .await
            .map_err(|e| self.error(e))?;
        crate::backend::session::held_among(names, pattern, |name| async move {
            self.inspect(&name).await
        })
        .await
    }

    /// Deletes every entry of lock `name` (holders and waiters), and returns the token of the first live one, the
    /// holder, if there was one.
    pub(crate) async fn force_release(&self, name: &str) -> Result<Option<String>, Error> {
        self.writable().await.map_err(|e| self.error(e))?;
        let first = self
            .call("force release", self.db.force_release(name))
            .await
            .map_err(|e| self.error(e))?;
        self.db.wakes().wake(name);
        Ok(first.map(|hold| crate::fence::token_of(&hold).to_owned()))
    }

    /// Waits until every background release has been answered (or given up).
    pub(crate) async fn settle(&self) {
        self.background.settle().await;
    }

    /// Closes every session (their rows and every entry of the client are deleted), then waits for the background
    /// releases: true when every delete was answered.
    pub(crate) async fn close(&self) -> bool {
        self.sessions
            .close(|s| async move { s.close().await })
            .await
    }

    /// Runs `statement` under the per-call deadline of this store's sessions.
    async fn call<T>(
        &self,
        op: &'static str,
        statement: impl std::future::Future<Output = Result<T, SqlError>>,
    ) -> Result<T, SqlError> {
        let after = super::session::call_timeout(self.sessions.default_ttl());
        super::session::within(self.db.label(), op, after, statement).await
    }
}

/// One acquisition in session `shared`: inserts the entry, then checks until the rule admits it (`Some(fence)`), or,
/// for a try (`waits` false), until the first check says it is busy (`None`, the entry deleted again).
async fn grant(
    shared: &Arc<Shared>,
    name: &str,
    kind: Kind,
    hold: &str,
    waits: bool,
    fail_fast: bool,
) -> Result<Option<i64>, SqlError> {
    let db = &shared.db;
    shared.check_alive()?;
    shared.know(hold);
    let pending = Pending {
        shared: Arc::clone(shared),
        hold: Some(hold.to_owned()),
    };
    let fence = match shared
        .call("enqueue", db.enqueue(name, &shared.id, kind, hold))
        .await
    {
        Ok(fence) => fence,
        Err(e) if e.session_gone() => {
            shared.lose(SessionLoss::ExpiredOnServer);
            return Err(SqlError::SessionLost(SessionLoss::ExpiredOnServer));
        }
        Err(e) => return Err(e),
    };
    let mut backoff = FIRST_BACKOFF;
    let mut polls = 0;
    loop {
        shared.check_alive()?;
        let mut wake = db.wakes().subscribe(name);
        let sleep = match check(shared, name, kind, fence).await {
            Ok(Check::Granted) => {
                pending.keep();
                return Ok(Some(fence));
            }
            Ok(Check::Again) => continue,
            Ok(Check::Busy { .. }) if !waits => {
                if shared
                    .call("release", db.release(name, fence, &shared.id))
                    .await
                    .is_ok()
                {
                    let hold = pending.hold.clone();
                    pending.keep();
                    if let Some(hold) = hold {
                        shared.forget(&hold);
                    }
                }
                return Ok(None);
            }
            Ok(Check::Busy { left, next }) => {
                backoff = FIRST_BACKOFF;
                // Next in line, a waiter polls at its fastest (a release admits it); behind others, it backs off.
                polls = if next { 0 } else { polls + 1 };
                let poll = db.poll(polls);
                let until = left.map(|left| left + EXPIRY_MARGIN);
                match (until, poll) {
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                    (None, None) => shared.ttl,
                }
                .min(shared.ttl)
            }
            Err(e)
                if e.passes()
                    && waits
                    && !fail_fast
                    && !matches!(
                        e,
                        SqlError::LostWhileWaiting { .. } | SqlError::SessionLost(_)
                    ) =>
            {
                tracing::debug!(target: TARGET, lock = %name, error = %e, "a check failed while waiting; the entry keeps its place");
                let pause = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                pause
            }
            Err(e) => return Err(e),
        };
        let at = clock::now() + sleep;
        tokio::select! {
            _ = wake.changed() => {}
            () = passed(at) => {}
            _ = shared.state.lost() => {}
        }
    }
}

/// What one check found.
enum Check {
    Granted,
    /// Dead sessions ahead were deleted: check again at once.
    Again,
    /// Not admitted; the entry it waits for expires in this long (`None`: not known). `next`: every entry ahead holds
    /// the lock, so the next release may admit this one.
    Busy {
        left: Option<Duration>,
        next: bool,
    },
}

/// Reads lock `name`'s entries up to the acquisition's own (`fence`), deletes the dead sessions among them, and
/// applies `kind`'s rule to the live ones ahead.
async fn check(
    shared: &Arc<Shared>,
    name: &str,
    kind: Kind,
    fence: i64,
) -> Result<Check, SqlError> {
    let db = &shared.db;
    let entries = shared.call("check", db.entries(name, Some(fence))).await?;
    let Some((mine, ahead)) = entries.split_last().filter(|(mine, _)| mine.fence == fence) else {
        return Err(SqlError::LostWhileWaiting {
            name: name.to_owned(),
        });
    };
    if !mine.live {
        shared.lose(SessionLoss::ExpiredOnServer);
        return Err(SqlError::SessionLost(SessionLoss::ExpiredOnServer));
    }
    let mut dead: Vec<String> = ahead
        .iter()
        .filter(|e| !e.live)
        .map(|e| e.session.clone())
        .collect();
    if !dead.is_empty() {
        dead.sort();
        dead.dedup();
        shared.call("reap", db.reap(name, &dead)).await?;
        return Ok(Check::Again);
    }
    let kinds: Vec<Kind> = ahead.iter().map(|e| e.kind).collect();
    let next = (0..kinds.len()).all(|i| admit(kinds[i], &kinds[..i]) == Admission::Granted);
    Ok(match admit(kind, &kinds) {
        Admission::Granted => Check::Granted,
        Admission::WaitFor(i) => Check::Busy {
            left: ahead.get(i).map(|e| e.left),
            next,
        },
        Admission::WaitForAny => Check::Busy {
            left: ahead.iter().map(|e| e.left).min(),
            next,
        },
        // Refused: the entry is deleted in the background (the acquisition's `Pending`).
        Admission::WrongPermits(stored) => {
            return Err(SqlError::WrongPermits {
                stored: stored.get(),
            })
        }
    })
}

impl SqlHold {
    /// Whether the session the entry belongs to is lost (its entry is gone, or may be deleted by anyone).
    pub(crate) fn session_lost(&self) -> bool {
        self.session.loss().is_some()
    }

    /// Deletes the grant's entry: true when it was there.
    pub(crate) async fn release(&self) -> Result<bool, Error> {
        let shared = &self.session.shared;
        let released = shared
            .call(
                "release",
                shared.db.release(&self.name, self.fence, &shared.id),
            )
            .await
            .map_err(|e| store_error(shared.db.name(), &self.shown, e))?;
        shared.db.wakes().wake(&self.name);
        shared.forget(&self.hold);
        Ok(released)
    }

    /// Releases in the background (a dropped guard); without a runtime the entry goes with the session.
    pub(crate) fn release_in_background(self) {
        let background = Arc::clone(&self.background);
        background.spawn(async move {
            if let Err(e) = self.release().await {
                tracing::debug!(target: TARGET, lock = %self.name, error = %e, "a background release failed; the entry goes with the session");
            }
        });
    }
}

/// The store a URL names, as errors name it.
pub(crate) fn db_name(url: &str) -> &'static str {
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        "mysql"
    } else {
        "postgres"
    }
}

/// The crate's error for an error of a SQL store.
pub(crate) fn store_error(store: &'static str, url: &str, e: SqlError) -> Error {
    match e {
        SqlError::Entropy(why) => Error::Entropy(why),
        SqlError::NotPermitted { detail } => Error::NotPermitted {
            detail,
            source: None,
        },
        SqlError::InvalidUrl { store, why } => {
            crate::InvalidArgument::BadUrl(format!("{url} ({store}): {why}")).into()
        }
        e => Error::Store {
            store,
            url: url.to_owned(),
            source: Box::new(e),
        },
    }
}
