//! The machinery that every store's server harness shares: [`Daemon`], one server process with the directory that
//! holds its log (spawn, wait until ready, kill, stop, signal, reap, print the log on a panic), the retries on a
//! taken port, and the process helpers behind pausing a process tree and running a server as its own user.
//!
//! A store's harness ([`EtcdServer`](crate::EtcdServer), [`ZkServer`](crate::ZkServer),
//! [`PgServer`](crate::PgServer), [`MariaDbServer`](crate::MariaDbServer)) keeps only what is its own: the command
//! line, the readiness probe, the configuration, and what a stop or a pause means for its processes.

use std::fs::OpenOptions;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::server::{free_port, read_lossy, START_ATTEMPTS};
use crate::{send_signal, TempDir};

/// How long a server may take to be ready, and a process to stop after `SIGSTOP`.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How often readiness and exits are polled: none of the servers announces either to an outsider.
const POLL: Duration = Duration::from_millis(10);
/// How long a restart retries while the server's port is still taken.
const RESTART_PORT_WAIT: Duration = Duration::from_secs(5);
/// What every one of the servers logs (in one case or the other) before exiting when its port is taken.
const ADDR_IN_USE: &str = "address already in use";
/// A memory file system for the servers' files (see [`server_dir_for`]).
const SHM: &str = "/dev/shm";

/// One server process and the temporary directory that holds its log (appended to across restarts) and whatever
/// else the store keeps there. `None` of a process while it is killed or stopped.
///
/// Dropping it kills the process with `SIGKILL` (which works on a stopped process too) and reaps it; a store whose
/// server must be shut down otherwise does so in its own `Drop`, which runs first.
#[derive(Debug)]
pub(crate) struct Daemon {
    /// Names the server in messages: `PostgreSQL`, `etcd member 2`.
    name: String,
    child: Option<Child>,
    dir: TempDir,
    log_file: String,
    /// Whether the process is stopped with `SIGSTOP`.
    paused: bool,
}

impl Daemon {
    /// A daemon named `name`, not running yet, with a new directory named after `dir_prefix` and its log `log_file`
    /// in it.
    pub(crate) fn new(name: impl Into<String>, dir_prefix: &str, log_file: String) -> Daemon {
        Daemon {
            name: name.into(),
            child: None,
            dir: TempDir::new(dir_prefix),
            log_file,
            paused: false,
        }
    }

