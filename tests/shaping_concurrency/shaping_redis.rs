//! Shaping on Redis: two store instances share one schedule (the reservation is the store's
//! ordinary check at the widened tolerance), and a waiting request that is dropped gives its
//! place back through the Redis refund. The stores decide at a shared `ManualClock` (frozen),
//! so every delay is exact; the waits themselves are short real sleeps.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::clock::ManualClock;
use tollgate::key::GlobalKey;
use tollgate::rate_limit::ShapedDelay;
use tollgate::store::redis::RedisBackend;
use tollgate::store::FailurePolicy;
use tollgate::{AlgorithmKind, Limit, Quota, RateLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::harness::redis_server::RedisServer;
use crate::harness::stores;

type Body = tollgate::rate_limit::ResponseBody<Full<Bytes>>;

/// One instance: its own Redis store (own connections) under the shared `prefix`.
fn instance(
    server: &RedisServer,
    prefix: &str,
    clock: &ManualClock,
    quota: Quota,
    max_wait: Duration,
) -> impl Service<
    Request<()>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    let layer = RateLimitLayer::builder()
        .backend(
            RedisBackend::new(server.url())
                .prefix(prefix)
                .clock(clock.clone()),
        )
        .limit(
            Limit::new("shaped", quota)
                .algorithm(AlgorithmKind::Gcra)
                .key(GlobalKey)
                .on_store_error(FailurePolicy::Closed {
                    retry_after: Duration::from_secs(1),
                })
                .shape(max_wait),
        )
        .build()
        .unwrap();
    ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
        }))
}

fn delay_ms(res: &Response<Body>) -> Option<u128> {
    res.extensions()
        .get::<ShapedDelay>()
        .map(|d| d.get().as_millis())
}

#[tokio::test]
async fn two_instances_shape_to_one_schedule() {
    let server = RedisServer::start();
    let prefix = stores::prefix("shape-shared");
    let clock = ManualClock::new();
    // One every 20 ms, waiting up to 100 ms: one through and five waiting, whoever asks.
    let quota = Quota::per_second(50).burst(1);
    let one = instance(&server, &prefix, &clock, quota, Duration::from_millis(100));
    let two = instance(&server, &prefix, &clock, quota, Duration::from_millis(100));

    let mut delays = Vec::new();
    for i in 0..8 {
        let svc = if i % 2 == 0 { one.clone() } else { two.clone() };
        let res = svc.oneshot(Request::new(())).await.unwrap();
        delays.push((res.status(), delay_ms(&res)));
    }
    let ok = |ms| (StatusCode::OK, ms);
    assert_eq!(
        delays,
        [
            ok(None),
            ok(Some(20)), // instance two waits behind instance one's request
            ok(Some(40)),
            ok(Some(60)),
            ok(Some(80)),
            ok(Some(100)),
            (StatusCode::TOO_MANY_REQUESTS, None),
            (StatusCode::TOO_MANY_REQUESTS, None),
        ]
    );
}

#[tokio::test]
async fn a_dropped_waiting_request_gives_its_place_back_on_redis() {
    let server = RedisServer::start();
    let prefix = stores::prefix("shape-cancel");
    let clock = ManualClock::new();
    // One every 250 ms.
    let quota = Quota::per_second(4).burst(1);
    let one = instance(&server, &prefix, &clock, quota, Duration::from_secs(5));
    let two = instance(&server, &prefix, &clock, quota, Duration::from_secs(5));

    let first = one.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(delay_ms(&first), None);
    let state = || -> Vec<Vec<u8>> {
        let keys: Vec<String> = server.cmd(&["KEYS", &format!("{prefix}*")]);
        keys.iter().map(|k| server.cmd(&["GET", k])).collect()
    };
    let before = state();

    // The second request reserves its place (250 ms away) and waits; its client leaves.
    let mut waiting = Box::pin(one.clone().oneshot(Request::new(())));
    let polled = tokio::time::timeout(Duration::from_millis(150), &mut waiting).await;
    assert!(polled.is_err(), "still waiting for its turn");
    assert_ne!(state(), before, "the reservation reached Redis");
    drop(waiting);
    // The refund runs in the background; wait (bounded) until Redis has it.
    for _ in 0..200 {
        if state() == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(state(), before, "the reservation was given back");

    // The other instance gets the freed place: 250 ms, not 500 ms.
    let next = two.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
    assert_eq!(delay_ms(&next), Some(250));
}
