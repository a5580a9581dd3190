//! Properties every algorithm must hold over random request streams, plus the seeds' worked
//! examples that compare algorithms on the same traffic.
//!
//! Streams have strictly non-decreasing times (random gaps, many of them zero) and random costs
//! (mostly 1, sometimes 0, sometimes more than the capacity).

use std::time::Duration;

use proptest::prelude::*;
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow, TokenBucket,
};
use tollgate::{Decision, Quota};

/// One admitted request: when, and how many units.
#[derive(Debug, Clone, Copy)]
struct Admitted {
    at: u64,
    cost: u64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).expect("test durations fit in u64")
}

/// Runs `stream` (gap, cost) through `alg` from a fresh key, checking after every request:
///
/// - `remaining <= limit`, and `remaining` is exact: right after the decision, a cost of
///   `remaining` is allowed and `remaining + 1` is not;
/// - a cost above the capacity, and only such a cost, is impossible;
/// - `retry_after` is zero when allowed and positive when rejected, and it is exact: the same
///   request is allowed after waiting it and refused after waiting 1 µs less;
/// - `reset` is exact: after it the limit is whole again, 1 µs before it is not;
/// - refunding an allowed charge at the same `now` restores every later decision;
/// - after `idle_timeout_micros` the key decides exactly like a fresh one.
///
/// Returns the admitted requests.
fn run<A>(alg: &A, stream: &[(u64, u64)]) -> Result<Vec<Admitted>, TestCaseError>
where
    A: Algorithm,
    A::State: Clone,
{
    let limit = alg.capacity();
    let mut state = A::State::default();
    let mut now = 0u64;
    let mut admitted = Vec::new();
    for (i, &(gap, cost)) in stream.iter().enumerate() {
        now += gap;
        let before = state.clone();
        let d = alg.check(&mut state, now, cost);
        let ctx = format!("request {i} at {now}, cost {cost}: {d:?}");
        prop_assert_eq!(d.limit(), limit, "{}", ctx);
        prop_assert!(d.remaining() <= limit, "{}", ctx);
        prop_assert_eq!(d.is_impossible(), cost > limit, "{}", ctx);

        // `remaining` is the largest cost allowed right now.
        prop_assert!(alg.decide(&state, now, d.remaining()).allowed(), "{}", ctx);
        prop_assert!(
            !alg.decide(&state, now, d.remaining() + 1).allowed(),
            "{}",
            ctx
        );

        // `reset` is when the limit is whole again, and not a microsecond sooner.
        let reset = micros(d.reset());
        prop_assert_eq!(
            alg.decide(&state, now + reset, 0).remaining(),
            limit,
            "{}",
            ctx
        );
        if reset > 0 {
            let early = alg.decide(&state, now + reset - 1, 0).remaining();
            prop_assert!(early < limit, "{}: reset not tight", ctx);
        }

        if d.allowed() {
            prop_assert_eq!(d.retry_after(), Some(Duration::ZERO), "{}", ctx);
            admitted.push(Admitted { at: now, cost });
            // Refund at the same `now` restores the decisions of the state before.
            let mut refunded = state.clone();
            alg.refund(&mut refunded, now, now, cost);
            for later in [now, now + gap, now + reset] {
                for c in [0, 1, cost, limit] {
                    prop_assert_eq!(
                        alg.decide(&refunded, later, c),
                        alg.decide(&before, later, c),
                        "{}: refund at {} for cost {}",
                        ctx,
                        later,
                        c
                    );
                }
            }
        } else if let Some(retry) = d.retry_after() {
            let retry = micros(retry);
            prop_assert!(retry > 0, "{}", ctx);
            prop_assert!(alg.decide(&state, now + retry, cost).allowed(), "{}", ctx);
            prop_assert!(
                !alg.decide(&state, now + retry - 1, cost).allowed(),
                "{}: retry_after not tight",
                ctx
            );
        }
    }
    // Idle long enough, the key is indistinguishable from a fresh one.
    let later = now + alg.idle_timeout_micros();
    let fresh = A::State::default();
    for c in [0, 1, limit] {
        prop_assert_eq!(alg.decide(&state, later, c), alg.decide(&fresh, later, c));
    }
    Ok(admitted)
}

/// Bucket bound: in every span `[a, b]` between admissions, at most
/// `capacity + (b - a) × count / period` units.
fn assert_span_bound(quota: &Quota, admitted: &[Admitted]) -> Result<(), TestCaseError> {
    let cap = i128::from(quota.burst_size());
    let (count, period) = (i128::from(quota.count()), i128::from(quota.period_micros()));
    for i in 0..admitted.len() {
        let mut sum = 0i128;
        for later in &admitted[i..] {
            sum += i128::from(later.cost);
            let span = i128::from(later.at - admitted[i].at);
            prop_assert!(
                (sum - cap) * period <= span * count,
                "{} units in {} µs exceeds {} + rate × t",
                sum,
                span,
                cap
            );
        }
    }
    Ok(())
}

