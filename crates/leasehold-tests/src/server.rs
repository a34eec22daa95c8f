//! A private server per test: `redis-server`, or whatever [`server_binary`] names.

use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{server_binary, TempDir};

/// The line `redis-server` logs once it listens; 7.x appends the transport (`tcp`), and so does
/// Valkey.
const READY: &str = "Ready to accept connections";
/// What `redis-server` logs, before exiting, when its port is taken.
pub(crate) const ADDR_IN_USE: &str = "Address already in use";
/// How long a server may take to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisServer::restart`] keeps retrying while its port is still taken.
const RESTART_PORT_WAIT: Duration = Duration::from_secs(5);
/// How many fresh ports [`RedisServer::start_with`] tries before giving up.
pub(crate) const START_ATTEMPTS: usize = 5;
/// How often the log is read while waiting for readiness. The server announces readiness only
/// through its log, and a file cannot be awaited portably, so it is polled.
const POLL: Duration = Duration::from_millis(5);
/// Connect, read and write timeout of the helper connection.
const HELPER_TIMEOUT: Duration = Duration::from_secs(5);

const LOG_FILE: &str = "redis.log";
/// Configuration errors are printed to stderr before the log file is opened.
const STDERR_FILE: &str = "stderr.log";

/// A `redis-server` child process listening on a private port of 127.0.0.1.
///
/// The program is [`server_binary`] (`redis-server` from `PATH` unless `LEASEHOLD_TEST_SERVER`
/// names another). The server runs with `--save ""`, `--appendonly no`, `--protected-mode no` and
/// its own temporary directory, which holds its log. Dropping the value kills the server with
/// `SIGKILL`, reaps it and removes the directory; if the thread is panicking, the server log is
/// printed to stderr first, so a failing test shows what the server saw.
///
/// All methods block the calling thread. From an async test that is harmless during set-up;
/// in the middle of a test on a current-thread runtime, remember that other tasks (a
/// [`TcpProxy`](crate::TcpProxy), a lease keeper) do not run while [`restart`](Self::restart)
/// waits.
///
/// # Examples
///
/// ```no_run
/// use leasehold_tests::RedisServer;
///
/// let mut server = RedisServer::start();
/// let mut con = server.client().get_connection().unwrap();
/// let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
/// assert_eq!(server.command_calls("set"), 1);
///
/// server.restart(); // same port, empty data set
/// ```
#[derive(Debug)]
pub struct RedisServer {
    /// What runs: [`server_binary`], or `redis-server` for a [`TlsRedisServer`](crate::TlsRedisServer) when that
    /// does not speak TLS.
    pub(crate) program: &'static OsStr,
    /// `None` while killed.
    pub(crate) child: Option<Child>,
    pub(crate) port: u16,
    pub(crate) extra_args: Vec<String>,
    pub(crate) dir: TempDir,
}

/// Why one attempt to run the server failed.
pub(crate) enum SpawnError {
    /// Someone else listens on the port; another port (or a later try) may work.
    AddrInUse,
    /// Anything else, with the reason.
    Failed(String),
}

