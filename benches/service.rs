//! Per-request cost of the whole middleware: tollgate's [`RateLimitLayer`] against
//! `tower_governor`'s `GovernorLayer`, with the bare service as the baseline.
//!
//! Run with `cargo bench --bench service` (about two minutes); `cargo bench --bench
//! service -- peers_1k` runs one case. At the end it prints a table of nanoseconds per request
//! and the ratio tollgate / tower_governor for each case, and the headers each side writes.
//!
//! # What is measured, and why it is fair
//!
//! Every variant wraps the same inner service, a `tower::service_fn` answering an empty `200`
//! with an `axum::body::Body` (tower_governor only accepts that body type). Each variant is built
//! once, outside the measurement, and every request goes through `ServiceExt::ready` then
//! `Service::call` on that one pre-built service, and its response future is polled once (all
//! sides answer synchronously: a pending future aborts the bench). The response is checked for
//! the expected status and dropped inside the timed loop, so building and freeing headers, bodies
//! and extensions all count.
//!
//! Requests are built outside the timed loop (in chunks of [`CHUNK`]), each carrying its peer
//! address both as a plain `SocketAddr` extension (which tollgate's `PeerIp` reads without its
//! `axum` feature) and as axum's `ConnectInfo<SocketAddr>` (which tower_governor's
//! `PeerIpKeyExtractor` reads); each side does one extension lookup. Moving a request out of the
//! chunk and dropping it are inside the timed loop, and so in the baseline.
//!
//! The limit is the same on both sides: a burst so large (10^8) that no measured request is
//! refused, refilled at one unit per minute so that no peer's budget is full again before its
//! next request (tollgate's store recycles the slot of a key whose budget is full, which with a
//! fast refill would leave only a handful of keys in memory and flatter it); or, for the
//! rejected case, one request per hour, exhausted before the measurement starts. tollgate uses
//! its in-memory store and token bucket; tower_governor uses governor's keyed GCRA (a `DashMap`),
//! which admits the same requests for this quota. For 100,000 peers tollgate's key bound is
//! raised to 2^17 so that, like governor's unbounded map, it holds every peer (the bench asserts
//! it); `tollgate_default_bound` shows the default bound of exactly 100,000 keys instead, which
//! evicts a few hundred peers per round in the shards that drew more than their share.
//!
//! # Two estimates
//!
//! `mean` is criterion's estimate (the slope of time against iterations). `quiet` is the
//! fastest tenth of the timed chunks: on a machine shared with other work (a CI runner, a laptop
//! compiling), preemption inflates the mean by a different amount for each variant, while the
//! fastest chunks still show what a request costs on an otherwise idle core. Ratios are printed
//! for both, and `net` subtracts the bare service to compare the middleware alone.
//!
//! # Headers
//!
//! tollgate writes `X-RateLimit-Limit`, `-Remaining` and `-Reset` on every response by default;
//! tower_governor by default writes nothing on allowed responses (`x-ratelimit-after` and
//! `retry-after` on 429s), and with `use_headers()` writes `x-ratelimit-limit` and
//! `x-ratelimit-remaining` (no reset). So the like-for-like pairs are `tollgate` against
//! `tower_governor_headers`, and `tollgate_no_headers` against `tower_governor`.
//!
//! # Clocks
//!
//! `tollgate` and `tollgate_no_headers` use the default `SystemClock` (the OS monotonic clock,
//! what a user gets without configuring anything); `tollgate_quanta` reads `QuantaClock` (the
//! CPU's time-stamp counter, tollgate's `quanta` feature), the kind of clock governor always
//! uses, so `tollgate_quanta` against `tower_governor_headers` compares the middlewares alone.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Debug;
use std::future::Future;
use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{BenchmarkGroup, Criterion};
use http::{HeaderMap, Request, Response, StatusCode};
use tollgate::clock::{Clock, QuantaClock, SystemClock};
use tollgate::key::PeerIp;
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::store::{MemoryBackend, MemoryStore};
use tollgate::Quota;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

