//! Token bucket: a bucket of `burst` tokens refilled at `count / period`.

use std::time::Duration;

use super::Algorithm;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::{Quota, MAX_EXACT};

/// The largest deficit (steps) a bucket reads or carries: below 2^53, so the Redis scripts
/// compute it exactly. Only a carried deficit (a quota change from a far larger one) or a state
/// written by something else reaches it.
pub(super) const MAX_DEFICIT: u64 = MAX_EXACT - 1;

/// Token bucket: permits a burst of its capacity, then settles to the rate.
///
/// # Exact arithmetic
///
/// Tokens are fixed-point: one token is `unit = period_us / g` steps and each microsecond earns
/// `per = count / g` steps, where `g = gcd(period_us, count)`; the capacity is
/// `cap = burst × unit`. The state stores the **deficit** (steps missing from a full bucket),
/// so the zero state is a full bucket. At `now`:
///
/// ```text
/// elapsed  = max(0, now - last)
/// deficit' = max(0, min(deficit, 2^53 - 1) - elapsed × per)
/// need     = cost × unit
/// allowed  = cost == 0  or  deficit' + need <= cap
/// after    = deficit' + need            (if allowed, else deficit')
/// remaining   = floor((cap - min(after, cap)) / unit)
/// reset       = ceil(after / per) µs
/// retry_after = ceil((deficit' + need - cap) / per) µs   (if rejected)
/// apply:  deficit = min(max(cap, deficit'), deficit' + need); last = max(last, now)
/// refund (of a reservation of cost at `at`, applied at now):
///         last'   = max(last, now)
///         give    = max(0, need - (last' - at) × per)      (0 when at > last')
///         deficit = deficit' - min(deficit', give); last = last'
/// idle timeout = ceil(cap / per) µs
/// ```
///
/// Nothing refills before `last`: a clock reading earlier than `last` earns nothing, and a
/// plan change may set `last` ahead of `now` (a **lock**, see below). The waits reported run
/// from `last`: with `lock = max(0, last - now)`, `reset` is `lock + ceil(after / per)` and
/// `retry_after` is `lock + ceil((deficit' + need - cap) / per)`. The deficit is at most `cap`
/// for every state the bucket's own transitions and [`rebase`](Algorithm::rebase) write; a
/// state with more (written by an earlier version) reads as empty until it has refilled.
///
/// # Why a refund never over-admits
///
/// Compare the key with a *truth* key that saw exactly the requests the key admitted, without
/// the reservation. Every other transition is applied to both alike and is monotone and
/// 1-Lipschitz in the deficit: an admission adds the same `need` (no clamp at `cap`: it was
/// allowed, and truth's deficit is no larger), another refund subtracts the same amount
/// (clamped at 0), a rejection changes nothing, and the passage of time subtracts
/// `elapsed × per` clamped at 0. So `deficit − truth` never goes below 0 and shrinks only
/// where truth is clamped at 0 (full) by the passage of time: at most `per` steps per µs that
/// `last` advances. Right after the reservation it is `need`; when the refund is applied,
/// `last` has advanced from at least `at` to `last'`, so it is at least
/// `need − (last' − at) × per`: exactly what the refund gives back, never more. With several
/// reservations pending the bounds add up (time clamps take at most `per` per µs off the sum),
/// so refunds in any order keep the key no fuller than truth. A clock that reads earlier than
/// `last` (skew between the reserving and refunding clocks, or `at` before `last`) advances
/// nothing and only makes the give-back smaller. The price: a refund a round trip late keeps
/// the refill of that round trip spent even if truth was not full; it errs towards refusing.
///
/// # Plan changes
///
/// [`rebase`](Algorithm::rebase) from a bucket `o` (the quota the state was written under) to
/// this one, `n`, at `now` carries what the key spent: the units that fit `n`'s capacity as
/// units, the units above it as **time**, the time `o` takes to refill them (a lock: the key is
/// empty at `n`, and nothing refills before the lock ends):
///
/// ```text
/// if (o.unit, o.per, o.cap) == (n.unit, n.per, n.cap): nothing changes
/// d     = o's deficit' at now;   lock = max(0, last - now)
/// fits  = n.burst × o.unit       (n's capacity, in o's steps)
/// if d > fits:      deficit = n.cap;  lock += ceil((d - fits) / o.per)
/// elif lock > 0:    deficit = n.cap   (a lock stays a lock, whole: its units are unknown)
/// else:             deficit = ceil(d / o.unit) × n.unit   (rounded up: toward refusing)
/// last = min(now + lock, 2^53 - 1)
/// ```
///
/// Right after the change, `remaining = max(0, n.burst - spent)`: an upgrade keeps what was
/// spent (no reset gift). A downgrade to less than was spent keeps all of it, the excess as the
/// time `o` would have taken to refill it, not as `n`'s units (which a far smaller quota would
/// take years to refill): the key is locked out for at most `o`'s full refill plus `n`'s
/// (`o.burst / o.rate + n.burst / n.rate`; 1,000,000/day to 1/day: at most 2 days), and told
/// exactly when it fits again. A lock converted again stays a lock, so a sequence of changes
/// never hands spending back either (a state carrying a lock reads as empty at any quota
/// until the lock ends); such a conversion errs toward refusing (the capacity standing in
/// for the lock's units is counted again, so repeated changes back and forth lengthen the
/// lock by up to `o.burst / o.rate` each). The stores do not compound conversions on checks:
/// they convert a copy of the state the key's last charge (or refund) wrote, and a locked
/// state is never charged. Across any sequence of changes a key never admits more in a span `t`
/// than `max burst + max rate × t` over the quotas in force during it.
///
/// The stores convert a key's state on a copy for each check and store it only when the check
/// charges something (see [`Algorithm::rebase`]): a key that is only checked keeps refilling
/// at the quota it was written under, and the figures a check reports are those of the copy.
///
/// ```
/// use tollgate::algorithm::{Algorithm, TokenBucket};
/// use tollgate::Quota;
///
/// let free = TokenBucket::new(Quota::per_hour(100)).unwrap();
/// let pro = TokenBucket::new(Quota::per_hour(1_000)).unwrap();
/// let mut state = Default::default();
/// assert!(free.check(&mut state, 0, 60).allowed());
/// pro.rebase(&free, &mut state, 0); // upgraded: 60 spent stays spent
/// assert_eq!(pro.decide(&state, 0, 0).remaining(), 940);
/// assert!(pro.check(&mut state, 0, 500).allowed());
/// free.rebase(&pro, &mut state, 0); // downgraded with 560 spent: 460 above Free's 100
/// assert_eq!(free.decide(&state, 0, 0).remaining(), 0);
/// // The 460 are held as the 1,656 s Pro takes to refill them (one per 3.6 s), then Free
/// // refills one per 36 s: the next request fits after 1,692 s, not after 461 × 36 s.
/// let d = free.decide(&state, 0, 1);
/// assert_eq!(d.retry_after(), Some(std::time::Duration::from_secs(1_692)));
/// assert!(!free.decide(&state, 1_692_000_000 - 1, 1).allowed());
/// assert!(free.decide(&state, 1_692_000_000, 1).allowed());
/// pro.rebase(&free, &mut state, 0); // straight back up: empty until the lock ends
/// assert_eq!(pro.decide(&state, 0, 0).remaining(), 0);
/// ```
///
/// ```
/// use tollgate::algorithm::{Algorithm, TokenBucket};
/// use tollgate::Quota;
///
/// // Capacity 20 refilling 2/s, idle for a minute, then 30 requests at once: 20 pass.
/// let bucket = TokenBucket::new(Quota::per_second(2).burst(20)).unwrap();
/// let mut state = Default::default();
/// let admitted = (0..30).filter(|_| bucket.check(&mut state, 60_000_000, 1).allowed()).count();
/// assert_eq!(admitted, 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    quota: Quota,
    unit: u64,
    per: u64,
    cap: u64,
}

