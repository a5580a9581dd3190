//! The layer in a real axum server on 127.0.0.1, exercised with a real HTTP client. Time is a
//! manual clock, so nothing depends on how fast the test runs.

use std::time::Duration;

use axum::routing::{get, post};
use axum::{Extension, Router};
use reqwest::StatusCode;
use tollgate::clock::ManualClock;
use tollgate::cost::ConstantCost;
use tollgate::headers::ResetFormat;
use tollgate::key::{ClientIp, GlobalKey, PeerIp};
use tollgate::store::memory::MemoryBackend;
use tollgate::{Decision, Limit, Quota, RateLimitLayer};

use crate::harness::http_server::{serve_url as serve, serve_without_connect_info};

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn header<'a>(res: &'a reqwest::Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or("<none>")
}

#[tokio::test]
async fn quickstart_five_then_429_with_problem_json() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(clock.clone()))
        .limit(Limit::new("per-ip", Quota::per_second(1).burst(5)).key(PeerIp::new()))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer);
    let base = serve(app).await;
    let http = client();

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for (i, remaining) in ["4", "3", "2", "1", "0"].into_iter().enumerate() {
        let res = http.get(&base).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "x-ratelimit-limit"), "5");
        assert_eq!(header(&res, "x-ratelimit-remaining"), remaining);
        // Unix seconds when the bucket is full again: i + 1 seconds from now, rounded up.
        let reset: u64 = header(&res, "x-ratelimit-reset").parse().unwrap();
        let full_in = i as u64 + 1;
        assert!(
            (now + full_in..=now + full_in + 2).contains(&reset),
            "{now} {reset}"
        );
        assert_eq!(res.text().await.unwrap(), "hello");
    }
    let res = http.get(&base).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), "1");
    assert_eq!(header(&res, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&res, "content-type"), "application/problem+json");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["policy"], "per-ip");
    assert_eq!(body["quota"], "1/s burst 5");
    assert_eq!(body["limit"], 5);
    assert_eq!(body["retry_after"], 1);

    clock.advance(Duration::from_secs(1));
    let res = http.get(&base).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "0");
}

#[tokio::test]
async fn per_route_limits_with_route_layer_and_a_global_ceiling() {
    let clock = ManualClock::new();
    let backend = || MemoryBackend::new().clock(clock.clone());
    let search = RateLimitLayer::builder()
        .backend(backend())
        .reset_format(ResetFormat::DeltaSeconds)
        .limit(Limit::new("search", Quota::per_minute(2)).key(PeerIp::new()))
        .build()
        .unwrap();
    let upload = RateLimitLayer::builder()
        .backend(backend())
        .reset_format(ResetFormat::DeltaSeconds)
        .limit(
            Limit::new("upload", Quota::per_minute(10))
                .key(PeerIp::new())
                .cost(ConstantCost(5)),
        )
        .build()
        .unwrap();
    let global = RateLimitLayer::builder()
        .backend(backend())
        .reset_format(ResetFormat::DeltaSeconds)
        .limit(Limit::new("global", Quota::per_minute(6)).key(GlobalKey))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/search", get(|| async { "results" }).route_layer(search))
        .route("/upload", post(|| async { "stored" }).route_layer(upload))
        .route("/free", get(|| async { "free" }))
        .layer(global);
    let base = serve(app).await;
    let http = client();

    // Search: 2 per minute of its own; global 6 above it.
    for remaining in ["1", "0"] {
        let res = http.get(format!("{base}/search")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        // search (1/2, then 0/2) is tighter than global (5/6, 4/6).
        assert_eq!(header(&res, "x-ratelimit-limit"), "2");
        assert_eq!(header(&res, "x-ratelimit-remaining"), remaining);
    }
    let res = http.get(format!("{base}/search")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["policy"], "search");

    // Upload costs 5 of its 10 units: two uploads, then the route is exhausted. Stacked layers
    // count independently: the outer global layer charged the refused search too (3 of 6 used),
    // so after the first upload global (2 of 6 left) is tighter than upload (5 of 10).
    let res = http.post(format!("{base}/upload")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-limit"), "6");
    assert_eq!(header(&res, "x-ratelimit-remaining"), "2");
    let res = http.post(format!("{base}/upload")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-limit"), "10");
    assert_eq!(header(&res, "x-ratelimit-remaining"), "0");
    let res = http.post(format!("{base}/upload")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), "30");

    // The global ceiling counted every request that reached it: 3 + 3 = 6 of 6, so even the
    // route without a limit of its own is now refused, by "global".
    let res = http.get(format!("{base}/free")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "x-ratelimit-limit"), "6");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["policy"], "global");

    // A minute later everything is back.
    clock.advance(Duration::from_secs(60));
    let res = http.get(format!("{base}/free")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "5");
}

