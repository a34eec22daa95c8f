//! A private MariaDB server for tests: [`MariaDbServer`], run from Debian's `mariadb-server` (10.11 on bookworm:
//! `/usr/sbin/mariadbd`, with `mariadb-install-db` and the `mariadb` client; `scripts/ensure-mariadb.sh` installs
//! them).
//!
//! The server gets fresh system tables (`mariadb-install-db --auth-root-authentication-method=normal`, which makes
//! `root@127.0.0.1` with no password), listens on a free port of 127.0.0.1 and on a Unix socket next to its data,
//! and holds a database `leasehold`. Every method is synchronous, like [`PgServer`](crate::PgServer)'s: readiness is
//! polled with the `mariadb` client, and tests read and change the server through [`MariaDbServer::sql`] (or a client
//! of their own, [`MariaDbServer::mariadb_command`]), so the harness needs no Rust MySQL client.
//!
//! # How it runs
//!
//! - **As the `mysql` user**, when the tests run as root, through `setpriv`, as [`PgServer`](crate::PgServer) runs
//!   PostgreSQL, and for the same reasons: `setpriv` execs, so the pid the harness holds is the server's, and it sets
//!   a parent-death signal that survives (`mariadbd --user` would drop it when it changes ids). The server is spawned
//!   from a thread that lives as long as the test process, so that it dies with the process and only then.
//! - **In memory.** The data directory, the socket and the pid file are in `/dev/shm` when there is one (and in the
//!   [`TempDir`](crate::TempDir) that holds the log otherwise). MariaDB syncs its DDL log and its Aria system tables whatever it is
//!   told (`mariadb-install-db` makes about 950 `fdatasync` calls): on a disk that other builds kept busy it took
//!   3.5–4.7 s instead of 0.4 s. Its `tmpdir` is there too, of its own: a starting server deletes every `#sql*` file
//!   in its `tmpdir`, so with a shared `/tmp` one test's server deleted the temporary tables of another's
//!   `mariadb-install-db`, which failed.
//! - **No option files** (`--no-defaults`, for the server and the client alike): what a machine's `/etc/mysql` says
//!   does not leak into the tests. The character set is `utf8mb4` with `utf8mb4_general_ci`, as Debian's
//!   configuration has it (the compiled-in default is `latin1`).
//! - **Light and fast, but safe against a kill.** A 32 MiB buffer pool, a 16 MiB redo log, no doublewrite buffer, no
//!   performance schema, no binary log, `max_connections=200`. `innodb_flush_log_at_trx_commit=2`: the redo log is
//!   written at every commit but flushed to disk once a second, so a `SIGKILL` ([`kill`](MariaDbServer::kill)) loses
//!   no committed transaction (with `0` it would lose up to a second of them, and a fence could go backwards); only a
//!   power cut could.
//! - It is one process: [`pause`](MariaDbServer::pause) stops it with `SIGSTOP` and returns once every one of its
//!   threads is stopped.
//!
//! # Readiness and start-up times
//!
//! A server is ready once `SELECT 1` through the `mariadb` client succeeds (then, on the first start, it creates the
//! database `leasehold`). Measured on two cores (Debian 12, MariaDB 10.11.19): [`MariaDbServer::start`],
//! `mariadb-install-db` included, returns after 0.41–0.63 s, and after 0.7–0.95 s while three other servers start
//! too (the server itself answers about 0.1 s after it was spawned). After a [`kill`](MariaDbServer::kill),
//! [`restart`](MariaDbServer::restart) returns after 0.08–0.36 s, InnoDB's crash recovery included.
//!
//! # Logs
//!
//! `mariadb-install-db`'s output and the server's stderr (its error log: no `--log-error` is given) go to one file,
//! appended to across restarts; it is printed to stderr when the value is dropped during a panic. Its warnings that
//! it "could not increase number of max_open_files" and that the `root@<host name>` entry is "ignored in
//! --skip-name-resolve mode" are harmless.

use std::path::Path;
use std::process::Command;

