//! Sliding window counter (Cloudflare's): the current window's count plus a weighted share of
//! the previous window's.

use std::time::Duration;

use super::{reject_window_burst, Algorithm};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::{Quota, MAX_EXACT};

/// Sliding window counter: estimates the units spent in the last `period` from two counters,
/// assuming the previous window's traffic was spread evenly over it.
///
/// Windows are aligned to the clock's origin like [`FixedWindow`](super::FixedWindow)'s. At
/// `e` microseconds into window `w`, the estimate is
/// `prev × (W − e) / W + cur`, where `cur` counts window `w` and `prev` counts window `w − 1`
/// (zero when the previous window stored is any older one: a stale window is never carried
/// forward). A request of `cost` is allowed when `floor(estimate) + cost <= limit`; for a cost of
/// 1 that is Cloudflare's `estimate < limit`.
///
/// It smooths the fixed window's seam for two counters per key. Its error is known and
/// one-sided: a burst crammed into the end of the previous window is under-counted once the
/// window turns, so an attacker who bursts just before a seam and then trickles requests through
/// the next window gets up to `2 × limit` through in one sliding period (the simulator's
/// `seam-attack` measures 10 at 5 per 10 s and 199 at 100/min). It never passes more than the
/// limit in a single aligned window; use the sliding log where every period must hold.
///
/// # Exact arithmetic
///
/// `W` is the period in µs and `L = count`; `new` requires `L × W < 2^53` so every product below
/// is exact in a Lua double. `÷` is floor division of non-negative integers. The state is the
/// time of the last charge and the two counts. At `now`, for a request of `cost`:
///
/// ```text
/// t        = max(now, last)                 (an earlier clock counts as no time elapsed)
/// w        = t ÷ W;   e = t - w × W;   s = last ÷ W
/// (p, c)   = (prev, cur)  if w == s
///            (cur, 0)     if w == s + 1
///            (0, 0)       otherwise         (stale)
/// (p, c)   = (min(p, K), min(c, K))  where K = (2^53 - 1) ÷ W >= L: counts left by a larger,
///                                    earlier limit weigh as they are (a lowered limit keeps
///                                    what the key spent), bounded so p × W stays exact
/// est      = (p × (W - e)) ÷ W + c          (floor of the weighted estimate)
/// allowed  = cost <= L - min(L, est)        (so a cost of 0 always is)
/// after    = est + cost                     (if allowed, else est)
/// remaining = L - min(L, after)
/// apply:  last = t; prev = p; cur = min(c + cost, max(L, c))
/// refund (now = the reservation's time; k = now ÷ W, the window it charged):
///         if s == k:       cur = cur - min(cur, cost)
///         if s == k + 1:   prev = prev - min(prev, cost)   (the charged window is now the previous)
///         otherwise        nothing (the window charged no longer weighs)
///         last is unchanged
/// idle timeout = 2 × W µs
/// ```
///
/// Waits are solved exactly, not approximated. `fit(p, c, e0, b)` is the smallest `e' >= e0`
/// in `[0, W)` at which `(p × (W - e')) ÷ W + c <= b`, if any:
///
/// ```text
/// fit(p, c, e0, b) = none                              if c > b
///                  = e0                                if p <= b - c
///                  = q = ((b - c + 1) × W - 1) ÷ p;
///                    none if q == 0, else max(e0, W - q)
/// wait(b)  = fit(p, c, e, b) - e                       if some
///          = (W - e) + fit(c, 0, 0, b)                 else if some (the next window)
///          = 2 × W - e                                 otherwise (the one after)
/// retry_after = (t - now) + wait(L - cost)      µs   (if rejected)
/// reset       = (t - now) + wait(0)             µs   (with c = c + cost when allowed)
/// ```
///
/// The estimate never increases while no request is charged, so waiting exactly `retry_after`
/// succeeds and waiting one microsecond less does not.
///
/// # Plan changes
///
/// [`rebase`](Algorithm::rebase) from a sliding window `o` (the quota the counts were written
/// under) to this one, `n`, at `now`:
///
/// ```text
/// if o.W == n.W: nothing changes                (counts are units; n's limit applies)
/// (t, e, p, c) = o's view at now                (as in decide, with o's W and K)
/// spent = ceil(p × (o.W - e) / o.W) + c         (the weighted count, rounded up)
/// last = t;  prev = 0;  cur = spent             (n's current window holds it)
/// if spent > 0 and n.W < o.W:                   (kept until o's current window ends)
///     last = max(t, floor((end - 1) / n.W) × n.W)   where end = (floor(t / o.W) + 1) × o.W
/// ```
///
/// The key keeps what it spent, rounded up to a whole unit (toward refusing): an upgrade is no
/// reset gift, a downgrade below what was spent reads as exhausted and is never charged twice
/// (the count then weighs as any other, fading over `n`'s window after the one holding it).
/// Moving to shorter windows, the count is charged to the shorter window holding the end of the
/// longer one (`last` ahead of `now`: an earlier clock reads as `last`), so it stays counted
/// until the longer window ends and a change back finds it. From shorter windows to a longer
/// one, only the current estimate is carried.
///
/// ```
/// use tollgate::algorithm::{Algorithm, SlidingWindow, SlidingWindowState};
/// use tollgate::Quota;
///
/// let minute = SlidingWindow::new(Quota::per_minute(100)).unwrap();
/// let hour = SlidingWindow::new(Quota::per_hour(1_000)).unwrap();
/// // 90 in the previous minute, 20 in this one, 15 s in: 87.5 weighted, carried as 88.
/// let mut state = SlidingWindowState { last: 60_000_000, prev: 90, cur: 20 };
/// hour.rebase(&minute, &mut state, 75_000_000);
/// assert_eq!(hour.decide(&state, 75_000_000, 0).remaining(), 912);
/// ```
///
/// ```
/// use std::time::Duration;
/// use tollgate::algorithm::{Algorithm, SlidingWindow, SlidingWindowState};
/// use tollgate::Quota;
///
/// // 90 in the previous minute, 20 so far in this one, 15 s in: 20 + 90 × 0.75 = 87.5.
/// let state = SlidingWindowState { last: 60_000_000, prev: 90, cur: 20 };
/// let now = 75_000_000;
/// let sw = SlidingWindow::new(Quota::per_minute(88)).unwrap();
/// assert!(sw.decide(&state, now, 1).allowed()); // 87.5 < 88
/// let sw = SlidingWindow::new(Quota::per_minute(87)).unwrap();
/// let d = sw.decide(&state, now, 1);
/// assert!(!d.allowed()); // 87.5 >= 87
/// // 90 × (60 − e) / 60 drops below 67 at e = 15.333… s: 333_334 µs from now.
/// assert_eq!(d.retry_after(), Some(Duration::from_micros(333_334)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    quota: Quota,
    /// Window length `W`, µs.
    period: u64,
    /// Units per window `L`.
    limit: u64,
    /// `K = (2^53 - 1) ÷ W`: the largest count read from state (at least `L`).
    max_count: u64,
}

