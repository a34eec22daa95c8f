//! The SQL stores (features `postgres` and `mysql`): lease tables in the user's own database, with every deadline on
//! the server's clock, fences that never restart, and one renewal statement per client and keeper period.
//!
//! # Files
//!
//! - [`session`]: the client's session row, its keeper, the local deadline and the loss signal.
//! - [`store`]: the store behind a [`Client`](crate::Client): the wait, guards, `inspect`, `held_locks`,
//!   `force_release`, and the fenced transaction.
//! - [`postgres`] and [`mysql`]: each dialect's statements and connections; [`Db`] hands every operation to one of
//!   them.
//! - [`rights`]: the rights a client needs on its tables, checked at connect, and the refusals that name them.
//!
//! # The tables, and why
//!
//! Three tables and, on PostgreSQL, a sequence, all named after the client's prefix (`leasehold` by default):
//!
//! ```text
//! leasehold_session  (id, expires_at)                          one row per client session, renewed by its keeper
//! leasehold_lock     (name, fence)                             one row per lock name ever used, never deleted
//! leasehold_entry    (name, fence, session, kind, permits, hold)  one row per grant or waiter, in fence order
//! leasehold_fence    (PostgreSQL: a sequence)
//! ```
//!
//! - **One session row per client**, not an expiry per grant: the keeper renews every grant of the client with one
//!   `UPDATE` of one row per period, however many locks it holds, and a waiter is live exactly as long as its
//!   client. A grant is live while its entry exists and its session's `expires_at` is in the future **on the
//!   server's clock** (`now()`, `UTC_TIMESTAMP(6)`): nothing depends on the client's clock.
//! - **Entries are a queue**: each kind is an admission rule over the live entries ahead (`backend/admission.rs`,
//!   the rules etcd and ZooKeeper use), so FIFO order, readers sharing, and permits come from one table.
//! - **Fences.** An entry's fence orders the queue and is the grant's fence. It is taken while the lock's row in
//!   `leasehold_lock` is locked, in the same transaction as the entry's insert, so fences of one lock are issued and
//!   committed in order: a waiter's check, made after its own insert committed, sees every entry with a smaller
//!   fence. The fence is the lock row's last fence plus one at least: on PostgreSQL `GREATEST(fence + 1,
//!   nextval('leasehold_fence'))` (a sequence's numbers are unique but not in order across connections once it is
//!   `CACHE`d, so the row decides the order and the sequence only keeps a re-created row from starting over); on MySQL
//!   `LAST_INSERT_ID(fence + 1)`. Both are durable and never go back: the lock rows are never deleted, and a sequence
//!   never repeats a value.
//! - **Takeover is a delete.** A dead session's entries are not skipped but deleted first (with the session row;
//!   `ON DELETE CASCADE`), and the delete re-checks `expires_at` on the row's newest version, so a renewal that
//!   raced it wins. A delete waits for a row lock: this is what makes the fenced transaction hold ([`store`]).
//! - **Clean-up.** Every session's keeper also deletes, now and then, a bounded number of sessions expired for
//!   longer than its TTL, with the same re-check: a crashed client's rows go even when nobody waits behind them.

pub(crate) mod error;
pub(crate) mod fenced;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(all(feature = "tls", feature = "postgres"))]
pub(crate) mod pg_tls;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod rights;
pub(crate) mod session;
pub(crate) mod store;

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::watch;

pub(crate) use error::SqlError;

use crate::backend::admission::Kind;
use crate::backend::session::random_bytes;

/// The TLS material of the [`Builder`](crate::Builder) (its CA and client identity), for `sslmode=require` on
/// PostgreSQL; nothing without the `tls` feature.
#[cfg(feature = "tls")]
pub(crate) type TlsMaterial = crate::backend::tls::TlsSettings;
#[cfg(not(feature = "tls"))]
pub(crate) type TlsMaterial = ();

