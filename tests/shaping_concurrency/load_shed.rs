//! The load shedder against a modelled backend, in tokio's paused time: a backend of
//! `capacity` permits, each held `work` (a request waits for a permit, FIFO: that queue is where
//! latency grows under overload), driven open-loop (requests start on schedule, each on its
//! own task, whatever the service does). The shedder is never told the capacity.
//!
//! Bounds asserted (paused time, so exact up to the model): under 3x overload the learned limit
//! ends between the capacity and 3x the capacity (the default tolerance
//! of 1.5 lets latency grow by half: about 1.5x), goodput is at least 90 % of the capacity and
//! the p99 latency of the 200s at most 5x `work`; from an initial limit of 1 and of 200 alike;
//! after the backend gets 5x faster (50 to 10 ms), a baseline of at most 20 ms, a p99 of at most
//! 50 ms and goodput at least 85 % of the new capacity within 10 s; after it gets 4x slower for
//! good (50 to 200 ms), goodput at least 85 % of the new capacity and p99 at most 1 s (5x) from
//! 20 s later;
//! with 20 % critical traffic at 3x, at least 99 % of the critical requests answered 200;
//! at a quarter of the capacity nothing is shed; dropped futures and bodies give every slot
//! back; a rate limit stacked outside refuses with `429` before a slot is taken.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tollgate::load_shed::{
    Adaptive, LoadShed, LoadShedLayer, LoadShedLayerBuilder, Priority, PriorityHeader,
};
use tower::util::BoxCloneService;
use tower::{service_fn, ServiceBuilder, ServiceExt};

use crate::harness::latency::quantile;

type Backend = BoxCloneService<Request<()>, Response<String>, Infallible>;

/// A backend of `capacity` permits each held `work` (changeable while it runs).
fn backend(capacity: usize, work: Arc<AtomicU64>) -> Backend {
    let permits = Arc::new(Semaphore::new(capacity));
    BoxCloneService::new(service_fn(move |_req: Request<()>| {
        let (permits, work) = (permits.clone(), work.clone());
        async move {
            let _permit = permits.acquire().await.unwrap();
            tokio::time::sleep(Duration::from_micros(work.load(Ordering::Relaxed))).await;
            Ok::<_, Infallible>(Response::new(String::from("done")))
        }
    }))
}

fn builder() -> LoadShedLayerBuilder {
    LoadShedLayer::builder()
        .priority(PriorityHeader::new("x-priority").otherwise(Priority::Sheddable))
}

#[derive(Debug, Default, Clone)]
struct Stats {
    ok: u64,
    shed: u64,
    critical: u64,
    critical_ok: u64,
    /// Latencies of the 200s.
    latencies: Vec<Duration>,
}

impl Stats {
    fn p99(&self) -> Duration {
        quantile(&self.latencies, 0.99)
    }
}

/// Sends `rate` requests per second for `duration`, every `critical_every`-th one critical,
/// each on its own task; counts those started at or after `measure_from`.
async fn drive(
    svc: &LoadShed<Backend>,
    rate: f64,
    critical_every: u64,
    duration: Duration,
    measure_from: Duration,
) -> Stats {
    let start = Instant::now();
    let gap = Duration::from_secs_f64(1.0 / rate);
    let n = (duration.as_secs_f64() * rate) as u64;
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        tokio::time::sleep_until(start + gap * i as u32).await;
        let critical = critical_every > 0 && i % critical_every == 0;
        let mut req = Request::get("/job");
        if critical {
            req = req.header("x-priority", "critical");
        }
        let req = req.body(()).unwrap();
        let measured = start.elapsed() >= measure_from;
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let res = svc.oneshot(req).await.unwrap();
            let status = res.status();
            drop(res); // the body: its slot comes back
            (measured, critical, status, sent.elapsed())
        }));
    }
    let mut stats = Stats::default();
    for t in tasks {
        let (measured, critical, status, latency) = t.await.unwrap();
        if !measured {
            continue;
        }
        stats.critical += u64::from(critical);
        match status {
            StatusCode::OK => {
                stats.ok += 1;
                stats.critical_ok += u64::from(critical);
                stats.latencies.push(latency);
            }
            StatusCode::SERVICE_UNAVAILABLE => stats.shed += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    stats
}

const WORK: Duration = Duration::from_millis(50);

fn work(d: Duration) -> Arc<AtomicU64> {
    Arc::new(AtomicU64::new(d.as_micros() as u64))
}

/// Capacity 4 at 50 ms: 80 requests per second.
const CAPACITY: usize = 4;
const CAPACITY_RPS: f64 = 80.0;

/// All requests critical (allowed the whole limit), so the limit is the concurrency admitted.
async fn overload_from(initial: u32) -> (LoadShedLayer, Stats) {
    let layer = LoadShedLayer::builder()
        .priority(Priority::Critical)
        .adaptive(Adaptive::new().initial_limit(initial).max_limit(500))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend(CAPACITY, work(WORK)));
    let secs = 15;
    let stats = drive(
        &svc,
        3.0 * CAPACITY_RPS,
        0,
        Duration::from_secs(secs),
        Duration::from_secs(5),
    )
    .await;
    (layer, stats)
}

