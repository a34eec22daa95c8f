//! What the PostgreSQL and MariaDB harnesses share: [`SqlServer`], one SQL server on a private port of 127.0.0.1 with
//! its data in a temporary directory and a database `leasehold`, started, killed, restarted, stopped, paused and
//! resumed the same way. A [`Dialect`] ([`Postgres`](crate::postgres::Postgres) in `postgres.rs`,
//! [`MariaDb`](crate::mariadb::MariaDb) in `mariadb.rs`) is data plus a few hooks: its name, user and URL, how its
//! data directory is created, its command line and readiness probe, how its processes are signalled (PostgreSQL's
//! server is a process tree, MariaDB's one process), and its command-line client. The types tests name are the
//! dialects' aliases, [`PgServer`](crate::PgServer) and [`MariaDbServer`](crate::MariaDbServer).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::daemon::{restart_on_port, server_dir_for, start_on_free_port, Daemon};

/// The database every server is created with, the one [`SqlServer::url`] names.
pub(crate) const DATABASE: &str = "leasehold";
/// The command-line client's connect timeout in seconds, which bounds a connection to a paused server: `psql`'s
/// `PGCONNECT_TIMEOUT` (libpq's smallest), the `mariadb` client's `--connect-timeout` (which also bounds the wait for
/// the server's greeting).
pub(crate) const CONNECT_TIMEOUT: &str = "2";
/// How long [`SqlServer::stop`] waits for a clean shutdown.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// One SQL server of dialect `D` on a private port of 127.0.0.1, with fresh data in a temporary directory and a
/// database `leasehold`, run by the dialect's own user when the tests run as root: see [`PgServer`](crate::PgServer)
/// and [`MariaDbServer`](crate::MariaDbServer).
///
/// All methods block the calling thread; those that wait panic with a message when the server cannot be run or does
/// not answer within 20 seconds. Dropping the value ends the server (as its dialect does: PostgreSQL an immediate
/// shutdown, MariaDB a `SIGKILL`), reaps it and removes its directories; if the thread is panicking, its log is
/// printed to stderr first.
#[derive(Debug)]
pub struct SqlServer<D: Dialect> {
    /// The server process, and the directory that holds the log (kept across restarts).
    pub(crate) daemon: Daemon,
    pub(crate) port: u16,
    /// The data directory and the socket, in memory if possible, belonging to the user the server runs as. Kept
    /// across restarts, removed on drop.
    pub(crate) server_dir: PathBuf,
    /// What the dialect keeps of its own (PostgreSQL's settings beyond its defaults, for TLS).
    pub(crate) dialect: D,
}

/// What differs between the SQL servers: implemented by [`Postgres`](crate::postgres::Postgres) and
/// [`MariaDb`](crate::mariadb::MariaDb) only.
pub trait Dialect: Sized + Default + std::fmt::Debug {
    /// The server's name in messages: `PostgreSQL`, `MariaDB`.
    #[doc(hidden)]
    const NAME: &'static str;
    /// The prefix of its temporary directory, and the name of its log file there (`postgres.log`): the data
    /// directory's creation and the server's stderr, appended to across restarts.
    #[doc(hidden)]
    const DIR_PREFIX: &'static str;
    /// The URL up to the host: `postgres://postgres`, `mysql://root`.
    #[doc(hidden)]
    const URL_USER: &'static str;
    /// The signal of a clean shutdown (PostgreSQL's fast one, `SIGINT`; MariaDB's `SIGTERM`).
    #[doc(hidden)]
    const STOP_SIGNAL: Signal;

    /// The program that creates the data directory: `initdb`, `mariadb-install-db`.
    #[doc(hidden)]
    const DATA_PROGRAM: &'static str;

    /// The command that creates the data directory, as the server's user, once its directory is ready for it.
    #[doc(hidden)]
    fn data_command(server: &SqlServer<Self>) -> Command;
    /// Spawns the server on its port and waits until it answers; `Err(addr_in_use)` if it exited first.
    #[doc(hidden)]
    fn spawn_and_wait(server: &mut SqlServer<Self>) -> Result<(), bool>;
    /// Runs `sql` through the command-line client, connected to no database in particular.
    #[doc(hidden)]
    fn admin_sql(server: &SqlServer<Self>, sql: &str);

    /// Kills every process of the server with `SIGKILL` and returns once they are gone.
    #[doc(hidden)]
    fn kill(server: &mut SqlServer<Self>) {
        server.daemon.kill();
    }
    /// Stops every process of the server with `SIGSTOP` and returns once the kernel reports them stopped.
    #[doc(hidden)]
    fn pause(server: &mut SqlServer<Self>) {
        server.daemon.pause();
    }
    /// Continues every process of a paused server.
    #[doc(hidden)]
    fn resume_if_paused(server: &mut SqlServer<Self>) {
        if server.daemon.is_paused() {
            server.daemon.resume();
        }
    }
    /// Ends the server at once on drop, paused or not. Must not panic.
    #[doc(hidden)]
    fn quit(server: &mut SqlServer<Self>) {
        server.daemon.kill();
    }
}