/// Per-key state of a [`TokenBucket`]: the deficit from full (fixed-point) and the last update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenBucketState {
    /// Fixed-point steps missing from a full bucket.
    pub deficit: u64,
    /// Time of the last charge, µs.
    pub last: u64,
}

impl TokenBucket {
    /// A token bucket of capacity `quota.burst_size()`, refilling `quota.count()` per
    /// `quota.period()`.
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        quota.validate()?;
        super::reject_calendar(&quota, "token_bucket")?;
        let fp = quota.fixed_point();
        Ok(Self {
            quota,
            unit: fp.unit,
            per: fp.per_micro,
            cap: quota.burst_size() * fp.unit,
        })
    }

    /// Microseconds to earn `steps` fixed-point steps: `ceil(steps / per)`, skipping the
    /// division in the common case of a count that divides the period (`per == 1`).
    #[inline]
    pub(super) fn micros_to_earn(&self, steps: u64) -> u64 {
        if self.per == 1 {
            steps
        } else {
            steps.div_ceil(self.per)
        }
    }

    /// Whether `other` decides exactly like this bucket (the same fixed point and capacity).
    #[inline]
    pub(super) fn same_arithmetic(&self, other: &Self) -> bool {
        (self.unit, self.per, self.cap) == (other.unit, other.per, other.cap)
    }

    /// The deficit at `now`: the stored one (at most [`MAX_DEFICIT`]) less the refill since
    /// `last`, at least 0. A deficit above `cap` (carried from a larger quota by `rebase`) is
    /// kept: the bucket reads as empty until the refill has paid the excess back.
    #[inline]
    pub(super) fn deficit_at(&self, state: &TokenBucketState, now: u64) -> u64 {
        let elapsed = now.saturating_sub(state.last);
        state
            .deficit
            .min(MAX_DEFICIT)
            .saturating_sub(elapsed.saturating_mul(self.per))
    }
}

