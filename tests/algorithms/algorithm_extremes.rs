//! Every algorithm's transitions at the extremes: hand-built states with `u64::MAX` fields, states
//! left by a larger quota, times at 0 and `u64::MAX` and going backwards, costs of 0, the
//! capacity and `u64::MAX`, and quotas from one per century to a billion per second. Tests run
//! in debug, so any arithmetic overflow panics; beyond "no panic", every decision must hold:
//!
//! - `limit` is the capacity and `remaining <= limit`;
//! - a cost above the capacity, and only such a cost, is impossible;
//! - an allowed request of cost `c > 0` had `c <= remaining` just before it;
//! - a rejection always asks to wait (`retry_after > 0`), and while the clock has not gone back,
//!   waiting it succeeds;
//! - a refund never leaves the key fuller than a fresh one.
//!
//! Case counts are bounded so the whole file runs in seconds.

use std::fmt::Debug;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::algorithm::{
    Algorithm, FixedWindow, FixedWindowState, Gcra, GcraState, LeakyBucket, LeakyBucketState,
    SlidingLog, SlidingWindow, SlidingWindowState, TokenBucket, TokenBucketState,
};
use tollgate::Quota;

const M: u64 = u64::MAX;

/// Quotas from one per century to a billion per second; each algorithm skips those it refuses.
fn quotas() -> Vec<Quota> {
    vec![
        Quota::per_second(3).burst(2),
        Quota::per_second(7),
        Quota::per(Duration::from_micros(1), 1),
        Quota::per(Duration::from_micros(7), 1_000),
        Quota::per_minute(SlidingLog::MAX_COUNT),
        Quota::per_second(10 * 1024 * 1024),
        Quota::per_second(1_000_000_000).burst(5),
        Quota::per(Duration::from_secs(100 * 365 * 86_400), 1),
        Quota::per_day(86_400 * 1_000),
    ]
}

/// A larger quota than `q`, to leave states no transition under `q` would produce.
fn larger(q: &Quota) -> Quota {
    Quota::per(
        q.period(),
        q.count()
            .saturating_mul(50)
            .min(SlidingLog::MAX_COUNT.max(q.count())),
    )
}

/// Hand-built states at the extremes, for the algorithms whose state fields are public.
trait Extremes: Algorithm {
    fn extremes() -> Vec<Self::State>;
}

impl Extremes for TokenBucket {
    fn extremes() -> Vec<TokenBucketState> {
        [(M, M), (M, 0), (0, M), (1, M - 1), (M / 2, 1)]
            .map(|(deficit, last)| TokenBucketState { deficit, last })
            .to_vec()
    }
}

impl Extremes for LeakyBucket {
    fn extremes() -> Vec<LeakyBucketState> {
        [(M, M), (M, 0), (0, M), (1, M - 1)]
            .map(|(level, last)| LeakyBucketState { level, last })
            .to_vec()
    }
}

impl Extremes for Gcra {
    fn extremes() -> Vec<GcraState> {
        [(M, M), (M, 0), (0, M), (M - 1, 1), (1 << 53, 999)]
            .map(|(tat, sub)| GcraState { tat, sub })
            .to_vec()
    }
}

impl Extremes for FixedWindow {
    fn extremes() -> Vec<FixedWindowState> {
        [(M, M), (M, 0), (0, M), (M - 1, 1)]
            .map(|(window, count)| FixedWindowState { window, count })
            .to_vec()
    }
}

impl Extremes for SlidingWindow {
    fn extremes() -> Vec<SlidingWindowState> {
        [(M, M, M), (M, 0, 0), (0, M, M), (M - 1, M, 0), (0, 0, M)]
            .map(|(last, prev, cur)| SlidingWindowState { last, prev, cur })
            .to_vec()
    }
}

impl Extremes for SlidingLog {
    fn extremes() -> Vec<<SlidingLog as Algorithm>::State> {
        // Its entries are private: extreme logs come from transitions at extreme times.
        let log = SlidingLog::new(Quota::per(Duration::from_micros(1), SlidingLog::MAX_COUNT))
            .expect("valid");
        let mut states = Vec::new();
        for times in [[M, M, M], [0, M, 0], [M - 1, M, 1]] {
            let mut state = Default::default();
            for t in times {
                log.check(&mut state, t, SlidingLog::MAX_COUNT / 3);
            }
            states.push(state);
        }
        states
    }
}

/// One step of a stream: how time moves, what it costs, what is done.
#[derive(Debug, Clone, Copy)]
struct Op {
    time: u8,
    amount: u64,
    cost: u8,
    refund: bool,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (0u8..6, any::<u64>(), 0u8..5, prop::bool::weighted(0.2)).prop_map(
            |(time, amount, cost, refund)| Op {
                time,
                amount,
                cost,
                refund,
            },
        ),
        1..40,
    )
}