/// Requests built per untimed setup step, then timed together.
const CHUNK: usize = 1024;
/// The fewest requests a chunk must hold to count towards the quiet estimate (below it, reading
/// the timer would weigh on the result). Slow variants run samples shorter than a whole chunk.
const MIN_CHUNK: u64 = 64;
/// The burst of the never-refusing quota: more requests than a run sends to one peer (the most,
/// to the hot key, is about 30 million). It refills one unit per minute, so no peer's budget is
/// full again before its next request, even in an unoptimised `cargo test --benches` run: its
/// state must stay in memory (a store may forget a key whose budget is full, and tollgate's does).
/// A minute per unit and 10^8 units is as far as tollgate's exact arithmetic goes (see
/// `Quota::validate`).
const BIG_BURST: u32 = 100_000_000;
/// tollgate's key bound when every peer must stay in memory (governor never evicts).
const ROOMY_MAX_KEYS: usize = 1 << 17;

const WARM_UP: Duration = Duration::from_secs(1);
const MEASUREMENT: Duration = Duration::from_millis(2500);
const SAMPLES: usize = 50;

const BARE: &str = "bare";
const TOLLGATE: &str = "tollgate";
const TOLLGATE_NO_HEADERS: &str = "tollgate_no_headers";
const TOLLGATE_QUANTA: &str = "tollgate_quanta";
const TOLLGATE_DEFAULT_BOUND: &str = "tollgate_default_bound";
const GOVERNOR: &str = "tower_governor";
const GOVERNOR_HEADERS: &str = "tower_governor_headers";

/// One workload: how many peers, round-robin, and whether their requests pass.
#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    peers: u32,
    refused: bool,
}

const CASES: [Case; 4] = [
    Case {
        name: "hot_allowed",
        peers: 1,
        refused: false,
    },
    Case {
        name: "hot_rejected",
        peers: 1,
        refused: true,
    },
    Case {
        name: "peers_1k",
        peers: 1_000,
        refused: false,
    },
    Case {
        name: "peers_100k",
        peers: 100_000,
        refused: false,
    },
];

impl Case {
    fn expected(&self) -> StatusCode {
        if self.refused {
            StatusCode::TOO_MANY_REQUESTS
        } else {
            StatusCode::OK
        }
    }

    /// tollgate's quota for this case.
    fn quota(&self) -> Quota {
        if self.refused {
            Quota::per_hour(1)
        } else {
            Quota::per_minute(1).burst(u64::from(BIG_BURST))
        }
    }

    /// tower_governor's equivalent: one unit every `period`, `burst` at once.
    fn governor_quota(&self) -> (Duration, u32) {
        if self.refused {
            (Duration::from_secs(3600), 1)
        } else {
            (Duration::from_secs(60), BIG_BURST)
        }
    }
}

/// The inner service of every variant: an empty `200`.
async fn ok(_req: Request<()>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::empty()))
}