use nix::sys::signal::Signal;

use crate::daemon::{as_server_user, client_output, give_to, spawn_for_process_life};
use crate::sql::{Dialect, SqlServer, CONNECT_TIMEOUT, DATABASE};

/// Debian's server program (package `mariadb-server-core`).
const MARIADBD: &str = "/usr/sbin/mariadbd";
/// The user the server runs as when the tests run as root.
const MARIADB_USER: &str = "mysql";
/// The settings of both `mariadb-install-db` (which passes them on to the server it bootstraps with, so that the redo
/// log is created at its size) and the server (see the module docs).
const SETTINGS: &[&str] = &[
    "--skip-name-resolve",
    "--skip-log-bin",
    "--performance-schema=OFF",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
    "--max-connections=200",
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=16M",
    "--innodb-doublewrite=0",
    "--innodb-flush-log-at-trx-commit=2",
];

/// A MariaDB server with fresh system tables (see the [module docs](self)): a [`SqlServer`] of one process, which
/// dropping the value kills with `SIGKILL`, leaving nothing behind.
///
/// # Examples
///
/// ```no_run
/// use leasehold_tests::MariaDbServer;
///
/// let db = MariaDbServer::start();
/// assert_eq!(db.url(), format!("mysql://root@{}/leasehold", db.addr()));
/// db.sql("CREATE TABLE t (n int) ENGINE=InnoDB; INSERT INTO t VALUES (1)");
/// assert_eq!(db.sql("SELECT n FROM t"), "1");
/// ```
pub type MariaDbServer = SqlServer<MariaDb>;

/// MariaDB's [`Dialect`]: Debian's `mariadbd`, one process, and the `mariadb` client.
#[derive(Debug, Default)]
pub struct MariaDb {
    /// Settings after [`SETTINGS`] (the last of an option wins).
    extra: Vec<String>,
}

impl SqlServer<MariaDb> {
    /// As [`start`](Self::start), with the performance schema on: what each statement costs the server, by digest
    /// (`performance_schema.events_statements_summary_by_digest`), to profile a cycle.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_counting_statements() -> MariaDbServer {
        MariaDbServer::start_with(|server| {
            server.dialect.extra = vec!["--performance-schema=ON".to_owned()];
        })
    }

    /// Runs `stmt` (one or more statements, separated by `;`) in the database `leasehold` through the `mariadb`
    /// client in batch mode (`-N -B`) as `root`, and returns what it printed, without the final newline: the rows one
    /// a line, their columns separated by tabs, with tabs, newlines and backslashes in values escaped (`\t`, `\n`,
    /// `\\`) and SQL `NULL` as `NULL`; nothing for a statement that returns no rows. Tests use it to read tables and to
    /// break connections (`KILL CONNECTION id`, with the ids of `information_schema.PROCESSLIST`).
    ///
    /// # Panics
    ///
    /// If the client fails, with its stderr: the SQL is wrong, or the server cannot be reached (a connection to a
    /// paused server gives up after 2 seconds).
    pub fn sql(&self, stmt: &str) -> String {
        self.sql_in(DATABASE, stmt)
    }

    /// [`sql`](Self::sql), for a test that expects it to fail.
    ///
    /// # Errors
    ///
    /// What the client printed on stderr when it failed, as `ERROR 2013 (HY000): Lost connection to server at
    /// 'handshake: reading initial communication packet', system error: 110` when the server is paused, or `ERROR
    /// 1146 (42S02) at line 1: Table 'leasehold.t' doesn't exist`.
    pub fn try_sql(&self, stmt: &str) -> Result<String, String> {
        try_sql_on(self.port, DATABASE, stmt)
    }

    /// [`sql`](Self::sql) in `database`, or in none if it is empty.
    fn sql_in(&self, database: &str, stmt: &str) -> String {
        try_sql_on(self.port, database, stmt)
            .unwrap_or_else(|e| panic!("the mariadb client failed on {stmt:?}: {e}"))
    }

    /// A `mariadb` client command connected to the database `leasehold` as `root` (with no option files, and the
    /// 2-second connect timeout), for a session of the test's own: add arguments (`-N -B`, `-n` to have every result
    /// written at once to a pipe, `-e`), pipes, and spawn it.
    pub fn mariadb_command(&self) -> Command {
        client_command(self.port, DATABASE)
    }

    /// The server's own directory for temporary tables. Not `/tmp`: a server that starts deletes every `#sql*` file
    /// in its `tmpdir`, so it would delete those of a server already running there (the bootstrap of another test's
    /// `mariadb-install-db` failed so: "Unknown table 'mysql.tmp_user_nopasswd…'").
    fn tmp_dir_arg(&self) -> String {
        format!("--tmpdir={}", self.server_dir.join("tmp").display())
    }
}