/// Per-key state of a [`SlidingWindow`]: when it was last charged and the two window counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SlidingWindowState {
    /// Time of the last charge, µs; its window `last / period` is the one `cur` counts.
    pub last: u64,
    /// Units charged in the window before `last`'s.
    pub prev: u64,
    /// Units charged in `last`'s window.
    pub cur: u64,
}

/// The counts as seen from a time `t`: `e` µs into the window, previous and current counts.
#[derive(Debug, Clone, Copy)]
struct View {
    t: u64,
    e: u64,
    prev: u64,
    cur: u64,
}

impl SlidingWindow {
    /// A sliding window counter of `quota.count()` units per `quota.period()`.
    ///
    /// Returns a [`ConfigError`] for a quota with an explicit burst different from its count
    /// (a window has no separate burst), or when `count × period_µs` is not below 2^53 (the
    /// weighted estimate must stay exact in every backend).
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        quota.validate()?;
        reject_window_burst(&quota, "sliding_window")?;
        super::reject_calendar(&quota, "sliding_window")?;
        let (period, limit) = (quota.period_micros(), quota.count());
        match limit.checked_mul(period) {
            Some(product) if product < MAX_EXACT => Ok(Self {
                quota,
                period,
                limit,
                max_count: (MAX_EXACT - 1) / period,
            }),
            _ => Err(ConfigError::new(
                "quota.count",
                format!(
                    "sliding_window weighs windows exactly only while count × period (in µs) is below 2^53, \
                     and {limit} per {:?} is not; use a count of at most {} for this period, a shorter \
                     period, or the token bucket or fixed window",
                    quota.period(),
                    (MAX_EXACT - 1) / period,
                ),
            )),
        }
    }

    #[inline]
    fn view(&self, state: &SlidingWindowState, now: u64) -> View {
        let t = now.max(state.last);
        let (w, s) = (t / self.period, state.last / self.period);
        let (prev, cur) = if w == s {
            (state.prev, state.cur)
        } else if w == s + 1 {
            (state.cur, 0)
        } else {
            (0, 0)
        };
        // Counts above `L` (left by a larger, earlier limit) are kept, so a lowered limit keeps
        // what the key spent; clamping at `K` only keeps `p × W` exact in Lua's doubles.
        View {
            t,
            e: t - w * self.period,
            prev: prev.min(self.max_count),
            cur: cur.min(self.max_count),
        }
    }

    /// `floor(p × (W − e) / W)`: the previous window's weighted share. `view` bounds `p` by
    /// `K`, so the product is below 2^53; the wider arithmetic only guards the cast.
    #[inline]
    fn weighted(&self, p: u64, e: u64) -> u64 {
        (u128::from(p) * u128::from(self.period - e) / u128::from(self.period)) as u64
    }

    /// `ceil(p × (W − e) / W)`: the previous window's weighted share, rounded up (what a plan
    /// change carries).
    #[inline]
    fn weighted_up(&self, p: u64, e: u64) -> u64 {
        (u128::from(p) * u128::from(self.period - e)).div_ceil(u128::from(self.period)) as u64
    }

    /// The smallest `e' >= e0` in this window at which `weighted(p, e') + c <= budget`.
    #[inline]
    fn fit(&self, p: u64, c: u64, e0: u64, budget: u64) -> Option<u64> {
        let m = budget.checked_sub(c)?;
        if p <= m {
            return Some(e0);
        }
        // weighted(p, e') <= m  ⇔  p × (W − e') <= (m + 1) × W − 1; here m + 1 <= p <= L.
        let q = ((m + 1) * self.period - 1) / p;
        (q > 0).then(|| e0.max(self.period - q))
    }

    /// Microseconds from `now` until the estimate is at most `budget`, charging nothing.
    fn wait(&self, v: View, now: u64, budget: u64) -> u64 {
        let w = self.period;
        let d = match self.fit(v.prev, v.cur, v.e, budget) {
            Some(e) => e - v.e,
            None => match self.fit(v.cur, 0, 0, budget) {
                Some(e) => (w - v.e) + e,
                None => 2 * w - v.e,
            },
        };
        (v.t - now).saturating_add(d)
    }
}

