//! What plans, overrides, shadow limits, charge-by-outcome and metrics add to a request, next
//! to the plain layer, side by side in one run.
//!
//! Run with `cargo bench --bench policies`. Every variant is the same `RateLimitLayer` (memory
//! store, default `SystemClock`, token bucket, X-RateLimit headers) around a `service_fn`
//! answering `200`, keyed by an `x-api-key` header drawn from 1,000 keys in a pseudo-random
//! order (splitmix64 of a counter). Requests are built outside the timing (criterion's
//! `iter_batched`), everything else (the layer, the store, the headers, dropping the response)
//! is timed. The quota never refuses (a burst of 10^9), so every request takes the allowed path.
//! At the end it prints ns per request and the difference to `plain`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use criterion::{BatchSize, Criterion};
use http::{Request, Response, StatusCode};
use tollgate::key::{GlobalKey, HeaderKey, Key, KeyValue};
use tollgate::plan::{CachedLookup, Charge, Mode, Override, Plan, PlanMap, Resolution};
use tollgate::{Limit, PolicyName, Quota, RateLimitLayer, RequestView};
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
    Quota::per_minute(1).burst(1_000_000_000)
}

fn api() -> Limit {
    Limit::new("api", quota()).key(HeaderKey::new("x-api-key").unwrap())
}

fn with_plans(limit: Limit) -> Limit {
    limit
        .plan(Plan::new("free", Quota::per_minute(1).burst(1_000_000_000)))
        .plan(Plan::new("pro", Quota::per_minute(2).burst(1_000_000_000)))
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
    Response<tollgate::layer::ResponseBody<String>>,
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
            KeyValue::Bytes(b) if b.starts_with(b"free-") => {
                Resolution::Plan(PolicyName::new("free"))
            }
            _ => Resolution::Plan(PolicyName::new("pro")),
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

fn run(
    c: &mut Criterion,
    name: &'static str,
    svc: &Svc,
    results: &RefCell<BTreeMap<&'static str, f64>>,
) {
    let mut group = c.benchmark_group("policies");
    let mut n = 0u64;
    // Warm every key (and the plan cache) first.
    for i in 0..KEYS * 4 {
        let res = block_on(svc.clone().oneshot(request(i))).unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{name}");
    }
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let reqs: Vec<Request<()>> = (0..iters)
                .map(|_| {
                    n += 1;
                    request(n)
                })
                .collect();
            let mut svc = svc.clone();
            let start = std::time::Instant::now();
            for req in reqs {
                let res = block_on(async {
                    svc.ready().await.unwrap();
                    svc.call(req).await.unwrap()
                });
                debug_assert_eq!(res.status(), StatusCode::OK);
                drop(res);
            }
            let took = start.elapsed();
            let ns = took.as_nanos() as f64 / iters.max(1) as f64;
            results
                .borrow_mut()
                .entry(name)
                .and_modify(|v| *v = v.min(ns))
                .or_insert(ns);
            took
        })
    });
    let _ = BatchSize::SmallInput;
    group.finish();
}

fn main() {
    let mut c = Criterion::default()
        .without_plots()
        .sample_size(30)
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let results = RefCell::new(BTreeMap::new());
    let variants = variants();
    for (name, svc) in &variants {
        run(&mut c, name, svc, &results);
    }
    // Last: a Prometheus recorder installed (the global recorder cannot be removed again).
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("install the Prometheus recorder");
    let plain_metrics = service(RateLimitLayer::new(api()).unwrap(), StatusCode::OK);
    run(&mut c, "plain_with_prometheus", &plain_metrics, &results);
    assert!(prometheus.render().contains("tollgate_decisions_total"));
    c.final_summary();
    if std::env::args().any(|arg| arg == "--bench") {
        let results = results.borrow();
        let plain = results.get("plain").copied().unwrap_or(f64::NAN);
        println!("\nns per allowed request (fastest sample), 1,000 keys in random order:");
        println!("{:<24} {:>8} {:>10}", "variant", "ns", "vs plain");
        for (name, ns) in results.iter() {
            println!("{name:<24} {ns:>8.0} {:>+9.0}", ns - plain);
        }
    }
}
