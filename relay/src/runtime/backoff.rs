//! Exponential backoff with jitter for reconnects, so many workers that lost the same
//! service do not hammer it in lockstep when it returns.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: 0,
        }
    }

    /// The next delay: base × 2^failures, capped, then scaled by a random factor in [0.5, 1].
    pub fn next_delay(&mut self) -> Duration {
        let exp = self.base.saturating_mul(1u32 << self.failures.min(20));
        self.failures = self.failures.saturating_add(1);
        let capped = exp.min(self.max);
        capped.mul_f64(rand::rng().random_range(0.5..=1.0))
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(30))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let first = backoff.next_delay();
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
        for _ in 0..10 {
            assert!(backoff.next_delay() <= Duration::from_secs(2));
        }
        assert!(backoff.next_delay() >= Duration::from_secs(1));
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }
}