impl Algorithm for SlidingWindow {
    type State = SlidingWindowState;

    fn quota(&self) -> &Quota {
        &self.quota
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn decide(&self, state: &SlidingWindowState, now: u64, cost: u64) -> Decision {
        let v = self.view(state, now);
        let est = self.weighted(v.prev, v.e).saturating_add(v.cur);
        let reset = |cur: u64| Duration::from_micros(self.wait(View { cur, ..v }, now, 0));
        if cost > self.limit {
            return Decision::impossible(self.limit, self.limit.saturating_sub(est), reset(v.cur));
        }
        // `cost <= remaining`: a cost of 0 is allowed even when counts left by a larger,
        // earlier limit put the estimate above this one.
        let remaining = self.limit.saturating_sub(est);
        if cost <= remaining {
            Decision::allowed_with(
                self.limit,
                remaining - cost,
                reset(v.cur.saturating_add(cost)),
            )
        } else {
            Decision::rejected(
                self.limit,
                self.limit.saturating_sub(est),
                reset(v.cur),
                Duration::from_micros(self.wait(v, now, self.limit - cost)),
            )
        }
    }

    fn apply(&self, state: &mut SlidingWindowState, now: u64, cost: u64) {
        let v = self.view(state, now);
        // An allowed charge ends at most at the limit; a cost of 0 keeps a count above it
        // (carried from a larger quota) as it is.
        *state = SlidingWindowState {
            last: v.t,
            prev: v.prev,
            cur: v.cur.saturating_add(cost).min(self.limit.max(v.cur)),
        };
    }

    /// Gives back `cost` to the counter of the window `now` (the reservation's time) charged:
    /// the current count while `last` is still in it, the previous count once `last` has moved
    /// one window on, nothing later. A refund never frees units of a window it did not charge.
    fn refund(&self, state: &mut SlidingWindowState, reserved_at: u64, _now: u64, cost: u64) {
        let (charged, s) = (reserved_at / self.period, state.last / self.period);
        if s == charged {
            state.cur = state.cur.saturating_sub(cost);
        } else if Some(s) == charged.checked_add(1) {
            state.prev = state.prev.saturating_sub(cost);
        }
    }

    fn rebase(&self, from: &Self, state: &mut SlidingWindowState, now: u64) {
        if self.period == from.period {
            return;
        }
        let v = from.view(state, now);
        let cur = from.weighted_up(v.prev, v.e).saturating_add(v.cur);
        let mut last = v.t;
        if cur > 0 && self.period < from.period {
            // The count stays counted until `from`'s current window ends: it is charged to
            // this quota's window holding that end (weighed from then on like any count).
            let end = (v.t / from.period)
                .saturating_add(1)
                .saturating_mul(from.period);
            last = last.max((end - 1) / self.period * self.period);
        }
        *state = SlidingWindowState { last, prev: 0, cur };
    }

    fn idle_timeout_micros(&self) -> u64 {
        2 * self.period
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn at(last: u64, prev: u64, cur: u64) -> SlidingWindowState {
        SlidingWindowState { last, prev, cur }
    }

    #[test]
    fn seed_estimate_87_5_at_the_boundary() {
        // The 10:04 window ended with 90; at 10:05:15 there are 20 in the new one.
        let state = at(60 * S + 3, 90, 20);
        let now = 75 * S;
        for (limit, allowed) in [(89, true), (88, true), (87, false), (86, false)] {
            let sw = SlidingWindow::new(Quota::per_minute(limit)).unwrap();
            let d = sw.decide(&state, now, 1);
            assert_eq!(d.allowed(), allowed, "limit {limit}");
            assert_eq!(
                d.remaining(),
                (limit - u64::from(allowed)).saturating_sub(87)
            );
        }
        // Cost 2 against 89: floor(87.5) + 2 = 89 fits; cost 3 does not.
        let sw = SlidingWindow::new(Quota::per_minute(89)).unwrap();
        assert!(sw.decide(&state, now, 2).allowed());
        assert!(!sw.decide(&state, now, 3).allowed());
    }

    #[test]
    fn seed_cloudflare_49_5_of_50_is_allowed() {
        let sw = SlidingWindow::new(Quota::per_minute(50)).unwrap();
        // 42 in the previous minute, 18 in the first 15 seconds of this one.
        let mut s = at(60 * S + 14 * S, 42, 18);
        let d = sw.check(&mut s, 75 * S, 1); // 42 × 0.75 + 18 = 49.5
        assert!(d.allowed());
        assert_eq!(d.remaining(), 0);
        assert!(!sw.decide(&s, 75 * S, 1).allowed());
    }

    #[test]
    fn retry_after_is_the_exact_smallest_wait() {
        let sw = SlidingWindow::new(Quota::per_minute(87)).unwrap();
        let state = at(60 * S, 90, 20);
        let now = 75 * S;
        let wait = sw.decide(&state, now, 1).retry_after().unwrap().as_micros() as u64;
        assert!(!sw.decide(&state, now + wait - 1, 1).allowed());
        assert!(sw.decide(&state, now + wait, 1).allowed());
        // A cost of the whole limit needs the previous window's share to round down to 0:
        // 87 × (W − e) < W, first true at e = W − floor((W − 1) / 87).
        let state = at(60 * S, 87, 0);
        let d = sw.decide(&state, 60 * S, 87);
        let wait = d.retry_after().unwrap().as_micros() as u64;
        assert_eq!(wait, 60 * S - (60 * S - 1) / 87);
        assert!(!sw.decide(&state, 60 * S + wait - 1, 87).allowed());
        assert!(sw.decide(&state, 60 * S + wait, 87).allowed());
    }

    #[test]
    fn a_full_window_can_need_two_windows() {
        // L = W: 4 units per 4 µs. A full current window still weighs 1 unit at the last µs of
        // the next one, so a cost of L fits only at the start of the window after.
        let sw = SlidingWindow::new(Quota::per(Duration::from_micros(4), 4)).unwrap();
        let mut s = SlidingWindowState::default();
        assert!(sw.check(&mut s, 0, 4).allowed());
        let d = sw.decide(&s, 1, 4);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(7)));
        assert_eq!(d.reset(), Duration::from_micros(7));
        assert!(!sw.decide(&s, 7, 4).allowed());
        assert!(sw.decide(&s, 8, 4).allowed());
    }

