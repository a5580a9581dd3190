//! How each limit leases: whether it can, the largest lease, how long a lease lives, and how
//! big the next one should be for a key's observed demand.

use crate::algorithm::AlgorithmKind;
use crate::store::{LimitSpec, PlanQuota};

/// The longest a lease lives.
pub const MAX_LEASE_TTL_MICROS: u64 = 1_000_000;
/// The shortest a lease lives.
const MIN_LEASE_TTL_MICROS: u64 = 1_000;

/// One limit's leasing parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeasePlan {
    /// Whether the limit leases (else every check goes to Redis).
    pub(crate) leasable: bool,
    /// `Decision::limit` (the capacity).
    pub(crate) limit: u64,
    /// The most units one instance holds for one key.
    pub(crate) max_units: u64,
    /// How long a lease lives (µs): the time the quota takes to refill `max_units`, at most
    /// [`MAX_LEASE_TTL_MICROS`].
    pub(crate) ttl: u64,
    /// Windows (fixed, sliding counter): the window length (µs); a lease ends with its window.
    pub(crate) window: Option<u64>,
    /// Windows: how many windows, counting the one it was spent in, what a key spent still
    /// weighs in: 1 for the fixed window, 2 for the sliding window counter (whose estimate
    /// weighs the previous window's count into the current one).
    pub(crate) weighs: u64,
    /// Units the quota refills in one `ttl`, at least 1.
    pub(crate) refill_in_ttl: u64,
    /// Buckets: µs the quota takes to refill one unit (period / count, rounded up).
    pub(crate) unit_micros: Option<u64>,
}

impl LeasePlan {
    /// The plan of `spec` with leases of at most `max_lease` (in (0, 1]) of its capacity.
    pub(crate) fn of(spec: &LimitSpec, max_lease: f64) -> Self {
        let q = spec.quota();
        let limit = PlanQuota::new(spec.algorithm(), *q).map_or(q.count(), |p| p.capacity());
        let leasable = match spec.algorithm() {
            AlgorithmKind::TokenBucket | AlgorithmKind::LeakyBucket | AlgorithmKind::Gcra => true,
            AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow => q.calendar().is_none(),
            // Entries recorded at lease time would leave the log before the units are used.
            _ => false,
        };
        let max_units = ((limit as f64 * max_lease).floor() as u64).clamp(1, limit.max(1));
        let period = q.period_micros().max(1);
        let count = q.count().max(1);
        let refill = (u128::from(max_units) * u128::from(period) / u128::from(count))
            .min(u128::from(MAX_LEASE_TTL_MICROS)) as u64;
        let ttl = refill.clamp(MIN_LEASE_TTL_MICROS, MAX_LEASE_TTL_MICROS);
        let refill_in_ttl =
            ((u128::from(count) * u128::from(ttl) / u128::from(period)) as u64).max(1);
        let window = matches!(
            spec.algorithm(),
            AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
        )
        .then_some(period);
        let unit_micros = window.is_none().then(|| period.div_ceil(count));
        let weighs = if spec.algorithm() == AlgorithmKind::SlidingWindow {
            2
        } else {
            1
        };
        Self {
            leasable,
            limit,
            max_units,
            ttl,
            window,
            weighs,
            refill_in_ttl,
            unit_micros,
        }
    }

    /// Buckets: after a lease that left fewer than `cost` units in Redis, how long until it can
    /// hold `wait` units (others only take; refunds aside): asking earlier is pointless. `None`
    /// when the lease left enough for a request, and for windows.
    pub(crate) fn dry_for(&self, remaining: u64, cost: u64, wait: u64) -> Option<u64> {
        let unit = self.unit_micros?;
        if remaining >= cost {
            return None;
        }
        let missing = wait.checked_sub(remaining).filter(|m| *m > 0)?;
        Some(missing.saturating_mul(unit).min(self.ttl))
    }

