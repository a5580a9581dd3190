//! The hybrid tier after Redis loses a key's state (`FLUSHALL`, a kill and an empty restart):
//! the instances re-charge what they know was spent, so an exhausted key does not get a fresh
//! burst.
//!
//! Four instances (separate [`HybridStore`]s, as four processes would hold) share one
//! `redis-server` started for the test and one `ManualClock` (Redis reads it too), so the refill
//! is exactly what the test advances. Each instance sends 3 requests every 10 ms of that clock.
//! The measure is the issue's: admissions in the 1.5 s after the loss, at a refill of 10/s (15),
//! next to the same 1.5 s without a loss.

use std::time::Duration;

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::hybrid::{HybridBackend, HybridStore};
use tollgate::store::redis::RedisBackend;
use tollgate::store::{Backend, FailurePolicy, LimitCheck, LimitSpec};
use tollgate::{Name, Quota};

use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{decide, prefix};

const INSTANCES: usize = 4;
const PER_STEP: usize = 3;
const STEP: Duration = Duration::from_millis(10);
/// 1.5 s of steps.
const STEPS: usize = 150;
const KEY: &str = "exhausted";

/// Refill 10/s, burst 100 for the buckets; 100 per minute for the windows (the tests stay
/// inside one window).
fn quota(kind: AlgorithmKind) -> Quota {
    match kind {
        AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow => Quota::per_minute(100),
        _ => Quota::per_second(10).burst(100),
    }
}

/// `INSTANCES` stores on one limit, and one more (a late instance) on the same keys.
fn instances(url: &str, clock: &ManualClock, kind: AlgorithmKind) -> Vec<HybridStore> {
    let p = prefix("hybrid-loss");
    let limits = [
        LimitSpec::new(Name::new("shared"), quota(kind), kind).on_store_error(
            FailurePolicy::Closed {
                retry_after: Duration::from_secs(1),
            },
        ),
    ];
    (0..=INSTANCES)
        .map(|_| {
            HybridBackend::new(
                RedisBackend::new(url)
                    .prefix(&p)
                    .clock(clock.clone())
                    .timeout(Duration::from_secs(2))
                    .breaker_threshold(1_000)
                    .probe_interval(Duration::from_millis(20)),
            )
            .clock(clock.clone())
            .build(&limits)
            .expect("build the hybrid store")
        })
        .collect()
}

/// Admitted or not; a failure (Redis down) counts as not admitted, as `Closed` decides.
async fn allow(store: &HybridStore, key: &str) -> bool {
    let checks = [LimitCheck::new(0, Key::string(key.to_owned()), 1)];
    decide(store, &checks).await.is_ok_and(|d| d.allowed())
}

