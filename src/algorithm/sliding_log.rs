//! Sliding window log: an exact record of what was admitted in the last window.

use std::collections::VecDeque;
use std::time::Duration;

use super::{reject_window_burst, Algorithm};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::Quota;

/// Sliding log: a request is allowed when the units admitted in the last `period` plus its cost
/// stay within `count`, exactly, at every instant. It never admits more than `count` units in
/// any span of length `period`.
///
/// Exactness costs memory: the state keeps one [`LogEntry`] (16 bytes) per distinct admission
/// time still inside the window (requests at the same microsecond are coalesced), so a key holds
/// at most `count` entries, and the queue's allocation never exceeds `count` entries either
/// (growth is clamped to it): at most `40 + 16 × count` bytes per key
/// ([`heap_bytes`](SlidingLogState::heap_bytes) reports the heap part). A fresh key allocates
/// nothing; its first admission allocates. To keep that bounded in memory and in Redis (where
/// every request reads the key's whole log), `count` is at most [`SlidingLog::MAX_COUNT`]
/// (1,000, so at most 16 KB of entries per key); a higher count is a [`ConfigError`]. Prefer it
/// for low limits that must be exact (logins, billing-grade counts); for high limits use
/// [`SlidingWindow`](super::SlidingWindow).
///
/// # Exact arithmetic
///
/// `W` is the period in µs and `L = count`. The state is a list of `(at, units)` entries, oldest
/// first, with strictly increasing `at`, and their total `units`. The window at time `t` is
/// `(t − W, t]`: an entry is live while `at + W > t`. At `now`, for a request of `cost`:
///
/// ```text
/// t        = max(now, newest.at)            (an earlier clock counts as no time elapsed)
/// used     = sum of units of live entries
/// allowed  = cost <= L - min(L, used)       (so a cost of 0 always is)
/// after    = used + cost                    (if allowed, else used)
/// remaining   = L - min(L, after)
/// reset       = (t if charged, else newest live at) + W - now µs;   0 if nothing is live
/// retry_after = at_k + W - now µs           (if rejected), where k is the first live entry,
///               oldest first, at which the running sum of units reaches used + cost - L
/// apply:  drop entries that are not live at t; if cost > 0: add cost to the newest entry if
///         its at == t, else append (t, cost)
/// refund (now = the reservation's time): if a live entry has at == now, drop entries that
///         are not live at t and take back min(units, cost) from that entry, removing it at 0;
///         otherwise nothing (the entry left the window, or the clock went back when the
///         charge was made and it went to a later entry). Later entries are other requests'.
/// idle timeout = W µs
/// ```
///
/// # Plan changes
///
/// [`rebase`](Algorithm::rebase) changes nothing: the entries are absolute times and units, so
/// the new quota reads them through its own window and limit. What was admitted stays
/// admitted, once: an upgrade is no reset gift, a downgrade below what the window holds reads
/// as exhausted until enough entries leave it. (Entries that the old, shorter window had
/// already dropped are not brought back.)
///
/// ```
/// use tollgate::algorithm::{Algorithm, SlidingLog};
/// use tollgate::Quota;
///
/// let five = SlidingLog::new(Quota::per_minute(5)).unwrap();
/// let ten = SlidingLog::new(Quota::per_minute(10)).unwrap();
/// let mut state = Default::default();
/// assert!(five.check(&mut state, 0, 4).allowed());
/// ten.rebase(&five, &mut state, 1_000_000);
/// assert_eq!(ten.decide(&state, 1_000_000, 0).remaining(), 6);
/// ```
///
/// ```
/// use std::time::Duration;
/// use tollgate::algorithm::{Algorithm, SlidingLog};
/// use tollgate::Quota;
///
/// let log = SlidingLog::new(Quota::per_minute(100)).unwrap();
/// let mut state = Default::default();
/// // 100 in the last second of one minute, then 100 more just after the seam: all refused.
/// let late = (0..100).filter(|_| log.check(&mut state, 59_000_000, 1).allowed()).count();
/// let early = (0..100).filter(|_| log.check(&mut state, 60_000_000, 1).allowed()).count();
/// assert_eq!((late, early), (100, 0));
/// let d = log.check(&mut state, 61_000_000, 1);
/// assert_eq!(d.retry_after(), Some(Duration::from_secs(58))); // when the batch leaves the window
/// assert_eq!(state.len(), 1); // the 100 coalesced into one entry
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    quota: Quota,
    /// Window length `W`, µs.
    period: u64,
    /// Units per window `L`.
    limit: u64,
}