/// One entry of a lock as a check or `inspect` reads it, with its session's state on the server's clock.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) fence: i64,
    pub(crate) kind: Kind,
    pub(crate) hold: String,
    pub(crate) session: String,
    /// Whether its session had not expired when the statement ran.
    pub(crate) live: bool,
    /// How long its session had left then (zero when dead).
    pub(crate) left: Duration,
}

/// An entry just appended to its lock's queue.
#[derive(Debug)]
pub(crate) struct Enqueue {
    /// The entry's fence.
    pub(crate) fence: i64,
    /// The lock's entries up to this one (itself last), read by a statement that began after the entry's insert
    /// committed (so it sees every entry with a smaller fence: they committed before the insert took the lock row's
    /// lock), in the same round trip as the insert; `None` when the dialect does not.
    pub(crate) entries: Option<Vec<Entry>>,
}

/// What a wait on an entry's bell heard.
#[derive(Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) enum Ring {
    /// The bell was free: the entry is gone, or it never held its bell.
    Rung,
    /// Still held when the wait ran out.
    Silent,
    /// No bell to wait on: the store has none, or every one of this client's bell connections is in use.
    Unavailable,
}

/// An entry's kind as the `kind` and `permits` columns store it.
pub(crate) fn kind_columns(kind: Kind) -> (&'static str, i32) {
    match kind {
        Kind::Exclusive => ("x", 0),
        Kind::Shared => ("r", 0),
        Kind::Permits(n) => ("s", i32::try_from(n.get()).unwrap_or(i32::MAX)),
    }
}

/// The kind of stored columns; an entry leasehold did not write reads as exclusive.
pub(crate) fn kind_of_columns(kind: &str, permits: i64) -> Kind {
    match kind {
        "r" => Kind::Shared,
        "s" => u32::try_from(permits)
            .ok()
            .and_then(std::num::NonZeroU32::new)
            .map_or(Kind::Exclusive, Kind::Permits),
        _ => Kind::Exclusive,
    }
}

/// The database behind a SQL store: one of the two dialects.
pub(crate) enum Db {
    #[cfg(feature = "postgres")]
    Postgres(postgres::PgDb),
    #[cfg(feature = "mysql")]
    MySql(mysql::MyDb),
}

/// Hands a call to the dialect's own method of the same name.
macro_rules! dispatch {
    ($db:expr, $method:ident ( $($arg:expr),* )) => {
        match $db {
            #[cfg(feature = "postgres")]
            Db::Postgres(db) => db.$method($($arg),*).await,
            #[cfg(feature = "mysql")]
            Db::MySql(db) => db.$method($($arg),*).await,
        }
    };
}