fn check_overload(what: &str, layer: &LoadShedLayer, stats: &Stats, seconds: f64) {
    let goodput = stats.ok as f64 / seconds;
    let p99 = stats.p99();
    eprintln!(
        "{what}: limit {} baseline {:?} goodput {goodput:.1}/s ({:.0} %) p99 {p99:?} shed {}",
        layer.limit(),
        layer.baseline(),
        100.0 * goodput / CAPACITY_RPS,
        stats.shed
    );
    assert!(
        (CAPACITY as u32..=3 * CAPACITY as u32).contains(&layer.limit()),
        "{what}: limit {}",
        layer.limit()
    );
    assert!(goodput >= 0.9 * CAPACITY_RPS, "{what}: goodput {goodput}");
    assert!(p99 <= 5 * WORK, "{what}: p99 {p99:?}");
    assert!(stats.shed > 0, "{what}: 3x overload sheds");
}

#[tokio::test(start_paused = true)]
async fn the_limit_converges_to_the_capacity_from_above() {
    let (layer, stats) = overload_from(200).await;
    check_overload("from 200", &layer, &stats, 10.0);
}

#[tokio::test(start_paused = true)]
async fn the_limit_converges_to_the_capacity_from_below() {
    let (layer, stats) = overload_from(1).await;
    check_overload("from 1", &layer, &stats, 10.0);
}

#[tokio::test(start_paused = true)]
async fn the_limit_recovers_after_the_backend_speeds_up() {
    let layer = builder().build().unwrap();
    let work_us = work(WORK);
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend(CAPACITY, work_us.clone()));
    // Slow for 10 s, then 5x faster: 400/s of capacity, offered 3x that throughout.
    let speed_up = {
        let work_us = work_us.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            work_us.store(10_000, Ordering::Relaxed);
        })
    };
    let stats = drive(
        &svc,
        1200.0,
        0,
        Duration::from_secs(20),
        Duration::from_secs(12),
    )
    .await;
    speed_up.await.unwrap();
    let goodput = stats.ok as f64 / 8.0;
    eprintln!(
        "after the speed-up: limit {} baseline {:?} goodput {goodput:.0}/s p99 {:?}",
        layer.limit(),
        layer.baseline(),
        stats.p99()
    );
    let baseline = layer.baseline().unwrap();
    assert!(baseline <= Duration::from_millis(20), "{baseline:?}");
    assert!(goodput >= 0.85 * 400.0, "goodput {goodput}");
    assert!(
        stats.p99() <= Duration::from_millis(50),
        "{:?}",
        stats.p99()
    );
}

#[tokio::test(start_paused = true)]
async fn the_limit_recovers_after_the_backend_slows_down() {
    let layer = builder().build().unwrap();
    let work_us = work(WORK);
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend(CAPACITY, work_us.clone()));
    // Fast for 5 s, then 4x slower for good (200 ms: 20/s of capacity), offered 60/s.
    let slow_down = {
        let work_us = work_us.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            work_us.store(200_000, Ordering::Relaxed);
        })
    };
    let stats = drive(
        &svc,
        60.0,
        0,
        Duration::from_secs(40),
        Duration::from_secs(25),
    )
    .await;
    slow_down.await.unwrap();
    let goodput = stats.ok as f64 / 15.0;
    eprintln!(
        "after the slow-down: limit {} baseline {:?} goodput {goodput:.1}/s p99 {:?}",
        layer.limit(),
        layer.baseline(),
        stats.p99()
    );
    assert!(goodput >= 0.85 * 20.0, "goodput {goodput}");
    assert!(stats.p99() <= Duration::from_secs(1), "{:?}", stats.p99());
}

