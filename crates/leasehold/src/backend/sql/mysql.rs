//! MySQL and MariaDB (feature `mysql`): the statements, through `mysql_async` (prepared once per connection, and
//! cached), on its pool of the client's own connections in autocommit, at `READ COMMITTED` (no gap locks).
//!
//! - **Time** is the server's `UTC_TIMESTAMP(6)`: microseconds (ShedLock#1968 saw double grants blamed on
//!   milliseconds), and no time zone, so no daylight-saving jump.
//! - **Names and holds are `VARBINARY`**: a default collation folds case and accents (`Lock` and `lock`, `é` and
//!   `e`), which would make two locks one.
//! - **Fences** come from the lock's row in `PREFIX_lock`: `LAST_INSERT_ID(fence + 1)` in the transaction that
//!   inserts the entry, read back from the statement's OK packet. The rows are never deleted, so a lock's fences never
//!   restart.
//! - **Bells, not polls.** MySQL has no `LISTEN`; a waiter blocks instead on the *bell* of the entry it waits for: a
//!   named lock (`GET_LOCK`) that the entry's client takes in the entry's own transaction, before its commit, on a
//!   connection kept for the entry, and frees after the entry's delete committed ([`Bells`]). A waiter's
//!   `GET_LOCK` on it returns when the entry is gone (or its client's connection is), and the waiter checks the table
//!   again: the table stays the only truth, a bell only wakes. A bell heard free while its entry is still there (an
//!   older client, a connection that went away, more entries than the client keeps bells for) marks that entry
//!   deaf, and the waiter polls for it: every 5 ms when it is next in line, doubling to 50 ms further back. A permit
//!   waiter (any entry ahead may admit it) blocks on the oldest one's bell for as long as it would sleep between polls
//!   (on MariaDB; MySQL's `GET_LOCK` takes whole seconds, and there it polls). Every waiter also checks at the expiry of the entry it waits
//!   for, at least every 500 ms (a `release --force` deletes entries without freeing their bells), and at once when a
//!   release by its own client.
//! - **Server-side deadlines**: `innodb_lock_wait_timeout` at the per-call deadline (whole seconds, at least one).
//! - **The schema** is created on first use with `CREATE TABLE IF NOT EXISTS` (MySQL's DDL is idempotent that way
//!   and serialises on the metadata lock), unless `information_schema` lists the tables already: a database whose
//!   tables exist needs no DDL right (MySQL checks the right to create before it looks whether the table exists).
//! - **Rights** are checked at connect by statements that need them and change nothing ([`Account::check`]).
//!
//! Written for MySQL 8.0+ and MariaDB 10.6+; tested on MariaDB 10.11.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Opts, OptsBuilder, Pool, Row, Value};

use super::rights::{self, Object, Right, Use};
use super::{kind_columns, kind_of_columns, micros, Enqueue, Entry, Ring, SqlError, Tables, Wakes};
use crate::backend::admission::Kind;
use crate::backend::session::StoreError;

/// How many of a client's entries hold a bell at once, and how many of its waiters block on one: beyond, they poll.
const BELLS: usize = 64;

/// The longest a waiter blocks on a bell before it checks again: `release --force` deletes entries without freeing
/// their bells, which stay held until their holders release. `GET_LOCK` takes whole seconds on MySQL (MariaDB takes
/// microseconds): there, a waiter whose entry ahead has less than a second left polls instead ([`MyDb::ring`]), as do
/// the waiters of locks with a TTL below about 1.3 s (their holders' sessions rarely have a second left), and every
/// permit waiter (it blocks on a bell only as long as its poll interval).
const BELL_WAIT: Duration = Duration::from_secs(1);

/// How long a connection beyond the pool's lower bound stays idle before it is closed.
const IDLE_CONNECTION_TTL: Duration = Duration::from_secs(60);

/// The poll interval of a waiter's `attempt`th check in a row behind waiters (0: it is next in line, every entry
/// ahead holds the lock): 5 ms next in line, doubling to 50 ms further back.
pub(crate) fn poll_interval(attempt: u32) -> Duration {
    Duration::from_millis(5u64 << attempt.min(4)).min(Duration::from_millis(50))
}

/// The statements of one prefix.
struct Statements {
    open: String,
    renew: String,
    holds: String,
    close: String,
    reap_expired: String,
    lock_row: String,
    entries: String,
    enqueued: String,
    release: String,
    rewrite: String,
    entry_count: String,
    lock_entry: String,
    raise_term: String,
    terms: String,
    first_live: String,
    delete_all: String,
    names: String,
    session: String,
    entry: String,
    commit_check: String,
}