#[tokio::test]
async fn multi_limit_all_or_nothing_over_http() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(clock.clone()))
        .ietf_headers(true)
        .limit(Limit::new("burst", Quota::per_second(1).burst(2)).key(PeerIp::new()))
        .limit(Limit::new("daily", Quota::per_day(3)).key(PeerIp::new()))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let base = serve(app).await;
    let http = client();

    let ratelimit = |res: &reqwest::Response| header(res, "ratelimit").to_owned();
    let res = http.get(&base).send().await.unwrap();
    assert_eq!(
        header(&res, "ratelimit-policy"),
        r#""burst";q=2;w=2, "daily";q=3;w=86400"#
    );
    assert_eq!(ratelimit(&res), r#""burst";r=1;t=1, "daily";r=2;t=28800"#);
    let res = http.get(&base).send().await.unwrap();
    assert_eq!(ratelimit(&res), r#""burst";r=0;t=2, "daily";r=1;t=57600"#);
    // Refused by "burst": "daily" keeps its last unit, however often the client retries.
    for _ in 0..3 {
        let res = http.get(&base).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(ratelimit(&res), r#""burst";r=0;t=2, "daily";r=1;t=57600"#);
    }
    clock.advance(Duration::from_secs(2));
    let res = http.get(&base).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        header(&res, "x-ratelimit-limit"),
        "3",
        "daily is now the tightest"
    );
    assert_eq!(header(&res, "x-ratelimit-remaining"), "0");
    // Refused by "daily": "burst" keeps its token.
    let res = http.get(&base).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        ratelimit(&res).starts_with(r#""burst";r=1;"#),
        "{}",
        ratelimit(&res)
    );
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["policy"], "daily");
}

#[tokio::test]
async fn handlers_read_the_decision() {
    let layer = RateLimitLayer::new(Limit::new("per-ip", Quota::per_minute(10)).key(PeerIp::new()))
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<Decision>| async move {
                format!("{} of {} left", d.remaining(), d.limit())
            }),
        )
        .layer(layer);
    let base = serve(app).await;
    let res = client().get(&base).send().await.unwrap();
    assert_eq!(res.text().await.unwrap(), "9 of 10 left");
}

#[tokio::test]
async fn missing_connect_info_is_a_loud_500() {
    // Served without `into_make_service_with_connect_info`: PeerIp has no address.
    let layer = RateLimitLayer::new(Limit::new("per-ip", Quota::per_minute(10)).key(PeerIp::new()))
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let addr = serve_without_connect_info(app).await;
    let res = client()
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["type"], "urn:tollgate:problem:missing-key");
    // The body names the limit and the fix, so no log subscriber is needed to find it.
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("\"per-ip\""), "{detail}");
    assert!(
        detail.contains("into_make_service_with_connect_info::<SocketAddr>()"),
        "{detail}"
    );
}

#[tokio::test]
async fn missing_connect_info_for_client_ip_names_the_trusted_proxy_check() {
    let layer = RateLimitLayer::new(
        Limit::new("per-client", Quota::per_minute(10))
            .key(ClientIp::trusting(["10.0.0.0/8"]).unwrap()),
    )
    .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let addr = serve_without_connect_info(app).await;
    let res = client()
        .get(format!("http://{addr}/"))
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body: serde_json::Value = res.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("trusted proxy"), "{detail}");
    assert!(
        detail.contains("into_make_service_with_connect_info"),
        "{detail}"
    );
    // Nothing from the request is echoed.
    assert!(!detail.contains("203.0.113.9"), "{detail}");
}