#[tokio::test(start_paused = true)]
async fn critical_traffic_is_kept_while_the_rest_is_shed() {
    let layer = builder()
        .queue(Priority::Critical, Duration::from_millis(500), 64)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend(CAPACITY, work(WORK)));
    let stats = drive(
        &svc,
        3.0 * CAPACITY_RPS,
        5,
        Duration::from_secs(15),
        Duration::from_secs(5),
    )
    .await;
    let goodput = stats.ok as f64 / 10.0;
    eprintln!(
        "20 % critical: limit {} critical {}/{} goodput {goodput:.1}/s p99 {:?} shed {}",
        layer.limit(),
        stats.critical_ok,
        stats.critical,
        stats.p99(),
        stats.shed
    );
    assert!(stats.critical_ok * 100 >= stats.critical * 99, "{stats:?}");
    assert!(goodput >= 0.9 * CAPACITY_RPS, "goodput {goodput}");
    assert!(stats.p99() <= 5 * WORK, "p99 {:?}", stats.p99());
    assert!(stats.shed >= stats.ok, "about two thirds are shed");
}

#[tokio::test(start_paused = true)]
async fn light_load_sheds_nothing() {
    let layer = builder().build().unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend(CAPACITY, work(WORK)));
    let stats = drive(
        &svc,
        CAPACITY_RPS / 4.0,
        5,
        Duration::from_secs(20),
        Duration::ZERO,
    )
    .await;
    assert_eq!(stats.shed, 0, "{stats:?}");
    assert_eq!(stats.ok, 400);
    assert_eq!(layer.limit(), 20, "light load teaches nothing");
}

#[tokio::test(start_paused = true)]
async fn cancelled_requests_and_dropped_bodies_give_their_slots_back() {
    let layer = builder()
        .fixed_limit(4)
        .queue(Priority::Critical, Duration::from_secs(10), 8)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend(1, work(Duration::from_secs(3600))));
    let critical = || {
        Request::get("/")
            .header("x-priority", "critical")
            .body(())
            .unwrap()
    };
    // Four running (hung in the backend), four waiting in line; all given up after 1 s.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        tasks.push(tokio::spawn(svc.clone().oneshot(critical())));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(layer.in_flight(), 4);
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.unwrap_err().is_cancelled());
    }
    assert_eq!(layer.in_flight(), 0);
    // The slots are free again: a fast backend answers all four.
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend(4, work(Duration::from_millis(1))));
    for _ in 0..4 {
        let res = svc.clone().oneshot(critical()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        std::mem::forget(res); // never dropped: the slot stays taken
    }
    assert_eq!(layer.in_flight(), 4);
    // Every slot is held: even a critical request is refused.
    assert_eq!(
        svc.clone().oneshot(critical()).await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test(start_paused = true)]
async fn rate_limits_stacked_outside_refuse_before_a_slot_is_taken() {
    use tollgate::key::GlobalKey;
    use tollgate::{Limit, Quota, RateLimitLayer};

    let shed = LoadShedLayer::builder().fixed_limit(1).build().unwrap();
    let rate = RateLimitLayer::new(Limit::new("burst", Quota::per_hour(1)).key(GlobalKey)).unwrap();
    let svc = ServiceBuilder::new()
        .layer(rate)
        .layer(shed.clone())
        .service(backend(1, work(Duration::from_millis(1))));
    let running = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(running.status(), StatusCode::OK);
    assert_eq!(shed.in_flight(), 1); // the body is not dropped yet
                                     // Over its quota: 429 from the rate limit, and the shedder never saw it.
    let refused = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(shed.in_flight(), 1);
    drop(running);
    assert_eq!(shed.in_flight(), 0);
}
