//! GCRA (generic cell rate algorithm): token-bucket admissions stored as one timestamp.

use std::time::Duration;

use super::Algorithm;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::{Quota, MAX_EXACT};

/// GCRA: the same admissions as a [`TokenBucket`](super::TokenBucket) of capacity `burst`
/// refilling `count / period`, stored as the *theoretical arrival time* (TAT): the moment at
/// which the bucket would be full again.
///
/// The TAT is exact at any rate: it is kept in the token bucket's fixed point
/// ([`Quota::fixed_point`]), as whole microseconds plus a fraction of a microsecond in steps of
/// `1 / per` µs, so `Quota::per_second(3)` or a byte rate of `10 MiB/s` (far above one unit per
/// microsecond) is enforced to the unit, with no rounding of the emission interval. GCRA and
/// the token bucket make the same decisions for every quota; GCRA's state says *when* the key is
/// whole again rather than *how much* it is missing.
///
/// # Exact arithmetic
///
/// `unit = period_us / g` steps per unit and `per = count / g` steps per µs, with
/// `g = gcd(period_us, count)`; `cap = burst × unit` (the burst tolerance, in steps). The state
/// is `(tat, sub)`: the TAT is `tat + sub / per` µs, with `0 <= sub < per`; `(0, 0)` is a fresh
/// key, full. At `now`, for a request of `cost`:
///
/// ```text
/// before   = min((tat - now) × per + sub, 2^53 - 1)   if tat >= now, else 0   steps until full
/// need     = cost × unit
/// allowed  = cost == 0  or  before <= cap - need
/// after    = before + need                 (if allowed, else before)
/// remaining   = floor((cap - min(after, cap)) / unit)
/// reset       = ceil(after / per) µs
/// retry_after = ceil((before - (cap - need)) / per) µs     (if rejected)
/// apply:  (b, s) = (tat, sub) if tat >= now, else (now, 0);  steps = s + need;
///         tat = b + floor(steps / per);  sub = steps mod per
/// refund (of a reservation of cost at `at`, applied at now):
///         t = max(now, at);  before = before at t;  only if before > 0:
///         give  = max(0, need - (t - at) × per)
///         steps = before - min(before, give)
///         tat = t + floor(steps / per);  sub = steps mod per
/// idle timeout = ceil(cap / per) µs
/// ```
///
/// When `count` divides the period (`per = 1`), `sub` is always 0 and `tat` advances by the
/// emission interval `unit` µs per unit: the textbook GCRA. Every stored value is a time below
/// `now + idle timeout` or a fraction below `per`, both below 2^53 for every quota `new`
/// accepts (it refuses a refill longer than 2^52 µs, 142 years) while the clock reads below
/// 2^52 µs, so the Redis script mirrors this with plain Lua numbers.
///
/// `before` is at most `cap` for every state the algorithm writes (more only after the clock
/// stepped back); the `2^53 - 1` ceiling only bounds state it cannot have written (a TAT
/// centuries ahead, left by something else at the Redis key), so the Lua script, whose numbers
/// are doubles, computes the same `reset` and `retry_after` to the microsecond.
///
/// A `now` earlier than a previous request is measured against the TAT as it stands: it never
/// earns anything (it is, if anything, stricter than "no time elapsed"), and a cost of 0 is
/// always allowed.
///
/// A refund moves the TAT back by what the reservation still takes: `need` less the refill
/// since `at`, which a key without the reservation may have lost to being full. It is the
/// token bucket's refund ([`TokenBucket`](super::TokenBucket) gives the argument) with
/// `t = max(now, at)` for `last'`: GCRA stores no last-seen time, so `now` must be no earlier
/// than the requests the key has seen (the refund's own clock reading) for the key never to
/// be fuller than one that saw only what was admitted. A TAT in the past reads as full, never
/// fuller.
///
/// # Plan changes
///
/// [`rebase`](Algorithm::rebase) from a GCRA `o` (the quota the TAT was written under) to this
/// one, `n`, at `now` carries what the key spent exactly as the [`TokenBucket`](super::TokenBucket) does (see its
/// **Plan changes**): `o`'s steps before full are, up to `o`'s capacity, a deficit, and beyond
/// it a lock (`ceil((before - o.cap) / o.per)` µs before anything refills); both go through the
/// token bucket's conversion, and the result is stored as a TAT:
///
/// ```text
/// if (o.unit, o.per, o.cap) == (n.unit, n.per, n.cap): nothing changes
/// (deficit, lock) = the token bucket's conversion of (min(before, o.cap), that lock)
/// if deficit == 0 and lock == 0:  (tat, sub) = (0, 0)        (full: a fresh key)
/// else:  steps = min(lock × n.per + deficit, 2^53 - 1, (2^52 - 1) × n.per)
///        tat = now + floor(steps / n.per);  sub = steps mod n.per
/// ```
///
/// Right after the change, `remaining = max(0, n.burst - spent)`: an upgrade is no reset gift.
/// A downgrade to less than was spent keeps all of it, the excess as the time `o` takes to
/// refill it: the TAT is that lock plus `n`'s burst tolerance ahead, the key is empty until the
/// lock ends and `retry_after` says exactly when it fits again. Such a TAT outlives the idle
/// timeout: the key is whole again at the TAT.
///
/// ```
/// use tollgate::algorithm::{Algorithm, Gcra};
/// use tollgate::Quota;
///
/// let free = Gcra::new(Quota::per_minute(10)).unwrap();
/// let pro = Gcra::new(Quota::per_minute(100)).unwrap();
/// let mut tat = Default::default();
/// assert!(free.check(&mut tat, 0, 10).allowed());
/// pro.rebase(&free, &mut tat, 30_000_000); // 30 s later: 5 came back, 5 stay spent
/// assert_eq!(pro.decide(&tat, 30_000_000, 0).remaining(), 95);
/// ```
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
///
/// // A byte rate: 10 MiB per second, exactly (10,485.76 bytes per millisecond).
/// let bytes = Gcra::new(Quota::per_second(10 * 1024 * 1024)).unwrap();
/// let mut state = Default::default();
/// assert!(bytes.check(&mut state, 0, 10 * 1024 * 1024).allowed());
/// assert_eq!(bytes.decide(&state, 1_000, 0).remaining(), 10_485);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    quota: Quota,
    /// Fixed-point steps per unit.
    unit: u64,
    /// Fixed-point steps per microsecond.
    per: u64,
    /// Burst tolerance `burst × unit`, steps.
    cap: u64,
}