impl Db {
    /// Connects to the database `url` names (`postgres://`, `postgresql://`, `mysql://`, `mariadb://`), creates
    /// `prefix`'s tables when they are missing, and checks that the user has the rights `used` needs on them
    /// ([`rights`]).
    pub(crate) async fn connect(
        url: &str,
        prefix: &str,
        connection_timeout: Duration,
        call_timeout: Duration,
        tls: &TlsMaterial,
        used: rights::Use,
    ) -> Result<Db, SqlError> {
        // Only PostgreSQL speaks TLS; without it (or `tls`) the material is `()` or refused.
        let _ = &tls;
        let connecting = async {
            #[cfg(feature = "postgres")]
            if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                return postgres::PgDb::connect(
                    url,
                    prefix,
                    connection_timeout,
                    call_timeout,
                    tls,
                    used,
                )
                .await
                .map(Db::Postgres);
            }
            #[cfg(feature = "mysql")]
            if url.starts_with("mysql://") || url.starts_with("mariadb://") {
                #[cfg(feature = "tls")]
                if !tls.is_empty() {
                    return Err(SqlError::InvalidUrl {
                        store: "MySQL",
                        why: "TLS is not supported on MySQL yet: leasehold speaks to MySQL in the clear"
                            .to_owned(),
                    });
                }
                return mysql::MyDb::connect(url, prefix, call_timeout, used)
                    .await
                    .map(Db::MySql);
            }
            Err(SqlError::InvalidUrl {
                store: "SQL",
                why: "not a postgres://, postgresql://, mysql:// or mariadb:// URL".to_owned(),
            })
        };
        // Connecting and creating the tables take a few round trips; each connection attempt has its own timeout.
        let after = connection_timeout * 4;
        tokio::time::timeout(after, connecting)
            .await
            .unwrap_or(Err(SqlError::Timeout {
                store: "SQL",
                op: "connect",
                after,
            }))
    }

    /// The store, as messages name it.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(_) => "PostgreSQL",
            #[cfg(feature = "mysql")]
            Db::MySql(_) => "MySQL",
        }
    }

    /// The store, as [`Client::store_name`](crate::Client::store_name) names it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(_) => "postgres",
            #[cfg(feature = "mysql")]
            Db::MySql(_) => "mysql",
        }
    }

    /// Checks that the user has the rights `used` needs on the tables (a read-only client's check before its first
    /// write).
    pub(crate) async fn check_rights(&self, used: rights::Use) -> Result<(), SqlError> {
        dispatch!(self, check_rights(used))
    }

    /// Inserts the session row `id`, expiring `ttl` from now on the server's clock.
    pub(crate) async fn open_session(&self, id: &str, ttl: Duration) -> Result<(), SqlError> {
        dispatch!(self, open_session(id, ttl))
    }

    /// Moves session `id`'s expiry to `ttl` from now if it has not expired: `None` when it had (or is gone);
    /// otherwise the holds of the session's entries, as the same statement saw them.
    pub(crate) async fn renew(
        &self,
        id: &str,
        ttl: Duration,
    ) -> Result<Option<Vec<String>>, SqlError> {
        dispatch!(self, renew(id, ttl))
    }

    /// Deletes session `id` and its entries.
    pub(crate) async fn close_session(&self, id: &str) -> Result<(), SqlError> {
        dispatch!(self, close_session(id))
    }

    /// Appends an entry of `kind` holding `hold` to lock `name`'s queue for session `session`: its fence, and the
    /// lock's entries up to it when the dialect reads them in the same round trip.
    pub(crate) async fn enqueue(
        &self,
        name: &str,
        session: &str,
        kind: Kind,
        hold: &str,
    ) -> Result<Enqueue, SqlError> {
        dispatch!(self, enqueue(name, session, kind, hold))
    }

    /// The entries of lock `name` up to fence `upto` (all with `None`), in fence order.
    pub(crate) async fn entries(
        &self,
        name: &str,
        upto: Option<i64>,
    ) -> Result<Vec<Entry>, SqlError> {
        dispatch!(self, entries(name, upto))
    }

    /// Deletes the sessions `ids` (and with them their entries) that have expired on the server's clock by now;
    /// wakes the lock `name`'s waiters when one was. Waits for the row locks of transactions fenced by those entries.
    pub(crate) async fn reap(&self, name: &str, ids: &[String]) -> Result<(), SqlError> {
        dispatch!(self, reap(name, ids))
    }

    /// Deletes at most `limit` sessions that expired more than `grace` ago on the server's clock (their entries go by
    /// the cascade), whoever they belong to: the rows of clients that crashed, whose locks nobody asks for again.
    /// Re-checks each expiry on the newest row version, as the takeover does, so a renewal that raced it wins.
    pub(crate) async fn reap_expired(&self, grace: Duration, limit: u32) -> Result<(), SqlError> {
        dispatch!(self, reap_expired(grace, limit))
    }

    /// Deletes lock `name`'s entry `fence` of session `session`, and wakes the lock's waiters: true when it was there.
    pub(crate) async fn release(
        &self,
        name: &str,
        fence: i64,
        session: &str,
    ) -> Result<bool, SqlError> {
        dispatch!(self, release(name, fence, session))
    }

    /// Stores `hold` as the hold of the entry of lock `name` with `fence` if it is session `session`'s: true when it
    /// was.
    pub(crate) async fn rewrite(
        &self,
        name: &str,
        fence: i64,
        session: &str,
        hold: &str,
    ) -> Result<bool, SqlError> {
        dispatch!(self, rewrite(name, fence, session, hold))
    }

    /// Counts a term of the election `name` for the entry with `fence` of session `session`: the lock row `record`
    /// one higher (made at 1), and the entry's hold `hold` and the count, in one transaction that first locks the
    /// entry. The count, or `None` when the entry was not there (nothing changed).
    pub(crate) async fn begin_term(
        &self,
        name: &str,
        fence: i64,
        session: &str,
        record: &str,
        hold: &str,
    ) -> Result<Option<u64>, SqlError> {
        dispatch!(self, begin_term(name, fence, session, record, hold))
    }

    /// The count in the lock row `record`: 0 when there is none.
    pub(crate) async fn terms(&self, record: &str) -> Result<u64, SqlError> {
        dispatch!(self, terms(record))
    }

    /// Deletes the entries of session `session` holding `holds` (left by abandoned acquisitions), and wakes their
    /// locks' waiters.
    pub(crate) async fn delete_entries(
        &self,
        session: &str,
        holds: &[String],
    ) -> Result<(), SqlError> {
        dispatch!(self, delete_entries(session, holds))
    }

    /// Deletes every entry of lock `name` and wakes its waiters: the hold of the first live one.
    pub(crate) async fn force_release(&self, name: &str) -> Result<Option<String>, SqlError> {
        dispatch!(self, force_release(name))
    }

    /// The names of the locks with an entry of a live session.
    pub(crate) async fn names(&self) -> Result<Vec<String>, SqlError> {
        dispatch!(self, names())
    }

    /// The statement a fenced transaction runs before its commit: it finds the grant's entry live on the server's
    /// clock and locks it against deletion until the transaction ends (parameters: name, fence, session).
    pub(crate) fn commit_check(&self) -> &str {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(db) => db.commit_check(),
            #[cfg(feature = "mysql")]
            Db::MySql(db) => db.commit_check(),
        }
    }

    /// The wake-ups of this store's waiters.
    pub(crate) fn wakes(&self) -> &Wakes {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(db) => db.wakes(),
            #[cfg(feature = "mysql")]
            Db::MySql(db) => db.wakes(),
        }
    }

    /// Blocks until the bell of lock `name`'s entry `fence` is free, or for `within` at most, then reads the lock's
    /// entries up to `upto` (the waiter's) in the same round trip ([`mysql::MyDb::ring`]); PostgreSQL has no bells
    /// (its waiters hear `NOTIFY`): [`Ring::Unavailable`] at once.
    #[cfg_attr(not(feature = "mysql"), allow(unused_variables))]
    pub(crate) async fn ring(
        &self,
        name: &str,
        fence: i64,
        upto: i64,
        within: Duration,
    ) -> Result<(Ring, Option<Vec<Entry>>), SqlError> {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(_) => Ok((Ring::Unavailable, None)),
            #[cfg(feature = "mysql")]
            Db::MySql(db) => db.ring(name, fence, upto, within).await,
        }
    }

    /// How long a waiter sleeps at most before it checks again without a wake-up: PostgreSQL's waiters are woken by
    /// `NOTIFY` and check again only at the holder's expiry; MySQL's have no notification and poll.
    #[cfg_attr(not(feature = "mysql"), allow(unused_variables))]
    pub(crate) fn poll(&self, attempt: u32) -> Option<Duration> {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(_) => None,
            #[cfg(feature = "mysql")]
            Db::MySql(_) => Some(mysql::poll_interval(attempt)),
        }
    }
}

