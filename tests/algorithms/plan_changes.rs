//! Plan changes on every algorithm: a key's state written under one quota (`o`) and converted
//! with [`Algorithm::rebase`] to another (`n`) keeps what the key spent.
//!
//! For random quotas, random request streams under `o` and a random time of the change:
//! - the buckets: remaining under `n` is `max(0, n.capacity - spent)`, where `spent` is what `o`
//!   reports spent (`o.capacity - remaining`, the deficit rounded up to whole units);
//! - the fixed window: the same, and the key is whole again when `n`'s window ends (never
//!   charged twice);
//! - the sliding window: the weighted count rounded up is carried (at most one unit more than
//!   `o` reports spent, never less);
//! - the sliding log: the entries are kept, and `n` reads them;
//! - every algorithm: never more than a fresh key; `rebase(o -> o)` is the identity; a round
//!   trip `o -> n -> o` gives nothing back, whether or not `n` holds what was spent (the excess
//!   above a lower capacity stays spent).

use std::time::Duration;

use proptest::prelude::*;
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow, SlidingWindowState,
    TokenBucket,
};
use tollgate::Quota;

/// A quota of `count` per `period` µs (at least `count` µs), with a burst for the buckets.
fn quota(with_burst: bool) -> impl Strategy<Value = Quota> {
    let period = prop_oneof![1u64..=64, 64u64..=10_000, 10_000u64..=5_000_000];
    (1u64..=12, period, 1u64..=16).prop_map(move |(count, period, burst)| {
        let q = Quota::per(Duration::from_micros(period.max(count)), count);
        if with_burst {
            q.burst(burst)
        } else {
            q
        }
    })
}

/// Two quotas (the second sometimes equal to the first, or of the same period), a stream of
/// `(time, cost)` under the first starting at a random offset, and the time of the change:
/// after the last request, at it, or (a clock that went back) before it.
fn case(with_burst: bool) -> impl Strategy<Value = (Quota, Quota, Vec<(u64, u64)>, u64)> {
    (quota(with_burst), quota(with_burst), 0u8..4)
        .prop_map(|(o, n, pick)| match pick {
            0 => (o, o),
            1 => {
                // Same period, another count (and burst): the windows keep their counts.
                let same = Quota::per(o.period(), n.count().min(o.period_micros()));
                (
                    o,
                    if n.has_explicit_burst() {
                        same.burst(n.burst_size())
                    } else {
                        same
                    },
                )
            }
            _ => (o, n),
        })
        .prop_flat_map(|(o, n)| {
            let w = o.period_micros();
            let cap = o.burst_size();
            let gap = prop_oneof![
                4 => Just(0u64),
                4 => 0..=w / o.count(),
                1 => 0..=3 * w,
            ];
            let cost = prop_oneof![6 => Just(1u64), 1 => Just(0u64), 2 => 0..=cap];
            let change = prop_oneof![
                2 => (0..=2 * w).prop_map(|d| d as i64),
                1 => Just(0i64),
                1 => (0..=w).prop_map(|d| -(d as i64)),
            ];
            (
                Just(o),
                Just(n),
                0..=10 * w,
                prop::collection::vec((gap, cost), 0..40),
                change,
            )
        })
        .prop_map(|(o, n, start, gaps, change)| {
            let mut now = start;
            let ops: Vec<_> = gaps
                .into_iter()
                .map(|(gap, cost)| {
                    now += gap;
                    (now, cost)
                })
                .collect();
            (o, n, ops, now.saturating_add_signed(change))
        })
}

/// The state `ops` leave under `o`, and the same state rebased to `n` at `now`.
fn rebased<A: Algorithm>(o: &A, n: &A, ops: &[(u64, u64)], now: u64) -> (A::State, A::State)
where
    A::State: Clone,
{
    let mut state = A::State::default();
    for &(at, cost) in ops {
        o.check(&mut state, at, cost);
    }
    let before = state.clone();
    n.rebase(o, &mut state, now);
    (before, state)
}

/// What every algorithm holds: no more than a fresh key, identity on the same quota, and a
/// round trip through `n` gives nothing back, whatever `n` holds.
fn assert_common<A: Algorithm>(
    o: &A,
    n: &A,
    before: &A::State,
    after: &A::State,
    now: u64,
) -> Result<(), TestCaseError>
where
    A::State: Clone + PartialEq,
{
    let fresh = n.decide(&A::State::default(), now, 0).remaining();
    prop_assert!(n.decide(after, now, 0).remaining() <= fresh);

    let mut same = before.clone();
    o.rebase(o, &mut same, now);
    prop_assert_eq!(&same, before, "rebase(o -> o) is the identity");

    // Whatever `n` holds: what `n` cannot hold stays spent too.
    let mut back = after.clone();
    o.rebase(n, &mut back, now);
    prop_assert!(
        o.decide(&back, now, 0).remaining() <= o.decide(before, now, 0).remaining(),
        "o -> n -> o gave budget back: {:?} -> {:?} -> {:?}",
        before,
        after,
        back
    );
    Ok(())
}

