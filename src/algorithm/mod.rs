//! Rate-limiting algorithms: one file each, every one a pure state transition.
//!
//! An [`Algorithm`] never reads a clock and never touches storage. Given a key's state, the time
//! `now` (integer microseconds, see [`clock`](crate::clock)) and a cost, [`Algorithm::decide`]
//! answers with a [`Decision`] without changing anything, and [`Algorithm::apply`] charges an
//! allowed request. Splitting the two is what lets several limits be all-or-nothing: every limit
//! decides first, and only if all allow is any charged.
//!
//! Every algorithm:
//! - refills lazily from elapsed time (no timers);
//! - treats `State::default()` as a fresh key, which starts full;
//! - caps idle banking at its capacity;
//! - keeps what a key spent beyond its capacity (carried from a larger quota by
//!   [`rebase`](Algorithm::rebase)): it reads as exhausted until the excess is paid back (the
//!   buckets hold it as the time the larger quota takes to refill it), and a cost of 0 never
//!   writes it clamped;
//! - allows a cost of 0 (it reports without charging) and answers a cost above its
//!   [`capacity`](Algorithm::capacity) with [`Decision::impossible`] (waiting never helps);
//! - never earns anything from a `now` earlier than one already seen: the buckets and windows
//!   treat it as no time elapsed; [`Gcra`], which stores no last-seen time, measures it against
//!   its TAT, which is stricter;
//! - never panics, whatever the state (one left by a larger, earlier quota included) or inputs;
//! - reports `remaining` exactly (a cost of `remaining` is allowed right after the decision,
//!   `remaining + 1` is not), `reset` exactly (the limit is whole again after it, not 1 µs
//!   sooner) and `retry_after` exactly (the same request is allowed after waiting it, not 1 µs
//!   sooner);
//! - uses exact integer arithmetic, so the Redis scripts can mirror it bit for bit.
//!
//! | algorithm | state per key | bursts | how it fails |
//! |---|---|---|---|
//! | [`TokenBucket`] | 16 bytes | up to capacity, then the rate | admits capacity + rate × t in any span t |
//! | [`Gcra`] | 16 bytes | same as token bucket | same as token bucket, stored as the time it is full again |
//! | [`FixedWindow`] | 16 bytes | whole window at once | 2× the limit across a window seam |
//! | [`SlidingWindow`] | 24 bytes | up to the limit | approximates; under-counts end-of-window bursts (up to 2× in one period against a seam attack) |
//! | [`SlidingLog`] | 40 bytes + 16 per distinct admission time in the window (at most the limit, itself at most [`SlidingLog::MAX_COUNT`]) | up to the limit | exact; memory grows with the limit |
//! | [`LeakyBucket`] | 16 bytes | queue of capacity, drained at the rate | meters like the token bucket; as a shaper, requests wait |
//!
//! # The formulas, and porting them
//!
//! Each algorithm's rustdoc has a section **Exact arithmetic** with its complete transition:
//! what `decide` computes (allowed, remaining, reset, retry_after), what `apply` and `refund`
//! store, and the idle timeout. Those sections are the specification that the Redis Lua scripts
//! mirror. Every stored integer stays below [`MAX_EXACT`](crate::quota::MAX_EXACT) (2^53) and
//! every product is bounded at construction, so Lua's doubles compute the same integers. Only
//! `+`, `-`, `×`, `min`/`max` and floor / ceiling division of non-negative integers are used;
//! in Lua 5.1, compute `floor(a / b)` as `(a - math.fmod(a, b)) / b`, which is exact for integers
//! below 2^53, and `ceil(a / b)` as that plus 1 when `math.fmod(a, b) > 0`. The one product that
//! can pass 2^53, `elapsed × per` in the buckets, is only ever subtracted from a smaller stored
//! value and clamped at 0, which rounding cannot change.
//!
//! ```
//! use tollgate::algorithm::{Algorithm, TokenBucket};
//! use tollgate::Quota;
//!
//! // Capacity 20, refilling 10 per second.
//! let bucket = TokenBucket::new(Quota::per_second(10).burst(20)).unwrap();
//! let mut state = Default::default();
//! for _ in 0..20 {
//!     assert!(bucket.check(&mut state, 0, 1).allowed());
//! }
//! let d = bucket.check(&mut state, 50_000, 1); // 50 ms later
//! assert!(!d.allowed());
//! assert_eq!(d.retry_after(), Some(std::time::Duration::from_millis(50)));
//! ```

use std::fmt::Debug;

use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::Quota;