impl Statements {
    fn new(t: &Tables) -> Statements {
        let (session, lock, entry) = (&t.session, &t.lock, &t.entry);
        Statements {
            open: format!(
                "INSERT INTO {session} (id, expires_at) VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)"
            ),
            // Never lowers the expiry: a renewal that started earlier may land after a later one (see `session`).
            renew: format!(
                "UPDATE {session} SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 WHERE id = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            holds: format!("SELECT hold FROM {entry} WHERE session = ?"),
            close: format!("DELETE FROM {session} WHERE id = ?"),
            // A locking read at READ COMMITTED: a row a renewal holds is read again once it committed, and skipped if
            // renewed. `ORDER BY id` makes the `LIMIT` deterministic, for statement-based replication.
            reap_expired: format!(
                "DELETE FROM {session} WHERE expires_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                 ORDER BY id LIMIT ?"
            ),
            lock_row: format!(
                "INSERT INTO {lock} (name, fence) VALUES (?, LAST_INSERT_ID(1)) \
                 ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1)"
            ),
            entries: format!(
                "SELECT e.fence, e.kind, e.permits, e.hold, e.session, \
                 COALESCE(s.expires_at > UTC_TIMESTAMP(6), 0), \
                 GREATEST(COALESCE(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), s.expires_at), 0), 0) \
                 FROM {entry} e LEFT JOIN {session} s ON s.id = e.session \
                 WHERE e.name = ? AND e.fence <= ? ORDER BY e.fence"
            ),
            // The entries up to the one just enqueued on this connection (its fence is the connection's
            // `LAST_INSERT_ID()`), which is the last column.
            enqueued: format!(
                "SELECT e.fence, e.kind, e.permits, e.hold, e.session, \
                 COALESCE(s.expires_at > UTC_TIMESTAMP(6), 0), \
                 GREATEST(COALESCE(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), s.expires_at), 0), 0), \
                 LAST_INSERT_ID() \
                 FROM {entry} e LEFT JOIN {session} s ON s.id = e.session \
                 WHERE e.name = ? AND e.fence <= LAST_INSERT_ID() ORDER BY e.fence"
            ),
            release: format!("DELETE FROM {entry} WHERE name = ? AND fence = ? AND session = ?"),
            rewrite: format!("UPDATE {entry} SET hold = ? WHERE name = ? AND fence = ? AND session = ?"),
            lock_entry: format!(
                "SELECT 1 FROM {entry} WHERE name = ? AND fence = ? AND session = ? FOR UPDATE"
            ),
            raise_term: format!(
                "INSERT INTO {lock} (name, fence) VALUES (?, LAST_INSERT_ID(1)) \
                 ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1)"
            ),
            terms: format!("SELECT fence FROM {lock} WHERE name = ?"),
            entry_count: format!(
                "SELECT COUNT(*) FROM {entry} WHERE name = ? AND fence = ? AND session = ?"
            ),
            first_live: format!(
                "SELECT e.hold FROM {entry} e JOIN {session} s ON s.id = e.session \
                 WHERE e.name = ? AND s.expires_at > UTC_TIMESTAMP(6) ORDER BY e.fence LIMIT 1"
            ),
            delete_all: format!("DELETE FROM {entry} WHERE name = ?"),
            names: format!(
                "SELECT DISTINCT e.name FROM {entry} e JOIN {session} s ON s.id = e.session \
                 WHERE s.expires_at > UTC_TIMESTAMP(6)"
            ),
            commit_check: format!(
                "SELECT 1 FROM {entry} e JOIN {session} s ON s.id = e.session \
                 WHERE e.name = ? AND e.fence = ? AND e.session = ? AND s.expires_at > UTC_TIMESTAMP(6) \
                 LOCK IN SHARE MODE"
            ),
            session: session.clone(),
            entry: entry.clone(),
        }
    }
}

/// The tables of a prefix, created when missing, as DESIGN.md and the README show them to an operator (a unit test
/// compares them).
fn schema(t: &Tables) -> [String; 3] {
    let (session, lock, entry) = (&t.session, &t.lock, &t.entry);
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {session} (id VARBINARY(32) NOT NULL PRIMARY KEY, \
             expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {lock} (name VARBINARY(512) NOT NULL PRIMARY KEY, \
             fence BIGINT NOT NULL) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {entry} (name VARBINARY(512) NOT NULL, fence BIGINT NOT NULL, \
             session VARBINARY(32) NOT NULL, kind CHAR(1) CHARACTER SET ascii NOT NULL, permits INT NOT NULL, \
             hold VARBINARY(2048) NOT NULL, PRIMARY KEY (name, fence), KEY (session), \
             FOREIGN KEY (session) REFERENCES {session} (id) ON DELETE CASCADE) ENGINE=InnoDB"
        ),
    ]
}

/// MySQL's `ER_DBACCESS_DENIED_ERROR`: "Access denied for user 'app'@'host' to database 'name'".
const DATABASE_DENIED: u16 = 1044;

/// The user a MySQL URL names.
fn opts_user(url: &str) -> String {
    Opts::from_url(url)
        .ok()
        .and_then(|o| o.user().map(str::to_owned))
        .unwrap_or_default()
}

/// MySQL's `ER_TABLEACCESS_DENIED_ERROR`: "SELECT command denied to user … for table …".
const ACCESS_DENIED: u16 = 1142;

/// The tables of a prefix as the rights check names them, each with its columns, which its probes write (no row: a
/// `NULL` in a `NOT NULL` column is refused only in a row; a column left out without a default is refused at once).
fn objects(t: &Tables) -> [(Object, &'static [&'static str]); 3] {
    let table = |name: &String| Object {
        name: name.clone(),
        sequence: false,
    };
    [
        (table(&t.session), &["id", "expires_at"]),
        (table(&t.lock), &["name", "fence"]),
        (
            table(&t.entry),
            &["name", "fence", "session", "kind", "permits", "hold"],
        ),
    ]
}

/// A statement that needs `privilege` on `table` (with `columns`) and nothing else, and changes nothing.
fn probe(privilege: &str, table: &str, columns: &[&str]) -> String {
    match privilege {
        "SELECT" => format!("SELECT 1 FROM {table} WHERE FALSE"),
        "INSERT" => format!(
            "INSERT INTO {table} ({}) SELECT {} FROM DUAL WHERE FALSE",
            columns.join(", "),
            vec!["NULL"; columns.len()].join(", ")
        ),
        "UPDATE" => format!("UPDATE {table} SET {} = NULL WHERE FALSE", columns[0]),
        _ => format!("DELETE FROM {table} WHERE FALSE"),
    }
}

