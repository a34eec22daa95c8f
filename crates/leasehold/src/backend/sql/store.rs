//! The SQL stores' primitives under the session engine (`backend/session/`), behind a [`crate::Client`] connected
//! with a `postgres://` or `mysql://` URL, and their reads (`inspect`, `held_locks`, `force_release`).
//!
//! - **One session per lease TTL** (the engine's): a grant's entry belongs to the session row of its lock's TTL.
//!   Every grant's lease follows its session: its deadline is the session's, its loss the session's loss, or its own
//!   entry found deleted by a renewal.
//! - **An acquisition** (the engine's recipe) inserts its entry once and keeps its place through every check: it
//!   reads the entries up to its own, deletes the dead sessions ahead (a delete, not a skip: see [`super`]), and the
//!   engine applies its kind's rule. Between checks it sleeps until a wake-up for the lock (PostgreSQL's `NOTIFY`, or a
//!   release by this client), the expiry of the entry it waits for, or on MySQL the next poll.

use std::sync::Arc;
use std::time::Duration;

use super::rights::Use;
use super::session::{Conn, Shared};
use super::{Db, Entry, Ring, SqlError};
use crate::backend::admission::{admit, admitted, Admission, Kind};
use crate::backend::session::state::passed;
use crate::backend::session::{
    Admitted, Background, Engine, EngineError, Enqueued, Opened, Primitives, Renewal, SessionLoss,
    StoreError,
};
use crate::engine::clock;
use crate::error::Error;
use crate::fence::Fence;

/// How long after the entry it waits for expires a waiter checks again: the server's clock and the client's sleep
/// round differently.
const EXPIRY_MARGIN: Duration = Duration::from_millis(2);

/// The SQL stores' settings and primitives under the session engine: the database and the tables' prefix.
pub(crate) struct Sql {
    pub(crate) db: Arc<Db>,
    pub(crate) prefix: String,
    /// Set once the user is known to have every right a lock needs: at connect, or for a read-only client (whose
    /// connect checked only `SELECT`) at its first write, before that write.
    writable: tokio::sync::OnceCell<()>,
}

impl std::fmt::Debug for Sql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sql")
            .field("db", &self.db.label())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Sql {
    /// Checks, once, that the user has every right a lock needs: a read-only client's first write does, before it
    /// writes anything.
    async fn writable(&self) -> Result<(), SqlError> {
        self.writable
            .get_or_try_init(|| self.db.check_rights(Use::Lock))
            .await
            .map(drop)
    }
}

/// A client's SQL side: the engine over the SQL stores' primitives.
pub(crate) type SqlStore = Engine<Sql>;

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

/// What a release needs of a SQL grant: the lock's name, the entry's fence and hold.
#[derive(Debug, Clone)]
pub(crate) struct SqlGrant {
    pub(crate) name: String,
    pub(crate) fence: i64,
    pub(crate) hold: String,
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
            .map_err(|e| e.into_error_on(db_name(url), &shown))?;
        let writable = if read_only {
            tokio::sync::OnceCell::new()
        } else {
            tokio::sync::OnceCell::new_with(Some(()))
        };
        let sql = Sql {
            db: Arc::new(db),
            prefix,
            writable,
        };
        Ok(Engine::new(sql, shown, ttl))
    }

    /// Deletes every entry of lock `name` (holders and waiters), and returns the token of the first live one, the
    /// holder, if there was one.
    pub(crate) async fn force_release(&self, name: &str) -> Result<Option<String>, Error> {
        self.store.writable().await.map_err(|e| self.error(e))?;
        let first = self
            .call("force release", self.store.db.force_release(name))
            .await
            .map_err(|e| self.error(e))?;
        self.store.db.wakes().wake(name);
        Ok(first.map(|hold| crate::fence::token_of(&hold).to_owned()))
    }

    /// Runs `statement` under the per-call deadline of this store's sessions.
    async fn call<T>(
        &self,
        op: &'static str,
        statement: impl std::future::Future<Output = Result<T, SqlError>>,
    ) -> Result<T, SqlError> {
        let after = super::session::call_timeout(self.default_ttl());
        super::session::within(self.store.db.label(), op, after, statement).await
    }
}