mod fixed_window;
mod gcra;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use fixed_window::{FixedWindow, FixedWindowState};
pub use gcra::{Gcra, GcraState};
pub use leaky_bucket::{LeakyBucket, LeakyBucketState};
pub use sliding_log::{LogEntry, SlidingLog, SlidingLogState};
pub use sliding_window::{SlidingWindow, SlidingWindowState};
pub use token_bucket::{TokenBucket, TokenBucketState};

/// Seals [`Algorithm`]: a limit picks one of this module's algorithms by [`AlgorithmKind`], and
/// the Redis scripts mirror exactly these, so an outside implementation could never be used.
mod sealed {
    #[allow(unreachable_pub)] // public in a private module: nameable here only
    pub trait Sealed {}
    impl Sealed for super::TokenBucket {}
    impl Sealed for super::Gcra {}
    impl Sealed for super::FixedWindow {}
    impl Sealed for super::SlidingWindow {}
    impl Sealed for super::SlidingLog {}
    impl Sealed for super::LeakyBucket {}
}

/// A rate-limiting algorithm: a pure transition over a key's state.
///
/// Times are microseconds on a monotonic clock. Implementations must tolerate `now` earlier than
/// a time already seen (treat it as no time elapsed) and any `cost` (a cost above
/// [`capacity`](Self::capacity) gets [`Decision::impossible`]).
///
/// The trait is sealed: call it (a custom store runs these transitions on its own state), but
/// the six algorithms of this module are its only implementations.
pub trait Algorithm: sealed::Sealed + Send + Sync + Debug + 'static {
    /// Per-key state. `Default` is a fresh key, which starts full.
    type State: Default + Debug + Send + Sync + 'static;

    /// The quota this algorithm enforces.
    fn quota(&self) -> &Quota;

    /// The largest cost a single request can ever be granted.
    fn capacity(&self) -> u64;

    /// Decides a request of `cost` at `now` without changing `state`.
    fn decide(&self, state: &Self::State, now: u64, cost: u64) -> Decision;

    /// Charges a request that [`decide`](Self::decide) allowed at the same `now` and `cost`.
    fn apply(&self, state: &mut Self::State, now: u64, cost: u64);

    /// Gives back `cost` that a reservation charged at `reserved_at` (reserve-then-refund
    /// across stores), applied at `now`. The refund may arrive after the state has seen later
    /// times and later charges. It gives back at most what the reservation still takes from
    /// the state as it is now, so the key is never fuller than a key that saw only the
    /// requests actually admitted (never fuller than a fresh key either): a refund never lets
    /// a limit admit more than it would have had the reservation never been made.
    ///
    /// - the windows give back only to the window or log entry the reservation charged (they
    ///   ignore `now`): the [`FixedWindow`] while its stored window is still `reserved_at`'s;
    ///   the [`SlidingWindow`] to the current count while `reserved_at`'s window is the stored
    ///   one, to the previous count once it has moved on by one, nothing later; the
    ///   [`SlidingLog`] to its live entry at exactly `reserved_at`, nothing once it has left
    ///   the window. A refund never frees units of a window it did not charge.
    /// - the buckets ([`TokenBucket`], [`Gcra`], [`LeakyBucket`]) give back `cost` less the
    ///   refill since the reservation, `rate × (t − reserved_at)` where `t` is the latest time
    ///   the key is known to have seen (the token bucket's `max(last, now)`, GCRA's
    ///   `max(now, reserved_at)`): a key without the reservation may have been full and lost
    ///   that refill. Refunded at its own time, a reservation is given back whole; a round
    ///   trip later, the refill of that round trip stays spent (the error only ever goes
    ///   towards refusing). See [`TokenBucket`] for the argument.
    ///
    /// Pass as `now` a time no earlier than any request the key has seen (a refund's own
    /// clock reading, taken after the reservation's answer): GCRA stores no last-seen time
    /// and counts the refill only up to `max(now, reserved_at)`.
    fn refund(&self, state: &mut Self::State, reserved_at: u64, now: u64, cost: u64);

    /// Converts `state`, written under `from` (the same algorithm at another quota: a key whose
    /// plan changed, or a limit changed by a reload), to this quota at `now`, so the key keeps
    /// what it spent: an upgrade is no reset gift, a downgrade no double charge.
    ///
    /// What was spent is read at `now` under `from` and rounded up to whole units (toward
    /// refusing, by less than one unit), then carried, all of it, the part above this quota's
    /// capacity included: the buckets carry what fits as their deficit and the excess as the
    /// time `from` takes to refill it (the key is empty until then: locked out for at most
    /// `from`'s full refill plus this quota's, never years); the fixed window carries its count
    /// into this quota's window holding the end of the window it was counted in (exhausted
    /// until then: a shorter period does not forget a longer window's count); the sliding
    /// window carries its weighted count likewise (into its window holding the end of
    /// `from`'s current one); the log keeps its entries.
    /// With `from` equal to `self` (the same arithmetic) nothing changes. Each algorithm's
    /// rustdoc states its rule under **Plan changes**; the Redis scripts mirror them.
    ///
    /// The stores decide a check at a quota other than the one a key's state was written under
    /// on a converted copy, and store the copy (now written under the check's quota) only if
    /// the check charges something: a check of cost 0, or a rejected one, writes nothing, so
    /// changing back finds the state as it was, and a key that is only checked keeps
    /// refilling at the quota it was written under (a check's figures are the copy's).
    ///
    /// ```
    /// use tollgate::algorithm::{Algorithm, TokenBucket};
    /// use tollgate::Quota;
    ///
    /// let free = TokenBucket::new(Quota::per_minute(10)).unwrap();
    /// let pro = TokenBucket::new(Quota::per_minute(100)).unwrap();
    /// let mut state = Default::default();
    /// assert!(free.check(&mut state, 0, 10).allowed()); // Free is spent
    /// pro.rebase(&free, &mut state, 0); // the key moves to Pro
    /// assert_eq!(pro.decide(&state, 0, 0).remaining(), 90); // not 100
    /// ```
    fn rebase(&self, from: &Self, state: &mut Self::State, now: u64);

    /// Microseconds without requests after which any state the algorithm's own transitions
    /// write is indistinguishable from a fresh key; stores use it to expire idle keys. A state
    /// [`rebase`](Self::rebase) carried from another quota takes longer: a bucket's until its
    /// lock has ended and it has refilled, a fixed window's until the later window it was
    /// carried to has ended (the Redis store sets such a key's TTL to that).
    fn idle_timeout_micros(&self) -> u64;

    /// Heap bytes `state` owns outside itself (a sliding log's entries); 0 for the algorithms
    /// whose state is plain numbers. Stores add it to their memory figures.
    fn state_heap_bytes(&self, state: &Self::State) -> usize {
        let _ = state;
        0
    }

    /// Decides and, if allowed, charges: `decide` followed by `apply`.
    #[inline]
    fn check(&self, state: &mut Self::State, now: u64, cost: u64) -> Decision {
        let decision = self.decide(state, now, cost);
        if decision.allowed() {
            self.apply(state, now, cost);
        }
        decision
    }
}

