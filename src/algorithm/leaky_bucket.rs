//! Leaky bucket as a meter: a queue of `burst` units draining at `count / period`.

use std::time::Duration;

use super::{Algorithm, TokenBucket, TokenBucketState};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::Quota;

/// Leaky bucket (as a meter): each admitted request pours its cost into a queue of capacity
/// `burst` that drains at `count / period`; a request that would overflow the queue is refused.
///
/// As a meter it admits exactly what a [`TokenBucket`](super::TokenBucket) of the same quota
/// admits — it is the same arithmetic read from the other end (the level of the queue instead
/// of the tokens left). What it adds is [`queue_delay`](Self::queue_delay): how long an admitted
/// request would wait if the queue were real, which is what a *shaper* (smoothing output to the
/// drain rate instead of passing bursts through) sleeps for.
///
/// # Exact arithmetic
///
/// The level is fixed-point exactly like the token bucket's deficit: one unit is
/// `unit = period_us / g` steps and each microsecond drains `per = count / g` steps, where
/// `g = gcd(period_us, count)` ([`Quota::fixed_point`]); the capacity is `cap = burst × unit`.
/// The zero state is an empty queue (a fresh key). At `now`, for a request of `cost`:
///
/// ```text
/// elapsed  = max(0, now - last)
/// level'   = max(0, min(level, 2^53 - 1) - elapsed × per)
/// need     = cost × unit
/// allowed  = cost == 0  or  level' + need <= cap
/// after    = level' + need                  (if allowed, else level')
/// remaining   = floor((cap - min(after, cap)) / unit)
/// reset       = ceil(after / per) µs         (until the queue is empty)
/// retry_after = ceil((level' + need - cap) / per) µs   (if rejected)
/// queue_delay = ceil(level' / per) µs        (the queue ahead of the request drains)
/// apply:  level = min(max(cap, level'), level' + need); last = max(last, now)
/// refund (of a reservation of cost at `at`, applied at now), as the token bucket's:
///         last' = max(last, now);  give = max(0, need - (last' - at) × per)
///         level = level' - min(level', give); last = last'
///         (what drained since `at` stays: never more room than without the reservation)
/// idle timeout = ceil(cap / per) µs
/// ```
///
/// # Plan changes
///
/// As the token bucket's (the level is its deficit; see its **Plan changes**):
/// [`rebase`](Algorithm::rebase) from a queue `o` to this one, `n`, at `now` carries the queued
/// units that fit `n`'s capacity, rounded up to whole units, and the units above it as the time
/// `o` takes to drain them: the queue is full at `n` and nothing drains before that lock ends
/// (`last` ahead of `now`; [`queue_delay`](LeakyBucket::queue_delay) and the waits reported
/// include it). Nothing changes when both have the same arithmetic.
///
/// ```
/// use tollgate::algorithm::{Algorithm, LeakyBucket};
/// use tollgate::Quota;
///
/// let small = LeakyBucket::new(Quota::per_second(1).burst(4)).unwrap();
/// let large = LeakyBucket::new(Quota::per_second(10).burst(40)).unwrap();
/// let mut state = Default::default();
/// assert!(small.check(&mut state, 0, 3).allowed());
/// large.rebase(&small, &mut state, 500_000); // 2.5 queued, carried as 3
/// assert_eq!(large.decide(&state, 500_000, 0).remaining(), 37);
/// ```
///
/// ```
/// use std::time::Duration;
/// use tollgate::algorithm::{Algorithm, LeakyBucket};
/// use tollgate::Quota;
///
/// // A queue of 3 draining one per second.
/// let bucket = LeakyBucket::new(Quota::per_second(1).burst(3)).unwrap();
/// let mut state = Default::default();
/// let mut delays = Vec::new();
/// for _ in 0..3 {
///     delays.push(bucket.queue_delay(&state, 0));
///     assert!(bucket.check(&mut state, 0, 1).allowed());
/// }
/// assert_eq!(delays, [0, 1, 2].map(Duration::from_secs)); // shaped to the drain rate
/// let d = bucket.check(&mut state, 0, 1);
/// assert_eq!(d.retry_after(), Some(Duration::from_secs(1))); // the queue is full
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakyBucket {
    /// The same arithmetic: a queue's level is a token bucket's deficit.
    bucket: TokenBucket,
}

/// Per-key state of a [`LeakyBucket`]: the queue's level (fixed-point) and the last update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LeakyBucketState {
    /// Fixed-point steps queued (0 = empty, a fresh key).
    pub level: u64,
    /// Time of the last charge, µs.
    pub last: u64,
}

