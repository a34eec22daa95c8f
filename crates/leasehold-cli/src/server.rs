//! A private `redis-server` for commands that need a Redis of their own (`demo`): started from `PATH` on a free
//! port of 127.0.0.1, without persistence, in its own temporary directory, and killed when dropped.
//!
//! ```ignore
//! let server = PrivateServer::start()?;
//! let url = server.url(); // redis://127.0.0.1:PORT
//! drop(server);           // killed, reaped, directory removed
//! ```

use std::fmt;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::exit::{doom, spare, Doomed};

/// What `redis-server` logs once it accepts connections.
const READY: &str = "Ready to accept connections";
/// What it logs before exiting when its port is taken.
const ADDR_IN_USE: &str = "Address already in use";
/// How long the server may take to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh ports tried when the chosen one turns out to be taken.
const START_ATTEMPTS: usize = 5;
/// How often the log is read while waiting: the server announces readiness only there.
const POLL: Duration = Duration::from_millis(5);
const LOG_FILE: &str = "redis.log";

/// Why a private server could not be started.
#[derive(Debug)]
pub enum StartError {
    /// `redis-server` is not on `PATH`.
    NotInstalled,
    /// It is there but did not come up; the reason, with the end of its log.
    Failed(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::NotInstalled => f.write_str(
                "redis-server not found; install it with: sudo apt-get install redis-server",
            ),
            StartError::Failed(why) => write!(f, "redis-server did not start: {why}"),
        }
    }
}

impl std::error::Error for StartError {}

/// A running private `redis-server`. Dropping it kills the server, reaps it and removes its directory.
#[derive(Debug)]
pub struct PrivateServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl PrivateServer {
    /// Starts a server and waits until it accepts connections. It runs in its own process group, so that a
    /// Ctrl-C meant for us does not stop it before we are done with it.
    ///
    /// # Errors
    ///
    /// [`StartError::NotInstalled`] when `redis-server` is not on `PATH`; [`StartError::Failed`] when it exits
    /// early or is not ready within 10 s.
    pub fn start() -> Result<PrivateServer, StartError> {
        let dir =
            temp_dir().map_err(|e| StartError::Failed(format!("no temporary directory: {e}")))?;
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port().map_err(|e| StartError::Failed(format!("no free port: {e}")))?;
            match spawn(&dir, port) {
                Ok(child) => return Ok(PrivateServer { child, port, dir }),
                Err(Spawn::AddrInUse) => last = format!("port {port} was taken"),
                Err(Spawn::Failed(err)) => {
                    let _ = fs::remove_dir_all(&dir);
                    return Err(err);
                }
            }
        }
        let _ = fs::remove_dir_all(&dir);
        Err(StartError::Failed(format!(
            "{last}, {START_ATTEMPTS} times in a row"
        )))
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        spare(Doomed::Process(self.child.id() as i32));
        let _ = fs::remove_dir_all(&self.dir);
    }
}

enum Spawn {
    AddrInUse,
    Failed(StartError),
}

fn spawn(dir: &Path, port: u16) -> Result<Child, Spawn> {
    let log = dir.join(LOG_FILE);
    let log_start = fs::metadata(&log).map_or(0, |m| m.len());
    let spawned = Command::new("redis-server")
        .arg("--port")
        .arg(port.to_string())
        .args([
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
        ])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Spawn::Failed(StartError::NotInstalled))
        }
        Err(e) => return Err(Spawn::Failed(StartError::Failed(e.to_string()))),
    };
    doom(Doomed::Process(child.id() as i32));
    let give_up = |child: &mut Child| {
        let _ = child.kill();
        let _ = child.wait();
        spare(Doomed::Process(child.id() as i32));
    };
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let text = read_from(&log, log_start);
        if text.contains(READY) {
            return Ok(child);
        }
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || Instant::now() >= deadline {
            give_up(&mut child);
            if text.contains(ADDR_IN_USE) {
                return Err(Spawn::AddrInUse);
            }
            let why = match exited {
                Some(status) => format!("it exited with {status}"),
                None => format!("not ready within {}", crate::duration::show(START_TIMEOUT)),
            };
            let tail = text.lines().last().unwrap_or("no log").trim().to_owned();
            return Err(Spawn::Failed(StartError::Failed(format!(
                "{why}; its log ends with: {tail}"
            ))));
        }
        std::thread::sleep(POLL);
    }
}

fn read_from(path: &Path, offset: u64) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset).map_or(bytes.len(), |o| o.min(bytes.len()));
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// A port that was free a moment ago. Another process may take it before the server binds it; [`spawn`]
/// recognises that and the caller tries another.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn temp_dir() -> io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        let path = std::env::temp_dir().join(format!(
            "leasehold-redis-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}