    /// The lease to ask for when `demand` units were asked for over the last lease lifetime and
    /// this request costs `cost`: at least `cost`, at most `max_units` (or `cost` if larger). A
    /// cold key (demand of one request) asks for its cost only: a plain check.
    pub(crate) fn want(&self, demand: u64, cost: u64) -> u64 {
        demand.clamp(cost, self.max_units.max(cost))
    }

    /// How many units a refused key waits for (locally) before it asks again: half the lease it
    /// wants, at most what refills in one lease lifetime, at least its cost. A hot key refused
    /// on N instances so costs Redis about N calls per lease lifetime, and a key freed elsewhere
    /// is noticed at most one lease lifetime late.
    pub(crate) fn wait(&self, want: u64, cost: u64) -> u64 {
        (want / 2).min(self.refill_in_ttl).max(cost)
    }

    /// Until when (Redis time, µs) what a key had spent at Redis time `at` may be charged again
    /// after Redis lost the key: for the fixed window the end of `at`'s window (the next one
    /// starts from nothing anyway); for the sliding window counter the end of the window after
    /// `at`'s, through which its estimate still weighs `at`'s window (the lease script charges
    /// the units at `at` and the algorithm weighs them); 0 (no end) for the buckets, whose
    /// refill since `at` the algorithm computes.
    pub(crate) fn known_until(&self, at: u64) -> u64 {
        match self.window {
            Some(period) => (at / period)
                .saturating_add(self.weighs)
                .saturating_mul(period),
            None => 0,
        }
    }

    /// How long (µs) a lease taken at Redis time `now` may be used: `ttl`, and for windows no
    /// further than the end of the window holding `now`.
    pub(crate) fn lifetime(&self, now: u64) -> u64 {
        match self.window {
            Some(period) => self.ttl.min(period - now % period),
            None => self.ttl,
        }
    }
}

/// Demand of one key: units asked for in the current and the previous lease lifetime.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Demand {
    start: u64,
    current: u64,
    previous: u64,
}

impl Demand {
    /// Records `cost` units asked for at `now`, lifetimes of `ttl` µs.
    pub(crate) fn record(&mut self, now: u64, ttl: u64, cost: u64) {
        let elapsed = now.saturating_sub(self.start);
        if elapsed >= ttl {
            self.previous = if elapsed >= 2 * ttl { 0 } else { self.current };
            self.current = 0;
            self.start = now;
        }
        self.current = self.current.saturating_add(cost);
    }

    /// Units asked for over about one lifetime (`ttl` µs) at `now`: the previous lifetime's, or
    /// the current one's so far extrapolated to a whole lifetime (from at least a tenth of it),
    /// whichever is larger. A key seen once is cold: its one request.
    pub(crate) fn estimate(&self, now: u64, ttl: u64) -> u64 {
        if self.previous == 0 && self.current <= 1 {
            return self.current;
        }
        let elapsed = now.saturating_sub(self.start).max(ttl / 10).max(1);
        let rate = (u128::from(self.current) * u128::from(ttl) / u128::from(elapsed))
            .min(u128::from(u64::MAX)) as u64;
        rate.max(self.previous)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Name, Quota};

    fn plan(alg: AlgorithmKind, q: Quota, share: f64) -> LeasePlan {
        LeasePlan::of(&LimitSpec::new(Name::new("t"), q, alg), share)
    }

    #[test]
    fn the_example_limit_leases_a_fifth_for_a_second() {
        let p = plan(
            AlgorithmKind::TokenBucket,
            Quota::per_second(10).burst(100),
            0.2,
        );
        assert!(p.leasable);
        assert_eq!((p.limit, p.max_units), (100, 20));
        assert_eq!(p.ttl, 1_000_000, "20 units refill in 2 s: capped at 1 s");
        assert_eq!(p.refill_in_ttl, 10);
        assert_eq!(p.want(1, 1), 1, "a cold key asks for its cost");
        assert_eq!(p.want(500, 1), 20);
        assert_eq!(p.want(3, 5), 5);
        assert_eq!(p.wait(20, 1), 10);
        assert_eq!(p.wait(1, 1), 1, "a cold key waits for its cost");
        assert_eq!(p.wait(20, 15), 15);
    }

