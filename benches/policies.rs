//! What plans, overrides, shadow limits, charge-by-outcome and metrics add to a request, next
//! to the plain layer, side by side in one run.
//!
//! Run with `cargo bench --bench policies`. Every variant is the same `RateLimitLayer` (memory
//! store, default `SystemClock`, token bucket, X-RateLimit headers) around a `service_fn`
//! answering `200`, keyed by an `x-api-key` header drawn from 1,000 keys in a pseudo-random
//! order (splitmix64 of a counter). Requests are built outside the timing; everything else
//! (the layer, the store, the headers, dropping the response) is timed. The quota never refuses
//! (a burst of 10^9), so every request takes the allowed path. Variants alternate within each
//! round; it prints the median ns per request of each and the difference to `plain`.
//! `plain_prometheus_installed` runs last, after a Prometheus recorder is installed (feature
//! `metrics`: the other variants record into the facade's default no-op recorder).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::key::{GlobalKey, HeaderKey, Key, KeyValue};
use tollgate::plan::{CachedLookup, Plan, PlanMap, Resolution};
use tollgate::rate_limit::Charge;
use tollgate::rate_limit::Mode;
use tollgate::rate_limit::Override;
use tollgate::{Limit, Name, Quota, RateLimitLayer, RequestView};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

const KEYS: u64 = 1_000;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn key_name(i: u64) -> String {
    if i.is_multiple_of(2) {
        format!("free-{i}")
    } else {
        format!("pro-{i}")
    }
}

fn quota() -> Quota {
    Quota::per_second(1).burst(1_000_000_000)
}

fn api() -> Limit {
    Limit::new("api", quota()).key(HeaderKey::new("x-api-key").unwrap())
}

fn with_plans(limit: Limit) -> Limit {
    limit
        .plan(Plan::new("free", Quota::per_second(1).burst(1_000_000_000)))
        .plan(Plan::new("pro", Quota::per_second(2).burst(1_000_000_000)))
}

struct NoopWake;
impl Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

/// Drives `fut` to completion on this thread (plan lookups and refunds resolve at once here).
fn block_on<F: Future>(fut: F) -> F::Output {
    let waker = Waker::from(Arc::new(NoopWake));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

type Svc = tower::util::BoxCloneSyncService<
    Request<()>,
    Response<tollgate::rate_limit::ResponseBody<String>>,
    Infallible,
>;

fn service(layer: RateLimitLayer, status: StatusCode) -> Svc {
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(move |_: Request<()>| async move {
                let mut res = Response::new(String::new());
                *res.status_mut() = status;
                Ok::<_, Infallible>(res)
            }));
    tower::util::BoxCloneSyncService::new(svc)
}

fn variants() -> Vec<(&'static str, Svc)> {
    let plain = RateLimitLayer::new(api()).unwrap();

    let mut map = PlanMap::new();
    for i in 0..KEYS {
        map = map.assign(
            key_name(i),
            if i.is_multiple_of(2) { "free" } else { "pro" },
        );
    }
    let plans_map = RateLimitLayer::new(with_plans(api()).resolve_plan(map)).unwrap();

    let plans_closure = RateLimitLayer::new(with_plans(api()).resolve_plan(
        |_: &RequestView<'_>, key: &Key<'_>| match key.value() {
            KeyValue::Bytes(b) if b.starts_with(b"free-") => Resolution::Plan(Name::new("free")),
            _ => Resolution::Plan(Name::new("pro")),
        },
    ))
    .unwrap();

    let lookup = CachedLookup::new(|key: String| async move {
        Some(
            if key.starts_with("free-") {
                "free"
            } else {
                "pro"
            }
            .to_owned(),
        )
    })
    .ttl(Duration::from_secs(3600))
    .unwrap();
    let plans_cached = RateLimitLayer::new(with_plans(api()).resolve_plan(lookup)).unwrap();

    let overridden = RateLimitLayer::new(api()).unwrap();
    overridden
        .set_override(
            "api",
            Key::string("someone-else"),
            Override::Exempt,
            "bench",
        )
        .unwrap();

    let shadow = RateLimitLayer::builder()
        .limit(api())
        .limit(
            Limit::new("global-shadow", quota())
                .key(GlobalKey)
                .mode(Mode::shadow()),
        )
        .build()
        .unwrap();

    let kept =
        RateLimitLayer::new(api().charge(Charge::refund_when(|s| s.is_server_error()))).unwrap();
    let refunded =
        RateLimitLayer::new(api().charge(Charge::only_when(|s| s == StatusCode::UNAUTHORIZED)))
            .unwrap();

    vec![
        ("plain", service(plain, StatusCode::OK)),
        ("plans_closure", service(plans_closure, StatusCode::OK)),
        ("plans_map", service(plans_map, StatusCode::OK)),
        ("plans_cached_lookup", service(plans_cached, StatusCode::OK)),
        ("override_table", service(overridden, StatusCode::OK)),
        ("shadow_limit", service(shadow, StatusCode::OK)),
        ("by_outcome_kept", service(kept, StatusCode::OK)),
        ("by_outcome_refunded", service(refunded, StatusCode::OK)),
    ]
}