/// The wake-ups of one client's waiters, one counter per lock name: a waiter reads it before its check and waits for
/// it to move. PostgreSQL's `NOTIFY` moves it for every release anywhere; a release by this client moves it on both
/// stores.
#[derive(Default)]
pub(crate) struct Wakes {
    names: std::sync::Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Wakes {
    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver of lock `name`'s wake-ups, taken before a check.
    pub(crate) fn subscribe(&self, name: &str) -> watch::Receiver<u64> {
        let mut names = self.names();
        // Counters nobody listens to any more go as new ones come.
        names.retain(|_, sender| sender.receiver_count() > 0);
        names
            .entry(name.to_owned())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Wakes the waiters of lock `name`.
    pub(crate) fn wake(&self, name: &str) {
        if let Some(sender) = self.names().get(name) {
            sender.send_modify(|n| *n += 1);
        }
    }

    /// Wakes every waiter (a notification may have been missed).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn wake_all(&self) {
        for sender in self.names().values() {
            sender.send_modify(|n| *n += 1);
        }
    }
}

/// The table and sequence names of a prefix, each quoted for the dialect.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct Tables {
    pub(crate) session: String,
    pub(crate) lock: String,
    pub(crate) entry: String,
    pub(crate) fence: String,
    /// PostgreSQL's `NOTIFY` channel: the prefix itself.
    pub(crate) channel: String,
}

