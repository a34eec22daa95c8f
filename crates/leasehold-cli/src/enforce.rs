//! The enforcer: a second, tiny process (`leasehold enforce`, hidden) that SIGKILLs the program's process group when
//! `leasehold run` stops telling it the lease is still good.
//!
//! `leasehold run` stops its program the moment the lease is lost, but only while it runs itself. Stopped (SIGSTOP,
//! a debugger attaching, a job stopped by SIGTTOU) or stuck, it would leave the program running beside the next
//! holder. So before the program starts, `run` starts this binary again as the enforcer, in a process group of its
//! own (a signal to `leasehold`'s job does not stop it), and keeps telling it over a pipe by when the program must be
//! dead: the instant [`crate::schedule`] sends SIGKILL, as a reading of a clock every process shares. When that
//! instant passes without a newer one, the enforcer kills the group and exits. It never writes anything and never
//! blocks on anything but its pipe. The program's child process names its group on the pipe itself, between `fork`
//! and `exec` (see `child.rs`), so the program never runs while the enforcer does not know whom to kill.
//!
//! It ends with the program: told that the program was reaped, it exits; its pipe closed without that (`leasehold`
//! died), it kills the group first and then exits (the pipe's end of file is its parent-death signal, and one that
//! fires when the process ends, not one of its threads); the group gone, it exits. The clock is `CLOCK_BOOTTIME` on
//! Linux, which counts the time the machine was suspended as the lease clock does, `CLOCK_MONOTONIC` elsewhere.