/// One coalesced admission in a [`SlidingLogState`]: `units` admitted at time `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogEntry {
    /// Admission time, µs.
    pub at: u64,
    /// Units admitted at that time.
    pub units: u64,
}

/// Per-key state of a [`SlidingLog`]: the admissions still inside the window, oldest first.
///
/// The default (fresh key) holds nothing and allocates nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SlidingLogState {
    entries: VecDeque<LogEntry>,
    units: u64,
}

impl SlidingLogState {
    /// The stored entries, oldest first (some may have left the window since the last charge).
    pub fn entries(&self) -> impl ExactSizeIterator<Item = &LogEntry> + DoubleEndedIterator + '_ {
        self.entries.iter()
    }

    /// Number of stored entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is stored (the state of a fresh key).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Total units of the stored entries.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// Heap bytes this state holds: its allocated entries (a fresh key holds none).
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<LogEntry>()
    }

    fn newest_at(&self) -> Option<u64> {
        self.entries.back().map(|e| e.at)
    }
}

/// The log as seen from time `t`: the first `expired` entries have left the window and the
/// live ones hold `used` units.
#[derive(Debug, Clone, Copy)]
struct View {
    t: u64,
    expired: usize,
    used: u64,
}

impl SlidingLog {
    /// The largest `count` a sliding log accepts: 1,000 units per window.
    ///
    /// Each key keeps up to `count` entries of 16 bytes (16 KB at this bound), and the Redis
    /// store reads a key's whole log on every request, so a higher count would let one client
    /// cost megabytes of memory and milliseconds of Redis time per request. Above it, the
    /// [`SlidingWindow`](super::SlidingWindow) counter limits the same window in 24 bytes.
    pub const MAX_COUNT: u64 = 1_000;