fn request(i: u64) -> Request<()> {
    Request::get("/api/items")
        .header("x-api-key", key_name(splitmix64(i) % KEYS))
        .body(())
        .unwrap()
}

/// Calls `svc` once per request in `reqs`, driving every future with one no-op waker (all
/// variants answer without waiting).
fn drive(svc: &mut Svc, cx: &mut Context<'_>, reqs: Vec<Request<()>>) {
    for req in reqs {
        match pin!(svc.ready()).poll(cx) {
            Poll::Ready(Ok(_)) => {}
            _ => panic!("service not ready"),
        }
        let res = match pin!(svc.call(req)).poll(cx) {
            Poll::Ready(Ok(res)) => res,
            _ => panic!("response future pending"),
        };
        debug_assert_eq!(res.status(), StatusCode::OK);
        drop(res);
    }
}

/// Rounds of [`PER_ROUND`] requests per variant, variants alternating within each round.
const ROUNDS: usize = 9;
const PER_ROUND: u64 = 20_000;

fn measure(svc: &mut Svc, n: &mut u64, cx: &mut Context<'_>) -> f64 {
    let reqs: Vec<Request<()>> = (0..PER_ROUND)
        .map(|_| {
            *n += 1;
            request(*n)
        })
        .collect();
    let start = std::time::Instant::now();
    drive(svc, cx, reqs);
    start.elapsed().as_nanos() as f64 / PER_ROUND as f64
}

fn warm(svc: &Svc, name: &str) {
    // Every key (and the plan cache) first.
    for i in 0..KEYS * 4 {
        let res = block_on(svc.clone().oneshot(request(i))).unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{name}");
    }
}

fn main() {
    let waker = Waker::from(Arc::new(NoopWake));
    let mut cx = Context::from_waker(&waker);
    let mut variants = variants();
    let mut times: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut n = 0u64;
    for (name, svc) in &variants {
        warm(svc, name);
    }
    for _ in 0..ROUNDS {
        for (name, svc) in variants.iter_mut() {
            let ns = measure(svc, &mut n, &mut cx);
            times.entry(name).or_default().push(ns);
        }
    }
    // Last: a Prometheus recorder installed (a global recorder cannot be removed again), so
    // every variant above records into the facade's default no-op recorder, as an app without
    // one; this one alternates with `plain` again.
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("install the Prometheus recorder");
    let mut with_prometheus = service(RateLimitLayer::new(api()).unwrap(), StatusCode::OK);
    warm(&with_prometheus, "plain_prometheus_installed");
    for _ in 0..ROUNDS {
        let ns = measure(&mut with_prometheus, &mut n, &mut cx);
        times
            .entry("plain_prometheus_installed")
            .or_default()
            .push(ns);
    }
    assert!(prometheus.render().contains("tollgate_decisions_total"));
    let median = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let plain = median(&times["plain"]);
    println!(
        "\nns per allowed request through the layer (median of {ROUNDS} alternating rounds of {PER_ROUND}), 1,000 keys in random order:"
    );
    println!("{:<28} {:>8} {:>10}", "variant", "ns", "vs plain");
    for (name, v) in &times {
        let m = median(v);
        println!("{name:<28} {m:>8.0} {:>+9.0}", m - plain);
    }
}