/// The buckets' rule: remaining under `n` is exactly `max(0, n.capacity - spent)`.
fn assert_bucket<A: Algorithm>(
    o: &A,
    n: &A,
    ops: &[(u64, u64)],
    now: u64,
) -> Result<(), TestCaseError>
where
    A::State: Clone + PartialEq,
{
    let (before, after) = rebased(o, n, ops, now);
    let spent = o.capacity() - o.decide(&before, now, 0).remaining();
    let (left, rule) = (
        n.decide(&after, now, 0).remaining(),
        n.capacity().saturating_sub(spent),
    );
    let ctx = format!(
        "{:?} -> {:?}: {before:?} -> {after:?}",
        o.quota(),
        n.quota()
    );
    if ops.last().is_none_or(|&(at, _)| at <= now) {
        prop_assert_eq!(left, rule, "{}", ctx);
    } else {
        // A clock that went back: GCRA measures it against its TAT, which can only be
        // stricter (more spent than its capacity); the others read it as no time elapsed.
        prop_assert!(left <= rule, "{}", ctx);
    }
    assert_common(o, n, &before, &after, now)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn token_bucket_keeps_what_was_spent((o, n, ops, now) in case(true)) {
        let (o, n) = (TokenBucket::new(o).unwrap(), TokenBucket::new(n).unwrap());
        assert_bucket(&o, &n, &ops, now)?;
    }

    #[test]
    fn gcra_keeps_what_was_spent((o, n, ops, now) in case(true)) {
        let (o, n) = (Gcra::new(o).unwrap(), Gcra::new(n).unwrap());
        assert_bucket(&o, &n, &ops, now)?;
    }

    #[test]
    fn leaky_bucket_keeps_what_was_spent((o, n, ops, now) in case(true)) {
        let (o, n) = (LeakyBucket::new(o).unwrap(), LeakyBucket::new(n).unwrap());
        assert_bucket(&o, &n, &ops, now)?;
    }

    #[test]
    fn fixed_window_keeps_what_was_spent((o, n, ops, now) in case(false)) {
        let (o, n) = (FixedWindow::new(o).unwrap(), FixedWindow::new(n).unwrap());
        let (before, after) = rebased(&o, &n, &ops, now);
        let spent = o.capacity() - o.decide(&before, now, 0).remaining();
        prop_assert_eq!(
            n.decide(&after, now, 0).remaining(),
            n.capacity().saturating_sub(spent)
        );
        // Never charged twice: whole again where `n`'s window ends.
        let w = n.quota().period_micros();
        let next = (after.window.max(now / w) + 1) * w;
        prop_assert_eq!(n.decide(&after, next, 0).remaining(), n.capacity());
        assert_common(&o, &n, &before, &after, now)?;
    }

    #[test]
    fn sliding_window_keeps_what_was_spent((o, n, ops, now) in case(false)) {
        let (o, n) = (SlidingWindow::new(o).unwrap(), SlidingWindow::new(n).unwrap());
        let (before, after) = rebased(&o, &n, &ops, now);
        let reported = o.capacity() - o.decide(&before, now, 0).remaining();
        let left = n.decide(&after, now, 0).remaining();
        if o.quota().period() == n.quota().period() {
            prop_assert_eq!(&after, &before, "counts are units: kept as they are");
        } else {
            // The weighted count rounded up: between what `o` reports spent and one more.
            prop_assert!(left <= n.capacity().saturating_sub(reported));
            prop_assert!(left + 1 >= n.capacity().saturating_sub(reported));
            prop_assert_eq!(after.prev, 0);
            let t = now.max(before.last);
            if after.cur > 0 && n.quota().period() < o.quota().period() {
                // Kept until `o`'s window ends: charged to `n`'s window holding that end.
                let (op, np) = (o.quota().period_micros(), n.quota().period_micros());
                let end = (t / op + 1) * op;
                prop_assert_eq!(after.last, t.max((end - 1) / np * np));
            } else {
                prop_assert_eq!(after.last, t);
            }
        }
        assert_common(&o, &n, &before, &after, now)?;
    }

    #[test]
    fn sliding_log_keeps_its_entries((o, n, ops, now) in case(false)) {
        let (o, n) = (SlidingLog::new(o).unwrap(), SlidingLog::new(n).unwrap());
        let (before, after) = rebased(&o, &n, &ops, now);
        prop_assert_eq!(&after, &before);
        // `n` reads the entries in its own window.
        let t = after.entries().next_back().map_or(now, |e| e.at.max(now));
        let w = n.quota().period_micros();
        let live: u64 = after.entries().filter(|e| e.at + w > t).map(|e| e.units).sum();
        prop_assert_eq!(
            n.decide(&after, now, 0).remaining(),
            n.capacity().saturating_sub(live)
        );
        assert_common(&o, &n, &before, &after, now)?;
    }
}

