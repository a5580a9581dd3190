//! The retry budget: retries to an upstream are at most a share of its recent first attempts,
//! plus a small allowance, as Finagle's `RetryBudget` and gRPC's retry throttling keep them.

use std::time::Duration;

use crate::ConfigError;

/// The most a [`RetryBudget`]'s window can be, in seconds.
const MAX_WINDOW_SECS: u64 = 60;
/// The largest [`RetryBudget::min_per_second`].
const MAX_MIN_PER_SECOND: u32 = 1_000;

/// How many retries the layer may send to one upstream: over the last
/// [`window`](Self::window) (10 s by default), retries never exceed
/// [`percent`](Self::percent) (20 by default) percent of the first attempts sent to it plus
/// [`min_per_second`](Self::min_per_second) (1 by default) × the window in seconds. With the
/// defaults: at most 20% of the first attempts of the last 10 s, plus 10.
///
/// A refused request whose retry the budget does not cover is returned as it is, like one with
/// no attempts left. So an upstream that refuses everything gets at most 1.2 requests per call
/// (plus the 10), not [`max_attempts`](super::OutboundLayerBuilder::max_attempts) per call,
/// however many callers retry at once.
///
/// The window is counted in whole seconds of the layer's clock: "the last 10 s" is the current
/// second and the 9 before it. A retry is counted when it is decided, before its backoff.
///
/// ```
/// use std::time::Duration;
/// use tollgate::outbound::{OutboundLayer, RetryBudget};
///
/// // Retries up to half of the last 30 s's first attempts, plus 2 a second.
/// let layer = OutboundLayer::builder()
///     .retry_budget(RetryBudget::new().percent(50).min_per_second(2).window(Duration::from_secs(30)))
///     .build()
///     .unwrap();
/// # drop(layer);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudget {
    percent: u32,
    min_per_second: u32,
    window_secs: u64,
}

impl Default for RetryBudget {
    /// 20 percent of first attempts, 1 retry a second, over 10 s.
    fn default() -> Self {
        Self {
            percent: 20,
            min_per_second: 1,
            window_secs: 10,
        }
    }
}

impl RetryBudget {
    /// The default budget: 20 percent, 1 a second, 10 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// Retries may be up to `percent` percent of the window's first attempts (0 to 100;
    /// default 20).
    #[must_use]
    pub fn percent(mut self, percent: u32) -> Self {
        self.percent = percent;
        self
    }

    /// Retries allowed on top of the percentage: `per_second` × the window in seconds (0 to
    /// 1000; default 1, so 10 per 10 s), so a caller with few calls may still retry.
    #[must_use]
    pub fn min_per_second(mut self, per_second: u32) -> Self {
        self.min_per_second = per_second;
        self
    }

    /// The span retries and first attempts are counted over, in whole seconds (1 s to 60 s;
    /// default 10 s).
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window_secs = window.as_secs().max(u64::from(window.subsec_nanos() > 0));
        self
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.percent > 100 {
            return Err(ConfigError::new(
                "outbound.retry_budget.percent",
                format!(
                    "a retry budget of {}% of first attempts is over 100%: use e.g. RetryBudget::new().percent(20)",
                    self.percent
                ),
            ));
        }
        if self.min_per_second > MAX_MIN_PER_SECOND {
            return Err(ConfigError::new(
                "outbound.retry_budget.min_per_second",
                format!(
                    "min_per_second {} is over {MAX_MIN_PER_SECOND}: use e.g. RetryBudget::new().min_per_second(1)",
                    self.min_per_second
                ),
            ));
        }
        if self.window_secs == 0 || self.window_secs > MAX_WINDOW_SECS {
            return Err(ConfigError::new(
                "outbound.retry_budget.window",
                format!(
                    "the retry budget's window must be 1 s to {MAX_WINDOW_SECS} s: use e.g. RetryBudget::new().window(Duration::from_secs(10))"
                ),
            ));
        }
        Ok(())
    }
}

