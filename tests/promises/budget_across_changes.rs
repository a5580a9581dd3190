//! Budget across quota and plan changes (issue 28, items 1 and 2): a key never admits more in
//! any span than the most generous quota in force during that span would have admitted. A
//! reload or a plan change is never a reset gift: what was spent stays spent (the excess above a
//! lower capacity included), and a cost-0 check (the layer's 413 path) never writes a clamped
//! state. The memory store and Redis decide identically. Switching a key between a
//! calendar-aligned quota and a plain one in the memory store keeps one time base.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::algorithm::{
    Algorithm, AlgorithmKind, FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow,
    TokenBucket,
};
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::quota::UtcOffset;
use tollgate::store::{memory::MemoryBackend, Backend, LimitCheck, PlanQuota, Store};
use tollgate::{Decision, Quota};

use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{self, decide, memory_store, spec};

const S: u64 = 1_000_000;
const MINUTE: u64 = 60 * S;
const DAY: u64 = 86_400 * S;
/// A realistic Unix time (µs) on a day boundary: 2023-11-14T00:00:00Z.
const T: u64 = 1_699_920_000 * S;

const BUCKETS: [AlgorithmKind; 3] = [
    AlgorithmKind::TokenBucket,
    AlgorithmKind::Gcra,
    AlgorithmKind::LeakyBucket,
];

