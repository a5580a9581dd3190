//! Fixed window: one counter per window, windows aligned to the clock's origin or the calendar.

use std::time::Duration;

use super::{reject_window_burst, Algorithm};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::{Calendar, Quota};

/// Fixed window: at most `count` units per window of `period`, windows cut from the clock's
/// origin (`[k × period, (k + 1) × period)`), so every key's windows line up.
///
/// The cheapest limiter (one counter), and the one with the best-known flaw: a caller who
/// spends a whole window's worth just before a seam and another just after gets **twice the
/// limit** in a moment. Use it for daily or monthly quotas, where that does not matter; use
/// [`SlidingWindow`](super::SlidingWindow) or [`SlidingLog`](super::SlidingLog) where it does.
///
/// # Calendar windows
///
/// A quota [aligned](Quota::aligned) to the calendar, or [monthly](Quota::per_month), has the
/// local hours, days or months of a fixed UTC offset as its windows (see
/// [`Calendar`]). Then `now` is **Unix time** in µs: Redis `TIME`, or the memory store's clock
/// plus its [`unix_offset_micros`](crate::clock::Clock::unix_offset_micros). A month's window
/// is 28 to 31 days, and `reset` / `retry_after` run to its real end:
///
/// ```
/// use std::time::Duration;
/// use tollgate::algorithm::{Algorithm, FixedWindow};
/// use tollgate::quota::UtcOffset;
/// use tollgate::Quota;
///
/// let fw = FixedWindow::new(Quota::per_day(2).aligned(UtcOffset::hours(2))).unwrap();
/// let mut state = Default::default();
/// // 2024-02-28T21:59:59Z is 23:59:59 in UTC+2: one second before local midnight.
/// let t = 1_709_157_599_000_000;
/// assert!(fw.check(&mut state, t, 2).allowed());
/// let d = fw.check(&mut state, t, 1);
/// assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
/// assert!(fw.check(&mut state, t + 1_000_000, 2).allowed(), "a new local day");
/// ```
///
/// # Exact arithmetic
///
/// `P` is the period in µs and `L = count`. The state is the index of the window last charged
/// and the units charged in it. At `now`, for a request of `cost`:
///
/// ```text
/// w        = max(floor(now / P), window)        (an earlier clock stays in the stored window)
/// used     = count  if w == window,  else 0
/// allowed  = cost == 0  or  used + cost <= L
/// after    = used + cost                        (if allowed, else used)
/// remaining   = L - min(after, L)
/// reset       = (w + 1) × P - now µs  if after > 0, else 0
/// retry_after = (w + 1) × P - now µs            (if rejected: the next window always fits)
/// apply:  window = w; count = min(used + cost, max(L, used))
/// refund (now = the reservation's time):
///         if window == floor(now / P): count = count - min(count, cost)
///         else nothing (the window charged is gone: never free a newer window's units)
/// idle timeout = P µs
/// ```
///
/// With a [`Calendar`] (offset `O` µs, `local = max(now + O, 0)`), `floor(now / P)` becomes
/// the calendar's window index and `(w + 1) × P` its end, `end(w)`, in Unix µs:
///
/// ```text
/// hourly, daily (H = 3.6e9 or 8.64e10 µs):
///     index(now) = floor(local / H)                 end(w) = (w + 1) × H - O
/// monthly (D = 8.64e10 µs; civil_from_days / days_from_civil of Howard Hinnant):
///     (y, m)     = civil_from_days(floor(local / D))
///     index(now) = (y - 1970) × 12 + m - 1          (months since January 1970, local)
///     end(w)     = days_from_civil(1970 + floor((w + 1) / 12), (w + 1) mod 12 + 1, 1) × D - O
/// reset, retry_after = end(w) - now;   idle timeout = P (31 days for months)
/// ```
///
/// # Plan changes
///
/// [`rebase`](Algorithm::rebase) from a fixed window `o` (the quota the count was written under)
/// to this one, `n`, at `now` carries the count of `o`'s current window into `n`'s window that
/// holds the end of `o`'s (the current one, or a later one when `n`'s windows are shorter):
///
/// ```text
/// if o.P == n.P and o's calendar == n's: nothing changes   (counts are units; n's limit applies)
/// t     = max(now, start of o's window `window`)   (an earlier clock stays in the stored window:
///                                                   window × o.P, or o's calendar's end(window - 1))
/// spent = count  if window == o.index(t),  else 0  (index(t) = floor(t / P), or the calendar's)
/// window = n.index(t)                              if spent == 0
///          max(n.index(t), n.index(o.end(window) - 1))   otherwise
/// count  = spent
/// ```
///
/// The count is not clamped: a count above `n`'s limit reads as exhausted until the window it
/// went to ends, and is never charged twice (the next window starts empty). A count carried to
/// shorter windows stays counted until the longer window it was counted in ends: `n` admits at
/// most `n`'s limit less that count until then, all of it into that one window, and a change
/// back (or to any other quota) finds it there. So within a window of the longest quota in
/// force, a key switched to shorter windows and back never admits more than the largest limit
/// in force. The price: at the shorter quota, the rest of the longer window is one window.
/// The other way, from shorter windows to a longer one, only the current shorter window's
/// count is carried: what earlier shorter windows of the longer one admitted is not.
///
/// A calendar quota's windows are on Unix time and a plain one's on the clock's time; the
/// memory store's clock need not read Unix time, so a key switched between the two is read at
/// the same instant on each quota's own time base (`t` above on `o`'s, `n.index` of that
/// instant on `n`'s): the count lands in a window of `n` that ends within one of `n`'s periods
/// after `o`'s window does.
///
/// ```
/// use tollgate::algorithm::{Algorithm, FixedWindow};
/// use tollgate::Quota;
///
/// let hourly = FixedWindow::new(Quota::per_hour(100)).unwrap();
/// let daily = FixedWindow::new(Quota::per_day(1_000)).unwrap();
/// let mut state = Default::default();
/// assert!(hourly.check(&mut state, 0, 70).allowed());
/// daily.rebase(&hourly, &mut state, 60_000_000); // 70 of today's 1,000 are spent
/// assert_eq!(daily.decide(&state, 60_000_000, 0).remaining(), 930);
/// ```
///
/// ```
/// use std::time::Duration;
/// use tollgate::algorithm::{Algorithm, FixedWindow};
/// use tollgate::Quota;
///
/// let fw = FixedWindow::new(Quota::per_minute(100)).unwrap();
/// let mut state = Default::default();
/// // 100 in the last second of one window, 100 more in the first second of the next.
/// let late = (0..100).filter(|_| fw.check(&mut state, 59_000_000, 1).allowed()).count();
/// let early = (0..100).filter(|_| fw.check(&mut state, 60_000_000, 1).allowed()).count();
/// assert_eq!(late + early, 200); // the seam doubles the limit
/// let d = fw.check(&mut state, 61_000_000, 1);
/// assert_eq!(d.retry_after(), Some(Duration::from_secs(59))); // the start of the next window
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    quota: Quota,
    /// Window length `P`, µs.
    period: u64,
    /// Units per window `L`.
    limit: u64,
    /// The calendar the windows follow, if any (then `now` is Unix time).
    calendar: Option<Calendar>,
}

