//! `tollgate::outbound` through real servers on 127.0.0.1 on both sides: the upstream is an
//! axum app (tollgate's own server layer, or a scripted handler), the client hyper-util's legacy
//! client wrapped in the outbound layer. Time is tokio's paused clock: the layer decides on a
//! `TokioClock` and sleeps on tokio's timer, the upstream stamps arrivals with
//! `tokio::time::Instant`, so every timing below is exact in virtual time (waits only ever
//! lengthen by the time the runtime spends on real I/O, which paused time does not count).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request as AxumRequest;
use axum::response::Response as AxumResponse;
use axum::Router;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tollgate::clock::TokioClock;
use tollgate::headers::ResetFormat;
use tollgate::key::GlobalKey;
use tollgate::outbound::{Backoff, NoReplay, OutboundInfo, OutboundLayer};
use tollgate::store::memory::MemoryBackend;
use tollgate::{AlgorithmKind, Limit, Quota, RateLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

type Http = Client<HttpConnector, Full<Bytes>>;

fn http() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

/// What an upstream saw: arrival time, method and status of each request.
#[derive(Default)]
struct Seen {
    arrivals: Mutex<Vec<(Instant, Method, StatusCode)>>,
    refused: AtomicU64,
}

impl Seen {
    fn times(&self) -> Vec<Instant> {
        let mut t: Vec<_> = self.arrivals.lock().unwrap().iter().map(|a| a.0).collect();
        t.sort();
        t
    }

    fn count(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

/// Records every answer of `app` in `seen` (outside any limiter it holds).
fn recorded(app: Router, seen: Arc<Seen>) -> Router {
    app.layer(axum::middleware::from_fn(
        move |req: AxumRequest, next: axum::middleware::Next| {
            let seen = seen.clone();
            async move {
                let at = Instant::now();
                let method = req.method().clone();
                let res = next.run(req).await;
                if res.status() == StatusCode::TOO_MANY_REQUESTS {
                    seen.refused.fetch_add(1, Ordering::SeqCst);
                }
                seen.arrivals
                    .lock()
                    .unwrap()
                    .push((at, method, res.status()));
                res
            }
        },
    ))
}

/// An upstream behind tollgate's server layer: a token bucket of 10 refilling 10 per second on
/// tokio's clock, with `X-RateLimit-*` (reset as `reset`) and, if `ietf`, the IETF fields.
async fn limited_upstream(ietf: bool, reset: ResetFormat) -> (SocketAddr, Arc<Seen>) {
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(TokioClock::new()))
        .limit(
            Limit::new("default", Quota::per_second(10))
                .algorithm(AlgorithmKind::TokenBucket)
                .key(GlobalKey),
        )
        .reset_format(reset)
        .ietf_headers(ietf)
        .build()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let app = Router::new().fallback(|| async { "ok" }).layer(layer);
    (serve(recorded(app, seen.clone())).await, seen)
}

/// An upstream answering request `n` (0-based) with `script(n)`.
async fn scripted(
    script: impl Fn(usize) -> AxumResponse + Clone + Send + Sync + 'static,
) -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let count = Arc::new(AtomicU64::new(0));
    let app = Router::new().fallback(move |_: AxumRequest| {
        let n = count.fetch_add(1, Ordering::SeqCst) as usize;
        let res = script(n);
        async move { Ok::<_, Infallible>(res) }
    });
    (serve(recorded(app, seen.clone())).await, seen)
}

fn status(code: u16, headers: &[(&str, &str)]) -> AxumResponse {
    let mut res = Response::builder().status(code);
    for (k, v) in headers {
        res = res.header(*k, *v);
    }
    res.body(Body::from("x")).unwrap()
}

fn get(addr: SocketAddr) -> Request<Full<Bytes>> {
    Request::get(format!("http://{addr}/"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

async fn send<S, B>(client: &mut S, req: Request<B>) -> Response<hyper::body::Incoming>
where
    S: Service<Request<B>, Response = Response<hyper::body::Incoming>>,
    S::Error: std::fmt::Debug,
{
    client.ready().await.unwrap().call(req).await.unwrap()
}

async fn drain(res: Response<hyper::body::Incoming>) -> (StatusCode, Option<OutboundInfo>) {
    let info = res.extensions().get::<OutboundInfo>().copied();
    let status = res.status();
    res.into_body().collect().await.unwrap();
    (status, info)
}

/// Concurrent calls through clones of `client`; the statuses in completion order.
async fn burst<S>(client: &S, addr: SocketAddr, n: usize) -> Vec<StatusCode>
where
    S: Service<Request<Full<Bytes>>, Response = Response<hyper::body::Incoming>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug + Send,
{
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let mut client = client.clone();
        set.spawn(async move { drain(send(&mut client, get(addr)).await).await.0 });
    }
    let mut out = Vec::new();
    while let Some(s) = set.join_next().await {
        out.push(s.unwrap());
    }
    out
}

fn gaps(times: &[Instant]) -> Vec<Duration> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn configured_quota_spaces_calls_and_the_upstream_never_refuses() {
    let (addr, seen) = limited_upstream(false, ResetFormat::DeltaSeconds).await;
    let layer = OutboundLayer::builder()
        .quota(Quota::per_second(10).burst(1))
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(layer).service(http());
    let started = Instant::now();
    let statuses = burst(&client, addr, 25).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    assert_eq!(seen.refused.load(Ordering::SeqCst), 0);
    let times = seen.times();
    assert_eq!(times.len(), 25);
    for gap in gaps(&times) {
        assert!(
            gap >= Duration::from_micros(99_900),
            "calls 100 ms apart, got {gap:?}"
        );
    }
    assert!(started.elapsed() >= Duration::from_millis(2_400));
}

#[tokio::test(start_paused = true)]
async fn a_configured_burst_goes_at_once_then_the_rate() {
    let (addr, seen) = scripted(|_| status(200, &[])).await;
    let layer = OutboundLayer::builder()
        .quota(Quota::per_second(10).burst(5))
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(layer).service(http());
    let started = Instant::now();
    burst(&client, addr, 8).await;
    let times = seen.times();
    // Five within the first instant, then one per 100 ms.
    assert!(
        times[4] - started < Duration::from_millis(50),
        "{:?}",
        times[4] - started
    );
    assert!(times[5] - started >= Duration::from_millis(100));
    assert!(times[7] - started >= Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn retry_after_seconds_pauses_the_upstream() {
    let (addr, seen) = scripted(|n| match n {
        0 => status(429, &[("retry-after", "2")]),
        _ => status(200, &[]),
    })
    .await;
    let layer = OutboundLayer::builder().replay(NoReplay).build().unwrap();
    let mut client = ServiceBuilder::new().layer(layer.clone()).service(http());
    let (s, info) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(
        s,
        StatusCode::TOO_MANY_REQUESTS,
        "NoReplay returns the refusal"
    );
    assert_eq!(info.unwrap().attempts(), 1);
    let key = addr.to_string();
    let paused = layer.status(&key).unwrap().paused_for();
    assert!(
        paused > Duration::from_millis(1_900) && paused <= Duration::from_secs(2),
        "{paused:?}"
    );
    let (s, _) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(s, StatusCode::OK);
    let times = seen.times();
    assert!(
        times[1] - times[0] >= Duration::from_secs(2),
        "{:?}",
        times[1] - times[0]
    );
    assert!(times[1] - times[0] < Duration::from_millis(2_500));
}

/// IMF-fixdate of Unix second `secs`.
fn imf_fixdate(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (days, sod) = (secs / 86_400, secs % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    format!(
        "{}, {d:02} {} {y} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        MONTHS[(m - 1) as usize],
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

#[tokio::test(start_paused = true)]
async fn retry_after_http_date_pauses_the_upstream_until_then() {
    // The layer's clock reads wall-clock time from when it was built; the date is 3 s past the
    // current whole second, so the pause is between 2 and 3 s.
    let layer = OutboundLayer::builder().replay(NoReplay).build().unwrap();
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let date = imf_fixdate(unix + 3);
    let (addr, seen) = scripted(move |n| match n {
        0 => status(503, &[("retry-after", &date)]),
        _ => status(200, &[]),
    })
    .await;
    let mut client = ServiceBuilder::new().layer(layer.clone()).service(http());
    let (s, _) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    let paused = layer.status(&addr.to_string()).unwrap().paused_for();
    assert!(
        paused >= Duration::from_secs(1) && paused <= Duration::from_secs(3),
        "{paused:?}"
    );
    let (s, _) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(s, StatusCode::OK);
    let gap = seen.times()[1] - seen.times()[0];
    assert!(
        gap >= paused.saturating_sub(Duration::from_millis(10)),
        "{gap:?} < {paused:?}"
    );
    assert!(
        gap >= Duration::from_secs(1) && gap < Duration::from_millis(3_500),
        "{gap:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pause_seen_by_one_caller_holds_back_the_others() {
    let (addr, seen) = scripted(|n| match n {
        0 => status(429, &[("retry-after", "1")]),
        _ => status(200, &[]),
    })
    .await;
    let layer = OutboundLayer::builder()
        .quota(Quota::per_second(100))
        .replay(NoReplay)
        .build()
        .unwrap();
    // Two services made by the layer, for two parts of an application.
    let mut a = ServiceBuilder::new().layer(layer.clone()).service(http());
    let mut b = ServiceBuilder::new().layer(layer.clone()).service(http());
    let (s, _) = drain(send(&mut a, get(addr)).await).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    let started = Instant::now();
    let (s, info) = drain(send(&mut b, get(addr)).await).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "{:?}",
        started.elapsed()
    );
    assert!(info.unwrap().waited() >= Duration::from_millis(950));
    let times = seen.times();
    assert!(times[1] - times[0] >= Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn grpc_resource_exhausted_with_retry_info_pauses() {
    use base64::Engine as _;
    use tonic_types::StatusExt as _;
    let mut details = tonic_types::ErrorDetails::new();
    details.set_retry_info(Some(Duration::from_millis(1_500)));
    let status_pb =
        tonic::Status::with_error_details(tonic::Code::ResourceExhausted, "slow down", details);
    let bin = base64::engine::general_purpose::STANDARD_NO_PAD.encode(status_pb.details());
    let (addr, seen) = scripted(move |n| match n {
        0 => status(
            200,
            &[
                ("content-type", "application/grpc"),
                ("grpc-status", "8"),
                ("grpc-status-details-bin", &bin),
            ],
        ),
        _ => status(200, &[]),
    })
    .await;
    let layer = OutboundLayer::builder().replay(NoReplay).build().unwrap();
    let mut client = ServiceBuilder::new().layer(layer.clone()).service(http());
    let (s, _) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(s, StatusCode::OK, "a trailers-only gRPC answer is HTTP 200");
    let paused = layer.status(&addr.to_string()).unwrap().paused_for();
    assert!(paused > Duration::from_millis(1_400), "{paused:?}");
    drain(send(&mut client, get(addr)).await).await;
    let gap = seen.times()[1] - seen.times()[0];
    assert!(gap >= Duration::from_millis(1_500), "{gap:?}");
}

#[tokio::test(start_paused = true)]
async fn retries_with_backoff_within_max_attempts() {
    // Refused twice with no wait given, then served: the backoff alone spaces the attempts.
    let (addr, seen) = scripted(|n| match n {
        0 | 1 => status(429, &[]),
        _ => status(200, &[]),
    })
    .await;
    let backoff = Backoff::exponential(Duration::from_millis(200)).max(Duration::from_secs(1));
    let layer = OutboundLayer::builder()
        .quota(Quota::per_second(1_000))
        .backoff(backoff)
        .max_attempts(3)
        .build()
        .unwrap();
    let mut client = ServiceBuilder::new().layer(layer).service(http());
    let (s, info) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(info.unwrap().attempts(), 3);
    assert_eq!(seen.count(), 3);
    let g = gaps(&seen.times());
    // Full jitter: each wait is at most its ceiling (200 ms, then 400 ms).
    assert!(g[0] <= Duration::from_millis(210), "{g:?}");
    assert!(g[1] <= Duration::from_millis(410), "{g:?}");
}

#[tokio::test(start_paused = true)]
async fn gives_up_after_max_attempts_with_the_upstreams_answer() {
    let (addr, seen) = scripted(|_| status(429, &[("x-reason", "busy")])).await;
    let layer = OutboundLayer::builder().max_attempts(4).build().unwrap();
    let mut client = ServiceBuilder::new().layer(layer).service(http());
    let res = send(&mut client, get(addr)).await;
    assert_eq!(
        res.headers()["x-reason"],
        "busy",
        "the upstream's response, unchanged"
    );
    let (s, info) = drain(res).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(info.unwrap().attempts(), 4);
    assert_eq!(seen.count(), 4);
}

#[tokio::test(start_paused = true)]
async fn no_retry_past_the_deadline() {
    // The upstream asks for 10 s; the deadline is 5 s: the refusal is returned at once.
    let (addr, seen) = scripted(|_| status(429, &[("retry-after", "10")])).await;
    let layer = OutboundLayer::builder()
        .retry_deadline(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut client = ServiceBuilder::new().layer(layer).service(http());
    let started = Instant::now();
    let (s, info) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(info.unwrap().attempts(), 1);
    assert_eq!(seen.count(), 1);
    assert!(started.elapsed() < Duration::from_secs(1));
    // Within the deadline, the same refusal is retried after the wait.
    let (addr, seen) = scripted(|n| match n {
        0 => status(429, &[("retry-after", "3")]),
        _ => status(200, &[]),
    })
    .await;
    let layer = OutboundLayer::builder()
        .retry_deadline(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut client = ServiceBuilder::new().layer(layer).service(http());
    let (s, info) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(info.unwrap().attempts(), 2);
    let gap = seen.times()[1] - seen.times()[0];
    assert!(gap >= Duration::from_secs(3), "{gap:?}");
}

#[tokio::test(start_paused = true)]
async fn a_post_is_not_retried_unless_opted_in() {
    let (addr, seen) = scripted(|n| match n {
        0 | 2 => status(429, &[("retry-after", "1")]),
        _ => status(200, &[]),
    })
    .await;
    let post = || {
        Request::post(format!("http://{addr}/"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    let mut client = ServiceBuilder::new()
        .layer(OutboundLayer::new())
        .service(http());
    let (s, info) = drain(send(&mut client, post()).await).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "POST is not idempotent");
    assert_eq!(info.unwrap().attempts(), 1);
    assert_eq!(seen.count(), 1);
    // Answer 1 is a 200 to the next request; then opted-in POSTs are retried.
    drain(send(&mut client, get(addr)).await).await;
    let layer = OutboundLayer::builder()
        .replay(tollgate::outbound::Idempotent::new().also(Method::POST))
        .build()
        .unwrap();
    let mut client = ServiceBuilder::new().layer(layer).service(http());
    let (s, info) = drain(send(&mut client, post()).await).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(info.unwrap().attempts(), 2);
    let methods: Vec<_> = seen
        .arrivals
        .lock()
        .unwrap()
        .iter()
        .map(|a| a.1.clone())
        .collect();
    assert_eq!(
        methods,
        [Method::POST, Method::GET, Method::POST, Method::POST]
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_that_cannot_be_cloned_is_not_retried() {
    type Chunks = futures_like::Once;
    let (addr, seen) = scripted(|_| status(429, &[("retry-after", "1")])).await;
    let http: Client<HttpConnector, StreamBody<Chunks>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut client = ServiceBuilder::new()
        .layer(OutboundLayer::builder().replay(NoReplay).build().unwrap())
        .service(http);
    let req = Request::put(format!("http://{addr}/"))
        .body(StreamBody::new(futures_like::Once::new(
            Bytes::from_static(b"data"),
        )))
        .unwrap();
    let (s, info) = drain(send(&mut client, req).await).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(info.unwrap().attempts(), 1);
    assert_eq!(seen.count(), 1);
}

/// A one-chunk streaming body that is not `Clone`, without a futures dependency.
mod futures_like {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http_body::Frame;

    pub struct Once(Option<Bytes>);

    impl Once {
        pub fn new(data: Bytes) -> Self {
            Self(Some(data))
        }
    }

    impl tokio_stream::Stream for Once {
        type Item = Result<Frame<Bytes>, std::convert::Infallible>;

        fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
        }
    }
}

#[tokio::test(start_paused = true)]
async fn adaptive_learns_the_policy_and_stays_under() {
    let (addr, seen) = limited_upstream(true, ResetFormat::DeltaSeconds).await;
    let layer = OutboundLayer::new();
    let client = ServiceBuilder::new().layer(layer.clone()).service(http());
    let statuses = burst(&client, addr, 30).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    assert_eq!(seen.refused.load(Ordering::SeqCst), 0);
    let learned = layer.status(&addr.to_string()).unwrap();
    assert_eq!(learned.learned().len(), 1);
    let q = learned.learned()[0];
    assert_eq!((q.count(), q.period()), (10, Duration::from_secs(1)));
    // Never faster than learned: in any second, at most the burst (5) plus 10.
    let times = seen.times();
    for (i, t) in times.iter().enumerate() {
        let within = times[i..]
            .iter()
            .take_while(|u| **u - *t < Duration::from_secs(1))
            .count();
        assert!(within <= 15, "{within} calls within a second from call {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn adaptive_learns_from_x_ratelimit_alone() {
    for reset in [ResetFormat::DeltaSeconds, ResetFormat::UnixSeconds] {
        learns_from_x_ratelimit(reset).await;
    }
}

async fn learns_from_x_ratelimit(reset: ResetFormat) {
    let (addr, seen) = limited_upstream(false, reset).await;
    let layer = OutboundLayer::new();
    let client = ServiceBuilder::new().layer(layer.clone()).service(http());
    let statuses = burst(&client, addr, 30).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    assert!(
        seen.refused.load(Ordering::SeqCst) <= 2,
        "{}",
        seen.refused.load(Ordering::SeqCst)
    );
    let q = layer.status(&addr.to_string()).unwrap().learned()[0];
    assert_eq!((q.count(), q.period()), (10, Duration::from_secs(1)));
}

#[tokio::test(start_paused = true)]
async fn adaptive_never_exceeds_a_configured_quota() {
    // The upstream allows 10/s; the client is configured for 2/s: it keeps to 2/s.
    let (addr, seen) = limited_upstream(true, ResetFormat::DeltaSeconds).await;
    let layer = OutboundLayer::builder()
        .quota(Quota::per_second(2).burst(1))
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(layer.clone()).service(http());
    burst(&client, addr, 6).await;
    for gap in gaps(&seen.times()) {
        assert!(gap >= Duration::from_micros(499_900), "{gap:?}");
    }
    assert_eq!(
        layer.status(&addr.to_string()).unwrap().learned()[0].count(),
        10
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_gives_its_slot_back() {
    let (addr, seen) = scripted(|_| status(200, &[])).await;
    let layer = OutboundLayer::builder()
        .quota(Quota::per_second(1).burst(1))
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(layer).service(http());
    let started = Instant::now();
    drain(send(&mut client.clone(), get(addr)).await).await; // t = 0
                                                             // The second call reserves t = 1 s, and is dropped at 0.5 s.
    let mut second = client.clone();
    let dropped = tokio::time::timeout(Duration::from_millis(500), async move {
        send(&mut second, get(addr)).await
    })
    .await;
    assert!(dropped.is_err(), "still waiting for its slot");
    // The third takes the slot the second gave back: 1 s, not 2 s.
    drain(send(&mut client.clone(), get(addr)).await).await;
    let times = seen.times();
    assert_eq!(times.len(), 2);
    assert!(times[1] - started >= Duration::from_secs(1));
    assert!(
        times[1] - started < Duration::from_millis(1_500),
        "{:?}",
        times[1] - started
    );
}

#[tokio::test]
async fn invalid_configuration_names_the_field() {
    let err = OutboundLayer::builder()
        .adaptive(false)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "outbound.quota");
    let err = OutboundLayer::builder()
        .max_attempts(0)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "outbound.max_attempts");
    let err = OutboundLayer::builder()
        .backoff(Backoff::exponential(Duration::ZERO))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "backoff");
    assert!(OutboundLayer::builder()
        .quota(Quota::per_second(0))
        .build()
        .is_err());
}

#[tokio::test(start_paused = true)]
async fn a_closure_key_shares_one_schedule_across_hosts() {
    // Two servers, one API (say, two regions of one provider): one key, one pause.
    let (a, seen_a) = scripted(|n| match n {
        0 => status(429, &[("retry-after", "1")]),
        _ => status(200, &[]),
    })
    .await;
    let (b, seen_b) = scripted(|_| status(200, &[])).await;
    let layer = OutboundLayer::builder()
        .upstream_key(|_: &Request<Full<Bytes>>| "provider".to_owned())
        .replay(NoReplay)
        .build()
        .unwrap();
    let mut client = ServiceBuilder::new().layer(layer.clone()).service(http());
    let (s, _) = drain(send(&mut client, get(a)).await).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert!(layer.status("provider").unwrap().paused_for() > Duration::from_millis(900));
    let (s, _) = drain(send(&mut client, get(b)).await).await;
    assert_eq!(s, StatusCode::OK);
    let gap = seen_b.times()[0] - seen_a.times()[0];
    assert!(gap >= Duration::from_secs(1), "{gap:?}");
    assert!(
        layer.status(&a.to_string()).is_none(),
        "keyed by the closure only"
    );
}

#[tokio::test(start_paused = true)]
async fn no_retry_whose_slot_is_past_the_deadline() {
    // One call a second: after the refusal at 0 s the next slot is 1 s away, past the 500 ms
    // deadline, though the backoff (at most 50 ms) is not. The refusal is returned at once
    // rather than sent again after the deadline.
    let (addr, seen) = scripted(|n| match n {
        0 => status(429, &[]),
        _ => status(200, &[]),
    })
    .await;
    let layer = OutboundLayer::builder()
        .quota(Quota::per_second(1).burst(1))
        .backoff(Backoff::exponential(Duration::from_millis(50)))
        .retry_deadline(Duration::from_millis(500))
        .build()
        .unwrap();
    let mut client = ServiceBuilder::new().layer(layer).service(http());
    let started = Instant::now();
    let (s, info) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(seen.count(), 1, "no attempt after the deadline");
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(info.unwrap().attempts(), 1);
    assert!(started.elapsed() < Duration::from_millis(500));
    // Its slot was given back: the next call goes at 1 s, not 2 s.
    let (s, _) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(s, StatusCode::OK);
    let gap = seen.times()[1] - seen.times()[0];
    assert!(gap < Duration::from_millis(1_100), "{gap:?}");
}

/// A client's outbound layer reads a load shedder's `503` as it reads a `429`: the upstream
/// is paused for its `Retry-After` (1 s).
#[tokio::test(start_paused = true)]
async fn a_load_shedders_503_pauses_the_upstream_for_its_retry_after() {
    use tollgate::load_shed::LoadShedLayer;

    let shed = LoadShedLayer::builder().fixed_limit(1).build().unwrap();
    let app = Router::new()
        .fallback(|| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            "done"
        })
        .layer(shed.clone());
    let addr = serve(app).await;
    let layer = OutboundLayer::builder().replay(NoReplay).build().unwrap();
    let client = ServiceBuilder::new().layer(layer.clone()).service(http());
    // Another client's request holds the shedder's only slot for 10 s.
    let mut first = http();
    let running = tokio::spawn(async move { drain(send(&mut first, get(addr)).await).await });
    // Until it is in flight (real I/O: virtual milliseconds pass meanwhile).
    for _ in 0..5_000 {
        if shed.in_flight() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(shed.in_flight(), 1);
    let mut client = client;
    let (s, _) = drain(send(&mut client, get(addr)).await).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    let paused = layer.status(&addr.to_string()).unwrap().paused_for();
    assert!(
        paused > Duration::from_millis(900) && paused <= Duration::from_secs(1),
        "{paused:?}"
    );
    assert_eq!(running.await.unwrap().0, StatusCode::OK);
}