/// Inserts the acquisition's entry (its hold already known to the session, so that a renewal never takes it for an
/// orphan): its fence, and the lock's entries up to it when the dialect read them in the same round trip; a session
/// the server no longer has is lost.
async fn enqueue(
    shared: &Arc<Shared>,
    name: &str,
    kind: Kind,
    hold: &str,
) -> Result<super::Enqueue, SqlError> {
    let db = &shared.conn.db;
    match shared
        .call("enqueue", db.enqueue(name, &shared.conn.id, kind, hold))
        .await
    {
        Ok(enqueued) => Ok(enqueued),
        Err(e) if e.session_gone() => {
            shared.lose(SessionLoss::Ended);
            Err(SqlError::session_lost(SessionLoss::Ended))
        }
        Err(e) => Err(e),
    }
}

/// An entry ahead of a waiter, as its wait needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ahead {
    /// The entry's fence: on MySQL, it names the entry's bell.
    fence: i64,
    /// The time left on its session.
    left: Duration,
}

/// What a waiter remembers from one wait to the next.
#[derive(Debug, Default)]
pub(crate) struct WaitState {
    /// How many polls in a row found this waiter behind others (MySQL without a bell).
    polls: u32,
    /// The entry whose bell the last wait heard free (MySQL): if that entry is still there at the next check, its bell
    /// is not held (its holder's connection went away, or an older client wrote it), and the waiter polls for it.
    rung: Option<i64>,
    /// The entries found without a held bell.
    deaf: Vec<i64>,
    /// The lock's entries up to the waiter's, read by the last bell wait in its own round trip once the bell was heard
    /// (or the wait ran out): the next check's, without a round trip of its own.
    fresh: Option<Vec<Entry>>,
}

/// What a read of a lock's entries up to the acquisition's own (`fence`) says.
enum Read {
    /// The live entries ahead, oldest first, each with its kind, fence and the time left on its session.
    Ahead(Vec<(Kind, Ahead)>),
    /// Some entries ahead belong to dead sessions: these, to delete before reading again.
    Dead(Vec<String>),
}

/// Reads `entries` (lock `name`'s up to `fence`, in fence order): the acquisition's own entry must be the last, and its
/// session live.
fn read(shared: &Shared, name: &str, fence: i64, entries: &[Entry]) -> Result<Read, SqlError> {
    let Some((mine, ahead)) = entries.split_last().filter(|(mine, _)| mine.fence == fence) else {
        return Err(SqlError::lost_while_waiting(name.to_owned()));
    };
    if !mine.live {
        shared.lose(SessionLoss::Ended);
        return Err(SqlError::session_lost(SessionLoss::Ended));
    }
    let mut dead: Vec<String> = ahead
        .iter()
        .filter(|e| !e.live)
        .map(|e| e.session.clone())
        .collect();
    if dead.is_empty() {
        let ahead = ahead.iter().map(|e| {
            let at = Ahead {
                fence: e.fence,
                left: e.left,
            };
            (e.kind, at)
        });
        return Ok(Read::Ahead(ahead.collect()));
    }
    dead.sort();
    dead.dedup();
    Ok(Read::Dead(dead))
}

/// Reads lock `name`'s entries up to the acquisition's own (`fence`), deletes the dead sessions among them (a delete,
/// not a skip: see [`super`]) and reads again, and returns the live ones ahead, oldest first, each with its kind and
/// the time left on its session.
async fn ahead(
    shared: &Arc<Shared>,
    name: &str,
    fence: i64,
) -> Result<Vec<(Kind, Ahead)>, SqlError> {
    let db = &shared.conn.db;
    loop {
        let entries = shared.call("check", db.entries(name, Some(fence))).await?;
        match read(shared, name, fence, &entries)? {
            Read::Ahead(ahead) => return Ok(ahead),
            Read::Dead(dead) => shared.call("reap", db.reap(name, &dead)).await?,
        }
    }
}

