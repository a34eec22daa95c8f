//! The program `leasehold run` starts: its own process group, signals to the whole group, the terminal handed to it,
//! and its exit status as ours.

use std::ffi::OsString;
use std::io::{self, IsTerminal as _};
use std::os::fd::RawFd;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{getpgrp, tcgetpgrp, tcsetpgrp, Pid};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::exit::{doom, spare, Doomed};
use crate::signals::Signals;

/// How often a terminating group is checked for members left behind by its leader. Nothing signals when the
/// last member of a process group exits, so this is polled, and only during the grace period.
const GROUP_POLL: Duration = Duration::from_millis(10);

/// A running program in its own process group (its id is the program's pid).
pub struct Program {
    child: tokio::process::Child,
    group: Pid,
    /// Set once the program has been reaped.
    status: Option<ExitStatus>,
    terminal: Option<Terminal>,
}

/// What [`Program::next_event`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The program exited (it has been reaped).
    Exited(ExitStatus),
    /// The program was stopped by job control.
    Stopped,
}

/// How [`Program::finish_stop`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// The whole group was gone within the grace period.
    Graceful,
    /// Something was left after the grace period and got SIGKILL.
    Killed,
    /// The program died of a SIGKILL `run` did not send within the grace period: the enforcer's, armed for the same
    /// instant (its timer may fire first on a loaded machine), or anyone else's.
    DiedOfSigkill,
}

impl Program {
    /// Starts `command` (program and arguments) directly, without a shell, with `env` added to its environment,
    /// in a new process group; stdin, stdout and stderr are inherited. When `leasehold` is the foreground job of the
    /// terminal on stdin, the terminal is handed to the program's group, so that it can read from it and gets the
    /// terminal's Ctrl-C and Ctrl-Z itself (see [`next_event`](Program::next_event)). With `enforcer` (the write end
    /// of the enforcer's pipe), the child names its group to the enforcer before it runs anything (Linux).
    ///
    /// # Errors
    ///
    /// The error of `exec`: not found, not executable, …
    pub fn spawn(
        command: &[OsString],
        env: &[(&str, String)],
        enforcer: Option<RawFd>,
    ) -> io::Result<Program> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no program given"))?;
        // Before the spawn, so that not even an immediate stop of the program goes unnoticed.
        let terminal = Terminal::foreground();
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .process_group(0);
        die_with_parent(&mut command, enforcer);
        let child = command.spawn()?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| {
                io::Error::other("the program exited before its process id could be read")
            })?;
        let group = Pid::from_raw(pid);
        doom(Doomed::Group(pid));
        let terminal = terminal.filter(|terminal| terminal.give(group));
        Ok(Program {
            child,
            group,
            status: None,
            terminal,
        })
    }

    /// The program's process group.
    pub fn group(&self) -> Pid {
        self.group
    }

    /// Waits for the program to exit, and gives the terminal back to `leasehold` if it had it.
    ///
    /// # Errors
    ///
    /// When waiting fails, which only happens if the child is not ours.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call can be repeated.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = self.child.wait().await?;
        self.status = Some(status);
        if let Some(terminal) = self.terminal.take() {
            terminal.take_back(self.group);
        }
        Ok(status)
    }

    /// Waits for the program to exit, like [`wait`](Program::wait), or to be stopped by job control (Ctrl-Z on the
    /// terminal it was handed): then [`suspend_with_it`](Program::suspend_with_it) is the caller's to do. A program
    /// without a terminal is never reported stopped: a stopped background job is not ours to manage.
    ///
    /// # Errors
    ///
    /// As [`wait`](Program::wait).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn next_event(&mut self) -> io::Result<Event> {
        if self.status.is_some() || self.terminal.is_none() {
            return self.wait().await.map(Event::Exited);
        }
        let group = self.group;
        let stopped = async {
            let Some(terminal) = self.terminal.as_mut() else {
                return std::future::pending().await;
            };
            loop {
                if terminal.children.recv().await.is_none() {
                    return std::future::pending().await;
                }
                // WSTOPPED alone consumes stop events only; the exit stays for `wait`.
                let flags = WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG;
                if let Ok(WaitStatus::Stopped(..)) = waitid(Id::Pid(group), flags) {
                    return;
                }
            }
        };
        tokio::select! {
            status = self.child.wait() => {
                let status = status?;
                self.status = Some(status);
                if let Some(terminal) = self.terminal.take() {
                    terminal.take_back(self.group);
                }
                Ok(Event::Exited(status))
            }
            () = stopped => Ok(Event::Stopped),
        }
    }

    /// After [`Event::Stopped`]: suspends `leasehold` with its program, the way a shell expects a job to
    /// stop: the terminal goes back to our group and our group gets SIGTSTP. Returns once `leasehold` is continued
    /// (`fg`, `bg`); the terminal then goes back to the program if we are in the foreground, and the program is
    /// continued. The lease is not renewed while `leasehold` is stopped, so a long suspension loses the lock.
    pub fn suspend_with_it(&self) {
        let Some(terminal) = &self.terminal else {
            return;
        };
        terminal.take_back(self.group);
        // Stops us (and the rest of our job) before the call returns; we resume here when continued.
        let _ = killpg(terminal.ours, Signal::SIGTSTP);
        terminal.give(self.group);
        self.signal(Signal::SIGCONT);
    }

    /// Sends `signal` to every process of the program's group. A group that is already gone is not an error.
    pub fn signal(&self, signal: Signal) {
        // ESRCH (nobody left) is the only error possible for our own group.
        let _ = killpg(self.group, signal);
    }

    /// Passes a signal sent to `leasehold` on to the whole group, and continues the group in case it is stopped (by
    /// SIGTSTP, SIGTTIN, a debugger), so that the signal takes effect now rather than whenever it resumes.
    pub fn forward(&self, signal: Signal) {
        self.signal(signal);
        self.signal(Signal::SIGCONT);
    }

    /// Starts stopping the whole group: SIGTERM, and SIGCONT so that a stopped program can act on it.
    pub fn stop(&self) {
        self.signal(Signal::SIGTERM);
        self.signal(Signal::SIGCONT);
    }

    /// After [`stop`](Program::stop): waits up to `grace` for the program and everything left in its group to
    /// exit, forwarding `signals` meanwhile, and sends SIGKILL to whatever remains. Returns once the program has
    /// been reaped.
    pub async fn finish_stop(&mut self, grace: Duration, signals: &mut Signals) -> Termination {
        let deadline = Instant::now() + grace;
        let graceful = loop {
            tokio::select! {
                status = self.wait() => match status {
                    Ok(status) if status.signal() == Some(Signal::SIGKILL as i32) => {
                        // Whatever is left of the group goes with it.
                        self.signal(Signal::SIGKILL);
                        return Termination::DiedOfSigkill;
                    }
                    Ok(_) => break self.group_gone_by(deadline).await,
                    Err(_) => break false,
                },
                () = tokio::time::sleep_until(deadline) => break false,
                sig = signals.recv() => self.forward(sig),
            }
        };
        if graceful {
            return Termination::Graceful;
        }
        self.signal(Signal::SIGKILL);
        let _ = self.wait().await;
        Termination::Killed
    }

    /// After the leader was reaped: waits until no process is left in the group, or `deadline`. True when empty.
    async fn group_gone_by(&self, deadline: Instant) -> bool {
        loop {
            if killpg(self.group, None).is_err() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(GROUP_POLL).await;
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        if self.status.is_none() {
            // Only reached on an error path: the lease ends with us, so the program must not run on unwarned.
            self.signal(Signal::SIGKILL);
        }
        spare(Doomed::Group(self.group.as_raw()));
        if let Some(terminal) = self.terminal.take() {
            terminal.take_back(self.group);
        }
    }
}

