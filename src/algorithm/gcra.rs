//! GCRA (generic cell rate algorithm): token-bucket admissions stored as one timestamp.

use std::time::Duration;

use super::Algorithm;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::Quota;

/// GCRA: the same admissions as a [`TokenBucket`](super::TokenBucket) of capacity `burst`
/// refilling `count / period`, with the whole state in one number, the *theoretical arrival time*
/// (TAT): the moment at which the bucket would be full again.
///
/// The only difference from the token bucket is rounding: one unit is earned every
/// `T = ceil(period / count)` microseconds ([`Quota::emission_interval_micros`]), so when `count`
/// does not divide the period the sustained rate is a hair *below* the quota, never above it.
/// In any span of `t` microseconds GCRA admits at most `burst + t / T` units.
///
/// # Exact arithmetic
///
/// `T` is the emission interval in µs and `cap = burst × T` (the "burst tolerance"). The state
/// is `tat` (µs; `0` = a fresh key, full). At `now`, for a request of `cost`:
///
/// ```text
/// base     = max(tat, now)
/// need     = cost × T
/// allowed  = cost == 0  or  base + need - now <= cap
/// after    = base + need - now            (if allowed, else base - now)   µs until full
/// remaining   = floor((cap - min(after, cap)) / T)
/// reset       = after µs
/// retry_after = base + need - now - cap µs            (if rejected)
/// apply:  tat = base + need
/// refund: tat = max(tat - need, now)                  (only if tat > now)
/// idle timeout = cap µs
/// ```
///
/// Every stored value is a time below `now + cap`; `cap` is below 2^53 for every quota that
/// [`Quota::validate`] accepts, so the Redis script mirrors this with plain Lua numbers.
///
/// A single timestamp cannot remember when the key was last seen, so a `now` earlier than a
/// previous request is measured against the TAT as it stands: it never earns anything (it is, if
/// anything, stricter than "no time elapsed"), and a cost of 0 is always allowed.
///
/// ```
/// use std::time::Duration;
/// use tollgate::algorithm::{Algorithm, Gcra};
/// use tollgate::Quota;
///
/// // Capacity 20 refilling 10 per second: a batch of 20, then one every 100 ms.
/// let gcra = Gcra::new(Quota::per_second(10).burst(20)).unwrap();
/// let mut tat = Default::default();
/// assert_eq!((0..25).filter(|_| gcra.check(&mut tat, 0, 1).allowed()).count(), 20);
/// let d = gcra.check(&mut tat, 50_000, 1); // 50 ms later: half a token
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(50)));
/// assert!(gcra.check(&mut tat, 100_000, 1).allowed());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    quota: Quota,
    /// Emission interval `T`, µs per unit.
    interval: u64,
    /// Burst tolerance `burst × T`, µs.
    cap: u64,
}

/// Per-key state of a [`Gcra`]: the theoretical arrival time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GcraState {
    /// The time (µs) at which the bucket is full again; any value `<= now` means full.
    pub tat: u64,
}

impl Gcra {
    /// A GCRA limiter of capacity `quota.burst_size()`, emitting one unit every
    /// [`quota.emission_interval_micros()`](Quota::emission_interval_micros).
    ///
    /// Returns a [`ConfigError`] when [`Quota::validate`] does.
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        quota.validate()?;
        let interval = quota.emission_interval_micros();
        // T = ceil(period / count) never exceeds the fixed-point unit `period / gcd`, which
        // `validate` keeps `burst × unit` below 2^53; check anyway so the bound is local.
        let cap = match quota.burst_size().checked_mul(interval) {
            Some(cap) if cap < crate::quota::MAX_EXACT => cap,
            _ => {
                return Err(ConfigError::new(
                    "quota.burst",
                    format!(
                        "burst {} × emission interval {interval} µs overflows exact arithmetic; lower the burst",
                        quota.burst_size()
                    ),
                ))
            }
        };
        Ok(Self {
            quota,
            interval,
            cap,
        })
    }

    /// The emission interval `T`: microseconds to earn one unit (rounded up).
    pub fn emission_interval_micros(&self) -> u64 {
        self.interval
    }

    #[inline]
    fn remaining(&self, after: u64) -> u64 {
        (self.cap - after.min(self.cap)) / self.interval
    }
}