    /// The directory that holds the log.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The name given to [`new`](Self::new).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join(&self.log_file)
    }

    /// Everything the server (and the commands logged with [`log_to`](Self::log_to)) logged so far.
    pub(crate) fn log(&self) -> String {
        self.log_since(0)
    }

    /// What the log grew by since it was `start` bytes long.
    pub(crate) fn log_since(&self, start: u64) -> String {
        read_lossy(self.log_path(), start)
    }

    /// How long the log is now, for a later [`log_since`](Self::log_since).
    pub(crate) fn log_len(&self) -> u64 {
        std::fs::metadata(self.log_path()).map_or(0, |m| m.len())
    }

    /// Sends `command`'s stdout and stderr to the end of the log, and nothing to its stdin.
    pub(crate) fn log_to<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap_or_else(|e| panic!("cannot create the {} log file: {e}", self.name));
        let copy = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot share the {} log file: {e}", self.name));
        command.stdin(Stdio::null()).stdout(copy).stderr(log)
    }

    /// Takes charge of the server's process, just spawned.
    pub(crate) fn set_child(&mut self, child: Child) {
        debug_assert!(self.child.is_none());
        self.child = Some(child);
        self.paused = false;
    }

    /// The process id, or `None` while the server is killed or stopped.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The process id, for `what` (`pause`, `resume`) to be done to it.
    ///
    /// # Panics
    ///
    /// If the server is not running.
    pub(crate) fn running_pid(&self, what: &str) -> u32 {
        self.pid()
            .unwrap_or_else(|| panic!("cannot {what} {}: it is not running", self.name))
    }

    /// Whether the process is stopped with `SIGSTOP`.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    /// Records whether the process is stopped, for a store that stops it (and its children) itself.
    pub(crate) fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
    }

    /// Whether it runs and is not paused: whether asking it anything makes sense.
    pub(crate) fn is_live(&self) -> bool {
        self.child.is_some() && !self.paused
    }

    /// Sends `sig` to the process.
    ///
    /// # Panics
    ///
    /// If it is not running or the signal cannot be sent.
    pub(crate) fn signal(&self, sig: Signal) {
        let pid = self.running_pid(&format!("send {sig} to"));
        send_signal(pid, sig).unwrap_or_else(|e| panic!("{sig} to {}: {e}", self.name));
    }

    /// Stops the process with `SIGSTOP` and returns once the kernel reports every one of its threads stopped.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub(crate) fn pause(&mut self) {
        self.signal(Signal::SIGSTOP);
        self.paused = true;
        wait_stopped(
            self.running_pid("pause"),
            &format!("the paused {}", self.name),
        );
    }

    /// Continues a paused process with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub(crate) fn resume(&mut self) {
        self.signal(Signal::SIGCONT);
        self.paused = false;
    }

    /// Kills the process with `SIGKILL` and reaps it. Does nothing if it is not running.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// `Some(true)` when the process exited because its port was taken, `Some(false)` when it exited otherwise,
    /// `None` while it runs (or was never spawned). Only what the log grew by since `log_start` counts.
    pub(crate) fn exited(&mut self, log_start: u64) -> Option<bool> {
        let child = self.child.as_mut()?;
        // An error would say it is not our child (any more): it is gone for us too.
        if matches!(child.try_wait(), Ok(None)) {
            return None;
        }
        self.child = None;
        self.paused = false;
        Some(self.says_addr_in_use(log_start))
    }

    /// Whether the log says, since `log_start`, that the port was taken.
    pub(crate) fn says_addr_in_use(&self, log_start: u64) -> bool {
        self.log_since(log_start)
            .to_ascii_lowercase()
            .contains(ADDR_IN_USE)
    }

    /// Polls `probe` until it returns `Ok`; `Err(addr_in_use)` if the process exited first, as
    /// [`exited`](Self::exited).
    ///
    /// # Panics
    ///
    /// If the server is not ready within [`READY_TIMEOUT`], with the last reason `probe` gave.
    pub(crate) fn wait_ready(
        &mut self,
        log_start: u64,
        mut probe: impl FnMut() -> Result<(), String>,
    ) -> Result<(), bool> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(addr_in_use) = self.exited(log_start) {
                return Err(addr_in_use);
            }
            match probe() {
                Ok(()) => return Ok(()),
                Err(why) => assert!(
                    Instant::now() < deadline,
                    "{} was not ready within {READY_TIMEOUT:?}: {why}",
                    self.name
                ),
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits at most `timeout` for the process to exit, and reaps it if it did; whether it did (or was not running).
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.child.is_some() {
            if self.exited(0).is_some() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL);
        }
        true
    }

    /// Prints the log to stderr if the thread is panicking, headed by the name, `port` and the state.
    pub(crate) fn print_log_if_panicking(&self, port: u16) {
        if !std::thread::panicking() {
            return;
        }
        let state = if self.paused {
            " (paused)"
        } else if self.child.is_none() {
            " (not running)"
        } else {
            ""
        };
        let name = &self.name;
        eprint!("--- {name} log (port {port}){state} ---\n{}", self.log());
        eprintln!("--- end of {name} log ---");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts a server on a free port: `attempt` spawns it on the port given and waits until it is ready, or says
/// `Err(addr_in_use)`; a taken port (another test's server took it between [`free_port`] and the bind) is tried
/// again on another, a few times over.
///
/// # Panics
///
/// If the server exits for another reason, or finds its port taken every time; `name` names it.
pub(crate) fn start_on_free_port(name: &str, mut attempt: impl FnMut(u16) -> Result<(), bool>) {
    for _ in 0..START_ATTEMPTS {
        match attempt(free_port()) {
            Ok(()) => return,
            Err(true) => continue,
            Err(false) => panic!("{name} exited before it was ready"),
        }
    }
    panic!("{name} found its port taken {START_ATTEMPTS} times in a row");
}

/// Restarts a server on its own port: `attempt` spawns it and waits until it is ready, or says
/// `Err(addr_in_use)`; while the port is still taken (by a connection of the killed server in `TIME_WAIT`, or one
/// of its processes not yet gone) it tries again for a few seconds.
///
/// # Panics
///
/// If the server exits for another reason, or the port stays taken; `name` names it.
pub(crate) fn restart_on_port(name: &str, mut attempt: impl FnMut() -> Result<(), bool>) {
    let deadline = Instant::now() + RESTART_PORT_WAIT;
    loop {
        match attempt() {
            Ok(()) => return,
            Err(true) if Instant::now() < deadline => {
                // A back-off between retries, not a synchronisation: nothing signals when a port becomes free.
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(_) => panic!("{name} did not restart on its port"),
        }
    }
}

/// Runs a store's command-line client `command` (`program` names it) with no stdin, and returns what it printed on
/// stdout without the final newline, or, if it failed, what it printed on stderr.
///
/// # Panics
///
/// If it cannot be run.
pub(crate) fn client_output(command: &mut Command, program: &str) -> Result<String, String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    if output.status.success() {
        let mut stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if stdout.ends_with('\n') {
            stdout.pop();
        }
        Ok(stdout)
    } else {
        Err(String::from_utf8_lossy(&output.stderr)
            .trim_end()
            .to_owned())
    }
}

/// Polls `check` until it returns `Ok`, or panics after [`READY_TIMEOUT`] with `what` and the last reason `check`
/// gave. For what several processes must agree on (a leader, a healthy cluster).
pub(crate) fn poll_until<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let why = match check() {
            Ok(value) => return value,
            Err(why) => why,
        };
        assert!(
            Instant::now() < deadline,
            "no {what} after {READY_TIMEOUT:?}: {why}"
        );
        std::thread::sleep(POLL);
    }
}

