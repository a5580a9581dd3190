//! A shadow limit never adds a store wait: a request waits at most one store timeout, shadow
//! limits included. And when the store did not decide (failure policy `Open` or `Local`), the
//! response does not claim a budget nobody counted: no rate-limit headers for `Open`, the
//! local limiter's own numbers for `Local`.
//!
//! Real `redis-server` processes on loopback (paused with SIGSTOP, or killed), a real layer.

use std::time::{Duration, Instant};

use http::{Request, StatusCode};
use tollgate::key::HeaderKey;
use tollgate::rate_limit::Mode;
use tollgate::store::redis::RedisBackend;
use tollgate::store::{memory::MemoryBackend, FailurePolicy};
use tollgate::{Limit, Quota, RateLimitLayer};
use tower::ServiceExt;

use crate::shaping_cancellation::{serve, Served};

use crate::harness::redis_server::RedisServer;
use crate::harness::stores;

/// The store timeout of these tests.
const TIMEOUT: Duration = Duration::from_millis(50);
/// What a request may take beyond one store timeout (the layer, the client, a loaded VM).
const MARGIN: Duration = Duration::from_millis(30);

fn limit(name: &str, policy: FailurePolicy) -> Limit {
    limit_at(name, Quota::per_second(1_000).burst(10), policy)
}

fn limit_at(name: &str, quota: Quota, policy: FailurePolicy) -> Limit {
    Limit::new(name, quota)
        .key(HeaderKey::new("x-client").unwrap())
        .on_store_error(policy)
}

fn service(server: &RedisServer, test: &str, limits: Vec<Limit>) -> impl Served {
    let layer = RateLimitLayer::builder()
        .backend(
            RedisBackend::new(server.url())
                .prefix(stores::prefix(test))
                .timeout(TIMEOUT)
                // Every call pays the timeout: no breaker opening to decide at once.
                .breaker_threshold(1_000_000)
                .local_fallback(MemoryBackend::new()),
        )
        .limits(limits)
        .build()
        .unwrap();
    serve(layer, |_| {})
}

fn req(client: usize) -> Request<()> {
    Request::get("/")
        .header("x-client", format!("c{client}"))
        .body(())
        .unwrap()
}

/// Latencies of `n` requests, `concurrency` at a time, sorted.
async fn latencies(svc: &impl Served, n: usize, concurrency: usize) -> Vec<Duration> {
    let mut all = Vec::with_capacity(n);
    for round in 0..n.div_ceil(concurrency) {
        let calls: Vec<_> = (0..concurrency)
            .map(|i| {
                let svc = svc.clone();
                tokio::spawn(async move {
                    let start = Instant::now();
                    let res = svc.oneshot(req(round * concurrency + i)).await.unwrap();
                    assert_eq!(res.status(), StatusCode::OK, "failure policy Open allows");
                    start.elapsed()
                })
            })
            .collect();
        for c in calls {
            all.push(c.await.unwrap());
        }
    }
    all.sort();
    all
}

