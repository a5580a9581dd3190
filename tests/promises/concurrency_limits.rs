//! Concurrency limits: a `RedisSlots` layer keeps its limit, and gives finished requests' slots
//! back, in every tokio runtime it is used from (issue 28, item 6); every duration knob is
//! bounded when the layer is built and never panics at run time (item 7); slot keys in Redis hold
//! no client key in clear and have a bounded length (item 8).
//!
//! The Redis tests start their own `redis-server` on a free loopback port. Lease expiry is
//! Redis's own clock, which a test cannot pause: those tests use real time, bounded.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::concurrency::{ConcurrencyLimitLayer, RedisSlots};
use tollgate::key::HeaderKey;
use tower::{service_fn, ServiceBuilder, ServiceExt};

use crate::harness::redis_server::RedisServer;

/// Requests running in the inner service now, the most seen at once, and how long each runs.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    peak: AtomicUsize,
    hold_ms: AtomicU64,
}

/// The layer around a handler that runs for `gauge.hold_ms` and counts itself in `gauge`.
fn gauged(
    layer: ConcurrencyLimitLayer,
    gauge: Arc<Gauge>,
) -> impl tower::Service<
    Request<()>,
    Response = Response<tollgate::concurrency::ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |_req: Request<()>| {
            let gauge = Arc::clone(&gauge);
            async move {
                let n = gauge.now.fetch_add(1, Ordering::SeqCst) + 1;
                gauge.peak.fetch_max(n, Ordering::SeqCst);
                let hold = gauge.hold_ms.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(hold)).await;
                gauge.now.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
            }
        }))
}

fn tenant(t: &str) -> Request<()> {
    Request::get("/").header("x-tenant", t).body(()).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// One request served (200, body read) in a first runtime, which is then dropped.
fn serve_one_in_a_dropped_runtime<S>(svc: &S)
where
    S: tower::Service<
            Request<()>,
            Response = Response<tollgate::concurrency::ResponseBody<Full<Bytes>>>,
            Error = Infallible,
        > + Clone,
{
    let first = runtime();
    first.block_on(async {
        let res = svc.clone().oneshot(tenant("acme")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.into_body().collect().await.unwrap();
    });
    drop(first);
}

fn redis_layer(
    server: &RedisServer,
    max: u32,
    lease: Duration,
    open: bool,
) -> ConcurrencyLimitLayer {
    ConcurrencyLimitLayer::builder(max)
        .name("api")
        .key(HeaderKey::new("x-tenant").unwrap())
        .redis(RedisSlots::new(redis::Client::open(server.url()).unwrap()).lease(lease))
        .fail_open(open)
        .build()
        .unwrap()
}

/// Item 6: the layer is used in a first runtime, which is then dropped; in a second runtime, 10
/// clients each retry (every 20 ms) until one request of theirs is served, each request running
/// 800 ms (twice the 400 ms lease: only renewal keeps a slot). With `fail_open(true)`, a slot
/// store that fails lets everyone in, and a lease no longer renewed expires while its request
/// runs: either shows in the peak.
#[test]
fn redis_slots_keep_their_limit_after_the_first_runtime_is_gone() {
    let server = RedisServer::start();
    let max = 2;
    let clients = 10;
    let layer = redis_layer(&server, max, Duration::from_millis(400), true);
    let gauge = Arc::new(Gauge::default());
    let svc = gauged(layer, Arc::clone(&gauge));

    gauge.hold_ms.store(1, Ordering::SeqCst);
    serve_one_in_a_dropped_runtime(&svc);

    gauge.hold_ms.store(800, Ordering::SeqCst);
    gauge.peak.store(0, Ordering::SeqCst);
    let second = runtime();
    let started = Instant::now();
    let (served, refused) = second.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let svc = svc.clone();
            tasks.push(tokio::spawn(async move {
                let mut refused = 0u32;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
                while tokio::time::Instant::now() < deadline {
                    let res = svc.clone().oneshot(tenant("acme")).await.unwrap();
                    if res.status() == StatusCode::OK {
                        res.into_body().collect().await.unwrap();
                        return (true, refused);
                    }
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (false, refused)
            }));
        }
        let mut served = 0;
        let mut refused = 0;
        for t in tasks {
            let (ok, r) = t.await.unwrap();
            served += usize::from(ok);
            refused += r;
        }
        (served, refused)
    });
    drop(second);
    let peak = gauge.peak.load(Ordering::SeqCst);
    println!(
        "item 6, second runtime: peak {peak} in flight (max {max}); {served} of {clients} clients served, {refused} refusals, in {:?}",
        started.elapsed()
    );
    assert!(
        peak <= max as usize,
        "{peak} requests in flight at once, max {max}"
    );
    assert_eq!(
        served, clients,
        "every client is served as slots are given back"
    );
}