use std::io::{self, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _, RawFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::time::{clock_gettime, ClockId};
use nix::unistd::Pid;

/// The longest the enforcer sleeps before it reads the clock again (a suspended machine stops its timers).
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// A message on the pipe: 8 bytes of kind, 8 of value, little-endian; one write, so never split (below `PIPE_BUF`).
const MESSAGE: usize = 16;
/// Watch this process group (the value).
const GROUP: u64 = 1;
/// The program must be dead by this instant (nanoseconds of [`now`]).
const KILL_BY: u64 = 2;
/// The program was reaped: exit without killing anything.
const DONE: u64 = 3;

/// `run`'s end of the enforcer.
pub struct Enforcer {
    child: Child,
    pipe: ChildStdin,
}

impl Enforcer {
    /// Starts the enforcer, armed to kill by `kill_in` from now the group that [`watch`](Enforcer::watch) names.
    ///
    /// # Errors
    ///
    /// When the process cannot be started.
    pub fn start(kill_in: Duration) -> io::Result<Enforcer> {
        let mut child = Command::new(own_binary()?)
            .arg("enforce")
            .arg("--kill-by")
            .arg(nanos(now() + kill_in).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let pipe = child
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("the enforcer's pipe is missing"))?;
        // A write must never block `run` (an enforcer that stopped reading would fill the pipe).
        let flags = OFlag::from_bits_truncate(fcntl(pipe.as_fd(), FcntlArg::F_GETFL)?);
        fcntl(pipe.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
        Ok(Enforcer { child, pipe })
    }

    /// The write end of the pipe, for the program's child process to name its group before `exec` (see
    /// [`group_message`]).
    pub fn fd(&self) -> RawFd {
        self.pipe.as_raw_fd()
    }

    /// Names the program's process group (again: the program's child process named it before `exec` on Linux).
    pub fn watch(&mut self, group: Pid) {
        let _ = self.pipe.write(&group_message(group));
    }

    /// The program must be dead by `kill_in` from now.
    pub fn kill_in(&mut self, kill_in: Duration) {
        self.send(KILL_BY, nanos(now() + kill_in));
    }

    /// The program was reaped: the enforcer exits without killing anything.
    pub fn stand_down(mut self) {
        self.send(DONE, 0);
        // Reaped if it is gone already; otherwise init reaps it after we exit.
        let _ = self.child.try_wait();
    }

    fn send(&mut self, kind: u64, value: u64) {
        let message = message(kind, value);
        // A full pipe (an enforcer that stopped reading) or a gone enforcer loses the message: the enforcer then
        // acts on an earlier, sooner deadline, or not at all, and `run` still supervises the program itself.
        let _ = self.pipe.write(&message);
    }
}

fn message(kind: u64, value: u64) -> [u8; MESSAGE] {
    let mut message = [0u8; MESSAGE];
    message[..8].copy_from_slice(&kind.to_le_bytes());
    message[8..].copy_from_slice(&value.to_le_bytes());
    message
}

/// The message naming `group` as the program's process group. Async-signal-safe (no allocation, no lock): the
/// program's child process sends it between `fork` and `exec`.
pub fn group_message(group: Pid) -> [u8; MESSAGE] {
    message(GROUP, u64::try_from(group.as_raw()).unwrap_or(0))
}

/// This very binary: `/proc/self/exe` on Linux (still the same file after a package upgrade replaced it on disk).
fn own_binary() -> io::Result<std::path::PathBuf> {
    if cfg!(target_os = "linux") {
        Ok("/proc/self/exe".into())
    } else {
        std::env::current_exe()
    }
}

/// The enforcer's options.
#[derive(Debug, clap::Args)]
pub struct EnforceArgs {
    /// Kill the group by this instant (nanoseconds of the shared clock) unless told a later one.
    #[arg(long, value_name = "NANOSECONDS")]
    pub kill_by: u64,
}

/// `leasehold enforce`: reads stdin until told to stand down, and kills the group when the deadline passes or stdin
/// closes first. No runtime, no allocation in the loop, nothing written. Returns the exit status.
pub fn enforce(args: &EnforceArgs) -> u8 {
    let mut kill_by = args.kill_by;
    let mut group: Option<Pid> = None;
    let mut pending = Vec::with_capacity(MESSAGE * 64);
    let mut buffer = [0u8; MESSAGE * 64];
    let stdin = io::stdin();
    loop {
        let left = Duration::from_nanos(kill_by).saturating_sub(now());
        // Until the group is named there is nothing to kill: wait for its name, and act on it at once if late.
        let sleep = match group {
            Some(_) if left.is_zero() => return kill(group),
            Some(group) if killpg(group, None) == Err(Errno::ESRCH) => return 0,
            Some(_) => left.min(MAX_SLEEP),
            None => MAX_SLEEP,
        };
        let timeout = PollTimeout::try_from(sleep.as_millis()).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => return kill(group),
        }
        let read = match nix::unistd::read(stdin.as_fd(), &mut buffer) {
            Ok(0) => return kill(group),
            Ok(read) => read,
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            Err(_) => return kill(group),
        };
        pending.extend_from_slice(&buffer[..read]);
        let whole = pending.len() / MESSAGE * MESSAGE;
        for message in pending[..whole].chunks_exact(MESSAGE) {
            let (kind, value) = message.split_at(8);
            let value = u64::from_le_bytes(value.try_into().unwrap_or_default());
            match u64::from_le_bytes(kind.try_into().unwrap_or_default()) {
                GROUP => group = i32::try_from(value).ok().map(Pid::from_raw),
                KILL_BY => kill_by = value,
                DONE => return 0,
                _ => {}
            }
        }
        pending.drain(..whole);
    }
}

/// Kills the group, if it is known, and gives the exit status.
fn kill(group: Option<Pid>) -> u8 {
    if let Some(group) = group {
        let _ = killpg(group, Signal::SIGKILL);
    }
    0
}

/// Now on the clock shared with the enforcer (see the module docs).
fn now() -> Duration {
    #[cfg(target_os = "linux")]
    let clock = ClockId::CLOCK_BOOTTIME;
    #[cfg(not(target_os = "linux"))]
    let clock = ClockId::CLOCK_MONOTONIC;
    clock_gettime(clock).map_or(Duration::ZERO, Duration::from)
}

fn nanos(at: Duration) -> u64 {
    u64::try_from(at.as_nanos()).unwrap_or(u64::MAX)
}
