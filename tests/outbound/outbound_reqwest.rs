//! `tollgate::outbound::reqwest::OutboundMiddleware` in a real `reqwest-middleware` client,
//! against a scripted axum upstream on 127.0.0.1 that records when each request arrived. Time
//! is tokio's paused clock, as in `outbound.rs`: the middleware decides on a `TokioClock` and
//! sleeps on tokio's timer, the upstream stamps arrivals with `tokio::time::Instant`, so the
//! timings are exact in virtual time. The reqwest client runs without its pool's idle timer,
//! which would otherwise be the next timer the paused clock jumps to while a request is on the
//! wire.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request as AxumRequest;
use axum::response::Response as AxumResponse;
use axum::Router;
use http::{Method, StatusCode};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tokio::time::Instant;
use tollgate::outbound::reqwest::OutboundMiddleware;
use tollgate::outbound::{OutboundInfo, OutboundLayer};
use tollgate::Quota;

/// What the upstream saw: arrival time and method of each request.
#[derive(Default)]
struct Seen {
    arrivals: Mutex<Vec<(Instant, Method)>>,
}

impl Seen {
    fn times(&self) -> Vec<Instant> {
        self.arrivals.lock().unwrap().iter().map(|a| a.0).collect()
    }

    fn methods(&self) -> Vec<Method> {
        self.arrivals
            .lock()
            .unwrap()
            .iter()
            .map(|a| a.1.clone())
            .collect()
    }
}

/// An upstream on 127.0.0.1 answering request `n` (0-based, in arrival order) with
/// `script(n)`.
async fn scripted(
    script: impl Fn(usize) -> AxumResponse + Clone + Send + Sync + 'static,
) -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let count = Arc::new(AtomicU64::new(0));
    let app = {
        let seen = seen.clone();
        Router::new().fallback(move |req: AxumRequest| {
            let n = count.fetch_add(1, Ordering::SeqCst) as usize;
            seen.arrivals
                .lock()
                .unwrap()
                .push((Instant::now(), req.method().clone()));
            let res = script(n);
            async move { Ok::<_, Infallible>(res) }
        })
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

fn status(code: u16, retry_after: Option<&str>) -> AxumResponse {
    let mut res = http::Response::builder().status(code);
    if let Some(secs) = retry_after {
        res = res.header(http::header::RETRY_AFTER, secs);
    }
    res.body(Body::from("x")).unwrap()
}

fn client(middleware: OutboundMiddleware) -> ClientWithMiddleware {
    let reqwest = reqwest::Client::builder()
        .pool_idle_timeout(None)
        .build()
        .unwrap();
    ClientBuilder::new(reqwest).with(middleware).build()
}

/// Sends `method /` to `addr`: the status and what the layer did.
async fn call(
    client: &ClientWithMiddleware,
    method: Method,
    addr: SocketAddr,
) -> (StatusCode, OutboundInfo) {
    let res = client
        .request(method, format!("http://{addr}/"))
        .body("{}")
        .send()
        .await
        .unwrap();
    let info = *res.extensions().get::<OutboundInfo>().unwrap();
    let status = res.status();
    res.bytes().await.unwrap();
    (status, info)
}

fn within(d: Duration, from: Duration, to: Duration) -> bool {
    d >= from && d < to
}

/// (a) A 429 with `Retry-After: 1` pauses the upstream for every client made from the layer;
/// the refused GET is sent again when the pause ends and succeeds, and a call from another
/// client started during the pause waits for it too.
#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_pauses_the_upstream_and_the_get_is_retried_after_it() {
    let (addr, seen) = scripted(|n| match n {
        0 => status(429, Some("1")),
        _ => status(200, None),
    })
    .await;
    let layer = OutboundLayer::builder()
        .quota(Quota::per_second(100))
        .build()
        .unwrap();
    let middleware = OutboundMiddleware::new(layer);
    let first = client(middleware.clone());
    let other = client(middleware.clone());
    let started = Instant::now();
    let a = tokio::spawn(async move { call(&first, Method::GET, addr).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let paused = middleware.status(&addr.to_string()).unwrap().paused_for();
    assert!(
        within(
            paused,
            Duration::from_millis(700),
            Duration::from_millis(801)
        ),
        "paused for {paused:?} 200 ms after the 429"
    );
    let (b_status, b_info) = call(&other, Method::GET, addr).await;
    let (a_status, a_info) = a.await.unwrap();

    assert_eq!((a_status, a_info.attempts()), (StatusCode::OK, 2));
    assert_eq!((b_status, b_info.attempts()), (StatusCode::OK, 1));
    let times = seen.times();
    assert_eq!(times.len(), 3, "the 429, the retry, the other call");
    assert!(times[0] - started < Duration::from_millis(50));
    for t in &times[1..] {
        let after = *t - times[0];
        assert!(
            within(after, Duration::from_secs(1), Duration::from_millis(1_200)),
            "{after:?} after the 429"
        );
    }
    assert!(a_info.waited() >= Duration::from_millis(900), "{a_info:?}");
}

/// (b) A configured quota of 5 per second with a burst of 1 spaces 12 concurrent calls 200 ms
/// apart: the upstream never sees more than 5 in any second.
#[tokio::test(start_paused = true)]
async fn a_configured_quota_spaces_the_calls() {
    let (addr, seen) = scripted(|_| status(200, None)).await;
    let layer = OutboundLayer::builder()
        .quota(Quota::per_second(5).burst(1))
        .build()
        .unwrap();
    let client = client(OutboundMiddleware::new(layer));
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let client = client.clone();
        set.spawn(async move { call(&client, Method::GET, addr).await.0 });
    }
    while let Some(status) = set.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::OK);
    }
    let times = seen.times();
    assert_eq!(times.len(), 12);
    for w in times.windows(2) {
        let gap = w[1] - w[0];
        assert!(gap >= Duration::from_micros(199_900), "gap {gap:?}");
    }
    // At most 5 in any window of a second starting at an arrival.
    for (i, t) in times.iter().enumerate() {
        let in_window = times[i..]
            .iter()
            .take_while(|u| **u - *t < Duration::from_secs(1))
            .count();
        assert!(in_window <= 5, "{in_window} calls within 1 s of call {i}");
    }
    let per_second: Vec<usize> = (0..3)
        .map(|s| {
            times
                .iter()
                .filter(|t| (**t - started).as_secs() == s)
                .count()
        })
        .collect();
    assert_eq!(per_second, [5, 5, 2]);
}