/// The longest refill (µs) a [`Gcra`] accepts: 2^52, about 142 years.
const MAX_REFILL: u64 = 1 << 52;

/// Per-key state of a [`Gcra`]: the theoretical arrival time, `tat + sub / per` µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GcraState {
    /// Whole microseconds of the time at which the bucket is full again; a TAT `<= now` means
    /// full.
    pub tat: u64,
    /// The fraction of a microsecond past `tat`, in fixed-point steps (`< per`).
    pub sub: u64,
}

impl Gcra {
    /// A GCRA limiter of capacity `quota.burst_size()`, refilling `quota.count()` per
    /// `quota.period()` exactly.
    ///
    /// Returns a [`ConfigError`] when [`Quota::validate`] does.
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        quota.validate()?;
        super::reject_calendar(&quota, "gcra")?;
        let fp = quota.fixed_point();
        // `validate` keeps `burst × unit` below 2^53.
        let cap = quota.burst_size() * fp.unit;
        // The TAT is a clock reading plus up to this refill time; both below 2^52 keeps it
        // below 2^53 (Unix time in µs stays below 2^52 until 2112).
        if cap.div_ceil(fp.per_micro) >= MAX_REFILL {
            return Err(ConfigError::new(
                "quota.burst",
                format!(
                    "gcra stores the time its bucket is full again, and {quota} takes more than \
                     142 years (2^52 µs) to refill; lower the burst or the period, or use the token bucket"
                ),
            ));
        }
        Ok(Self {
            quota,
            unit: fp.unit,
            per: fp.per_micro,
            cap,
        })
    }

    /// Fixed-point steps until the bucket is full at `now` (0 when the TAT has passed).
    #[inline]
    fn before(&self, state: &GcraState, now: u64) -> u64 {
        match state.tat.checked_sub(now) {
            // Saturating, then capped: exact below the cap, as the Lua mirror is.
            Some(ahead) => ahead
                .saturating_mul(self.per)
                .saturating_add(state.sub)
                .min(MAX_EXACT - 1),
            None => 0,
        }
    }

    #[inline]
    fn remaining(&self, after: u64) -> u64 {
        (self.cap - after.min(self.cap)) / self.unit
    }

    /// `ceil(steps / per)` µs.
    #[inline]
    fn micros(&self, steps: u64) -> Duration {
        Duration::from_micros(if self.per == 1 {
            steps
        } else {
            steps.div_ceil(self.per)
        })
    }

    /// The most steps a plan change carries: below 2^53 (exact in the Lua mirror) and less
    /// than [`MAX_REFILL`] µs of refill, so the TAT stays below 2^53 while the clock reads below
    /// 2^52 µs. `min(2^53 - 1, (2^52 - 1) × per)`.
    #[inline]
    fn max_carried(&self) -> u64 {
        (MAX_REFILL - 1).saturating_mul(self.per).min(MAX_EXACT - 1)
    }

    /// Stores a TAT `steps` steps after `base` µs.
    #[inline]
    fn store(&self, state: &mut GcraState, base: u64, steps: u64) {
        state.tat = base.saturating_add(steps / self.per);
        state.sub = steps % self.per;
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
        let before = self.before(state, now);
        if cost > limit {
            return Decision::impossible(limit, self.remaining(before), self.micros(before));
        }
        // `cost <= burst`, so `need <= cap < 2^53`.
        let slack = self.cap - cost * self.unit;
        if cost == 0 || before <= slack {
            let after = before.saturating_add(cost * self.unit);
            Decision::allowed_with(limit, self.remaining(after), self.micros(after))
        } else {
            Decision::rejected(
                limit,
                self.remaining(before),
                self.micros(before),
                self.micros(before - slack),
            )
        }
    }

    #[inline]
    fn apply(&self, state: &mut GcraState, now: u64, cost: u64) {
        let need = cost.min(self.capacity()) * self.unit;
        let (base, sub) = if state.tat >= now {
            (state.tat, state.sub.min(self.per - 1))
        } else {
            (now, 0)
        };
        self.store(state, base, sub + need);
    }

    fn refund(&self, state: &mut GcraState, reserved_at: u64, now: u64, cost: u64) {
        // The latest time the key is known to have seen: it stores no last-seen time.
        let now = now.max(reserved_at);
        let before = self.before(state, now);
        if before > 0 {
            // The hole may have refilled since the reservation while a key without it was full.
            let refilled = (now - reserved_at).saturating_mul(self.per);
            let give = cost.saturating_mul(self.unit).saturating_sub(refilled);
            self.store(state, now, before.saturating_sub(give));
        }
    }

    fn rebase(&self, from: &Self, state: &mut GcraState, now: u64) {
        if (self.unit, self.per, self.cap) == (from.unit, from.per, from.cap) {
            return;
        }
        // Steps before full at `from`: up to its capacity a deficit, beyond it a lock (the
        // time before anything refills), as the token bucket's state holds them.
        let before = from.before(state, now);
        let (deficit, lock) = if before > from.cap {
            (from.cap, (before - from.cap).div_ceil(from.per))
        } else {
            (before, 0)
        };
        let (deficit, lock) =
            super::token_bucket::carry((from.unit, from.per), (self.unit, self.cap), deficit, lock);
        if deficit == 0 && lock == 0 {
            *state = GcraState::default();
        } else {
            let steps = u128::from(lock) * u128::from(self.per) + u128::from(deficit);
            let steps = u64::try_from(steps)
                .map_or(u64::MAX, |s| s)
                .min(self.max_carried());
            self.store(state, now, steps);
        }
    }

    fn idle_timeout_micros(&self) -> u64 {
        self.cap.div_ceil(self.per)
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
    fn matches_token_bucket_for_any_quota() {
        // Uneven rates (count does not divide the period) and rates far above one per µs.
        for q in [
            Quota::per_second(3).burst(2),
            Quota::per(Duration::from_micros(7), 1_000),
            Quota::per_second(10 * 1024 * 1024),
            Quota::per_second(1_000_000_000).burst(3_000_000_000),
            Quota::per(Duration::from_secs(365 * 86_400), 1),
        ] {
            let (g, tb) = (Gcra::new(q).unwrap(), TokenBucket::new(q).unwrap());
            let (mut gs, mut ts) = (GcraState::default(), Default::default());
            let (mut now, mut x) = (1u64, 0x9E37_79B9_7F4A_7C15u64);
            let cap = g.capacity();
            for i in 0u64..2_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                now += x % 5 * (x >> 8) % (g.idle_timeout_micros() / 8 + 2);
                let cost = match i % 5 {
                    0 => 0,
                    1 => cap,
                    _ => (x >> 20) % (cap / 3 + 2),
                };
                let (a, b) = (g.check(&mut gs, now, cost), tb.check(&mut ts, now, cost));
                assert_eq!(a, b, "{q}: request {i} at {now}, cost {cost}");
                assert!(gs.sub < g.per, "{gs:?}");
            }
        }
    }

    #[test]
    fn refill_beyond_142_years_is_refused() {
        let century = Duration::from_secs(100 * 365 * 86_400);
        assert!(Gcra::new(Quota::per(century, 1)).is_ok());
        let err = Gcra::new(Quota::per(century, 1).burst(2)).unwrap_err();
        assert_eq!(err.field(), "quota.burst");
        assert!(err.message().contains("142 years"), "{err}");
    }

    #[test]
    fn uneven_rate_is_exact() {
        // 3 per second, drained at 0: units come back at 333_334, 666_667 and 1_000_000 µs
        // (ceil of k/3 s); an emission interval rounded to 333_334 µs made it 1_000_002.
        let g = Gcra::new(Quota::per_second(3)).unwrap();
        let mut s = GcraState::default();
        assert!(g.check(&mut s, 0, 3).allowed());
        assert!(!g.decide(&s, 333_333, 1).allowed());
        assert!(g.check(&mut s, 333_334, 1).allowed());
        assert!(!g.decide(&s, 666_666, 1).allowed());
        assert!(g.check(&mut s, 666_667, 1).allowed());
        let d = g.check(&mut s, 999_999, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        assert!(g.check(&mut s, 1_000_000, 1).allowed());
    }

    #[test]
    fn a_billion_per_second_is_a_billion_per_second() {
        // The old emission interval rounded 1 ns up to 1 µs: a million per second.
        let g = Gcra::new(Quota::per_second(1_000_000_000).burst(1_000)).unwrap();
        let mut s = GcraState::default();
        assert!(g.check(&mut s, 0, 1_000).allowed());
        assert_eq!(g.decide(&s, 0, 0).remaining(), 0);
        assert_eq!(g.decide(&s, 1, 0).remaining(), 1_000, "1,000 units per µs");
        assert!(g.check(&mut s, 1, 1_000).allowed());
        let d = g.check(&mut s, 1, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
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
        g.refund(&mut s, 10 * S, 10 * S, 3);
        assert_eq!(g.decide(&s, 10 * S, 3), before);
        g.refund(&mut s, 10 * S, 10 * S, 50);
        assert_eq!(
            s,
            GcraState {
                tat: 10 * S,
                sub: 0
            },
            "refunded down to full, not beyond"
        );
        assert_eq!(g.decide(&s, 10 * S, 0).remaining(), 5);
    }

    #[test]
    fn late_refund_gives_back_only_what_did_not_refill() {
        // Capacity 10, 1/s (as the token bucket's test): 5 reserved at 0 s, 8 admitted at 3 s
        // (3 of the 5 refilled meanwhile); refunded at 3 s, 2 come back, as without it.
        let g = Gcra::new(Quota::per_second(1).burst(10)).unwrap();
        let mut s = GcraState::default();
        assert!(g.check(&mut s, 0, 5).allowed());
        assert!(g.check(&mut s, 3 * S, 8).allowed());
        g.refund(&mut s, 0, 3 * S, 5);
        assert_eq!(
            s,
            GcraState {
                tat: 11 * S,
                sub: 0
            }
        );
        assert_eq!(g.decide(&s, 3 * S, 0).remaining(), 2);
        // A refund clock reading before the reservation counts from the reservation: whole.
        let mut s = GcraState::default();
        assert!(g.check(&mut s, 4 * S, 5).allowed());
        g.refund(&mut s, 4 * S, S, 5);
        assert_eq!(s, GcraState { tat: 4 * S, sub: 0 });
        // Refunded 9 s later, 9 of 10 refilled: 1 comes back (full, as without it), not 10.
        assert!(g.check(&mut s, 4 * S, 10).allowed());
        assert!(g.check(&mut s, 13 * S, 0).allowed());
        g.refund(&mut s, 4 * S, 13 * S, 10);
        assert_eq!(
            s,
            GcraState {
                tat: 13 * S,
                sub: 0
            }
        );
        // 10 s later, all of it refilled: nothing comes back.
        let mut s = GcraState::default();
        assert!(g.check(&mut s, 4 * S, 10).allowed());
        let spent = s;
        g.refund(&mut s, 4 * S, 14 * S, 10);
        assert_eq!(s, spent);
    }

    #[test]
    fn rebase_carries_spent_units_as_the_token_bucket_does() {
        let quotas = [
            Quota::per_second(3).burst(5),
            Quota::per_second(10).burst(2),
            Quota::per(Duration::from_micros(7), 1_000),
            Quota::per_minute(7),
        ];
        for o in quotas {
            for n in quotas {
                let (go, gn) = (Gcra::new(o).unwrap(), Gcra::new(n).unwrap());
                let (to, tn) = (TokenBucket::new(o).unwrap(), TokenBucket::new(n).unwrap());
                let (mut gs, mut ts) = (GcraState::default(), Default::default());
                let cost = go.capacity().div_ceil(2);
                assert!(go.check(&mut gs, 1_000, cost).allowed());
                assert!(to.check(&mut ts, 1_000, cost).allowed());
                for at in [1_000, 1_001, 2_000, 400_000] {
                    let (mut g, mut t) = (gs, ts);
                    gn.rebase(&go, &mut g, at);
                    tn.rebase(&to, &mut t, at);
                    for later in [at, at + 1, at + 333_333, at + 10 * S] {
                        for c in [0, 1] {
                            assert_eq!(
                                gn.decide(&g, later, c),
                                tn.decide(&t, later, c),
                                "{o} -> {n} at {at}, read at {later}, cost {c}"
                            );
                        }
                    }
                    // Straight back: nothing comes back but the refill.
                    go.rebase(&gn, &mut g, at);
                    to.rebase(&tn, &mut t, at);
                    assert_eq!(go.decide(&g, at, 1), to.decide(&t, at, 1));
                }
            }
        }
        // Nothing spent: a fresh key; same arithmetic: unchanged.
        let (o, n) = (
            Gcra::new(Quota::per_second(1)).unwrap(),
            Gcra::new(Quota::per_second(2)).unwrap(),
        );
        let mut s = GcraState { tat: 5, sub: 0 };
        n.rebase(&o, &mut s, 9);
        assert_eq!(s, GcraState::default());
        let mut s = GcraState { tat: 5 * S, sub: 0 };
        o.rebase(&o, &mut s, 0);
        assert_eq!(s, GcraState { tat: 5 * S, sub: 0 });
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
        g.refund(&mut s, u64::MAX, u64::MAX, 20);
        g.decide(&s, 0, 20);
    }
}