/// The account the client connected as, and its database, as `GRANT` statements name them.
struct Account {
    /// `'app'@'%'`, from `CURRENT_USER()`: the account the server matched, whose grants count.
    user: String,
    /// `` `leasehold` ``; empty when the URL names none.
    database: String,
}

impl Account {
    /// The account of `CURRENT_USER()` (`app@%`) and the database of `DATABASE()`.
    fn of(user: String, database: Option<String>) -> Account {
        let user = match user.rsplit_once('@') {
            Some((name, host)) => format!("'{name}'@'{host}'"),
            None => format!("'{user}'"),
        };
        let database = database.map_or_else(String::new, |d| format!("`{d}`"));
        Account { user, database }
    }

    /// The account a refusal to open the URL's database names (`… for user 'app'@'host' to database 'name'`), else
    /// the URL's user at any host; the database the URL names.
    fn refused(message: &str, user: &str, url: &str) -> Account {
        let named = message
            .split_once("for user ")
            .and_then(|(_, rest)| rest.split_once(" to database"))
            .map(|(account, _)| account.to_owned());
        let database = Opts::from_url(url)
            .ok()
            .and_then(|o| o.db_name().map(|d| format!("`{d}`")))
            .unwrap_or_default();
        Account {
            user: named.unwrap_or_else(|| format!("'{user}'@'%'")),
            database,
        }
    }

    /// `table` as a `GRANT` names it: qualified by the database.
    fn qualified(&self, table: &str) -> String {
        if self.database.is_empty() {
            table.to_owned()
        } else {
            format!("{}.{table}", self.database)
        }
    }

    /// Checks that the user has every right `used` needs on `tables`, by running statements that need them and change
    /// nothing: the server applies its own rules (global, database and table grants, wildcards, roles). One round trip
    /// when every right is there; when one is refused, each is tried alone, to name every missing right. Refuses with
    /// [`SqlError::NotPermitted`] naming them and the `GRANT`s that give them.
    async fn check(
        &self,
        conn: &mut mysql_async::Conn,
        tables: &Tables,
        used: Use,
    ) -> Result<(), SqlError> {
        let objects = objects(tables);
        let plain: Vec<Object> = objects.iter().map(|(o, _)| o.clone()).collect();
        let rights = rights::needed(used, &plain);
        let probes: Vec<String> = rights
            .iter()
            .map(|r| {
                let (o, columns) = &objects[r.object];
                probe(r.privilege, &o.name, columns)
            })
            .collect();
        match conn.query_drop(probes.join("; ")).await {
            Ok(()) => return Ok(()),
            Err(mysql_async::Error::Server(e)) if e.code == ACCESS_DENIED => {}
            Err(e) => return Err(my("check rights")(e)),
        }
        let mut missing: Vec<Right> = Vec::new();
        for (right, probe) in rights.iter().zip(&probes) {
            match conn.query_drop(probe).await {
                Ok(()) => {}
                Err(mysql_async::Error::Server(e)) if e.code == ACCESS_DENIED => {
                    missing.push(*right)
                }
                Err(e) => return Err(my("check rights")(e)),
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = plain.iter().map(|o| self.qualified(&o.name)).collect();
        Err(SqlError::NotPermitted {
            detail: rights::refusal("MySQL", &self.user, &missing, &plain, &names),
        })
    }

    /// The refusal of a user who may not create `prefix`'s missing tables (the server said `why`).
    fn cannot_create(&self, tables: &Tables, prefix: &str, used: Use, why: &str) -> SqlError {
        let plain: Vec<Object> = objects(tables).into_iter().map(|(o, _)| o).collect();
        let names: Vec<String> = plain.iter().map(|o| self.qualified(&o.name)).collect();
        let rights = rights::needed(used, &plain);
        let database = if self.database.is_empty() {
            "the database"
        } else {
            &self.database
        };
        SqlError::NotPermitted {
            detail: rights::cannot_create(
                &format!("MySQL user {}", self.user),
                &format!(
                    "of prefix {prefix:?} ({}, {}, {}) do not exist, or this user may not see them,",
                    tables.session, tables.lock, tables.entry
                ),
                why,
                &rights::grants(&rights, &plain, &names, &self.user),
                &format!(
                    "GRANT CREATE, REFERENCES ON {database}.* TO {}; (REFERENCES for the foreign key, on MySQL)",
                    self.user
                ),
            ),
        }
    }
}

/// A MySQL or MariaDB database: the pool and the statements of the client's prefix.
pub(crate) struct MyDb {
    pool: Pool,
    statements: Statements,
    tables: Tables,
    account: Account,
    wakes: Wakes,
    bells: Bells,
    /// Whether the server's `GET_LOCK` takes fractions of a second (MariaDB does since 10.1.2; MySQL rounds to whole
    /// seconds).
    fractional: bool,
    /// The deadline of each statement.
    call_timeout: Duration,
}

impl Drop for MyDb {
    fn drop(&mut self) {
        let pool = self.pool.clone();
        let bells = self.bells.pool.clone();
        let pinned = self.bells.take(|_, _| true);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // Their locks go with their connections.
                for p in pinned {
                    let _ = p.conn.disconnect().await;
                }
                let _ = pool.disconnect().await;
                let _ = bells.disconnect().await;
            });
        }
    }
}

