//! A private PostgreSQL server for tests: [`PgServer`], run from the newest `/usr/lib/postgresql/<version>/bin`
//! (Debian's layout; 15 on bookworm: `scripts/ensure-postgres.sh` installs it).
//!
//! The server gets a fresh cluster (`initdb -A trust -U postgres --no-sync -E UTF8 --locale=C.UTF-8`), listens on a
//! free port of 127.0.0.1 and on a Unix socket next to its cluster, and holds a database `leasehold`. Every method
//! is synchronous, like [`ZkServer`](crate::ZkServer)'s: readiness is polled with `pg_isready`, and tests read and
//! change the server through [`PgServer::psql`] (or a `psql` of their own, [`PgServer::psql_command`]), so the
//! harness needs no Rust PostgreSQL client.
//!
//! # How it runs
//!
//! - **As the `postgres` user.** PostgreSQL refuses to run as root, so when the tests run as root, `initdb` and
//!   `postgres` run through `setpriv --reuid=postgres --regid=postgres --init-groups`, in a directory the harness
//!   gives to that user. `setpriv` execs (`runuser` forks, and stays in between): the pid the harness holds is the
//!   postmaster's, so it can signal, pause and reap the server itself. `pg_ctl` is not used, since it detaches.
//! - **Dying with the tests.** `setpriv --pdeathsig SIGKILL` has the kernel kill the postmaster when its parent
//!   dies. That parent is the *thread* that spawned it, so servers are spawned from one thread that lives as long as
//!   the test process: a server restarted from a short-lived thread (a `spawn_blocking` task, a fault-injecting
//!   thread) would otherwise die with that thread. The postmaster's children notice its death and exit.
//! - **In memory.** The cluster and the socket are in `/dev/shm` when there is one (and in the [`TempDir`](crate::TempDir) that
//!   holds the log otherwise): on a disk that other builds keep busy, `initdb` took 2.1 s instead of 0.8 s.
//! - **Fast, but safe against a kill.** `fsync=off` and `full_page_writes=off` (nothing here needs to survive a power
//!   cut or a torn page). `synchronous_commit` stays `on`: with `fsync=off` it costs a `write(2)` and no flush,
//!   while with it `off` a commit acknowledged up to 0.6 s before a [`kill`](PgServer::kill) would be lost on
//!   restart, and a fence could go backwards. Also `max_connections=200`, `shared_buffers=32MB`, and
//!   `dynamic_shared_memory_type=mmap` (the segments of parallel queries are files of the cluster, not of
//!   `/dev/shm`, so that a killed server leaves none behind).
//! - **A server is a process tree.** The postmaster forks a process per connection and a few helpers (checkpointer,
//!   WAL writer…). So [`pause`](PgServer::pause) stops every one of them (stopping the postmaster alone would leave
//!   the open sessions served), and [`kill`](PgServer::kill) kills every one of them, as a crash of the machine
//!   would.
//!
//! # Readiness and start-up times
//!
//! A server is ready once `pg_isready` says it accepts connections and a query through `psql` succeeds (on the first
//! start, `CREATE DATABASE leasehold`). Measured on two cores (Debian 12, PostgreSQL 15.18): [`PgServer::start`],
//! `initdb` included, returns after 0.48–0.70 s, and after 0.8–1.7 s while three other servers start too (most of
//! it is `initdb`: the server itself accepts connections 0.03–0.1 s after it was spawned). After a
//! [`kill`](PgServer::kill), [`restart`](PgServer::restart) returns after 0.07–0.17 s, crash recovery included.
//!
//! # Logs
//!
//! `initdb`'s output and the server's stderr go to one file, appended to across restarts; it is printed to stderr
//! when the value is dropped during a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use nix::sys::signal::Signal;

use crate::daemon::{
    as_server_user, children_of, client_output, give_to, is_root, spawn_for_process_life,
    wait_gone, wait_stopped,
};
use crate::send_signal;
use crate::sql::{Dialect, SqlServer, CONNECT_TIMEOUT, DATABASE, STOP_TIMEOUT};

/// Where Debian installs each PostgreSQL version's programs, one directory per version.
const PG_ROOT: &str = "/usr/lib/postgresql";
/// The user the server runs as when the tests run as root.
const PG_USER: &str = "postgres";
/// The server's settings (see the module docs).
const SETTINGS: &[&str] = &[
    "listen_addresses=127.0.0.1",
    "fsync=off",
    "full_page_writes=off",
    "max_connections=200",
    "shared_buffers=32MB",
    // A killed server leaves its dynamic segments behind: as files of the cluster, they go with its directory.
    "dynamic_shared_memory_type=mmap",
];

