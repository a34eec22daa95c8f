//! Exit statuses, the error that carries one, and the last-resort clean-up of a panic.
//!
//! | status | meaning |
//! |---|---|
//! | the program's | `run`: the program's own exit status |
//! | 128 + N | `run`: the program was ended by signal N (or `leasehold` was, while it waited for the lock) |
//! | 2 | usage error; or a `redis://` URL naming a Redis Cluster node the client could not recognise |
//! | 65 | the lock's key holds something leasehold did not write, a lock of another kind, a semaphore in use with another permit count, or a nested run its outer grant does not cover |
//! | 69 | the store (Redis, etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB) cannot be reached or refuses us, or cannot do what was asked (`Error::Unsupported`, found before anything is taken: `exit::tests::an_unsupported_capability_exits_69`; the options a store cannot honour exit 2 before connecting, by the library's capabilities: `stores::tests::the_refusals_before_connecting_are_the_library_s_capabilities`); `demo`: `redis-server` is missing |
//! | 70 | internal error (a bug) |
//! | 75 | `run`: the lock was not acquired (`--conflict-exit-code`) |
//! | 76 | `run`: the lock was lost, or its lease ran out unrenewed, while the program ran |
//! | 126 | `run`: the program exists but cannot be executed |
//! | 127 | `run`: the program cannot be found |

use std::fmt;
use std::io::Write as _;
use std::sync::Mutex;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// Usage error: bad flag, bad value, missing argument.
pub const USAGE: u8 = 2;
/// The lock's key exists but was not written by leasehold, holds a lock of another kind, or a semaphore in use with
/// another permit count (sysexits' `EX_DATAERR`).
pub const NOT_A_LOCK: u8 = 65;
/// The store (Redis, etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB) cannot be reached or refuses the credentials (sysexits' `EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// A bug in leasehold (sysexits' `EX_SOFTWARE`).
pub const INTERNAL: u8 = 70;
/// The default status when the lock was not acquired (sysexits' `EX_TEMPFAIL`, as `flock -E` users expect).
pub const CONFLICT: u8 = 75;
/// The lock was lost, or its lease ran out unrenewed, while the program ran.
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
        leasehold::Error::Redis(_)
        | leasehold::Error::Connect { .. }
        | leasehold::Error::Store { .. }
        | leasehold::Error::NotPermitted { .. }
        | leasehold::Error::NotReplicated { .. }
        | leasehold::Error::Unsupported { .. }
        | leasehold::Error::NoQuorum { .. } => UNAVAILABLE,
        leasehold::Error::InvalidArgument(_) | leasehold::Error::ClusterNode { .. } => USAGE,
        leasehold::Error::NotALock { .. }
        | leasehold::Error::WrongKind { .. }
        | leasehold::Error::WrongPermits { .. } => NOT_A_LOCK,
        leasehold::Error::Busy { .. } | leasehold::Error::Timeout { .. } => CONFLICT,
        leasehold::Error::LeaseLost { .. } | leasehold::Error::NotOwner { .. } => LOST,
        _ => INTERNAL,
    }
}

/// The one line printed for an error: the chain joined by `: `, without line breaks.
pub fn one_line(err: &anyhow::Error) -> String {
    chain_line(err.chain())
}

