//! The torture test: worker processes loop lock → critical section → release on one lock while a scheduler injects
//! faults at random, and a checker reads everything they observed and reports one line.
//!
//! - Each worker (`torture-worker`, a real OS process) talks to the lock server through its own [`TcpProxy`], and to
//!   a separate store server directly (an occupancy marker and a fenced write per critical section). It logs its
//!   grants, its `is_held() == true` samples (stamped before each call, also while its release is in flight), its
//!   loss signals and its releases on `CLOCK_MONOTONIC`, which all processes share (`history.rs`).
//! - The scheduler (`chaos.rs`) picks faults from a seeded generator: SIGSTOP past the lease, SIGKILL and respawn,
//!   blackholed and delayed proxies, `DEBUG SLEEP`, `CLIENT PAUSE`, crashes restarted from an older snapshot,
//!   `FLUSHALL`, deletion of the fence counter, and clients that queue and die, with a `PSUBSCRIBE '*'` bystander on
//!   the lock server throughout. Faults come in bursts; each burst ends with more than 16 clients that queue and
//!   die, and is followed by a calm spell in which a free lock must reach a waiter within the stall bound. It
//!   records when each fault was in force.
//! - The checker (`check.rs`) counts overlaps, fence regressions, late losses and stalls, and the test adds keys left
//!   without a TTL on the lock server. Any of them fails the test, with the seed in the message.
//!
//! Every lock kind goes through it in turn (`TORTURE_KINDS`, default `mutex,fair,semaphore:2,rw,reentrant`), each with its own
//! servers and workers, for `TORTURE_SECONDS` each (default 12) with `TORTURE_SEED` (default: drawn from the clock);
//! `scripts/torture.sh SECONDS SEED [KINDS]` runs it in release mode.

mod chaos;
mod check;
mod history;

use std::time::Duration;

use chaos::Rig;

/// The lease the workers take: short, so that a run sees many grants, renewals, expiries and faults, and long
/// enough next to the stall bound that a waiter left to its lease-end timer shows as a stall.
const TTL: Duration = Duration::from_secs(1);
const WORKERS: usize = 5;
/// The kinds a run goes through by default.
const KINDS: &str = "mutex,fair,semaphore:2,rw,reentrant";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_keeps_its_contract_under_random_faults() {
    let seconds: u64 = std::env::var("TORTURE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let kinds = std::env::var("TORTURE_KINDS").unwrap_or_else(|_| KINDS.to_owned());
    let seed: u64 = std::env::var("TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let mut failed = Vec::new();
    for kind in kinds.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        eprintln!("torture: kind={kind} seed={seed} secs={seconds} (rerun with TORTURE_KINDS={kind} TORTURE_SEED={seed})");
        let mut rig = Rig::start(WORKERS, TTL, seed, kind).await;
        rig.torture(Duration::from_secs(seconds)).await;
        let verbose = std::env::var_os("TORTURE_VERBOSE").is_some();
        if verbose {
            eprintln!("{}", rig.windows());
        }
        let outcome = rig.finish().await;
        println!("{}", outcome.line(kind, seed, seconds));
        if verbose || outcome.violations() > 0 {
            eprintln!("{}", outcome.details());
        }
        if outcome.violations() > 0 {
            failed.push(kind.to_owned());
        }
    }
    assert!(
        failed.is_empty(),
        "torture seed={seed} found violations for {failed:?} (rerun with TORTURE_SEED={seed})"
    );
}