/// A PostgreSQL server with a fresh cluster, as the [module docs](self) tell: a [`SqlServer`], whose server is a
/// process tree.
///
/// Dropping the value ends the server with an immediate shutdown (`SIGQUIT`, after which the postmaster has reaped
/// all its children; `SIGKILL` to all of them if that takes over 10 seconds), and also removes the shared memory
/// segment that a killed server leaves.
///
/// # Examples
///
/// ```no_run
/// use leasehold_tests::PgServer;
///
/// let mut pg = PgServer::start();
/// pg.psql("CREATE TABLE t (n int); INSERT INTO t VALUES (1)");
/// pg.kill();
/// pg.restart(); // same port, same data
/// assert_eq!(pg.psql("SELECT n FROM t"), "1");
/// ```
pub type PgServer = SqlServer<Postgres>;

/// PostgreSQL's [`Dialect`]: the programs of the newest `/usr/lib/postgresql/<version>/bin`, a server that is a
/// process tree.
#[derive(Debug, Default)]
pub struct Postgres {
    /// Settings beyond [`SETTINGS`] (TLS, for [`start_tls`](SqlServer::start_tls)).
    extra: Vec<String>,
}

impl SqlServer<Postgres> {
    /// As [`start`](Self::start), with TLS on (`ssl=on`): the server presents `ca`'s server certificate (valid for
    /// `127.0.0.1`), copied into its directory for its user, and still accepts clients in the clear.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start), and if the certificate cannot be copied.
    pub fn start_tls(ca: &crate::TestCa) -> PgServer {
        PgServer::start_with(|server| {
            let server_dir = &server.server_dir;
            let (cert, key) = (server_dir.join("server.crt"), server_dir.join("server.key"));
            for (from, to) in [(&ca.server.cert_path, &cert), (&ca.server.key_path, &key)] {
                std::fs::copy(from, to).unwrap_or_else(|e| {
                    panic!("cannot copy {} to {}: {e}", from.display(), to.display())
                });
                // PostgreSQL refuses a key that others can read.
                std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .expect("cannot restrict the key's mode");
                if is_root() {
                    let status = Command::new("chown")
                        .arg(PG_USER)
                        .arg(to)
                        .status()
                        .expect("cannot run chown");
                    assert!(status.success(), "chown {} failed", to.display());
                }
            }
            server.dialect.extra = vec![
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", cert.display()),
                format!("ssl_key_file={}", key.display()),
            ];
        })
    }

    /// As [`start`](Self::start), with `pg_stat_statements` loaded and created in the database `leasehold`: a test
    /// counts how many times the client ran a statement (its `calls`, counted once it finished), which the last query
    /// `pg_stat_activity` shows of a pooled connection cannot tell (the next statement on it hides it).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start), and if the extension cannot be created.
    pub fn start_counting_statements() -> PgServer {
        let server = PgServer::start_with(|server| {
            server.dialect.extra = vec!["shared_preload_libraries=pg_stat_statements".to_owned()];
        });
        server.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
        server
    }

    /// Runs `sql` (one or more statements) in the database `leasehold` through `psql -At` as the `postgres` superuser,
    /// and returns what it printed, without the final newline: the rows one a line, their columns separated by `|`,
    /// nothing for a statement that returns no rows. Tests use it to read tables and to break sessions, e.g.
    /// `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '…'`.
    ///
    /// # Panics
    ///
    /// If `psql` fails, with its stderr: the SQL is wrong, or the server cannot be reached (a connection to a paused
    /// server gives up after 2 seconds).
    pub fn psql(&self, sql: &str) -> String {
        self.psql_in(DATABASE, sql)
    }