    #[test]
    fn stale_previous_window_counts_zero() {
        let sw = SlidingWindow::new(Quota::per_minute(10)).unwrap();
        let mut s = SlidingWindowState::default();
        assert!(sw.check(&mut s, 30 * S, 10).allowed());
        assert!(
            !sw.decide(&s, 61 * S, 10).allowed(),
            "previous window still weighs"
        );
        assert!(
            sw.decide(&s, 120 * S, 10).allowed(),
            "two windows later it is stale"
        );
        assert_eq!(sw.decide(&s, 121 * S, 0).remaining(), 10);
    }

    #[test]
    fn never_more_than_the_limit_in_one_aligned_window() {
        let sw = SlidingWindow::new(Quota::per_second(5)).unwrap();
        let mut s = SlidingWindowState::default();
        let admitted = (0..50)
            .filter(|i| sw.check(&mut s, 3 * S + i * 10_000, 1).allowed())
            .count();
        assert_eq!(admitted, 5);
    }

    #[test]
    fn reset_is_when_the_estimate_reaches_zero() {
        let sw = SlidingWindow::new(Quota::per_second(10)).unwrap();
        let mut s = SlidingWindowState::default();
        let d = sw.check(&mut s, 250_000, 4);
        // 4 × (1 s − e) / 1 s < 1 once e > 0.75 s of the next window: at 1.750_001 s.
        assert_eq!(d.reset(), Duration::from_micros(1_500_001));
        let later = 250_000 + 1_500_001;
        assert_eq!(sw.decide(&s, later, 0).remaining(), 10);
        assert_eq!(sw.decide(&s, later - 1, 0).remaining(), 9);
        assert_eq!(
            sw.decide(&SlidingWindowState::default(), 0, 0).reset(),
            Duration::ZERO
        );
    }