/// One step: every instance sends `PER_STEP` requests, the instances concurrently; admitted.
async fn step(stores: &[HybridStore], key: &str) -> u64 {
    let tasks: Vec<_> = stores
        .iter()
        .map(|s| {
            let (s, key) = (s.clone(), key.to_owned());
            tokio::spawn(async move {
                let mut n = 0;
                for _ in 0..PER_STEP {
                    n += u64::from(allow(&s, &key).await);
                }
                n
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("the step task");
    }
    admitted
}

/// `STEPS` steps of `STEP` on the clock; admitted in all.
async fn run(stores: &[HybridStore], clock: &ManualClock, key: &str) -> u64 {
    let mut admitted = 0;
    for _ in 0..STEPS {
        clock.advance(STEP);
        admitted += step(stores, key).await;
    }
    admitted
}

/// Spends the key's whole budget with the clock frozen, then runs 1.5 s of steady traffic on
/// the exhausted key: the baseline a loss is compared with.
async fn exhaust(stores: &[HybridStore], clock: &ManualClock) -> (u64, u64) {
    let mut spent = 0;
    for _ in 0..200 {
        let n = step(stores, KEY).await;
        spent += n;
        if n == 0 {
            break;
        }
    }
    let steady = run(stores, clock, KEY).await;
    (spent, steady)
}

/// What four instances that all knew the key may admit in the 1.5 s after a loss: what refills
/// in it (15), and one request per instance (an instance whose knowledge predates the key's
/// rebuilding leases only its cost once).
fn bound() -> u64 {
    15 + INSTANCES as u64
}

fn start_clock() -> ManualClock {
    let clock = ManualClock::new();
    // One hour plus a second: a minute's window does not end during a test.
    clock.set_micros(3_601_000_000);
    clock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_grants_no_fresh_burst_to_an_exhausted_key() {
    let server = RedisServer::start();
    for kind in [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::LeakyBucket,
    ] {
        let clock = start_clock();
        let mut stores = instances(&server.url(), &clock, kind);
        stores.pop();
        let (spent, steady) = exhaust(&stores, &clock).await;
        assert!(spent >= 100, "{kind}: the budget was spent ({spent})");
        let _: String = server.cmd(&["FLUSHALL"]);
        let after = run(&stores, &clock, KEY).await;
        let bound = bound();
        println!(
            "{kind}: FLUSHALL on an exhausted key: {after} admitted in 1.5 s after it \
             ({steady} in the 1.5 s before; refill 15, bound {bound})"
        );
        assert!(
            after <= bound,
            "{kind}: {after} admitted in 1.5 s after FLUSHALL: a fresh burst (bound {bound})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_restart_grants_no_fresh_burst_to_an_exhausted_key() {
    let mut server = RedisServer::start();
    let kind = AlgorithmKind::TokenBucket;
    let clock = start_clock();
    let mut stores = instances(&server.url(), &clock, kind);
    stores.pop();
    let (spent, steady) = exhaust(&stores, &clock).await;
    assert!(spent >= 100, "the budget was spent ({spent})");
    server.kill();
    server.restart();
    // Every instance reconnects (a probe key, not counted); the clock stays frozen meanwhile.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    for s in &stores {
        while !allow(s, "probe").await {
            assert!(std::time::Instant::now() < deadline, "Redis came back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let after = run(&stores, &clock, KEY).await;
    let bound = bound();
    println!(
        "{kind}: kill + empty restart on an exhausted key: {after} admitted in 1.5 s after it \
         ({steady} in the 1.5 s before; refill 15, bound {bound})"
    );
    assert!(
        after <= bound,
        "{after} admitted in 1.5 s after an empty restart: a fresh burst (bound {bound})"
    );
}

/// The instance that first reaches the emptied key knew nothing of it (it joined late): the
/// instances that did know re-charge what they knew on their next call all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_caller_that_knew_nothing_does_not_reopen_the_budget() {
    let server = RedisServer::start();
    let kind = AlgorithmKind::TokenBucket;
    let clock = start_clock();
    let mut stores = instances(&server.url(), &clock, kind);
    let late = stores.pop().expect("the late instance");
    let (spent, steady) = exhaust(&stores, &clock).await;
    assert!(spent >= 100, "the budget was spent ({spent})");
    let _: String = server.cmd(&["FLUSHALL"]);
    // The late instance's first request for the key: a cold lease of its cost.
    let first = u64::from(allow(&late, KEY).await);
    let after = first + run(&stores, &clock, KEY).await;
    // The late instance knew nothing: its cold lease (its one request) is on top.
    let bound = bound() + 1;
    println!(
        "{kind}: FLUSHALL, then first a late instance that never saw the key: {after} admitted in \
         1.5 s ({steady} in the 1.5 s before; refill 15, bound {bound})"
    );
    assert!(
        after <= bound,
        "{after} admitted in 1.5 s after FLUSHALL and a late first caller: a fresh burst (bound {bound})"
    );
}

/// One request per instance in turn, the clock frozen, until `stop` are admitted or a whole
/// round admits nothing (at most 400 rounds); admitted.
async fn drain(stores: &[HybridStore], stop: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..400 {
        let mut round = 0;
        for s in stores {
            round += u64::from(allow(s, KEY).await);
        }
        admitted += round;
        if round == 0 || admitted >= stop {
            break;
        }
    }
    admitted
}

/// A key part spent (60 of 100, the clock frozen: nothing refills) keeps what it spent through
/// a `FLUSHALL`, in every leasing algorithm, the windows included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_keeps_what_a_part_spent_key_spent() {
    let server = RedisServer::start();
    for kind in [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::LeakyBucket,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
    ] {
        let clock = start_clock();
        let mut stores = instances(&server.url(), &clock, kind);
        stores.pop();
        let before = drain(&stores, 60).await;
        assert_eq!(before, 60, "{kind}: 60 of 100 admitted");
        clock.advance(Duration::from_millis(1));
        let _: String = server.cmd(&["FLUSHALL"]);
        let after = drain(&stores, u64::MAX).await;
        // One request per instance beyond the capacity (see `bound`).
        let bound = 100 + INSTANCES as u64;
        println!(
            "{kind}: 60 of 100 spent, FLUSHALL, then {after} more admitted: {} in all \
             (capacity 100, bound {bound})",
            before + after
        );
        assert!(
            before + after <= bound,
            "{kind}: {} admitted of a capacity of 100 across a FLUSHALL (bound {bound})",
            before + after
        );
    }
}

/// The other side: a key that Redis expired because it was full again is charged nothing, by
/// the instance that knew it spent nor by one that finds it started over by another instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_expired_once_full_is_charged_nothing() {
    let server = RedisServer::start();
    let clock = start_clock();
    let kind = AlgorithmKind::TokenBucket;
    // Burst 10 refilling in 100 ms: the key's ttl in Redis (real time) is 100 ms.
    let limits = [
        LimitSpec::new(Name::new("short"), Quota::per_second(100).burst(10), kind).on_store_error(
            FailurePolicy::Closed {
                retry_after: Duration::from_secs(1),
            },
        ),
    ];
    let p = prefix("hybrid-expired");
    let stores: Vec<HybridStore> = (0..2)
        .map(|_| {
            HybridBackend::new(
                RedisBackend::new(server.url())
                    .prefix(&p)
                    .clock(clock.clone())
                    .timeout(Duration::from_secs(2)),
            )
            .clock(clock.clone())
            .build(&limits)
            .expect("build the hybrid store")
        })
        .collect();
    for order in [[0, 1], [1, 0]] {
        let spent = drain(&stores, u64::MAX).await;
        assert_eq!(spent, 10, "the burst");
        // The bucket refills (the clock) and Redis drops the key (its ttl, real time).
        clock.advance(Duration::from_secs(1));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while server.cmd::<i64>(&["DBSIZE"]) > 0 {
            assert!(std::time::Instant::now() < deadline, "the key expired");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut again = u64::from(allow(&stores[order[0]], KEY).await);
        again += drain(
            &[stores[order[1]].clone(), stores[order[0]].clone()],
            u64::MAX,
        )
        .await;
        println!("a key expired once full: {again} admitted again of a burst of 10");
        assert_eq!(again, 10, "a full key is charged nothing");
        clock.advance(Duration::from_secs(1));
        while server.cmd::<i64>(&["DBSIZE"]) > 0 {
            assert!(std::time::Instant::now() < deadline, "the key expired");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A sliding window counter weighs the previous window into the next one, so what the instances
/// knew of a key lost just before its window ended still counts after it: exhausted at 59.9 s of
/// a one-minute window (100 per minute) and flushed, the key admits at 60.1 s and at 90 s what
/// it would have admitted without the loss (the estimate: about 0, then about 50), plus at most
/// one request per instance that knew it; and one more when an instance that never saw the key
/// reaches it first (the others then charge what they knew on top, weighed the same way). It
/// admits no fewer than without the loss less that many either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_at_a_window_end_keeps_the_sliding_estimate() {
    let server = RedisServer::start();
    let kind = AlgorithmKind::SlidingWindow;
    // The window of the start clock is [3600 s, 3660 s).
    let (end, late) = (3_659_900_000, 3_660_100_000);
    let half = 3_690_000_000;
    let mut figures = Vec::new();
    for (flush, late_first) in [(false, false), (true, false), (true, true)] {
        let clock = start_clock();
        let mut stores = instances(&server.url(), &clock, kind);
        let newcomer = stores.pop().expect("the late instance");
        clock.set_micros(end);
        let spent = drain(&stores, u64::MAX).await;
        assert_eq!(spent, 100, "{kind}: the budget was spent at 59.9 s");
        if flush {
            let _: String = server.cmd(&["FLUSHALL"]);
        }
        clock.set_micros(late);
        let mut at_late = 0;
        if late_first {
            at_late += u64::from(allow(&newcomer, KEY).await);
        }
        at_late += drain(&stores, u64::MAX).await;
        clock.set_micros(half);
        let at_half = drain(&stores, u64::MAX).await;
        figures.push((at_late, at_half));
    }
    let (base_late, base_half) = figures[0];
    for (i, &(late_n, half_n)) in figures.iter().enumerate().skip(1) {
        let what = if i == 1 {
            "FLUSHALL"
        } else {
            "FLUSHALL, a newcomer first"
        };
        // One request per instance that knew the key, and the newcomer's cold lease.
        let extra = INSTANCES as u64 + u64::from(i == 2);
        let late_bound = base_late + extra;
        let bound = base_late + base_half + extra;
        println!(
            "{kind}: exhausted at 59.9 s, {what}: {late_n} admitted at 60.1 s and {half_n} at \
             90 s (without the loss: {base_late} and {base_half}; bound {late_bound} at 60.1 s, \
             {bound} in all)"
        );
        assert!(
            late_n <= late_bound,
            "{kind}, {what}: {late_n} admitted at 60.1 s after a loss at 59.9 s: a fresh window \
             (without the loss: {base_late}; bound {late_bound})"
        );
        assert!(
            late_n + half_n <= bound,
            "{kind}, {what}: {late_n} admitted at 60.1 s and {half_n} at 90 s after a loss at \
             59.9 s (without the loss: {base_late} and {base_half}; bound {bound})"
        );
        // Nor does the loss cost more than that the other way: what is charged again weighs
        // as it would have, it does not stay in the count at full weight.
        let floor = (base_late + base_half).saturating_sub(extra);
        assert!(
            late_n + half_n >= floor,
            "{kind}, {what}: {late_n} admitted at 60.1 s and {half_n} at 90 s after a loss at \
             59.9 s (without the loss: {base_late} and {base_half}; at least {floor})"
        );
    }
}