/// Where a server whose log is in `dir` keeps its files: a directory of the same name in `/dev/shm` when there is
/// one, `server/` inside `dir` otherwise. Not created yet.
pub(crate) fn server_dir_for(dir: &Path) -> PathBuf {
    let shm = Path::new(SHM);
    match dir.file_name() {
        // The name is unique among those that [`TempDir`] makes, which are all that the harness makes there.
        Some(name) if shm.is_dir() => shm.join(name),
        _ => dir.join("server"),
    }
}

/// Whether the tests run as root, who must hand the servers to their own users. The owner of `/proc/self` is the
/// process's effective uid (nix's `geteuid` needs a feature the harness does not otherwise use).
pub(crate) fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Creates `dir` (mode 0700) and, when the tests run as root, gives it to `user`, whose server keeps its files
/// there: the [`TempDir`] above it stays root's, and readable, which is all the server needs of it.
///
/// # Panics
///
/// If the directory cannot be created or given away.
pub(crate) fn give_to(dir: &Path, user: &str) {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    if !is_root() {
        return;
    }
    let status = Command::new("chown")
        .arg(format!("{user}:{user}"))
        .arg(dir)
        .status()
        .unwrap_or_else(|e| panic!("cannot run chown: {e}"));
    assert!(
        status.success(),
        "cannot give {} to the user {user} (does it exist? scripts/ensure-postgres.sh and \
         scripts/ensure-mariadb.sh create the servers' users)",
        dir.display()
    );
}