/// Item 6: finished requests give their slots back in a runtime other than the first: with
/// 30 s leases, slots that are not given back would refuse every later wave for 30 s.
#[test]
fn redis_slots_are_given_back_after_the_first_runtime_is_gone() {
    let server = RedisServer::start();
    let layer = redis_layer(&server, 2, Duration::from_secs(30), false);
    let gauge = Arc::new(Gauge::default());
    let svc = gauged(layer, Arc::clone(&gauge));
    gauge.hold_ms.store(1, Ordering::SeqCst);

    serve_one_in_a_dropped_runtime(&svc);

    let waves = 5;
    let second = runtime();
    let admitted_waves = second.block_on(async {
        let mut admitted_waves = 0;
        for _ in 0..waves {
            // Each wave of two is admitted within 1 s of the previous one finishing (its slots
            // given back), or never.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
            let wave = loop {
                let a = svc.clone().oneshot(tenant("acme")).await.unwrap();
                let b = svc.clone().oneshot(tenant("acme")).await.unwrap();
                if (a.status(), b.status()) == (StatusCode::OK, StatusCode::OK) {
                    // Both slots held: a third is refused.
                    let c = svc.clone().oneshot(tenant("acme")).await.unwrap();
                    assert_eq!(c.status(), StatusCode::TOO_MANY_REQUESTS);
                    break Some((a, b));
                }
                if tokio::time::Instant::now() >= deadline {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let Some((a, b)) = wave else { break };
            admitted_waves += 1;
            a.into_body().collect().await.unwrap();
            b.into_body().collect().await.unwrap();
        }
        admitted_waves
    });
    println!(
        "item 6, second runtime: {admitted_waves} of {waves} waves of 2 admitted (30 s leases)"
    );
    assert_eq!(
        admitted_waves, waves,
        "finished requests' slots were not given back"
    );
}

/// What a configuration gave: an error naming `field`, a working layer, or a panic.
#[derive(Debug, PartialEq)]
enum Outcome {
    Error(&'static str),
    Works,
    Broken(String),
}

/// A queued layer (`max_wait`, 10 waiting) under paused time: one request holds the only slot,
/// a second queues; when the first finishes the second is served (or, if `max_wait` ran out
/// first, refused with 429). Either is a working layer; a panic is not.
async fn queue_outcome(max_wait: Duration) -> Outcome {
    let layer = match ConcurrencyLimitLayer::builder(1)
        .queue(max_wait, 10)
        .build()
    {
        Ok(layer) => layer,
        Err(e) => return Outcome::Error(e.field()),
    };
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
        }));
    let held = svc.clone().oneshot(Request::new(())).await.unwrap();
    let queued = tokio::spawn(svc.clone().oneshot(Request::new(())));
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(held);
    match queued.await {
        Ok(Ok(res)) if matches!(res.status(), StatusCode::OK | StatusCode::TOO_MANY_REQUESTS) => {
            Outcome::Works
        }
        Ok(Ok(res)) => Outcome::Broken(format!("status {}", res.status())),
        Ok(Err(never)) => match never {},
        Err(e) if e.is_panic() => Outcome::Broken("panicked".into()),
        Err(e) => Outcome::Broken(e.to_string()),
    }
}

