//! The bench's MySQL or MariaDB (`--store mysql://…` or `mariadb://…`): the floor, the raw round trip, and what is
//! read from the server itself.
//!
//! The floor is the servers' named lock, the primitive users reach for: `SELECT GET_LOCK(?, 10)`, then
//! `SELECT RELEASE_LOCK(?)`, both prepared, on a connection of the task's own (a named lock belongs to the connection
//! that took it). One connection per task, opened before the measured window. The name is the lock's under the floor's
//! prefix; the servers take at most 64 characters, so a longer one is the prefix and its hash ([`lock_name`]).
//! Uncontended (`my-floor-1`, `-64`) each call is one round trip; on ONE name (`my-floor-8p`) `GET_LOCK` waits in the
//! server until the holder releases (in an order MySQL leaves undefined), and a wait that times out (`0`) is asked
//! again, the latency counted from the first ask.
//!
//! The row floor (`my-row-1`, `-64`) is what any durable lease row costs: per cycle an `INSERT` of the lock's row
//! into an InnoDB table (its name a `VARBINARY(512)` primary key, so a second insert fails) and its `DELETE`, each
//! prepared and its own autocommitted transaction, on a connection per task as well.
//!
//! The servers report no CPU time of their own, so it is read from `/proc` for a server on this machine: the process
//! that listens on the URL's port, all its threads (see [`super::local`]). A server elsewhere shows none. The requests
//! the server received (`renew-10k`'s renewal calls) are its `Questions`: the statements clients sent it.
//!
//! The floor connects where the URL says: mysql_async would otherwise move a connection to a server on this machine
//! over to the server's Unix socket (`?prefer_socket=true` asks for that).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context as _};
use mysql_async::prelude::Queryable as _;
use mysql_async::{Conn, Opts, OptsBuilder, Statement};
use tokio::sync::Mutex;

use super::local::{self, Processes};
use super::ROW_TABLE;

/// The scheme mysql_async reads.
const SCHEME: &str = "mysql://";

/// MariaDB's scheme: the same server protocol, given to mysql_async as `mysql://`.
const MARIADB_SCHEME: &str = "mariadb://";

/// The floor's lock names live under this prefix, apart from leasehold's.
const FLOOR_PREFIX: &str = "leasehold-bench-floor:";

/// The longest lock name the servers take (MySQL 5.7+, MariaDB).
const MAX_NAME: usize = 64;

/// How long `GET_LOCK` waits in the server before it answers `0`, in seconds (the floor then asks again).
const FLOOR_WAIT_S: u32 = 10;

/// The deadline of connecting and of the bench's own readings.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The MySQL or MariaDB server of `--store`.
#[derive(Clone, Debug)]
pub struct MySql {
    opts: Opts,
    /// `host:port` of the server the URL names.
    server: String,
}

