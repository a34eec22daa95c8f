//! A lock holder on etcd in a process of its own, for the tests that stop it with `SIGSTOP`.
//!
//! ```text
//! etcd-holder URL PATH TTL_S
//! ```
//!
//! Opens a session of TTL_S seconds, takes the exclusive lock PATH, prints `granted FENCE`, then prints
//! `deadline NS` (the session's deadline on `CLOCK_MONOTONIC`, in nanoseconds, comparable across processes) every
//! time it moves, and `lost NS REASON` when the session's loss signal fires (NS: when it fired), then exits.
//!
//! Exit status: 0 after the loss, 1 on any error (printed on stderr), 2 on bad usage.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::__etcd::{Kind, Session, SessionOptions};
use leasehold_tests::monotonic_ns;

/// `at` on `CLOCK_MONOTONIC`, in nanoseconds.
fn monotonic(at: tokio::time::Instant) -> u64 {
    let now = tokio::time::Instant::now();
    let now_ns = monotonic_ns();
    if at >= now {
        now_ns + u64::try_from((at - now).as_nanos()).unwrap_or(u64::MAX)
    } else {
        now_ns.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, path, ttl] = args.as_slice() else {
        eprintln!("usage: etcd-holder URL PATH TTL_S");
        return ExitCode::from(2);
    };
    let Ok(ttl) = ttl.parse::<u64>() else {
        eprintln!("TTL_S must be a number of seconds");
        return ExitCode::from(2);
    };
    let options = SessionOptions::default().ttl(Duration::from_secs(ttl));
    let session = match Session::connect(url, options).await {
        Ok(session) => session,
        Err(e) => {
            eprintln!("connect: {e}");
            return ExitCode::from(1);
        }
    };
    let grant = match session.acquire(path, Kind::Exclusive).await {
        Ok(grant) => grant,
        Err(e) => {
            eprintln!("acquire: {e}");
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "granted {}", grant.fence());
    let mut reported = None;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        let deadline = session.deadline();
        if reported != Some(deadline) {
            let _ = writeln!(out, "deadline {}", monotonic(deadline));
            reported = Some(deadline);
        }
        tokio::select! {
            reason = session.lost() => {
                let _ = writeln!(out, "lost {} {reason:?}", monotonic_ns());
                return ExitCode::SUCCESS;
            }
            _ = tick.tick() => {}
        }
    }
}