impl Tables {
    /// The names of `prefix`'s tables quoted with `quote` (`"` or `` ` ``).
    pub(crate) fn new(prefix: &str, quote: char) -> Tables {
        let q = |suffix: &str| format!("{quote}{prefix}_{suffix}{quote}");
        Tables {
            session: q("session"),
            lock: q("lock"),
            entry: q("entry"),
            fence: q("fence"),
            channel: prefix.to_owned(),
        }
    }
}

/// The longest prefix a SQL store takes: its tables' names must fit the identifier limits (63 bytes on PostgreSQL,
/// 64 on MySQL) with the longest suffix (`_session`).
const MAX_PREFIX: usize = 40;

/// Whether `prefix` names tables as it is: ASCII letters, digits and `_`, not starting with a digit, at most 40 bytes.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), crate::InvalidArgument> {
    let fits = !prefix.is_empty()
        && prefix.len() <= MAX_PREFIX
        && !prefix.starts_with(|c: char| c.is_ascii_digit())
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if fits {
        Ok(())
    } else {
        Err(crate::InvalidArgument::BadPrefix {
            prefix: prefix.to_owned(),
            rule: format!(
                "on PostgreSQL and MySQL/MariaDB it names the lease tables: ASCII letters, digits and `_`, not \
                 starting with a digit, 1 to {MAX_PREFIX} bytes"
            ),
        })
    }
}

/// A new session id: 128 random bits in hex.
pub(crate) fn new_session_id() -> Result<String, SqlError> {
    let bytes: [u8; 16] = random_bytes()?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Microseconds of `d`, as the statements take a TTL, rounded up.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX)
}

/// `sql` on one line, with single spaces, without a final `;`: statements as a test compares them.
#[cfg(test)]
pub(crate) fn normalized(sql: &str) -> String {
    sql.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end_matches(';')
        .to_owned()
}

/// The statements of DESIGN.md's SQL block that follows the line `-- TITLE`, each [`normalized`].
#[cfg(test)]
pub(crate) fn documented_sql(title: &str) -> Vec<String> {
    let design = include_str!("../../../../../DESIGN.md");
    let marker = format!("-- {title}\n");
    let start = design
        .find(&marker)
        .unwrap_or_else(|| panic!("DESIGN.md has no block {title:?}"))
        + marker.len();
    let block = &design[start..start + design[start..].find("```").unwrap()];
    block
        .split(';')
        .map(normalized)
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_must_be_identifiers() {
        for good in ["leasehold", "billing_locks", "_x", "A1"] {
            assert!(check_prefix(good).is_ok(), "{good}");
        }
        for bad in ["", "1x", "a-b", "a b", "a\"b", "a`b", &"x".repeat(41)] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kinds_round_trip_through_their_columns() {
        let three = Kind::Permits(std::num::NonZeroU32::new(3).unwrap());
        for kind in [Kind::Exclusive, Kind::Shared, three] {
            let (tag, permits) = kind_columns(kind);
            assert_eq!(kind_of_columns(tag, i64::from(permits)), kind);
        }
        assert_eq!(kind_of_columns("s", 0), Kind::Exclusive);
    }
}