/// Sleeps until a wake-up for the lock (`wake`: PostgreSQL's `NOTIFY`, or a release by this client), the expiry of
/// the entry it waits for (`ahead[on]`; any: the first to expire), or on MySQL the ring of the bell of the entry it
/// waits for ([`Db::ring`]); on MySQL without a bell (a permit waiter, an entry whose bell is not held, or more
/// waiters than bells), the next poll: next in line (every entry ahead holds the lock, so the next release may admit
/// this one) a waiter polls at its fastest; behind others, it backs off.
async fn wait(
    shared: &Arc<Shared>,
    name: &str,
    mine: i64,
    ahead: &[(Kind, Ahead)],
    on: Option<usize>,
    mut wake: tokio::sync::watch::Receiver<u64>,
    state: &mut WaitState,
) {
    let db = &shared.conn.db;
    // A bell heard free while its entry stayed: that entry has no bell.
    if let Some(rung) = state.rung.take() {
        if ahead.iter().any(|(_, at)| at.fence == rung) && !state.deaf.contains(&rung) {
            state.deaf.push(rung);
        }
    }
    let kinds: Vec<Kind> = ahead.iter().map(|(kind, _)| *kind).collect();
    let next = (0..kinds.len()).all(|i| admit(kinds[i], &kinds[..i]) == Admission::Granted);
    state.polls = if next { 0 } else { state.polls + 1 };
    let left = match on {
        Some(i) => ahead.get(i).map(|(_, at)| at.left),
        None => ahead.iter().map(|(_, at)| at.left).min(),
    };
    let until = left.map(|left| left + EXPIRY_MARGIN);
    let poll = db.poll(state.polls);
    // The bell of the entry it waits for; waiting for any entry ahead (a permit), the oldest's with a bell (the
    // likeliest to go first), for as long as a poll would sleep: another entry's departure is then found by the check that follows.
    let hears = |fence: &i64| !state.deaf.contains(fence);
    let bell = match on {
        Some(i) => ahead
            .get(i)
            .map(|(_, at)| at.fence)
            .filter(hears)
            .map(|fence| (fence, None)),
        None => ahead
            .iter()
            .map(|(_, at)| at.fence)
            .find(hears)
            .map(|fence| (fence, poll)),
    };
    if let Some((fence, most)) = bell {
        let within = [until, most]
            .into_iter()
            .flatten()
            .fold(shared.ttl, Duration::min);
        tokio::select! {
            _ = wake.changed() => return,
            rung = db.ring(name, fence, mine, within) => match rung {
                Ok((Ring::Rung, entries)) => {
                    state.rung = Some(fence);
                    state.fresh = entries;
                    return;
                }
                Ok((Ring::Silent, entries)) => {
                    state.fresh = entries;
                    return;
                }
                // No bell to wait on now: this wait polls.
                Ok((Ring::Unavailable, _)) | Err(_) => {}
            },
        }
    }
    let sleep = match (until, poll) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => shared.ttl,
    }
    .min(shared.ttl);
    let at = clock::now() + sleep;
    tokio::select! {
        _ = wake.changed() => {}
        () = passed(at) => {}
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

impl SqlError {
    /// The crate's error for it, on `store` at the URL shown as `shown`.
    fn into_error_on(self, store: &'static str, shown: &str) -> Error {
        match self {
            SqlError::Engine(EngineError::Entropy(why)) => Error::Entropy(why),
            SqlError::NotPermitted { detail } => Error::NotPermitted {
                detail,
                source: None,
            },
            SqlError::InvalidUrl { store, why } => {
                crate::InvalidArgument::BadUrl(format!("{shown} ({store}): {why}")).into()
            }
            e => Error::Store {
                store,
                url: shown.to_owned(),
                source: Box::new(e),
            },
        }
    }
}

impl StoreError for SqlError {
    fn store(shown: &str) -> &'static str {
        db_name(shown)
    }

    fn transient(&self) -> bool {
        self.is_transient()
    }

    fn as_engine(&self) -> Option<&EngineError> {
        match self {
            SqlError::Engine(e) => Some(e),
            _ => None,
        }
    }

    /// The store's name comes from the error's own dialect when it has one; a URL's errors name it themselves.
    fn into_store_error(self, shown: &str) -> Error {
        self.into_error_on(Self::store(shown), shown)
    }
}