impl LeakyBucket {
    /// A leaky bucket holding `quota.burst_size()` units, draining `quota.count()` per
    /// `quota.period()`.
    ///
    /// Returns a [`ConfigError`] when [`Quota::validate`] does.
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        quota.validate()?;
        super::reject_calendar(&quota, "leaky_bucket")?;
        Ok(Self {
            bucket: TokenBucket::new(quota)?,
        })
    }

    /// How long a request admitted at `now` would wait in a shaping queue before it is
    /// released: the time for the queue ahead of it to drain, `ceil(level' / per)`.
    ///
    /// Call it with the state *before* [`apply`](Algorithm::apply) at the same `now`. Zero for an
    /// empty queue; at most `(burst - cost) / rate` for an admitted request of `cost`, so a
    /// shaper never holds a request longer than the burst takes to drain. Successive requests
    /// are released one cost's drain time apart: output is smoothed to the rate.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::algorithm::{Algorithm, LeakyBucket};
    /// use tollgate::Quota;
    ///
    /// let bucket = LeakyBucket::new(Quota::per_second(10).burst(50)).unwrap();
    /// let mut state = Default::default();
    /// assert!(bucket.check(&mut state, 0, 5).allowed());
    /// // Half a second's worth is queued ahead; 200 ms later, 300 ms of it is left.
    /// assert_eq!(bucket.queue_delay(&state, 200_000), Duration::from_millis(300));
    /// ```
    pub fn queue_delay(&self, state: &LeakyBucketState, now: u64) -> Duration {
        let level = self.bucket.deficit_at(&as_bucket(state), now);
        // Nothing drains before `last` (a lock carried by a plan change, or an earlier clock).
        let lock = state.last.saturating_sub(now);
        Duration::from_micros(lock.saturating_add(self.bucket.micros_to_earn(level)))
    }
}

/// A queue's state read as the token bucket's: the level is the deficit.
#[inline]
fn as_bucket(state: &LeakyBucketState) -> TokenBucketState {
    TokenBucketState {
        deficit: state.level,
        last: state.last,
    }
}

#[inline]
fn from_bucket(state: TokenBucketState) -> LeakyBucketState {
    LeakyBucketState {
        level: state.deficit,
        last: state.last,
    }
}

impl Algorithm for LeakyBucket {
    type State = LeakyBucketState;

    fn quota(&self) -> &Quota {
        self.bucket.quota()
    }

    fn capacity(&self) -> u64 {
        self.bucket.capacity()
    }

    #[inline]
    fn decide(&self, state: &LeakyBucketState, now: u64, cost: u64) -> Decision {
        self.bucket.decide(&as_bucket(state), now, cost)
    }

    #[inline]
    fn apply(&self, state: &mut LeakyBucketState, now: u64, cost: u64) {
        let mut bucket = as_bucket(state);
        self.bucket.apply(&mut bucket, now, cost);
        *state = from_bucket(bucket);
    }

    fn refund(&self, state: &mut LeakyBucketState, reserved_at: u64, now: u64, cost: u64) {
        let mut bucket = as_bucket(state);
        self.bucket.refund(&mut bucket, reserved_at, now, cost);
        *state = from_bucket(bucket);
    }

    fn rebase(&self, from: &Self, state: &mut LeakyBucketState, now: u64) {
        let mut bucket = as_bucket(state);
        self.bucket.rebase(&from.bucket, &mut bucket, now);
        *state = from_bucket(bucket);
    }

    fn idle_timeout_micros(&self) -> u64 {
        self.bucket.idle_timeout_micros()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;
    const S: u64 = 1_000_000;

    #[test]
    fn seed_batch_of_twenty_then_retry_in_50ms_then_empty_after_3s() {
        let b = LeakyBucket::new(Quota::per_second(10).burst(20)).unwrap();
        let mut s = LeakyBucketState::default();
        for i in 0..20 {
            let d = b.check(&mut s, 0, 1);
            assert!(d.allowed(), "request {i}");
            assert_eq!(d.remaining(), 19 - i);
        }
        let d = b.check(&mut s, 50 * MS, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(50)));
        assert_eq!(d.reset(), Duration::from_millis(1_950));
        let d = b.decide(&s, 3 * S, 20);
        assert!(d.allowed(), "drained after 3 s");
        assert_eq!(b.queue_delay(&s, 3 * S), Duration::ZERO);
    }

    #[test]
    fn seed_idle_minute_admits_twenty_of_thirty() {
        let b = LeakyBucket::new(Quota::per_second(2).burst(20)).unwrap();
        let mut s = LeakyBucketState::default();
        assert!(b.check(&mut s, 0, 20).allowed());
        let admitted = (0..30)
            .filter(|_| b.check(&mut s, 60 * S, 1).allowed())
            .count();
        assert_eq!(admitted, 20);
    }