impl<D: Dialect> SqlServer<D> {
    /// Creates the data directory, starts a server on a free port, waits until it answers and creates the database
    /// `leasehold`. On a taken port, starts it again on another, a few times over.
    ///
    /// # Panics
    ///
    /// If the server's programs cannot be found (run `scripts/ensure-postgres.sh` or `scripts/ensure-mariadb.sh`)
    /// or run, the data directory cannot be created, or the server does not answer within 20 seconds.
    pub fn start() -> SqlServer<D> {
        SqlServer::start_with(|_| {})
    }

    /// [`start`](Self::start), with `configure` run once the data directory exists, before the server starts.
    pub(crate) fn start_with(configure: impl FnOnce(&mut SqlServer<D>)) -> SqlServer<D> {
        let daemon = Daemon::new(D::NAME, D::DIR_PREFIX, format!("{}.log", D::DIR_PREFIX));
        let server_dir = server_dir_for(daemon.dir());
        let mut server = SqlServer {
            daemon,
            port: 0,
            server_dir,
            dialect: D::default(),
        };
        server.create_data();
        configure(&mut server);
        // Dropping `server` while panicking prints the log.
        start_on_free_port(D::NAME, |port| {
            server.port = port;
            D::spawn_and_wait(&mut server)
        });
        D::admin_sql(&server, &format!("CREATE DATABASE {DATABASE}"));
        server
    }

    /// `postgres://postgres@127.0.0.1:PORT/leasehold`, `mysql://root@127.0.0.1:PORT/leasehold` (no password).
    pub fn url(&self) -> String {
        format!("{}@127.0.0.1:{}/{DATABASE}", D::URL_USER, self.port)
    }

    /// `127.0.0.1:PORT`, for a [`TcpProxy`](crate::TcpProxy) in front of the server.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id (PostgreSQL's postmaster), or `None` while it is killed or stopped.
    pub fn pid(&self) -> Option<u32> {
        self.daemon.pid()
    }

    /// Kills the server with `SIGKILL` (PostgreSQL's postmaster and every process it forked: sessions,
    /// checkpointer, WAL writer…), as a crash of its machine would, and returns once all of it is gone. Does nothing
    /// if it is not running. Works on a paused server too.
    ///
    /// # Panics
    ///
    /// If a process of the server still runs 10 seconds after its `SIGKILL`.
    pub fn kill(&mut self) {
        D::kill(self);
    }

    /// Kills the server if it runs, starts it again on the same port with the same data, and waits until it
    /// answers. After a [`kill`](Self::kill), the server recovers from its log first (PostgreSQL's WAL, InnoDB's redo
    /// log): every committed transaction is there.
    ///
    /// # Panics
    ///
    /// If it does not answer within 20 seconds.
    pub fn restart(&mut self) {
        self.kill();
        restart_on_port(D::NAME, || D::spawn_and_wait(self));
    }

    /// Shuts the server down cleanly (PostgreSQL a fast shutdown, `SIGINT`, as `pg_ctl stop` does: sessions ended, a
    /// checkpoint written; MariaDB a normal one, `SIGTERM`: connections closed, InnoDB's pages flushed) and reaps it.
    /// Does nothing if it is not running; resumes it first if it is paused. [`restart`](Self::restart) starts it
    /// again.
    ///
    /// # Panics
    ///
    /// If it has not exited after 10 seconds (it is then killed).
    pub fn stop(&mut self) {
        if self.daemon.pid().is_none() {
            return;
        }
        D::resume_if_paused(self);
        self.daemon.signal(D::STOP_SIGNAL);
        if !self.daemon.wait_exit(STOP_TIMEOUT) {
            self.kill();
            panic!("{} did not shut down within {STOP_TIMEOUT:?}", D::NAME);
        }
    }

    /// Stops the server with `SIGSTOP` (every process of it), and returns once the kernel reports all of it stopped
    /// (a signal is delivered asynchronously). Open connections hear nothing from then on, and a new connection hangs
    /// after the kernel accepted it: the dialect's `try_*` client call fails after its 2-second connect timeout.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn pause(&mut self) {
        self.daemon.running_pid("pause");
        D::pause(self);
    }

    /// Continues a paused server with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn resume(&mut self) {
        self.daemon.running_pid("resume");
        D::resume_if_paused(self);
    }

    /// Everything the data directory's creation and the server logged so far, across restarts.
    pub fn log(&self) -> String {
        self.daemon.log()
    }

    /// The data directory.
    pub(crate) fn data_dir(&self) -> PathBuf {
        self.server_dir.join("data")
    }

    /// Creates the data directory, its program's output in the log.
    fn create_data(&self) {
        let mut command = D::data_command(self);
        let status = self
            .daemon
            .log_to(&mut command)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {} through setpriv: {e}", D::DATA_PROGRAM));
        assert!(
            status.success(),
            "{} failed ({status}):\n{}",
            D::DATA_PROGRAM,
            self.log()
        );
    }
}

impl<D: Dialect> Drop for SqlServer<D> {
    fn drop(&mut self) {
        self.daemon.print_log_if_panicking(self.port);
        D::quit(self);
        let _ = std::fs::remove_dir_all(&self.server_dir);
        // The log's directory is removed when `daemon` is dropped, after this.
    }
}