/// Runs `ops` on `alg` from `state`, checking the invariants of the module docs. `honest` says
/// the state came from transitions at times up to `now` (so waiting `retry_after` must work).
fn run<A: Algorithm>(
    alg: &A,
    mut state: A::State,
    mut now: u64,
    honest: bool,
    ops: &[Op],
) -> Result<(), TestCaseError>
where
    A::State: Clone + Debug,
{
    let limit = alg.capacity();
    let mut seen = now; // the latest time used so far
    for (i, op) in ops.iter().enumerate() {
        let span = alg.idle_timeout_micros().max(1);
        now = match op.time {
            0 => 0,
            1 => M,
            2 => now.saturating_sub(op.amount % span.saturating_mul(2)),
            3 => now.saturating_add(op.amount % 4),
            4 => now.saturating_add(op.amount % span.saturating_mul(2)),
            _ => now.saturating_add(op.amount >> (op.amount % 64)),
        };
        let cost = match op.cost {
            0 => 0,
            1 => limit,
            2 => M,
            3 => 1,
            _ => op.amount % limit.saturating_mul(2).max(1),
        };
        let forward = honest && now >= seen;
        seen = seen.max(now);
        let ctx = format!("op {i} at {now}, cost {cost}, state {state:?}");
        if op.refund {
            alg.refund(&mut state, now, seen, cost);
            let d = alg.decide(&state, now, 0);
            prop_assert!(d.allowed(), "{}", ctx);
            prop_assert!(d.remaining() <= limit, "refund overfilled: {}", ctx);
            continue;
        }
        let before = alg.decide(&state, now, 0);
        prop_assert!(before.allowed(), "cost 0 is always allowed: {}", ctx);
        let d = alg.check(&mut state, now, cost);
        prop_assert_eq!(d.limit(), limit, "{}", &ctx);
        prop_assert!(d.remaining() <= limit, "{}: {:?}", &ctx, d);
        prop_assert_eq!(d.is_impossible(), cost > limit, "{}: {:?}", &ctx, d);
        if d.allowed() {
            prop_assert!(
                cost <= before.remaining(),
                "{}: {:?} after {:?}",
                &ctx,
                d,
                before
            );
            continue;
        }
        if d.is_impossible() {
            prop_assert_eq!(d.retry_after(), None, "{}", &ctx);
            continue;
        }
        let retry = d.retry_after().expect("a rejection has a retry_after");
        prop_assert!(retry > Duration::ZERO, "{}: {:?}", &ctx, d);
        if forward {
            let wait = u64::try_from(retry.as_micros()).unwrap_or(M);
            if let Some(later) = now.checked_add(wait) {
                prop_assert!(
                    alg.decide(&state, later, cost).allowed(),
                    "waiting {:?} did not help: {}",
                    retry,
                    ctx
                );
            }
        }
    }
    Ok(())
}

/// Every quota `A` accepts: from a fresh key at 0 and at a late epoch, from each hand-built
/// extreme state, and from the state a larger quota left behind.
fn exercise<A, F>(build: F, ops: &[Op], start: u64) -> Result<(), TestCaseError>
where
    A: Extremes,
    A::State: Clone + Debug,
    F: Fn(Quota) -> Option<A>,
{
    for quota in quotas() {
        let Some(alg) = build(quota) else { continue };
        run(&alg, A::State::default(), 0, true, ops)?;
        run(&alg, A::State::default(), start, true, ops)?;
        for state in A::extremes() {
            run(&alg, state, start, false, ops)?;
        }
        if let Some(big) = build(larger(&quota)) {
            let mut state = A::State::default();
            let mut t = start;
            for op in ops {
                t = t.saturating_add(op.amount % 1_000);
                big.check(&mut state, t, big.capacity());
            }
            run(&alg, state, t, true, ops)?;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn token_bucket_at_the_extremes(ops in ops(), start in any::<u64>()) {
        exercise(|q| TokenBucket::new(q).ok(), &ops, start >> 8)?;
    }

    #[test]
    fn gcra_at_the_extremes(ops in ops(), start in any::<u64>()) {
        exercise(|q| Gcra::new(q).ok(), &ops, start >> 8)?;
    }

    #[test]
    fn fixed_window_at_the_extremes(ops in ops(), start in any::<u64>()) {
        exercise(|q| FixedWindow::new(q).ok(), &ops, start >> 8)?;
    }

    #[test]
    fn sliding_window_at_the_extremes(ops in ops(), start in any::<u64>()) {
        exercise(|q| SlidingWindow::new(q).ok(), &ops, start >> 8)?;
    }

    #[test]
    fn sliding_log_at_the_extremes(ops in ops(), start in any::<u64>()) {
        exercise(|q| SlidingLog::new(q).ok(), &ops, start >> 8)?;
    }

    #[test]
    fn leaky_bucket_at_the_extremes(ops in ops(), start in any::<u64>()) {
        exercise(|q| LeakyBucket::new(q).ok(), &ops, start >> 8)?;
    }
}

#[test]
fn every_quota_in_the_list_is_accepted_by_the_buckets() {
    // The list is meant to reach the extremes; make sure they are not all skipped.
    for quota in quotas() {
        assert!(TokenBucket::new(quota).is_ok(), "{quota}");
        assert!(Gcra::new(quota).is_ok(), "{quota}");
    }
}