/// Our exit status for the program's: its own code, or 128 + N when signal N ended it.
pub fn exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    match status.signal() {
        Some(sig) => u8::try_from(128 + sig).unwrap_or(255),
        None => 1,
    }
}

/// The terminal on stdin, handed to the program's group while it runs.
struct Terminal {
    /// Our process group: the job the shell knows.
    ours: Pid,
    /// SIGCHLD, to notice the program stopping: the terminal's Ctrl-Z goes to its group, not ours.
    children: tokio::signal::unix::Signal,
}

impl Terminal {
    /// The terminal on stdin, if `leasehold` is its foreground job.
    fn foreground() -> Option<Terminal> {
        let stdin = io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let ours = getpgrp();
        if tcgetpgrp(&stdin).ok()? != ours {
            return None;
        }
        let children = signal(SignalKind::child()).ok()?;
        Some(Terminal { ours, children })
    }

    /// Makes `group` the terminal's foreground, if our group is. True when it did.
    fn give(&self, group: Pid) -> bool {
        let stdin = io::stdin();
        tcgetpgrp(&stdin).ok() == Some(self.ours) && tcsetpgrp(&stdin, group).is_ok()
    }

    /// Takes the terminal back if the program's group has it. `leasehold` is then a background process, which the
    /// terminal answers with SIGTTOU unless that signal is blocked, so it is blocked for the call.
    fn take_back(&self, group: Pid) {
        let stdin = io::stdin();
        if tcgetpgrp(&stdin).ok() != Some(group) {
            return;
        }
        let mut ttou = SigSet::empty();
        ttou.add(Signal::SIGTTOU);
        let mut previous = SigSet::empty();
        if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut previous)).is_err() {
            return;
        }
        let _ = tcsetpgrp(&stdin, self.ours);
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&previous), None);
    }
}

/// If `leasehold` itself is killed (SIGKILL, the OOM killer), the program must not run on without a lease: on Linux
/// the kernel sends it SIGKILL the moment its parent dies (`PR_SET_PDEATHSIG`). The parent is the thread that
/// spawned it; `leasehold` runs on one thread (a current-thread runtime), which lives as long as the process.
/// Elsewhere the program can outlive a killed `leasehold` (documented in the README's limits).
///
/// With `enforcer` (the write end of the enforcer's pipe, see `enforce.rs`), the child also names its process group
/// to the enforcer before `exec`: a `leasehold` stopped right after the fork cannot leave the enforcer without a
/// group to kill.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut tokio::process::Command, enforcer: Option<RawFd>) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe calls are allowed.
    // It makes system calls through nix (prctl, getppid, getpid, write), which allocate nothing and take no locks,
    // builds the enforcer's message on the stack, and returns an io::Error built from an errno value (no allocation
    // for `from_raw_os_error`). The enforcer's descriptor stays open in the parent, and so in the child, until exec.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
                .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
            // The parent may have died between the fork and the prctl: then no signal will come.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            if let Some(fd) = enforcer {
                let message = crate::enforce::group_message(nix::unistd::getpid());
                let _ = nix::unistd::write(std::os::fd::BorrowedFd::borrow_raw(fd), &message);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut tokio::process::Command, _enforcer: Option<RawFd>) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_pass_through_and_signals_add_128() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
    }
}