/// A request from peer number `peer` (`10.0.0.0` + `peer`).
fn request(peer: u32) -> Request<()> {
    let addr = SocketAddr::from((Ipv4Addr::from(0x0a00_0000 + peer), 40_000));
    let mut req = Request::new(());
    req.extensions_mut().insert(addr);
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

struct NoopWake;

impl Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

/// `ready` then `call`, driving both futures with a no-op waker: every variant answers without
/// waiting, so one poll each suffices.
#[inline]
fn call<S, B>(svc: &mut S, cx: &mut Context<'_>, req: Request<()>) -> Response<B>
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: Debug,
{
    let svc = match pin!(svc.ready()).poll(cx) {
        Poll::Ready(Ok(svc)) => svc,
        Poll::Ready(Err(e)) => panic!("service failed: {e:?}"),
        Poll::Pending => panic!("service not ready"),
    };
    match pin!(svc.call(req)).poll(cx) {
        Poll::Ready(Ok(response)) => response,
        Poll::Ready(Err(e)) => panic!("service failed: {e:?}"),
        Poll::Pending => panic!("response future pending"),
    }
}

/// One criterion sample: `iters` requests, timed in chunks.
struct Sample {
    iters: u64,
    total: Duration,
    /// Mean nanoseconds per request of each chunk of at least [`MIN_CHUNK`] requests.
    chunks: Vec<f64>,
}

/// What each benchmark measured (samples in order, warm-up first), and the headers it wrote.
#[derive(Default)]
struct Results {
    samples: BTreeMap<(&'static str, &'static str), Vec<Sample>>,
    headers: BTreeMap<(&'static str, &'static str), HeaderMap>,
    /// Peers the limiter held in memory after the measurement.
    held: BTreeMap<(&'static str, &'static str), usize>,
}

impl Results {
    /// The measurement phase: the last [`SAMPLES`] samples.
    fn measured(&self, case: &'static str, variant: &'static str) -> Option<&[Sample]> {
        let samples = self.samples.get(&(case, variant))?;
        Some(&samples[samples.len().saturating_sub(SAMPLES)..])
    }

    /// Nanoseconds per request: the least-squares slope through the origin of the measured
    /// samples, criterion's own point estimate.
    fn ns_per_request(&self, case: &'static str, variant: &'static str) -> Option<f64> {
        let (xy, xx) = self
            .measured(case, variant)?
            .iter()
            .fold((0.0, 0.0), |(xy, xx), sample| {
                let n = sample.iters as f64;
                (xy + n * sample.total.as_nanos() as f64, xx + n * n)
            });
        (xx > 0.0).then(|| xy / xx)
    }

    /// Nanoseconds per request of the fastest tenth of the measured chunks: what a request costs
    /// when no other process takes the core, which a loaded machine otherwise hides.
    fn quiet_ns_per_request(&self, case: &'static str, variant: &'static str) -> Option<f64> {
        let mut chunks: Vec<f64> = self
            .measured(case, variant)?
            .iter()
            .flat_map(|sample| sample.chunks.iter().copied())
            .collect();
        if chunks.is_empty() {
            return None;
        }
        chunks.sort_by(f64::total_cmp);
        Some(chunks[chunks.len() / 10])
    }
}

/// Benchmarks `svc` on `case`: primes it (every peer seen once, or the hot key exhausted), keeps
/// one response's headers for the report, then measures.
fn bench<S, B>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    results: &RefCell<Results>,
    case: Case,
    variant: &'static str,
    mut svc: S,
) where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: Debug,
{
    let waker = Waker::from(Arc::new(NoopWake));
    let mut cx = Context::from_waker(&waker);
    if case.refused {
        let first = call(&mut svc, &mut cx, request(0));
        assert_eq!(first.status(), StatusCode::OK, "{variant}: first request");
    } else {
        for peer in 0..case.peers {
            let response = call(&mut svc, &mut cx, request(peer));
            assert_eq!(response.status(), StatusCode::OK, "{variant}: priming");
        }
    }
    let sample = call(&mut svc, &mut cx, request(0));
    assert_eq!(sample.status(), case.expected(), "{variant}: sample");
    results
        .borrow_mut()
        .headers
        .insert((case.name, variant), sample.headers().clone());

    let expected = case.expected();
    let mut next = 1 % case.peers;
    let mut chunk = Vec::with_capacity(CHUNK);
    group.bench_function(variant, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut chunks = Vec::new();
            let mut left = iters;
            while left > 0 {
                let n = left.min(CHUNK as u64);
                left -= n;
                chunk.extend((0..n).map(|_| {
                    let req = request(next);
                    next = if next + 1 == case.peers { 0 } else { next + 1 };
                    req
                }));
                let start = Instant::now();
                for req in chunk.drain(..) {
                    let response = call(&mut svc, &mut cx, black_box(req));
                    if response.status() != expected {
                        panic!("{variant}: got {}", response.status());
                    }
                    drop(black_box(response));
                }
                let elapsed = start.elapsed();
                total += elapsed;
                if n >= MIN_CHUNK {
                    chunks.push(elapsed.as_nanos() as f64 / n as f64);
                }
            }
            results
                .borrow_mut()
                .samples
                .entry((case.name, variant))
                .or_default()
                .push(Sample {
                    iters,
                    total,
                    chunks,
                });
            total
        });
    });
}