/// Per-key state of a [`FixedWindow`]: the window last charged and its count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FixedWindowState {
    /// Index of the window last charged: `floor(now / period)`, or the calendar's index.
    pub window: u64,
    /// Units charged in that window.
    pub count: u64,
}

impl FixedWindow {
    /// A fixed window of `quota.count()` units per `quota.period()`.
    ///
    /// A quota with an explicit burst different from its count is a [`ConfigError`]: a window
    /// has no separate burst.
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        quota.validate()?;
        reject_window_burst(&quota, "fixed_window")?;
        Ok(Self {
            quota,
            period: quota.period_micros(),
            limit: quota.count(),
            calendar: quota.calendar(),
        })
    }

    /// The index of the window holding `now`: `floor(now / P)`, or the calendar's window.
    #[inline]
    pub(crate) fn window_index(&self, now: u64) -> u64 {
        match &self.calendar {
            None => now / self.period,
            Some(calendar) => calendar.window_of(now),
        }
    }

    /// When window `w` starts: `w × P`, or the end of the calendar's window before it.
    fn window_start(&self, w: u64) -> u64 {
        match &self.calendar {
            None => w.saturating_mul(self.period),
            Some(calendar) => w
                .checked_sub(1)
                .map_or(0, |before| calendar.window_end(before)),
        }
    }

    /// `(w, used)`: the effective window at `now` and the units already charged in it.
    #[inline]
    fn window_at(&self, state: &FixedWindowState, now: u64) -> (u64, u64) {
        let w = self.window_index(now);
        if w > state.window {
            (w, 0)
        } else {
            // A count above the limit (carried from a larger quota) is kept as it is.
            (state.window, state.count)
        }
    }

    /// Microseconds from `now` to the end of window `w`.
    #[inline]
    fn until_end(&self, w: u64, now: u64) -> u64 {
        // Saturating throughout: `w` may be `u64::MAX` (a stored or hostile state, or
        // `now = u64::MAX` with a 1 µs period), where the window "ends" at the end of time.
        let end = match &self.calendar {
            None => w.saturating_add(1).saturating_mul(self.period),
            Some(calendar) => calendar.window_end(w),
        };
        end.saturating_sub(now)
    }
}