/// The bells of a client's entries, and the connections its waiters block on them with: a pool of its own, so that
/// the connections kept for entries never take one the keeper needs.
///
/// An entry's bell is the named lock `leasehold:` followed by the SHA-1 of the database's name, the prefix, the lock's
/// name and the entry's fence (separated by NUL bytes): the same for every client of the tables, and unique to the
/// entry (a lock's fences never repeat). It is taken with `GET_LOCK(bell, 0)` inside the entry's transaction, before
/// its commit, so every client that can see the entry finds its bell held; and freed after the entry's delete
/// committed (`RELEASE_LOCK(bell)` in the release's round trip; `RELEASE_ALL_LOCKS()` for one whose entry another
/// statement deleted), or by the server when the connection ends.
struct Bells {
    pool: Pool,
    /// The entries' bells this client holds now: at most [`BELLS`].
    held: Arc<tokio::sync::Semaphore>,
    /// The waiters of this client blocked on a bell now: at most [`BELLS`].
    waiting: Arc<tokio::sync::Semaphore>,
    /// The connection that holds each entry's bell, by lock name and fence.
    pinned: std::sync::Mutex<HashMap<(String, i64), Pinned>>,
    /// The tables' prefix, in every bell's name.
    prefix: String,
}

/// A connection that holds an entry's bell.
struct Pinned {
    conn: mysql_async::Conn,
    session: String,
    hold: String,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Bells {
    /// The expression of the bell of lock `name` (a SQL literal) and fence `fence` (a SQL expression).
    fn bell(&self, name: &str, fence: &str) -> String {
        format!(
            "CONCAT('leasehold:', SHA1(CONCAT_WS(0x00, IFNULL(DATABASE(), ''), '{}', {name}, {fence})))",
            self.prefix
        )
    }

    /// Takes out the connections that hold the bells `which` picks.
    fn take(&self, which: impl Fn(&(String, i64), &Pinned) -> bool) -> Vec<Pinned> {
        let mut pinned = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<(String, i64)> = pinned
            .iter()
            .filter(|(key, p)| which(key, p))
            .map(|(key, _)| key.clone())
            .collect();
        keys.iter().filter_map(|key| pinned.remove(key)).collect()
    }

    /// Takes out the connection that holds the bell of lock `name`'s entry `fence`, if this client keeps one.
    fn take_entry(&self, name: &str, fence: i64) -> Option<Pinned> {
        self.pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(name.to_owned(), fence))
    }

    /// Frees the bells of `pinned`, whose entries are deleted; each connection goes back to the pool, or is closed if
    /// that fails (the server then frees its bell).
    async fn free(pinned: Vec<Pinned>) {
        for p in pinned {
            let mut listed = Listed(Some(p.conn));
            if listed.run("DO RELEASE_ALL_LOCKS()").await.is_ok() {
                drop(listed.done());
            }
        }
    }
}

