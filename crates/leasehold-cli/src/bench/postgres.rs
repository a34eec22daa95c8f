//! The bench's PostgreSQL (`--store postgres://…` or `postgresql://…`): the floor, the raw round trip, and what is
//! read from the server itself.
//!
//! The floor is PostgreSQL's session advisory lock, the primitive users reach for: `SELECT pg_advisory_lock($1)`, then
//! `SELECT pg_advisory_unlock($1)`, both prepared, on a connection of the task's own (a session lock belongs to the
//! connection that took it, so a pool must never share one). One connection per task, opened before the measured
//! window. The key is a 64-bit hash of the lock's name ([`key_of`]). Uncontended (`pg-floor-1`, `-64`) each call is
//! one round trip; on ONE name (`pg-floor-8p`) `pg_advisory_lock` waits in the server's lock manager until the holder
//! unlocks, and PostgreSQL wakes the next waiter.
//!
//! PostgreSQL reports no CPU time of its own, so the server's is read from `/proc` for a server on this machine: the
//! process that listens on the URL's port and its children, one per connection (see [`super::local`]). A server
//! elsewhere shows none. The requests the server received (`renew-10k`'s renewal calls) are the transactions of every
//! database (`xact_commit + xact_rollback` of `pg_stat_database`; a statement outside a transaction is one). A
//! backend reports them when it goes idle, at most once a second, so the count lags by up to a second.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls, Statement};

use super::local::{self, Processes};
use super::ROW_TABLE;

/// The schemes of PostgreSQL URLs.
const SCHEMES: [&str; 2] = ["postgres://", "postgresql://"];

/// PostgreSQL's port, when a URL names none.
const DEFAULT_PORT: u16 = 5432;

/// The floor's lock names are hashed under this prefix, apart from leasehold's.
const FLOOR_PREFIX: &str = "leasehold-bench-floor";

/// The connection timeout when the URL sets none (`connect_timeout=`), and the deadline of the bench's own readings.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The transactions every database has run (committed or rolled back), as far as the backends have reported them.
const TRANSACTIONS: &str = "SELECT sum(xact_commit + xact_rollback)::bigint FROM pg_stat_database";

/// The PostgreSQL server of `--store`.
#[derive(Clone, Debug)]
pub struct Pg {
    config: Config,
    /// `host:port` of each TCP host the URL names (none for a Unix socket).
    servers: Vec<String>,
}

impl Pg {
    /// The server of a `postgres://` or `postgresql://` URL; `None` for any other URL.
    ///
    /// # Errors
    ///
    /// When the URL is not one tokio-postgres reads.
    pub fn parse(url: &str) -> anyhow::Result<Option<Pg>> {
        if !SCHEMES.iter().any(|scheme| url.starts_with(scheme)) {
            return Ok(None);
        }
        let mut config: Config = url.parse().context("not a PostgreSQL URL")?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(TIMEOUT);
        }
        let servers = tcp_servers(&config);
        Ok(Some(Pg { config, servers }))
    }

    /// How many servers the URL names (whose CPU time the server columns sum).
    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    /// A connection of its own, served by a task of this process until the client is dropped.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        let (client, connection) = self
            .config
            .connect(NoTls)
            .await
            .context("connecting to PostgreSQL")?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!("the floor's PostgreSQL connection ended: {err}");
            }
        });
        Ok(client)
    }

    /// A connection for the floor, its two statements prepared.
    pub async fn session(&self) -> anyhow::Result<Session> {
        let client = self.connect().await?;
        let lock = client.prepare("SELECT pg_advisory_lock($1)").await?;
        let unlock = client.prepare("SELECT pg_advisory_unlock($1)").await?;
        Ok(Session {
            client,
            lock,
            unlock,
            row: false,
        })
    }

    /// The in-process floor: one session per task, opened together.
    pub async fn floor(&self, tasks: usize) -> anyhow::Result<Floor> {
        let sessions =
            futures_util::future::try_join_all((0..tasks).map(|_| self.session())).await?;
        Ok(Floor { sessions })
    }

    /// A connection for the row floor, its insert and delete prepared (the table exists: [`row_floor`](Pg::row_floor)).
    async fn row_session(&self) -> anyhow::Result<Session> {
        let client = self.connect().await?;
        let lock = client
            .prepare(&format!("INSERT INTO {ROW_TABLE} (name) VALUES ($1)"))
            .await?;
        let unlock = client
            .prepare(&format!("DELETE FROM {ROW_TABLE} WHERE name = $1"))
            .await?;
        Ok(Session {
            client,
            lock,
            unlock,
            row: true,
        })
    }

    /// The in-process row floor: what any durable lease row costs (a ShedLock-style lock): per cycle an `INSERT` of
    /// the lock's row (its name the primary key, so a second insert fails) and its `DELETE`, each its own durable
    /// transaction, on a connection per task; the table (logged, as leasehold's are by default) is created first.
    pub async fn row_floor(&self, tasks: usize) -> anyhow::Result<Floor> {
        self.connect()
            .await?
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {ROW_TABLE} (name text PRIMARY KEY); TRUNCATE {ROW_TABLE}"
            ))
            .await
            .context("creating the row floor's table")?;
        let sessions =
            futures_util::future::try_join_all((0..tasks).map(|_| self.row_session())).await?;
        Ok(Floor { sessions })
    }

    /// One raw round trip: `SELECT 1`, in the simple protocol (one message each way).
    pub async fn round_trip(client: &Client) -> anyhow::Result<()> {
        client.simple_query("SELECT 1").await?;
        Ok(())
    }

    /// What reads the server's own figures: its processes, and a connection for `pg_stat_database`.
    pub async fn meter(&self) -> anyhow::Result<Meter> {
        let client = self.connect().await?;
        let transactions = client.prepare(TRANSACTIONS).await?;
        Ok(Meter {
            servers: self.servers.clone(),
            client,
            transactions,
        })
    }
}

