//! Shaping: a request that does not fit waits for its turn, first come first served per key,
//! up to `max_wait` and the queue bounds; a waiting request that is dropped gives its place
//! back. Time is tokio's paused clock, which the store reads too (`TokioClock`).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tollgate::clock::TokioClock;
use tollgate::key::{GlobalKey, HeaderKey};
use tollgate::plan::{Plan, PlanFromHeader};
use tollgate::rate_limit::Mode;
use tollgate::rate_limit::{Shape, ShapedDelay};
use tollgate::store::{memory::MemoryBackend, memory::MemoryStore};
use tollgate::{AlgorithmKind, Limit, Quota, RateLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

/// What the handler saw: the request's id, its `ShapedDelay` and when (since the start).
type Seen = Arc<Mutex<Vec<(String, Option<Duration>, Duration)>>>;

type Layer = RateLimitLayer<MemoryStore<TokioClock>>;
type Body = tollgate::rate_limit::ResponseBody<Full<Bytes>>;

fn layer(limit: Limit, max_waiting: usize) -> Layer {
    RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(TokioClock::new()))
        .limit(limit)
        .max_waiting(max_waiting)
        .build()
        .unwrap()
}

fn service(
    layer: Layer,
    seen: Seen,
) -> impl Service<
    Request<()>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    let start = Instant::now();
    ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(move |req: Request<()>| {
            let seen = Arc::clone(&seen);
            async move {
                let id = req.headers()["x-id"].to_str().unwrap().to_owned();
                let delay = req.extensions().get::<ShapedDelay>().map(ShapedDelay::get);
                seen.lock().unwrap().push((id, delay, start.elapsed()));
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
            }
        }))
}

fn req(id: &str) -> Request<()> {
    Request::get("/")
        .header("x-id", id)
        .header("x-key", &id[..1])
        .body(())
        .unwrap()
}