/// A bucket's spending carried from one quota to another ([`Algorithm::rebase`] of the token
/// bucket and GCRA): `deficit` steps at `from`'s fixed point (`from_unit` steps a unit,
/// `from_per` a µs) and `lock` µs before which nothing refills, converted to `to`'s
/// (`to_unit`, `to_per`, `to_cap`). Returns `to`'s deficit and lock.
///
/// The units that fit `to`'s capacity are carried as units (rounded up); the units above it
/// as the time `from` takes to refill them (not as `to`'s units, which a far smaller quota
/// would take years to refill): the key is then empty at `to` and nothing refills before that
/// lock ends. A lock the state already carries stays a lock, whole, and the key stays empty
/// until it ends: a lock is time, and its units are those of a quota no longer known (turning
/// it into units at a slower quota's rate would hand units back).
pub(super) fn carry(
    (from_unit, from_per): (u64, u64),
    (to_unit, to_cap): (u64, u64),
    deficit: u64,
    lock: u64,
) -> (u64, u64) {
    let burst = to_cap / to_unit;
    let fits = u128::from(burst) * u128::from(from_unit);
    if u128::from(deficit) > fits {
        // Below 2^53 / from_per + 1: fits a u64.
        let excess = (u128::from(deficit) - fits).div_ceil(u128::from(from_per));
        return (to_cap, lock.saturating_add(excess as u64));
    }
    if lock > 0 {
        return (to_cap, lock);
    }
    // `deficit <= burst × from_unit`: at most `burst` units, at most `to_cap` steps.
    (deficit.div_ceil(from_unit) * to_unit, 0)
}

impl Algorithm for TokenBucket {
    type State = TokenBucketState;

    fn quota(&self) -> &Quota {
        &self.quota
    }

    fn capacity(&self) -> u64 {
        self.quota.burst_size()
    }