impl Primitives for Sql {
    type Error = SqlError;
    type Conn = Conn;
    /// The entry's hold.
    /// The grant's token's id: what its hold says whatever else the hold's text says (see `session::renew`).
    type Entry = u128;
    type Grant = SqlGrant;

    const SESSION: &'static str = "SQL lock session";

    fn session_ttl(ttl: Duration) -> Result<Duration, Error> {
        session_ttl(ttl)
    }

    /// A lock's entries are rows named by the lock's name itself.
    fn path(&self, name: &str) -> Result<String, Error> {
        Ok(name.to_owned())
    }

    /// Checks the rights a lock needs first (once), then inserts the session's row.
    async fn open(
        &self,
        ttl: Duration,
        _background: &Arc<Background>,
    ) -> Result<Opened<Conn>, SqlError> {
        self.writable().await?;
        super::session::open(Arc::clone(&self.db), ttl).await
    }

    fn id(conn: &Conn) -> String {
        conn.id.clone()
    }

    async fn renew(shared: &Arc<Shared>, round: i64) -> Renewal<u128> {
        super::session::renew(shared, round).await
    }

    /// Never called: the renewal's own answer carries the session's entries.
    async fn read_entries(_shared: &Arc<Shared>, _entries: Vec<u128>) -> Option<Vec<bool>> {
        None
    }

    async fn close(shared: &Arc<Shared>) -> Result<(), SqlError> {
        super::session::close(shared).await
    }

    /// The hold, known to the session from now on.
    type Claim = String;
    type Waiter = SqlGrant;
    /// The entry's fence and the time left on its session.
    type Ahead = Ahead;
    /// The lock's wake-ups, subscribed to before the check.
    type Seen = tokio::sync::watch::Receiver<u64>;
    type WaitState = WaitState;

    fn claim(
        session: &Arc<Shared>,
        _name: &str,
        _kind: Kind,
        hold: &str,
    ) -> Result<String, SqlError> {
        session.know(hold);
        Ok(hold.to_owned())
    }

    async fn enqueue(
        session: &Arc<Shared>,
        name: &str,
        kind: Kind,
        hold: &str,
        _claim: &mut String,
    ) -> Result<Enqueued<SqlGrant>, SqlError> {
        let enqueued = enqueue(session, name, kind, hold).await?;
        let fence = enqueued.fence;
        // Admitted by the entries read in the same round trip: granted without another; otherwise (or when the
        // dialect read none) the engine's check reads them again, deleting dead sessions ahead.
        let first = match &enqueued.entries {
            Some(entries) => match read(session, name, fence, entries)? {
                Read::Ahead(ahead) => admitted(kind, &ahead),
                Read::Dead(_) => false,
            },
            None => false,
        };
        Ok(Enqueued {
            waiter: SqlGrant {
                name: name.to_owned(),
                fence,
                hold: hold.to_owned(),
            },
            first,
        })
    }

    /// Deletes the entry by its hold, in the background; one not deleted then is an orphan the keeper's next renewal
    /// deletes.
    fn abandon(session: &Arc<Shared>, hold: String) {
        session.abandon(hold);
    }

    async fn ahead(
        session: &Arc<Shared>,
        name: &str,
        waiter: &SqlGrant,
        _kind: Kind,
        state: &mut WaitState,
    ) -> Result<(Vec<(Kind, Ahead)>, Self::Seen), SqlError> {
        // Subscribed before the read: a release after it wakes the wait. (Entries a bell wait read came before it: a
        // release by this client since then also frees its entry's bell, which the next wait hears.)
        let wake = session.conn.db.wakes().subscribe(name);
        if let Some(entries) = state.fresh.take() {
            if let Read::Ahead(ahead) = read(session, name, waiter.fence, &entries)? {
                return Ok((ahead, wake));
            }
        }
        Ok((ahead(session, name, waiter.fence).await?, wake))
    }

