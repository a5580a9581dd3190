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
    /// Units the quota refills in one `ttl`, at least 1.
    pub(crate) refill_in_ttl: u64,
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
        Self {
            leasable,
            limit,
            max_units,
            ttl,
            window,
            refill_in_ttl,
        }
    }

    /// The lease to ask for when `demand` units were asked for over the last lease lifetime and
    /// this request costs `cost`: at least `cost`, at most `max_units` (or `cost` if larger). A
    /// cold key (demand of one request) asks for its cost only: a plain check.
    pub(crate) fn want(&self, demand: u64, cost: u64) -> u64 {
        demand.clamp(cost, self.max_units.max(cost))
    }

    /// The fewest units worth a lease. A key Redis refused last time waits (locally) until half
    /// its lease fits, at most what refills in one lease lifetime, so a hot key refused on N
    /// instances costs Redis about N calls per lease lifetime; otherwise the cost.
    pub(crate) fn min(&self, want: u64, cost: u64, refused_before: bool) -> u64 {
        if refused_before {
            (want / 2).min(self.refill_in_ttl).max(cost)
        } else {
            cost
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

    /// Units asked for over about one lifetime.
    pub(crate) fn estimate(&self) -> u64 {
        self.current.max(self.previous)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PolicyName, Quota};

    fn plan(alg: AlgorithmKind, q: Quota, share: f64) -> LeasePlan {
        LeasePlan::of(&LimitSpec::new(PolicyName::new("t"), q, alg), share)
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
        assert_eq!(p.min(20, 1, false), 1);
        assert_eq!(p.min(20, 1, true), 10);
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
    fn demand_follows_the_last_two_lifetimes() {
        let mut d = Demand::default();
        for i in 0..50 {
            d.record(i * 1_000, 1_000_000, 1);
        }
        assert_eq!(d.estimate(), 50);
        d.record(1_500_000, 1_000_000, 1);
        assert_eq!(d.estimate(), 50, "the previous lifetime still counts");
        d.record(5_000_000, 1_000_000, 1);
        assert_eq!(d.estimate(), 1, "an idle key goes cold");
    }
}