/// (c) The default replay: a refused POST is returned as it is, a refused GET is sent again,
/// and a PUT with a streamed body (which `reqwest::Request::try_clone` cannot copy) is not.
#[tokio::test(start_paused = true)]
async fn a_post_is_not_retried_a_get_is() {
    let (addr, seen) = scripted(|n| match n {
        0..=2 => status(429, Some("1")),
        3 => status(200, None),
        _ => status(503, Some("1")),
    })
    .await;
    let client = client(OutboundMiddleware::default());

    let (s, info) = call(&client, Method::POST, addr).await;
    assert_eq!((s, info.attempts()), (StatusCode::TOO_MANY_REQUESTS, 1));
    assert_eq!(seen.methods(), [Method::POST]);

    // It waits out the POST's pause, is refused again, and is retried after that pause.
    let (s, info) = call(&client, Method::GET, addr).await;
    assert_eq!((s, info.attempts()), (StatusCode::OK, 3));
    assert_eq!(
        seen.methods(),
        [Method::POST, Method::GET, Method::GET, Method::GET]
    );
    let times = seen.times();
    for w in times.windows(2) {
        assert!(w[1] - w[0] >= Duration::from_secs(1), "{:?}", w[1] - w[0]);
    }

    let streamed = http_body_util::Full::new(bytes::Bytes::from_static(b"data"));
    let res = client
        .put(format!("http://{addr}/"))
        .body(reqwest::Body::wrap(streamed))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.extensions().get::<OutboundInfo>().unwrap().attempts(),
        1
    );
    assert_eq!(seen.methods().len(), 5);
}

/// (d) `max_pause` bounds a `Retry-After` of a day: the upstream is paused for 2 s, and the
/// retry goes then.
#[tokio::test(start_paused = true)]
async fn max_pause_bounds_a_huge_retry_after() {
    let (addr, seen) = scripted(|n| match n {
        0 => status(429, Some("86400")),
        _ => status(200, None),
    })
    .await;
    let layer = OutboundLayer::builder()
        .max_pause(Duration::from_secs(2))
        .build()
        .unwrap();
    let middleware = OutboundMiddleware::new(layer);
    let client = client(middleware.clone());
    let call = tokio::spawn(async move { call(&client, Method::GET, addr).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let paused = middleware.status(&addr.to_string()).unwrap().paused_for();
    assert!(
        within(
            paused,
            Duration::from_millis(1_800),
            Duration::from_millis(1_901)
        ),
        "{paused:?}"
    );
    let (s, info) = call.await.unwrap();
    assert_eq!((s, info.attempts()), (StatusCode::OK, 2));
    let times = seen.times();
    assert_eq!(times.len(), 2);
    let gap = times[1] - times[0];
    assert!(
        within(gap, Duration::from_secs(2), Duration::from_millis(2_200)),
        "{gap:?}"
    );
}

/// A call dropped while it waits for its slot gives the slot back: the next caller takes it.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_waiting_gives_its_slot_back() {
    let (addr, seen) = scripted(|_| status(200, None)).await;
    let layer = OutboundLayer::builder()
        .quota(Quota::per_second(1).burst(1))
        .build()
        .unwrap();
    let client = client(OutboundMiddleware::new(layer));
    let started = Instant::now();
    call(&client, Method::GET, addr).await;
    // The second call's slot is at 1 s; it is dropped at 500 ms.
    let dropped =
        tokio::time::timeout(Duration::from_millis(500), call(&client, Method::GET, addr)).await;
    assert!(dropped.is_err());
    call(&client, Method::GET, addr).await;
    let times = seen.times();
    assert_eq!(times.len(), 2, "the dropped call was never sent");
    let second = times[1] - started;
    assert!(
        within(second, Duration::from_secs(1), Duration::from_millis(1_100)),
        "the third call took the given-back slot at 1 s, not 2 s: {second:?}"
    );
}
