//! The lock on a SQL store: one PostgreSQL server (topology `pg`) or one MariaDB server (`mysql`), and the faults of
//! the SQL mix that the rig draws in place of the Redis server's.
//!
//! Each worker reaches the server through a proxy of its own, under a name of its own that the server sees: on
//! PostgreSQL its `application_name` (`torture-worker-N`, set in its URL), on MariaDB a user of its own
//! (`tortureN`, created when the server starts, with every right on the database `leasehold`), since the server sees
//! every worker's connections come from the proxies on 127.0.0.1. The faults are the members' mix on one member
//! ([`members::fault`](crate::members::fault): a worker's path cut, slowed or reset; the server stopped with `SIGSTOP`, or killed with
//! `SIGKILL` and restarted with its data), and the SQL stores' own, in the slots where one member has nothing else
//! to do: every connection of one worker killed server-side (slot 6, which on three members would stop or kill the
//! leader), and a worker's session expired on the server while the worker is cut off from it (slot 7).
//!
//! None of them loses a committed write. The harness's PostgreSQL runs with `fsync=off` but `synchronous_commit=on`:
//! a commit is answered once its WAL record was written into the kernel, which a `SIGKILL` of the server leaves
//! intact (the rig kills processes, not the machine), and crash recovery replays it. The harness's MariaDB runs with
//! `innodb_flush_log_at_trx_commit=2`: the redo log is written at every commit (flushed to disk once a second), the
//! same way. The fence source is durable on both: PostgreSQL's sequence is WAL-logged ahead of the values it hands
//! out (a crash skips values, never repeats one), MySQL's is the lock's committed row.

use std::net::SocketAddr;
use std::time::Duration;

use leasehold_tests::{MariaDbServer, PgServer, XorShift as Rng};

use crate::history::Fault;
use crate::members::{self, Aim, Members, OwnFaults};
use crate::Topology;

/// The longest the workers' sessions may stay live on the server once every client is killed: a session expires one
/// TTL (2 s) after its last renewal ran, and the last one may have been held back by a slowed path (a third of a
/// TTL); with room for a loaded machine.
const SESSIONS_GONE: Duration = Duration::from_secs(10);

/// The tables of the workers' locks: those of leasehold's default prefix.
const SESSION_TABLE: &str = "leasehold_session";
const ENTRY_TABLE: &str = "leasehold_entry";

/// The server the lock lives on.
pub enum Sql {
    Pg(PgServer),
    MariaDb(MariaDbServer),
}

impl Sql {
    /// Starts the server of a `pg` or `mysql` topology for `workers` workers, and waits until it serves; on MariaDB
    /// also creates each worker's user.
    pub fn start(topology: Topology, workers: usize) -> Sql {
        match topology {
            Topology::Pg => Sql::Pg(PgServer::start()),
            Topology::Mysql => {
                let server = MariaDbServer::start();
                let users: String = (0..workers)
                    .map(|worker| {
                        let user = maria_user(worker);
                        format!(
                            "CREATE USER '{user}'@'127.0.0.1'; \
                             GRANT ALL PRIVILEGES ON leasehold.* TO '{user}'@'127.0.0.1'; "
                        )
                    })
                    .collect();
                server.sql(&users);
                Sql::MariaDb(server)
            }
            _ => unreachable!("{topology} is not a SQL topology"),
        }
    }

    /// The URL that reaches the server directly (not through a proxy), as its superuser.
    pub fn url(&self) -> String {
        match self {
            Sql::Pg(server) => server.url(),
            Sql::MariaDb(server) => server.url(),
        }
    }

    /// The URL of worker `worker`, through its proxy at `path`, under the name the server knows it by.
    pub fn worker_url(&self, worker: usize, path: SocketAddr) -> String {
        match self {
            Sql::Pg(_) => format!(
                "postgres://postgres@{path}/leasehold?application_name={}",
                pg_application(worker)
            ),
            Sql::MariaDb(_) => format!("mysql://{}@{path}/leasehold", maria_user(worker)),
        }
    }

    /// Everything the server logged, across its restarts, and the name of the file to keep it in.
    pub fn log(&self) -> (&'static str, String) {
        match self {
            Sql::Pg(server) => ("postgres.log", server.log()),
            Sql::MariaDb(server) => ("mariadb.log", server.log()),
        }
    }

    /// Runs `sql` through the server's command-line client: its output, or what it printed on failure.
    fn sql(&self, sql: &str) -> Result<String, String> {
        match self {
            Sql::Pg(server) => server.try_psql(sql),
            Sql::MariaDb(server) => server.try_sql(sql),
        }
    }