/// Which algorithm a limit uses; builds the typed algorithm from a [`Quota`].
///
/// ```
/// use tollgate::AlgorithmKind;
///
/// assert_eq!("gcra".parse::<AlgorithmKind>().unwrap(), AlgorithmKind::Gcra);
/// assert_eq!(AlgorithmKind::default(), AlgorithmKind::TokenBucket);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum AlgorithmKind {
    /// [`TokenBucket`]: bursts up to capacity, sustained rate. The default.
    #[default]
    TokenBucket,
    /// [`Gcra`]: token bucket semantics, stored as the time the bucket is full again.
    Gcra,
    /// [`FixedWindow`]: one counter per aligned window.
    FixedWindow,
    /// [`SlidingWindow`]: weighted previous + current window counters.
    SlidingWindow,
    /// [`SlidingLog`]: exact log of admitted requests.
    SlidingLog,
    /// [`LeakyBucket`]: a queue drained at a constant rate.
    LeakyBucket,
}

impl AlgorithmKind {
    /// Every algorithm, in a fixed order.
    pub const ALL: [AlgorithmKind; 6] = [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::SlidingLog,
        AlgorithmKind::LeakyBucket,
    ];

    /// The algorithm's name, as parsed by `FromStr`.
    pub fn as_str(&self) -> &'static str {
        match self {
            AlgorithmKind::TokenBucket => "token_bucket",
            AlgorithmKind::Gcra => "gcra",
            AlgorithmKind::FixedWindow => "fixed_window",
            AlgorithmKind::SlidingWindow => "sliding_window",
            AlgorithmKind::SlidingLog => "sliding_log",
            AlgorithmKind::LeakyBucket => "leaky_bucket",
        }
    }

    /// Checks that this algorithm can enforce `quota` (e.g. window algorithms take no burst).
    pub fn validate(&self, quota: &Quota) -> Result<(), ConfigError> {
        match self {
            AlgorithmKind::TokenBucket => TokenBucket::new(*quota).map(drop),
            AlgorithmKind::Gcra => Gcra::new(*quota).map(drop),
            AlgorithmKind::FixedWindow => FixedWindow::new(*quota).map(drop),
            AlgorithmKind::SlidingWindow => SlidingWindow::new(*quota).map(drop),
            AlgorithmKind::SlidingLog => SlidingLog::new(*quota).map(drop),
            AlgorithmKind::LeakyBucket => LeakyBucket::new(*quota).map(drop),
        }
    }
}

