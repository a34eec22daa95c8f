//! The wait between retries, the same everywhere a task retries Redis: 50 ms, doubling per failure up to 1 s.

use std::time::Duration;

/// The delays between the retries of one failing thing (a connection, a release, a renewal). The first is short so
/// that a blip costs little; the cap keeps a long outage from pushing the next try out of reach once it ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    delay: Duration,
}

impl Backoff {
    /// The first delay.
    pub(crate) const FIRST: Duration = Duration::from_millis(50);
    /// The longest delay.
    pub(crate) const MAX: Duration = Duration::from_secs(1);

    pub(crate) const fn new() -> Backoff {
        Backoff { delay: Self::FIRST }
    }

    /// The delay to wait now; the one after it is twice as long, up to [`Backoff::MAX`].
    pub(crate) fn next(&mut self) -> Duration {
        let delay = self.delay;
        self.delay = (delay * 2).min(Self::MAX);
        delay
    }

    /// The delay the next call to [`Backoff::next`] returns.
    pub(crate) fn peek(&self) -> Duration {
        self.delay
    }

    /// Starts over at [`Backoff::FIRST`]: the thing worked again.
    pub(crate) fn reset(&mut self) {
        *self = Backoff::new();
    }

    /// The delay after `waited` earlier waits, for callers that count failures themselves: [`Backoff::FIRST`] for 0,
    /// doubled per wait, at most [`Backoff::MAX`].
    pub(crate) fn after(waited: u32) -> Duration {
        Self::FIRST
            .saturating_mul(1 << waited.min(16))
            .min(Self::MAX)
    }
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_50ms_up_to_1s_and_start_over_on_reset() {
        let mut backoff = Backoff::new();
        let delays: Vec<u64> = (0..8)
            .map(|_| u64::try_from(backoff.next().as_millis()).unwrap())
            .collect();
        assert_eq!(delays, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(backoff.peek(), Backoff::MAX);
        backoff.reset();
        assert_eq!(backoff.peek(), Backoff::FIRST);
        for waited in 0..40 {
            let mut counted = Backoff::new();
            for _ in 0..waited {
                counted.next();
            }
            assert_eq!(Backoff::after(waited), counted.peek(), "after {waited}");
        }
    }
}