impl MyDb {
    /// Connects to the database of `url` (`mysql://`, or `mariadb://` read as `mysql://`), creates `prefix`'s
    /// tables when missing, and checks that the user has the rights `used` needs on them ([`Account::check`]).
    pub(crate) async fn connect(
        url: &str,
        prefix: &str,
        call_timeout: Duration,
        used: Use,
    ) -> Result<MyDb, SqlError> {
        let url = match url.strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_owned(),
        };
        let opts = Opts::from_url(&url).map_err(|e| SqlError::InvalidUrl {
            store: "MySQL",
            why: e.to_string(),
        })?;
        let lock_wait = call_timeout.as_secs().max(1);
        // mysql_async would move a connection to 127.0.0.1 onto the server's Unix socket (`prefer_socket`), a path
        // the URL does not name: only when the URL asks for it.
        let prefer_socket = url.contains("prefer_socket=true");
        // No reset when a connection goes back to the pool (mysql_async's default): it would cost a round trip per
        // statement, drop the cache of prepared statements, and undo the session settings below. The library never
        // leaves anything behind on a connection: its only transaction is mysql_async's `Transaction`, which rolls
        // itself back when dropped.
        let mut pool_opts = opts.pool_opts().clone().with_reset_connection(false);
        // mysql_async keeps only its lower bound of idle connections (10) unless idle ones may live a while: 64 tasks
        // would open and close a connection (a server thread, a login) for most statements. Idle connections beyond
        // the lower bound now last a minute, unless the URL says otherwise.
        if pool_opts.inactive_connection_ttl().is_zero() {
            pool_opts = pool_opts.with_inactive_connection_ttl(IDLE_CONNECTION_TTL);
        }
        // `CLIENT_FOUND_ROWS`: a renewal counts the session row it matched, also when it left its expiry as it was
        // (a later renewal landed first).
        let opts = OptsBuilder::from_opts(opts)
            .pool_opts(pool_opts.clone())
            .client_found_rows(true)
            .prefer_socket(prefer_socket)
            .init(vec![
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_owned(),
                format!("SET SESSION innodb_lock_wait_timeout = {lock_wait}"),
            ])
            .tcp_keepalive(Some(Duration::from_secs(5)));
        // The bells' pool: each connection kept for an entry's bell, or blocked on another's.
        let bell_constraints = mysql_async::PoolConstraints::new(0, 2 * BELLS)
            .expect("0 is at most the bells' connections");
        let bell_opts = opts
            .clone()
            .pool_opts(pool_opts.with_constraints(bell_constraints));
        let pool = Pool::new(opts);
        let bells = Bells {
            pool: Pool::new(bell_opts),
            held: Arc::new(tokio::sync::Semaphore::new(BELLS)),
            waiting: Arc::new(tokio::sync::Semaphore::new(BELLS)),
            pinned: std::sync::Mutex::new(HashMap::new()),
            prefix: prefix.to_owned(),
        };
        let tables = Tables::new(prefix, '`');
        let mut conn = match pool.get_conn().await {
            // The URL's database refused: the user has no right on it at all.
            Err(mysql_async::Error::Server(e)) if e.code == DATABASE_DENIED => {
                let account = Account::refused(&e.message, &opts_user(&url), &url);
                return Err(account.cannot_create(&tables, prefix, used, &e.message));
            }
            connected => connected.map_err(my("connect"))?,
        };
        // Looked for first: MySQL checks the right to create a table before it finds the table exists, so a `CREATE
        // TABLE IF NOT EXISTS` by a user with only the rights to read and write it fails (ERROR 1142). A table the
        // user has no right on is not listed either: it is then "created" (it exists: a no-op), or refused below. The
        // account and database come in the same round trip, for the messages.
        let (present, user, database, version): (i64, String, Option<String>, String) = conn
            .exec_first(
                "SELECT (SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name IN (?, ?, ?)), CURRENT_USER(), DATABASE(), VERSION()",
                (
                    format!("{prefix}_session"),
                    format!("{prefix}_lock"),
                    format!("{prefix}_entry"),
                ),
            )
            .await
            .map_err(my("schema"))?
            .unwrap_or_default();
        let account = Account::of(user, database);
        if present != 3 {
            for ddl in schema(&tables) {
                match conn.query_drop(ddl).await {
                    Err(mysql_async::Error::Server(e)) if e.code == ACCESS_DENIED => {
                        return Err(account.cannot_create(&tables, prefix, used, &e.message));
                    }
                    done => done.map_err(my("create schema"))?,
                }
            }
        }
        account.check(&mut conn, &tables, used).await?;
        drop(conn);
        Ok(MyDb {
            pool,
            statements: Statements::new(&tables),
            tables,
            account,
            wakes: Wakes::default(),
            bells,
            fractional: version.contains("MariaDB"),
            call_timeout,
        })
    }

    /// Checks that the user has the rights `used` needs on the tables ([`Account::check`]).
    pub(crate) async fn check_rights(&self, used: Use) -> Result<(), SqlError> {
        let mut conn = self.conn().await?;
        self.account.check(&mut conn, &self.tables, used).await
    }

    pub(crate) fn wakes(&self) -> &Wakes {
        &self.wakes
    }

    /// The statement a fenced transaction runs before its commit (parameters: name, fence, session).
    pub(crate) fn commit_check(&self) -> &str {
        &self.statements.commit_check
    }

    async fn conn(&self) -> Result<mysql_async::Conn, SqlError> {
        self.pool.get_conn().await.map_err(my("connect"))
    }

    pub(crate) async fn open_session(&self, id: &str, ttl: Duration) -> Result<(), SqlError> {
        let mut conn = self.conn().await?;
        conn.exec_drop(&self.statements.open, (id, micros(ttl)))
            .await
            .map_err(my("open session"))
    }

    pub(crate) async fn renew(
        &self,
        id: &str,
        ttl: Duration,
    ) -> Result<Option<Vec<String>>, SqlError> {
        let mut conn = self.conn().await?;
        conn.exec_drop(&self.statements.renew, (micros(ttl), id))
            .await
            .map_err(my("renew"))?;
        if conn.affected_rows() == 0 {
            return Ok(None);
        }
        let holds: Vec<Vec<u8>> = conn
            .exec(&self.statements.holds, (id,))
            .await
            .map_err(my("renew"))?;
        Ok(Some(holds.into_iter().map(text).collect()))
    }

    pub(crate) async fn close_session(&self, id: &str) -> Result<(), SqlError> {
        let mut conn = self.conn().await?;
        conn.exec_drop(&self.statements.close, (id,))
            .await
            .map_err(my("close session"))?;
        Bells::free(self.bells.take(|_, p| p.session == id)).await;
        Ok(())
    }

    /// Appends the entry and reads the lock's entries up to it, in one round trip: a list of statements in its own
    /// transaction (the lock row's fence, the entry, and the entry's bell when this client has one to spare),
    /// committed, then the read, a statement that began after the commit. The connection goes back to the pool only
    /// once the whole list was answered ([`Listed`]); one that took a bell is kept for the entry ([`Bells`]).
    pub(crate) async fn enqueue(
        &self,
        name: &str,
        session: &str,
        kind: Kind,
        hold: &str,
    ) -> Result<Enqueue, SqlError> {
        let (tag, permits) = kind_columns(kind);
        let lit = literal(name.as_bytes());
        let permit = Arc::clone(&self.bells.held).try_acquire_owned().ok();
        let bell = match permit {
            Some(_) => format!(
                "DO GET_LOCK({}, 0); ",
                self.bells.bell(&lit, "LAST_INSERT_ID()")
            ),
            None => String::new(),
        };
        let sql = format!(
            "START TRANSACTION; {lock_row}; \
             INSERT INTO {entry} (name, fence, session, kind, permits, hold) \
             VALUES ({lit}, LAST_INSERT_ID(), {session}, '{tag}', {permits}, {hold}); \
             {bell}COMMIT; {entries}",
            lock_row = filled(&self.statements.lock_row, &[&lit]),
            entry = self.statements.entry,
            session = literal(session.as_bytes()),
            hold = literal(hold.as_bytes()),
            entries = filled(&self.statements.enqueued, &[&lit]),
        );
        let conn = match permit {
            Some(_) => self.bells.pool.get_conn().await.map_err(my("connect"))?,
            None => self.conn().await?,
        };
        let mut listed = Listed(Some(conn));
        let rows: Vec<Row> = listed.run(&sql).await.map_err(my("enqueue"))?;
        let mut fence = None;
        let entries = rows
            .into_iter()
            .map(|row| {
                fence = Some(col::<i64>(&row, 7)?);
                entry_of(&row)
            })
            .collect::<Result<Vec<Entry>, SqlError>>()?;
        // Without its entry (deleted already), a connection that took a bell is closed (`listed`'s drop).
        let fence = fence.ok_or_else(|| SqlError::lost_while_waiting(name.to_owned()))?;
        let conn = listed.done();
        if let Some(permit) = permit {
            let pinned = Pinned {
                conn,
                session: session.to_owned(),
                hold: hold.to_owned(),
                _permit: permit,
            };
            self.bells
                .pinned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert((name.to_owned(), fence), pinned);
        }
        Ok(Enqueue {
            fence,
            entries: Some(entries),
        })
    }

    /// Blocks until the bell of lock `name`'s entry `fence` is free, for `within` (at most [`BELL_WAIT`]; in whole
    /// seconds on MySQL, whose `GET_LOCK` reads no fraction: [`Ring::Unavailable`] when that is none, and the waiter
    /// polls), on a connection of the bells' pool that holds nothing (got, the bell is freed in the same statement), then reads the
    /// lock's entries up to `upto`, the waiter's, in the same round trip: a statement after the bell was heard, so it
    /// sees the delete that freed it. Dropped while blocked, the connection is closed ([`Listed`]); the server's
    /// `GET_LOCK` then runs out on its own, and frees the bell if it got it. The answer has a call's deadline more.
    pub(crate) async fn ring(
        &self,
        name: &str,
        fence: i64,
        upto: i64,
        within: Duration,
    ) -> Result<(Ring, Option<Vec<Entry>>), SqlError> {
        let within = within.min(BELL_WAIT);
        // Whole seconds where the server reads no fraction (MySQL); microseconds on MariaDB.
        let within = if self.fractional {
            Duration::from_micros(u64::try_from(within.as_micros()).unwrap_or(u64::MAX))
        } else {
            Duration::from_secs(within.as_secs())
        };
        if within.is_zero() {
            return Ok((Ring::Unavailable, None));
        }
        let Ok(_permit) = Arc::clone(&self.bells.waiting).try_acquire_owned() else {
            return Ok((Ring::Unavailable, None));
        };
        let lit = literal(name.as_bytes());
        let bell = self.bells.bell(&lit, &fence.to_string());
        let sql = format!(
            "SELECT CASE GET_LOCK({bell}, {}.{:06}) WHEN 1 THEN RELEASE_LOCK({bell}) ELSE 0 END; {}",
            within.as_secs(),
            within.subsec_micros(),
            filled(&self.statements.entries, &[&lit, &upto.to_string()]),
        );
        let ringing = async {
            let mut listed = Listed(Some(self.bells.pool.get_conn().await?));
            let sets = listed.run_all(&sql).await?;
            drop(listed.done());
            Ok::<_, mysql_async::Error>(sets)
        };
        let after = within + self.call_timeout;
        let mut sets = match tokio::time::timeout(after, ringing).await {
            Ok(sets) => sets.map_err(my("wait"))?,
            Err(_) => {
                return Err(SqlError::Timeout {
                    store: "MySQL",
                    op: "wait",
                    after,
                })
            }
        };
        let (Some(entries), Some(rung)) = (sets.pop(), sets.pop()) else {
            return Err(SqlError::Unexpected {
                store: "MySQL",
                what: "a bell wait without its two results".to_owned(),
            });
        };
        let rung = match rung.first() {
            Some(row) => col::<i64>(row, 0)?,
            None => 0,
        };
        let entries = entries
            .iter()
            .map(entry_of)
            .collect::<Result<Vec<Entry>, SqlError>>()?;
        let ring = if rung == 1 { Ring::Rung } else { Ring::Silent };
        Ok((ring, Some(entries)))
    }

    pub(crate) async fn entries(
        &self,
        name: &str,
        upto: Option<i64>,
    ) -> Result<Vec<Entry>, SqlError> {
        let mut conn = self.conn().await?;
        let rows: Vec<Row> = conn
            .exec(
                &self.statements.entries,
                (name.as_bytes(), upto.unwrap_or(i64::MAX)),
            )
            .await
            .map_err(my("check"))?;
        rows.iter().map(entry_of).collect()
    }

    pub(crate) async fn reap(&self, name: &str, ids: &[String]) -> Result<(), SqlError> {
        if ids.is_empty() {
            return Ok(());
        }
        let marks = vec!["?"; ids.len()].join(", ");
        let sql = format!(
            "DELETE FROM {} WHERE expires_at <= UTC_TIMESTAMP(6) AND id IN ({marks})",
            self.statements.session
        );
        let params: Vec<Value> = ids.iter().map(|id| Value::from(id.as_str())).collect();
        let mut conn = self.conn().await?;
        conn.exec_drop(sql, params).await.map_err(my("reap"))?;
        if conn.affected_rows() > 0 {
            self.wakes.wake(name);
        }
        Ok(())
    }

    pub(crate) async fn reap_expired(&self, grace: Duration, limit: u32) -> Result<(), SqlError> {
        let mut conn = self.conn().await?;
        conn.exec_drop(&self.statements.reap_expired, (micros(grace), limit))
            .await
            .map_err(my("reap expired"))
    }

    /// Deletes the entry; on the connection that holds its bell, in the same round trip as the bell's release.
    pub(crate) async fn release(
        &self,
        name: &str,
        fence: i64,
        session: &str,
    ) -> Result<bool, SqlError> {
        if let Some(pinned) = self.bells.take_entry(name, fence) {
            let delete = filled(
                &self.statements.release,
                &[
                    &literal(name.as_bytes()),
                    &fence.to_string(),
                    &literal(session.as_bytes()),
                ],
            );
            let bell = self
                .bells
                .bell(&literal(name.as_bytes()), &fence.to_string());
            let sql = format!("{delete}; SELECT ROW_COUNT(), RELEASE_LOCK({bell})");
            let mut listed = Listed(Some(pinned.conn));
            // Half the call's deadline: a connection kept for a long hold may have gone silent, and the release must
            // still have time for another.
            let within = self.call_timeout / 2;
            let ran = tokio::time::timeout(within, listed.run(&sql))
                .await
                .unwrap_or_else(|_| {
                    Err(mysql_async::Error::Driver(
                        mysql_async::DriverError::ConnectionClosed,
                    ))
                });
            match ran {
                Ok(rows) => {
                    drop(listed.done());
                    let deleted = match rows.first() {
                        Some(row) => col::<i64>(row, 0)?,
                        None => 0,
                    };
                    return Ok(deleted > 0);
                }
                // That connection is gone (killed, a restart), and its bell with it: the delete goes on another.
                Err(e) => {
                    tracing::debug!(target: "leasehold::sql", error = %e, "an entry's bell connection failed; releasing on another");
                }
            }
        }
        let mut conn = self.conn().await?;
        conn.exec_drop(&self.statements.release, (name.as_bytes(), fence, session))
            .await
            .map_err(my("release"))?;
        Ok(conn.affected_rows() > 0)
    }

    pub(crate) async fn delete_entries(
        &self,
        session: &str,
        holds: &[String],
    ) -> Result<(), SqlError> {
        if holds.is_empty() {
            return Ok(());
        }
        let marks = vec!["?"; holds.len()].join(", ");
        let sql = format!(
            "DELETE FROM {} WHERE session = ? AND hold IN ({marks})",
            self.statements.entry
        );
        let mut params: Vec<Value> = vec![Value::from(session)];
        params.extend(holds.iter().map(|h| Value::from(h.as_bytes())));
        let mut conn = self.conn().await?;
        conn.exec_drop(sql, params)
            .await
            .map_err(my("delete entries"))?;
        drop(conn);
        Bells::free(
            self.bells
                .take(|_, p| p.session == session && holds.contains(&p.hold)),
        )
        .await;
        Ok(())
    }

    /// The update; only when it changed no row, a count of the entry (MySQL's affected rows leave out a row whose hold
    /// was already the same), so a new value costs one round trip.
    pub(crate) async fn rewrite(
        &self,
        name: &str,
        fence: i64,
        session: &str,
        hold: &str,
    ) -> Result<bool, SqlError> {
        let mut conn = self.conn().await?;
        let key = (name.as_bytes(), fence, session.as_bytes());
        conn.exec_drop(
            &self.statements.rewrite,
            (hold.as_bytes(), key.0, key.1, key.2),
        )
        .await
        .map_err(my("proclaim"))?;
        if conn.affected_rows() > 0 {
            return Ok(true);
        }
        let count: Option<i64> = conn
            .exec_first(&self.statements.entry_count, key)
            .await
            .map_err(my("proclaim"))?;
        Ok(count.unwrap_or(0) > 0)
    }

    /// One transaction: the entry locked (none: rolled back), the count raised, the entry's hold written.
    pub(crate) async fn begin_term(
        &self,
        name: &str,
        fence: i64,
        session: &str,
        record: &str,
        hold: &str,
    ) -> Result<Option<u64>, SqlError> {
        let mut conn = self.conn().await?;
        let mut tx = conn
            .start_transaction(mysql_async::TxOpts::default())
            .await
            .map_err(my("count a term"))?;
        let key = (name.as_bytes(), fence, session.as_bytes());
        let there: Option<i64> = tx
            .exec_first(&self.statements.lock_entry, key)
            .await
            .map_err(my("count a term"))?;
        if there.is_none() {
            tx.rollback().await.map_err(my("count a term"))?;
            return Ok(None);
        }
        tx.exec_drop(&self.statements.raise_term, (record.as_bytes(),))
            .await
            .map_err(my("count a term"))?;
        let term: Option<u64> = tx
            .query_first("SELECT LAST_INSERT_ID()")
            .await
            .map_err(my("count a term"))?;
        let term = term.ok_or_else(|| SqlError::Unexpected {
            store: "MySQL",
            what: "no count after counting a term".to_owned(),
        })?;
        tx.exec_drop(
            &self.statements.rewrite,
            (format!("{hold}{term}").as_bytes(), key.0, key.1, key.2),
        )
        .await
        .map_err(my("count a term"))?;
        tx.commit().await.map_err(my("count a term"))?;
        Ok(Some(term))
    }

    pub(crate) async fn terms(&self, record: &str) -> Result<u64, SqlError> {
        let mut conn = self.conn().await?;
        let count: Option<i64> = conn
            .exec_first(&self.statements.terms, (record.as_bytes(),))
            .await
            .map_err(my("read a term count"))?;
        Ok(count.and_then(|c| u64::try_from(c).ok()).unwrap_or(0))
    }

    pub(crate) async fn force_release(&self, name: &str) -> Result<Option<String>, SqlError> {
        let mut conn = self.conn().await?;
        let first: Option<Vec<u8>> = conn
            .exec_first(&self.statements.first_live, (name.as_bytes(),))
            .await
            .map_err(my("force release"))?;
        conn.exec_drop(&self.statements.delete_all, (name.as_bytes(),))
            .await
            .map_err(my("force release"))?;
        drop(conn);
        Bells::free(self.bells.take(|(lock, _), _| lock == name)).await;
        Ok(first.map(text))
    }

    pub(crate) async fn names(&self) -> Result<Vec<String>, SqlError> {
        let mut conn = self.conn().await?;
        let names: Vec<Vec<u8>> = conn
            .exec(&self.statements.names, ())
            .await
            .map_err(my("list"))?;
        Ok(names.into_iter().map(text).collect())
    }
}