impl Dialect for MariaDb {
    const NAME: &'static str = "MariaDB";
    const DIR_PREFIX: &'static str = "mariadb";
    const URL_USER: &'static str = "mysql://root";
    const STOP_SIGNAL: Signal = Signal::SIGTERM;
    const DATA_PROGRAM: &'static str = "mariadb-install-db";

    fn data_command(server: &MariaDbServer) -> Command {
        assert!(
            Path::new(MARIADBD).is_file(),
            "no {MARIADBD}: run scripts/ensure-mariadb.sh"
        );
        let server_dir = &server.server_dir;
        give_to(server_dir, MARIADB_USER);
        give_to(&server_dir.join("tmp"), MARIADB_USER);
        // A shell script, found on PATH; `--no-defaults` must come first.
        let mut install = as_server_user(MARIADB_USER, Path::new("mariadb-install-db"));
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", server.data_dir().display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .arg(server.tmp_dir_arg())
            .args(SETTINGS)
            .current_dir(server_dir);
        install
    }

    fn spawn_and_wait(server: &mut MariaDbServer) -> Result<(), bool> {
        let log_start = server.daemon.log_len();
        let server_dir = &server.server_dir;
        let mut command = as_server_user(MARIADB_USER, Path::new(MARIADBD));
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", server.data_dir().display()))
            .arg(format!(
                "--socket={}",
                server_dir.join("mariadbd.sock").display()
            ))
            .arg(format!(
                "--pid-file={}",
                server_dir.join("mariadbd.pid").display()
            ))
            .arg(format!("--port={}", server.port))
            .arg("--bind-address=127.0.0.1")
            .arg(server.tmp_dir_arg())
            .args(SETTINGS)
            .args(&server.dialect.extra)
            .current_dir(server_dir);
        server.daemon.log_to(&mut command);
        let child = spawn_for_process_life(command)
            .unwrap_or_else(|e| panic!("cannot run {MARIADBD} through setpriv: {e}"));
        server.daemon.set_child(child);
        let port = server.port;
        server
            .daemon
            .wait_ready(log_start, || try_sql_on(port, "", "SELECT 1").map(drop))
    }

    fn admin_sql(server: &MariaDbServer, sql: &str) {
        server.sql_in("", sql);
    }
}

/// A `mariadb` client command connected to the server on `port`, in `database` (in none if it is empty).
fn client_command(port: u16, database: &str) -> Command {
    let mut command = Command::new("mariadb");
    // `--no-defaults` must come first.
    command
        .args(["--no-defaults", "--default-character-set=utf8mb4"])
        .args(["-h", "127.0.0.1", "-P", &port.to_string(), "-u", "root"])
        .arg(format!("--connect-timeout={CONNECT_TIMEOUT}"));
    if !database.is_empty() {
        command.args(["-D", database]);
    }
    command
}

/// Runs `stmt` through the `mariadb` client in batch mode on the server on `port`: see [`MariaDbServer::try_sql`].
fn try_sql_on(port: u16, database: &str, stmt: &str) -> Result<String, String> {
    let mut command = client_command(port, database);
    command.args(["-N", "-B", "-e"]).arg(stmt);
    client_output(&mut command, "the mariadb client")
}
