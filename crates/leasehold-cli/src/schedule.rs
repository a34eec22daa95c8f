//! When `leasehold run` stops its program: the program must be gone **by** its lease's deadline, so that nobody
//! else can hold the lock while it runs. SIGKILL lands a margin before the deadline, SIGTERM `--kill-after` before
//! that; a lease too short to fit both while renewals still keep it is refused before anything connects.
//!
//! ```text
//!   grant ... renewals keep the deadline ahead ...   SIGTERM        SIGKILL   deadline   expiry on the server
//!                                                  |<- kill-after ->|<margin>|<- drift ->|
//! ```
//!
//! The deadline is the lease's conservative one ([`leasehold::Lease::remaining`]: already short of the server's
//! expiry by the drift allowance). Healthy renewals keep the remaining lease above half of it on every store (Redis
//! and etcd renew every third of the lease, SQL every quarter, ZooKeeper syncs every eighth of its session and keeps
//! five eighths of it), so SIGTERM can only leave when renewals have failed for a while, never on a healthy run. A
//! lease granted shorter than `--ttl` says gets the rule applied to the lease as granted ([`Schedule::within`]).

use std::time::Duration;

use crate::args::RunArgs;
use crate::duration::show;
use crate::exit::{self, fail};
use crate::stores::Store;

/// `--kill-after` when none is given, or less when the lease is too short for it (see [`Schedule::of`]).
const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(5);

/// The margin between SIGKILL and the deadline is a tenth of the lease, at most this: it covers a late timer on a
/// busy machine and the time a killed process takes to go.
const MAX_MARGIN: Duration = Duration::from_secs(1);

/// When the program gets SIGTERM and SIGKILL, relative to its lease's deadline.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Between SIGTERM and SIGKILL.
    pub kill_after: Duration,
    /// Between SIGKILL and the lease's deadline.
    pub margin: Duration,
}

impl Schedule {
    /// The schedule of `args`: `--kill-after` (by default 5s, or at most half the lease less the margin) and the
    /// margin.
    ///
    /// # Errors
    ///
    /// Status 2 when `--kill-after` and the margin take more than half the lease: renewals could no longer keep the
    /// program from getting SIGTERM on a healthy run.
    pub fn of(args: &RunArgs) -> anyhow::Result<Schedule> {
        let lease = lease_of(Store::of_all(&args.store.urls), args.ttl);
        let margin = (lease / 10).min(MAX_MARGIN);
        let most = (lease / 2).saturating_sub(margin);
        let kill_after = match args.kill_after {
            None => DEFAULT_KILL_AFTER.min(most),
            Some(kill_after) if kill_after <= most => kill_after,
            Some(kill_after) => {
                return Err(fail(
                    exit::USAGE,
                    format!(
                        "--kill-after {} is too long for --ttl {}: the program gets SIGTERM --kill-after and {} \
                         before its lease's deadline, and renewals keep only half the lease ahead, so --kill-after \
                         can be at most {}; shorten it or lengthen --ttl",
                        show(kill_after),
                        show(args.ttl),
                        show(margin),
                        show(most)
                    ),
                ))
            }
        };
        Ok(Schedule { kill_after, margin })
    }

    /// The schedule for a lease seen to last `lease` at most: the same rule with the lease as granted, when that is
    /// shorter than `--ttl` said (a hand-off's claim of at most 2s on Redis, until the keeper extends it at once; a
    /// ZooKeeper session negotiated shorter than asked for). Without it, such a grant would get SIGTERM on arrival.
    pub fn within(&self, lease: Duration) -> Schedule {
        let margin = self.margin.min(lease / 10);
        Schedule {
            kill_after: self.kill_after.min((lease / 2).saturating_sub(margin)),
            margin,
        }
    }

    /// From `remaining` (what is left of the lease), how long until the program must have had SIGKILL.
    pub fn kill_in(&self, remaining: Duration) -> Duration {
        remaining.saturating_sub(self.margin)
    }

    /// From `remaining`, how long until the program gets SIGTERM (zero: now).
    pub fn term_in(&self, remaining: Duration) -> Duration {
        self.kill_in(remaining).saturating_sub(self.kill_after)
    }
}

/// How long a grant's deadline lies ahead after a renewal, from `--ttl`: the lease itself, except on ZooKeeper, where
/// the program is stopped five eighths of the session timeout after the last answered sync (from the timeout asked
/// for; a server that negotiates a shorter one shortens it).
fn lease_of(store: Store, ttl: Duration) -> Duration {
    match store {
        Store::ZooKeeper => ttl * 5 / 8,
        _ => ttl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `leasehold run`'s options alone (the command line in `cli.rs` is above this module).
    #[derive(clap::Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }

    fn schedule(args: &[&str]) -> anyhow::Result<Schedule> {
        let mut line = vec!["run"];
        line.extend_from_slice(args);
        line.extend_from_slice(&["job", "true"]);
        let mut run = <Run as clap::Parser>::try_parse_from(line).unwrap();
        run.args.store.resolve();
        Schedule::of(&run.args)
    }

    #[test]
    fn the_default_kill_after_shrinks_with_a_short_lease() {
        let long = schedule(&[]).unwrap();
        assert_eq!(long.kill_after, Duration::from_secs(5));
        assert_eq!(long.margin, Duration::from_secs(1));
        let short = schedule(&["--ttl", "2s"]).unwrap();
        assert_eq!(short.margin, Duration::from_millis(200));
        assert_eq!(short.kill_after, Duration::from_millis(800));
        let zk = schedule(&["--store", "zk://127.0.0.1:2181", "--ttl", "8s"]).unwrap();
        assert_eq!(zk.margin, Duration::from_millis(500));
        assert_eq!(zk.kill_after, Duration::from_millis(2000));
    }

    #[test]
    fn a_kill_after_beyond_half_the_lease_is_a_usage_error() {
        assert!(schedule(&["--ttl", "2s", "--kill-after", "800ms"]).is_ok());
        let err = schedule(&["--ttl", "2s", "--kill-after", "801ms"]).unwrap_err();
        assert_eq!(exit::code_of(&err), exit::USAGE);
        assert!(err.to_string().contains("at most 800ms"), "{err}");
    }

    #[test]
    fn sigterm_leaves_kill_after_before_sigkill_and_sigkill_a_margin_before_the_deadline() {
        let plan = Schedule {
            kill_after: Duration::from_secs(5),
            margin: Duration::from_secs(1),
        };
        assert_eq!(
            plan.kill_in(Duration::from_secs(30)),
            Duration::from_secs(29)
        );
        assert_eq!(
            plan.term_in(Duration::from_secs(30)),
            Duration::from_secs(24)
        );
        assert_eq!(plan.term_in(Duration::from_secs(6)), Duration::ZERO);
        assert_eq!(plan.kill_in(Duration::from_millis(500)), Duration::ZERO);
    }

    #[test]
    fn a_lease_granted_shorter_than_the_ttl_gets_the_same_rule() {
        let plan = Schedule {
            kill_after: Duration::from_secs(5),
            margin: Duration::from_secs(1),
        };
        let claim = plan.within(Duration::from_secs(2));
        assert_eq!(claim.margin, Duration::from_millis(200));
        assert_eq!(claim.kill_after, Duration::from_millis(800));
        // A claim just granted is not stopped at once: its extension is on its way.
        assert!(!claim.term_in(Duration::from_millis(1900)).is_zero());
        let full = plan.within(Duration::from_secs(30));
        assert_eq!(
            (full.kill_after, full.margin),
            (plan.kill_after, plan.margin)
        );
    }
}
