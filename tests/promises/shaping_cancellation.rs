//! Shaping: a waiting request that is dropped gives back exactly its own place in its key's
//! schedule, and the rate bound holds over any window whatever is cancelled.
//!
//! Tokio's paused clock, read by the memory store too (`TokioClock`): every wait is exact.
//! For each shaping algorithm (GCRA, token bucket, leaky bucket):
//!
//! - 1,000 waiters dropped in arrival order: the next request waits one interval (its place
//!   right after the request that went through), not behind places nobody holds;
//! - waiters dropped (in arrival order, or every other one), then 150 new arrivals: over every
//!   window between two admissions, at most `burst + rate × span` reached the service.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate::clock::TokioClock;
use tollgate::key::GlobalKey;
use tollgate::store::{memory::MemoryBackend, Store};
use tollgate::{AlgorithmKind, Limit, Quota, RateLimitLayer};
use tower::{Service, ServiceBuilder};

use crate::harness::redis_server::RedisServer;
use crate::harness::stores;

const ALGORITHMS: [AlgorithmKind; 3] = [
    AlgorithmKind::Gcra,
    AlgorithmKind::TokenBucket,
    AlgorithmKind::LeakyBucket,
];

/// When each request reached the service, since the test's start.
type Seen = Arc<Mutex<Vec<Duration>>>;

type Body = tollgate::rate_limit::ResponseBody<String>;

/// A rate-limited service, as `serve` returns it: cloned, and its calls spawned.
pub(crate) trait Served:
    Service<Request<()>, Response = Response<Body>, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S> Served for S where
    S: Service<Request<()>, Response = Response<Body>, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + 'static
{
}

/// `layer` over a service that calls `reached` with each request, then answers 200 (empty).
pub(crate) fn serve<St: Store>(
    layer: RateLimitLayer<St>,
    reached: impl Fn(&Request<()>) + Clone + Send + 'static,
) -> impl Served {
    ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(move |req: Request<()>| {
            let reached = reached.clone();
            async move {
                reached(&req);
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        }))
}

fn service(
    algorithm: AlgorithmKind,
    per_second: u64,
    max_wait: Duration,
    seen: Seen,
) -> impl Served {
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(TokioClock::new()))
        .limit(
            Limit::new("smooth", Quota::per_second(per_second).burst(1))
                .algorithm(algorithm)
                .key(GlobalKey)
                .shape(max_wait),
        )
        .max_waiting(100_000)
        .build()
        .unwrap();
    let start = Instant::now();
    serve(layer, move |_| seen.lock().unwrap().push(start.elapsed()))
}

/// Calls the service now (the reservation is made in `call`) and lets the response future run.
fn spawn_call<S>(svc: &mut S) -> JoinHandle<Result<Response<Body>, Infallible>>
where
    S: Service<Request<()>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    tokio::spawn(svc.call(Request::new(())))
}

/// Drops a waiting request (its client went away).
async fn cancel(call: JoinHandle<Result<Response<Body>, Infallible>>) {
    call.abort();
    let _ = call.await;
}

/// How long a new request waits; it and `first` are both served.
async fn next_wait(
    svc: &mut impl Served,
    first: JoinHandle<Result<Response<Body>, Infallible>>,
) -> Duration {
    let start = Instant::now();
    let next = spawn_call(svc).await.unwrap().unwrap();
    let waited = start.elapsed();
    assert_eq!(next.status(), StatusCode::OK);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    waited
}

/// The most admissions in excess of `burst + rate × span` over any window between two
/// admissions (0 when the bound holds everywhere).
fn worst_excess(times: &mut [Duration], burst: u64, per_second: u64) -> (i64, usize, u64) {
    times.sort();
    let mut worst = (i64::MIN, 0, 0);
    for i in 0..times.len() {
        for j in i..times.len() {
            let span = times[j] - times[i];
            let allowed = burst + (span.as_micros() as u64 * per_second / 1_000_000);
            let count = (j - i + 1) as u64;
            let excess = count as i64 - allowed as i64;
            if excess > worst.0 {
                worst = (excess, count as usize, allowed);
            }
        }
    }
    worst
}