    #[test]
    fn cost_zero_and_impossible_costs() {
        let sw = SlidingWindow::new(Quota::per_second(3)).unwrap();
        let mut s = SlidingWindowState::default();
        assert!(sw.check(&mut s, 0, 3).allowed());
        let d = sw.check(&mut s, 10, 0);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(s.cur, 3, "cost 0 charged nothing");
        assert!(sw.decide(&s, 10, 4).is_impossible());
    }

    #[test]
    fn refund_restores_and_never_overfills() {
        let sw = SlidingWindow::new(Quota::per_second(8)).unwrap();
        let mut s = SlidingWindowState::default();
        sw.check(&mut s, 900_000, 6);
        let now = S + 200_000;
        sw.check(&mut s, now, 1);
        let before = sw.decide(&s, now, 2);
        sw.check(&mut s, now, 2);
        sw.refund(&mut s, now, now, 2);
        assert_eq!(sw.decide(&s, now, 2), before);
        sw.refund(&mut s, now, now, 100);
        assert_eq!(
            (s.prev, s.cur),
            (6, 0),
            "refund never touches the previous window"
        );
    }

    #[test]
    fn refund_after_the_window_moved_on_gives_back_nothing() {
        // 1 per 10 s: reserved at 9.9 s, the window moves at 10 s. Waiting out the previous
        // window's weight, one is admitted at 19.95 s; the late refund (as of 9.9 s) gives back
        // only to the previous window's count and must not let a second one in.
        let sw = SlidingWindow::new(Quota::per(Duration::from_secs(10), 1)).unwrap();
        let mut s = SlidingWindowState::default();
        assert!(sw.check(&mut s, 9_900_000, 1).allowed());
        assert!(sw.check(&mut s, 19_950_000, 1).allowed());
        sw.refund(&mut s, 9_900_000, 19_950_000, 1);
        assert_eq!((s.last, s.prev, s.cur), (19_950_000, 0, 1));
        assert!(!sw.check(&mut s, 19_960_000, 1).allowed());
        // Two windows on, the charged window no longer weighs: nothing to give back.
        assert!(sw.check(&mut s, 30 * S, 1).allowed());
        let moved_on = s;
        sw.refund(&mut s, 9_900_000, 30 * S, 1);
        assert_eq!(s, moved_on);
        assert!(!sw.check(&mut s, 30 * S + 1, 1).allowed());
    }