    #[test]
    fn a_bucket_left_dry_is_not_asked_again_before_it_can_hold_the_wait() {
        let p = plan(
            AlgorithmKind::TokenBucket,
            Quota::per_second(10).burst(100),
            0.25,
        );
        assert_eq!(p.dry_for(0, 1, 10), Some(1_000_000));
        assert_eq!(p.dry_for(2, 3, 10), Some(800_000));
        assert_eq!(p.dry_for(4, 1, 10), None, "what is left is leased");
        let w = plan(AlgorithmKind::FixedWindow, Quota::per_second(100), 0.5);
        assert_eq!(w.dry_for(0, 1, 10), None, "windows: not estimated");
    }

    #[test]
    fn which_algorithms_lease() {
        let q = Quota::per_minute(600);
        for (alg, leases) in [
            (AlgorithmKind::TokenBucket, true),
            (AlgorithmKind::LeakyBucket, true),
            (AlgorithmKind::Gcra, true),
            (AlgorithmKind::FixedWindow, true),
            (AlgorithmKind::SlidingWindow, true),
            (AlgorithmKind::SlidingLog, false),
        ] {
            assert_eq!(plan(alg, q, 0.1).leasable, leases, "{alg:?}");
        }
    }

    #[test]
    fn a_window_lease_ends_with_its_window() {
        let p = plan(AlgorithmKind::FixedWindow, Quota::per_second(100), 0.5);
        assert_eq!(p.window, Some(1_000_000));
        assert_eq!(p.ttl, 500_000);
        assert_eq!(p.lifetime(10_900_000), 100_000);
        assert_eq!(p.lifetime(10_000_000), 500_000);
    }

    #[test]
    fn what_a_key_spent_is_charged_again_while_its_window_weighs() {
        let w = plan(AlgorithmKind::FixedWindow, Quota::per_second(100), 0.5);
        assert_eq!(w.known_until(10_250_000), 11_000_000);
        assert_eq!(w.known_until(11_000_000), 12_000_000);
        let s = plan(AlgorithmKind::SlidingWindow, Quota::per_minute(60), 0.5);
        assert_eq!(
            s.known_until(61_000_000),
            180_000_000,
            "the sliding estimate weighs the window into the next one"
        );
        assert_eq!(s.known_until(59_900_000), 120_000_000);
        assert_eq!(s.known_until(u64::MAX), u64::MAX, "no overflow");
        let b = plan(AlgorithmKind::Gcra, Quota::per_second(10), 0.5);
        assert_eq!(
            b.known_until(u64::MAX),
            0,
            "buckets: no end, the refill counts"
        );
        assert_eq!(w.known_until(u64::MAX), u64::MAX, "no overflow");
    }

    #[test]
    fn demand_follows_the_last_two_lifetimes() {
        let ttl = 1_000_000;
        let mut d = Demand::default();
        d.record(0, ttl, 1);
        assert_eq!(d.estimate(0, ttl), 1, "a key seen once is cold");
        for i in 1..50 {
            d.record(i * 1_000, ttl, 1);
        }
        assert_eq!(
            d.estimate(49_000, ttl),
            500,
            "50 in the first 100 ms: 500 per lifetime"
        );
        assert_eq!(d.estimate(500_000, ttl), 100, "50 in half a lifetime");
        d.record(1_500_000, ttl, 1);
        assert_eq!(
            d.estimate(1_500_000, ttl),
            50,
            "the previous lifetime still counts"
        );
        d.record(5_000_000, ttl, 1);
        assert_eq!(d.estimate(5_000_000, ttl), 1, "an idle key goes cold");
    }
}