/// [`one_line`] for a plain error and its sources (a `RedisError` and the I/O error under it).
pub fn error_line(err: &(dyn std::error::Error + 'static)) -> String {
    chain_line(std::iter::successors(Some(err), |e| e.source()))
}

/// Joins the texts of an error chain with `: `, each on one line. leasehold's errors never repeat their cause; some
/// clients' errors do: a `RedisError` prints the text of the error under it, which is also its source, and
/// `mysql_async` ends its text with its source's (`Input/output error: …`, ``Server error: `ERROR 1045 …'``). Such an
/// error is left out and its source speaks for it (see [`repeats_its_source`]). An error of etcd's client (the last of
/// its chain) is said by [`crate::etcd::client_error_line`], without the `Debug` dump its own text holds.
fn chain_line<'a>(causes: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>) -> String {
    causes
        .filter(|cause| !(cause.is::<leasehold::redis::RedisError>() && cause.source().is_some()))
        .filter(|cause| !repeats_its_source(*cause))
        .map(|cause| {
            let text = match cause.downcast_ref::<leasehold::__etcd::rpc::Error>() {
                Some(etcd) => crate::etcd::client_error_line(etcd),
                None => cause.to_string(),
            };
            text.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .filter(|text| !text.is_empty())
        .collect::<Vec<_>>()
        .join(": ")
}

/// Whether `err`'s text ends with its source's, after `: ` or in quotes (`mysql_async`'s `Input/output error: {0}` and
/// ``Server error: `{0}'``): then the source says it all. A text that merely ends with the same words (`connection
/// refused` over `refused`) is a cause of its own.
fn repeats_its_source(err: &(dyn std::error::Error + 'static)) -> bool {
    let Some(source) = err.source() else {
        return false;
    };
    let (text, under) = (err.to_string(), source.to_string());
    if under.is_empty() {
        return false;
    }
    let unquoted = text.trim_end_matches(['\'', '`', '"']);
    let in_quotes = unquoted.len() < text.len();
    match unquoted.strip_suffix(under.as_str()) {
        Some(before) if in_quotes => before.ends_with(['`', '\'', '"']),
        Some(before) => before.ends_with(": ") || before.is_empty(),
        None => false,
    }
}

/// Longer names than this are cut in messages.
const NAME_SHOWN_MAX: usize = 80;
/// How much of a cut name is shown.
const NAME_SHOWN_CUT: usize = 60;

/// A lock name as messages show it: quoted, and cut to its first 60 characters when longer than 80 bytes
/// (`"aaaa…"…(600 bytes)`), since names may be up to 512 bytes and an error must stay one readable line.
pub fn show_name(name: &str) -> String {
    if name.len() <= NAME_SHOWN_MAX {
        return format!("{name:?}");
    }
    let cut: String = name.chars().take(NAME_SHOWN_CUT).collect();
    format!("{cut:?}…({} bytes)", name.len())
}

/// `line` with every quoted lock name (after `lock ` or `key `, as leasehold's messages and the library's errors
/// write them) shown by [`show_name`]. Applied to every line written to stderr, so that no message, whoever wrote
/// it, prints a 512-byte name in full.
fn cut_names(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = next_quoted_name(rest) {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        match unquote(rest) {
            Some((name, len)) => {
                out.push_str(&show_name(&name));
                rest = &rest[len..];
            }
            None => {
                out.push('"');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Where the next quoted name starts (its opening quote).
fn next_quoted_name(text: &str) -> Option<usize> {
    ["lock \"", "key \""]
        .iter()
        .filter_map(|prefix| text.find(prefix).map(|at| at + prefix.len() - 1))
        .min()
}

/// The string that `text` starts with, as written by `{:?}`, and the length of its quoted form; `None` when `text`
/// does not start with one.
fn unquote(text: &str) -> Option<(String, usize)> {
    let mut chars = text.char_indices();
    if chars.next()?.1 != '"' {
        return None;
    }
    let mut name = String::new();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Some((name, at + 1)),
            '\\' => name.push(match chars.next()?.1 {
                't' => '\t',
                'r' => '\r',
                'n' => '\n',
                '0' => '\0',
                'u' => {
                    let mut hex = String::new();
                    if chars.next()?.1 != '{' {
                        return None;
                    }
                    loop {
                        match chars.next()?.1 {
                            '}' => break,
                            digit => hex.push(digit),
                        }
                    }
                    char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
                }
                other => other,
            }),
            c => name.push(c),
        }
    }
    None
}

/// Writes `line` and a newline to stderr, long lock names cut (see [`show_name`]). Unlike `eprintln!` it never
/// panics, and never blocks: the line is queued for stderr's writer thread (see [`crate::stderr`]); a closed stderr
/// loses the line, nothing more.
pub fn print_err(line: &str) {
    crate::stderr::write(format!("{}\n", cut_names(line)));
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
        crate::stderr::flush(crate::stderr::EXIT_FLUSH);
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
    fn an_unsupported_capability_exits_69() {
        let unsupported = anyhow::Error::from(leasehold::Error::Unsupported { detail: "x".into() });
        assert_eq!(code_of(&unsupported), UNAVAILABLE);
    }

    #[test]
    fn messages_are_one_line() {
        let err = anyhow::anyhow!("two\nlines").context("outer");
        assert_eq!(one_line(&err), "outer: two lines");
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let lock_error = leasehold::Error::Redis(leasehold::redis::RedisError::from(io));
        let err = anyhow::Error::from(lock_error).context("releasing lock \"jobs\"");
        assert_eq!(
            format!("{err:#}"),
            "releasing lock \"jobs\": Redis request failed: broken pipe"
        );
        assert_eq!(
            one_line(&err),
            "releasing lock \"jobs\": Redis request failed: broken pipe"
        );

        let os = std::io::Error::from_raw_os_error(nix::libc::EPIPE);
        let redis = leasehold::redis::RedisError::from(os);
        assert_eq!(error_line(&redis), "Broken pipe (os error 32)");
        let err = anyhow::Error::from(leasehold::Error::Redis(redis));
        assert_eq!(
            one_line(&err),
            "Redis request failed: Broken pipe (os error 32)"
        );

        let bad = anyhow::Error::from(leasehold::Error::from(
            leasehold::InvalidArgument::EmptyName,
        ));
        assert_eq!(one_line(&bad), "invalid argument: lock name is empty");

        // Different causes all stay, in order, even when one's text holds the next one's.
        let err = anyhow::anyhow!("refused")
            .context("connection refused")
            .context("scenario floor-1");
        assert_eq!(
            one_line(&err),
            "scenario floor-1: connection refused: refused"
        );
        assert_eq!(one_line(&fail(CONFLICT, "")), "");
    }

    /// Each store client's errors, wrapped as a SQL, etcd or ZooKeeper connection error is: every cause once.
    #[test]
    fn store_clients_errors_say_each_cause_once() {
        let refused = || std::io::Error::from_raw_os_error(nix::libc::ECONNREFUSED);
        let said = |err: anyhow::Error| one_line(&err.context("MySQL connect failed"));

        let io = mysql_async::Error::Io(mysql_async::IoError::Io(refused()));
        assert_eq!(
            said(io.into()),
            "MySQL connect failed: Connection refused (os error 111)"
        );
        let denied = mysql_async::Error::Server(mysql_async::ServerError {
            code: 1045,
            state: "28000".to_owned(),
            message: "Access denied for user 'u'@'localhost' (using password: YES)".to_owned(),
        });
        assert_eq!(
            said(denied.into()),
            "MySQL connect failed: ERROR 1045 (28000): Access denied for user 'u'@'localhost' (using password: YES)"
        );
        let closed = mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed);
        assert_eq!(
            said(closed.into()),
            "MySQL connect failed: Connection to the server is closed."
        );

        let postgres = tokio_postgres::Error::__private_api_timeout();
        assert_eq!(error_line(&postgres), "timeout waiting for server");

        let etcd = leasehold::__etcd::rpc::Error::IoError(refused());
        assert_eq!(
            error_line(&etcd),
            "io error: Connection refused (os error 111)"
        );

        let zk = zookeeper_client::Error::NoHosts;
        assert_eq!(error_line(&zk), "no available hosts");
    }

    #[test]
    fn long_names_are_cut_in_messages() {
        assert_eq!(show_name("jobs"), "\"jobs\"");
        let eighty = "n".repeat(80);
        assert_eq!(show_name(&eighty), format!("{eighty:?}"));
        let long = "é".repeat(300);
        assert_eq!(
            show_name(&long),
            format!("\"{}\"…(600 bytes)", "é".repeat(60))
        );

        let name = format!("a\"b\\c\n{}", "x".repeat(100));
        let line = format!("leasehold: lost lock {name:?}: key gone; stopping \"sh\" (SIGTERM)");
        assert_eq!(
            cut_names(&line),
            format!(
                "leasehold: lost lock {}: key gone; stopping \"sh\" (SIGTERM)",
                show_name(&name)
            )
        );
        assert!(
            cut_names(&line).contains("…(106 bytes)"),
            "{}",
            cut_names(&line)
        );
        let key = format!(
            "key \"leasehold:{{{}}}\" exists but is not a leasehold lock",
            "k".repeat(90)
        );
        assert!(cut_names(&key).starts_with(&format!("key \"leasehold:{{{}\"…(", "k".repeat(49))));
        // Short names, other quoted text, and lines that only look like a name are left as they are.
        for same in [
            "lock \"jobs\" is held by another owner",
            "cannot run \"/a/very/long/path/that/is/not/a/lock/name/at/all/and/goes/on/and/on/for/ever\"",
            "lock \"unterminated",
            "lock \"bad escape \\u{zz}\" here",
        ] {
            assert_eq!(cut_names(same), same);
        }
    }
}