fn p99(sorted: &[Duration]) -> Duration {
    sorted[(sorted.len() * 99).div_ceil(100).saturating_sub(1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_limit_adds_no_store_wait_on_a_stalled_redis() {
    let server = RedisServer::start();
    let plain = service(
        &server,
        "shadow-stall-plain",
        vec![limit("enforced", FailurePolicy::Open)],
    );
    let shadowed = service(
        &server,
        "shadow-stall-shadow",
        vec![
            limit("enforced", FailurePolicy::Open),
            limit("tried", FailurePolicy::Open).mode(Mode::shadow()),
        ],
    );
    // Connected and answering once, so every later call has the plain timeout.
    assert_eq!(
        plain.clone().oneshot(req(0)).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        shadowed.clone().oneshot(req(0)).await.unwrap().status(),
        StatusCode::OK
    );

    server.pause();
    // One round each first, so that both measure a Redis that already stopped answering.
    latencies(&plain, 5, 5).await;
    latencies(&shadowed, 5, 5).await;
    // Rounds of each in turn, so that a slow moment of the machine falls on both.
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        without.extend(latencies(&plain, 10, 5).await);
        with.extend(latencies(&shadowed, 10, 5).await);
    }
    without.sort();
    with.sort();
    server.resume();

    let (p99_without, p99_with) = (p99(&without), p99(&with));
    println!(
        "Redis paused, store timeout {TIMEOUT:?}: p99 {p99_without:?} without a shadow limit, {p99_with:?} with one (bound: {:?} = one timeout + {MARGIN:?})",
        TIMEOUT + MARGIN
    );
    assert!(
        p99_with <= TIMEOUT + MARGIN,
        "with a shadow limit a request waited {p99_with:?} (p99), more than one store timeout ({TIMEOUT:?}) + {MARGIN:?}"
    );
    assert!(
        p99_with <= p99_without + MARGIN,
        "the shadow limit added {:?} to p99",
        p99_with.saturating_sub(p99_without)
    );
}

#[tokio::test]
async fn a_limit_redis_did_not_decide_claims_no_budget() {
    let mut server = RedisServer::start();
    let open = service(
        &server,
        "undecided-open",
        vec![limit_at("open", Quota::per_hour(10), FailurePolicy::Open)],
    );
    let local = service(
        &server,
        "undecided-local",
        vec![limit_at(
            "local",
            Quota::per_hour(10),
            FailurePolicy::Local { share: 0.5 },
        )],
    );
    // Decided by Redis: the real numbers.
    let res = open.clone().oneshot(req(1)).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-remaining"], "9");
    let res = local.clone().oneshot(req(1)).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-remaining"], "9");

    server.kill();
    // Open: allowed, counted nowhere, so no numbers.
    let res = open.clone().oneshot(req(2)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let shown: Vec<_> = res
        .headers()
        .iter()
        .filter(|(name, _)| name.as_str().contains("ratelimit"))
        .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
        .collect();
    println!("Open, Redis down: rate-limit headers {shown:?}");
    assert!(shown.is_empty(), "nothing was counted, yet: {shown:?}");

    // Local: the local limiter's share (half of a burst of 10) decides, and is what is shown.
    let mut remaining = Vec::new();
    for _ in 0..6 {
        let res = local.clone().oneshot(req(3)).await.unwrap();
        remaining.push((
            res.status().as_u16(),
            res.headers()
                .get("x-ratelimit-limit")
                .map(|v| v.to_str().unwrap().to_owned()),
            res.headers()
                .get("x-ratelimit-remaining")
                .map(|v| v.to_str().unwrap().to_owned()),
        ));
    }
    println!("Local {{ share: 0.5 }}, Redis down: (status, limit, remaining) {remaining:?}");
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        remaining,
        [
            (200, s("5"), s("4")),
            (200, s("5"), s("3")),
            (200, s("5"), s("2")),
            (200, s("5"), s("1")),
            (200, s("5"), s("0")),
            (429, s("5"), s("0")),
        ]
    );
}

#[tokio::test]
async fn a_request_the_enforcing_limit_refuses_leaves_no_shadow_charge() {
    // The shadow limit is checked together with the enforcing one (one store wait), and
    // decides only the requests the enforcing limit allows: a refused request's shadow charge
    // is given back.
    let server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .backend(
            RedisBackend::new(server.url())
                .prefix(stores::prefix("shadow-refused"))
                .timeout(Duration::from_millis(500)),
        )
        .limit(limit_at(
            "enforced",
            Quota::per_hour(1),
            FailurePolicy::Open,
        ))
        .limit(
            Limit::new("tried", Quota::per_hour(100))
                .key(tollgate::key::GlobalKey)
                .on_store_error(FailurePolicy::Open)
                .mode(Mode::Shadow { headers: true }),
        )
        .ietf_headers(true)
        .build()
        .unwrap();
    let svc = serve(layer, |_| {});
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(svc.clone().oneshot(req(7)).await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [200, 429, 429, 429, 429]);
    // The refunds of the refused requests' shadow charges run in the background.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Another client's request shows the shadow limit: 100 - 1 (allowed) - 1 (this one).
    let res = svc.clone().oneshot(req(8)).await.unwrap();
    let shown = res.headers()["ratelimit"].to_str().unwrap().to_owned();
    println!("shadow limit after 1 allowed + 4 refused requests, and one more allowed: {shown}");
    assert!(shown.contains(r#""tried";r=98;"#), "{shown}");
}

#[tokio::test]
async fn a_shaped_limit_redis_did_not_decide_claims_no_budget_and_does_not_wait() {
    let mut server = RedisServer::start();
    let svc = service(
        &server,
        "undecided-shaped",
        vec![limit_at(
            "shaped",
            Quota::per_second(10).burst(5),
            FailurePolicy::Open,
        )
        .algorithm(tollgate::AlgorithmKind::Gcra)
        .shape(Duration::from_secs(1))],
    );
    let res = svc.clone().oneshot(req(1)).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-remaining"], "4");
    server.kill();
    let res = svc.clone().oneshot(req(2)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let shown: Vec<_> = res
        .headers()
        .iter()
        .filter(|(name, _)| name.as_str().contains("ratelimit"))
        .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
        .collect();
    let waited = res.extensions().get::<tollgate::rate_limit::ShapedDelay>();
    println!("Open, shaped limit, Redis down: rate-limit headers {shown:?}, waited {waited:?}");
    assert!(shown.is_empty(), "nothing was counted, yet: {shown:?}");
    assert_eq!(waited, None);
}