    /// [`psql`](Self::psql), for a test that expects it to fail.
    ///
    /// # Errors
    ///
    /// What `psql` printed on stderr when it failed, as `psql: error: connection to server at "127.0.0.1", port
    /// PORT failed: timeout expired` when the server is paused, or `ERROR:  relation "t" does not exist`.
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        self.try_psql_in(DATABASE, sql)
    }

    /// A `psql` command connected to the database `leasehold` as `postgres` (and with the 2-second connect timeout),
    /// for a session of the test's own: add arguments (`-At`, `-c`), pipes and an application name (`PGAPPNAME`),
    /// and spawn it.
    ///
    /// # Panics
    ///
    /// If PostgreSQL cannot be found (run `scripts/ensure-postgres.sh`).
    pub fn psql_command(&self) -> Command {
        self.psql_command_in(DATABASE)
    }

    fn psql_command_in(&self, database: &str) -> Command {
        let mut command = Command::new(bin_dir().join("psql"));
        command
            .env("PGCONNECT_TIMEOUT", CONNECT_TIMEOUT)
            // No ~/.psqlrc: the output must be what the statements return and nothing else.
            .args(["-X", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", PG_USER, "-d", database]);
        command
    }

    fn psql_in(&self, database: &str, sql: &str) -> String {
        self.try_psql_in(database, sql)
            .unwrap_or_else(|e| panic!("psql failed on {sql:?}: {e}"))
    }

    fn try_psql_in(&self, database: &str, sql: &str) -> Result<String, String> {
        let mut command = self.psql_command_in(database);
        command
            .args(["-At", "-v", "ON_ERROR_STOP=1", "-c"])
            .arg(sql);
        client_output(&mut command, "psql")
    }

    /// Polls `pg_isready` until the server accepts connections; `Err(addr_in_use)` if it exited first.
    fn wait_ready(&mut self, log_start: u64) -> Result<(), bool> {
        let port = self.port.to_string();
        self.daemon.wait_ready(log_start, || {
            let ready = Command::new(bin_dir().join("pg_isready"))
                // As `postgres`: as root it would make the server log that there is no role `root`.
                .args(["-q", "-t", "2", "-h", "127.0.0.1", "-p", &port])
                .args(["-U", PG_USER, "-d", "postgres"])
                .stdin(Stdio::null())
                .status()
                .unwrap_or_else(|e| panic!("cannot run pg_isready: {e}"));
            ready
                .success()
                .then_some(())
                .ok_or_else(|| format!("pg_isready: {ready}"))
        })
    }

    /// Removes the System V shared memory segment that a killed server left (a tiny one, by which a postmaster tells
    /// whether processes of an earlier one still run). A restart would remove it, a server shut down removed it
    /// itself; this is for a server killed and then dropped. Its id is on line 7 of the lock file, which only a
    /// server that did not shut down leaves behind.
    fn remove_leftover_segment(&self) {
        let lock_file =
            std::fs::read_to_string(self.data_dir().join("postmaster.pid")).unwrap_or_default();
        let id = lock_file
            .lines()
            .nth(6)
            .and_then(|line| line.split_whitespace().nth(1));
        if let Some(id) = id.filter(|id| id.parse::<u64>().is_ok()) {
            let _ = Command::new("ipcrm")
                .args(["-m", id])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Dialect for Postgres {
    const NAME: &'static str = "PostgreSQL";
    const DIR_PREFIX: &'static str = "postgres";
    const URL_USER: &'static str = "postgres://postgres";
    const STOP_SIGNAL: Signal = Signal::SIGINT;
    const DATA_PROGRAM: &'static str = "initdb";

    fn data_command(server: &PgServer) -> Command {
        let server_dir = &server.server_dir;
        give_to(server_dir, PG_USER);
        let mut initdb = as_server_user(PG_USER, &bin_dir().join("initdb"));
        initdb
            .arg("-D")
            .arg(server.data_dir())
            .args(["-A", "trust", "-U", PG_USER, "--no-sync", "-E", "UTF8"])
            .arg("--locale=C.UTF-8")
            .current_dir(server_dir);
        initdb
    }

    fn spawn_and_wait(server: &mut PgServer) -> Result<(), bool> {
        let log_start = server.daemon.log_len();
        let mut command = as_server_user(PG_USER, &bin_dir().join("postgres"));
        command
            .arg("-D")
            .arg(server.data_dir())
            .args(["-p", &server.port.to_string(), "-k"])
            .arg(&server.server_dir);
        for setting in SETTINGS
            .iter()
            .copied()
            .chain(server.dialect.extra.iter().map(String::as_str))
        {
            command.args(["-c", setting]);
        }
        command.current_dir(&server.server_dir);
        server.daemon.log_to(&mut command);
        let child = spawn_for_process_life(command)
            .unwrap_or_else(|e| panic!("cannot run postgres through setpriv: {e}"));
        server.daemon.set_child(child);
        server.wait_ready(log_start)?;
        // `pg_isready` only says the server accepts connections; a query says it serves.
        server.psql_in("postgres", "SELECT 1");
        Ok(())
    }

    fn admin_sql(server: &PgServer, sql: &str) {
        server.psql_in("postgres", sql);
    }

    fn kill(server: &mut PgServer) {
        if let Some(pid) = server.daemon.pid() {
            // Stopped, the postmaster can neither fork a new child nor reap an old one (whose pid could then be
            // reused): its children stay exactly those listed here.
            let _ = send_signal(pid, Signal::SIGSTOP);
            wait_stopped(pid, "the killed postmaster");
            let children = children_of(pid);
            for &process in &children {
                let _ = send_signal(process, Signal::SIGKILL);
            }
            server.daemon.kill();
            // A restart must not begin while one of them is still attached to the old shared memory: the new
            // postmaster would refuse to start.
            assert!(
                wait_gone(&children, STOP_TIMEOUT),
                "PostgreSQL's processes {children:?} outlived a SIGKILL"
            );
        }
    }

    fn pause(server: &mut PgServer) {
        let pid = server.daemon.running_pid("pause");
        // The postmaster first: stopped, it forks nothing more, so the list of children below is complete.
        send_signal(pid, Signal::SIGSTOP).unwrap_or_else(|e| panic!("SIGSTOP to PostgreSQL: {e}"));
        wait_stopped(pid, "the paused postmaster");
        let children = children_of(pid);
        for &process in &children {
            // A child that has just exited (and waits for the stopped postmaster to reap it) is fine.
            let _ = send_signal(process, Signal::SIGSTOP);
        }
        for &process in &children {
            wait_stopped(process, "a paused PostgreSQL process");
        }
        server.daemon.set_paused(true);
    }

    /// Its children, and then the postmaster.
    fn resume_if_paused(server: &mut PgServer) {
        if !server.daemon.is_paused() {
            return;
        }
        let pid = server.daemon.running_pid("resume");
        for process in children_of(pid) {
            let _ = send_signal(process, Signal::SIGCONT);
        }
        server.daemon.resume();
    }

    /// An immediate shutdown (`SIGQUIT`), after which the postmaster has had every child exit and reaped it, so
    /// that none is left for init to reap; `SIGKILL` to all of them if that takes too long. Then the shared memory
    /// segment a killed server leaves.
    fn quit(server: &mut PgServer) {
        if let Some(pid) = server.pid() {
            let children = children_of(pid);
            if server.daemon.is_paused() {
                for &process in &children {
                    let _ = send_signal(process, Signal::SIGCONT);
                }
                let _ = send_signal(pid, Signal::SIGCONT);
                server.daemon.set_paused(false);
            }
            let _ = send_signal(pid, Signal::SIGQUIT);
            if !(server.daemon.wait_exit(STOP_TIMEOUT) && wait_gone(&children, STOP_TIMEOUT)) {
                for &process in &children {
                    let _ = send_signal(process, Signal::SIGKILL);
                }
                server.daemon.kill();
            }
        }
        server.remove_leftover_segment();
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` that holds a `postgres`, looked for once per process.
///
/// # Panics
///
/// If there is none.
fn bin_dir() -> &'static Path {
    static BIN_DIR: OnceLock<PathBuf> = OnceLock::new();
    BIN_DIR.get_or_init(|| {
        let versions = std::fs::read_dir(PG_ROOT).into_iter().flatten().flatten();
        versions
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                // `15`, `16`; before 10, `9.6`.
                let version: Vec<u32> = name
                    .split('.')
                    .map(|n| n.parse().ok())
                    .collect::<Option<_>>()?;
                let bin = entry.path().join("bin");
                bin.join("postgres").is_file().then_some((version, bin))
            })
            .max()
            .map(|(_, bin)| bin)
            .unwrap_or_else(|| {
                panic!(
                    "no PostgreSQL under {PG_ROOT}/<version>/bin: run scripts/ensure-postgres.sh"
                )
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_postgresql_is_found() {
        let bin = bin_dir();
        assert!(bin.starts_with(PG_ROOT), "{}", bin.display());
        assert!(bin.join("psql").is_file(), "{}", bin.display());
    }
}