/// The entry a check's `row` reads.
fn entry_of(row: &Row) -> Result<Entry, SqlError> {
    Ok(Entry {
        fence: col(row, 0)?,
        kind: kind_of_columns(&col::<String>(row, 1)?, col(row, 2)?),
        hold: text(col(row, 3)?),
        session: text(col(row, 4)?),
        live: col::<i64>(row, 5)? != 0,
        left: Duration::from_micros(col::<i64>(row, 6)?.unsigned_abs()),
    })
}

/// `bytes` as a SQL literal of the text protocol: a hex string, which needs no escaping.
fn literal(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(3 + 2 * bytes.len());
    s.push_str("X'");
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s.push('\'');
    s
}

/// A prepared statement's text with its `?` marks replaced, in order, by `values` (SQL literals of the text
/// protocol: [`literal`], numbers): the same statement, sent in a list. None of the statements has a `?` elsewhere.
fn filled(sql: &str, values: &[&str]) -> String {
    let mut values = values.iter();
    let mut out = String::with_capacity(sql.len() + 64);
    for part in sql.split_inclusive('?') {
        match part.strip_suffix('?') {
            Some(head) => {
                out.push_str(head);
                out.push_str(values.next().expect("a value for every mark"));
            }
            None => out.push_str(part),
        }
    }
    out
}

