//! Exit statuses, the error that carries one, and the last-resort clean-up of a panic.
//!
//! | status | meaning |
//! |---|---|
//! | the program's | `run`: the program's own exit status |
//! | 128 + N | `run`: the program was ended by signal N (or `leasehold` was, while it waited for the lock) |
//! | 2 | usage error |
//! | 65 | the lock's key holds something leasehold did not write |
//! | 69 | Redis cannot be reached or refuses us; `demo`: `redis-server` is missing |
//! | 70 | internal error (a bug) |
//! | 75 | `run`: the lock was not acquired (`--conflict-exit-code`) |
//! | 76 | `run`: the lock was lost while the program ran |
//! | 126 | `run`: the program exists but cannot be executed |
//! | 127 | `run`: the program cannot be found |

use std::fmt;
use std::io::Write as _;
use std::sync::Mutex;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// Usage error: bad flag, bad value, missing argument.
pub const USAGE: u8 = 2;
/// The lock's key exists but was not written by leasehold (sysexits' `EX_DATAERR`).
pub const NOT_A_LOCK: u8 = 65;
/// Redis cannot be reached or refuses the credentials (sysexits' `EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// A bug in leasehold (sysexits' `EX_SOFTWARE`).
pub const INTERNAL: u8 = 70;
/// The default status when the lock was not acquired (sysexits' `EX_TEMPFAIL`, as `flock -E` users expect).
pub const CONFLICT: u8 = 75;
/// The lock was lost while the program ran.
pub const LOST: u8 = 76;
/// The program cannot be found (as in shells).
pub const CANNOT_RUN: u8 = 127;
/// `run`: the program exists but cannot be executed (permissions, not an executable format).
pub const CANNOT_EXECUTE: u8 = 126;

/// An error that decides the exit status. Its message is the one line printed after `leasehold: `.
#[derive(Debug)]
pub struct Failure {
    /// The exit status.
    pub code: u8,
    message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// An error that makes `leasehold` exit with `code` after printing `message`.
pub fn fail(code: u8, message: impl Into<String>) -> anyhow::Error {
    Failure {
        code,
        message: message.into(),
    }
    .into()
}

/// The exit status for an error: the first [`Failure`] or typed error in its chain decides.
pub fn code_of(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if let Some(failure) = cause.downcast_ref::<Failure>() {
            return failure.code;
        }
        if let Some(err) = cause.downcast_ref::<leasehold::Error>() {
            return code_of_lock_error(err);
        }
        if cause
            .downcast_ref::<leasehold::redis::RedisError>()
            .is_some()
        {
            return UNAVAILABLE;
        }
    }
    INTERNAL
}

fn code_of_lock_error(err: &leasehold::Error) -> u8 {
    match err {
        leasehold::Error::Redis(_) | leasehold::Error::NotPermitted { .. } => UNAVAILABLE,
        leasehold::Error::InvalidArgument(_) => USAGE,
        leasehold::Error::NotALock { .. } => NOT_A_LOCK,
        leasehold::Error::Busy { .. } | leasehold::Error::Timeout { .. } => CONFLICT,
        leasehold::Error::LeaseLost { .. } | leasehold::Error::NotOwner { .. } => LOST,
        _ => INTERNAL,
    }
}

/// The one line printed for an error: the chain joined by `: `, without line breaks.
pub fn one_line(err: &anyhow::Error) -> String {
    let text = format!("{err:#}");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Writes `line` and a newline to stderr. Unlike `eprintln!` it never panics: a closed stderr loses the line,
/// nothing more.
pub fn print_err(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// Writes `text` to stdout and flushes. A closed stdout is not worth an error: nobody would read it.
pub fn print_out(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Processes that must not outlive `leasehold` even when it panics: the program `run` started (a whole process
/// group, since its lease ends with us) and the private `redis-server` of `demo`.
static DOOMED: Mutex<Vec<Doomed>> = Mutex::new(Vec::new());

/// One entry of the last-resort clean-up list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doomed {
    /// A process group, by its id.
    Group(i32),
    /// One process.
    Process(i32),
}

/// Adds an entry to the list the panic hook kills.
pub fn doom(entry: Doomed) {
    lock_doomed().push(entry);
}

/// Removes an entry once its owner has cleaned it up itself.
pub fn spare(entry: Doomed) {
    lock_doomed().retain(|e| *e != entry);
}

fn lock_doomed() -> std::sync::MutexGuard<'static, Vec<Doomed>> {
    DOOMED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs the panic hook: one line on stderr, the doomed processes killed, exit 70. A panic is a bug; this
/// keeps it from printing a backtrace or leaving a program running without its lock.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_owned());
        let place = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let what = what.split_whitespace().collect::<Vec<_>>().join(" ");
        print_err(&format!("leasehold: internal error: {what}{place}"));
        for entry in lock_doomed().drain(..) {
            // SIGKILL: nothing of ours is left to wait for a graceful exit.
            let _ = match entry {
                Doomed::Group(id) => killpg(Pid::from_raw(id), Signal::SIGKILL),
                Doomed::Process(id) => kill(Pid::from_raw(id), Signal::SIGKILL),
            };
        }
        std::process::exit(i32::from(INTERNAL));
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_errors_map_to_their_statuses() {
        assert_eq!(code_of(&fail(USAGE, "x")), USAGE);
        let wrapped = fail(LOST, "lost").context("while running");
        assert_eq!(code_of(&wrapped), LOST);
        let busy = anyhow::Error::from(leasehold::Error::Busy {
            name: "n".into(),
            remaining: None,
        });
        assert_eq!(code_of(&busy), CONFLICT);
        let bad = anyhow::Error::from(leasehold::Error::from(
            leasehold::InvalidArgument::EmptyName,
        ));
        assert_eq!(code_of(&bad), USAGE);
        assert_eq!(code_of(&anyhow::anyhow!("what")), INTERNAL);
    }

    #[test]
    fn messages_are_one_line() {
        let err = anyhow::anyhow!("two\nlines").context("outer");
        assert_eq!(one_line(&err), "outer: two lines");
    }
}