fn smooth() -> Limit {
    // One every 100 ms, no burst beyond one.
    Limit::new("smooth", Quota::per_second(10).burst(1))
        .algorithm(AlgorithmKind::Gcra)
        .key(GlobalKey)
}

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn waiting_requests_go_in_arrival_order_at_the_rate() {
    let seen = Seen::default();
    let mut svc = service(
        layer(smooth().shape(Duration::from_secs(1)), 100),
        seen.clone(),
    );
    // The store decides in `call`: the order of the calls is the order of arrival.
    let mut calls = Vec::new();
    for id in ["a1", "a2", "a3", "a4", "a5"] {
        let f = svc.ready().await.unwrap().call(req(id));
        calls.push(tokio::spawn(f));
    }
    let mut delays = Vec::new();
    for call in calls {
        let res = call.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.headers()["x-ratelimit-limit"],
            "1",
            "the limit's own burst"
        );
        assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
        delays.push(res.extensions().get::<ShapedDelay>().map(|d| d.get()));
    }
    let ms = |n: u32| Some(n * MS);
    assert_eq!(delays, [None, ms(100), ms(200), ms(300), ms(400)]);
    let seen = seen.lock().unwrap().clone();
    let order: Vec<&str> = seen.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(order, ["a1", "a2", "a3", "a4", "a5"]);
    // The handler ran after its wait, and saw it.
    for (i, (_, delay, at)) in seen.iter().enumerate() {
        assert_eq!(*at, i as u32 * 100 * MS);
        assert_eq!(*delay, (i > 0).then(|| i as u32 * 100 * MS));
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiting_request_gives_its_place_back() {
    let seen = Seen::default();
    let mut svc = service(
        layer(smooth().shape(Duration::from_secs(1)), 100),
        seen.clone(),
    );
    let mut call = |id: &str| {
        let f = svc.call(req(id));
        tokio::spawn(f)
    };
    let first = call("a1");
    let second = call("a2"); // waits 100 ms
    let third = call("a3"); // waits 200 ms
    let fourth = call("a4"); // waits 300 ms
    third.abort(); // its client goes away while it waits
    let _ = third.await;
    // The next request takes the place a3 freed (200 ms): not 400 ms (behind a place nobody
    // holds), nor 300 ms (a4's turn: two at once where the rate allows one).
    let fifth = call("a5");
    let mut delays = Vec::new();
    for c in [first, second, fourth, fifth] {
        let res = c.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        delays.push(
            res.extensions()
                .get::<ShapedDelay>()
                .map(|d| d.get().as_millis()),
        );
    }
    assert_eq!(delays, [None, Some(100), Some(300), Some(200)]);
    let order: Vec<String> = seen.lock().unwrap().iter().map(|s| s.0.clone()).collect();
    assert_eq!(
        order,
        ["a1", "a2", "a5", "a4"],
        "a3 never reached the handler; a5 went at its time"
    );
}

#[tokio::test(start_paused = true)]
async fn beyond_max_wait_a_request_is_refused_as_usual() {
    let svc = service(
        layer(smooth().shape(Duration::from_millis(500)), 100),
        Seen::default(),
    );
    let mut calls = Vec::new();
    for i in 0..6 {
        calls.push(tokio::spawn(svc.clone().oneshot(req(&format!("a{i}")))));
        tokio::task::yield_now().await;
    }
    // Five wait (100..=500 ms); the seventh would wait 600 ms.
    let refused = svc.clone().oneshot(req("a7")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["x-ratelimit-limit"], "1");
    assert_eq!(refused.headers()["retry-after"], "1"); // 100 ms until a place frees, rounded up
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["policy"], "smooth");
    assert_eq!(json["limit"], 1);
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn the_per_key_queue_bound_counts_per_key() {
    let limit = Limit::new("per-key", Quota::per_second(10).burst(1))
        .algorithm(AlgorithmKind::TokenBucket)
        .key(HeaderKey::new("x-key").unwrap())
        .shape(Shape::new(Duration::from_secs(10)).max_queued(2));
    let svc = service(layer(limit, 100), Seen::default());
    let mut ok = Vec::new();
    for id in ["a1", "a2", "a3"] {
        ok.push(tokio::spawn(svc.clone().oneshot(req(id))));
        tokio::task::yield_now().await;
    }
    // Key a: one through, two waiting: full.
    let refused = svc.clone().oneshot(req("a4")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // Key b has its own queue.
    let b = svc.clone().oneshot(req("b1")).await.unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    assert!(b.extensions().get::<ShapedDelay>().is_none());
    for c in ok {
        assert_eq!(c.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn the_layer_bound_on_waiting_requests_refuses_and_gives_the_place_back() {
    let limit = Limit::new("per-key", Quota::per_second(10).burst(1))
        .algorithm(AlgorithmKind::LeakyBucket)
        .key(HeaderKey::new("x-key").unwrap())
        .shape(Duration::from_secs(1));
    let svc = service(layer(limit, 2), Seen::default());
    // Two keys each with one request through and one waiting: the layer's two places.
    let mut waiting = Vec::new();
    for key in ["a", "b"] {
        assert_eq!(
            svc.clone()
                .oneshot(req(&format!("{key}1")))
                .await
                .unwrap()
                .status(),
            StatusCode::OK
        );
        waiting.push(tokio::spawn(svc.clone().oneshot(req(&format!("{key}2")))));
        tokio::task::yield_now().await;
    }
    assert_eq!(
        svc.clone().oneshot(req("c1")).await.unwrap().status(),
        StatusCode::OK
    );
    // c2 would wait, but no place is free: refused, and its reservation is given back.
    let refused = svc.clone().oneshot(req("c2")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // A place frees when a waiting request gets its turn.
    let a2 = waiting.remove(0).await.unwrap().unwrap();
    assert_eq!(a2.status(), StatusCode::OK);
    // 100 ms have passed: c's turn is now, as if c2 had never reserved (else: 100 ms more).
    let c3 = svc.clone().oneshot(req("c3")).await.unwrap();
    assert_eq!(c3.status(), StatusCode::OK);
    assert!(c3.extensions().get::<ShapedDelay>().is_none());
    for w in waiting {
        assert_eq!(w.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_that_fits_does_not_wait_or_carry_a_delay() {
    let limit = Limit::new("bursty", Quota::per_second(10).burst(3))
        .algorithm(AlgorithmKind::Gcra)
        .key(GlobalKey)
        .shape(Duration::from_secs(1));
    let svc = service(layer(limit, 100), Seen::default());
    for remaining in ["2", "1", "0"] {
        let res = svc.clone().oneshot(req("a")).await.unwrap();
        assert_eq!(res.headers()["x-ratelimit-limit"], "3");
        assert_eq!(res.headers()["x-ratelimit-remaining"], remaining);
        assert!(res.extensions().get::<ShapedDelay>().is_none());
    }
    let start = Instant::now();
    let res = svc.clone().oneshot(req("a")).await.unwrap();
    assert_eq!(start.elapsed(), 100 * MS);
    assert_eq!(
        res.extensions().get::<ShapedDelay>().unwrap().get(),
        100 * MS
    );
}

#[test]
fn what_cannot_shape_fails_at_build_time() {
    let err = |limit: Limit| {
        RateLimitLayer::new(limit.key(GlobalKey))
            .unwrap_err()
            .field()
    };
    let one_s = Duration::from_secs(1);
    for kind in [
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::SlidingLog,
    ] {
        let limit = Limit::new("w", Quota::per_second(10))
            .algorithm(kind)
            .shape(one_s);
        assert_eq!(err(limit), "limit.shape", "{kind}");
    }
    // Shorter than one interval (6 s at 10/min).
    assert_eq!(
        err(Limit::new("slow", Quota::per_minute(10)).shape(one_s)),
        "limit.shape.max_wait"
    );
    let shadow = Limit::new("s", Quota::per_second(10))
        .mode(Mode::Shadow { headers: false })
        .shape(one_s);
    assert_eq!(err(shadow), "limit.shape");
    let plans = Limit::new("p", Quota::per_second(10))
        .plan(Plan::new("pro", Quota::per_second(100)))
        .resolve_plan(PlanFromHeader::new("x-plan").unwrap())
        .shape(one_s);
    assert_eq!(err(plans), "limit.shape");
    let no_room = RateLimitLayer::builder()
        .limit(smooth().shape(one_s))
        .max_waiting(0)
        .build()
        .unwrap_err();
    assert_eq!(no_room.field(), "max_waiting");
    let message = RateLimitLayer::new(
        Limit::new("w", Quota::per_second(10))
            .algorithm(AlgorithmKind::FixedWindow)
            .key(GlobalKey)
            .shape(one_s),
    )
    .unwrap_err()
    .to_string();
    assert!(
        message.contains("use gcra, token_bucket or leaky_bucket"),
        "{message}"
    );
}

/// Through a real hyper server and a real client: the requests that do not fit wait for
/// their turn instead of being refused. Real time here, so only what cannot depend on
/// scheduling is asserted.
#[tokio::test]
async fn shaped_requests_wait_instead_of_failing_over_http() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;

    // One every 250 ms.
    let limit = Limit::new("smooth", Quota::per_second(4).burst(1))
        .algorithm(AlgorithmKind::Gcra)
        .key(GlobalKey)
        .shape(Duration::from_secs(2));
    let layer = RateLimitLayer::new(limit).unwrap();
    let seen = Seen::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handler_seen = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = handler_seen.clone();
            let svc = ServiceBuilder::new()
                .layer(layer.clone())
                .service(tower::service_fn(
                    move |req: Request<hyper::body::Incoming>| {
                        let seen = Arc::clone(&seen);
                        async move {
                            let delay = req.extensions().get::<ShapedDelay>().map(ShapedDelay::get);
                            seen.lock()
                                .unwrap()
                                .push((String::new(), delay, Duration::ZERO));
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
                        }
                    },
                ));
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc))
                    .await;
            });
        }
    });
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{addr}/");
    let calls: Vec<_> = (0..3)
        .map(|_| tokio::spawn(http.get(&url).send()))
        .collect();
    for c in calls {
        let res = c.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-ratelimit-limit"], "1");
    }
    let delays: Vec<Option<Duration>> = seen.lock().unwrap().iter().map(|s| s.1).collect();
    // At most 500 ms of waiting for three requests at 4/s, and two of them waited (the three
    // arrive within far less than 250 ms).
    let waited: Vec<Duration> = delays.iter().flatten().copied().collect();
    assert_eq!(waited.len(), 2, "{delays:?}");
    assert!(waited.iter().all(|d| *d <= 500 * MS), "{delays:?}");
}

#[tokio::test(start_paused = true)]
async fn a_request_that_costs_nothing_never_waits() {
    let limit = smooth()
        .cost(|req: &tollgate::RequestView<'_>| u64::from(req.method() != http::Method::HEAD))
        .shape(Duration::from_secs(1));
    let svc = service(layer(limit, 100), Seen::default());
    assert_eq!(
        svc.clone().oneshot(req("a1")).await.unwrap().status(),
        StatusCode::OK
    );
    let _waiting = tokio::spawn(svc.clone().oneshot(req("a2")));
    tokio::task::yield_now().await;
    let head = Request::head("/")
        .header("x-id", "h")
        .header("x-key", "h")
        .body(())
        .unwrap();
    let start = Instant::now();
    let res = svc.clone().oneshot(head).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(res.extensions().get::<ShapedDelay>().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_after_waiting_a_while_still_gives_its_place_back() {
    let seen = Seen::default();
    let mut svc = service(
        layer(smooth().shape(Duration::from_secs(1)), 100),
        seen.clone(),
    );
    let mut call = |id: &str| {
        let f = svc.call(req(id));
        tokio::spawn(f)
    };
    let first = call("a1");
    let second = call("a2"); // waits 100 ms
    let third = call("a3"); // waits 200 ms
    let fourth = call("a4"); // waits 300 ms
                             // Its client gives up 150 ms into its 200 ms wait: its place (200 ms) is still ahead.
    tokio::time::sleep(150 * MS).await;
    third.abort();
    let _ = third.await;
    // As when dropped at once: the next request is not pushed behind the lost place
    // (slot 400 ms, a wait of 250 ms) but takes the place it freed (200 ms, a wait of 50 ms).
    let mut call = |id: &str| {
        let f = svc.call(req(id));
        tokio::spawn(f)
    };
    let fifth = call("a5");
    let mut delays = Vec::new();
    for c in [first, second, fourth, fifth] {
        let res = c.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        delays.push(
            res.extensions()
                .get::<ShapedDelay>()
                .map(|d| d.get().as_millis()),
        );
    }
    assert_eq!(delays, [None, Some(100), Some(300), Some(50)]);
}

#[tokio::test(start_paused = true)]
async fn a_request_refused_by_the_layer_bound_is_not_charged_to_the_other_limits() {
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(TokioClock::new()))
        .limit(smooth().shape(Duration::from_secs(1)))
        .limit(
            Limit::new("hourly", Quota::per_hour(3))
                .algorithm(AlgorithmKind::Gcra)
                .key(GlobalKey),
        )
        .max_waiting(1)
        .build()
        .unwrap();
    let svc = service(layer, Seen::default());
    assert_eq!(
        svc.clone().oneshot(req("a1")).await.unwrap().status(),
        StatusCode::OK
    );
    let waiting = tokio::spawn(svc.clone().oneshot(req("a2"))); // the one place
    tokio::task::yield_now().await;
    // a3 would wait, but no place is free: refused, so it must not spend the hourly quota.
    let refused = svc.clone().oneshot(req("a3")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(waiting.await.unwrap().unwrap().status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Two of the three served so far: the third fits.
    let third = svc.clone().oneshot(req("a4")).await.unwrap();
    assert_eq!(third.status(), StatusCode::OK, "{:?}", third.headers());
}
