//! A small deterministic generator and the clock shared by processes, for tests that replay a seed and compare
//! what several processes saw.

use std::time::Duration;

use nix::time::{clock_gettime, ClockId};

/// A xorshift generator: the same seed gives the same sequence, so a failure can be replayed.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator for `seed` (any value). The seed is scrambled first (splitmix64), so that small seeds (1, 2, 3)
    /// start as well mixed as large ones.
    pub fn new(seed: u64) -> XorShift {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        XorShift((z ^ (z >> 31)) | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration between `lo` and `hi`, in whole milliseconds.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = u64::try_from(hi.saturating_sub(lo).as_millis()).unwrap_or(u64::MAX);
        lo + Duration::from_millis(self.below(span.saturating_add(1)))
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the machine, so that histories logged by
/// several processes can be compared.
pub fn monotonic_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| u64::try_from(Duration::from(t).as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_sequence_and_bounds_hold() {
        let mut a = XorShift::new(7);
        let mut b = XorShift::new(7);
        for _ in 0..100 {
            let n = a.below(10);
            assert_eq!(n, b.below(10));
            assert!(n < 10);
        }
        let d = a.between(Duration::from_millis(5), Duration::from_millis(9));
        assert!(d >= Duration::from_millis(5) && d <= Duration::from_millis(9));
        assert!(monotonic_ns() > 0);
    }
}
