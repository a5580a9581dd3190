//! The limiter in the stacks people build with it: tower-http's `TraceLayer`, `TimeoutLayer` and
//! `CompressionLayer` on either side of it, axum `route_layer` with state, `ServiceBuilder`, and a
//! plain hyper service. Each stack is served on 127.0.0.1 and called with a real client (or
//! driven with `oneshot` on paused time). That these compile at all is half the test: axum's
//! `Router::layer` only accepts services whose error is `Infallible`, so none of them needs
//! `HandleErrorLayer`.

use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tollgate::key::PeerIp;
use tollgate::{Decision, Limit, Quota, RateLimitLayer};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_http::compression::CompressionLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::harness::http_server::serve_url as serve;

/// Long enough for `CompressionLayer` to compress it (it skips bodies under 32 bytes).
const PAGE: &str = "hello, world! hello, world! hello, world! hello, world! hello, world!";

/// `n` requests per hour per client IP: nothing refills while a test runs.
fn per_ip(n: u64) -> RateLimitLayer {
    RateLimitLayer::new(Limit::new("per-ip", Quota::per_hour(n)).key(PeerIp::new())).unwrap()
}

fn timeout() -> TimeoutLayer {
    TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, Duration::from_millis(200))
}

/// A client that neither decompresses nor follows proxies; the timeout only guards against a hang.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn get_gzip(http: &reqwest::Client, url: &str) -> reqwest::Response {
    http.get(url)
        .header(header::ACCEPT_ENCODING, "gzip")
        .send()
        .await
        .unwrap()
}

fn header_of<'a>(res: &'a reqwest::Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .map_or("<none>", |v| v.to_str().unwrap())
}

/// The body, gunzipped when the response says it is gzip.
async fn text(res: reqwest::Response) -> String {
    let gzip = header_of(&res, "content-encoding") == "gzip";
    let bytes = res.bytes().await.unwrap();
    if !gzip {
        return String::from_utf8(bytes.to_vec()).unwrap();
    }
    let mut out = String::new();
    flate2::read::GzDecoder::new(&bytes[..])
        .read_to_string(&mut out)
        .unwrap();
    out
}

fn app() -> Router {
    Router::new()
        .route("/", get(|| async { PAGE }))
        .route("/slow", get(std::future::pending::<&'static str>))
}

#[tokio::test]
async fn tower_http_layers_outside_the_limiter() {
    // ServiceBuilder lists layers outermost first: trace, compression and timeout wrap the limiter.
    let app = app().layer(
        ServiceBuilder::new()
            .layer(TraceLayer::new_for_http())
            .layer(CompressionLayer::new())
            .layer(timeout())
            .layer(per_ip(3)),
    );
    let base = serve(app).await;
    let http = client();

    let res = get_gzip(&http, &base).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header_of(&res, "content-encoding"), "gzip");
    assert_eq!(header_of(&res, "x-ratelimit-limit"), "3");
    assert_eq!(header_of(&res, "x-ratelimit-remaining"), "2");
    assert_eq!(text(res).await, PAGE);

    // The timeout still fires around the limiter (the request was admitted, so it was charged);
    // its 408 is the timeout layer's own response, made with `ResponseBody::default()`.
    let res = get_gzip(&http, &format!("{base}/slow")).await;
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);

    let res = get_gzip(&http, &base).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header_of(&res, "x-ratelimit-remaining"), "0");

    // The 429 comes through timeout and compression intact: status, headers, problem+json body.
    let res = get_gzip(&http, &base).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header_of(&res, "retry-after"), "1200");
    assert_eq!(header_of(&res, "x-ratelimit-limit"), "3");
    assert_eq!(header_of(&res, "x-ratelimit-remaining"), "0");
    assert_eq!(header_of(&res, "content-type"), "application/problem+json");
    assert_eq!(header_of(&res, "content-encoding"), "gzip");
    let body: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["policy"], "per-ip");
}