impl FixedWindow {
    /// [`rebase`](Algorithm::rebase) of a state written on `from`'s time base, where
    /// `from_now` and `now` read the same instant on `from`'s and on this quota's time base
    /// (they differ when one of the two is calendar-aligned and the store's clock is not Unix
    /// time): `from`'s window and count are read at `from_now`, and the count goes to this
    /// quota's window at `now`.
    pub(crate) fn rebase_between(
        &self,
        from: &Self,
        state: &mut FixedWindowState,
        from_now: u64,
        now: u64,
    ) {
        if (self.period, self.calendar) == (from.period, from.calendar) {
            return;
        }
        // The key has seen its stored window: an earlier clock reads as that window's start.
        let t = from_now.max(from.window_start(state.window));
        let spent = if state.window == from.window_index(t) {
            state.count
        } else {
            0
        };
        // The same instant on this quota's time base.
        let here = now.saturating_add(t - from_now);
        let mut window = self.window_index(here);
        if spent > 0 {
            // The count stays counted until the window it was counted in ends: it goes to this
            // quota's window holding that end (a later one than the current when this quota's
            // windows are shorter), so a change back, or to any other quota, still finds it.
            let end = here.saturating_add(from.until_end(state.window, t));
            window = window.max(self.window_index(end.saturating_sub(1)));
        }
        *state = FixedWindowState {
            window,
            count: spent,
        };
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    fn quota(&self) -> &Quota {
        &self.quota
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    #[inline]
    fn decide(&self, state: &FixedWindowState, now: u64, cost: u64) -> Decision {
        let (w, used) = self.window_at(state, now);
        let end = Duration::from_micros(self.until_end(w, now));
        let reset = |after: u64| if after > 0 { end } else { Duration::ZERO };
        let remaining_now = self.limit.saturating_sub(used);
        if cost > self.limit {
            return Decision::impossible(self.limit, remaining_now, reset(used));
        }
        let after = used.saturating_add(cost);
        // A cost of 0 is allowed even when a count carried from a larger quota is above the
        // limit.
        if after <= self.limit || cost == 0 {
            Decision::allowed_with(self.limit, self.limit.saturating_sub(after), reset(after))
        } else {
            Decision::rejected(self.limit, remaining_now, end, end)
        }
    }

    #[inline]
    fn apply(&self, state: &mut FixedWindowState, now: u64, cost: u64) {
        let (w, used) = self.window_at(state, now);
        state.window = w;
        // An allowed charge ends at most at the limit; a cost of 0 keeps a count above it.
        state.count = used.saturating_add(cost).min(self.limit.max(used));
    }

    /// Gives back `cost` only while the stored window is the one `now` (the reservation's
    /// time) charged; once the window has moved on, its count is another window's.
    fn refund(&self, state: &mut FixedWindowState, reserved_at: u64, _now: u64, cost: u64) {
        if state.window == self.window_index(reserved_at) {
            state.count = state.count.saturating_sub(cost);
        }
    }

    fn rebase(&self, from: &Self, state: &mut FixedWindowState, now: u64) {
        self.rebase_between(from, state, now, now);
    }

    fn idle_timeout_micros(&self) -> u64 {
        self.period
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn counts_per_aligned_window() {
        let fw = FixedWindow::new(Quota::per_second(3)).unwrap();
        let mut s = FixedWindowState::default();
        for i in 0..3 {
            let d = fw.check(&mut s, 2 * S + 400_000, 1);
            assert!(d.allowed());
            assert_eq!(d.remaining(), 2 - i);
            assert_eq!(d.reset(), Duration::from_millis(600));
        }
        let d = fw.check(&mut s, 2 * S + 900_000, 1);
        assert!(!d.allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
        assert!(
            !fw.decide(&s, 3 * S - 1, 1).allowed(),
            "1 µs early is still this window"
        );
        assert!(
            fw.decide(&s, 3 * S, 3).allowed(),
            "the next window starts empty"
        );
    }

    #[test]
    fn seam_admits_twice_the_limit() {
        let fw = FixedWindow::new(Quota::per(Duration::from_secs(10), 5)).unwrap();
        let mut s = FixedWindowState::default();
        let times = [9_900_000, 9_950_000, 9_990_000, 9_995_000, 9_999_999];
        let before = times
            .iter()
            .filter(|&&t| fw.check(&mut s, t, 1).allowed())
            .count();
        let after = (0..5)
            .filter(|i| fw.check(&mut s, 10 * S + i, 1).allowed())
            .count();
        assert_eq!(
            before + after,
            10,
            "10 admitted within 100 ms against a limit of 5"
        );
    }

    #[test]
    fn idle_minute_admits_the_limit_of_thirty() {
        let fw = FixedWindow::new(Quota::per_minute(20)).unwrap();
        let mut s = FixedWindowState::default();
        assert!(fw.check(&mut s, 0, 20).allowed());
        let admitted = (0..30)
            .filter(|_| fw.check(&mut s, 61 * S, 1).allowed())
            .count();
        assert_eq!(admitted, 20);
    }

    #[test]
    fn rejects_an_explicit_burst() {
        let err = FixedWindow::new(Quota::per_minute(10).burst(20)).unwrap_err();
        assert_eq!(err.field(), "quota.burst");
        assert!(err.message().contains("fixed_window"), "{err}");
        assert!(FixedWindow::new(Quota::per_minute(10).burst(10)).is_ok());
        assert!(FixedWindow::new(Quota::per_minute(0)).is_err());
    }

    #[test]
    fn cost_zero_and_impossible_costs() {
        let fw = FixedWindow::new(Quota::per_second(4)).unwrap();
        let mut s = FixedWindowState::default();
        let d = fw.check(&mut s, 0, 0);
        assert!(d.allowed());
        assert_eq!((d.remaining(), d.reset()), (4, Duration::ZERO));
        assert_eq!(s.count, 0);
        assert!(fw.check(&mut s, 0, 4).allowed());
        assert!(
            fw.check(&mut s, 0, 0).allowed(),
            "cost 0 passes even when exhausted"
        );
        let d = fw.decide(&s, 0, 5);
        assert!(d.is_impossible());
        assert_eq!(d.reset(), Duration::from_secs(1));
    }

    #[test]
    fn refund_restores_and_never_overfills() {
        let fw = FixedWindow::new(Quota::per_second(4)).unwrap();
        let mut s = FixedWindowState::default();
        fw.check(&mut s, 5 * S, 1);
        let before = fw.decide(&s, 5 * S, 3);
        fw.check(&mut s, 5 * S, 3);
        fw.refund(&mut s, 5 * S, 5 * S, 3);
        assert_eq!(fw.decide(&s, 5 * S, 3), before);
        fw.refund(&mut s, 5 * S, 5 * S, 10);
        assert_eq!(s.count, 0);
        // A refund in a later window does not touch the (already reset) count.
        fw.check(&mut s, 5 * S, 4);
        fw.refund(&mut s, 6 * S, 6 * S, 4);
        assert_eq!(
            s,
            FixedWindowState {
                window: 5,
                count: 4
            }
        );
    }

    #[test]
    fn refund_after_the_window_moved_on_gives_back_nothing() {
        // 1 per 10 s: reserved at 9.9 s, the window moves at 10 s, one admitted at 10.1 s; the
        // late refund (as of 9.9 s) must not let a second one into the window of 10 s.
        let fw = FixedWindow::new(Quota::per(Duration::from_secs(10), 1)).unwrap();
        let mut s = FixedWindowState::default();
        assert!(fw.check(&mut s, 9_900_000, 1).allowed());
        assert!(fw.check(&mut s, 10_100_000, 1).allowed());
        let moved_on = s;
        fw.refund(&mut s, 9_900_000, 10_100_000, 1);
        assert_eq!(s, moved_on, "the new window's count is untouched");
        assert!(!fw.check(&mut s, 10_200_000, 1).allowed());
    }

    #[test]
    fn rebase_carries_the_current_count_once() {
        let (hourly, daily) = (
            FixedWindow::new(Quota::per_hour(10)).unwrap(),
            FixedWindow::new(Quota::per_day(5)).unwrap(),
        );
        let mut s = FixedWindowState::default();
        let t = 30 * 3_600 * S; // 06:00 on day 1
        assert!(hourly.check(&mut s, t, 8).allowed());
        // Downgraded to 5 a day with 8 spent: exhausted until the day ends, not longer.
        daily.rebase(&hourly, &mut s, t + S);
        assert_eq!(
            s,
            FixedWindowState {
                window: 1,
                count: 8
            }
        );
        assert!(!daily.decide(&s, t + S, 1).allowed());
        assert_eq!(daily.decide(&s, 2 * 86_400 * S, 0).remaining(), 5);
        // Back to hourly: the day's 8 stay counted until the day ends, in its last hour, so
        // the day never admits more than the larger of the limits in force (10).
        let mut back = s;
        hourly.rebase(&daily, &mut back, t + 2 * S);
        assert_eq!(
            back,
            FixedWindowState {
                window: 47,
                count: 8
            }
        );
        assert_eq!(hourly.decide(&back, t + 2 * S, 0).remaining(), 2);
        hourly.rebase(&daily, &mut s, t + 3_600 * S);
        assert_eq!(hourly.decide(&s, t + 3_600 * S, 0).remaining(), 2);
        assert_eq!(hourly.decide(&s, t + 7_200 * S, 0).remaining(), 2);
        assert_eq!(hourly.decide(&s, 2 * 86_400 * S, 0).remaining(), 10);
        // And back to daily finds them in the same day.
        let mut day = s;
        daily.rebase(&hourly, &mut day, t + 7_200 * S);
        assert_eq!(
            day,
            FixedWindowState {
                window: 1,
                count: 8
            }
        );
        // A stale window carries nothing; an earlier clock stays in the stored window.
        let mut stale = FixedWindowState {
            window: 3,
            count: 9,
        };
        daily.rebase(&hourly, &mut stale, 5 * 3_600 * S);
        assert_eq!(
            stale,
            FixedWindowState {
                window: 0,
                count: 0
            }
        );
        let mut ahead = FixedWindowState {
            window: 31,
            count: 4,
        };
        daily.rebase(&hourly, &mut ahead, 0);
        assert_eq!(
            ahead,
            FixedWindowState {
                window: 1,
                count: 4
            }
        );
    }

    #[test]
    fn rebase_follows_calendar_windows() {
        use crate::quota::UtcOffset;
        let local = UtcOffset::hours(2);
        let hourly = FixedWindow::new(Quota::per_hour(10).aligned(local)).unwrap();
        let monthly = FixedWindow::new(Quota::per_month(100).aligned(local)).unwrap();
        // 2024-02-29T21:30:00Z: 23:30 local, the last hour of February in UTC+2.
        let t = 1_709_242_200_000_000;
        let mut s = FixedWindowState::default();
        assert!(hourly.check(&mut s, t, 7).allowed());
        monthly.rebase(&hourly, &mut s, t + S);
        assert_eq!(monthly.decide(&s, t + S, 0).remaining(), 93);
        // 31 minutes later it is March locally: a new month, whole.
        assert_eq!(monthly.decide(&s, t + 1_860 * S, 0).remaining(), 100);
        // Back to hourly in the same local hour: 7 still spent.
        hourly.rebase(&monthly, &mut s, t + 2 * S);
        assert_eq!(hourly.decide(&s, t + 2 * S, 0).remaining(), 3);
        // Same period and calendar: unchanged.
        let kept = s;
        hourly.rebase(&hourly, &mut s, t + 3 * S);
        assert_eq!(s, kept);
    }

    #[test]
    fn clock_going_backwards_stays_in_the_stored_window() {
        let fw = FixedWindow::new(Quota::per_second(1)).unwrap();
        let mut s = FixedWindowState::default();
        assert!(fw.check(&mut s, 5 * S, 1).allowed());
        let d = fw.check(&mut s, 4 * S, 1);
        assert!(!d.allowed(), "an earlier window does not reopen");
        assert_eq!(d.retry_after(), Some(Duration::from_secs(2)));
        assert!(fw.check(&mut s, 6 * S, 1).allowed());
    }

    #[test]
    fn idle_timeout_restores_a_fresh_key() {
        let fw = FixedWindow::new(Quota::per_minute(10)).unwrap();
        let mut s = FixedWindowState::default();
        let t = 123 * S + 456;
        fw.check(&mut s, t, 10);
        let fresh = FixedWindowState::default();
        let later = t + fw.idle_timeout_micros();
        assert_eq!(fw.decide(&s, later, 10), fw.decide(&fresh, later, 10));
    }

    #[test]
    fn extreme_times_do_not_panic() {
        let fw = FixedWindow::new(Quota::per_second(2)).unwrap();
        let mut s = FixedWindowState::default();
        fw.check(&mut s, u64::MAX, 2);
        assert!(fw.decide(&s, u64::MAX, 1).retry_after().is_some());
        fw.refund(&mut s, 0, 0, 2);
    }

    #[test]
    fn extreme_window_index_does_not_panic() {
        // `w + 1` overflowed here: a stored window of u64::MAX, or `now = u64::MAX` with a
        // 1 µs period (window index u64::MAX).
        let fw = FixedWindow::new(Quota::per(Duration::from_micros(1), 1)).unwrap();
        let mut s = FixedWindowState {
            window: u64::MAX,
            count: u64::MAX,
        };
        let d = fw.decide(&s, 0, 1);
        assert!(!d.allowed());
        assert_eq!(d.remaining(), 0);
        fw.check(&mut s, u64::MAX, 1);
        fw.refund(&mut s, u64::MAX, u64::MAX, u64::MAX);
        let mut fresh = FixedWindowState::default();
        assert!(fw.check(&mut fresh, u64::MAX, 1).allowed());
        assert!(!fw.check(&mut fresh, u64::MAX, 1).allowed());
    }
}