    async fn wait(
        session: &Arc<Shared>,
        name: &str,
        waiter: &SqlGrant,
        ahead: &[(Kind, Ahead)],
        on: Option<usize>,
        wake: Self::Seen,
        state: &mut WaitState,
    ) -> Result<(), SqlError> {
        wait(session, name, waiter.fence, ahead, on, wake, state).await;
        Ok(())
    }

    fn grant_of(waiter: &SqlGrant) -> SqlGrant {
        waiter.clone()
    }

    fn fence(grant: &SqlGrant) -> Fence {
        Fence::new(grant.fence.unsigned_abs())
    }

    fn entry(grant: &SqlGrant) -> u128 {
        crate::fence::token_id(&grant.hold).unwrap_or_default()
    }

    /// Deletes the entry, wakes this client's waiters of the lock, and forgets the hold.
    async fn release(shared: &Arc<Shared>, grant: &SqlGrant) -> Result<bool, SqlError> {
        let db = &shared.conn.db;
        let released = shared
            .call(
                "release",
                db.release(&grant.name, grant.fence, &shared.conn.id),
            )
            .await?;
        db.wakes().wake(&grant.name);
        shared.forget(&grant.hold);
        Ok(released)
    }

    async fn rewrite(shared: &Arc<Shared>, grant: &SqlGrant, hold: &str) -> Result<bool, SqlError> {
        let db = &shared.conn.db;
        shared
            .call(
                "proclaim",
                db.rewrite(&grant.name, grant.fence, &shared.conn.id, hold),
            )
            .await
    }

    /// The lock row `NAME` and U+001F: a name no lock takes in practice (a name ending in a control character), in
    /// the lock table, whose rows are never deleted. At most [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes with it, as
    /// every lock row's name.
    fn term_record(&self, name: &str) -> Result<String, Error> {
        let record = format!("{name}{}", crate::fence::VALUE_SEPARATOR);
        if record.len() > crate::MAX_NAME_LEN {
            return Err(crate::InvalidArgument::NameTooLong {
                len: name.len(),
                max: crate::MAX_NAME_LEN - 1,
            }
            .into());
        }
        Ok(record)
    }

    async fn begin_term(
        shared: &Arc<Shared>,
        grant: &SqlGrant,
        record: &str,
        hold: &str,
    ) -> Result<Option<u64>, SqlError> {
        let db = &shared.conn.db;
        shared
            .call(
                "count a term",
                db.begin_term(&grant.name, grant.fence, &shared.conn.id, record, hold),
            )
            .await
    }

    async fn terms(engine: &SqlStore, record: &str) -> Result<u64, Error> {
        engine
            .call("read a term count", engine.store.db.terms(record))
            .await
            .map_err(|e| engine.error(e))
    }

    fn describe(grant: &SqlGrant) -> String {
        format!("{} (fence {})", grant.name, grant.fence)
    }

    /// A row of the lock, with its session's time left.
    type Listed = Entry;

    /// The lock's rows whose sessions are live, in fence order (read without a session: a reader writes nothing).
    async fn list(engine: &SqlStore, name: &str) -> Result<Vec<(Kind, Entry)>, Error> {
        let entries = engine
            .call("inspect", engine.store.db.entries(name, None))
            .await
            .map_err(|e| engine.error(e))?;
        Ok(entries
            .into_iter()
            .filter(|e| e.live)
            .map(|e| (e.kind, e))
            .collect())
    }

    async fn holders(
        _engine: &SqlStore,
        _name: &str,
        holders: Vec<Entry>,
    ) -> Result<Vec<Option<Admitted>>, Error> {
        Ok(holders
            .into_iter()
            .map(|e| {
                Some(Admitted {
                    entry: e.fence.to_string(),
                    fence: Fence::new(e.fence.unsigned_abs()),
                    kind: e.kind,
                    remaining: Some(e.left),
                    value: e.hold,
                })
            })
            .collect())
    }

    async fn lock_names(engine: &SqlStore) -> Result<Vec<String>, Error> {
        engine
            .call("list", engine.store.db.names())
            .await
            .map_err(|e| engine.error(e))
    }
}