    #[inline]
    fn decide(&self, state: &TokenBucketState, now: u64, cost: u64) -> Decision {
        let limit = self.quota.burst_size();
        let deficit = self.deficit_at(state, now);
        // Nothing refills before `last`: a lock carried from a larger quota (see "Plan
        // changes"), or a clock reading earlier than one already seen.
        let lock = state.last.saturating_sub(now);
        let wait =
            |steps: u64| Duration::from_micros(lock.saturating_add(self.micros_to_earn(steps)));
        // Hot path first: the allowed branch computes only what it reports.
        if cost <= limit {
            // `deficit <= MAX_DEFICIT` and `cost × unit <= cap < 2^53`: no overflow.
            let after = deficit + cost * self.unit;
            if after <= self.cap {
                return Decision::allowed_with(limit, (self.cap - after) / self.unit, wait(after));
            }
            if cost == 0 {
                // A deficit above the capacity (carried from a larger quota by an earlier
                // version): empty, and whole again once all of it has refilled.
                return Decision::allowed_with(limit, 0, wait(deficit));
            }
        }
        let remaining_now = self.cap.saturating_sub(deficit) / self.unit;
        let reset_now = wait(deficit);
        if cost > limit {
            return Decision::impossible(limit, remaining_now, reset_now);
        }
        let after = deficit + cost * self.unit;
        Decision::rejected(limit, remaining_now, reset_now, wait(after - self.cap))
    }

    #[inline]
    fn apply(&self, state: &mut TokenBucketState, now: u64, cost: u64) {
        let deficit = self.deficit_at(state, now);
        // An allowed charge ends at most at `cap`; a cost of 0 keeps a deficit above it.
        let after = deficit.saturating_add(cost.saturating_mul(self.unit));
        state.deficit = after.min(self.cap.max(deficit));
        state.last = state.last.max(now);
    }

    fn refund(&self, state: &mut TokenBucketState, reserved_at: u64, now: u64, cost: u64) {
        let deficit = self.deficit_at(state, now);
        let last = state.last.max(now);
        // The hole may have refilled since the reservation while a bucket without it was full.
        let refilled = last.saturating_sub(reserved_at).saturating_mul(self.per);
        let give = cost.saturating_mul(self.unit).saturating_sub(refilled);
        state.deficit = deficit.saturating_sub(give);
        state.last = last;
    }

    fn rebase(&self, from: &Self, state: &mut TokenBucketState, now: u64) {
        if self.same_arithmetic(from) {
            return;
        }
        let (deficit, lock) = carry(
            (from.unit, from.per),
            (self.unit, self.cap),
            from.deficit_at(state, now),
            state.last.saturating_sub(now),
        );
        state.deficit = deficit;
        state.last = now.saturating_add(lock).min(MAX_DEFICIT);
    }

    fn idle_timeout_micros(&self) -> u64 {
        self.cap.div_ceil(self.per)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;
    const S: u64 = 1_000_000;

    #[test]
    fn seed_batch_of_twenty_then_retry_in_50ms_then_full_after_3s() {
        let b = TokenBucket::new(Quota::per_second(10).burst(20)).unwrap();
        let mut s = TokenBucketState::default();
        for i in 0..20 {
            let d = b.check(&mut s, 0, 1);
            assert!(d.allowed(), "request {i}");
            assert_eq!(d.remaining(), 19 - i);
        }
        let d = b.check(&mut s, 50 * MS, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(50)));
        let d = b.decide(&s, 3_000 * MS, 20);
        assert!(d.allowed(), "full again after 3 s");
        assert_eq!(d.remaining(), 0);
        assert_eq!(b.decide(&s, 3_000 * MS, 0).remaining(), 20);
    }

    #[test]
    fn retry_after_waiting_succeeds() {
        let b = TokenBucket::new(Quota::per_second(3).burst(2)).unwrap();
        let mut s = TokenBucketState::default();
        assert!(b.check(&mut s, 0, 2).allowed());
        let d = b.check(&mut s, 10, 1);
        let wait = d.retry_after().unwrap().as_micros() as u64;
        assert!(!b.decide(&s, 10 + wait - 1, 1).allowed());
        assert!(b.decide(&s, 10 + wait, 1).allowed());
    }

    #[test]
    fn cost_over_capacity_is_impossible() {
        let b = TokenBucket::new(Quota::per_second(1).burst(5)).unwrap();
        let d = b.decide(&TokenBucketState::default(), 0, 6);
        assert!(d.is_impossible());
        assert_eq!(d.remaining(), 5);
    }

