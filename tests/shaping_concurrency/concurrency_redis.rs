//! Concurrency slots in Redis: shared between instances, given back when a body ends, and
//! leases that expire (at Redis `TIME`) when the instance holding them dies. Each test starts
//! its own `redis-server`.
//!
//! Lease expiry is Redis's own clock, which a test cannot pause: the tests use short leases
//! and wait for the state they expect (bounded), never assert on elapsed time.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::concurrency::{ConcurrencyLimitLayer, RedisSlots};
use tollgate::key::HeaderKey;
use tower::{service_fn, ServiceBuilder, ServiceExt};

use crate::harness::redis_server::RedisServer;

/// The Redis keys of the slots under the limit "api" (client keys appear only hashed in them).
fn slot_keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server.cmd(&["KEYS", "tollgate:{*}:cc:api:h.*"]);
    keys.sort();
    keys
}

/// The only slot key under the limit "api".
fn only_key(server: &RedisServer) -> String {
    let keys = slot_keys(server);
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys.into_iter().next().unwrap()
}

/// One instance: a layer with its own connection and background task.
fn instance(
    server: &RedisServer,
    max: u32,
    lease: Duration,
) -> impl tower::Service<
    Request<()>,
    Response = Response<tollgate::concurrency::ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    let slots = RedisSlots::new(redis::Client::open(server.url()).unwrap()).lease(lease);
    let layer = ConcurrencyLimitLayer::builder(max)
        .name("api")
        .key(HeaderKey::new("x-tenant").unwrap())
        .redis(slots)
        .build()
        .unwrap();
    ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
        }))
}

fn req(tenant: &str) -> Request<()> {
    Request::get("/")
        .header("x-tenant", tenant)
        .body(())
        .unwrap()
}

/// Waits (bounded) until `cond` holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

fn redis_time_us(server: &RedisServer) -> u64 {
    let t: Vec<String> = server.cmd(&["TIME"]);
    t[0].parse::<u64>().unwrap() * 1_000_000 + t[1].parse::<u64>().unwrap()
}

#[tokio::test]
async fn instances_share_slots_and_give_them_back_when_bodies_end() {
    let server = RedisServer::start();
    let one = instance(&server, 2, Duration::from_secs(30));
    let two = instance(&server, 2, Duration::from_secs(30));

    let a = one.clone().oneshot(req("acme")).await.unwrap();
    let b = two.clone().oneshot(req("acme")).await.unwrap();
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    let acme = only_key(&server);
    assert!(!acme.contains("acme"), "{acme}");
    let refused = one.clone().oneshot(req("acme")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let json: serde_json::Value =
        serde_json::from_slice(&refused.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(json["in_flight"], 2);
    // Another key is counted apart.
    let other = two.clone().oneshot(req("globex")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(server.cmd::<i64>(&["ZCARD", &acme]), 2);
    assert_eq!(slot_keys(&server).len(), 2);

    // Finishing a body on instance two frees a slot instance one can take.
    assert_eq!(b.into_body().collect().await.unwrap().to_bytes(), "ok");
    eventually("the finished request's lease is removed", || {
        server.cmd::<i64>(&["ZCARD", &acme]) == 1
    })
    .await;
    let c = one.clone().oneshot(req("acme")).await.unwrap();
    assert_eq!(c.status(), StatusCode::OK);
    drop((a, c, other));
    eventually("every lease is removed", || {
        server.cmd::<i64>(&["EXISTS", &acme]) == 0
    })
    .await;
}

#[tokio::test]
async fn live_requests_are_renewed_past_their_lease() {
    let server = RedisServer::start();
    let svc = instance(&server, 1, Duration::from_millis(150));
    let held = svc.clone().oneshot(req("acme")).await.unwrap();
    let key = only_key(&server);
    let scores: Vec<String> = server.cmd(&["ZRANGE", &key, "0", "0", "WITHSCORES"]);
    let first: f64 = scores[1].parse().unwrap();
    // Wait until Redis's clock is past the first expiry: only renewal keeps the slot.
    eventually("Redis TIME passes the first lease's expiry", || {
        redis_time_us(&server) as f64 > first + 50_000.0
    })
    .await;
    assert_eq!(
        server.cmd::<i64>(&["ZCARD", &key]),
        1,
        "renewed, still held"
    );
    let refused = svc.clone().oneshot(req("acme")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(held);
}

#[tokio::test]
async fn a_killed_instances_slots_expire_with_their_leases() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(300);
    // The instance that dies: its own runtime on its own thread, holding two slots it never
    // gives back (its responses are leaked), then shut down with its renewal task.
    let url = server.url();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let slots = RedisSlots::new(redis::Client::open(url).unwrap()).lease(lease);
            let layer = ConcurrencyLimitLayer::builder(2)
                .name("api")
                .key(HeaderKey::new("x-tenant").unwrap())
                .redis(slots)
                .build()
                .unwrap();
            let svc =
                ServiceBuilder::new()
                    .layer(layer)
                    .service(service_fn(|_req: Request<()>| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
                    }));
            for _ in 0..2 {
                let res = svc.clone().oneshot(req("acme")).await.unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                std::mem::forget(res); // a crash: no release ever runs
            }
        });
        rt.shutdown_background(); // the instance is gone: nothing renews its leases
    })
    .join()
    .unwrap();

    let key = only_key(&server);
    let scores: Vec<String> = server.cmd(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]);
    assert_eq!(scores.len(), 4, "two leases left behind: {scores:?}");
    let expiry = scores[1]
        .parse::<f64>()
        .unwrap()
        .max(scores[3].parse().unwrap()) as u64;

    let survivor = instance(&server, 2, lease);
    if redis_time_us(&server) < expiry {
        let res = survivor.clone().oneshot(req("acme")).await.unwrap();
        // Unless the leases ran out meanwhile, the dead instance's slots still count.
        if redis_time_us(&server) < expiry {
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        }
    }
    eventually("Redis TIME passes the dead leases' expiry", || {
        redis_time_us(&server) > expiry
    })
    .await;
    let a = survivor.clone().oneshot(req("acme")).await.unwrap();
    let b = survivor.clone().oneshot(req("acme")).await.unwrap();
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    let live: Vec<String> = server.cmd(&["ZRANGE", &key, "0", "-1"]);
    assert_eq!(live.len(), 2);
    assert!(
        !scores.iter().step_by(2).any(|dead| live.contains(dead)),
        "the dead leases were dropped"
    );
}

