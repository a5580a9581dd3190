//! The hybrid store (issue 10): a local tier of leases in front of a real `redis-server` (and a
//! 3-master Cluster), several instances in separate tasks. Time is a shared `ManualClock` (Redis
//! reads it too), so leases expire and buckets refill only when a test says so.

use std::sync::Arc;
use std::time::Duration;

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::hybrid::{HybridBackend, HybridStore};
use tollgate::store::redis::RedisBackend;
use tollgate::store::{Backend, FailurePolicy, LimitCheck, LimitSpec};
use tollgate::{Name, Quota};

use crate::harness::redis_cluster::RedisCluster;
use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{decide, prefix};

const CAPACITY: u64 = 100;

fn closed() -> FailurePolicy {
    FailurePolicy::Closed {
        retry_after: Duration::from_secs(1),
    }
}

/// Capacity 100, refilling far slower than any test runs.
fn slow(kind: AlgorithmKind) -> Quota {
    match kind {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => {
            Quota::per_day(1).burst(CAPACITY)
        }
        _ => Quota::per_day(CAPACITY),
    }
}

fn spec(name: &str, quota: Quota, kind: AlgorithmKind, policy: FailurePolicy) -> LimitSpec {
    LimitSpec::new(Name::new(name), quota, kind).on_store_error(policy)
}

fn redis(url: &str, prefix: &str, clock: &ManualClock) -> RedisBackend {
    RedisBackend::new(url)
        .prefix(prefix)
        .clock(clock.clone())
        .timeout(Duration::from_secs(3))
}

fn hybrid(url: &str, prefix: &str, clock: &ManualClock, limits: &[LimitSpec]) -> HybridStore {
    HybridBackend::new(redis(url, prefix, clock))
        .clock(clock.clone())
        .build(limits)
        .expect("build the hybrid store")
}

async fn allow(store: &HybridStore, key: &str) -> bool {
    let checks = [LimitCheck::new(0, Key::string(key.to_owned()), 1)];
    decide(store, &checks)
        .await
        .expect("no failure in this test")
        .allowed()
}

/// `n` concurrent requests from each store, released together; admitted per store.
async fn hammer(stores: &[HybridStore], key: &str, n: usize) -> Vec<u64> {
    let barrier = Arc::new(tokio::sync::Barrier::new(stores.len() * n));
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        for _ in 0..n {
            let (store, barrier, key) = (store.clone(), barrier.clone(), key.to_owned());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                (i, allow(&store, &key).await)
            }));
        }
    }
    let mut admitted = vec![0; stores.len()];
    for t in tasks {
        let (i, ok) = t.await.unwrap();
        admitted[i] += u64::from(ok);
    }
    admitted
}

