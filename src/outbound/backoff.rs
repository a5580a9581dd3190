//! Exponential backoff with full jitter between attempts.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The smallest base a [`Backoff`] can have.
const MIN_BACKOFF_BASE: Duration = Duration::from_millis(1);
/// The largest max a [`Backoff`] can have: 10 minutes.
const MAX_BACKOFF: Duration = Duration::from_secs(600);

/// Exponential backoff with full jitter: before attempt `n + 1`, wait a uniformly random time
/// in `[0, min(max, base × 2^(n-1))]` (the "full jitter" of the AWS architecture blog), so
/// callers refused together do not come back together. An upstream's own wait (`Retry-After`)
/// applies on top: the retry waits for whichever is later.
///
/// The layer's builder accepts a base of 1 ms or more, up to the max, and a max of at most
/// 600 s.
///
/// ```
/// use std::time::Duration;
/// use tollgate::outbound::Backoff;
///
/// let backoff = Backoff::exponential(Duration::from_millis(100)).max(Duration::from_secs(1));
/// assert_eq!(backoff.ceiling(1), Duration::from_millis(100));
/// assert_eq!(backoff.ceiling(3), Duration::from_millis(400));
/// assert_eq!(backoff.ceiling(10), Duration::from_secs(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
}

impl Default for Backoff {
    /// 100 ms doubling up to 10 s.
    fn default() -> Self {
        Self {
            base: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// Ceilings of `base`, `2 × base`, `4 × base`, ... up to 10 s (see [`max`](Self::max)).
    pub fn exponential(base: Duration) -> Self {
        Self {
            base,
            ..Self::default()
        }
    }

    /// The largest ceiling.
    #[must_use]
    pub fn max(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }

    /// The first ceiling.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The upper bound of the wait after failed attempt `attempt` (1 is the first).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.base
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// Checks the base is 1 ms to the max, and the max at most [`MAX_BACKOFF`].
    pub(crate) fn validate(&self) -> Result<(), crate::ConfigError> {
        if self.base < MIN_BACKOFF_BASE || self.base > self.max || self.max > MAX_BACKOFF {
            return Err(crate::ConfigError::new(
                "backoff",
                format!(
                    "backoff base {:?} must be at least {MIN_BACKOFF_BASE:?} and at most its max {:?}, the max at most {MAX_BACKOFF:?}: use e.g. Backoff::exponential(Duration::from_millis(100)).max(Duration::from_secs(10))",
                    self.base, self.max
                ),
            ));
        }
        Ok(())
    }
}

/// A shared source of jitter: splitmix64 over an atomic counter, seeded per process.
#[derive(Debug)]
pub(crate) struct Jitter(AtomicU64);

impl Jitter {
    pub(crate) fn new() -> Self {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        Self(AtomicU64::new(h.finish()))
    }

    fn next(&self) -> u64 {
        let mut z = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform duration in `[0, ceiling]`, to the microsecond.
    pub(crate) fn up_to(&self, ceiling: Duration) -> Duration {
        let micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        if micros == 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(self.next() % micros.saturating_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_and_saturate() {
        let b = Backoff::default();
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(2), Duration::from_millis(200));
        assert_eq!(b.ceiling(8), Duration::from_secs(10));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(10));
        let huge = Backoff::exponential(Duration::from_secs(u64::MAX / 4)).max(Duration::MAX);
        assert_eq!(huge.ceiling(40), Duration::MAX);
        assert!(Backoff::exponential(Duration::ZERO).validate().is_err());
        assert!(Backoff::exponential(Duration::from_secs(20))
            .validate()
            .is_err());
        assert!(Backoff::exponential(Duration::from_micros(999))
            .validate()
            .is_err());
        assert!(Backoff::exponential(Duration::from_millis(1))
            .max(Duration::from_secs(601))
            .validate()
            .is_err());
        assert!(Backoff::exponential(Duration::from_millis(1))
            .max(Duration::from_secs(600))
            .validate()
            .is_ok());
    }

    #[test]
    fn jitter_is_full_and_bounded() {
        let j = Jitter::new();
        let ceiling = Duration::from_millis(400);
        let draws: Vec<_> = (0..2000).map(|_| j.up_to(ceiling)).collect();
        assert!(draws.iter().all(|d| *d <= ceiling));
        // Full jitter: draws cover the whole range, low and high quarters alike.
        assert!(draws.iter().any(|d| *d < Duration::from_millis(100)));
        assert!(draws.iter().any(|d| *d > Duration::from_millis(300)));
        assert_eq!(j.up_to(Duration::ZERO), Duration::ZERO);
    }
}