fn tollgate_layer<C: Clock>(
    case: Case,
    headers: bool,
    max_keys: usize,
    clock: C,
) -> RateLimitLayer<MemoryStore<C>> {
    RateLimitLayer::builder()
        .limit(Limit::new("per-ip", case.quota()).key(PeerIp::new()))
        .backend(MemoryBackend::new().max_keys(max_keys).clock(clock))
        .x_ratelimit_headers(headers)
        .build()
        .expect("valid tollgate configuration")
}

/// Benchmarks one tollgate variant and checks how many peers its store kept.
fn bench_tollgate<C: Clock>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    results: &RefCell<Results>,
    case: Case,
    variant: &'static str,
    layer: RateLimitLayer<MemoryStore<C>>,
) {
    bench(group, results, case, variant, layer.layer(service_fn(ok)));
    let held = layer.store().len();
    if layer.store().max_keys() == ROOMY_MAX_KEYS {
        assert_eq!(
            held, case.peers as usize,
            "{variant}: every peer stays in memory"
        );
    }
    results.borrow_mut().held.insert((case.name, variant), held);
}

/// A `GovernorLayer` with `case`'s quota from `builder` (a macro: tower_governor's middleware
/// parameter is bounded by its own `governor` version, which this crate cannot name).
macro_rules! governor_layer {
    ($case:expr, $builder:expr) => {{
        let (period, burst) = $case.governor_quota();
        let config = $builder
            .period(period)
            .burst_size(burst)
            .finish()
            .expect("valid tower_governor configuration");
        GovernorLayer {
            config: Arc::new(config),
        }
    }};
}

fn run_case(c: &mut Criterion, results: &RefCell<Results>, case: Case) {
    let mut group = c.benchmark_group(case.name);
    group
        .warm_up_time(WARM_UP)
        .measurement_time(MEASUREMENT)
        .sample_size(SAMPLES);
    let held = |variant, n| results.borrow_mut().held.insert((case.name, variant), n);

    if case.name == "hot_allowed" {
        bench(&mut group, results, case, BARE, service_fn(ok));
    }

    let system = SystemClock::new();
    let layer = tollgate_layer(case, true, ROOMY_MAX_KEYS, system);
    bench_tollgate(&mut group, results, case, TOLLGATE, layer);
    let layer = tollgate_layer(case, false, ROOMY_MAX_KEYS, system);
    bench_tollgate(&mut group, results, case, TOLLGATE_NO_HEADERS, layer);
    let layer = tollgate_layer(case, true, ROOMY_MAX_KEYS, QuantaClock::new());
    bench_tollgate(&mut group, results, case, TOLLGATE_QUANTA, layer);
    if case.peers as usize >= MemoryBackend::DEFAULT_MAX_KEYS {
        let max_keys = MemoryBackend::DEFAULT_MAX_KEYS;
        let layer = tollgate_layer(case, true, max_keys, system);
        bench_tollgate(&mut group, results, case, TOLLGATE_DEFAULT_BOUND, layer);
    }

    let layer = governor_layer!(case, GovernorConfigBuilder::default());
    bench(
        &mut group,
        results,
        case,
        GOVERNOR,
        layer.layer(service_fn(ok)),
    );
    held(GOVERNOR, layer.config.limiter().len());

    let layer = governor_layer!(case, GovernorConfigBuilder::default().use_headers());
    let svc = layer.layer(service_fn(ok));
    bench(&mut group, results, case, GOVERNOR_HEADERS, svc);
    held(GOVERNOR_HEADERS, layer.config.limiter().len());

    group.finish();
}