/// A connection running a list of statements that opens a transaction of its own (mysql_async does not know of it):
/// it goes back to the pool only once every statement of the list was answered; on an error, or dropped before
/// that, it is closed instead, and the server rolls back whatever the list left open.
struct Listed(Option<mysql_async::Conn>);

impl Listed {
    /// Runs `sql`, a list of statements, and returns the rows of the last result set.
    async fn run(&mut self, sql: &str) -> Result<Vec<Row>, mysql_async::Error> {
        Ok(self.run_all(sql).await?.pop().unwrap_or_default())
    }

    /// Runs `sql`, a list of statements, and returns the rows of every result set.
    async fn run_all(&mut self, sql: &str) -> Result<Vec<Vec<Row>>, mysql_async::Error> {
        let conn = self
            .0
            .as_mut()
            .expect("a listed connection is present until done");
        let mut result = conn.query_iter(sql).await?;
        let mut sets = Vec::new();
        while !result.is_empty() {
            sets.push(result.collect::<Row>().await?);
        }
        Ok(sets)
    }

    /// The connection, once its list was answered in full: dropped, it goes back to its pool.
    fn done(mut self) -> mysql_async::Conn {
        self.0
            .take()
            .expect("a listed connection is present until done")
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = conn.disconnect().await;
                });
            }
        }
    }
}