    /// Kills every connection of worker `worker` on the server (its pool and, on PostgreSQL, its listener), as an
    /// administrator or a connection limit would: `pg_terminate_backend` of the backends with its application name,
    /// `KILL CONNECTION` of the connections of its user. Returns how many there were.
    fn kill_connections(&self, worker: usize) -> Result<usize, String> {
        match self {
            Sql::Pg(_) => {
                let killed = self.sql(&format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = '{}'",
                    pg_application(worker)
                ))?;
                killed
                    .trim()
                    .parse()
                    .map_err(|e| format!("{killed:?}: {e}"))
            }
            Sql::MariaDb(_) => {
                let ids = self.sql(&format!(
                    "SELECT id FROM information_schema.processlist WHERE user = '{}'",
                    maria_user(worker)
                ))?;
                let ids: Vec<&str> = ids.split_whitespace().collect();
                for id in &ids {
                    // Gone already (it ended meanwhile) is fine.
                    let _ = self.sql(&format!("KILL CONNECTION {id}"));
                }
                Ok(ids.len())
            }
        }
    }

    /// The sessions still live on the server's clock, each with its number of entries and how long it has left.
    fn live_sessions(&self) -> Result<Vec<String>, String> {
        let now = match self {
            Sql::Pg(_) => "now()",
            Sql::MariaDb(_) => "UTC_TIMESTAMP(6)",
        };
        let left = match self {
            Sql::Pg(_) => "extract(epoch FROM s.expires_at - now())",
            Sql::MariaDb(_) => "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), s.expires_at) / 1e6",
        };
        let rows = self.sql(&format!(
            "SELECT s.id, (SELECT count(*) FROM {ENTRY_TABLE} e WHERE e.session = s.id), {left} \
             FROM {SESSION_TABLE} s WHERE s.expires_at > {now}"
        ))?;
        Ok(rows
            .lines()
            .filter(|row| !row.trim().is_empty())
            .map(|row| {
                let cols: Vec<&str> = row.split(['|', '\t']).collect();
                format!(
                    "session {} with {} entries, live for {} s more",
                    cols.first().unwrap_or(&"?"),
                    cols.get(1).unwrap_or(&"?"),
                    cols.get(2).unwrap_or(&"?")
                )
            })
            .collect())
    }

    /// Sessions that stay live once every client of the lock is gone (the SQL stores' keys without a TTL): to be
    /// asked once every worker and queued client is killed. A session expires one TTL after its last renewal ran on
    /// the server; one still live [`SESSIONS_GONE`] after the kill counts, with its entries.
    pub async fn sessions_outliving_clients(&self) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + SESSIONS_GONE;
        loop {
            match tokio::task::block_in_place(|| self.live_sessions()) {
                Ok(live) if live.is_empty() => return Vec::new(),
                Ok(live) if tokio::time::Instant::now() >= deadline => {
                    return live
                        .into_iter()
                        .map(|s| format!("{s}, {SESSIONS_GONE:?} after its client was killed"))
                        .collect();
                }
                Ok(_) => {}
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return vec![format!("the server did not list its sessions: {e}")];
                }
                Err(_) => {}
            }
            // Polled: the server tells an outsider nothing when a session expires (nothing happens then).
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The SQL stores' own faults, in the slots where one member has nothing else to do:
///
/// - 6: every connection of the worker killed server-side ([`Sql::kill_connections`]): its statements in flight fail
///   at once, and it connects again (on three members, this slot would stop or kill the leader);
/// - 7: the worker's session expired: its path blackholed for one and a half to two and a half TTLs (`ttl`). The last
///   renewal that got through passed the proxy before the cut, and the server dated the session's expiry from that
///   statement's start (`now()`, `UTC_TIMESTAMP(6)`): so the session has expired on the server's clock before the
///   path is back, with half a TTL to spare for a loaded machine, and the next waiter deletes it, whatever the worker
///   said last.
impl OwnFaults for Sql {
    async fn own_fault(&mut self, aim: &Aim<'_>, rng: &mut Rng) -> Option<(Fault, Option<usize>)> {
        let worker = aim.worker;
        let fault = match aim.slot {
            6 => {
                if let Err(e) = tokio::task::block_in_place(|| self.kill_connections(worker)) {
                    eprintln!(
                        "torture: the SQL server did not kill worker {worker}'s connections: {e}"
                    );
                }
                Fault::ConnectionsKilled
            }
            7 => {
                let cut = rng.between(aim.ttl * 3 / 2, aim.ttl * 5 / 2);
                members::cut_off(aim.paths.iter(), cut).await;
                Fault::SessionExpiry
            }
            _ => return None,
        };
        Some((fault, Some(worker)))
    }
}

/// The `application_name` of worker `worker`'s PostgreSQL connections.
fn pg_application(worker: usize) -> String {
    format!("torture-worker-{worker}")
}

/// The MariaDB user of worker `worker`.
fn maria_user(worker: usize) -> String {
    format!("torture{worker}")
}

impl Members for Sql {
    fn members(&self) -> usize {
        1
    }

    fn addr(&self, _: usize) -> SocketAddr {
        match self {
            Sql::Pg(server) => server.addr(),
            Sql::MariaDb(server) => server.addr(),
        }
    }

    fn leader(&self) -> usize {
        0
    }

    fn pause(&mut self, _: usize) {
        match self {
            Sql::Pg(server) => server.pause(),
            Sql::MariaDb(server) => server.pause(),
        }
    }

    fn resume(&mut self, _: usize) {
        match self {
            Sql::Pg(server) => server.resume(),
            Sql::MariaDb(server) => server.resume(),
        }
    }

    fn kill(&mut self, _: usize) {
        match self {
            Sql::Pg(server) => server.kill(),
            Sql::MariaDb(server) => server.kill(),
        }
    }

    fn restart(&mut self, _: usize) {
        match self {
            Sql::Pg(server) => server.restart(),
            Sql::MariaDb(server) => server.restart(),
        }
    }
}
