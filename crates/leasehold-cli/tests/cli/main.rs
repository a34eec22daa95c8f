//! End-to-end tests of the `leasehold` binary against real `redis-server`, `etcd`, ZooKeeper, PostgreSQL and MariaDB
//! processes (one test binary, one module per concern). Every test starts its own servers on private ports, bounds every wait, and cleans
//! up its processes.

mod bench;
mod cluster;
mod demo;
mod elect;
mod etcd;
mod help;
mod inputs;
mod kinds;
mod lease;
mod quorum;
mod run;
mod session_cleanup;
mod sets;
mod signals;
mod sql;
mod status;
mod stores;
mod tls;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use leasehold::redis;
use leasehold_tests::{is_default_server, server_binary_path, ChildGuard, RedisServer};
use nix::sys::signal::killpg;
use nix::unistd::Pid;

/// The binary under test.
pub const LEASEHOLD: &str = env!("CARGO_BIN_EXE_leasehold");

/// Generous bound for anything that should take well under a second.
pub const SOON: Duration = Duration::from_secs(10);

/// A `leasehold` command with `args`, isolated from the caller's environment (no `LEASEHOLD_STORE`, `LEASEHOLD_REDIS_URL`,
/// `LEASEHOLD_PREFIX`, `LEASEHOLD_TLS_*` or `RUST_LOG`), stdin closed, and with the server under test as its
/// `redis-server` (see [`server_path`]).
pub fn leasehold(args: &[&str]) -> Command {
    let mut command = Command::new(LEASEHOLD);
    command.args(args);
    if let Some(path) = server_path() {
        command.env("PATH", path);
    }
    for var in [
        "LEASEHOLD_STORE",
        "LEASEHOLD_REDIS_URL",
        "LEASEHOLD_PREFIX",
        "LEASEHOLD_TLS_CA",
        "LEASEHOLD_TLS_CERT",
        "LEASEHOLD_TLS_KEY",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
    command.env_remove("RUST_BACKTRACE").stdin(Stdio::null());
    command
}

/// `PATH` for `leasehold` when the suite runs on another server than `redis-server` (`LEASEHOLD_TEST_SERVER`):
/// `demo` and `bench` start a private `redis-server` from `PATH`, so a directory in which `redis-server` is the
/// server under test comes first, the way a distribution's compatibility package installs Valkey. `None` on the
/// default server.
fn server_path() -> Option<&'static OsString> {
    static PATH: OnceLock<Option<OsString>> = OnceLock::new();
    PATH.get_or_init(|| {
        if is_default_server() {
            return None;
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-under-test");
        std::fs::create_dir_all(&dir).unwrap();
        // Made aside and renamed into place: another run of these tests may be reading the link.
        let aside = dir.join(format!("redis-server.{}", std::process::id()));
        let _ = std::fs::remove_file(&aside);
        std::os::unix::fs::symlink(server_binary_path(), &aside).unwrap();
        std::fs::rename(&aside, dir.join("redis-server")).unwrap();
        let inherited = std::env::var_os("PATH").unwrap_or_default();
        let path = std::env::split_paths(&inherited);
        Some(std::env::join_paths(std::iter::once(dir).chain(path)).unwrap())
    })
    .as_ref()
}

/// A started `leasehold`: stdout read line by line in a thread, stderr collected, killed on drop.
pub struct Running {
    child: ChildGuard,
    stdout: Receiver<String>,
    stderr: Option<Receiver<String>>,
}

impl Running {
    /// Starts `command` with stdout and stderr piped.
    pub fn start(command: Command) -> Running {
        Running::start_with(command, true)
    }

    /// Starts `command` with stdout piped, and stderr piped only if `capture_stderr` (otherwise as configured).
    pub fn start_with(mut command: Command, capture_stderr: bool) -> Running {
        command.stdout(Stdio::piped());
        if capture_stderr {
            command.stderr(Stdio::piped());
        }
        let mut child = ChildGuard::new(command.spawn().unwrap());
        let stdout = child.stdout.take().unwrap();
        let (out_tx, out_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if out_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = child.stderr.take().map(|mut stderr| {
            let (err_tx, err_rx) = mpsc::channel();
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = stderr.read_to_string(&mut text);
                let _ = err_tx.send(text);
            });
            err_rx
        });
        Running {
            child,
            stdout: out_rx,
            stderr,
        }
    }

    /// The process id of `leasehold`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line on stdout.
    pub fn line(&self, within: Duration) -> String {
        match self.stdout.recv_timeout(within) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("no line on stdout within {within:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("stdout closed before the expected line"),
        }
    }

    /// Every stdout line still to come, until stdout closes (bounded by `within`).
    pub fn rest(&self, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(RecvTimeoutError::Disconnected) => return lines,
                Err(RecvTimeoutError::Timeout) => panic!("stdout still open after {within:?}"),
            }
        }
    }

    /// `leasehold`'s stdin, when it was piped.
    pub fn take_stdin(&mut self) -> std::process::ChildStdin {
        self.child.stdin.take().expect("stdin was not piped")
    }

    /// Closes `leasehold`'s stdin (a program that waits for it with `read` then goes on).
    pub fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Waits for the exit.
    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        self.child
            .wait_timeout(within)
            .unwrap_or_else(|| panic!("leasehold did not exit within {within:?}"))
    }

    /// Waits for the exit and returns the status code (`None` if a signal ended `leasehold` itself).
    pub fn code(&mut self, within: Duration) -> Option<i32> {
        self.wait(within).code()
    }

    /// Everything `leasehold` wrote on stderr, once it has exited.
    pub fn stderr(&mut self) -> String {
        let stderr = self.stderr.as_ref().expect("stderr was not captured");
        stderr.recv_timeout(SOON).expect("stderr closed")
    }
}

/// Runs `command` to its end (within `limit`) and returns its exit code, stdout and stderr.
pub fn finish(command: Command, limit: Duration) -> (Option<i32>, String, String) {
    let mut running = Running::start(command);
    let code = running.code(limit);
    let stdout = running.rest(SOON).join("\n");
    (code, stdout, running.stderr())
}

/// Asserts that `stderr` is exactly one `leasehold: ` line, and returns it.
pub fn one_error_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line on stderr, got {stderr:?}"
    );
    assert!(lines[0].starts_with("leasehold: "), "{stderr:?}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr:?}"
    );
    lines[0]
}

/// True when the key of lock `name` exists.
pub fn lock_exists(server: &RedisServer, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(format!("leasehold:{{{name}}}"))
        .query(&mut server.connection())
        .unwrap()
}

/// Waits until a client queues for lock `name` (waiting clients put their id on the lock's queue). Redis
/// announces nothing, so the queue's length is polled.
pub fn await_waiter(server: &RedisServer, name: &str) {
    let queue = format!("leasehold:{{{name}}}:queue");
    let mut con = server.connection();
    poll_until(&format!("a client waits for {name:?}"), || {
        let waiting: u64 = redis::cmd("LLEN").arg(&queue).query(&mut con).unwrap();
        waiting > 0
    });
}

/// Waits until no process is left in process group `pgid`. Members killed with their leader stay zombies until
/// init reaps them, and nothing announces that, so the group is polled.
pub fn await_group_gone(pgid: i32) {
    poll_until(&format!("process group {pgid} is gone"), || {
        killpg(Pid::from_raw(pgid), None) == Err(nix::Error::ESRCH)
    });
}

pub fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + SOON;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