    /// A sliding log of `quota.count()` units per `quota.period()`.
    ///
    /// A quota with an explicit burst different from its count, or a count above
    /// [`MAX_COUNT`](Self::MAX_COUNT), is a [`ConfigError`]: a window has no separate burst, and
    /// the log's memory grows with the count.
    ///
    /// ```
    /// use tollgate::algorithm::SlidingLog;
    /// use tollgate::Quota;
    ///
    /// assert!(SlidingLog::new(Quota::per_minute(1_000)).is_ok());
    /// let err = SlidingLog::new(Quota::per_hour(10_000)).unwrap_err();
    /// assert_eq!(err.field(), "quota.count");
    /// assert!(err.message().contains("SlidingWindow"), "{err}");
    /// ```
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        quota.validate()?;
        reject_window_burst(&quota, "sliding_log")?;
        super::reject_calendar(&quota, "sliding_log")?;
        if quota.count() > Self::MAX_COUNT {
            return Err(ConfigError::new(
                "quota.count",
                format!(
                    "sliding_log keeps one entry per admission and allows at most {} per window, \
                     not {}; use AlgorithmKind::SlidingWindow (a counter: fixed memory, same window) \
                     for {quota}, or a count of at most {}",
                    Self::MAX_COUNT,
                    quota.count(),
                    Self::MAX_COUNT,
                ),
            ));
        }
        Ok(Self {
            quota,
            period: quota.period_micros(),
            limit: quota.count(),
        })
    }

    #[inline]
    fn live(&self, entry: &LogEntry, t: u64) -> bool {
        entry.at.saturating_add(self.period) > t
    }

    fn view(&self, state: &SlidingLogState, now: u64) -> View {
        let t = state.newest_at().map_or(now, |at| now.max(at));
        let mut expired_units = 0u64;
        let expired = state
            .entries
            .iter()
            .take_while(|e| !self.live(e, t))
            .inspect(|e| expired_units = expired_units.saturating_add(e.units))
            .count();
        View {
            t,
            expired,
            used: state.units.saturating_sub(expired_units),
        }
    }

    /// Microseconds from `now` until entry `at` leaves the window.
    #[inline]
    fn leaves(&self, at: u64, now: u64) -> u64 {
        at.saturating_add(self.period).saturating_sub(now)
    }

    /// Drops the entries that left the window by `t`, releasing memory a burst left behind.
    fn prune(&self, state: &mut SlidingLogState, v: View) {
        for _ in 0..v.expired {
            state.entries.pop_front();
        }
        state.units = v.used;
        let (len, cap) = (state.entries.len(), state.entries.capacity());
        if cap >= 64 && len * 4 <= cap {
            state.entries.shrink_to(len * 2);
        }
    }

    /// Appends an entry, growing the queue by doubling but never past `limit` entries (the
    /// most a log can hold), so a key's allocation stays within `16 × limit` bytes.
    fn push(&self, state: &mut SlidingLogState, entry: LogEntry) {
        let len = state.entries.len();
        if len == state.entries.capacity() {
            // `limit <= MAX_COUNT`, so this fits a usize.
            let most = usize::try_from(self.limit).unwrap_or(usize::MAX);
            let target = (len * 2).max(4).min(most).max(len + 1);
            state.entries.reserve_exact(target - len);
        }
        state.entries.push_back(entry);
    }
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;

    fn quota(&self) -> &Quota {
        &self.quota
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn decide(&self, state: &SlidingLogState, now: u64, cost: u64) -> Decision {
        let v = self.view(state, now);
        let newest_live = state.entries.iter().skip(v.expired).next_back();
        let reset_now = newest_live.map_or(Duration::ZERO, |e| {
            Duration::from_micros(self.leaves(e.at, now))
        });
        let remaining_now = self.limit.saturating_sub(v.used);
        if cost > self.limit {
            return Decision::impossible(self.limit, remaining_now, reset_now);
        }
        // `cost <= remaining`: a cost of 0 is allowed even when entries left by a larger,
        // earlier limit hold more than this one.
        if cost <= remaining_now {
            let reset = if cost > 0 {
                Duration::from_micros(self.leaves(v.t, now))
            } else {
                reset_now
            };
            return Decision::allowed_with(self.limit, remaining_now - cost, reset);
        }
        let after = v.used.saturating_add(cost);
        // Free `after - L` units: wait for the oldest live entries to leave.
        let excess = after - self.limit;
        let mut freed = 0u64;
        let retry = state
            .entries
            .iter()
            .skip(v.expired)
            .find(|e| {
                freed = freed.saturating_add(e.units);
                freed >= excess
            })
            .map_or(reset_now, |e| Duration::from_micros(self.leaves(e.at, now)));
        Decision::rejected(self.limit, remaining_now, reset_now, retry)
    }

    fn apply(&self, state: &mut SlidingLogState, now: u64, cost: u64) {
        if cost == 0 {
            // Charges nothing, so changes nothing: entries older than this quota's window may
            // still count for another (a key whose plan changed and may change back).
            return;
        }
        let v = self.view(state, now);
        self.prune(state, v);
        let cost = cost.min(self.limit.saturating_sub(v.used));
        if cost == 0 {
            return;
        }
        match state.entries.back_mut() {
            Some(newest) if newest.at == v.t => newest.units += cost,
            _ => self.push(
                state,
                LogEntry {
                    at: v.t,
                    units: cost,
                },
            ),
        }
        state.units += cost;
    }

    /// Gives back up to `cost` units from the entry `now` (the reservation's time) charged,
    /// the live entry at exactly `now`; admissions at other times are other requests' and are
    /// never touched. Without such an entry nothing is given back.
    fn refund(&self, state: &mut SlidingLogState, reserved_at: u64, _now: u64, cost: u64) {
        let v = self.view(state, reserved_at);
        // Entries are strictly increasing in `at`: the first one at or after `reserved_at`, if
        // live.
        let i = state.entries.partition_point(|e| e.at < reserved_at);
        let charged = i >= v.expired && state.entries.get(i).is_some_and(|e| e.at == reserved_at);
        if cost == 0 || !charged {
            return;
        }
        self.prune(state, v);
        let i = i - v.expired;
        let entry = &mut state.entries[i];
        let take = entry.units.min(cost);
        entry.units -= take;
        state.units = state.units.saturating_sub(take);
        if entry.units == 0 {
            state.entries.remove(i);
        }
    }

    /// Keeps the entries as they are: they are times and units, which any quota reads.
    fn rebase(&self, _from: &Self, _state: &mut SlidingLogState, _now: u64) {}

    fn idle_timeout_micros(&self) -> u64 {
        self.period
    }

    fn state_heap_bytes(&self, state: &SlidingLogState) -> usize {
        state.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn exact_in_every_window() {
        let log = SlidingLog::new(Quota::per(Duration::from_secs(10), 3)).unwrap();
        let mut s = SlidingLogState::default();
        assert!(log.check(&mut s, 0, 1).allowed());
        assert!(log.check(&mut s, 4 * S, 1).allowed());
        assert!(log.check(&mut s, 8 * S, 1).allowed());
        let d = log.check(&mut s, 9 * S, 1);
        assert!(!d.allowed());
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_secs(1)),
            "the entry at 0 leaves at 10 s"
        );
        assert!(!log.decide(&s, 10 * S - 1, 1).allowed());
        assert!(log.decide(&s, 10 * S, 1).allowed());
        let d = log.decide(&s, 10 * S, 2);
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_secs(4)),
            "2 units: wait for 4 s too"
        );
    }

    #[test]
    fn seam_never_exceeds_the_limit() {
        let log = SlidingLog::new(Quota::per(Duration::from_secs(10), 5)).unwrap();
        let mut s = SlidingLogState::default();
        let times = [9_900_000, 9_950_000, 9_990_000, 9_995_000, 9_999_999];
        let before = times
            .iter()
            .filter(|&&t| log.check(&mut s, t, 1).allowed())
            .count();
        let after = (0..5)
            .filter(|i| log.check(&mut s, 10 * S + i, 1).allowed())
            .count();
        assert_eq!((before, after), (5, 0));
    }

    #[test]
    fn coalesces_and_prunes() {
        let log = SlidingLog::new(Quota::per_second(100)).unwrap();
        let mut s = SlidingLogState::default();
        for _ in 0..40 {
            log.check(&mut s, 5, 1);
        }
        log.check(&mut s, 6, 2);
        assert_eq!(s.len(), 2);
        assert_eq!(s.units(), 42);
        assert_eq!(
            s.entries().copied().collect::<Vec<_>>(),
            [LogEntry { at: 5, units: 40 }, LogEntry { at: 6, units: 2 }]
        );
        // A cost of 0 changes nothing; a charge prunes.
        log.check(&mut s, S + 5, 0);
        assert_eq!(s.len(), 2);
        log.check(&mut s, S + 5, 1);
        assert_eq!(s.units(), 3);
        log.refund(&mut s, S + 5, S + 5, 1);
        assert_eq!(
            s.entries().map(|e| e.at).collect::<Vec<_>>(),
            [6],
            "pruned on apply"
        );
        assert_eq!(s.units(), 2);
    }

    #[test]
    fn memory_is_released_after_a_burst() {
        let log = SlidingLog::new(Quota::per_second(1_000)).unwrap();
        let mut s = SlidingLogState::default();
        for i in 0..1_000 {
            assert!(log.check(&mut s, i, 1).allowed());
        }
        assert_eq!(s.len(), 1_000);
        assert!(!log.check(&mut s, 1_000, 1).allowed());
        log.check(&mut s, 2 * S, 1);
        assert_eq!(s.len(), 1);
        assert!(
            s.entries.capacity() < 64,
            "capacity {}",
            s.entries.capacity()
        );
    }

    #[test]
    fn rebase_keeps_the_entries_for_the_new_window() {
        let (o, n) = (
            SlidingLog::new(Quota::per_minute(6)).unwrap(),
            SlidingLog::new(Quota::per(Duration::from_secs(10), 2)).unwrap(),
        );
        let mut s = SlidingLogState::default();
        assert!(o.check(&mut s, 0, 3).allowed());
        assert!(o.check(&mut s, 5 * S, 1).allowed());
        let kept = s.clone();
        n.rebase(&o, &mut s, 6 * S);
        assert_eq!(s, kept);
        // All 4 are in n's 10 s window at 6 s: exhausted until the 3 at 0 leave.
        let d = n.decide(&s, 6 * S, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(4)));
        assert_eq!(n.decide(&s, 10 * S, 0).remaining(), 1);
    }

    #[test]
    fn idle_minute_admits_the_limit_of_thirty() {
        let log = SlidingLog::new(Quota::per_minute(20)).unwrap();
        let mut s = SlidingLogState::default();
        assert!(log.check(&mut s, 0, 20).allowed());
        let admitted = (0..30)
            .filter(|_| log.check(&mut s, 61 * S, 1).allowed())
            .count();
        assert_eq!(admitted, 20);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn reset_is_when_the_newest_entry_leaves() {
        let log = SlidingLog::new(Quota::per_second(5)).unwrap();
        let mut s = SlidingLogState::default();
        assert_eq!(log.decide(&s, 0, 0).reset(), Duration::ZERO);
        assert_eq!(log.check(&mut s, 100, 2).reset(), Duration::from_secs(1));
        let d = log.check(&mut s, 300_100, 0);
        assert_eq!(d.reset(), Duration::from_millis(700));
        assert_eq!(d.remaining(), 3);
        assert_eq!(log.decide(&s, S + 100, 0).remaining(), 5);
        assert_eq!(log.decide(&s, S + 99, 0).remaining(), 3);
    }

    #[test]
    fn cost_zero_and_impossible_costs() {
        let log = SlidingLog::new(Quota::per_second(3)).unwrap();
        let mut s = SlidingLogState::default();
        assert!(log.check(&mut s, 0, 0).allowed());
        assert!(s.is_empty());
        assert!(log.check(&mut s, 0, 3).allowed());
        assert!(
            log.check(&mut s, 1, 0).allowed(),
            "cost 0 passes even when exhausted"
        );
        let d = log.decide(&s, 1, 4);
        assert!(d.is_impossible());
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn refund_restores_and_never_overfills() {
        let log = SlidingLog::new(Quota::per_second(8)).unwrap();
        let mut s = SlidingLogState::default();
        log.check(&mut s, 10, 3);
        log.check(&mut s, 20, 1);
        let before = log.decide(&s, 20, 4);
        log.check(&mut s, 20, 4);
        log.refund(&mut s, 20, 20, 4);
        assert_eq!(log.decide(&s, 20, 4), before);
        assert_eq!(s.units(), 4);
        log.refund(&mut s, 20, 20, 100);
        assert_eq!(
            s.entries().copied().collect::<Vec<_>>(),
            [LogEntry { at: 10, units: 3 }],
            "only the entry at the refund's time gives back"
        );
        assert_eq!(s.units(), 3);
        log.refund(&mut s, 10, 10, 100);
        assert!(s.is_empty());
        assert_eq!(s.units(), 0);
    }

    #[test]
    fn refund_after_the_window_moved_on_gives_back_nothing() {
        // 1 per 10 s: reserved at 9.9 s; it leaves the window at 19.9 s, one is admitted at
        // 20 s; the late refund (as of 9.9 s) must not free the newer admission.
        let log = SlidingLog::new(Quota::per(Duration::from_secs(10), 1)).unwrap();
        let mut s = SlidingLogState::default();
        assert!(log.check(&mut s, 9_900_000, 1).allowed());
        assert!(log.check(&mut s, 20 * S, 1).allowed());
        let moved_on = s.clone();
        log.refund(&mut s, 9_900_000, 20 * S, 1);
        assert_eq!(s, moved_on);
        assert!(!log.check(&mut s, 20 * S + 100_000, 1).allowed());
        // Within the window, a late refund takes from its own entry, not the newest one.
        let log = SlidingLog::new(Quota::per(Duration::from_secs(10), 3)).unwrap();
        let mut s = SlidingLogState::default();
        assert!(log.check(&mut s, S, 2).allowed());
        assert!(log.check(&mut s, 2 * S, 1).allowed());
        log.refund(&mut s, S, 2 * S, 5);
        assert_eq!(
            s.entries().copied().collect::<Vec<_>>(),
            [LogEntry {
                at: 2 * S,
                units: 1
            }]
        );
        // Its units are free again, but the one of 2 s stays until 12 s.
        assert!(log.check(&mut s, 3 * S, 2).allowed());
        assert!(!log.check(&mut s, 11 * S, 1).allowed());
        // A charge made while the clock read earlier went to the newest entry: no refund.
        let before = s.clone();
        log.refund(&mut s, 2 * S + 1, 2 * S, 1);
        assert_eq!(s, before);
    }

    #[test]
    fn clock_going_backwards_counts_as_no_time_elapsed() {
        let log = SlidingLog::new(Quota::per_second(1)).unwrap();
        let mut s = SlidingLogState::default();
        assert!(log.check(&mut s, 5 * S, 1).allowed());
        let d = log.check(&mut s, 4 * S, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(2)));
        assert!(log.check(&mut s, 6 * S, 1).allowed());
        assert_eq!(s.entries().map(|e| e.at).collect::<Vec<_>>(), [6 * S]);
    }

    #[test]
    fn idle_timeout_restores_a_fresh_key() {
        let log = SlidingLog::new(Quota::per_minute(10)).unwrap();
        let mut s = SlidingLogState::default();
        let t = 7 * S + 3;
        log.check(&mut s, t, 10);
        let later = t + log.idle_timeout_micros();
        let fresh = SlidingLogState::default();
        assert_eq!(log.decide(&s, later, 10), log.decide(&fresh, later, 10));
        assert_ne!(
            log.decide(&s, later - 1, 10),
            log.decide(&fresh, later - 1, 10)
        );
    }

    #[test]
    fn count_is_capped_and_the_allocation_stays_within_it() {
        assert!(SlidingLog::new(Quota::per_hour(SlidingLog::MAX_COUNT)).is_ok());
        let err = SlidingLog::new(Quota::per_hour(SlidingLog::MAX_COUNT + 1)).unwrap_err();
        assert_eq!(err.field(), "quota.count");
        assert!(err.message().contains("SlidingWindow"), "{err}");
        // A full log of distinct times: growth is clamped to the limit, not a power of two.
        let log = SlidingLog::new(Quota::per_hour(1_000)).unwrap();
        let mut s = SlidingLogState::default();
        for i in 0..5_000 {
            log.check(&mut s, i, 1);
        }
        assert_eq!(s.len(), 1_000);
        assert_eq!(s.heap_bytes(), 1_000 * 16);
    }

    #[test]
    fn rejects_an_explicit_burst() {
        let err = SlidingLog::new(Quota::per_minute(10).burst(20)).unwrap_err();
        assert_eq!(err.field(), "quota.burst");
    }

    #[test]
    fn extreme_times_do_not_panic() {
        let log = SlidingLog::new(Quota::per_second(2)).unwrap();
        let mut s = SlidingLogState::default();
        log.check(&mut s, u64::MAX, 1);
        log.check(&mut s, u64::MAX, 1);
        assert!(log.decide(&s, u64::MAX, 1).retry_after().is_some());
        let before = s.clone();
        log.refund(&mut s, 0, 0, 2);
        assert_eq!(s, before, "nothing was charged at 0");
        // An entry at u64::MAX is never live (its end saturates), so there is nothing to free.
        log.refund(&mut s, u64::MAX, u64::MAX, 2);
        assert_eq!(s.units(), 1);
    }
}
