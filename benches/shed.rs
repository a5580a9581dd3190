//! Load shedding: goodput and p99 latency against offered load, with and without tollgate's
//! `LoadShedLayer`, and what a shed request costs next to a rate-limited one.
//!
//! `cargo bench --bench shed` (about two minutes) prints the tables and writes them to
//! `target/bench-report/shed.json` (section `shed`, plot `shed.svg`).
//!
//! # Method
//!
//! The backend is the one of `examples/shed.rs`, in process: 4 permits each held 50 ms (a
//! request waits for a permit, first come first served, then sleeps 50 ms in real time), so
//! 80 jobs per second. The shedder is configured as in the example (adaptive limit with its
//! defaults, `x-priority: critical` critical, everything else sheddable, a 1 s line for
//! critical requests) and never told the capacity. Load is open-loop: requests start on
//! schedule, each on its own task, every fifth critical, whatever the service does; a client
//! gives up after 2 s (its future is dropped, which also leaves the backend's queue). Each load
//! point runs [`WARM_UP`] then [`MEASURED`]; the figures are those of the requests sent in the
//! measured part: goodput is their `200`s within 2 s per second, p99 is over their `200`s
//! with the abandoned ones counted as 2 s. The two variants run one after the other at each
//! load point, in the same process, load points from 0.5x to 4x the capacity.
//!
//! The refusal cost: [`ROUNDS`] rounds, each timing [`REFUSALS`] refused requests through each
//! layer on a current-thread runtime (`ready` then `call`, the response dropped): the shedder
//! at a fixed limit of 1 with its one slot held, and a `RateLimitLayer` (one global key, the
//! in-memory store) whose one-per-hour quota is spent. The ratio is the median of each round's
//! ratio.

#[path = "common/report.rs"]
mod report;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use report::{median_ratio, Plot, Section, Table};
use tokio::sync::Semaphore;
use tollgate::key::GlobalKey;
use tollgate::load_shed::{LoadShedLayer, Priority, PriorityHeader};
use tollgate::{Limit, Quota, RateLimitLayer};
use tower::util::BoxCloneService;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

const CAPACITY: usize = 4;
const WORK: Duration = Duration::from_millis(50);
const CAPACITY_RPS: f64 = 80.0;
const LOADS: [f64; 7] = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0];
const WARM_UP: Duration = Duration::from_secs(3);
const MEASURED: Duration = Duration::from_secs(4);
const GIVE_UP: Duration = Duration::from_secs(2);
const ROUNDS: usize = 15;
const REFUSALS: usize = 20_000;

type Svc = BoxCloneService<Request<()>, StatusCode, Infallible>;

fn backend() -> impl Service<
    Request<()>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    let permits = Arc::new(Semaphore::new(CAPACITY));
    service_fn(move |_req: Request<()>| {
        let permits = permits.clone();
        async move {
            let _permit = permits.acquire().await.unwrap();
            tokio::time::sleep(WORK).await;
            Ok::<_, Infallible>(Response::new(String::from("done")))
        }
    })
}

fn shedder() -> LoadShedLayer {
    LoadShedLayer::builder()
        .priority(PriorityHeader::new("x-priority").otherwise(Priority::Sheddable))
        .queue(Priority::Critical, Duration::from_secs(1), 64)
        .build()
        .unwrap()
}

/// The backend alone, or behind a fresh shedder; answers the status once the body is dropped.
fn variant(shed: bool) -> Svc {
    if shed {
        let svc = ServiceBuilder::new().layer(shedder()).service(backend());
        BoxCloneService::new(svc.map_response(|r| r.status()))
    } else {
        BoxCloneService::new(backend().map_response(|r| r.status()))
    }
}

#[derive(Debug, Clone, Copy)]
struct Point {
    goodput: f64,
    p99_ms: f64,
    critical_ok: f64,
    shed_share: f64,
}