impl Algorithm for Gcra {
    type State = GcraState;

    fn quota(&self) -> &Quota {
        &self.quota
    }

    fn capacity(&self) -> u64 {
        self.quota.burst_size()
    }

    #[inline]
    fn decide(&self, state: &GcraState, now: u64, cost: u64) -> Decision {
        let limit = self.quota.burst_size();
        let before = state.tat.max(now) - now;
        if cost > limit {
            return Decision::impossible(
                limit,
                self.remaining(before),
                Duration::from_micros(before),
            );
        }
        let after = before.saturating_add(cost * self.interval);
        if cost == 0 || after <= self.cap {
            Decision::allowed_with(limit, self.remaining(after), Duration::from_micros(after))
        } else {
            Decision::rejected(
                limit,
                self.remaining(before),
                Duration::from_micros(before),
                Duration::from_micros(after - self.cap),
            )
        }
    }

    #[inline]
    fn apply(&self, state: &mut GcraState, now: u64, cost: u64) {
        let need = cost.min(self.capacity()) * self.interval;
        state.tat = state.tat.max(now).saturating_add(need);
    }

    fn refund(&self, state: &mut GcraState, now: u64, cost: u64) {
        if state.tat > now {
            let need = cost.saturating_mul(self.interval);
            state.tat = state.tat.saturating_sub(need).max(now);
        }
    }

    fn idle_timeout_micros(&self) -> u64 {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::TokenBucket;

    const MS: u64 = 1_000;
    const S: u64 = 1_000_000;

    #[test]
    fn seed_batch_of_twenty_then_retry_in_50ms_then_full_after_3s() {
        let g = Gcra::new(Quota::per_second(10).burst(20)).unwrap();
        let mut s = GcraState::default();
        for i in 0..20 {
            let d = g.check(&mut s, 0, 1);
            assert!(d.allowed(), "request {i}");
            assert_eq!(d.remaining(), 19 - i);
            assert_eq!(d.reset(), Duration::from_millis(100 * (i + 1)));
        }
        let d = g.check(&mut s, 50 * MS, 1);
        assert!(!d.allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(50)));
        assert!(!g.decide(&s, 100 * MS - 1, 1).allowed());
        assert!(g.decide(&s, 100 * MS, 1).allowed());
        let d = g.decide(&s, 3 * S, 20);
        assert!(d.allowed(), "full again after 3 s");
        assert_eq!(d.remaining(), 0);
        assert_eq!(g.decide(&s, 3 * S, 0).remaining(), 20);
        assert_eq!(g.decide(&s, 3 * S, 0).reset(), Duration::ZERO);
    }

    #[test]
    fn seed_idle_minute_admits_twenty_of_thirty() {
        let g = Gcra::new(Quota::per_second(2).burst(20)).unwrap();
        let mut s = GcraState::default();
        // Busy at first, then idle for a minute: capacity caps what was banked.
        assert!(g.check(&mut s, 0, 20).allowed());
        let admitted = (0..30)
            .filter(|_| g.check(&mut s, 60 * S, 1).allowed())
            .count();
        assert_eq!(admitted, 20);
    }

    #[test]
    fn matches_token_bucket_when_interval_is_exact() {
        // 10/s divides 1 s exactly, so GCRA and the token bucket are the same limiter.
        let q = Quota::per_second(10).burst(7);
        let (g, tb) = (Gcra::new(q).unwrap(), TokenBucket::new(q).unwrap());
        let (mut gs, mut ts) = (GcraState::default(), Default::default());
        let mut now = 0;
        for i in 0u64..400 {
            now += (i * 7_919) % 130_000;
            let cost = i % 4;
            let (a, b) = (g.check(&mut gs, now, cost), tb.check(&mut ts, now, cost));
            assert_eq!(a, b, "request {i} at {now}");
        }
    }

