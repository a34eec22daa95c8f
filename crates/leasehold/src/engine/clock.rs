//! The clock of lease deadlines: monotonic, and counting the time the machine spent suspended.
//!
//! [`tokio::time::Instant`] reads `CLOCK_MONOTONIC`, which stops while the machine is suspended (a laptop lid, a VM
//! save). The Redis server's clock does not stop, so a holder that wakes up after a suspension longer than its
//! lease would otherwise believe it still holds a lock that expired meanwhile. On Linux, [`now`] adds the time
//! spent suspended since the process first asked (`CLOCK_BOOTTIME − CLOCK_MONOTONIC`, which grows by exactly that),
//! so every deadline comparison sees the suspension. Elsewhere the suspended time reads as zero.
//!
//! Timers still run on tokio's monotonic clock, which is the only one it has; a timer that was sleeping when the
//! machine was suspended would fire late by the suspension. So lease timers sleep at most [`MAX_SLEEP`] at a time
//! and look again: a loss that happened during a suspension is signalled within that much of the resume, and
//! [`Lease::is_held`](crate::Lease::is_held) is right at once.

use std::time::Duration;

use tokio::time::Instant;

/// The longest a lease timer sleeps before it looks at the clock again.
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Now, on the lease clock: monotonic time plus the time spent suspended since the first call.
pub(crate) fn now() -> Instant {
    Instant::now() + suspended()
}

/// When a tokio timer (monotonic, suspension not counted) should fire for `at` on the lease clock, as far as is
/// known now; never later than [`MAX_SLEEP`] from now.
pub(crate) fn timer_for(at: Instant) -> Instant {
    let at = at.checked_sub(suspended()).unwrap_or(at);
    at.min(Instant::now() + MAX_SLEEP)
}

#[cfg(target_os = "linux")]
fn suspended() -> Duration {
    use std::sync::OnceLock;

    use nix::time::{clock_gettime, ClockId};

    fn gap() -> Option<Duration> {
        let boot = clock_gettime(ClockId::CLOCK_BOOTTIME).ok()?;
        let mono = clock_gettime(ClockId::CLOCK_MONOTONIC).ok()?;
        Some(Duration::from(boot).saturating_sub(Duration::from(mono)))
    }
    static BASE: OnceLock<Option<Duration>> = OnceLock::new();
    let Some(base) = *BASE.get_or_init(gap) else {
        return fake::offset();
    };
    // The two readings are not taken at the same instant: ignore the few nanoseconds between them.
    let jitter = Duration::from_micros(50);
    let grown = gap().map_or(Duration::ZERO, |g| g.saturating_sub(base));
    let real = if grown > jitter {
        grown
    } else {
        Duration::ZERO
    };
    real + fake::offset()
}

#[cfg(not(target_os = "linux"))]
fn suspended() -> Duration {
    fake::offset()
}

/// A suspension that tests can pretend happened (the machine running the tests cannot be suspended).
mod fake {
    use std::time::Duration;

    #[cfg(test)]
    thread_local! {
        static OFFSET: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
    }

    #[cfg(test)]
    pub(crate) fn offset() -> Duration {
        OFFSET.with(std::cell::Cell::get)
    }

    #[cfg(test)]
    pub(crate) fn suspend(by: Duration) {
        OFFSET.with(|o| o.set(o.get() + by));
    }

    #[cfg(not(test))]
    pub(crate) fn offset() -> Duration {
        Duration::ZERO
    }
}

#[cfg(test)]
pub(crate) use fake::suspend;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_suspension_the_lease_clock_is_the_monotonic_clock() {
        let before = Instant::now();
        let now = now();
        let after = Instant::now();
        assert!(before <= now && now <= after + Duration::from_millis(1));
    }

    #[test]
    fn timers_never_sleep_longer_than_max_sleep() {
        let far = Instant::now() + Duration::from_secs(3600);
        assert!(timer_for(far) <= Instant::now() + MAX_SLEEP);
    }
}