async fn run_point(svc: Svc, load: f64) -> Point {
    let rate = load * CAPACITY_RPS;
    let gap = Duration::from_secs_f64(1.0 / rate);
    let n = ((WARM_UP + MEASURED).as_secs_f64() * rate).round() as u32;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = start + gap * i;
        tokio::time::sleep_until(at).await;
        let critical = i % 5 == 0;
        let measured = at - start >= WARM_UP;
        let mut req = Request::get("/job");
        if critical {
            req = req.header("x-priority", "critical");
        }
        let req = req.body(()).unwrap();
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let status = tokio::time::timeout(GIVE_UP, svc.oneshot(req)).await;
            (
                measured,
                critical,
                status.map(Result::unwrap).ok(),
                sent.elapsed(),
            )
        }));
    }
    let (mut ok, mut shed, mut sent, mut critical, mut critical_ok) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut latencies = Vec::new();
    for t in tasks {
        let (measured, is_critical, status, latency) = t.await.unwrap();
        if !measured {
            continue;
        }
        sent += 1;
        critical += u64::from(is_critical);
        match status {
            Some(StatusCode::OK) => {
                ok += 1;
                critical_ok += u64::from(is_critical);
                latencies.push(latency);
            }
            Some(StatusCode::SERVICE_UNAVAILABLE) => shed += 1,
            Some(other) => panic!("unexpected status {other}"),
            None => latencies.push(GIVE_UP),
        }
    }
    latencies.sort();
    let p99 = latencies
        .get((latencies.len() * 99 / 100).min(latencies.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default();
    Point {
        goodput: ok as f64 / MEASURED.as_secs_f64(),
        p99_ms: p99.as_secs_f64() * 1e3,
        critical_ok: critical_ok as f64 / critical.max(1) as f64,
        shed_share: shed as f64 / sent.max(1) as f64,
    }
}

/// Nanoseconds per refused request through `svc` (`REFUSALS` of them).
async fn time_refusals<S>(svc: &mut S, request: impl Fn() -> Request<()>, status: StatusCode) -> f64
where
    S: Service<Request<()>, Error = Infallible>,
    S::Response: HasStatus,
{
    let requests: Vec<Request<()>> = (0..REFUSALS).map(|_| request()).collect();
    let start = Instant::now();
    for req in requests {
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(res.status(), status);
    }
    start.elapsed().as_nanos() as f64 / REFUSALS as f64
}

trait HasStatus {
    fn status(&self) -> StatusCode;
}

impl<B> HasStatus for Response<B> {
    fn status(&self) -> StatusCode {
        Response::status(self)
    }
}

async fn refusal_costs() -> (Vec<f64>, Vec<f64>) {
    let inner =
        service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) });
    let shed_layer = LoadShedLayer::builder().fixed_limit(1).build().unwrap();
    let mut shed = ServiceBuilder::new().layer(shed_layer).service(inner);
    let _held = shed.clone().oneshot(Request::new(())).await.unwrap();
    let limit =
        RateLimitLayer::new(Limit::new("hourly", Quota::per_hour(1)).key(GlobalKey)).unwrap();
    let mut limited = ServiceBuilder::new().layer(limit).service(inner);
    limited.clone().oneshot(Request::new(())).await.unwrap();
    let request = || Request::get("/job").body(()).unwrap();
    let (mut shed_ns, mut limited_ns) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            shed_ns.push(time_refusals(&mut shed, request, StatusCode::SERVICE_UNAVAILABLE).await);
            limited_ns
                .push(time_refusals(&mut limited, request, StatusCode::TOO_MANY_REQUESTS).await);
        } else {
            limited_ns
                .push(time_refusals(&mut limited, request, StatusCode::TOO_MANY_REQUESTS).await);
            shed_ns.push(time_refusals(&mut shed, request, StatusCode::SERVICE_UNAVAILABLE).await);
        }
    }
    (shed_ns, limited_ns)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut with = Vec::new();
    let mut without = Vec::new();
    for load in LOADS {
        let plain = runtime.block_on(run_point(variant(false), load));
        let shed = runtime.block_on(run_point(variant(true), load));
        eprintln!("{load}x: without {plain:?}\n      with {shed:?}");
        without.push((load, plain));
        with.push((load, shed));
    }
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (shed_ns, limited_ns) = current.block_on(refusal_costs());

    let mut section = Section::new(
        "shed",
        "Load shedding: goodput and p99 against offered load",
        "cargo bench --bench shed",
        &format!(
            "A backend of {CAPACITY} permits each held {} ms ({CAPACITY_RPS} jobs/s), in process, with and without `LoadShedLayer` (adaptive limit, its defaults, never told the capacity; every fifth request critical, the others sheddable; a 1 s line for critical requests). Open-loop load from 0.5x to 4x the capacity: requests start on schedule, each on its own task; a client gives up after {} s. Each load point runs {} s of warm-up, then {} s whose requests are counted: goodput is their `200`s per second, p99 is over their `200`s with abandoned requests counted as {} s. Both variants run at each load point, one after the other, in one run. The refusal cost: {ROUNDS} rounds of {REFUSALS} refused requests through each layer (the shedder at a fixed limit of 1 with its slot held; a `RateLimitLayer` with a spent one-per-hour quota), alternating; the ratio is the median of the rounds' ratios.",
            WORK.as_millis(),
            GIVE_UP.as_secs(),
            WARM_UP.as_secs(),
            MEASURED.as_secs(),
            GIVE_UP.as_secs(),
        ),
    );
    let mut table = Table::new(
        "Goodput (200s per second) and p99 latency of the 200s, by offered load",
        &[
            "offered load",
            "goodput without",
            "goodput with",
            "p99 without (ms)",
            "p99 with (ms)",
            "critical 200 with",
            "shed with",
        ],
    );
    for ((load, plain), (_, shed)) in without.iter().zip(&with) {
        table.row(&[
            format!("{load}x ({:.0}/s)", load * CAPACITY_RPS),
            format!("{:.1}", plain.goodput),
            format!("{:.1}", shed.goodput),
            format!("{:.0}", plain.p99_ms),
            format!("{:.0}", shed.p99_ms),
            format!("{:.1} %", 100.0 * shed.critical_ok),
            format!("{:.0} %", 100.0 * shed.shed_share),
        ]);
    }
    section.table(table);
    let mut refusals = Table::new(
        "A refused request (ns, median of the rounds)",
        &["layer", "ns per refusal"],
    );
    refusals.row(&["LoadShedLayer, 503", &format!("{:.0}", median(&shed_ns))]);
    refusals.row(&[
        "RateLimitLayer, 429",
        &format!("{:.0}", median(&limited_ns)),
    ]);
    section.table(refusals);

    let mut plot = Plot::new(
        "shed.svg",
        "Goodput and p99 against offered load (capacity 80/s)",
        "offered load (x capacity)",
        "goodput (jobs/s) / p99 (ms / 10)",
    );
    let series = |points: &[(f64, Point)], f: fn(&Point) -> f64| -> Vec<(f64, f64)> {
        points.iter().map(|(l, p)| (*l, f(p))).collect()
    };
    plot.series("goodput without", series(&without, |p| p.goodput));
    plot.series("goodput with", series(&with, |p| p.goodput));
    plot.series(
        "p99 without (ms / 10)",
        series(&without, |p| p.p99_ms / 10.0),
    );
    plot.series("p99 with (ms / 10)", series(&with, |p| p.p99_ms / 10.0));
    section.plot(plot);

    for (load, shed) in with.iter().filter(|(l, _)| *l >= 2.0) {
        section.ratio(
            "goodput with the shedder / 85 % of the capacity",
            &format!("{load}x"),
            shed.goodput / (0.85 * CAPACITY_RPS),
            1.0,
        );
        section.ratio(
            "5 x WORK / p99 with the shedder",
            &format!("{load}x"),
            5.0 * WORK.as_secs_f64() * 1e3 / shed.p99_ms,
            1.0,
        );
    }
    section.ratio(
        "rate-limit refusal / shed refusal (ns)",
        "one global key, one slot held",
        median_ratio(&limited_ns, &shed_ns),
        1.0,
    );
    section.note("Without the shedder, beyond the capacity the backend's queue grows by the excess every second until requests wait 2 s, so its p99 is the clients' 2 s patience; requests abandoned while the backend works on them waste that work, which is why goodput collapses instead of staying at the capacity. With it, the excess is refused at once with `503` and the backend works only on requests whose clients still wait.");
    section.write();
}
