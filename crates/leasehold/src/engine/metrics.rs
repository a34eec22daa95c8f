//! Counters and histograms through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`); without the
//! feature every function here is empty and compiles away.
//!
//! The names and what they count are listed in the crate docs (`# Observing`).
//!
//! No label carries the lock name: one-lock-per-entity names would make the series unbounded.

use std::time::Duration;

use crate::engine::lease::LossReason;

#[cfg(feature = "metrics")]
mod on {
    use super::*;

    pub(crate) fn granted(waited: Duration) {
        metrics::counter!("leasehold_acquisitions_total").increment(1);
        metrics::histogram!("leasehold_wait_seconds").record(waited.as_secs_f64());
    }

    pub(crate) fn busy() {
        metrics::counter!("leasehold_busy_total").increment(1);
    }

    pub(crate) fn timed_out() {
        metrics::counter!("leasehold_acquire_timeouts_total").increment(1);
    }

    pub(crate) fn renewals(renewed: usize, failed: usize) {
        if renewed > 0 {
            metrics::counter!("leasehold_renewals_total").increment(renewed as u64);
        }
        if failed > 0 {
            metrics::counter!("leasehold_renewal_failures_total").increment(failed as u64);
        }
    }

    pub(crate) fn ended(reason: LossReason, held: Duration) {
        metrics::histogram!("leasehold_hold_seconds").record(held.as_secs_f64());
        let reason = match reason {
            LossReason::Released => return,
            LossReason::Expired => "expired",
            LossReason::Gone => "gone",
            LossReason::Taken => "taken",
        };
        metrics::counter!("leasehold_losses_total", "reason" => reason).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    use super::*;

    pub(crate) fn granted(_: Duration) {}
    pub(crate) fn busy() {}
    pub(crate) fn timed_out() {}
    pub(crate) fn renewals(_: usize, _: usize) {}
    pub(crate) fn ended(_: LossReason, _: Duration) {}
}

pub(crate) use on::{busy, ended, granted, renewals, timed_out};