/// A command that runs `program` as `user` when the tests run as root (as themselves otherwise), killed by the kernel
/// when its parent thread dies. `setpriv` changes the ids and the signal and then execs `program`: the child's pid
/// is `program`'s, and the signal survives the exec (it would not survive a change of ids after it, which is why a
/// server's own `--user` switch is not used).
pub(crate) fn as_server_user(user: &str, program: &Path) -> Command {
    let mut command = Command::new("setpriv");
    if is_root() {
        command.args(["--reuid", user, "--regid", user, "--init-groups"]);
    }
    command.args(["--pdeathsig", "SIGKILL", "--"]).arg(program);
    command
}

/// What [`spawn_for_process_life`] asks its thread: a command, and where to send the spawned child.
type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `command` from a thread that lives as long as the test process. A parent-death signal
/// ([`as_server_user`]) fires when the *thread* that spawned the child exits, not the process: a server spawned
/// (or restarted) from a test's thread, a `spawn_blocking` task or a fault-injecting thread would be killed when that
/// thread ends. Spawned from here, it is killed when the test process ends, however it ends.
///
/// # Errors
///
/// As [`Command::spawn`].
pub(crate) fn spawn_for_process_life(command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("leasehold-tests-spawner".to_owned())
            .spawn(move || {
                // Never ends: the sender lives in a static.
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the spawner thread");
        requests
    });
    let (reply, child) = mpsc::channel();
    spawner
        .send((command, reply))
        .expect("the spawner thread is gone");
    child.recv().expect("the spawner thread is gone")
}

/// The state letter of process (or thread) `pid` (`R`, `S`, `T` stopped, `Z` zombie…), from `stat` under `proc`
/// (`/proc` or `/proc/PID/task`); `None` if there is no such process.
fn state_in(proc: &Path, pid: &str) -> Option<char> {
    let stat = std::fs::read_to_string(proc.join(pid).join("stat")).ok()?;
    // The state follows the command's closing parenthesis (the command may hold any character but that last `)`).
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The pids of the processes whose parent is `parent`.
pub(crate) fn children_of(parent: u32) -> Vec<u32> {
    let parent = parent.to_string();
    let processes = std::fs::read_dir("/proc").expect("cannot read /proc");
    processes
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
            (fields.nth(1)? == parent).then_some(pid)
        })
        .collect()
}

/// Returns once every thread of process `pid` is stopped (or the process is gone or a zombie: nothing of it runs),
/// since `SIGSTOP` is delivered asynchronously and a process still running for a moment would answer what a test
/// sends it next.
///
/// # Panics
///
/// If that does not happen within 20 seconds; `what` names the process.
pub(crate) fn wait_stopped(pid: u32, what: &str) {
    let tasks = PathBuf::from(format!("/proc/{pid}/task"));
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let running = std::fs::read_dir(&tasks)
            .into_iter()
            .flatten()
            .flatten()
            .find(|task| {
                let state = task
                    .file_name()
                    .to_str()
                    .and_then(|tid| state_in(&tasks, tid));
                !matches!(state, None | Some('T' | 't' | 'Z' | 'X'))
            });
        let Some(task) = running else { return };
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) still has thread {:?} running {READY_TIMEOUT:?} after SIGSTOP",
            task.file_name()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits at most `timeout` until none of `pids` runs any more (each is gone, or a zombie that init has yet to
/// reap); whether that happened.
pub(crate) fn wait_gone(pids: &[u32], timeout: Duration) -> bool {
    let proc = Path::new("/proc");
    let deadline = Instant::now() + timeout;
    loop {
        let alive = pids
            .iter()
            .any(|pid| !matches!(state_in(proc, &pid.to_string()), None | Some('Z' | 'X')));
        if !alive {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_and_states_are_read_from_proc() {
        let me = std::process::id();
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(children_of(me).contains(&child.id()));
        send_signal(child.id(), Signal::SIGSTOP).unwrap();
        wait_stopped(child.id(), "sleep");
        assert_eq!(
            state_in(Path::new("/proc"), &child.id().to_string()),
            Some('T')
        );
        child.kill().unwrap();
        assert!(wait_gone(&[child.id()], Duration::from_secs(5)));
        child.wait().unwrap();
        assert!(!children_of(me).contains(&child.id()));
    }
}