/// An upgrade and a downgrade worked through for each algorithm, as the rustdoc states them.
#[test]
fn worked_examples() {
    const S: u64 = 1_000_000;

    // Token bucket: 10 of Free's 10/min spent; Pro (100/min) has 90 left, not 100.
    let free = TokenBucket::new(Quota::per_minute(10)).unwrap();
    let pro = TokenBucket::new(Quota::per_minute(100)).unwrap();
    let mut s = Default::default();
    assert!(free.check(&mut s, 0, 10).allowed());
    pro.rebase(&free, &mut s, 0);
    assert_eq!(pro.decide(&s, 0, 0).remaining(), 90);
    // 80 more on Pro, then back to Free: 90 spent is more than Free holds, so it is empty, and
    // the 80 above Free's 10 are held as the 48 s Pro takes to refill them (not the 480 s
    // Free would): nothing refills before 48 s, then one unit every 6 s.
    assert!(pro.check(&mut s, 0, 80).allowed());
    free.rebase(&pro, &mut s, 0);
    assert_eq!(free.decide(&s, 0, 0).remaining(), 0);
    assert!(!free.decide(&s, 54 * S - 1, 1).allowed());
    assert!(free.decide(&s, 54 * S, 1).allowed());
    // Straight back to Pro: the lock stays a lock, so Pro is empty until it ends (never less
    // than the 90 spent: no reset gift).
    let mut back = s;
    pro.rebase(&free, &mut back, 0);
    assert_eq!(pro.decide(&back, 0, 0).remaining(), 0);
    assert_eq!(pro.decide(&back, 48 * S, 0).remaining(), 0);
    assert_eq!(pro.decide(&back, 54 * S, 0).remaining(), 10);

    // GCRA: the same arithmetic, stored as a time.
    let (free, pro) = (
        Gcra::new(Quota::per_minute(10)).unwrap(),
        Gcra::new(Quota::per_minute(100)).unwrap(),
    );
    let mut s = Default::default();
    assert!(free.check(&mut s, 0, 4).allowed());
    pro.rebase(&free, &mut s, 3 * S); // half a unit came back: 3.5 spent, rounded up to 4
    assert_eq!(pro.decide(&s, 3 * S, 0).remaining(), 96);
    let mut idle = Default::default();
    pro.rebase(&free, &mut idle, 3 * S);
    assert_eq!(idle, Default::default(), "nothing spent: still a fresh key");

    // Fixed window: 8 of 10 spent this hour, the plan moves to 100 per day: 92 left today.
    let hourly = FixedWindow::new(Quota::per_hour(10)).unwrap();
    let daily = FixedWindow::new(Quota::per_day(100)).unwrap();
    let mut s = Default::default();
    let t = 5 * 3_600 * S + 17;
    assert!(hourly.check(&mut s, t, 8).allowed());
    daily.rebase(&hourly, &mut s, t + S);
    assert_eq!(daily.decide(&s, t + S, 0).remaining(), 92);
    // Back to 10 per hour: the 8 spent stay counted until the day ends (in its last hour), so
    // the day never admits more than the larger limit in force; the next day starts whole.
    hourly.rebase(&daily, &mut s, t + 2 * S);
    assert_eq!(hourly.decide(&s, t + 2 * S, 0).remaining(), 2);
    assert_eq!(hourly.decide(&s, 6 * 3_600 * S, 0).remaining(), 2);
    assert_eq!(hourly.decide(&s, 24 * 3_600 * S, 0).remaining(), 10);

    // Sliding window: 90 in the previous minute, 20 in this one, 15 s in: 87.5 weighted,
    // carried as 88 into a 10-minute window of 1,000.
    let minute = SlidingWindow::new(Quota::per_minute(100)).unwrap();
    let ten = SlidingWindow::new(Quota::per(Duration::from_secs(600), 1_000)).unwrap();
    let mut s = SlidingWindowState {
        last: 60 * S,
        prev: 90,
        cur: 20,
    };
    ten.rebase(&minute, &mut s, 75 * S);
    assert_eq!(
        s,
        SlidingWindowState {
            last: 75 * S,
            prev: 0,
            cur: 88
        }
    );
    assert_eq!(ten.decide(&s, 75 * S, 0).remaining(), 912);

    // Sliding log: the entries are the record; a 3-per-minute plan reads the same 5 as spent.
    let five = SlidingLog::new(Quota::per_minute(5)).unwrap();
    let three = SlidingLog::new(Quota::per_minute(3)).unwrap();
    let mut s = Default::default();
    assert!(five.check(&mut s, 0, 5).allowed());
    three.rebase(&five, &mut s, S);
    assert_eq!(
        three.decide(&s, S, 1).retry_after(),
        Some(Duration::from_secs(59))
    );
}