fn fmt_ns(ns: Option<f64>) -> String {
    ns.map_or_else(|| String::from("-"), |ns| format!("{ns:.1}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => String::from("-"),
    }
}

const VARIANTS: [&str; 7] = [
    BARE,
    TOLLGATE,
    TOLLGATE_NO_HEADERS,
    TOLLGATE_QUANTA,
    TOLLGATE_DEFAULT_BOUND,
    GOVERNOR,
    GOVERNOR_HEADERS,
];

fn print_summary(results: &Results) {
    println!();
    println!("ns per request: mean = criterion's estimate; quiet = fastest tenth of chunks of up to 1024 requests;");
    println!("held = peers in the limiter's memory after the run");
    println!(
        "{:<13} {:<23} {:>9} {:>9} {:>8}",
        "case", "variant", "mean", "quiet", "held"
    );
    for case in CASES {
        for variant in VARIANTS {
            let mean = results.ns_per_request(case.name, variant);
            let quiet = results.quiet_ns_per_request(case.name, variant);
            let held = results.held.get(&(case.name, variant));
            if mean.is_some() {
                println!(
                    "{:<13} {:<23} {:>9} {:>9} {:>8}",
                    case.name,
                    variant,
                    fmt_ns(mean),
                    fmt_ns(quiet),
                    held.map_or_else(|| String::from("-"), usize::to_string),
                );
            }
        }
    }

    // The bare service costs the same whatever the peer: one measurement serves every case.
    let bare = results.quiet_ns_per_request("hot_allowed", BARE);
    println!();
    println!("tollgate / tower_governor (net = quiet minus the bare service; allowed cases only)");
    let row = |cells: [&str; 10]| {
        println!(
            "{:<13} | {:>6} {:>6} {:>6} | {:>6} {:>6} {:>6} | {:>6} {:>6} {:>6}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8],
            cells[9]
        );
    };
    row(["", "header", "", "", "quanta", "", "", "none", "", ""]);
    row([
        "case", "mean", "quiet", "net", "mean", "quiet", "net", "mean", "quiet", "net",
    ]);
    for case in CASES {
        let mean = |variant| results.ns_per_request(case.name, variant);
        let quiet = |variant| results.quiet_ns_per_request(case.name, variant);
        let net = |variant| match (quiet(variant), bare) {
            (Some(ns), Some(bare)) if !case.refused => Some(ns - bare),
            _ => None,
        };
        let pair = |ours, theirs| {
            [
                ratio(mean(ours), mean(theirs)),
                ratio(quiet(ours), quiet(theirs)),
                ratio(net(ours), net(theirs)),
            ]
        };
        let [a, b, c] = pair(TOLLGATE, GOVERNOR_HEADERS);
        let [d, e, f] = pair(TOLLGATE_QUANTA, GOVERNOR_HEADERS);
        let [g, h, i] = pair(TOLLGATE_NO_HEADERS, GOVERNOR);
        row([case.name, &a, &b, &c, &d, &e, &f, &g, &h, &i]);
    }
    println!(
        "header: tollgate (X-RateLimit-Limit/-Remaining/-Reset) vs tower_governor use_headers()"
    );
    println!(
        "quanta: the same, tollgate reading time from QuantaClock (the TSC, as governor does)"
    );
    println!("none:   tollgate x_ratelimit_headers(false) vs tower_governor's default");

    println!();
    println!("response headers (peer 10.0.0.0)");
    for ((case, variant), headers) in &results.headers {
        if !case.starts_with("hot_") || *variant == BARE {
            continue;
        }
        let list: Vec<String> = headers
            .iter()
            .map(|(name, value)| format!("{name}: {}", value.to_str().unwrap_or("<binary>")))
            .collect();
        println!("  {case:<13} {variant:<23} {}", list.join(", "));
    }
}

fn main() {
    // No plots: they take longer to draw than a benchmark takes to run; the table below is the report.
    let mut c = Criterion::default().without_plots().configure_from_args();
    let results = RefCell::new(Results::default());
    for case in CASES {
        run_case(&mut c, &results, case);
    }
    c.final_summary();
    // `cargo test --benches` runs every benchmark once, without `--bench`: nothing to report.
    if std::env::args().any(|arg| arg == "--bench") {
        print_summary(&results.borrow());
    }
}