    #[test]
    fn refund_restores_exactly() {
        let b = TokenBucket::new(Quota::per_second(1).burst(5)).unwrap();
        let mut s = TokenBucketState::default();
        b.check(&mut s, 0, 3);
        b.refund(&mut s, 0, 0, 3);
        assert_eq!(s.deficit, 0);
        b.refund(&mut s, 0, 0, 3);
        assert_eq!(s.deficit, 0, "never fuller than fresh");
    }

    #[test]
    fn late_refund_gives_back_only_what_did_not_refill() {
        // Capacity 10, 1/s. 5 reserved at 0 s; by 3 s, 3 of them have refilled into the hole
        // (a bucket without the reservation was full and would have lost them); 8 pass at 3 s.
        // Without the reservation 2 would be left: the refund gives back 5 - 3 = 2 units, not 5.
        let b = TokenBucket::new(Quota::per_second(1).burst(10)).unwrap();
        let mut s = TokenBucketState::default();
        assert!(b.check(&mut s, 0, 5).allowed());
        assert!(b.check(&mut s, 3_000 * MS, 8).allowed());
        b.refund(&mut s, 0, 3_000 * MS, 5);
        assert_eq!(
            s,
            TokenBucketState {
                deficit: 8 * S,
                last: 3_000 * MS
            }
        );
        assert_eq!(b.decide(&s, 3_000 * MS, 0).remaining(), 2);
        // Refunded later still (at 4 s, as of 0 s): 4 s refilled, only 1 of 5 given back; a
        // refund time before the last charge counts from the last charge.
        let mut s = TokenBucketState::default();
        assert!(b.check(&mut s, 0, 5).allowed());
        assert!(b.check(&mut s, 3_000 * MS, 8).allowed());
        b.refund(&mut s, 0, 4_000 * MS, 5);
        assert_eq!(
            s.deficit,
            10 * S - S - S,
            "empty at 3 s, 1 s of refill, 1 unit back"
        );
        let mut t = TokenBucketState::default();
        assert!(b.check(&mut t, 0, 5).allowed());
        assert!(b.check(&mut t, 3_000 * MS, 8).allowed());
        b.refund(&mut t, 0, 1_000 * MS, 5);
        assert_eq!(
            t.deficit,
            10 * S - 2 * S,
            "as of the last charge at 3 s: 2 back"
        );
        // Everything given back at the reservation's own time: never fuller than fresh.
        b.refund(&mut t, 3_000 * MS, 3_000 * MS, 100);
        assert_eq!(t.deficit, 0, "never fuller than fresh");
    }