/// Exact window bound: in every window `(t - W, t]`, at most `count` units.
fn assert_sliding_bound(quota: &Quota, admitted: &[Admitted]) -> Result<(), TestCaseError> {
    let w = quota.period_micros();
    for (j, end) in admitted.iter().enumerate() {
        let sum: u64 = admitted[..=j]
            .iter()
            .filter(|a| a.at + w > end.at)
            .map(|a| a.cost)
            .sum();
        prop_assert!(
            sum <= quota.count(),
            "{} units in the window ending {}",
            sum,
            end.at
        );
    }
    Ok(())
}

/// Aligned window bound: in every window `[kW, (k + 1)W)`, at most `count` units.
fn assert_aligned_bound(quota: &Quota, admitted: &[Admitted]) -> Result<(), TestCaseError> {
    let w = quota.period_micros();
    let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
    for a in admitted {
        *per_window.entry(a.at / w).or_default() += a.cost;
    }
    for (k, sum) in per_window {
        prop_assert!(sum <= quota.count(), "{} units in window {}", sum, k);
    }
    Ok(())
}

/// A quota (count per period, and a burst for the buckets) and a request stream whose gaps are
/// scaled to the period: many simultaneous requests, many a fraction of the emission interval
/// apart, some longer than a window.
fn quota_and_stream(with_burst: bool) -> impl Strategy<Value = (Quota, Vec<(u64, u64)>)> {
    // Small periods make rounding errors (an emission interval rounded the wrong way) visible
    // within a short stream; large ones exercise realistic windows.
    let period = prop_oneof![1u64..=64, 64u64..=10_000, 10_000u64..=5_000_000];
    (1u64..=12, period, 1u64..=16)
        .prop_map(move |(count, period, burst)| {
            let q = Quota::per(Duration::from_micros(period.max(count)), count);
            if with_burst {
                q.burst(burst)
            } else {
                q
            }
        })
        .prop_flat_map(|q| {
            let w = q.period_micros();
            let cap = q.burst_size();
            let gap = prop_oneof![
                4 => Just(0u64),
                4 => 0..=w / q.count(),
                1 => 0..=3 * w,
            ];
            let cost = prop_oneof![
                6 => Just(1u64),
                1 => Just(0u64),
                2 => 0..=cap,
                1 => cap + 1..=cap + 3,
            ];
            (Just(q), prop::collection::vec((gap, cost), 1..60))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn token_bucket_properties((quota, stream) in quota_and_stream(true)) {
        let alg = TokenBucket::new(quota).unwrap();
        let admitted = run(&alg, &stream)?;
        assert_span_bound(&quota, &admitted)?;
    }

    #[test]
    fn gcra_properties((quota, stream) in quota_and_stream(true)) {
        let alg = Gcra::new(quota).unwrap();
        let admitted = run(&alg, &stream)?;
        assert_span_bound(&quota, &admitted)?;
    }

    #[test]
    fn leaky_bucket_properties((quota, stream) in quota_and_stream(true)) {
        let alg = LeakyBucket::new(quota).unwrap();
        let admitted = run(&alg, &stream)?;
        assert_span_bound(&quota, &admitted)?;
    }

    #[test]
    fn fixed_window_properties((quota, stream) in quota_and_stream(false)) {
        let alg = FixedWindow::new(quota).unwrap();
        let admitted = run(&alg, &stream)?;
        assert_aligned_bound(&quota, &admitted)?;
    }

    #[test]
    fn sliding_window_properties((quota, stream) in quota_and_stream(false)) {
        let alg = SlidingWindow::new(quota).unwrap();
        let admitted = run(&alg, &stream)?;
        assert_aligned_bound(&quota, &admitted)?;
    }

    #[test]
    fn sliding_log_properties((quota, stream) in quota_and_stream(false)) {
        let alg = SlidingLog::new(quota).unwrap();
        let admitted = run(&alg, &stream)?;
        assert_sliding_bound(&quota, &admitted)?;
        assert_aligned_bound(&quota, &admitted)?;
    }

    /// The leaky bucket as a meter and the token bucket are one limiter read from two ends.
    #[test]
    fn leaky_bucket_meters_like_the_token_bucket((quota, stream) in quota_and_stream(true)) {
        let (lb, tb) = (LeakyBucket::new(quota).unwrap(), TokenBucket::new(quota).unwrap());
        let (mut ls, mut ts) = Default::default();
        let mut now = 0;
        for (gap, cost) in stream {
            now += gap;
            prop_assert_eq!(lb.check(&mut ls, now, cost), tb.check(&mut ts, now, cost));
        }
    }

    /// When the count divides the period, GCRA's emission interval is exact and it decides
    /// exactly like the token bucket.
    #[test]
    fn gcra_equals_token_bucket_when_exact(
        (quota, stream) in quota_and_stream(true),
        k in 1u64..=200_000,
    ) {
        let quota = Quota::per(Duration::from_micros(quota.count() * k), quota.count())
            .burst(quota.burst_size());
        let (g, tb) = (Gcra::new(quota).unwrap(), TokenBucket::new(quota).unwrap());
        let (mut gs, mut ts) = Default::default();
        let mut now = 0;
        for (gap, cost) in stream {
            now += gap;
            prop_assert_eq!(g.check(&mut gs, now, cost), tb.check(&mut ts, now, cost));
        }
    }
}

const S: u64 = 1_000_000;

/// Sends `stream` (time, cost) and returns the admitted requests.
fn admit<A: Algorithm>(alg: &A, stream: &[(u64, u64)]) -> Vec<Admitted> {
    let mut state = A::State::default();
    stream
        .iter()
        .filter(|&&(at, cost)| alg.check(&mut state, at, cost).allowed())
        .map(|&(at, cost)| Admitted { at, cost })
        .collect()
}

/// The most units admitted in any span of `w` µs (inclusive of both ends' window `(t - w, t]`).
fn max_in_any_window(admitted: &[Admitted], w: u64) -> u64 {
    admitted
        .iter()
        .map(|end| {
            admitted
                .iter()
                .filter(|a| a.at <= end.at && a.at + w > end.at)
                .map(|a| a.cost)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn seam_fixed_window_doubles_while_the_log_stays_exact() {
    // 5 per 10 s; a request every 100 ms from 8 s to 12 s: the same stream through both.
    let quota = Quota::per(Duration::from_secs(10), 5);
    let stream: Vec<(u64, u64)> = (0..=40).map(|i| (8 * S + i * 100_000, 1)).collect();
    let fixed = admit(&FixedWindow::new(quota).unwrap(), &stream);
    let log = admit(&SlidingLog::new(quota).unwrap(), &stream);
    let w = quota.period_micros();

    assert_eq!(fixed.len(), 10);
    let span = fixed.last().unwrap().at - fixed[0].at;
    assert!(span < 3 * S, "10 admitted within {span} µs");
    assert_eq!(
        max_in_any_window(&fixed, w),
        10,
        "2× the limit across the seam"
    );

    assert_eq!(log.len(), 5);
    assert_eq!(
        max_in_any_window(&log, w),
        5,
        "never over the limit in any window"
    );
}

#[test]
fn seed_burst_of_twenty_for_both_buckets_and_gcra() {
    // Capacity 20 at 10/s: a batch of 20, a rejection 50 ms later with a 50 ms retry, and a
    // full bucket again 3 s later.
    let quota = Quota::per_second(10).burst(20);
    fn scenario<A: Algorithm>(alg: A) {
        let mut s = A::State::default();
        assert_eq!(
            (0..20)
                .filter(|_| alg.check(&mut s, 0, 1).allowed())
                .count(),
            20
        );
        let d: Decision = alg.check(&mut s, 50_000, 1);
        assert!(!d.allowed(), "{alg:?}");
        assert_eq!(d.retry_after(), Some(Duration::from_millis(50)), "{alg:?}");
        assert_eq!(alg.decide(&s, 3 * S, 0).remaining(), 20, "{alg:?}");
        assert!(alg.check(&mut s, 3 * S, 20).allowed(), "{alg:?}");
    }
    scenario(TokenBucket::new(quota).unwrap());
    scenario(Gcra::new(quota).unwrap());
    scenario(LeakyBucket::new(quota).unwrap());
}

#[test]
fn seed_idle_key_admits_its_capacity_of_thirty() {
    // Capacity 20 refilling 2/s (the windows: 20 per 10 s), idle a minute, then 30 at once.
    fn scenario<A: Algorithm>(alg: A) {
        let mut s = A::State::default();
        assert!(alg.check(&mut s, 0, 20).allowed(), "{alg:?}");
        let admitted = (0..30)
            .filter(|_| alg.check(&mut s, 60 * S, 1).allowed())
            .count();
        assert_eq!(admitted, 20, "{alg:?}");
    }
    let bucket = Quota::per_second(2).burst(20);
    scenario(TokenBucket::new(bucket).unwrap());
    scenario(Gcra::new(bucket).unwrap());
    scenario(LeakyBucket::new(bucket).unwrap());
    let window = Quota::per(Duration::from_secs(10), 20);
    scenario(FixedWindow::new(window).unwrap());
    scenario(SlidingWindow::new(window).unwrap());
    scenario(SlidingLog::new(window).unwrap());
}

/// Reserves `ops[k]` (when allowed) among the other requests of `ops` (time, cost; times may go
/// back), refunds it after all of them (as of its own time, applied at the latest time seen),
/// and compares the key with `truth`: the same key charged with only what the stream actually
/// admitted besides the reservation. At the latest time seen and `probe` µs later, the
/// refunded key never has more budget than `truth`, for every algorithm: a refund never
/// creates budget that a world without the reservation would not have.
fn assert_refund_gives_back_at_most_what_it_took<A: Algorithm>(
    alg: &A,
    ops: &[(u64, u64)],
    k: usize,
    probe: u64,
) -> Result<(), TestCaseError> {
    let (mut state, mut truth) = (A::State::default(), A::State::default());
    let mut reserved = None;
    for (i, &(at, cost)) in ops.iter().enumerate() {
        let d = alg.check(&mut state, at, cost);
        if i == k {
            reserved = d.allowed().then_some((at, cost));
        } else if d.allowed() {
            alg.apply(&mut truth, at, cost);
        }
    }
    let Some((at, cost)) = reserved else {
        return Ok(());
    };
    let last = ops.iter().map(|o| o.0).max().unwrap_or(0);
    alg.refund(&mut state, at, last, cost);
    for t in [last, last + probe] {
        let (got, fair) = (
            alg.decide(&state, t, 0).remaining(),
            alg.decide(&truth, t, 0).remaining(),
        );
        prop_assert!(
            got <= fair,
            "at {t}: {got} left after the refund of {cost} reserved at {at}, {fair} without it",
        );
    }
    Ok(())
}

/// A quota, a stream of (time, cost) starting 100 windows in, with times that mostly move on
/// (often across a seam) and sometimes go back, the index of the reservation, and a probe gap.
fn refund_case(with_burst: bool) -> impl Strategy<Value = (Quota, Vec<(u64, u64)>, usize, u64)> {
    (1u64..=6, 1u64..=1_000, 1u64..=8).prop_flat_map(move |(count, unit, burst)| {
        let w = count * unit * 10;
        let q = Quota::per(Duration::from_micros(w), count);
        let q = if with_burst { q.burst(burst) } else { q };
        let step = prop_oneof![
            3 => (0..=w / 2).prop_map(|d| d as i64),
            2 => (w / 2..=2 * w).prop_map(|d| d as i64),
            1 => (0..=w).prop_map(|d| -(d as i64)),
        ];
        let cost = prop_oneof![4 => Just(1u64), 1 => 0..=q.burst_size()];
        (
            Just(q),
            prop::collection::vec((step, cost), 2..24),
            any::<prop::sample::Index>(),
            0..=3 * w,
        )
            .prop_map(move |(q, steps, k, probe)| {
                let mut now = 100 * w;
                let ops: Vec<_> = steps
                    .into_iter()
                    .map(|(d, c)| {
                        now = now.saturating_add_signed(d);
                        (now, c)
                    })
                    .collect();
                let k = k.index(ops.len());
                (q, ops, k, probe)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn fixed_window_refund_never_creates_budget((q, ops, k, probe) in refund_case(false)) {
        let alg = FixedWindow::new(q).unwrap();
        assert_refund_gives_back_at_most_what_it_took(&alg, &ops, k, probe)?;
    }

    #[test]
    fn sliding_window_refund_never_creates_budget((q, ops, k, probe) in refund_case(false)) {
        let alg = SlidingWindow::new(q).unwrap();
        assert_refund_gives_back_at_most_what_it_took(&alg, &ops, k, probe)?;
    }

    #[test]
    fn sliding_log_refund_never_creates_budget((q, ops, k, probe) in refund_case(false)) {
        let alg = SlidingLog::new(q).unwrap();
        assert_refund_gives_back_at_most_what_it_took(&alg, &ops, k, probe)?;
    }

    #[test]
    fn token_bucket_refund_never_creates_budget((q, ops, k, probe) in refund_case(true)) {
        let alg = TokenBucket::new(q).unwrap();
        assert_refund_gives_back_at_most_what_it_took(&alg, &ops, k, probe)?;
    }

    #[test]
    fn gcra_refund_never_creates_budget((q, ops, k, probe) in refund_case(true)) {
        let alg = Gcra::new(q).unwrap();
        assert_refund_gives_back_at_most_what_it_took(&alg, &ops, k, probe)?;
    }

    #[test]
    fn leaky_bucket_refund_never_creates_budget((q, ops, k, probe) in refund_case(true)) {
        let alg = LeakyBucket::new(q).unwrap();
        assert_refund_gives_back_at_most_what_it_took(&alg, &ops, k, probe)?;
    }
}
