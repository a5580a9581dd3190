//! What a layer answers: statuses, headers and bodies, refusals, missing keys, costs.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceBuilder, ServiceExt};

use super::test_store::{Mode, TestBackend};
use super::*;
use crate::clock::ManualClock;
use crate::error::{StoreError, StoreErrorKind};
use crate::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::key::{GlobalKey, MissingKey, PeerIp};
use crate::response::{RejectReason, Rejected, RejectionBody};
use crate::{Decision, Quota, RequestView};

async fn quickstart_sequence(mode: Mode) {
    let clock = ManualClock::new();
    let svc = service(
        builder(&clock, mode)
            .limit(Limit::new("burst", Quota::per_second(1).burst(5)).key(PeerIp::new())),
    );
    for (i, remaining) in ["4", "3", "2", "1", "0"].into_iter().enumerate() {
        let res = svc.clone().oneshot(from_peer("192.0.2.1")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        assert_eq!(header(&res, X_RATELIMIT_LIMIT), "5");
        assert_eq!(header(&res, X_RATELIMIT_REMAINING), remaining);
        assert_eq!(header(&res, X_RATELIMIT_RESET), (i + 1).to_string());
        assert_eq!(
            header(&res, "x-seen-remaining"),
            remaining,
            "handler sees the decision"
        );
        assert!(!res.headers().contains_key(RETRY_AFTER));
        assert!(!res.body().is_rejection());
        assert!(
            res.extensions().get::<Decision>().is_none(),
            "allowed responses carry the decision only when opted in"
        );
    }
    let res = svc.clone().oneshot(from_peer("192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, RETRY_AFTER), "1");
    assert_eq!(header(&res, X_RATELIMIT_LIMIT), "5");
    assert_eq!(header(&res, X_RATELIMIT_REMAINING), "0");
    assert_eq!(header(&res, X_RATELIMIT_RESET), "5");
    assert_eq!(header(&res, CONTENT_TYPE), "application/problem+json");
    assert!(
        res.extensions().get::<Decision>().is_none(),
        "refusals too carry the decision only when opted in"
    );
    let body = body_json(res).await;
    assert_eq!(body["status"], 429);
    assert_eq!(body["policy"], "burst");
    assert_eq!(body["quota"], "1/s burst 5");
    assert_eq!(body["retry_after"], 1);

    // Another client has its own bucket.
    let res = svc.clone().oneshot(from_peer("192.0.2.2")).await.unwrap();
    assert_eq!(header(&res, X_RATELIMIT_REMAINING), "4");

    // One second later one token is back.
    clock.advance(Duration::from_secs(1));
    let res = svc.clone().oneshot(from_peer("192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, X_RATELIMIT_REMAINING), "0");
    let res = svc.clone().oneshot(from_peer("192.0.2.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn five_allowed_then_429_sync_store() {
    quickstart_sequence(Mode::Ready).await;
}

#[tokio::test]
async fn five_allowed_then_429_async_store() {
    quickstart_sequence(Mode::Pending).await;
}

/// A service that must be polled ready before each call, and whose clones start unready (as
/// tower's `ConcurrencyLimit` or a buffer's handle behave).
#[derive(Debug)]
struct MustBeReady {
    ready: bool,
}

impl Clone for MustBeReady {
    fn clone(&self) -> Self {
        Self { ready: false }
    }
}

impl Service<Request<()>> for MustBeReady {
    type Response = Response<Full<Bytes>>;
    type Error = &'static str;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.ready = true;
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let was_ready = std::mem::replace(&mut self.ready, false);
        std::future::ready(if was_ready {
            Ok(Response::new(Full::new(Bytes::new())))
        } else {
            Err("called without poll_ready")
        })
    }
}

#[tokio::test]
async fn calls_the_instance_that_was_polled_ready() {
    for mode in [Mode::Ready, Mode::Pending] {
        let clock = ManualClock::new();
        let layer = builder(&clock, mode).limit(burst5()).build().unwrap();
        let mut svc = ServiceBuilder::new()
            .layer(layer)
            .service(MustBeReady { ready: false });
        for _ in 0..3 {
            let res = svc
                .ready()
                .await
                .unwrap()
                .call(get("/", "a"))
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
        }
    }
}

#[tokio::test]
async fn multi_limit_is_all_or_nothing() {
    let clock = ManualClock::new();
    let svc = service(
        builder(&clock, Mode::Ready)
            .ietf_headers(true)
            .limit(Limit::new("burst", Quota::per_second(1).burst(2)).key(client()))
            .limit(Limit::new("daily", Quota::per_day(5)).key(client())),
    );
    let remaining = |res: &Response<_>| -> (u64, u64) {
        let r = ietf_remaining(res);
        assert_eq!(r[0].0, "burst");
        assert_eq!(r[1].0, "daily");
        (r[0].1, r[1].1)
    };
    for want in [(1, 4), (0, 3)] {
        let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(remaining(&res), want);
        assert_eq!(header(&res, "x-seen-count"), "2");
    }
    // Burst exhausted: rejected by "burst", and "daily" is not charged.
    for _ in 0..3 {
        let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(remaining(&res), (0, 3));
        assert_eq!(
            header(&res, X_RATELIMIT_LIMIT),
            "2",
            "the rejecting limit is reported"
        );
    }
    // Refill the burst; spend the daily quota down to zero.
    for want_daily in [2, 1, 0] {
        clock.advance(Duration::from_secs(2));
        let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(remaining(&res).1, want_daily);
    }
    // Now "daily" rejects and "burst" keeps its tokens.
    clock.advance(Duration::from_secs(2));
    for _ in 0..3 {
        let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(remaining(&res), (2, 0));
        assert_eq!(header(&res, X_RATELIMIT_LIMIT), "5");
        let body = body_json(res).await;
        assert_eq!(body["policy"], "daily");
        assert_eq!(body["retry_after"].as_u64().unwrap(), 86_400 / 5 - 8);
    }
}

#[tokio::test]
async fn allowed_response_reports_the_limit_closest_to_exhaustion() {
    let clock = ManualClock::new();
    let svc = service(
        builder(&clock, Mode::Ready)
            .limit(Limit::new("burst", Quota::per_second(10).burst(10)).key(client()))
            .limit(Limit::new("hourly", Quota::per_hour(4)).key(client())),
    );
    let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
    // burst: 9/10 left, hourly: 3/4 left, so hourly is reported.
    assert_eq!(header(&res, X_RATELIMIT_LIMIT), "4");
    assert_eq!(header(&res, X_RATELIMIT_REMAINING), "3");
    assert_eq!(header(&res, X_RATELIMIT_RESET), "900");
}

#[tokio::test]
async fn skip_predicate_exempts_requests() {
    let clock = ManualClock::new();
    let svc = service(
        builder(&clock, Mode::Ready)
            .limit(Limit::new("tiny", Quota::per_hour(1)).key(client()))
            .skip(|req: &RequestView<'_>| req.uri().path() == "/health"),
    );
    for _ in 0..3 {
        let res = svc.clone().oneshot(get("/health", "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(!res.headers().contains_key(X_RATELIMIT_LIMIT));
        assert!(res.extensions().get::<Decision>().is_none());
    }
    let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
    assert_eq!(header(&res, X_RATELIMIT_REMAINING), "0");
    let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn missing_key_default_is_400_or_500_by_cause() {
    let clock = ManualClock::new();
    // The request lacks the header the key needs: the client's fault.
    let svc = service(builder(&clock, Mode::Ready).limit(burst5()));
    let res = svc
        .clone()
        .oneshot(Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(header(&res, CONTENT_TYPE), "application/problem+json");
    assert!(!res.headers().contains_key(RETRY_AFTER));
    let body = body_json(res).await;
    assert_eq!(body["policy"], "burst");
    assert_eq!(body["type"], "urn:tollgate:problem:missing-key");
    assert!(body["detail"].as_str().unwrap().contains("x-client"));

    // No peer address: the server was started without connection info. Even a limit told to
    // answer 401 answers 500, and the body names the limit and the fix.
    for outcome in [
        MissingKey::Reject,
        MissingKey::reject_with(StatusCode::UNAUTHORIZED),
    ] {
        let svc = service(
            builder(&clock, Mode::Ready).limit(
                Limit::new("per-ip", Quota::per_second(5))
                    .key(PeerIp::new())
                    .on_missing_key(outcome),
            ),
        );
        let res = svc
            .oneshot(Request::get("/").body(()).unwrap())
            .await
            .unwrap();
        assert_eq!(
            res.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{outcome:?}"
        );
        let body = body_json(res).await;
        assert_eq!(body["policy"], "per-ip");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains("\"per-ip\""), "{body}");
        assert!(
            detail.contains("into_make_service_with_connect_info"),
            "{body}"
        );
    }
}

#[tokio::test]
async fn missing_key_reject_with_chosen_status_or_skip() {
    let clock = ManualClock::new();
    let svc = service(
        builder(&clock, Mode::Ready)
            .limit(burst5().on_missing_key(MissingKey::reject_with(StatusCode::UNAUTHORIZED))),
    );
    let res = svc
        .oneshot(Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let body = body_json(res).await;
    assert!(body["detail"]
        .as_str()
        .unwrap()
        .contains("missing x-client header"));

    // Skip: the per-client limit does not apply, the global one still does.
    let svc = service(
        builder(&clock, Mode::Ready)
            .limit(burst5().on_missing_key(MissingKey::Skip))
            .limit(Limit::new("global", Quota::per_second(100)).key(GlobalKey)),
    );
    let res = svc
        .clone()
        .oneshot(Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, X_RATELIMIT_LIMIT), "100");
    assert_eq!(header(&res, "x-seen-count"), "1");

    // Every limit skipped: the request passes undecided, without headers.
    let svc =
        service(builder(&clock, Mode::Ready).limit(burst5().on_missing_key(MissingKey::Skip)));
    let res = svc
        .oneshot(Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(!res.headers().contains_key(X_RATELIMIT_LIMIT));
}

#[tokio::test]
async fn cost_above_capacity_is_413_without_retry_after_and_charges_nothing() {
    let clock = ManualClock::new();
    let cost = |req: &RequestView<'_>| -> u64 {
        req.headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    };
    for mode in [Mode::Ready, Mode::Pending] {
        let svc = service(
            builder(&clock, mode)
                .ietf_headers(true)
                .response_extensions(true)
                .limit(burst5().cost(cost))
                .limit(Limit::new("global", Quota::per_second(100)).key(GlobalKey)),
        );
        let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
        assert_eq!(header(&res, X_RATELIMIT_REMAINING), "4");
        let mut req = get("/", "a");
        req.headers_mut().insert("x-cost", "6".parse().unwrap());
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(!res.headers().contains_key(RETRY_AFTER));
        assert_eq!(header(&res, X_RATELIMIT_LIMIT), "5");
        assert_eq!(header(&res, X_RATELIMIT_REMAINING), "4", "nothing charged");
        assert!(res.extensions().get::<Decision>().unwrap().is_impossible());
        let r = ietf_remaining(&res);
        assert_eq!(
            r,
            [("burst".to_owned(), 4), ("global".to_owned(), 99)],
            "nothing charged"
        );
        let body = body_json(res).await;
        assert_eq!(body["status"], 413);
        assert_eq!(body["cost"], 6);
        assert_eq!(body["limit"], 5);
        assert!(body["detail"]
            .as_str()
            .unwrap()
            .contains("can never be allowed"));
        assert!(body.get("retry_after").is_none());
        // A cost that fits still passes.
        let mut req = get("/", "a");
        req.headers_mut().insert("x-cost", "4".parse().unwrap());
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, X_RATELIMIT_REMAINING), "0");
    }
}

#[tokio::test]
async fn ietf_headers_list_every_limit() {
    let clock = ManualClock::new();
    let svc = service(
        builder(&clock, Mode::Ready)
            .ietf_headers(true)
            .limit(Limit::new("burst", Quota::per_second(1).burst(5)).key(client()))
            .limit(Limit::new("daily", Quota::per_day(5000)).key(client())),
    );
    let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
    assert_eq!(
        header(&res, RATELIMIT_POLICY),
        r#""burst";q=5;w=5, "daily";q=5000;w=86400"#
    );
    assert_eq!(
        header(&res, RATELIMIT),
        r#""burst";r=4;t=1, "daily";r=4999;t=18"#
    );
    // X- headers stay on alongside unless disabled.
    assert_eq!(header(&res, X_RATELIMIT_LIMIT), "5");

    let svc = service(
        builder(&clock, Mode::Ready)
            .ietf_headers(true)
            .x_ratelimit_headers(false)
            .limit(burst5()),
    );
    for _ in 0..5 {
        svc.clone().oneshot(get("/", "z")).await.unwrap();
    }
    let res = svc.clone().oneshot(get("/", "z")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!res.headers().contains_key(X_RATELIMIT_LIMIT));
    assert_eq!(header(&res, RATELIMIT), r#""burst";r=0;t=5"#);
    assert_eq!(header(&res, RETRY_AFTER), "1");
}

#[tokio::test]
async fn unix_reset_by_default() {
    let clock = ManualClock::new();
    let svc = service(
        RateLimitLayer::builder()
            .backend(TestBackend::new(&clock, Mode::Ready))
            .limit(burst5()),
    );
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let before = now();
    let res = svc.oneshot(get("/", "a")).await.unwrap();
    let after = now();
    let reset: u64 = header(&res, X_RATELIMIT_RESET).parse().unwrap();
    assert!(
        (before + 1..=after + 2).contains(&reset),
        "{before} {reset} {after}"
    );
}

#[tokio::test]
async fn grpc_requests_get_resource_exhausted() {
    let clock = ManualClock::new();
    let svc = service(
        builder(&clock, Mode::Ready).limit(Limit::new("rpc", Quota::per_minute(1)).key(client())),
    );
    let grpc = || {
        Request::post("/pkg.Greeter/SayHello")
            .header("x-client", "a")
            .header(CONTENT_TYPE, "application/grpc")
            .body(())
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(grpc()).await.unwrap().status(),
        StatusCode::OK
    );
    let res = svc.clone().oneshot(grpc()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, CONTENT_TYPE), "application/grpc");
    assert_eq!(header(&res, "grpc-status"), "8");
    assert_eq!(
        header(&res, "grpc-message"),
        "rate limit \"rpc\" (1/min) exhausted; retry in 60 s"
    );
    assert_eq!(header(&res, "grpc-retry-pushback-ms"), "60000");
    assert_eq!(header(&res, X_RATELIMIT_REMAINING), "0");
    assert!(res.body().is_rejection());
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    assert!(bytes.is_empty());
}

#[tokio::test]
async fn store_failure_is_503_with_retry_after() {
    let clock = ManualClock::new();
    let err = StoreError::new(StoreErrorKind::Unavailable, "connection refused")
        .with_retry_after(Duration::from_millis(2500));
    let svc = service(builder(&clock, Mode::Fail(err)).limit(burst5()));
    let res = svc.oneshot(get("/", "a")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, RETRY_AFTER), "3");
    assert!(!res.headers().contains_key(X_RATELIMIT_LIMIT));
    let body = body_json(res).await;
    assert_eq!(body["type"], "urn:tollgate:problem:limiter-unavailable");
}

#[tokio::test]
async fn custom_rejection_closure_keeps_layer_headers() {
    let clock = ManualClock::new();
    let svc = service(
        builder(&clock, Mode::Ready)
            .limit(Limit::new("tiny", Quota::per_minute(1)).key(client()))
            .rejection(|rejected: &Rejected<'_>| {
                let text = match rejected.reason() {
                    RejectReason::RateLimited { decision, .. } => {
                        format!("slow down, {} says no", decision.policy())
                    }
                    _ => String::from("no"),
                };
                let mut res = Response::new(RejectionBody::from(text));
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                res
            }),
    );
    svc.clone().oneshot(get("/", "a")).await.unwrap();
    let res = svc.oneshot(get("/", "a")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, RETRY_AFTER), "60", "added by the layer");
    assert_eq!(header(&res, X_RATELIMIT_LIMIT), "1");
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes, "slow down, tiny says no");
}