impl MySql {
    /// The server of a `mysql://` or `mariadb://` URL; `None` for any other URL.
    ///
    /// # Errors
    ///
    /// When the URL is not one mysql_async reads.
    pub fn parse(url: &str) -> anyhow::Result<Option<MySql>> {
        let url = match url.strip_prefix(MARIADB_SCHEME) {
            Some(rest) => format!("{SCHEME}{rest}"),
            None if url.starts_with(SCHEME) => url.to_owned(),
            None => return Ok(None),
        };
        let mut opts = Opts::from_url(&url).context("not a MySQL or MariaDB URL")?;
        // mysql_async moves a connection to a server on this machine over to the server's Unix socket unless told
        // not to: the floor goes where the URL says, as every other store's does.
        if !url.contains("prefer_socket=") {
            opts = OptsBuilder::from_opts(opts).prefer_socket(false).into();
        }
        let host = opts.ip_or_hostname();
        let server = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{}", opts.tcp_port())
        } else {
            format!("{host}:{}", opts.tcp_port())
        };
        Ok(Some(MySql { opts, server }))
    }

    /// A connection of its own.
    pub async fn connect(&self) -> anyhow::Result<Conn> {
        tokio::time::timeout(TIMEOUT, Conn::new(self.opts.clone()))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {TIMEOUT:?}"))
            .context("connecting to MySQL")?
            .context("connecting to MySQL")
    }

    /// A connection for the floor, its two statements prepared.
    pub async fn session(&self) -> anyhow::Result<Session> {
        let mut conn = self.connect().await?;
        let get = conn.prep("SELECT GET_LOCK(?, ?)").await?;
        let release = conn.prep("SELECT RELEASE_LOCK(?)").await?;
        Ok(Session {
            conn: Mutex::new(conn),
            statements: Statements::Named { get, release },
        })
    }

    /// A connection for the row floor, its insert and delete prepared (the table exists: see
    /// [`row_floor`](MySql::row_floor)).
    async fn row_session(&self) -> anyhow::Result<Session> {
        let mut conn = self.connect().await?;
        let insert = conn
            .prep(format!("INSERT INTO {ROW_TABLE} (name) VALUES (?)"))
            .await?;
        let delete = conn
            .prep(format!("DELETE FROM {ROW_TABLE} WHERE name = ?"))
            .await?;
        Ok(Session {
            conn: Mutex::new(conn),
            statements: Statements::Row { insert, delete },
        })
    }

    /// The in-process floor: one session per task, opened together.
    pub async fn floor(&self, tasks: usize) -> anyhow::Result<Floor> {
        let sessions =
            futures_util::future::try_join_all((0..tasks).map(|_| self.session())).await?;
        Ok(Floor { sessions })
    }

    /// The in-process row floor: one row session per task, opened together, after the table is created if missing
    /// and emptied of the rows an interrupted run left.
    pub async fn row_floor(&self, tasks: usize) -> anyhow::Result<Floor> {
        let mut conn = self.connect().await?;
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS {ROW_TABLE} (name VARBINARY(512) PRIMARY KEY) ENGINE=InnoDB"
        ))
        .await
        .context("creating the row floor's table")?;
        // DELETE rather than TRUNCATE: the privilege the scenario needs anyway, not DROP.
        conn.query_drop(format!("DELETE FROM {ROW_TABLE}"))
            .await
            .context("emptying the row floor's table")?;
        conn.disconnect().await?;
        let sessions =
            futures_util::future::try_join_all((0..tasks).map(|_| self.row_session())).await?;
        Ok(Floor { sessions })
    }

    /// One raw round trip: `COM_PING`.
    pub async fn round_trip(conn: &mut Conn) -> anyhow::Result<()> {
        conn.ping().await?;
        Ok(())
    }

    /// What reads the server's own figures: its process, and a connection for its status.
    pub async fn meter(&self) -> anyhow::Result<Meter> {
        Ok(Meter {
            server: self.server.clone(),
            conn: self.connect().await?,
        })
    }
}

/// The floor of one task: a connection and the lock statements prepared on it.
pub struct Session {
    /// Only the task's loop uses it: the mutex is never contended, it lends the connection to `&self`.
    conn: Mutex<Conn>,
    statements: Statements,
}

/// The two statements of a session: the named lock's, or the row floor's.
enum Statements {
    /// `GET_LOCK(name, wait)` and `RELEASE_LOCK(name)`.
    Named { get: Statement, release: Statement },
    /// The `INSERT` and the `DELETE` of the lock's row.
    Row {
        insert: Statement,
        delete: Statement,
    },
}

impl Session {
    /// `GET_LOCK` of the lock `name`: returns once this connection holds it, waiting in the server while another
    /// does. The row floor inserts the lock's row: an error when it exists.
    pub async fn lock(&self, name: &str) -> anyhow::Result<()> {
        let mut conn = self.conn.lock().await;
        let get = match &self.statements {
            Statements::Named { get, .. } => get,
            Statements::Row { insert, .. } => {
                conn.exec_drop(insert, (name,)).await?;
                return Ok(());
            }
        };
        let name = lock_name(name);
        loop {
            let granted: Option<Option<i64>> =
                conn.exec_first(get, (name.as_str(), FLOOR_WAIT_S)).await?;
            match granted.flatten() {
                Some(1) => return Ok(()),
                Some(0) => continue,
                _ => bail!("GET_LOCK({name:?}) answered NULL (an error, or the wait was killed)"),
            }
        }
    }