impl RedisServer {
    /// Starts a server with the default configuration and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// If the server program cannot be run, exits early, or is not ready within 10 seconds.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra command-line configuration, such as
    /// `["--requirepass", "pw"]`, and waits until it accepts connections.
    ///
    /// The extra arguments come last, so they override the defaults. They are kept for
    /// [`restart`](Self::restart). With `--requirepass`, the helper methods
    /// ([`connection`](Self::connection), [`command_calls`](Self::command_calls), …)
    /// authenticate; [`url`](Self::url) and [`client`](Self::client) do not.
    ///
    /// If the chosen port turns out to be taken (another process grabbed it between choosing
    /// and binding), a new one is chosen, a few times over.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start); also if the port is taken on every attempt.
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        RedisServer::start_program(server_binary(), extra_args)
    }

    /// As [`start_with`](Self::start_with), running `program`.
    pub(crate) fn start_program(program: &'static OsStr, extra_args: &[&str]) -> RedisServer {
        let mut server = RedisServer::unstarted(program, extra_args, "redis");
        if let Err(why) = server.start_on_free_port() {
            // Dropping `server` while panicking prints its log.
            panic!("{} did not start: {why}", server.name());
        }
        server
    }

    /// A server not running yet, with its directory (named after `dir_prefix`) and no port.
    pub(crate) fn unstarted(
        program: &'static OsStr,
        extra_args: &[&str],
        dir_prefix: &str,
    ) -> RedisServer {
        RedisServer {
            program,
            child: None,
            port: 0,
            extra_args: extra_args.iter().map(|&arg| arg.to_owned()).collect(),
            dir: TempDir::new(dir_prefix),
        }
    }

    /// Runs the server on a free port, choosing another while the chosen one turns out to be taken (a few
    /// times over), and waits until it is ready.
    pub(crate) fn start_on_free_port(&mut self) -> Result<(), String> {
        for _ in 0..START_ATTEMPTS {
            self.port = free_port();
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(SpawnError::AddrInUse) => continue,
                Err(SpawnError::Failed(why)) => return Err(why),
            }
        }
        Err(format!(
            "it found its port taken {START_ATTEMPTS} times in a row"
        ))
    }

    /// The program, for messages.
    pub(crate) fn name(&self) -> std::path::Display<'_> {
        std::path::Path::new(self.program).display()
    }

    /// The TCP port the server listens on. It stays the same across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address the server listens on: 127.0.0.1 and [`port`](Self::port).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:PORT`, without credentials.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A client for [`url`](Self::url).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a redis:// URL with a port is valid")
    }

    /// The server's process id, or `None` while it is killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server with `SIGKILL` and reaps it. Does nothing if it is already killed.
    ///
    /// Clients see their connections reset; the data set is lost, since nothing is persisted.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs, then starts it again on the same port with the same
    /// arguments, and waits until it accepts connections. The data set starts empty.
    ///
    /// While the old listening socket lingers in the kernel the port may still be taken; the
    /// start is then retried for up to 5 seconds.
    ///
    /// # Panics
    ///
    /// If the server does not come back (see [`start`](Self::start)), or the port is still
    /// taken after 5 seconds.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + RESTART_PORT_WAIT;
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(SpawnError::AddrInUse) if Instant::now() < deadline => {
                    // A back-off between retries, not a synchronisation: nothing signals
                    // when a port becomes free.
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(SpawnError::AddrInUse) => panic!(
                    "{} could not restart: port {} still taken after {RESTART_PORT_WAIT:?}",
                    self.name(),
                    self.port
                ),
                Err(SpawnError::Failed(why)) => panic!("{} did not restart: {why}", self.name()),
            }
        }
    }

    /// Everything the server wrote to its log (and to stderr) so far, across restarts.
    pub fn log(&self) -> String {
        let mut log = read_lossy(self.log_path(), 0);
        let stderr = read_lossy(self.dir.path().join(STDERR_FILE), 0);
        if !stderr.trim().is_empty() {
            log.push_str("--- stderr ---\n");
            log.push_str(&stderr);
        }
        log
    }

    /// A new synchronous connection, authenticated if the server was started with
    /// `--requirepass`, with 5-second connect, read and write timeouts.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached or refuses the password.
    pub fn connection(&self) -> redis::Connection {
        let mut con = self
            .client()
            .get_connection_with_timeout(HELPER_TIMEOUT)
            .unwrap_or_else(|e| panic!("cannot connect to {} on {}: {e}", self.name(), self.port));
        con.set_read_timeout(Some(HELPER_TIMEOUT))
            .expect("a non-zero timeout is valid");
        con.set_write_timeout(Some(HELPER_TIMEOUT))
            .expect("a non-zero timeout is valid");
        if let Some(password) = self.password() {
            redis::cmd("AUTH")
                .arg(password)
                .query::<()>(&mut con)
                .unwrap_or_else(|e| panic!("AUTH with --requirepass failed: {e}"));
        }
        con
    }

    /// The value of `field` in the `section` of `INFO`, e.g.
    /// `info_field("server", "tcp_port")`, or `None` if there is no such field.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let info = self.info(section);
        info.lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(name, _)| *name == field)
            .map(|(_, value)| value.trim().to_owned())
    }

    /// How many times `command` ran since the server started or since the last
    /// [`config_resetstat`](Self::config_resetstat), from `INFO commandstats`; 0 if never.
    ///
    /// `command` is matched case-insensitively; subcommands use Redis' `|` spelling, as in
    /// `"client|setinfo"`. Counts include calls made inside scripts (`"set"` counts a `SET`
    /// issued by `redis.call`), and the helper's own `INFO` calls count under `"info"`.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn command_calls(&self, command: &str) -> u64 {
        let key = format!("cmdstat_{}", command.to_ascii_lowercase());
        let info = self.info("commandstats");
        let Some(stats) = info
            .lines()
            .filter_map(|line| line.split_once(':'))
            .find_map(|(name, stats)| (name == key).then_some(stats))
        else {
            return 0;
        };
        stats
            .split(',')
            .find_map(|pair| pair.strip_prefix("calls="))
            .and_then(|calls| calls.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected commandstats line: {key}:{stats}"))
    }

    /// Deletes every key in every database (`FLUSHALL`).
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn flushall(&self) {
        redis::cmd("FLUSHALL")
            .query::<()>(&mut self.connection())
            .expect("FLUSHALL");
    }

    /// Zeroes the statistics behind [`command_calls`](Self::command_calls) and `INFO`
    /// (`CONFIG RESETSTAT`).
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn config_resetstat(&self) {
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query::<()>(&mut self.connection())
            .expect("CONFIG RESETSTAT");
    }

    fn info(&self, section: &str) -> String {
        redis::cmd("INFO")
            .arg(section)
            .query(&mut self.connection())
            .unwrap_or_else(|e| panic!("INFO {section}: {e}"))
    }

    /// The value after the last `--requirepass` among the extra arguments, if any.
    fn password(&self) -> Option<&str> {
        self.extra_args
            .windows(2)
            .rev()
            .find(|pair| pair[0].eq_ignore_ascii_case("--requirepass"))
            .map(|pair| pair[1].as_str())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// Runs the program on `self.port` and waits until it is ready or gone.
    pub(crate) fn spawn(&mut self) -> Result<(), SpawnError> {
        debug_assert!(self.child.is_none());
        let log_path = self.log_path();
        // The log is appended to across restarts; only what this run writes tells whether
        // this run is ready.
        let log_start = std::fs::metadata(&log_path).map_or(0, |m| m.len());
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(STDERR_FILE))
            .expect("cannot create the stderr file of the server");
        let child = Command::new(self.program)
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .args(["--daemonize", "no", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log_path)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.name()));
        let child = self.child.insert(child);

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if read_lossy(&log_path, log_start).contains(READY) {
                return Ok(());
            }
            if let Some(status) = child.try_wait().expect("try_wait on the server") {
                self.child = None;
                // The process is gone, so its log is complete.
                return Err(if read_lossy(&log_path, log_start).contains(ADDR_IN_USE) {
                    SpawnError::AddrInUse
                } else {
                    SpawnError::Failed(format!("it exited with {status} before it was ready"))
                });
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(SpawnError::Failed(format!(
                    "it was not ready after {START_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- {name} log (port {}) ---\n{}--- end of {name} log ---",
                self.port,
                self.log(),
                name = self.name(),
            );
        }
        self.kill();
        // `dir` is removed when the field is dropped, after this.
    }
}