#[tokio::test(start_paused = true)]
async fn waiters_dropped_in_arrival_order_leave_no_phantom_places() {
    // 100 per second, burst 1: one request through, 1,000 waiting (10 ms apart, the last 10 s
    // away), all dropped in arrival order. The next request's place is 10 ms away.
    let mut failures = Vec::new();
    for algorithm in ALGORITHMS {
        let seen = Seen::default();
        let mut svc = service(algorithm, 100, Duration::from_secs(20), seen.clone());
        let first = spawn_call(&mut svc);
        let waiting: Vec<_> = (0..1_000).map(|_| spawn_call(&mut svc)).collect();
        for call in waiting {
            cancel(call).await;
        }
        let waited = next_wait(&mut svc, first).await;
        println!("{algorithm}: 1,000 waiters dropped in arrival order; the next request waited {waited:?} (one interval: 10ms)");
        if waited > Duration::from_millis(10) {
            failures.push(format!("{algorithm}: waited {waited:?}"));
        }
        assert_eq!(
            seen.lock().unwrap().len(),
            2,
            "{algorithm}: only two reached the service"
        );
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Which waiters are dropped: a name, and whether the waiter at this position is.
type Pattern = (&'static str, fn(usize) -> bool);

#[tokio::test(start_paused = true)]
async fn the_rate_bound_holds_whatever_is_cancelled() {
    // 10 per second, burst 1: one request through and 200 waiting (100 ms apart); some are
    // dropped; then 150 new arrivals. Over every window, at most 1 + 10/s × span reach the
    // service.
    let patterns: [Pattern; 2] = [
        ("the first 100 in arrival order", |i| i < 100),
        ("every other one", |i| i % 2 == 0),
    ];
    let mut failures = Vec::new();
    for algorithm in ALGORITHMS {
        for (pattern, dropped) in patterns {
            let seen = Seen::default();
            let mut svc = service(algorithm, 10, Duration::from_secs(60), seen.clone());
            let mut kept = vec![spawn_call(&mut svc)];
            let waiting: Vec<_> = (0..200).map(|_| spawn_call(&mut svc)).collect();
            for (i, call) in waiting.into_iter().enumerate() {
                if dropped(i) {
                    cancel(call).await;
                } else {
                    kept.push(call);
                }
            }
            let dropped_count = 201 - kept.len();
            for _ in 0..150 {
                kept.push(spawn_call(&mut svc));
            }
            let mut refused = 0;
            for call in kept {
                if call.await.unwrap().unwrap().status() != StatusCode::OK {
                    refused += 1;
                }
            }
            let mut times = seen.lock().unwrap().clone();
            let admitted = times.len();
            let span = times.iter().max().copied().unwrap_or_default();
            let (excess, count, allowed) = worst_excess(&mut times, 1, 10);
            println!(
                "{algorithm}, {dropped_count} dropped ({pattern}), then 150 new: {admitted} admitted over {span:?} ({refused} refused); worst window: {count} admitted where 1 + rate x span allows {allowed} (excess {excess})"
            );
            if excess > 0 {
                failures.push(format!(
                    "{algorithm} ({pattern}): {count} admitted where {allowed} are allowed"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// The same on Redis, for one instance: 200 waiters (one a second, frozen store clock) dropped
/// in arrival order; the next request's place is one interval away.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_waiters_dropped_in_arrival_order_leave_no_phantom_places() {
    use tollgate::clock::ManualClock;
    use tollgate::rate_limit::{RateLimit, ShapedDelay};
    use tollgate::store::redis::RedisBackend;
    use tollgate::store::FailurePolicy;
    use tower::ServiceExt;

    let server = RedisServer::start();
    let clock = ManualClock::new();
    let mut failures = Vec::new();
    for algorithm in ALGORITHMS {
        let layer = RateLimitLayer::builder()
            .backend(
                RedisBackend::new(server.url())
                    .prefix(stores::prefix(&format!("shape-drop-{algorithm}")))
                    // Generous: this test is about places, not a loaded machine's latency.
                    .timeout(Duration::from_millis(500))
                    .clock(clock.clone()),
            )
            .limit(
                Limit::new("smooth", Quota::per_second(1).burst(1))
                    .algorithm(algorithm)
                    .key(GlobalKey)
                    .on_store_error(FailurePolicy::Closed {
                        retry_after: Duration::from_secs(1),
                    })
                    .shape(Duration::from_secs(2_000)),
            )
            .build()
            .unwrap();
        let mut svc = RateLimit::new(
            tower::service_fn(|_req: Request<()>| async {
                Ok::<_, Infallible>(Response::new(String::new()))
            }),
            &layer,
        );
        let first = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(first.extensions().get::<ShapedDelay>(), None);
        // Each waiter reserves its place (one Redis call) and starts waiting, in order.
        let mut waiting = Vec::new();
        for i in 0..200 {
            svc.ready().await.unwrap();
            let mut call = Box::pin(svc.call(Request::new(())));
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !format!("{call:?}").contains("shaping") {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{algorithm}: never waited"
                );
                if let Ok(res) = tokio::time::timeout(Duration::from_micros(200), &mut call).await {
                    let res = res.unwrap();
                    panic!(
                        "{algorithm}: waiter {i} was answered at once: {} {:?}",
                        res.status(),
                        res.headers()
                    );
                }
            }
            waiting.push(call);
        }
        for call in waiting {
            drop(call);
        }
        // The refunds reach Redis in the background: the next request sees them within 1 s.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let next = tokio::time::timeout(
            Duration::from_secs(5),
            svc.clone().oneshot(Request::new(())),
        )
        .await;
        let waited = next.as_ref().ok().map(|res| {
            res.as_ref()
                .unwrap()
                .extensions()
                .get::<ShapedDelay>()
                .map(ShapedDelay::get)
        });
        let shown = match waited {
            None => "still waiting after 5s".to_owned(),
            Some(None) => "no wait".to_owned(),
            Some(Some(d)) => format!("{d:?}"),
        };
        println!("{algorithm} on Redis: 200 waiters dropped in arrival order; the next request waited {shown} (one interval: 1s)");
        if waited != Some(Some(Duration::from_secs(1))) {
            failures.push(format!("{algorithm}: {shown}"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// When each request reached the service, and its cost.
type SeenCost = Arc<Mutex<Vec<(Duration, u64)>>>;

/// 10 per second, burst 2, POST costing 2 and GET 1 (or every request 1).
fn costed_service(algorithm: AlgorithmKind, costed: bool, seen: SeenCost) -> impl Served {
    let cost = move |req: &tollgate::RequestView<'_>| -> u64 {
        if costed && req.method() == http::Method::POST {
            2
        } else {
            1
        }
    };
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(TokioClock::new()))
        .limit(
            Limit::new("costed", Quota::per_second(10).burst(2))
                .algorithm(algorithm)
                .key(GlobalKey)
                .cost(cost)
                .shape(Duration::from_secs(60)),
        )
        .max_waiting(100_000)
        .build()
        .unwrap();
    let start = Instant::now();
    serve(layer, move |req| {
        let cost = if costed && req.method() == http::Method::POST {
            2
        } else {
            1
        };
        seen.lock().unwrap().push((start.elapsed(), cost));
    })
}

/// 60 waiting, POST and GET in turn; the POSTs are dropped, then 60 new GETs; every request
/// kept is awaited.
async fn drop_posts_among_gets(svc: &mut impl Served) {
    let mut kept = Vec::new();
    let mut posts = Vec::new();
    for i in 0..60 {
        let method = if i % 2 == 0 {
            http::Method::POST
        } else {
            http::Method::GET
        };
        let call = tokio::spawn(svc.call(Request::builder().method(method).body(()).unwrap()));
        if i % 2 == 0 {
            posts.push(call);
        } else {
            kept.push(call);
        }
    }
    for call in posts {
        cancel(call).await;
    }
    for _ in 0..60 {
        kept.push(spawn_call(svc));
    }
    for call in kept {
        let _ = call.await.unwrap().unwrap();
    }
}

/// The most units in excess of `burst + rate × span` over any window between two admissions.
fn worst_unit_excess(seen: &mut [(Duration, u64)], burst: u64, per_second: u64) -> i64 {
    seen.sort();
    let mut worst = i64::MIN;
    for i in 0..seen.len() {
        let mut units = 0;
        for j in i..seen.len() {
            units += seen[j].1;
            let span = seen[j].0 - seen[i].0;
            let allowed = burst + (span.as_micros() as u64 * per_second / 1_000_000);
            worst = worst.max(units as i64 - allowed as i64);
        }
    }
    worst
}

#[tokio::test(start_paused = true)]
async fn per_request_costs_never_share_a_turn() {
    // 10 per second, burst 2, POST = 2 units and GET = 1: 60 waiting, POST and GET in turn;
    // the POSTs are dropped, then 60 new GETs. Over every window, at most 2 + 10/s × span
    // units reach the service (the same run with every request costing 1 as the control).
    let mut failures = Vec::new();
    for algorithm in [AlgorithmKind::Gcra, AlgorithmKind::TokenBucket] {
        for costed in [false, true] {
            let seen = SeenCost::default();
            let mut svc = costed_service(algorithm, costed, seen.clone());
            drop_posts_among_gets(&mut svc).await;
            let mut seen = seen.lock().unwrap().clone();
            let units: u64 = seen.iter().map(|s| s.1).sum();
            let excess = worst_unit_excess(&mut seen, 2, 10);
            let what = if costed {
                "POST=2, GET=1"
            } else {
                "all cost 1"
            };
            println!("{algorithm}, {what}: {units} units admitted; worst window: {excess} units over 2 + rate x span");
            if excess > 0 {
                failures.push(format!("{algorithm} ({what}): {excess} units over"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[tokio::test(start_paused = true)]
async fn a_free_place_already_due_goes_back_to_the_store() {
    // 10 per second, burst 1 (100 ms apart): one through, A at 100 ms and B at 200 ms waiting;
    // A is dropped. At 150 ms (A's free place due, B still waiting) C arrives and is given
    // 300 ms; then B and C are dropped. Every place after A's is free: A's goes back too, less
    // what refilled since its turn, so the next request, at 150 ms, goes at once.
    let mut failures = Vec::new();
    for algorithm in ALGORITHMS {
        let seen = Seen::default();
        let mut svc = service(algorithm, 10, Duration::from_secs(10), seen.clone());
        let first = spawn_call(&mut svc);
        let a = spawn_call(&mut svc);
        let b = spawn_call(&mut svc);
        cancel(a).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        let c = spawn_call(&mut svc);
        tokio::task::yield_now().await;
        cancel(b).await;
        cancel(c).await;
        let waited = next_wait(&mut svc, first).await;
        println!("{algorithm}: a free place due 50 ms ago and every place after it dropped; the next request waited {waited:?} (right: 0)");
        if waited > Duration::ZERO {
            failures.push(format!("{algorithm}: waited {waited:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[tokio::test(start_paused = true)]
async fn requests_with_different_shaped_limits_never_share_a_turn() {
    // Two shaped limits on one key: "all" (10 per second, burst 1) for every request, and
    // "posts" (generous) for POSTs only. 60 waiting, POST and GET in turn; the POSTs are
    // dropped, then 60 new GETs. Over every window, at most 1 + 10/s × span reach the service.
    let mut failures = Vec::new();
    for algorithm in [AlgorithmKind::Gcra, AlgorithmKind::TokenBucket] {
        let seen = SeenCost::default();
        let layer = RateLimitLayer::builder()
            .backend(MemoryBackend::new().clock(TokioClock::new()))
            .limit(
                Limit::new("all", Quota::per_second(10).burst(1))
                    .algorithm(algorithm)
                    .key(GlobalKey)
                    .shape(Duration::from_secs(60)),
            )
            .limit(
                Limit::new("posts", Quota::per_second(1_000).burst(1_000))
                    .algorithm(algorithm)
                    .key(GlobalKey)
                    .when(|req: &tollgate::RequestView<'_>| req.method() == http::Method::POST)
                    .shape(Duration::from_secs(1)),
            )
            .max_waiting(100_000)
            .build()
            .unwrap();
        let start = Instant::now();
        let recorded = Arc::clone(&seen);
        let mut svc = serve(layer, move |_| {
            recorded.lock().unwrap().push((start.elapsed(), 1))
        });
        drop_posts_among_gets(&mut svc).await;
        let mut seen = seen.lock().unwrap().clone();
        let admitted = seen.len();
        let excess = worst_unit_excess(&mut seen, 1, 10);
        println!("{algorithm}, POSTs (shaped by two limits) dropped among GETs (one): {admitted} admitted; worst window: {excess} over 1 + rate x span");
        if excess > 0 {
            failures.push(format!("{algorithm}: {excess} over"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