/// One second's counts.
#[derive(Debug, Clone, Copy, Default)]
struct Second {
    /// The clock second these counts are for.
    at: u64,
    firsts: u64,
    retries: u64,
}

/// One upstream's counts over a [`RetryBudget`]'s window: a ring of one-second buckets.
#[derive(Debug, Default)]
pub(crate) struct BudgetWindow {
    seconds: Vec<Second>,
}

impl BudgetWindow {
    /// The bucket of clock second `sec`, emptied if it held an older second.
    fn bucket(&mut self, budget: &RetryBudget, sec: u64) -> &mut Second {
        let n = budget.window_secs as usize;
        if self.seconds.len() != n {
            self.seconds = vec![Second::default(); n];
        }
        let b = &mut self.seconds[(sec % budget.window_secs) as usize];
        if b.at != sec {
            *b = Second {
                at: sec,
                ..Second::default()
            };
        }
        b
    }

    /// Counts a first attempt at clock time `now` (µs).
    pub(crate) fn first(&mut self, budget: &RetryBudget, now: u64) {
        let b = self.bucket(budget, now / 1_000_000);
        b.firsts = b.firsts.saturating_add(1);
    }

    /// Counts a retry at `now` if the budget covers it; whether it does.
    pub(crate) fn retry(&mut self, budget: &RetryBudget, now: u64) -> bool {
        let sec = now / 1_000_000;
        self.bucket(budget, sec);
        let oldest = sec.saturating_sub(budget.window_secs - 1);
        let (firsts, retries) = self
            .seconds
            .iter()
            .filter(|b| b.at >= oldest && b.at <= sec)
            .fold((0u64, 0u64), |(f, r), b| {
                (f.saturating_add(b.firsts), r.saturating_add(b.retries))
            });
        let allowed = firsts.saturating_mul(u64::from(budget.percent)) / 100
            + u64::from(budget.min_per_second) * budget.window_secs;
        if retries >= allowed {
            return false;
        }
        let b = self.bucket(budget, sec);
        b.retries += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn retries_are_a_share_of_first_attempts_plus_the_minimum() {
        let budget = RetryBudget::default();
        let mut w = BudgetWindow::default();
        // No first attempts: the minimum alone, 10 per 10 s.
        assert_eq!((0..50).filter(|_| w.retry(&budget, 0)).count(), 10);
        // 100 first attempts add 20.
        for _ in 0..100 {
            w.first(&budget, S);
        }
        assert_eq!((0..50).filter(|_| w.retry(&budget, S)).count(), 20);
        // Second 0 has left the window at 10 s: its 10 retries are no longer counted.
        assert_eq!((0..50).filter(|_| w.retry(&budget, 10 * S)).count(), 10);
        // At 11 s the first attempts of second 1 have left too: the 10 of second 10 use up
        // the minimum.
        assert_eq!((0..50).filter(|_| w.retry(&budget, 11 * S)).count(), 0);
        // At 20 s everything has left it.
        assert_eq!((0..50).filter(|_| w.retry(&budget, 20 * S)).count(), 10);
    }

    #[test]
    fn bounds_are_checked() {
        assert!(RetryBudget::new().validate().is_ok());
        assert!(RetryBudget::new().percent(100).validate().is_ok());
        let field = |b: RetryBudget| b.validate().unwrap_err().field();
        assert_eq!(
            field(RetryBudget::new().percent(101)),
            "outbound.retry_budget.percent"
        );
        assert_eq!(
            field(RetryBudget::new().min_per_second(1_001)),
            "outbound.retry_budget.min_per_second"
        );
        assert_eq!(
            field(RetryBudget::new().window(Duration::ZERO)),
            "outbound.retry_budget.window"
        );
        assert_eq!(
            field(RetryBudget::new().window(Duration::from_secs(61))),
            "outbound.retry_budget.window"
        );
        assert!(RetryBudget::new()
            .window(Duration::from_millis(500))
            .validate()
            .is_ok());
    }
}
