//! Lease lengths: the limits every lock kind and store accepts, the drift allowance taken off every lease, and
//! lengths in whole milliseconds as stores take them.

use std::time::Duration;

use crate::error::InvalidArgument;

/// The shortest lease accepted.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// The longest lease accepted: longer leases are almost certainly a unit mistake.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

pub(crate) fn check_ttl(ttl: Duration) -> Result<(), InvalidArgument> {
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
        return Err(InvalidArgument::BadTtl {
            ttl,
            min: MIN_TTL,
            max: MAX_TTL,
        });
    }
    Ok(())
}

/// The clock-drift allowance subtracted from a lease: 1 % of it plus 2 ms (Redlock's rule).
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// Milliseconds for a lease argument (`PX`, `PEXPIRE`), rounded up so a lease never shrinks below what was asked.
pub(crate) fn millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if Duration::from_millis(ms as u64) < d {
        ms + 1
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The default lease, on every store: of a lock that sets no [`Mutex::ttl`](crate::Mutex::ttl) (kept alive by the
/// watchdog while the guard lives), and on the stores with sessions of the session such locks live under unless
/// [`Builder::session_ttl`](crate::Builder::session_ttl) sets another.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_and_millis_round_conservatively() {
        assert_eq!(drift(Duration::from_secs(30)), Duration::from_millis(302));
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::from_millis(7)), 7);
    }
}