impl std::fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for AlgorithmKind {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace(['-', ' '], "_");
        AlgorithmKind::ALL
            .into_iter()
            .find(|k| k.as_str() == norm)
            .ok_or_else(|| {
                ConfigError::new(
                    "algorithm",
                    format!(
                        "unknown algorithm {s:?}; use one of token_bucket, gcra, fixed_window, sliding_window, sliding_log, leaky_bucket"
                    ),
                )
            })
    }
}

/// A plan change between two time bases. The memory store decides a calendar-aligned quota on
/// Unix time and every other on its clock's own time, so a key switched between the two has its
/// state converted knowing both readings of the same instant: `from_now` on the time base
/// `state` was written on (`from`'s), `now` on this quota's. Only [`FixedWindow`] has calendar
/// quotas; the other algorithms never see two bases and rebase at `now`.
pub(crate) trait RebaseAcross: Algorithm {
    /// [`Algorithm::rebase`] of a state written on `from`'s time base, read there at
    /// `from_now`, to this quota at `now` (the same instant on this quota's time base).
    fn rebase_across(&self, from: &Self, state: &mut Self::State, from_now: u64, now: u64) {
        let _ = from_now;
        self.rebase(from, state, now);
    }
}

impl RebaseAcross for TokenBucket {}
impl RebaseAcross for Gcra {}
impl RebaseAcross for SlidingWindow {}
impl RebaseAcross for SlidingLog {}
impl RebaseAcross for LeakyBucket {}

impl RebaseAcross for FixedWindow {
    fn rebase_across(&self, from: &Self, state: &mut FixedWindowState, from_now: u64, now: u64) {
        self.rebase_between(from, state, from_now, now);
    }
}

/// Rejects a window algorithm's quota that sets a burst different from its count.
pub(crate) fn reject_window_burst(quota: &Quota, name: &str) -> Result<(), ConfigError> {
    if quota.has_explicit_burst() && quota.burst_size() != quota.count() {
        return Err(ConfigError::new(
            "quota.burst",
            format!(
                "{name} counts requests per window and has no separate burst; remove .burst({}) or use the token bucket",
                quota.burst_size()
            ),
        ));
    }
    Ok(())
}

/// Rejects a calendar-aligned quota ([`Quota::aligned`], [`Quota::per_month`]) for an
/// algorithm with no fixed windows to align.
pub(crate) fn reject_calendar(quota: &Quota, name: &str) -> Result<(), ConfigError> {
    if quota.calendar().is_some() {
        return Err(ConfigError::new(
            "quota.calendar",
            format!(
                "{name} has no fixed windows to align to the calendar ({quota}); use the fixed_window algorithm for calendar-aligned quotas, or drop .aligned(..)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn state_sizes_match_the_table() {
        assert_eq!(size_of::<TokenBucketState>(), 16);
        assert_eq!(size_of::<GcraState>(), 16);
        assert_eq!(size_of::<FixedWindowState>(), 16);
        assert_eq!(size_of::<SlidingWindowState>(), 24);
        assert_eq!(size_of::<SlidingLogState>(), 40);
        assert_eq!(size_of::<LogEntry>(), 16);
        assert_eq!(size_of::<LeakyBucketState>(), 16);
    }

    #[test]
    fn every_kind_validates_through_its_constructor() {
        let bursty = Quota::per_second(10).burst(50);
        for kind in AlgorithmKind::ALL {
            let windowed = matches!(
                kind,
                AlgorithmKind::FixedWindow
                    | AlgorithmKind::SlidingWindow
                    | AlgorithmKind::SlidingLog
            );
            assert_eq!(kind.validate(&bursty).is_err(), windowed, "{kind}");
            let daily = Quota::per_day(100).aligned(crate::quota::UtcOffset::hours(2));
            let refused = kind.validate(&daily).err().map(|e| e.field());
            let want = (kind != AlgorithmKind::FixedWindow).then_some("quota.calendar");
            assert_eq!(refused, want, "{kind}");
            assert!(kind.validate(&Quota::per_minute(100)).is_ok(), "{kind}");
            assert!(kind.validate(&Quota::per_minute(0)).is_err(), "{kind}");
        }
    }
}