/// Reloads the limit between 1000/h and 500/h, 50 round trips, with 8 tasks checking one key
/// concurrently in every phase; the clock is frozen, so the bound is the larger capacity, 1,000.
async fn reload_alternation<S>(first: S, kind: AlgorithmKind, per_task: u64) -> u64
where
    S: Store + Send + Sync + 'static,
    S::Future: Send,
{
    let high = spec("api", Quota::per_hour(1_000), kind);
    let low = spec("api", Quota::per_hour(500), kind);
    let admitted = Arc::new(AtomicU64::new(0));
    let mut store = Arc::new(first);
    for phase in 0..101u32 {
        if phase > 0 {
            let next = if phase % 2 == 1 { &low } else { &high };
            store = Arc::new(S::reconfigure(&store, std::slice::from_ref(next)).unwrap());
        }
        // The first phase spends the whole budget; the others race 8 tasks on the key.
        let (tasks, each) = if phase == 0 {
            (1, 1_000)
        } else {
            (8, per_task)
        };
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (store, admitted) = (Arc::clone(&store), Arc::clone(&admitted));
                tokio::spawn(async move {
                    for _ in 0..each {
                        let checks = [LimitCheck::new(0, Key::string("alice"), 1)];
                        if decide(&*store, &checks).await.unwrap().allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.unwrap();
        }
    }
    admitted.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reload_alternation_never_admits_more_than_the_larger_quota() {
    for kind in BUCKETS {
        let clock = ManualClock::new();
        clock.set_micros(T);
        let store = memory_store(&clock, &[spec("api", Quota::per_hour(1_000), kind)]);
        let admitted = reload_alternation(store, kind, 100).await;
        println!("memory {kind}: reload 1000/h <-> 500/h x50, 8 tasks: {admitted} admitted (bound 1,001)");
        assert!(admitted <= 1_001, "{kind}: {admitted} admitted");
        assert_eq!(admitted, 1_000, "{kind}: the first phase spends the budget");
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reload_alternation_on_redis_never_admits_more_than_the_larger_quota() {
    let server = RedisServer::start();
    for kind in BUCKETS {
        let clock = ManualClock::new();
        clock.set_micros(T);
        let store = stores::node_store(
            &server.url(),
            "reload-alternation",
            &clock,
            &[spec("api", Quota::per_hour(1_000), kind)],
        );
        let admitted = reload_alternation(store, kind, 3).await;
        println!(
            "redis {kind}: reload 1000/h <-> 500/h x50, 8 tasks: {admitted} admitted (bound 1,001)"
        );
        assert_eq!(admitted, 1_000, "{kind}: {admitted} admitted");
    }
}

/// One step of a plan round trip: the check and what the store answered.
type Trace = Vec<(u64, u64, bool, u64, Option<Duration>)>;

/// pro (20/min) -> free (5/min) -> pro, 50 times, clock frozen. At pro, 25 checks of 1; at
/// free, a check of cost 0 (the layer's 413 path), one above free's capacity, and 6 of 1.
/// Returns what was admitted and every decision.
async fn plan_round_trips<S: Store>(store: &S, kind: AlgorithmKind) -> (u64, Trace) {
    let pro = PlanQuota::new(kind, Quota::per_minute(20)).unwrap();
    let free = PlanQuota::new(kind, Quota::per_minute(5)).unwrap();
    let (mut admitted, mut trace) = (0, Trace::new());
    let mut check = async |plan: &PlanQuota, cost: u64| {
        let checks = [LimitCheck::new(0, Key::string("bob"), cost).with_quota(plan)];
        let d: Decision = decide(store, &checks).await.unwrap().as_slice()[0];
        trace.push((
            plan.capacity(),
            cost,
            d.allowed(),
            d.remaining(),
            d.retry_after(),
        ));
        d.allowed() && cost > 0
    };
    for _ in 0..50 {
        for _ in 0..25 {
            admitted += u64::from(check(&pro, 1).await);
        }
        check(&free, 0).await;
        check(&free, 6).await;
        for _ in 0..6 {
            admitted += u64::from(check(&free, 1).await);
        }
    }
    (admitted, trace)
}

#[tokio::test]
async fn plan_round_trips_never_admit_more_than_the_richer_plan() {
    for kind in AlgorithmKind::ALL {
        let clock = ManualClock::new();
        clock.set_micros(T + 10 * S);
        let store = memory_store(&clock, &[spec("api", Quota::per_minute(20), kind)]);
        let (admitted, _) = plan_round_trips(&store, kind).await;
        println!("memory {kind}: pro 20/min -> free 5/min -> pro x50, frozen clock: {admitted} admitted (bound 20)");
        assert_eq!(admitted, 20, "{kind}");
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn plan_round_trips_decide_identically_on_redis() {
    let server = RedisServer::start();
    for kind in AlgorithmKind::ALL {
        let clock = ManualClock::new();
        clock.set_micros(T + 10 * S);
        let limits = [spec("api", Quota::per_minute(20), kind)];
        let memory = memory_store(&clock, &limits);
        let redis = stores::node_store(&server.url(), "plan-round-trips", &clock, &limits);
        let (on_memory, memory_trace) = plan_round_trips(&memory, kind).await;
        let (on_redis, redis_trace) = plan_round_trips(&redis, kind).await;
        println!("redis {kind}: pro 20/min -> free 5/min -> pro x50, frozen clock: {on_redis} admitted (bound 20)");
        assert_eq!(on_redis, 20, "{kind}");
        assert_eq!(on_memory, 20, "{kind}");
        for (i, (m, r)) in memory_trace.iter().zip(&redis_trace).enumerate() {
            assert_eq!(
                m, r,
                "{kind}: step {i} (capacity, cost, allowed, remaining, retry)"
            );
        }
    }
}

/// A downgrade keeps the excess: the key waits until the lower quota's refill has paid it back,
/// exactly, and the wait it is told is that wait.
#[test]
fn a_downgrade_keeps_the_excess_and_says_exactly_when_it_is_paid_back() {
    let clock = ManualClock::new();
    clock.set_micros(T);
    for kind in BUCKETS {
        let store = memory_store(&clock, &[spec("api", Quota::per_minute(20), kind)]);
        let free = PlanQuota::new(kind, Quota::per_minute(5)).unwrap();
        let bob = Key::string("bob");
        assert!(store.check_one(0, &bob, 20).unwrap().allowed());
        let at_free = |cost| {
            store
                .check_all(&[LimitCheck::new(0, bob.clone(), cost).with_quota(&free)])
                .unwrap()
                .as_slice()[0]
        };
        // 20 spent, Free holds 5: the 15 above it are held as the 45 s Pro takes to refill
        // them (not the 180 s Free would), then Free refills one per 12 s.
        let d = at_free(0);
        assert!(d.allowed(), "{kind}: a cost of 0 is always allowed");
        assert_eq!((d.remaining(), d.reset()), (0, Duration::from_secs(105)));
        let d = at_free(1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(57)), "{kind}");
        // Neither check wrote anything: the key's own state refills at Pro's rate until a
        // charge at Free converts it, so the request fits at 48 s, within the wait it was told
        // (and never before the 45 s lock ends).
        clock.advance(Duration::from_micros(45 * S));
        assert!(!at_free(1).allowed(), "{kind}: locked");
        clock.advance(Duration::from_micros(3 * S - 1));
        assert!(!at_free(1).allowed(), "{kind}: 1 µs early");
        clock.advance(Duration::from_micros(1));
        assert!(at_free(1).allowed(), "{kind}: on time");
        clock.set_micros(T);
    }
}

/// Plain per-day quota <-> the same quota aligned to the calendar (UTC), on one key of the
/// memory store whose clock starts at a realistic Unix time.
#[test]
fn calendar_and_plain_quotas_share_one_time_base_in_the_memory_store() {
    let clock = ManualClock::new();
    // The clock reads from 0; its zero is 2023-11-14T10:00:00Z (as a TokioClock's would be).
    clock.set_unix_offset_micros(T + 10 * 3_600 * S);
    clock.set_micros(7 * MINUTE);
    let plain = Quota::per_day(5);
    let calendar = Quota::per_day(5).aligned(UtcOffset::hours(0));
    let store = MemoryBackend::new()
        .clock(clock.clone())
        .build(&[spec("daily", plain, AlgorithmKind::FixedWindow)])
        .unwrap();
    let cal = PlanQuota::new(AlgorithmKind::FixedWindow, calendar).unwrap();
    let flat = PlanQuota::new(AlgorithmKind::FixedWindow, plain).unwrap();
    let check = |key: &str, plan: &PlanQuota| {
        store
            .check_all(&[LimitCheck::new(0, Key::string(key.to_owned()), 1).with_quota(plan)])
            .unwrap()
            .as_slice()[0]
    };
    // plain -> calendar: 5 at plain, then as many as pass at the calendar quota.
    let mut admitted = (0..10).filter(|_| check("p2c", &flat).allowed()).count();
    admitted += (0..10).filter(|_| check("p2c", &cal).allowed()).count();
    println!("memory plain -> calendar: {admitted} admitted (bound 5)");
    assert_eq!(admitted, 5);
    // calendar -> plain: 5 at the calendar quota, then the plain one's retry-after.
    let spent = (0..10).filter(|_| check("c2p", &cal).allowed()).count();
    assert_eq!(spent, 5);
    let d = check("c2p", &flat);
    let retry = d.retry_after().unwrap();
    println!(
        "memory calendar -> plain: retry-after {} s (bound one day)",
        retry.as_secs()
    );
    assert!(!d.allowed());
    assert!(retry <= Duration::from_micros(DAY), "{retry:?}");
    // Two days later the key is whole again at either quota.
    clock.advance(Duration::from_micros(2 * DAY));
    assert!(check("c2p", &flat).allowed());
    assert!(check("c2p", &cal).allowed());
    // And back and forth within one window never admits more than 5 in a day.
    let mut admitted = 0;
    for i in 0..20 {
        let plan = if i % 2 == 0 { &cal } else { &flat };
        admitted += (0..3).filter(|_| check("both", plan).allowed()).count();
    }
    assert!(admitted <= 5, "{admitted}");
}

/// The bound of the "most generous quota in force" for a bucket: `burst + rate × span`.
fn bucket_bound(quotas: &[Quota], span: u64) -> u64 {
    let burst = quotas.iter().map(|q| q.burst_size()).max().unwrap();
    let rate = quotas
        .iter()
        .map(|q| u128::from(span) * u128::from(q.count()))
        .zip(quotas.iter().map(|q| u128::from(q.period_micros())))
        .map(|(n, d)| n.div_ceil(d))
        .max()
        .unwrap();
    burst + u64::try_from(rate).unwrap()
}

/// Runs `events` (gap µs, quota index, cost) on one key, rebasing on every change of quota,
/// and returns (time, quota index, admitted units) per event.
fn run<A: Algorithm>(algorithms: &[A], events: &[(u64, usize, u64)]) -> Vec<(u64, usize, u64)> {
    let mut state = A::State::default();
    let (mut now, mut current) = (1_000 * S, events.first().map_or(0, |e| e.1));
    let mut out = Vec::new();
    for &(gap, q, cost) in events {
        now += gap;
        if q != current {
            algorithms[q].rebase(&algorithms[current], &mut state, now);
            current = q;
        }
        let d = algorithms[q].check(&mut state, now, cost);
        out.push((now, q, if d.allowed() { cost } else { 0 }));
    }
    out
}

/// As [`run`], the way the stores do it: the state stays as it was written (and under the quota
/// it was written under) until a check charges something; every other check decides on a
/// converted copy and writes nothing.
fn run_store<A: Algorithm>(algorithms: &[A], events: &[(u64, usize, u64)]) -> Vec<(u64, usize, u64)>
where
    A::State: Clone,
{
    let mut state = A::State::default();
    let (mut now, mut written) = (1_000 * S, events.first().map_or(0, |e| e.1));
    let mut out = Vec::new();
    for &(gap, q, cost) in events {
        now += gap;
        let mut copy = state.clone();
        if q != written {
            algorithms[q].rebase(&algorithms[written], &mut copy, now);
        }
        let d = algorithms[q].check(&mut copy, now, cost);
        if q == written || (d.allowed() && cost > 0) {
            (state, written) = (copy, q);
        }
        out.push((now, q, if d.allowed() { cost } else { 0 }));
    }
    out
}

/// Every span between two events admits at most `bound(quotas in force, span)`.
fn assert_spans(
    quotas: &[Quota],
    log: &[(u64, usize, u64)],
    bound: impl Fn(&[Quota], u64, u64) -> u64,
) {
    for a in 0..log.len() {
        let mut in_force: Vec<Quota> = vec![quotas[log[a.saturating_sub(1)].1]];
        let mut units = 0;
        for event in &log[a..] {
            in_force.push(quotas[event.1]);
            units += event.2;
            let b = bound(&in_force, log[a].0, event.0);
            assert!(
                units <= b,
                "{units} admitted in [{}, {}] with a bound of {b}",
                log[a].0,
                event.0
            );
        }
    }
}

fn bucket_quota() -> impl Strategy<Value = Quota> {
    (1u64..=12, 1u64..=20, 1u64..=4)
        .prop_map(|(count, burst, s)| Quota::per(Duration::from_secs(s), count).burst(burst))
}

fn events(quotas: usize, cap: u64) -> impl Strategy<Value = Vec<(u64, usize, u64)>> {
    let gap = prop_oneof![4 => Just(0u64), 3 => 0..=S / 2, 1 => 0..=4 * S];
    let cost = prop_oneof![6 => Just(1u64), 1 => Just(0u64), 2 => 0..=cap];
    prop::collection::vec((gap, 0..quotas, cost), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Random sequences of quota changes among three quotas: no span of the buckets admits
    /// more than the most generous quota in force during it.
    #[test]
    fn random_quota_changes_never_beat_the_most_generous_quota(
        quotas in prop::collection::vec(bucket_quota(), 3),
        events in events(3, 20),
    ) {
        let tb: Vec<_> = quotas.iter().map(|q| TokenBucket::new(*q).unwrap()).collect();
        let gcra: Vec<_> = quotas.iter().map(|q| Gcra::new(*q).unwrap()).collect();
        let lb: Vec<_> = quotas.iter().map(|q| LeakyBucket::new(*q).unwrap()).collect();
        let bound = |q: &[Quota], a: u64, b: u64| bucket_bound(q, b - a);
        let log = run(&tb, &events);
        assert_spans(&quotas, &log, bound);
        prop_assert_eq!(&run(&gcra, &events), &log);
        prop_assert_eq!(&run(&lb, &events), &log);
        let log = run_store(&tb, &events);
        assert_spans(&quotas, &log, bound);
        prop_assert_eq!(&run_store(&gcra, &events), &log);
        prop_assert_eq!(&run_store(&lb, &events), &log);
    }

    /// The windows, among three limits of one period: no aligned window admits more than the
    /// largest limit in force during it.
    #[test]
    fn random_limit_changes_never_beat_the_largest_limit_in_a_window(
        counts in prop::collection::vec(1u64..=12, 3),
        events in events(3, 12),
    ) {
        let quotas: Vec<_> = counts.iter().map(|&c| Quota::per_second(c)).collect();
        let in_window = |q: &[Quota], a: u64, b: u64| {
            if a / S == b / S { q.iter().map(|q| q.count()).max().unwrap() } else { u64::MAX }
        };
        let fw: Vec<_> = quotas.iter().map(|q| FixedWindow::new(*q).unwrap()).collect();
        assert_spans(&quotas, &run(&fw, &events), in_window);
        let sw: Vec<_> = quotas.iter().map(|q| SlidingWindow::new(*q).unwrap()).collect();
        assert_spans(&quotas, &run(&sw, &events), in_window);
        let sl: Vec<_> = quotas.iter().map(|q| SlidingLog::new(*q).unwrap()).collect();
        assert_spans(&quotas, &run(&sl, &events), in_window);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Fixed windows of different periods (1, 2, 4 and 8 s, nested), the key charged first at
    /// the longest: within that longest window, switched to shorter windows and back in any
    /// order, never more than the largest limit in force (its count stays counted until that
    /// window ends), in the algorithm's own transitions and as the stores run them. (A key
    /// with history in shorter windows first is not covered: from shorter windows to a longer
    /// one only the current shorter window's count is carried.)
    #[test]
    fn random_period_changes_never_beat_the_largest_limit_in_the_longest_window(
        quotas in prop::collection::vec(
            (1u64..=12, 0u32..=3).prop_map(|(c, p)| Quota::per(Duration::from_secs(1 << p), c)),
            3,
        ),
        events in events(3, 12),
    ) {
        let longest = quotas.iter().map(|q| q.period_micros()).max().unwrap();
        let start = quotas.iter().position(|q| q.period_micros() == longest).unwrap();
        let mut events = events;
        events[0] = (events[0].0, start, 1);
        let fw: Vec<_> = quotas.iter().map(|q| FixedWindow::new(*q).unwrap()).collect();
        for log in [run(&fw, &events), run_store(&fw, &events)] {
            let first = log[0].0 / longest;
            let window: Vec<_> = log.iter().copied().filter(|e| e.0 / longest == first).collect();
            assert_spans(&quotas, &window, |q, _, _| q.iter().map(|q| q.count()).max().unwrap());
        }
    }
}

/// On Redis, a key whose spending is above its quota's capacity (carried from a larger quota)
/// lives until all of it has refilled, not just the quota's idle timeout: expiring sooner would
/// hand the excess back.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_redis_key_carrying_an_excess_lives_until_it_has_refilled() {
    let server = RedisServer::start();
    for kind in BUCKETS {
        let clock = ManualClock::new();
        clock.set_micros(T);
        let test = format!("ttl-excess-{kind}");
        let store = stores::node_store(
            &server.url(),
            &test,
            &clock,
            &[spec("api", Quota::per_minute(20), kind)],
        );
        let free = PlanQuota::new(kind, Quota::per_minute(5)).unwrap();
        let bob = || Key::string("bob");
        assert!(decide(&store, &[LimitCheck::new(0, bob(), 20)])
            .await
            .unwrap()
            .allowed());
        // The 413 path: a cost of 0 at Free. 20 spent: the 15 above Free's 5 are held as the
        // 45 s Pro takes to refill them, then 60 s at 5/min until whole. The check writes
        // nothing: the key keeps Pro's state (whole in 60 s) and lives as long as it.
        let checks = [LimitCheck::new(0, bob(), 0).with_quota(&free)];
        let d = decide(&store, &checks).await.unwrap().as_slice()[0];
        assert_eq!(
            (d.remaining(), d.reset()),
            (0, Duration::from_secs(105)),
            "{kind}"
        );
        let keys: Vec<String> = server.cmd(&["KEYS", &format!("*{test}*")]);
        assert_eq!(keys.len(), 1, "{kind}: {keys:?}");
        let ttl: i64 = server.cmd(&["PTTL", &keys[0]]);
        println!("redis {kind}: 20 spent at 20/min, checked at 5/min: key TTL {ttl} ms (whole in 60,000)");
        assert!((50_000..=60_001).contains(&ttl), "{kind}: {ttl} ms");
        // A rejected check at Free writes nothing either.
        let checks = [LimitCheck::new(0, bob(), 1).with_quota(&free)];
        let d = decide(&store, &checks).await.unwrap().as_slice()[0];
        assert!(!d.allowed(), "{kind}");
        let after: i64 = server.cmd(&["PTTL", &keys[0]]);
        assert!(after <= ttl, "{kind}: {after} ms");
    }
}

/// A key spent at its limit's own quota (`own`), one check of cost 0 at `other` (a plan of
/// another period), then, `gap` µs later, back at `own`: what `own` admits then (of `probe`
/// checks of 1). Nothing: the cost-0 check wrote nothing, so `own`'s window still holds it.
async fn cost_zero_at_another_period<S: Store>(
    store: &S,
    clock: &ManualClock,
    kind: AlgorithmKind,
    spend: u64,
    other: Quota,
    gap: u64,
    probe: u64,
) -> u64 {
    let other = PlanQuota::new(kind, other).unwrap();
    let bob = || Key::string("bob");
    for _ in 0..spend {
        assert!(decide(store, &[LimitCheck::new(0, bob(), 1)])
            .await
            .unwrap()
            .allowed());
    }
    let free = decide(store, &[LimitCheck::new(0, bob(), 0).with_quota(&other)])
        .await
        .unwrap()
        .as_slice()[0];
    assert!(free.allowed(), "{kind}: a cost of 0 is allowed");
    clock.advance(Duration::from_micros(gap));
    let mut admitted = 0;
    for _ in 0..probe {
        admitted += u64::from(
            decide(store, &[LimitCheck::new(0, bob(), 1)])
                .await
                .unwrap()
                .allowed(),
        );
    }
    admitted
}

const WINDOWS: [(AlgorithmKind, u64, u64); 3] = [
    // (algorithm, spent at 1000/h... or 100/h for the log, limit of the short plan per minute)
    (AlgorithmKind::FixedWindow, 1_000, 20),
    (AlgorithmKind::SlidingWindow, 1_000, 20),
    (AlgorithmKind::SlidingLog, 100, 5),
];

/// Review of issue 28: a cost-0 check at a plan of a shorter period wrote the converted state
/// (or pruned the log to the shorter window), so going back to the hourly quota found its
/// window empty: 2,000 admitted in one hourly window of 1,000 (100 more in a log of 100).
#[tokio::test]
async fn a_cost_zero_check_at_a_shorter_period_hands_nothing_back() {
    for (kind, spend, per_minute) in WINDOWS {
        let clock = ManualClock::new();
        clock.set_micros(T + 10 * S);
        let limits = [spec("api", Quota::per_hour(spend), kind)];
        let store = memory_store(&clock, &limits);
        let other = Quota::per_minute(per_minute);
        let more =
            cost_zero_at_another_period(&store, &clock, kind, spend, other, 2 * MINUTE, spend)
                .await;
        println!("memory {kind}: {spend}/h spent, cost 0 at {per_minute}/min, back 2 min later: {more} more admitted (bound 0)");
        assert_eq!(more, 0, "{kind}");
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_cost_zero_check_at_a_shorter_period_hands_nothing_back_on_redis() {
    let server = RedisServer::start();
    for (kind, spend, per_minute) in WINDOWS {
        let clock = ManualClock::new();
        clock.set_micros(T + 10 * S);
        let limits = [spec("api", Quota::per_hour(spend), kind)];
        let store = stores::node_store(&server.url(), "cost-zero-period", &clock, &limits);
        let other = Quota::per_minute(per_minute);
        let more =
            cost_zero_at_another_period(&store, &clock, kind, spend, other, 2 * MINUTE, spend)
                .await;
        println!("redis {kind}: {spend}/h spent, cost 0 at {per_minute}/min, back 2 min later: {more} more admitted (bound 0)");
        assert_eq!(more, 0, "{kind}");
    }
}

/// Review of issue 28: a downgrade kept the excess as units of the lower quota, so
/// 1,000,000/day -> 1/day answered a Retry-After of about 2,700 years. The excess is now held as
/// the time the old quota takes to refill it: the key is locked out for at most the old quota's
/// full refill plus the new one's (here 2 days), told so, and memory and Redis agree.
async fn million_a_day_to_one_a_day<S: Store>(
    store: &S,
    clock: &ManualClock,
    kind: AlgorithmKind,
) -> (Vec<(u64, bool, Option<Duration>)>, u64) {
    let one = PlanQuota::new(kind, Quota::per_day(1)).unwrap();
    let bob = || Key::string("bob");
    assert!(decide(store, &[LimitCheck::new(0, bob(), 1_000_000)])
        .await
        .unwrap()
        .allowed());
    let mut trace = Vec::new();
    let mut first = None;
    // Every 6 hours for 3 days: a check of 1 at 1/day.
    for step in 0..=12u64 {
        let d = decide(store, &[LimitCheck::new(0, bob(), 1).with_quota(&one)])
            .await
            .unwrap()
            .as_slice()[0];
        trace.push((step, d.allowed(), d.retry_after()));
        if d.allowed() && first.is_none() {
            first = Some(step * DAY / 4);
        }
        clock.advance(Duration::from_micros(DAY / 4));
    }
    (trace, first.expect("admitted within 3 days"))
}

#[tokio::test]
async fn a_million_a_day_to_one_a_day_locks_out_for_at_most_two_days() {
    for kind in BUCKETS {
        let clock = ManualClock::new();
        clock.set_micros(T);
        let store = memory_store(&clock, &[spec("api", Quota::per_day(1_000_000), kind)]);
        let (trace, first) = million_a_day_to_one_a_day(&store, &clock, kind).await;
        let told = trace[0].2.unwrap();
        println!("memory {kind}: 1,000,000/day spent, moved to 1/day: Retry-After {told:?}, first admitted after {} h", first / (3_600 * S));
        assert!(told <= Duration::from_secs(2 * 86_400), "{kind}: {told:?}");
        assert!(first <= 2 * DAY, "{kind}");
        // Each wait told is never shorter than the real one.
        for &(step, allowed, retry) in &trace {
            if !allowed {
                assert!(
                    step * DAY / 4 + retry.unwrap().as_micros() as u64 >= first,
                    "{kind}"
                );
            }
        }
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_million_a_day_to_one_a_day_decides_identically_on_redis() {
    let server = RedisServer::start();
    for kind in BUCKETS {
        let limits = [spec("api", Quota::per_day(1_000_000), kind)];
        let clock = ManualClock::new();
        clock.set_micros(T);
        let memory = memory_store(&clock, &limits);
        let on_memory = million_a_day_to_one_a_day(&memory, &clock, kind).await;
        let clock = ManualClock::new();
        clock.set_micros(T);
        let redis = stores::node_store(&server.url(), "million-a-day", &clock, &limits);
        let on_redis = million_a_day_to_one_a_day(&redis, &clock, kind).await;
        println!(
            "redis {kind}: 1,000,000/day -> 1/day: Retry-After {:?}",
            on_redis.0[0].2
        );
        assert_eq!(on_memory, on_redis, "{kind}");
    }
}

/// Fixed window, 1000/h with 10 spent, then 20/min for 58 minutes (as much as it admits, every
/// minute), then back to hourly: what the hour admitted in all. The hourly count stays counted
/// at 20/min until the hour ends, so the hour never admits more than its 1,000 (before the
/// fix: 2,140: the minutes forgot the hour's 10, and the way back forgot all but the last minute).
async fn hour_down_to_minutes_and_back<S: Store>(
    store: &S,
    clock: &ManualClock,
    kind: AlgorithmKind,
) -> u64 {
    let minute = PlanQuota::new(kind, Quota::per_minute(20)).unwrap();
    let bob = || Key::string("bob");
    let mut admitted = 0;
    let take = async |plan: Option<&PlanQuota>, n: u64| {
        let mut got = 0;
        for _ in 0..n {
            let mut check = LimitCheck::new(0, bob(), 1);
            if let Some(plan) = plan {
                check = check.with_quota(plan);
            }
            got += u64::from(decide(store, &[check]).await.unwrap().allowed());
        }
        got
    };
    admitted += take(None, 10).await;
    for _ in 0..58 {
        clock.advance(Duration::from_micros(MINUTE));
        admitted += take(Some(&minute), 25).await;
    }
    clock.advance(Duration::from_micros(30 * S));
    admitted + take(None, 1_000).await
}

#[tokio::test]
async fn a_shorter_period_keeps_the_longer_windows_count_until_it_ends() {
    for kind in [AlgorithmKind::FixedWindow, AlgorithmKind::SlidingWindow] {
        let clock = ManualClock::new();
        clock.set_micros(T + 10 * S);
        let limits = [spec("api", Quota::per_hour(1_000), kind)];
        let store = memory_store(&clock, &limits);
        let admitted = hour_down_to_minutes_and_back(&store, &clock, kind).await;
        println!("memory {kind}: 10 of 1000/h, 58 min at 20/min, back: {admitted} in the hour (bound 1,000)");
        assert_eq!(admitted, 1_000, "{kind}");
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_shorter_period_keeps_the_longer_windows_count_until_it_ends_on_redis() {
    let server = RedisServer::start();
    for kind in [AlgorithmKind::FixedWindow, AlgorithmKind::SlidingWindow] {
        let clock = ManualClock::new();
        clock.set_micros(T + 10 * S);
        let limits = [spec("api", Quota::per_hour(1_000), kind)];
        let store = stores::node_store(&server.url(), "hour-to-minutes", &clock, &limits);
        let admitted = hour_down_to_minutes_and_back(&store, &clock, kind).await;
        println!("redis {kind}: 10 of 1000/h, 58 min at 20/min, back: {admitted} in the hour (bound 1,000)");
        assert_eq!(admitted, 1_000, "{kind}");
    }
}