#[tokio::test]
async fn redis_down_fails_closed_or_open_as_configured() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let build = |open: bool| {
        let layer = ConcurrencyLimitLayer::builder(1)
            .redis(RedisSlots::new(redis::Client::open(url.clone()).unwrap()))
            .fail_open(open)
            .build()
            .unwrap();
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|_req: Request<()>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
            }))
    };
    let closed = build(false).oneshot(req("a")).await.unwrap();
    assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
    let open = build(true).oneshot(req("a")).await.unwrap();
    assert_eq!(open.status(), StatusCode::OK);
}

#[test]
fn redis_slots_refuse_a_queue_and_a_tiny_lease() {
    let client = || redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let err = ConcurrencyLimitLayer::builder(1)
        .redis(RedisSlots::new(client()))
        .queue(Duration::from_secs(1), 4)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "queue");
    let err = ConcurrencyLimitLayer::builder(1)
        .redis(RedisSlots::new(client()).lease(Duration::from_millis(5)))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "lease");
}

#[tokio::test]
async fn a_request_dropped_while_its_lease_is_taken_gives_the_lease_back() {
    let server = RedisServer::start();
    let svc = instance(&server, 1, Duration::from_secs(30));
    // Warm: the connection is up and the script loaded.
    let res = svc.clone().oneshot(req("t")).await.unwrap();
    let key = only_key(&server);
    let zcard = || server.cmd::<i64>(&["ZCARD", &key]);
    res.into_body().collect().await.unwrap();
    eventually("the warm-up slot is given back", || zcard() == 0).await;
    // Redis stops answering with the acquire script sent; the request's client gives up.
    server.pause();
    let dropped = tokio::time::timeout(Duration::from_millis(200), svc.clone().oneshot(req("t")));
    assert!(
        dropped.await.is_err(),
        "the call was still waiting for Redis"
    );
    // Redis resumes and runs the script: the lease it takes belongs to nobody.
    server.resume();
    eventually("the orphaned lease is given back", || zcard() == 0).await;
    let res = svc.clone().oneshot(req("t")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}