    #[test]
    fn rounding_never_exceeds_the_quota() {
        // 3 per second: T = 333_334 µs, so the third unit after a drain takes 1_000_002 µs.
        let g = Gcra::new(Quota::per_second(3).burst(1)).unwrap();
        assert_eq!(g.emission_interval_micros(), 333_334);
        let mut s = GcraState::default();
        assert!(g.check(&mut s, 0, 1).allowed());
        assert!(g.check(&mut s, 333_334, 1).allowed());
        assert!(g.check(&mut s, 666_668, 1).allowed());
        let d = g.check(&mut s, 1_000_001, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        assert!(g.check(&mut s, 1_000_002, 1).allowed());
    }

    #[test]
    fn cost_zero_reports_without_charging() {
        let g = Gcra::new(Quota::per_second(1).burst(3)).unwrap();
        let mut s = GcraState::default();
        assert!(g.check(&mut s, 0, 3).allowed());
        let d = g.check(&mut s, 500 * MS, 0);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.reset(), Duration::from_millis(2_500));
        assert_eq!(
            g.decide(&s, S, 1).remaining(),
            0,
            "the cost-0 check charged nothing"
        );
        assert!(g.decide(&s, S, 1).allowed());
    }

    #[test]
    fn cost_over_capacity_is_impossible() {
        let g = Gcra::new(Quota::per_second(1).burst(5)).unwrap();
        let d = g.decide(&GcraState::default(), 0, 6);
        assert!(d.is_impossible());
        assert_eq!(d.remaining(), 5);
        assert!(g.decide(&GcraState::default(), 0, u64::MAX).is_impossible());
    }

    #[test]
    fn refund_restores_and_never_overfills() {
        let g = Gcra::new(Quota::per_second(1).burst(5)).unwrap();
        let mut s = GcraState::default();
        g.check(&mut s, 10 * S, 2);
        let before = g.decide(&s, 10 * S, 3);
        g.check(&mut s, 10 * S, 3);
        g.refund(&mut s, 10 * S, 3);
        assert_eq!(g.decide(&s, 10 * S, 3), before);
        g.refund(&mut s, 10 * S, 50);
        assert_eq!(s.tat, 10 * S, "refunded down to full, not beyond");
        assert_eq!(g.decide(&s, 10 * S, 0).remaining(), 5);
    }

    #[test]
    fn clock_going_backwards_earns_nothing() {
        let g = Gcra::new(Quota::per_second(1).burst(1)).unwrap();
        let mut s = GcraState::default();
        assert!(g.check(&mut s, 5 * S, 1).allowed());
        assert!(!g.check(&mut s, S, 1).allowed());
        assert!(g.check(&mut s, S, 0).allowed(), "cost 0 is always allowed");
        assert!(g.check(&mut s, 6 * S, 1).allowed());
    }

    #[test]
    fn idle_timeout_restores_a_fresh_key() {
        let g = Gcra::new(Quota::per_minute(6).burst(4)).unwrap();
        let mut s = GcraState::default();
        assert!(g.check(&mut s, 7, 4).allowed());
        let later = 7 + g.idle_timeout_micros();
        assert_eq!(
            g.decide(&s, later, 4),
            g.decide(&GcraState::default(), later, 4)
        );
        assert_ne!(
            g.decide(&s, later - 1, 0),
            g.decide(&GcraState::default(), later - 1, 0)
        );
    }

    #[test]
    fn extreme_times_do_not_panic() {
        let g = Gcra::new(Quota::per_second(10).burst(20)).unwrap();
        let mut s = GcraState::default();
        g.check(&mut s, u64::MAX - 1, 20);
        g.check(&mut s, u64::MAX, 20);
        g.refund(&mut s, u64::MAX, 20);
        g.decide(&s, 0, 20);
    }
}
