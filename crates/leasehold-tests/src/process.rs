//! Child processes that cannot outlive their test, and signals to pause or kill them.

use std::ops::{Deref, DerefMut};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

/// How often [`ChildGuard::wait_timeout`] polls for an exit. The standard library has no
/// wait-with-deadline, and a few milliseconds of latency is nothing next to the timeouts that
/// tests use.
const POLL: Duration = Duration::from_millis(5);

/// Sends `sig` to the process `pid`.
///
/// # Errors
///
/// The `errno` of `kill(2)`: `ESRCH` when no such process exists (it has exited and been
/// reaped), `EPERM` when it is not ours.
///
/// # Examples
///
/// ```no_run
/// use leasehold_tests::send_signal;
/// use nix::sys::signal::Signal;
///
/// # let pid = 0;
/// send_signal(pid, Signal::SIGSTOP).unwrap(); // freeze the holder mid-lease
/// send_signal(pid, Signal::SIGCONT).unwrap();
/// ```
pub fn send_signal(pid: u32, sig: Signal) -> nix::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| nix::Error::EINVAL)?;
    signal::kill(Pid::from_raw(pid), sig)
}

/// A [`Child`] that is killed with `SIGKILL` and reaped when the guard is dropped, so a failing
/// test leaves no process behind.
///
/// Dereferences to the [`Child`], so `guard.id()`, `guard.stdout.take()` and `guard.wait()` work
/// as usual. A child that has already been waited for is left alone on drop.
#[derive(Debug)]
#[must_use = "dropping the guard kills the child at once"]
pub struct ChildGuard {
    child: Child,
}

impl ChildGuard {
    /// Takes charge of `child`.
    pub fn new(child: Child) -> ChildGuard {
        ChildGuard { child }
    }

    /// Sends `sig` to the child.
    ///
    /// # Errors
    ///
    /// As [`send_signal`]; after the child has been reaped the pid may belong to someone else,
    /// so do not signal a child you have already waited for.
    pub fn signal(&self, sig: Signal) -> nix::Result<()> {
        send_signal(self.child.id(), sig)
    }

    /// Waits at most `timeout` for the child to exit, and returns its status if it did.
    ///
    /// # Panics
    ///
    /// If waiting on the child fails, which only happens when it is not our child.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait on child") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Deref for ChildGuard {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl From<Child> for ChildGuard {
    fn from(child: Child) -> ChildGuard {
        ChildGuard::new(child)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // `try_wait` returns the cached status once the child has been reaped, so a child
        // already waited for is never killed (its pid may have been reused).
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    use super::*;

    fn sleeper() -> ChildGuard {
        ChildGuard::new(Command::new("sleep").arg("30").spawn().unwrap())
    }

    #[test]
    fn dropping_the_guard_kills_and_reaps_the_child() {
        let child = sleeper();
        let pid = child.id();
        drop(child);
        assert_eq!(send_signal(pid, Signal::SIGCONT), Err(nix::Error::ESRCH));
    }

    #[test]
    fn signals_reach_the_child() {
        let mut child = sleeper();
        assert_eq!(child.wait_timeout(Duration::from_millis(20)), None);
        child.signal(Signal::SIGTERM).unwrap();
        let status = child.wait_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(status.signal(), Some(Signal::SIGTERM as i32));
    }

    #[test]
    fn a_stopped_child_is_still_killed_on_drop() {
        let child = sleeper();
        let pid = child.id();
        send_signal(pid, Signal::SIGSTOP).unwrap();
        drop(child);
        assert_eq!(send_signal(pid, Signal::SIGCONT), Err(nix::Error::ESRCH));
    }
}