    #[test]
    fn rebase_carries_spent_units_rounded_up() {
        // 10/s burst 20 (unit 100_000 steps, per 1): 7.5 units spent at 250 ms.
        let o = TokenBucket::new(Quota::per_second(10).burst(20)).unwrap();
        let n = TokenBucket::new(Quota::per_second(3).burst(12)).unwrap();
        let mut s = TokenBucketState::default();
        assert!(o.check(&mut s, 0, 10).allowed());
        n.rebase(&o, &mut s, 250 * MS);
        assert_eq!(
            s,
            TokenBucketState {
                deficit: 8 * n.unit,
                last: 250 * MS
            }
        );
        assert_eq!(n.decide(&s, 250 * MS, 0).remaining(), 4);
        // A downgrade below what was spent: empty, and the excess stays spent.
        let tiny = TokenBucket::new(Quota::per_second(1).burst(2)).unwrap();
        tiny.rebase(&n, &mut s, 250 * MS);
        // 2 fit; the 6 above are held as the 2 s `n` takes to refill them: nothing refills
        // before 2.25 s, and one request fits 1 s after that.
        assert_eq!(
            s,
            TokenBucketState {
                deficit: 2 * tiny.unit,
                last: 2_250 * MS
            }
        );
        let d = tiny.decide(&s, 250 * MS, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(d.reset(), Duration::from_secs(4));
        // Straight back: the lock stays a lock (its units are `n`'s, which `tiny` does not
        // know), and `n` is empty until it ends: never less spent than the 8.
        let mut back = s;
        n.rebase(&tiny, &mut back, 250 * MS);
        assert_eq!(
            back,
            TokenBucketState {
                deficit: 12 * n.unit,
                last: 2_250 * MS
            }
        );
        // Nothing spent: the fresh state stays fresh.
        let mut fresh = TokenBucketState::default();
        n.rebase(&o, &mut fresh, 5 * S);
        assert_eq!(fresh.deficit, 0);
    }

    #[test]
    fn rebase_between_equal_arithmetic_changes_nothing() {
        // The same bucket written two ways, and a clock that went back.
        let a = TokenBucket::new(Quota::per_second(10)).unwrap();
        let b = TokenBucket::new(Quota::per(Duration::from_millis(100), 1).burst(10)).unwrap();
        let mut s = TokenBucketState::default();
        assert!(a.check(&mut s, 5 * S, 3).allowed());
        let kept = s;
        b.rebase(&a, &mut s, 5 * S + 50 * MS);
        a.rebase(&a, &mut s, S);
        assert_eq!(s, kept);
    }

    #[test]
    fn clock_going_backwards_earns_nothing() {
        let b = TokenBucket::new(Quota::per_second(1).burst(1)).unwrap();
        let mut s = TokenBucketState::default();
        assert!(b.check(&mut s, 5_000_000, 1).allowed());
        assert!(!b.check(&mut s, 1_000_000, 1).allowed());
        assert!(b.check(&mut s, 6_000_000, 1).allowed());
    }

    #[test]
    fn a_deficit_above_the_capacity_is_kept_until_paid_back() {
        // A deficit carried from an earlier, larger burst: empty until 9 units have refilled.
        let b = TokenBucket::new(Quota::per_second(1).burst(2)).unwrap();
        let mut s = TokenBucketState {
            deficit: 10 * S,
            last: 0,
        };
        let d = b.decide(&s, 0, 1);
        assert!(!d.allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(9)));
        assert_eq!(d.reset(), Duration::from_secs(10));
        let d = b.check(&mut s, 0, 0);
        assert!(d.allowed(), "a cost of 0 always is");
        assert_eq!((d.remaining(), d.reset()), (0, Duration::from_secs(10)));
        assert_eq!(s.deficit, 10 * S, "and it writes no clamped state");
        assert!(!b.decide(&s, 9 * S - 1, 1).allowed());
        assert!(b.check(&mut s, 9 * S, 1).allowed());
        // A state no transition writes (the deficit of the end of time) does not overflow.
        let s = TokenBucketState {
            deficit: u64::MAX,
            last: 0,
        };
        let d = b.decide(&s, 0, 2);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(MAX_DEFICIT)));
        assert!(b.decide(&s, 0, 3).is_impossible());
    }

    #[test]
    fn rebase_keeps_the_excess_of_a_downgrade() {
        let pro = TokenBucket::new(Quota::per_minute(20)).unwrap();
        let free = TokenBucket::new(Quota::per_minute(5)).unwrap();
        let mut s = TokenBucketState::default();
        assert!(pro.check(&mut s, 0, 20).allowed());
        // The 15 above Free's 5 are held as the 45 s Pro takes to refill them, then Free
        // refills one per 12 s: one request fits after 57 s (not 192 s at Free's rate).
        free.rebase(&pro, &mut s, 0);
        assert!(free.check(&mut s, 0, 0).allowed());
        assert_eq!(
            free.decide(&s, 0, 1).retry_after(),
            Some(Duration::from_secs(57))
        );
        assert!(!free.decide(&s, 57 * S - 1, 1).allowed());
        assert!(free.decide(&s, 57 * S, 1).allowed());
        // Straight back up, and down again, at the same instant: never a reset gift. A lock
        // converted again stays a lock and the capacity it stands in for is counted again:
        // conversions of a converted state err toward refusing (the stores convert a copy of
        // the state a charge wrote, so they never compound).
        for round in 1..=3u64 {
            pro.rebase(&free, &mut s, 0);
            assert!(!pro.check(&mut s, 0, 1).allowed(), "no reset gift");
            free.rebase(&pro, &mut s, 0);
            let wait = free.decide(&s, 0, 1).retry_after().unwrap();
            assert_eq!(wait, Duration::from_secs(57 + 45 * round));
        }
    }
}
