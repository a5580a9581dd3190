//! Nested layers, and the specialised steps of a one-limit layer against the general ones.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceBuilder, ServiceExt};

use super::test_store::{Mode, TestBackend};
use super::*;
use crate::clock::ManualClock;
use crate::headers::{RATELIMIT, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING};
use crate::key::GlobalKey;
use crate::{Decision, Quota, RequestView};

/// `handler` behind the layer `inner` builds, itself behind the one `outer` builds.
fn nested(
    outer: RateLimitLayerBuilder<TestBackend>,
    inner: RateLimitLayerBuilder<TestBackend>,
) -> impl Service<
    Request<()>,
    Response = Response<ResponseBody<ResponseBody<Full<Bytes>>>>,
    Error = Infallible,
    Future: Send,
> + Clone {
    ServiceBuilder::new()
        .layer(outer.build().unwrap())
        .layer(inner.build().unwrap())
        .service_fn(handler)
}

#[tokio::test]
async fn nested_layers_report_the_most_pressing_decision() {
    let clock = ManualClock::new();
    let svc = nested(
        builder(&clock, Mode::Ready)
            .ietf_headers(true)
            .limit(Limit::new("global", Quota::per_second(3)).key(GlobalKey)),
        builder(&clock, Mode::Ready)
            .ietf_headers(true)
            .limit(Limit::new("route", Quota::per_second(10)).key(client())),
    );
    let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
    // global 2/3 is tighter than route 9/10.
    assert_eq!(header(&res, X_RATELIMIT_LIMIT), "3");
    assert_eq!(header(&res, X_RATELIMIT_REMAINING), "2");
    assert_eq!(
        header(&res, "x-seen-remaining"),
        "2",
        "handler sees the tightest"
    );
    assert_eq!(header(&res, "x-seen-count"), "2");
    let lines: Vec<_> = res.headers().get_all(RATELIMIT).iter().collect();
    assert_eq!(lines, [r#""route";r=9;t=1"#, r#""global";r=2;t=1"#]);
    assert_eq!(
        res.extensions().get::<Decision>().map(Decision::limit),
        Some(3),
        "the nested layer's response carries its decision, the outer one replaces it"
    );
}

#[tokio::test]
async fn a_nested_layer_tighter_than_the_outer_one_keeps_its_headers() {
    let clock = ManualClock::new();
    let svc = nested(
        builder(&clock, Mode::Ready)
            .limit(Limit::new("global", Quota::per_second(100)).key(GlobalKey)),
        builder(&clock, Mode::Ready).limit(Limit::new("route", Quota::per_second(2)).key(client())),
    );
    for remaining in ["1", "0"] {
        let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        // route 1/2 (then 0/2) is tighter than global 99/100 (then 98/100): the outer layer
        // must not overwrite the inner one's headers.
        assert_eq!(header(&res, X_RATELIMIT_LIMIT), "2");
        assert_eq!(header(&res, X_RATELIMIT_REMAINING), remaining);
        assert_eq!(
            res.extensions().get::<Decision>().map(Decision::policy),
            Some(crate::Name::new("route"))
        );
    }
    let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, X_RATELIMIT_LIMIT), "2");
    assert!(!res.extensions().get::<Decision>().unwrap().allowed());
}

#[tokio::test]
async fn a_nested_layer_of_shadow_limits_only_keeps_its_tighter_headers() {
    let clock = ManualClock::new();
    let svc = nested(
        builder(&clock, Mode::Ready)
            .limit(Limit::new("global", Quota::per_second(100)).key(GlobalKey)),
        builder(&clock, Mode::Ready).limit(
            Limit::new("trial", Quota::per_second(2))
                .key(client())
                .mode(crate::rate_limit::Mode::Shadow { headers: true }),
        ),
    );
    for remaining in ["1", "0", "0"] {
        let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "a shadow limit never refuses");
        // trial's 1/2, then 0/2, is tighter than global's 99/100: the outer layer keeps it.
        assert_eq!(header(&res, X_RATELIMIT_LIMIT), "2");
        assert_eq!(header(&res, X_RATELIMIT_REMAINING), remaining);
    }
}

/// A layer of one plain limit takes the steps specialised for it (`begin_with::<1, true>`, the
/// branches of `when`, plans, shadow mode, charge by outcome and shaping left out); the same
/// limit with a `when` that always holds takes the general ones (`begin_with::<1, false>`).
/// They must answer alike: statuses, headers and bodies, with a store that answers at once and
/// one that answers later.
#[tokio::test]
async fn the_short_path_decides_as_the_general_one() {
    use crate::key::Key;
    use crate::rate_limit::Override;
    let cost = |req: &RequestView<'_>| -> u64 {
        req.headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    };
    for pending in [false, true] {
        let mode = || if pending { Mode::Pending } else { Mode::Ready };
        let clock = ManualClock::new();
        let limit = || burst5().cost(cost);
        let layers = [
            builder(&clock, mode()).limit(limit()).build().unwrap(),
            builder(&clock, mode())
                .limit(limit().when(|_| true))
                .build()
                .unwrap(),
        ];
        for layer in &layers {
            let big = Override::Quota(Quota::per_second(1).burst(50));
            layer
                .set_override("burst", Key::string("big"), big, "t")
                .unwrap();
            let blocked = Key::string("blocked");
            layer
                .set_override("burst", blocked, Override::Block, "t")
                .unwrap();
            let exempt = Key::string("exempt");
            layer
                .set_override("burst", exempt, Override::Exempt, "t")
                .unwrap();
        }
        let svcs = layers.map(|l| ServiceBuilder::new().layer(l).service_fn(handler));
        let requests: [(Option<&str>, u64); 14] = [
            (Some("a"), 1),
            (Some("a"), 2),
            (Some("a"), 6), // above the capacity: 413, nothing charged
            (Some("a"), 2),
            (Some("a"), 1), // refused: 429
            (Some("big"), 20),
            (Some("big"), 40), // above what is left of the override's 50: 429
            (Some("blocked"), 1),
            (Some("exempt"), 100),
            (None, 1), // no key
            (Some("b"), 0),
            (Some("a"), 1),
            (Some("b"), 5),
            (Some("b"), 1),
        ];
        let mut statuses = Vec::new();
        for (i, (client, cost)) in requests.into_iter().enumerate() {
            if i == 11 {
                clock.advance(Duration::from_millis(1500));
            }
            let mut seen = Vec::new();
            for svc in &svcs {
                let mut req = Request::get("/").body(()).unwrap();
                if let Some(client) = client {
                    req.headers_mut()
                        .insert("x-client", client.parse().unwrap());
                }
                req.headers_mut().insert("x-cost", cost.into());
                let res = svc.clone().oneshot(req).await.unwrap();
                let mut headers: Vec<String> = res
                    .headers()
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap()))
                    .collect();
                headers.sort();
                let status = res.status();
                let body = res.into_body().collect().await.unwrap().to_bytes();
                seen.push((status, headers, body));
            }
            assert_eq!(
                seen[0], seen[1],
                "request {i} ({client:?}, cost {cost}), pending {pending}"
            );
            statuses.push(seen[0].0);
        }
        for status in [
            StatusCode::OK,
            StatusCode::PAYLOAD_TOO_LARGE,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::FORBIDDEN,
        ] {
            assert!(statuses.contains(&status), "{status} among {statuses:?}");
        }
    }
}