/// Script calls the server has run (EVALSHA + EVAL), from `INFO commandstats`.
fn script_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split(['=', ','])
                .nth(1)
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_never_admit_more_than_the_capacity_and_give_back_what_they_held() {
    let server = RedisServer::start();
    for kind in [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::LeakyBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::SlidingLog,
    ] {
        let clock = ManualClock::new();
        // Start well inside a day, so a day's window does not end during the test.
        clock.set_micros(3_600_000_000);
        let p = prefix("hybrid-8");
        let limits = [spec("shared", slow(kind), kind, closed())];
        let stores: Vec<_> = (0..8)
            .map(|_| hybrid(&server.url(), &p, &clock, &limits))
            .collect();
        let (max_units, ttl) = stores[0].lease_bounds(0).unwrap_or((0, 0));
        let first = hammer(&stores, "hot", 40).await;
        let admitted: u64 = first.iter().sum();
        eprintln!("{kind}: 8 x 40 concurrent: {admitted} admitted at once ({first:?})");
        assert!(
            admitted <= CAPACITY,
            "{kind}: over-admitted: {admitted} ({first:?})"
        );
        // Under-admission: at most what the others hold, each at most one lease.
        assert!(
            admitted + 8 * max_units >= CAPACITY,
            "{kind}: {admitted} admitted, leases of at most {max_units}"
        );
        // The leases expire; each instance gives back what it held with its next call, and
        // draining the instances one after another then finds the whole capacity.
        clock.advance(Duration::from_micros(ttl + 1));
        let mut total = admitted;
        for store in &stores {
            while allow(store, "hot").await {
                total += 1;
                assert!(total <= CAPACITY, "{kind}: over-admitted after give-back");
            }
        }
        // The refund rule keeps what refilled since a lease (a few µs of a day's refill): at
        // most one unit per instance is lost to rounding.
        assert!(
            total + 8 >= CAPACITY,
            "{kind}: {total} admitted in all after the leases were given back"
        );
        if kind == AlgorithmKind::SlidingLog {
            assert_eq!(
                stores[0].lease_bounds(0),
                None,
                "the sliding log never leases"
            );
            assert_eq!(stores[0].stats().local_allowed(), 0);
        } else {
            let local: u64 = stores.iter().map(|s| s.stats().local_allowed()).sum();
            assert!(local > admitted / 2, "{kind}: only {local} decided locally");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_keys_check_plainly_and_a_hot_key_costs_a_few_calls() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let kind = AlgorithmKind::TokenBucket;
    let store = hybrid(
        &server.url(),
        &prefix("hybrid-cold"),
        &clock,
        &[spec("shared", slow(kind), kind, closed())],
    );
    // The first call may find the lease script not loaded yet (NOSCRIPT, then EVAL).
    assert!(allow(&store, "warm-up").await);
    let before = script_calls(&server);
    for i in 0..200 {
        assert!(allow(&store, &format!("cold-{i}")).await);
    }
    let stats = store.stats();
    assert_eq!(stats.leases(), 201, "one call per cold key");
    assert_eq!(stats.leased_units(), 201, "a cold key leases its cost only");
    assert_eq!(script_calls(&server) - before, 200);

    let before = script_calls(&server);
    let mut admitted = 0;
    for _ in 0..1_000 {
        admitted += u64::from(allow(&store, "hot").await);
    }
    assert_eq!(
        admitted, CAPACITY,
        "one instance admits exactly the capacity"
    );
    let calls = script_calls(&server) - before;
    // Cold (1), then leases of at most 25 (4 or 5), then one refusal; the other ~900
    // refusals are remembered locally.
    assert!(calls <= 8, "{calls} script calls for a hot key");
    assert!(stats.local_rejected() >= 890, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_is_refused_locally_until_its_retry_after() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set_micros(1_000_000_000);
    let kind = AlgorithmKind::TokenBucket;
    // The example's limit: 100 per 10 s.
    let quota = Quota::per_second(10).burst(100);
    let store = hybrid(
        &server.url(),
        &prefix("hybrid-refused"),
        &clock,
        &[spec("ip", quota, kind, closed())],
    );
    let (_, ttl) = store.lease_bounds(0).unwrap();
    let checks = [LimitCheck::new(0, Key::string("abuser"), 1)];
    let mut admitted = 0;
    let mut last = None;
    for _ in 0..150 {
        let d = decide(&store, &checks).await.unwrap();
        admitted += u64::from(d.allowed());
        last = Some(d.as_slice()[0]);
    }
    assert_eq!(admitted, CAPACITY);
    let refusal = last.unwrap();
    assert!(!refusal.allowed());
    let retry = refusal.retry_after().unwrap();
    // The staleness bound: a refused key asks again at most one lease lifetime later.
    assert!(retry <= Duration::from_micros(ttl), "{retry:?}");
    assert!(
        retry >= Duration::from_millis(100),
        "waits for more than one unit"
    );
    assert_eq!(refusal.limit(), 100);
    assert_eq!(refusal.remaining(), 0);

    let before = script_calls(&server);
    for _ in 0..1_000 {
        let d = decide(&store, &checks).await.unwrap().as_slice()[0];
        assert!(!d.allowed());
        assert!(d.retry_after().unwrap() <= retry, "retry-after counts down");
    }
    clock.advance(retry - Duration::from_millis(1));
    let d = decide(&store, &checks).await.unwrap().as_slice()[0];
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(1)));
    assert_eq!(
        script_calls(&server),
        before,
        "1 001 refusals, no Redis call"
    );
    clock.advance(Duration::from_millis(1));
    let d = decide(&store, &checks).await.unwrap().as_slice()[0];
    assert!(d.allowed(), "what refilled meanwhile is leased: {d:?}");
    assert_eq!(
        script_calls(&server),
        before + 1,
        "one call per retry interval"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_stay_within_the_bound_as_the_bucket_refills() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set_micros(1_000_000_000);
    let kind = AlgorithmKind::TokenBucket;
    let quota = Quota::per_second(10).burst(100);
    let p = prefix("hybrid-refill");
    let limits = [spec("ip", quota, kind, closed())];
    let stores: Vec<_> = (0..4)
        .map(|_| hybrid(&server.url(), &p, &clock, &limits))
        .collect();
    let (max_units, ttl) = stores[0].lease_bounds(0).unwrap();
    let before = script_calls(&server);
    let step = Duration::from_millis(10);
    let mut admitted = 0u64;
    let mut per_step = Vec::new();
    for s in 0..300u64 {
        let got: u64 = hammer(&stores, "client", 3).await.iter().sum();
        admitted += got;
        per_step.push(got);
        // From the key's first request, never more than one shared bucket admits.
        let fair = CAPACITY + 10 * (s * 10) / 1_000;
        assert!(
            admitted <= fair,
            "step {s}: {admitted} admitted, one bucket allows {fair}"
        );
        clock.advance(step);
    }
    let elapsed_s = 3;
    let fair = CAPACITY + 10 * elapsed_s;
    // Under-admission: at most the leases the four instances hold (and the wait a refused
    // instance keeps, one lease lifetime of refill).
    let under = 4 * max_units + 10 * ttl / 1_000_000;
    assert!(
        admitted + under >= fair,
        "{admitted} admitted of {fair}, under-admission bound {under}"
    );
    // Over any one second, at most the burst plus the refill of that second and one lease
    // lifetime (units leased up to a lifetime ago may be spent now).
    for w in per_step.windows(100) {
        let n: u64 = w.iter().sum();
        assert!(
            n <= CAPACITY + 10 + 10 * ttl / 1_000_000,
            "{n} in one second"
        );
    }
    let calls = script_calls(&server) - before;
    eprintln!(
        "4 instances, 3 s: {admitted} admitted of {fair} (under-admission bound {under}), {calls} script calls"
    );
    assert!(
        calls * 5 <= admitted,
        "{calls} script calls for {admitted} admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_stay_all_or_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let kind = AlgorithmKind::TokenBucket;
    let limits = [
        spec("per-key", Quota::per_day(1).burst(5), kind, closed()),
        spec("global", Quota::per_day(1).burst(300), kind, closed()),
    ];
    let store = hybrid(&server.url(), &prefix("hybrid-multi"), &clock, &limits);
    let both = |key: String| {
        [
            LimitCheck::new(0, Key::string(key), 1),
            LimitCheck::new(1, Key::global(), 1),
        ]
    };
    let mut a = 0;
    for _ in 0..50 {
        let d = decide(&store, &both("a".into())).await.unwrap();
        if d.allowed() {
            a += 1;
        } else {
            assert_eq!(d.rejected().unwrap().policy().as_str(), "per-key");
        }
    }
    assert_eq!(a, 5);
    // The 45 refusals spent nothing of the global limit: 295 other keys still get through.
    let mut others = 0;
    for i in 0..400 {
        others += u64::from(
            decide(&store, &both(format!("k{i}")))
                .await
                .unwrap()
                .allowed(),
        );
    }
    assert_eq!(others, 295);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_the_local_share_decides_and_recovery_grants_no_burst() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new();
    let kind = AlgorithmKind::TokenBucket;
    let limits = [spec(
        "shared",
        slow(kind),
        kind,
        FailurePolicy::Local { share: 0.5 },
    )];
    let store = HybridBackend::new(
        RedisBackend::new(server.url())
            .prefix(prefix("hybrid-down"))
            .clock(clock.clone())
            .timeout(Duration::from_millis(200))
            .breaker_threshold(2)
            .probe_interval(Duration::from_millis(20)),
    )
    .clock(clock.clone())
    .build(&limits)
    .unwrap();
    let (_, ttl) = store.lease_bounds(0).unwrap();
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u64::from(allow(&store, "k").await);
    }
    assert_eq!(admitted, 10);
    server.kill();
    // Leases held keep deciding (their units are spent in Redis already); then the local
    // share: half the capacity.
    let mut during = 0;
    for _ in 0..200 {
        during += u64::from(allow(&store, "k").await);
    }
    assert!(
        (50..=50 + 25).contains(&during),
        "{during} admitted while Redis was down"
    );
    assert!(store.redis().stats().local_fallback() > 0);
    // Redis comes back empty: a plain store would find a full bucket of 100 again. The
    // instance charges what its local share admitted first.
    server.restart();
    clock.advance(Duration::from_micros(ttl + 1));
    // The breaker's probe (every 20 ms, real time) closes it once Redis answers.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.redis().stats().breaker_open() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!store.redis().stats().breaker_open(), "the breaker closed");
    let mut after = 0;
    for _ in 0..200 {
        after += u64::from(allow(&store, "k").await);
    }
    assert!(
        after + 50 <= CAPACITY,
        "{after} admitted after recovery: the local share's {during} was not charged"
    );
    assert!(after > 0, "Redis decides again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_on_a_cluster_never_over_admit() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new();
    let kind = AlgorithmKind::TokenBucket;
    let p = prefix("hybrid-cluster");
    let limits = [spec("shared", slow(kind), kind, closed())];
    let stores: Vec<_> = (0..4)
        .map(|_| {
            HybridBackend::new(
                RedisBackend::cluster(cluster.urls())
                    .prefix(p.clone())
                    .clock(clock.clone())
                    .timeout(Duration::from_secs(3)),
            )
            .clock(clock.clone())
            .build(&limits)
            .unwrap()
        })
        .collect();
    let (max_units, _) = stores[0].lease_bounds(0).unwrap();
    for key in ["alpha", "bravo", "charlie", "delta", "echo"] {
        let admitted: u64 = hammer(&stores, key, 40).await.iter().sum();
        assert!(admitted <= CAPACITY, "{key}: {admitted}");
        assert!(admitted + 4 * max_units >= CAPACITY, "{key}: {admitted}");
    }
    // The keys spread over the masters.
    let masters = cluster
        .nodes
        .iter()
        .filter(|n| {
            let size: i64 = n.cmd(&["DBSIZE"]);
            size > 0
        })
        .count();
    assert!(masters >= 2, "keys on {masters} masters");
}

#[test]
fn the_knob_is_validated_with_the_field_and_the_fix() {
    let limits = [spec(
        "a",
        Quota::per_second(10),
        AlgorithmKind::TokenBucket,
        closed(),
    )];
    for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
        let err = HybridBackend::new(RedisBackend::new("redis://127.0.0.1:1"))
            .max_lease(bad)
            .build(&limits)
            .unwrap_err();
        assert_eq!(err.field(), "hybrid.max_lease", "{bad}");
        assert!(err.message().contains("(0, 1]"), "{err}");
    }
    let err = HybridBackend::new(RedisBackend::new("redis://127.0.0.1:1"))
        .max_keys(0)
        .build(&limits)
        .unwrap_err();
    assert_eq!(err.field(), "hybrid.max_keys");
    // The Redis backend's own validation still applies.
    let err = HybridBackend::new(RedisBackend::new("redis://127.0.0.1:1"))
        .build(&[LimitSpec::new(
            Name::new("a"),
            Quota::per_second(1),
            AlgorithmKind::TokenBucket,
        )])
        .unwrap_err();
    assert_eq!(err.field(), "failure_policy");
    HybridBackend::new(RedisBackend::new("redis://127.0.0.1:1"))
        .max_lease(1.0)
        .build(&limits)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_layer_headers_count_down_and_refusals_say_when() {
    use http::{Request, Response, StatusCode};
    use tollgate::key::GlobalKey;
    use tollgate::{Limit, RateLimitLayer};
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    let server = RedisServer::start();
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .limit(
            Limit::new("global", Quota::per_day(1).burst(20))
                .key(GlobalKey)
                .on_store_error(closed()),
        )
        .backend(
            HybridBackend::new(redis(&server.url(), &prefix("hybrid-layer"), &clock))
                .clock(clock.clone()),
        )
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(String::new()))
        }));
    let mut last = u64::MAX;
    let mut ok = 0;
    for _ in 0..30 {
        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        let h = res.headers();
        assert_eq!(h["x-ratelimit-limit"], "20");
        let remaining: u64 = h["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        if res.status() == StatusCode::OK {
            ok += 1;
            assert!(
                remaining < last,
                "remaining counts down: {remaining} after {last}"
            );
            assert_eq!(remaining, 20 - ok, "one instance: exact");
            last = remaining;
        } else {
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(remaining, 0);
            assert!(h.contains_key("retry-after"));
        }
    }
    assert_eq!(ok, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_goes_back_into_the_lease_it_came_from() {
    use tollgate::store::{Checked, Store};

    let server = RedisServer::start();
    let clock = ManualClock::new();
    let kind = AlgorithmKind::TokenBucket;
    let store = hybrid(
        &server.url(),
        &prefix("hybrid-refund"),
        &clock,
        &[spec("shared", Quota::per_day(1).burst(10), kind, closed())],
    );
    let checks = [LimitCheck::new(0, Key::string("k"), 1)];
    let mut admitted = 0;
    let mut refunded = 0;
    for i in 0..40 {
        let d = decide(&store, &checks).await.unwrap();
        if d.allowed() {
            admitted += 1;
            // Every other admission is refunded (charge by outcome).
            if i % 2 == 0 {
                let at = d.decided_at().expect("a lease time to refund against");
                let r = match store.refund(&checks, at) {
                    Checked::Ready(r) => r,
                    Checked::Pending(f) => f.await,
                };
                r.unwrap();
                refunded += 1;
            }
        }
    }
    // The refunded units were admitted again; nothing was created.
    assert!(
        admitted - refunded <= 10,
        "{admitted} admitted, {refunded} refunded"
    );
    assert!(
        admitted - refunded >= 9,
        "{admitted} admitted, {refunded} refunded"
    );
    assert!(refunded >= 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_is_decided_by_the_local_share_and_resumes_without_a_burst() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let kind = AlgorithmKind::TokenBucket;
    let limits = [spec(
        "shared",
        Quota::per_day(1).burst(40),
        kind,
        FailurePolicy::Local { share: 0.5 },
    )];
    let store = HybridBackend::new(
        RedisBackend::new(server.url())
            .prefix(prefix("hybrid-pause"))
            .clock(clock.clone())
            .timeout(Duration::from_millis(50))
            .breaker_threshold(2)
            .probe_interval(Duration::from_millis(20)),
    )
    .clock(clock.clone())
    .build(&limits)
    .unwrap();
    let (_, ttl) = store.lease_bounds(0).unwrap();
    assert!(allow(&store, "k").await, "a cold key: one plain lease");
    clock.advance(Duration::from_micros(ttl + 1));
    server.pause();
    let mut during = 0;
    for _ in 0..40 {
        during += u64::from(allow(&store, "k").await);
    }
    // The local share holds half the capacity: 20.
    assert!(during <= 20, "{during} admitted while Redis was paused");
    assert!(during >= 19, "the local share decided: {during}");
    server.resume();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.redis().stats().breaker_open() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    clock.advance(Duration::from_micros(ttl + 1));
    let leases = store.stats().leases();
    let mut after = 0;
    for _ in 0..100 {
        after += u64::from(allow(&store, "k").await);
    }
    // Redis kept its state (1 spent) and is charged the share's admissions: what is left is at
    // most 40 - 1 - 20. The leases sent while Redis was paused ran when it resumed, after
    // their callers had given up: their units stay spent (under-admission, never more).
    assert!(
        1 + during + after <= 40,
        "1 + {during} + {after} admitted: more than the capacity"
    );
    assert!(store.stats().leases() > leases, "Redis decides again");
    eprintln!("paused: {during} admitted by the local share, {after} after resuming");
}

/// Decided by Redis and admitted (a failure, decided by `Closed`, is not).
async fn decided(store: &HybridStore, key: &str) -> bool {
    let checks = [LimitCheck::new(0, Key::string(key.to_owned()), 1)];
    decide(store, &checks).await.is_ok_and(|d| d.allowed())
}

/// A Cluster master that stalls (SIGSTOP, or a network partition: its connections stay open and
/// nothing answers) must not make the probe of another master's breaker fail: the probe checks
/// the Cluster connection with a command routed to a slot the probed master serves, not to any
/// node (about a third of such commands went to the stalled master and timed out, and the
/// probe then replaced the Cluster connection: once in 8 cycles, B deciding again up to 960 ms
/// after its resume; now 0, and about 210 ms). Master A stays stalled; master B is stalled and
/// resumed 8 times, each time until its breaker is open; master C is never probed, so every
/// connection C accepts is a replaced Cluster connection, this test's reading, or the store's
/// own connection to C made when it first reads the slot map there (one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_master_does_not_make_a_healthy_masters_probe_replace_the_connection() {
    const CYCLES: usize = 8;
    let cluster = RedisCluster::start_with(&["--cluster-require-full-coverage", "no"]);
    let p = prefix("hybrid-stalled");
    let limits = [spec(
        "calls",
        Quota::per_second(100_000),
        AlgorithmKind::TokenBucket,
        closed(),
    )];
    let backend = || {
        RedisBackend::cluster(cluster.urls())
            .prefix(p.clone())
            .timeout(Duration::from_millis(100))
            .connect_timeout(Duration::from_millis(300))
            .breaker_threshold(1)
            .probe_interval(Duration::from_millis(50))
    };
    let plain = backend().build(&limits).unwrap();
    let store = HybridBackend::new(backend()).build(&limits).unwrap();
    // Client keys by the master their Redis key lives on.
    let mut on: [Vec<String>; 3] = Default::default();
    for i in 0.. {
        let client = format!("client-{i}");
        let redis_key = plain.redis_key(0, &Key::string(client.clone())).unwrap();
        on[cluster.index_for(&redis_key)].push(client);
        if on.iter().all(|v| v.len() > 3 * CYCLES + 1) {
            break;
        }
    }
    let (a, b, c) = (0, 1, 2);
    for keys in &on {
        assert!(decided(&store, &keys[0]).await, "every master answers");
    }
    // Connections `n` accepted, this reading's own included.
    let accepted = |n: usize| -> u64 {
        let info: String = cluster.nodes[n].cmd(&["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("total_connections_received")
    };
    cluster.nodes[a].pause();
    let before = accepted(c);
    let mut slowest = Duration::ZERO;
    for cycle in 0..CYCLES {
        let keys = &on[b][1 + 3 * cycle..];
        cluster.nodes[b].pause();
        // The lease call times out (after 250 ms: a request waits at most the store timeout,
        // the call longer) and opens B's breaker (threshold 1): checks then fail at once.
        assert!(!decided(&store, &keys[0]).await, "B is stalled");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = std::time::Instant::now();
        assert!(!decided(&store, &keys[1]).await, "B is stalled");
        assert!(
            t.elapsed() < Duration::from_millis(50),
            "B's breaker is open ({:?})",
            t.elapsed()
        );
        cluster.nodes[b].resume();
        let t0 = std::time::Instant::now();
        let deadline = t0 + Duration::from_secs(10);
        while !decided(&store, &keys[2]).await {
            assert!(std::time::Instant::now() < deadline, "B decides again");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        slowest = slowest.max(t0.elapsed());
    }
    // Less the connection that reads the figure, and the store's own connection to C, made when
    // it first reads the slot map from C (a replaced connection makes at least two: the redis-rs
    // Cluster connection's and the store's own).
    let replaced = (accepted(c) - before - 1).saturating_sub(1);
    cluster.nodes[a].resume();
    println!(
        "master A stalled, master B stalled and resumed {CYCLES} times: the Cluster connection \
         was replaced {replaced} times (connections master C accepted); B decided again at most \
         {slowest:?} after each resume"
    );
    assert_eq!(
        replaced, 0,
        "a healthy master's probe replaced the Cluster connection because of a stalled one"
    );
}