#[tokio::test]
async fn tower_http_layers_inside_the_limiter() {
    let app = app().layer(
        ServiceBuilder::new()
            .layer(TraceLayer::new_for_http())
            .layer(per_ip(3))
            .layer(CompressionLayer::new())
            .layer(timeout()),
    );
    let base = serve(app).await;
    let http = client();

    let res = get_gzip(&http, &base).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header_of(&res, "content-encoding"), "gzip");
    assert_eq!(header_of(&res, "x-ratelimit-remaining"), "2");
    assert_eq!(text(res).await, PAGE);

    // The timeout fires inside the limiter, so its 408 carries the rate-limit headers.
    let res = get_gzip(&http, &format!("{base}/slow")).await;
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(header_of(&res, "x-ratelimit-limit"), "3");
    assert_eq!(header_of(&res, "x-ratelimit-remaining"), "1");

    let res = get_gzip(&http, &base).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header_of(&res, "x-ratelimit-remaining"), "0");

    // Refused before compression: the problem+json goes out as is.
    let res = get_gzip(&http, &base).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header_of(&res, "retry-after"), "1200");
    assert_eq!(header_of(&res, "content-encoding"), "<none>");
    let body: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
    assert_eq!(body["policy"], "per-ip");
}

#[derive(Clone)]
struct AppState {
    greeting: &'static str,
    calls: Arc<AtomicUsize>,
}

async fn greet(State(state): State<AppState>, Extension(decision): Extension<Decision>) -> String {
    state.calls.fetch_add(1, Ordering::SeqCst);
    format!("{} ({} left)", state.greeting, decision.remaining())
}

#[tokio::test]
async fn route_layer_on_a_router_with_state() {
    let state = AppState {
        greeting: "hi",
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let app = Router::new()
        .route("/limited", get(greet).route_layer(per_ip(2)))
        .route(
            "/open",
            get(|State(s): State<AppState>| async move { s.greeting }),
        )
        .with_state(state.clone());
    let base = serve(app).await;
    let http = client();

    for left in ["1", "0"] {
        let res = http.get(format!("{base}/limited")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header_of(&res, "x-ratelimit-remaining"), left);
        assert_eq!(text(res).await, format!("hi ({left} left)"));
    }
    let res = http.get(format!("{base}/limited")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // The refused request never reached the handler.
    assert_eq!(state.calls.load(Ordering::SeqCst), 2);

    // Routes without the route layer are neither limited nor given headers.
    let res = http.get(format!("{base}/open")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header_of(&res, "x-ratelimit-limit"), "<none>");
    assert_eq!(text(res).await, "hi");
}

async fn page(_: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(
        PAGE.as_bytes(),
    ))))
}

#[tokio::test]
async fn plain_hyper_service_with_tower_http_layers() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limit = per_ip(1);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let svc = ServiceBuilder::new()
                // hyper does not record the peer: put it where PeerIp looks.
                .map_request(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert::<SocketAddr>(peer);
                    req
                })
                .layer(TraceLayer::new_for_http())
                .layer(CompressionLayer::new())
                .layer(timeout())
                .layer(limit.clone())
                .service_fn(page);
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc))
                    .await;
            });
        }
    });
    let http = client();
    let url = format!("http://{addr}/");

    let res = get_gzip(&http, &url).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header_of(&res, "x-ratelimit-remaining"), "0");
    assert_eq!(text(res).await, PAGE);

    let res = get_gzip(&http, &url).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header_of(&res, "retry-after"), "3600");
    assert_eq!(header_of(&res, "content-encoding"), "gzip");
    let body: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
    assert_eq!(body["policy"], "per-ip");
}

/// `TimeoutLayer` on either side of the limiter, driven with `oneshot` on paused time: the
/// timeout fires at once (tokio advances the clock), and a refusal is not turned into a 408.
#[tokio::test(start_paused = true)]
async fn timeout_on_either_side_with_oneshot() {
    let slow = || {
        service_fn(|req: Request<()>| async move {
            if req.uri().path() == "/slow" {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        })
    };
    let request = |path: &str| {
        let mut req = Request::get(path).body(()).unwrap();
        req.extensions_mut()
            .insert("203.0.113.9:5000".parse::<SocketAddr>().unwrap());
        req
    };

    let outside = ServiceBuilder::new()
        .layer(timeout())
        .layer(per_ip(2))
        .service(slow());
    let inside = ServiceBuilder::new()
        .layer(per_ip(2))
        .layer(timeout())
        .service(slow());

    let res = outside.clone().oneshot(request("/slow")).await.unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(res
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());
    let res = outside.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    let res = outside.clone().oneshot(request("/slow")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "1800");

    let res = inside.clone().oneshot(request("/slow")).await.unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
    let res = inside.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = inside.clone().oneshot(request("/slow")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["policy"], "per-ip");
}