/// The floor of one task: a connection and the lock statements prepared on it.
pub struct Session {
    client: Client,
    lock: Statement,
    unlock: Statement,
    /// The row floor's (insert and delete a row) rather than the advisory lock's.
    row: bool,
}

impl Session {
    /// `pg_advisory_lock` of the lock `name`'s key: returns once this connection holds it, waiting in the server
    /// while another does. The row floor inserts the lock's row: an error when it exists.
    pub async fn lock(&self, name: &str) -> anyhow::Result<()> {
        if self.row {
            self.client.execute(&self.lock, &[&name]).await?;
            return Ok(());
        }
        self.client.execute(&self.lock, &[&key_of(name)]).await?;
        Ok(())
    }

    /// `pg_advisory_unlock` of the lock `name`'s key; an error when this connection did not hold it. The row floor
    /// deletes the lock's row: an error when there was none.
    pub async fn unlock(&self, name: &str) -> anyhow::Result<()> {
        if self.row {
            if self.client.execute(&self.unlock, &[&name]).await? != 1 {
                bail!("the row floor's lock {name} had no row");
            }
            return Ok(());
        }
        let key = key_of(name);
        let row = self.client.query_one(&self.unlock, &[&key]).await?;
        if !row.try_get::<_, bool>(0)? {
            bail!("pg_advisory_unlock({key}): the floor's lock {name} was not held");
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
    servers: Vec<String>,
    client: Client,
    transactions: Statement,
}

impl Meter {
    /// The CPU time so far of each server process on this machine that listens on a port the URL names, with its
    /// children (the backends); an error when there is none.
    pub fn cpu_seconds(&self) -> anyhow::Result<BTreeMap<String, f64>> {
        local::cpu_seconds(&self.servers, Processes::WithChildren)
    }

    /// The transactions every database has run so far, as far as the backends have reported them.
    pub async fn transactions(&self) -> anyhow::Result<u64> {
        let read = self.client.query_one(&self.transactions, &[]);
        let row = tokio::time::timeout(TIMEOUT, read)
            .await
            .context("PostgreSQL did not answer a read of pg_stat_database")??;
        let total: Option<i64> = row.try_get(0)?;
        Ok(u64::try_from(total.unwrap_or(0))?)
    }
}

/// The advisory-lock key of the floor's lock `name`: the 64-bit FNV-1a hash of the name under the floor's prefix,
/// which every process of a run computes alike.
pub fn key_of(name: &str) -> i64 {
    // The hash's 64 bits as they are: PostgreSQL's keys are signed.
    hash(&format!("{FLOOR_PREFIX}/{name}")) as i64
}

/// FNV-1a, 64 bits: small, stable across builds and platforms, and spreads short names over the whole key space.
pub fn hash(text: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    text.bytes()
        .fold(OFFSET, |h, byte| (h ^ u64::from(byte)).wrapping_mul(PRIME))
}

/// `host:port` of each TCP host of `config`: one port for all of them, one per host, or PostgreSQL's.
fn tcp_servers(config: &Config) -> Vec<String> {
    let ports = config.get_ports();
    config
        .get_hosts()
        .iter()
        .enumerate()
        .filter_map(|(i, host)| {
            let Host::Tcp(name) = host else {
                return None;
            };
            let port = match ports {
                [] => DEFAULT_PORT,
                [one] => *one,
                each => *each.get(i)?,
            };
            Some(if name.contains(':') {
                format!("[{name}]:{port}")
            } else {
                format!("{name}:{port}")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_the_servers() {
        let pg = Pg::parse("postgres://app:secret@127.0.0.1:55432/locks")
            .unwrap()
            .unwrap();
        assert_eq!(pg.servers, ["127.0.0.1:55432"]);
        assert_eq!(pg.servers(), 1);
        assert_eq!(pg.config.get_connect_timeout(), Some(&TIMEOUT));
        let both = Pg::parse("postgresql://db1:5433,db2:5434/locks?connect_timeout=2")
            .unwrap()
            .unwrap();
        assert_eq!(both.servers, ["db1:5433", "db2:5434"]);
        assert_eq!(
            both.config.get_connect_timeout(),
            Some(&Duration::from_secs(2))
        );
        let default_port = Pg::parse("postgres://[::1]/locks").unwrap().unwrap();
        assert_eq!(default_port.servers, ["[::1]:5432"]);
        let socket = Pg::parse("postgres://%2Fvar%2Frun%2Fpostgresql/locks")
            .unwrap()
            .unwrap();
        assert!(socket.servers.is_empty());
        assert!(Pg::parse("mysql://127.0.0.1:3306/locks").unwrap().is_none());
        assert!(Pg::parse("postgres://host:port/locks").is_err());
    }

    #[test]
    fn keys_are_fnv1a_of_the_prefixed_name() {
        // The reference values of FNV-1a, 64 bits.
        assert_eq!(hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash("foobar"), 0x8594_4171_f739_67e8);
        let key = key_of("bench:0");
        assert_eq!(key as u64, hash("leasehold-bench-floor/bench:0"));
        assert_ne!(key, key_of("bench:1"));
    }
}