    /// `RELEASE_LOCK` of the lock `name`; an error when this connection did not hold it. The row floor deletes the
    /// lock's row: an error when there was none.
    pub async fn unlock(&self, name: &str) -> anyhow::Result<()> {
        let mut conn = self.conn.lock().await;
        let release = match &self.statements {
            Statements::Named { release, .. } => release,
            Statements::Row { delete, .. } => {
                conn.exec_drop(delete, (name,)).await?;
                if conn.affected_rows() != 1 {
                    bail!("the row floor's lock {name} had no row");
                }
                return Ok(());
            }
        };
        let name = lock_name(name);
        let released: Option<Option<i64>> = conn.exec_first(release, (name.as_str(),)).await?;
        if released.flatten() != Some(1) {
            bail!("RELEASE_LOCK({name:?}): the floor's lock was not held");
        }
        Ok(())
    }
}

/// The in-process floor: a session per task.
pub struct Floor {
    sessions: Vec<Session>,
}

impl Floor {
    /// The session of task `task`.
    pub fn session(&self, task: usize) -> &Session {
        &self.sessions[task]
    }
}

/// The server's own figures.
pub struct Meter {
    server: String,
    conn: Conn,
}

impl Meter {
    /// The CPU time so far of the server process on this machine that listens on the URL's port; an error when
    /// there is none.
    pub fn cpu_seconds(&self) -> anyhow::Result<BTreeMap<String, f64>> {
        local::cpu_seconds(std::slice::from_ref(&self.server), Processes::One)
    }

    /// The statements clients have sent the server so far (`Questions`, this reading's included).
    pub async fn questions(&mut self) -> anyhow::Result<u64> {
        let read = self
            .conn
            .query_first::<(String, String), _>("SHOW GLOBAL STATUS LIKE 'Questions'");
        let row = tokio::time::timeout(TIMEOUT, read)
            .await
            .context("MySQL did not answer SHOW GLOBAL STATUS")??;
        let (_, value) = row.context("SHOW GLOBAL STATUS has no Questions")?;
        value
            .parse()
            .with_context(|| format!("Questions is not a count: {value:?}"))
    }
}

/// The name of the floor's lock `name` on the server: the name under the floor's prefix, or, when that is longer
/// than the servers take, the prefix and the 64-bit hash of the name in hex.
pub fn lock_name(name: &str) -> String {
    let named = format!("{FLOOR_PREFIX}{name}");
    if named.chars().count() <= MAX_NAME {
        return named;
    }
    // The same hash as the PostgreSQL floor's keys: stable across the processes of a run.
    format!("{FLOOR_PREFIX}{:016x}", super::postgres::hash(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_the_server_and_mariadb_reads_as_mysql() {
        let my = MySql::parse("mysql://root@127.0.0.1:33306/locks")
            .unwrap()
            .unwrap();
        assert_eq!(my.server, "127.0.0.1:33306");
        assert_eq!(my.opts.db_name(), Some("locks"));
        assert!(!my.opts.prefer_socket());
        let socket = MySql::parse("mysql://root@127.0.0.1/locks?prefer_socket=true")
            .unwrap()
            .unwrap();
        assert!(socket.opts.prefer_socket());
        let maria = MySql::parse("mariadb://app:secret@db.example/locks")
            .unwrap()
            .unwrap();
        assert_eq!(maria.server, "db.example:3306");
        assert_eq!(maria.opts.user(), Some("app"));
        assert_eq!(maria.opts.pass(), Some("secret"));
        assert!(MySql::parse("postgres://127.0.0.1/locks")
            .unwrap()
            .is_none());
        assert!(MySql::parse("mysql://127.0.0.1/locks?no_such_option=1").is_err());
    }

    #[test]
    fn lock_names_fit_the_servers_limit() {
        assert_eq!(lock_name("bench:7"), "leasehold-bench-floor:bench:7");
        let long = "x".repeat(60);
        let hashed = lock_name(&long);
        assert_eq!(hashed.len(), FLOOR_PREFIX.len() + 16);
        assert!(hashed.len() <= MAX_NAME);
        assert_eq!(hashed, lock_name(&long));
        assert_ne!(hashed, lock_name(&"x".repeat(61)));
    }
}