    #[test]
    fn queue_delay_spaces_requests_at_the_rate() {
        // 3 per second does not divide a second: the fixed point keeps delays exact.
        let b = LeakyBucket::new(Quota::per_second(3).burst(4)).unwrap();
        let mut s = LeakyBucketState::default();
        let mut delays = Vec::new();
        while b.decide(&s, 0, 1).allowed() {
            delays.push(b.queue_delay(&s, 0).as_micros());
            b.apply(&mut s, 0, 1);
        }
        assert_eq!(delays, [0, 333_334, 666_667, 1_000_000]);
        // The last admitted waited (burst - cost) / rate = 1 s; the full queue would hold a
        // fifth request for 4 / 3 s, which is why it is refused instead.
        assert_eq!(b.queue_delay(&s, 0), Duration::from_micros(1_333_334));
        assert!(!b.decide(&s, 0, 1).allowed());
    }

    #[test]
    fn cost_zero_and_impossible_costs() {
        let b = LeakyBucket::new(Quota::per_second(1).burst(5)).unwrap();
        let mut s = LeakyBucketState::default();
        assert!(b.check(&mut s, 0, 5).allowed());
        let d = b.check(&mut s, 0, 0);
        assert!(d.allowed());
        assert_eq!((d.remaining(), d.reset()), (0, Duration::from_secs(5)));
        let d = b.decide(&s, 0, 6);
        assert!(d.is_impossible());
        assert_eq!(d.retry_after(), None);
    }

    #[test]
    fn refund_restores_and_never_overfills() {
        let b = LeakyBucket::new(Quota::per_second(1).burst(5)).unwrap();
        let mut s = LeakyBucketState::default();
        b.check(&mut s, 0, 2);
        let before = b.decide(&s, 500 * MS, 3);
        b.check(&mut s, 500 * MS, 3);
        b.refund(&mut s, 500 * MS, 500 * MS, 3);
        assert_eq!(b.decide(&s, 500 * MS, 3), before);
        b.refund(&mut s, 500 * MS, 500 * MS, 10);
        assert_eq!(s.level, 0, "never emptier than empty");
    }

    #[test]
    fn rebase_carries_the_queue_as_the_token_bucket_does() {
        let (o, n) = (
            LeakyBucket::new(Quota::per_second(2).burst(6)).unwrap(),
            LeakyBucket::new(Quota::per_second(1).burst(3)).unwrap(),
        );
        let mut s = LeakyBucketState::default();
        assert!(o.check(&mut s, 0, 5).allowed());
        let mut t = as_bucket(&s);
        n.rebase(&o, &mut s, 250 * MS);
        n.bucket.rebase(&o.bucket, &mut t, 250 * MS);
        assert_eq!(s, from_bucket(t));
        // 4.5 queued: the 3 that fit, and the 1.5 above them held as the 750 ms `o` takes to
        // drain them (nothing drains before 1 s).
        assert_eq!((s.level, s.last), (3 * S, S));
        assert_eq!(n.queue_delay(&s, 250 * MS), Duration::from_millis(3_750));
        let d = n.decide(&s, 250 * MS, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1_750)));
        let kept = s;
        n.rebase(&n, &mut s, 0);
        assert_eq!(s, kept);
    }

    #[test]
    fn clock_going_backwards_drains_nothing() {
        let b = LeakyBucket::new(Quota::per_second(1).burst(1)).unwrap();
        let mut s = LeakyBucketState::default();
        assert!(b.check(&mut s, 5 * S, 1).allowed());
        let d = b.check(&mut s, S, 1);
        assert!(!d.allowed());
        // Nothing drains before 5 s, the time already seen: the request fits at 6 s.
        assert_eq!(d.retry_after(), Some(Duration::from_secs(5)));
        assert!(b.check(&mut s, 6 * S, 1).allowed());
    }

    #[test]
    fn idle_timeout_restores_a_fresh_key() {
        let b = LeakyBucket::new(Quota::per_minute(7).burst(3)).unwrap();
        let mut s = LeakyBucketState::default();
        b.check(&mut s, 11, 3);
        let later = 11 + b.idle_timeout_micros();
        let fresh = LeakyBucketState::default();
        assert_eq!(b.decide(&s, later, 3), b.decide(&fresh, later, 3));
        assert_ne!(b.decide(&s, later - 1, 3), b.decide(&fresh, later - 1, 3));
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        let b = LeakyBucket::new(Quota::per_second(2).burst(3)).unwrap();
        // A level carried from a larger capacity is kept, and the wait stays exact: 10 queued,
        // 3 fit, so 8 drain (4 s) before one more fits.
        let over = LeakyBucketState {
            level: 10 * 500_000,
            last: 0,
        };
        let d = b.decide(&over, 0, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(4)));
        assert!(!b.decide(&over, 4 * S - 1, 1).allowed());
        assert!(b.decide(&over, 4 * S, 1).allowed());
        let mut s = LeakyBucketState {
            level: u64::MAX,
            last: u64::MAX,
        };
        b.decide(&s, 0, 3);
        b.check(&mut s, u64::MAX, 3);
        // Reserved at the end of time, refunded by a clock that reads 0: no refill since.
        b.refund(&mut s, u64::MAX, 0, u64::MAX);
        assert_eq!(s.level, 0);
    }
}