/// Item 7, the queue's `max_wait`: `Duration::ZERO` and `Duration::MAX` (and just past the bound)
/// are errors naming the field; the longest accepted wait and a 1 ns wait make working layers.
#[tokio::test(start_paused = true)]
async fn queue_max_wait_is_bounded_at_build_time_and_never_panics() {
    let cases = [
        (Duration::ZERO, Outcome::Error("queue.max_wait")),
        (Duration::MAX, Outcome::Error("queue.max_wait")),
        (
            Duration::from_secs(3600) + Duration::from_nanos(1),
            Outcome::Error("queue.max_wait"),
        ),
        (Duration::from_secs(3600), Outcome::Works),
        (Duration::from_nanos(1), Outcome::Works),
    ];
    let mut wrong = Vec::new();
    for (max_wait, want) in cases {
        let got = queue_outcome(max_wait).await;
        println!("item 7: queue({max_wait:?}, 10) -> {got:?}");
        if got != want {
            wrong.push(format!("queue({max_wait:?}): {got:?}, want {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Item 7, the Redis lease: `Duration::ZERO` and `Duration::MAX` (and just past the bound) are
/// errors naming the field; the longest accepted lease makes a working layer against a real
/// `redis-server` (one slot: the first request is served, a second refused).
#[tokio::test]
async fn redis_lease_is_bounded_at_build_time() {
    let server = RedisServer::start();
    let cases = [
        (Duration::ZERO, Outcome::Error("lease")),
        (Duration::MAX, Outcome::Error("lease")),
        (
            Duration::from_secs(3600) + Duration::from_nanos(1),
            Outcome::Error("lease"),
        ),
        (Duration::from_secs(3600), Outcome::Works),
        (Duration::from_millis(30), Outcome::Works),
    ];
    let mut wrong = Vec::new();
    for (n, (lease, want)) in cases.into_iter().enumerate() {
        let built = ConcurrencyLimitLayer::builder(1)
            .name(format!("lease{n}"))
            .redis(RedisSlots::new(redis::Client::open(server.url()).unwrap()).lease(lease))
            .build();
        let got = match built {
            Err(e) => Outcome::Error(e.field()),
            Ok(layer) => {
                let svc = ServiceBuilder::new().layer(layer).service(service_fn(
                    |_req: Request<()>| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
                    },
                ));
                let first = svc.clone().oneshot(Request::new(())).await.unwrap();
                let second = svc.clone().oneshot(Request::new(())).await.unwrap();
                match (first.status(), second.status()) {
                    (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS) => Outcome::Works,
                    other => Outcome::Broken(format!("statuses {other:?}")),
                }
            }
        };
        println!("item 7: RedisSlots::lease({lease:?}) -> {got:?}");
        if got != want {
            wrong.push(format!("lease({lease:?}): {got:?}, want {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Every key in the server, by `SCAN`.
fn scan_all(server: &RedisServer) -> Vec<Vec<u8>> {
    let mut conn = server.conn();
    let mut cursor = 0u64;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn)
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// Item 8: slot keys after requests keyed by an API key and by a 1 MB header value (both held in
/// flight, so both keys exist): `SCAN` finds no key holding the API key or the header's bytes,
/// and every key name is at most 77 bytes (the default prefix `tollgate` and name
/// `concurrency`: `tollgate:{<16 hex>}:cc:concurrency:h.<32 hex>`).
#[tokio::test]
async fn slot_keys_hold_no_client_key_in_clear_and_stay_short() {
    const SECRET: &str = "sk_live_SECRET_api_key_123";
    const BOUND: usize = 77;
    let server = RedisServer::start();
    let layer = ConcurrencyLimitLayer::builder(4)
        .key(
            HeaderKey::new("x-api-key")
                .unwrap()
                .max_len(2 << 20)
                .unwrap(),
        )
        .redis(RedisSlots::new(redis::Client::open(server.url()).unwrap()))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
        }));
    let big = "m".repeat(1 << 20);
    let with_key = |value: &str| {
        Request::get("/")
            .header("x-api-key", value)
            .body(())
            .unwrap()
    };
    let secret = svc.clone().oneshot(with_key(SECRET)).await.unwrap();
    let huge = svc.clone().oneshot(with_key(&big)).await.unwrap();
    assert_eq!(
        (secret.status(), huge.status()),
        (StatusCode::OK, StatusCode::OK)
    );

    let keys = scan_all(&server);
    let longest = keys.iter().map(Vec::len).max().unwrap_or(0);
    let leaking = keys
        .iter()
        .filter(|k| {
            let k = String::from_utf8_lossy(k);
            k.contains("sk_live") || k.contains("SECRET") || k.contains("mmmmmmmm")
        })
        .count();
    println!(
        "item 8: {} keys, {leaking} holding a client key in clear, longest {longest} bytes (bound {BOUND}); e.g. {:?}",
        keys.len(),
        keys.iter()
            .map(|k| String::from_utf8_lossy(&k[..k.len().min(100)]).into_owned())
            .collect::<Vec<_>>()
    );
    assert_eq!(keys.len(), 2, "one slot set per client key in flight");
    assert_eq!(leaking, 0, "client keys in clear in Redis");
    assert!(longest <= BOUND, "a key name of {longest} bytes");
    drop((secret, huge));
}