/// A TCP port of 127.0.0.1 that was free a moment ago. Another process may take it before we
/// bind it again, which [`RedisServer::start_with`] copes with.
pub(crate) fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("cannot bind 127.0.0.1:0")
        .port()
}

/// The file's bytes from `offset` on as text; empty if it does not exist (yet).
pub(crate) fn read_lossy(path: impl AsRef<std::path::Path>, offset: u64) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset).map_or(bytes.len(), |o| o.min(bytes.len()));
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// Checks what the `count` workers (`leasehold-worker count`, `count-on`, `quorum-count`) left in the store server:
/// no two critical sections overlapped (`test:overlaps` unset), the non-atomic counter `test:counter` is exactly
/// `sections` (no lost update), and the fences `test:fences`, in critical-section order, strictly increase.
///
/// # Panics
///
/// On any of those failures, saying which; or if the store cannot be reached.
pub fn assert_exclusive_sections(store: &RedisServer, sections: usize) {
    let mut conn = store.connection();
    let counter: i64 = redis::cmd("GET")
        .arg("test:counter")
        .query(&mut conn)
        .expect("GET");
    let overlaps: Option<i64> = redis::cmd("GET")
        .arg("test:overlaps")
        .query(&mut conn)
        .expect("GET");
    let fences: Vec<u64> = redis::cmd("LRANGE")
        .arg("test:fences")
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .expect("LRANGE");
    assert_eq!(overlaps, None, "two critical sections overlapped");
    assert_eq!(counter, sections as i64, "lost updates");
    assert_eq!(fences.len(), sections);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences, in critical-section order, must strictly increase"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ping(con: &mut redis::Connection) -> redis::RedisResult<String> {
        redis::cmd("PING").query(con)
    }

    #[test]
    fn server_answers_ping() {
        let server = RedisServer::start();
        assert_eq!(ping(&mut server.connection()).unwrap(), "PONG");
        assert_eq!(
            server.info_field("server", "tcp_port"),
            Some(server.port().to_string())
        );
        assert_eq!(server.info_field("server", "no_such_field"), None);
        assert!(server.log().contains(READY));
    }

    #[test]
    fn restart_keeps_the_port_and_answers_again() {
        let mut server = RedisServer::start();
        let (port, pid) = (server.port(), server.pid().unwrap());
        let mut con = server.connection();
        let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();

        server.restart();

        assert_eq!(server.port(), port);
        assert_ne!(server.pid().unwrap(), pid);
        assert!(
            ping(&mut con).is_err(),
            "the old connection died with the old server"
        );
        let mut con = server.connection();
        assert_eq!(ping(&mut con).unwrap(), "PONG");
        let value: Option<String> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
        assert_eq!(value, None, "nothing is persisted");
    }

    #[test]
    fn kill_makes_connections_fail() {
        let mut server = RedisServer::start();
        let mut con = server.connection();
        assert_eq!(ping(&mut con).unwrap(), "PONG");

        server.kill();
        server.kill(); // idempotent

        assert_eq!(server.pid(), None);
        assert!(ping(&mut con).is_err());
        let refused = server.client().get_connection_with_timeout(HELPER_TIMEOUT);
        assert!(matches!(refused, Err(e) if e.is_connection_refusal()));
    }

    #[test]
    fn two_servers_get_different_ports_and_directories() {
        let a = RedisServer::start();
        let b = RedisServer::start();
        assert_ne!(a.port(), b.port());
        assert_ne!(a.dir.path(), b.dir.path());
    }

    #[test]
    fn command_calls_counts_sets() {
        let server = RedisServer::start();
        assert_eq!(server.command_calls("set"), 0);
        let mut con = server.connection();
        for i in 0..3 {
            let _: () = redis::cmd("SET").arg("k").arg(i).query(&mut con).unwrap();
        }
        assert_eq!(server.command_calls("set"), 3);
        assert_eq!(server.command_calls("SET"), 3);
        assert_eq!(server.command_calls("evalsha"), 0);

        server.config_resetstat();
        assert_eq!(server.command_calls("set"), 0);
        server.flushall();
        let exists: bool = redis::cmd("EXISTS").arg("k").query(&mut con).unwrap();
        assert!(!exists);
    }

    #[test]
    fn extra_args_configure_the_server_and_survive_restart() {
        let mut server = RedisServer::start_with(&["--requirepass", "pw"]);
        for _ in 0..2 {
            let mut anonymous = server.client().get_connection().unwrap();
            let err = ping(&mut anonymous).unwrap_err();
            assert!(err.to_string().contains("NOAUTH"), "{err}");
            // The helpers authenticate.
            assert_eq!(ping(&mut server.connection()).unwrap(), "PONG");
            server.restart();
        }
    }

    #[test]
    fn a_taken_port_is_recognised_and_restart_waits_it_out() {
        let mut server = RedisServer::start();
        server.kill();
        let squatter = TcpListener::bind(server.addr()).unwrap();
        assert!(matches!(server.spawn(), Err(SpawnError::AddrInUse)));
        drop(squatter);
        server.restart();
        assert_eq!(ping(&mut server.connection()).unwrap(), "PONG");
    }

    #[test]
    fn start_panics_on_a_bad_argument() {
        let result = std::panic::catch_unwind(|| RedisServer::start_with(&["--no-such-option"]));
        assert!(result.is_err());
    }

    #[test]
    fn drop_kills_the_server_and_removes_its_directory() {
        let server = RedisServer::start();
        let pid = server.pid().unwrap();
        let dir = server.dir.path().to_owned();
        drop(server);
        assert!(!dir.exists());
        assert_eq!(
            crate::send_signal(pid, nix::sys::signal::Signal::SIGCONT),
            Err(nix::Error::ESRCH)
        );
    }
}