    #[test]
    fn rebase_carries_the_weighted_count_rounded_up() {
        let (o, n) = (
            SlidingWindow::new(Quota::per_second(10)).unwrap(),
            SlidingWindow::new(Quota::per(Duration::from_secs(4), 6)).unwrap(),
        );
        // 7 in the previous second, 2 in this one, 300 ms in: 4.9 + 2, carried as 7.
        let mut s = at(S + 100_000, 7, 2);
        n.rebase(&o, &mut s, S + 300_000);
        assert_eq!(s, at(S + 300_000, 0, 7));
        let d = n.decide(&s, S + 300_000, 0);
        assert_eq!(d.remaining(), 0, "7 spent is more than 6: exhausted");
        // Never charged twice: it fades over n's next window like any count.
        assert!(!n.decide(&s, 4 * S + 1, 1).allowed());
        assert!(n.decide(&s, 5 * S, 1).allowed());
        // An earlier clock reads as the stored time; a stale state carries nothing.
        let mut back = at(S + 900_000, 0, 3);
        n.rebase(&o, &mut back, 0);
        assert_eq!(back, at(S + 900_000, 0, 3));
        let mut stale = at(S, 5, 5);
        n.rebase(&o, &mut stale, 3 * S);
        assert_eq!(stale, at(3 * S, 0, 0));
        // The same period: counts are units, kept as they are under another limit.
        let same = SlidingWindow::new(Quota::per_second(3)).unwrap();
        let mut kept = at(S + 5, 7, 2);
        same.rebase(&o, &mut kept, 2 * S);
        assert_eq!(kept, at(S + 5, 7, 2));
    }

    #[test]
    fn clock_going_backwards_counts_as_no_time_elapsed() {
        let sw = SlidingWindow::new(Quota::per_second(2)).unwrap();
        let mut s = SlidingWindowState::default();
        assert!(sw.check(&mut s, 1_999_999, 2).allowed());
        let d = sw.check(&mut s, 500_000, 1);
        assert!(!d.allowed());
        // Measured from the stored 1.999_999 s: 2 × (W − e) / W < 2 from e = 1 µs into the next window.
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1_500_001)));
        assert!(sw.check(&mut s, 1_000, 0).allowed());
    }

    #[test]
    fn idle_timeout_restores_a_fresh_key() {
        let sw = SlidingWindow::new(Quota::per_minute(30)).unwrap();
        let mut s = SlidingWindowState::default();
        let t = 61 * S;
        sw.check(&mut s, t, 30);
        let later = t + sw.idle_timeout_micros();
        let fresh = SlidingWindowState::default();
        assert_eq!(sw.decide(&s, later, 30), sw.decide(&fresh, later, 30));
    }

    #[test]
    fn rejects_burst_and_inexact_quotas() {
        assert_eq!(
            SlidingWindow::new(Quota::per_minute(10).burst(20))
                .unwrap_err()
                .field(),
            "quota.burst"
        );
        let err = SlidingWindow::new(Quota::per_day(1_000_000)).unwrap_err();
        assert_eq!(err.field(), "quota.count");
        assert!(err.message().contains("2^53"), "{err}");
        assert!(SlidingWindow::new(Quota::per_day(100_000)).is_ok());
    }

    #[test]
    fn extreme_times_do_not_panic() {
        let sw = SlidingWindow::new(Quota::per_second(2)).unwrap();
        let mut s = SlidingWindowState::default();
        sw.check(&mut s, u64::MAX, 2);
        sw.decide(&s, u64::MAX, 1);
        sw.decide(&at(u64::MAX, u64::MAX, u64::MAX), 0, 2);
        sw.refund(&mut s, 0, 0, 2);
    }
}