/// Column `i` of a check's `row`.
fn col<T: mysql_async::prelude::FromValue>(row: &Row, i: usize) -> Result<T, SqlError> {
    match row.get_opt(i) {
        Some(Ok(value)) => Ok(value),
        Some(Err(e)) => Err(SqlError::Unexpected {
            store: "MySQL",
            what: format!("column {i} of a check: {e}"),
        }),
        None => Err(SqlError::Unexpected {
            store: "MySQL",
            what: format!("a check without column {i}"),
        }),
    }
}

/// Bytes the library wrote as UTF-8 (names, holds, ids), read back.
fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The error of statement `op`.
fn my(op: &'static str) -> impl Fn(mysql_async::Error) -> SqlError {
    move |source| SqlError::MySql { op, source }
}

/// Whether a MySQL error passes: the connection failed, or the server cannot answer now (shutting down, a killed
/// connection, a lock wait timeout, a deadlock, too many connections, a statement time limit).
pub(crate) fn is_transient(e: &mysql_async::Error) -> bool {
    match e {
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => true,
        mysql_async::Error::Server(e) => {
            matches!(
                e.code,
                1040 | 1053 | 1205 | 1213 | 1452 | 1927 | 1969 | 2006 | 2013 | 3024
            )
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_statement_has_each_mark_replaced_in_order() {
        assert_eq!(
            filled("DELETE FROM t WHERE a = ? AND b = ?", &["X'6c'", "7"]),
            "DELETE FROM t WHERE a = X'6c' AND b = 7"
        );
        assert_eq!(literal(b"l\x00"), "X'6c00'");
    }

    #[test]
    fn the_documented_statements_are_the_ones_the_client_runs() {
        let tables = Tables::new("leasehold", '`');
        assert_eq!(
            super::super::documented_sql("MySQL/MariaDB: the tables"),
            schema(&tables).map(|s| super::super::normalized(&s))
        );
    }
}
