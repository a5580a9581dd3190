//! Per-request cost of the whole middleware: tollgate's [`RateLimitLayer`] against
//! `tower_governor`'s `GovernorLayer`, with the bare service as the baseline.
//!
//! `cargo bench --bench service` (about a minute) prints a table of nanoseconds per request and
//! writes it to `target/bench-report/layer.json` (section `layer`, plot `layer.svg`).
//!
//! # Method
//!
//! Every variant wraps the same inner service, a `tower::service_fn` answering an empty `200`
//! with an `axum::body::Body` (tower_governor only accepts that body type), and is built once.
//! Every request goes through `ServiceExt::ready` then `Service::call` on that one service, and
//! its response future is polled once (all sides answer synchronously: a pending future aborts
//! the bench). The response's status is checked and the response dropped inside the timed loop,
//! so building and freeing headers, bodies and extensions all count. Requests are built outside
//! the timed loop, in chunks of [`CHUNK`], each carrying its peer address both as a plain
//! `SocketAddr` extension (which tollgate's `PeerIp` reads) and as axum's
//! `ConnectInfo<SocketAddr>` (which tower_governor's `PeerIpKeyExtractor` reads).
//!
//! Peers: 1,000 addresses visited in pseudo-random order (`splitmix64(counter) % 1000`), every
//! one seen once before the rounds start. The allowed cases use a quota no measured request
//! exhausts (a burst of 9 999, one unit a minute back) on both sides; the rejected cases one
//! request per hour, spent before the rounds. Both sides use their defaults otherwise:
//! tollgate's in-memory store (default clock, default bound) and its default headers
//! (`X-RateLimit-Limit`, `-Remaining`, `-Reset`); tower_governor with `use_headers()`
//! (`x-ratelimit-limit`, `-remaining`; no reset), or its default (no headers on allowed
//! responses).
//!
//! Each of [`ROUNDS`] rounds times every variant once ([`REQUESTS`] requests), in an order that
//! rotates from round to round, so that drift on a shared machine hits every variant alike; a
//! time is the median over the rounds, and a ratio the median over the rounds of that round's
//! ratio (a round the machine ran slow for both sides counts once, as one ratio).
//!
//! # Cases
//!
//! - allowed: tollgate with headers against tower_governor with `use_headers()` (the headline),
//!   and each without headers;
//! - rejected: tollgate's 429 (problem+json body, `Retry-After`, headers) against its allowed
//!   request (target: at most twice), and tower_governor's 429;
//! - limits: N = 1 to 4 limits (each its own name and quota, keyed by peer) in one tollgate layer
//!   against N stacked tollgate layers of one limit each, and N stacked `GovernorLayer`s.

#[path = "common/report.rs"]
mod report;

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
use http::{Request, Response, StatusCode};
use report::{Plot, Section, Table};
use tollgate::key::PeerIp;
use tollgate::rate_limit::{Limit, RateLimitLayer};
use tollgate::Quota;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

/// Requests built per untimed setup step, then timed together.
const CHUNK: usize = 1024;
/// Requests timed per variant and round.
const REQUESTS: usize = 14 * CHUNK;
/// Rounds; figures are medians over them. Many short rounds rather than a few long ones: this
/// VM's speed drifts within seconds, and each variant then samples every phase of it.
const ROUNDS: usize = 45;
/// Peers, visited in pseudo-random order.
const PEERS: u64 = 1_000;
/// The never-refusing quota's burst (see the module docs): more than one peer's requests in a
/// run (about 650), and a realistic API limit (tollgate writes numbers below 10 000 from a static
/// table, larger ones it formats or takes from a per-thread cache).
const BIG_BURST: u32 = 9_999;

/// The inner service of every variant: an empty `200`.
async fn ok(_req: Request<()>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::empty()))
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A request from peer number `peer` (`10.0.0.0` + `peer`).
fn request(peer: u64) -> Request<()> {
    let addr = SocketAddr::from((Ipv4Addr::from(0x0a00_0000 + peer as u32), 40_000));
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

/// Answers a chunk of requests (draining it) and says how long the answering took.
type Run = Box<dyn FnMut(&mut Vec<Request<()>>) -> Duration>;

/// One variant: a service behind a closure that answers a chunk of requests and says how long
/// the answering took.
struct Variant {
    name: String,
    run: Run,
    /// The headers of one response, for the report.
    headers: String,
}

/// Whether the variant `name` runs: every one, or with `--only NAME[,NAME...]` (for a
/// profiler) those and the bare service (a name with a comma in it: alone, as the whole argument).
fn wanted(name: &str) -> bool {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--only") {
        Some(at) => {
            args.get(at + 1)
                .is_some_and(|only| only == name || only.split(',').any(|o| o == name))
                || name == "bare"
        }
        None => true,
    }
}

/// Wraps `svc`, primes it (every peer once; for a refusing quota, every peer's one request),
/// and keeps one response's headers.
fn variant<S, B>(name: &str, mut svc: S, expected: StatusCode) -> Variant
where
    S: Service<Request<()>, Response = Response<B>> + 'static,
    S::Error: Debug,
    B: 'static,
{
    if !wanted(name) {
        return Variant {
            name: name.to_string(),
            run: Box::new(|_| Duration::ZERO),
            headers: String::new(),
        };
    }
    let waker = Waker::from(Arc::new(NoopWake));
    let mut cx = Context::from_waker(&waker);
    for peer in 0..PEERS {
        let response = call(&mut svc, &mut cx, request(peer));
        assert_eq!(response.status(), StatusCode::OK, "{name}: priming");
    }
    let sample = call(&mut svc, &mut cx, request(0));
    assert_eq!(sample.status(), expected, "{name}: sample");
    let mut headers: Vec<String> = sample
        .headers()
        .iter()
        .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("?")))
        .collect();
    headers.sort();
    let label = name.to_string();
    Variant {
        name: name.to_string(),
        headers: headers.join("; "),
        run: Box::new(move |chunk: &mut Vec<Request<()>>| {
            let waker = Waker::from(Arc::new(NoopWake));
            let mut cx = Context::from_waker(&waker);
            let start = Instant::now();
            for req in chunk.drain(..) {
                let response = call(&mut svc, &mut cx, black_box(req));
                if response.status() != expected {
                    panic!("{label}: got {}", response.status());
                }
                drop(black_box(response));
            }
            start.elapsed()
        }),
    }
}

fn allowed_quota() -> Quota {
    Quota::per_minute(1).burst(u64::from(BIG_BURST))
}

/// A tollgate layer of `n` limits on the peer address (names `l0`, `l1`, ...).
fn tollgate_layer(n: usize, first: usize, quota: Quota, headers: bool) -> RateLimitLayer {
    let mut builder = RateLimitLayer::builder().x_ratelimit_headers(headers);
    for i in first..first + n {
        builder = builder.limit(Limit::new(format!("l{i}"), quota).key(PeerIp::new()));
    }
    builder.build().expect("valid tollgate configuration")
}

/// A `GovernorLayer` for `burst` requests refilled one per `period`, with headers or not (a
/// macro: tower_governor's middleware parameter changes with `use_headers()`).
macro_rules! governor_layer {
    ($period:expr, $burst:expr) => {{
        let config = GovernorConfigBuilder::default()
            .period($period)
            .burst_size($burst)
            .finish()
            .expect("valid tower_governor configuration");
        GovernorLayer {
            config: Arc::new(config),
        }
    }};
    ($period:expr, $burst:expr, headers) => {{
        let config = GovernorConfigBuilder::default()
            .use_headers()
            .period($period)
            .burst_size($burst)
            .finish()
            .expect("valid tower_governor configuration");
        GovernorLayer {
            config: Arc::new(config),
        }
    }};
}

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

fn variants() -> Vec<Variant> {
    let ok_ = StatusCode::OK;
    let refused = StatusCode::TOO_MANY_REQUESTS;
    let one = |headers| tollgate_layer(1, 0, allowed_quota(), headers);
    let mut v = vec![
        variant("bare", service_fn(ok), ok_),
        variant("tollgate", one(true).layer(service_fn(ok)), ok_),
        variant(
            "tower_governor headers",
            governor_layer!(MINUTE, BIG_BURST, headers).layer(service_fn(ok)),
            ok_,
        ),
        variant("tollgate no headers", one(false).layer(service_fn(ok)), ok_),
        variant(
            "tower_governor",
            governor_layer!(MINUTE, BIG_BURST).layer(service_fn(ok)),
            ok_,
        ),
        variant(
            "tollgate rejected",
            tollgate_layer(1, 0, Quota::per_hour(1), true).layer(service_fn(ok)),
            refused,
        ),
        variant(
            "tower_governor headers rejected",
            governor_layer!(HOUR, 1, headers).layer(service_fn(ok)),
            refused,
        ),
    ];
    // N limits in one layer, N stacked layers of one limit, N stacked GovernorLayers.
    let q = allowed_quota();
    let stacked = |i: usize| tollgate_layer(1, i, q, true);
    v.push(variant(
        "tollgate 2 limits, one layer",
        tollgate_layer(2, 0, q, true).layer(service_fn(ok)),
        ok_,
    ));
    v.push(variant(
        "tollgate 3 limits, one layer",
        tollgate_layer(3, 0, q, true).layer(service_fn(ok)),
        ok_,
    ));
    v.push(variant(
        "tollgate 4 limits, one layer",
        tollgate_layer(4, 0, q, true).layer(service_fn(ok)),
        ok_,
    ));
    v.push(variant(
        "tollgate 2 layers",
        stacked(0).layer(stacked(1).layer(service_fn(ok))),
        ok_,
    ));
    v.push(variant(
        "tollgate 3 layers",
        stacked(0).layer(stacked(1).layer(stacked(2).layer(service_fn(ok)))),
        ok_,
    ));
    v.push(variant(
        "tollgate 4 layers",
        stacked(0).layer(stacked(1).layer(stacked(2).layer(stacked(3).layer(service_fn(ok))))),
        ok_,
    ));
    let g = || governor_layer!(MINUTE, BIG_BURST, headers);
    v.push(variant(
        "tower_governor 2 layers",
        g().layer(g().layer(service_fn(ok))),
        ok_,
    ));
    v.push(variant(
        "tower_governor 3 layers",
        g().layer(g().layer(g().layer(service_fn(ok)))),
        ok_,
    ));
    v.push(variant(
        "tower_governor 4 layers",
        g().layer(g().layer(g().layer(g().layer(service_fn(ok))))),
        ok_,
    ));
    v
}

/// Times `requests` requests of `variant` (in chunks), ns per request.
fn time(variant: &mut Variant, requests: usize, counter: &mut u64) -> f64 {
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut total = Duration::ZERO;
    for _ in 0..requests / CHUNK {
        chunk.extend((0..CHUNK).map(|_| {
            *counter += 1;
            request(splitmix64(*counter) % PEERS)
        }));
        total += (variant.run)(&mut chunk);
    }
    total.as_nanos() as f64 / (requests / CHUNK * CHUNK) as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let test_mode = std::env::args().any(|a| a == "--test") || cfg!(debug_assertions);
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_else(|_| "unknown".to_string());
    let mut variants = variants();
    variants.retain(|v| wanted(&v.name));
    let (rounds, requests) = if test_mode {
        (1, CHUNK)
    } else {
        (ROUNDS, REQUESTS)
    };
    let mut counter = 1u64 << 40;
    for v in &mut variants {
        time(v, requests / 10 + CHUNK, &mut counter);
    }
    let mut samples = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        let n = variants.len();
        for i in 0..n {
            let j = (i + round) % n;
            let j = if round % 2 == 1 { n - 1 - j } else { j };
            samples[j].push(time(&mut variants[j], requests, &mut counter));
        }
    }
    let ns: Vec<f64> = samples.iter().cloned().map(median).collect();
    let index = |name: &str| {
        variants
            .iter()
            .position(|v| v.name == name)
            .expect("variant")
    };
    let by = |name: &str| ns[index(name)];
    // A ratio of two variants: the median over the rounds of each round's ratio.
    let paired = |a: &str, b: &str| report::median_ratio(&samples[index(a)], &samples[index(b)]);
    println!("\n=== ns per request (median of {rounds} alternating rounds) ===");
    for (v, ns) in variants.iter().zip(&ns) {
        println!("{:<34} {ns:>8.1}", v.name);
    }
    if test_mode || std::env::args().any(|a| a == "--only") {
        return;
    }
    report(&variants, &ns, &by, &paired, &load);
}

/// `by(name)`: a variant's median ns; `paired(a, b)`: the median over the rounds of a's time
/// over b's in the same round.
fn report(
    variants: &[Variant],
    ns: &[f64],
    by: &dyn Fn(&str) -> f64,
    paired: &dyn Fn(&str, &str) -> f64,
    load: &str,
) {
    let mut section = Section::new(
        "layer",
        "The layer against tower_governor",
        "cargo bench --bench service",
        &format!(
            "One request through `ready` + `call` of a pre-built service wrapping an empty `200` \
             (`tower::service_fn`), its future polled once, the response checked and dropped \
             inside the timed loop; requests built outside it, from 1 000 peers in pseudo-random \
             order (`splitmix64(counter) % 1000`). tollgate in its defaults (in-memory store, \
             default headers `X-RateLimit-Limit`/`-Remaining`/`-Reset`; the benches build with \
             the `metrics` feature, which the examples' dev-dependency enables), tower_governor \
             with `use_headers()` (`x-ratelimit-limit`/`-remaining`) unless said. Allowed: a burst \
             of 9 999 refilled one a minute on both sides (each peer sees about 650 requests); \
             rejected: one an hour, spent first. Each of {ROUNDS} rounds times every variant once \
             ({REQUESTS} requests) in a rotating order; times are medians over the rounds, and \
             a ratio is the median over the rounds of that round's ratio."
        ),
    );
    let bare = by("bare");
    let mut table = Table::new(
        format!("ns per request (median of {ROUNDS} alternating rounds)"),
        &[
            "variant",
            "ns per request",
            "less the bare service",
            "headers written",
        ],
    );
    for (v, &t) in variants.iter().zip(ns) {
        table.row(&[
            v.name.clone(),
            format!("{t:.1}"),
            format!("{:.1}", t - bare),
            v.headers.clone(),
        ]);
    }
    section.table(table);

    let ours = by("tollgate");
    let theirs = by("tower_governor headers");
    section.ratio(
        "layer per allowed request with headers (tower_governor / tollgate)",
        "1 limit, 1 000 peers",
        paired("tower_governor headers", "tollgate"),
        1.0,
    );
    section.ratio(
        "layer per allowed request without headers (tower_governor / tollgate)",
        "1 limit, 1 000 peers",
        paired("tower_governor", "tollgate no headers"),
        1.0,
    );
    let rejected = by("tollgate rejected");
    section.ratio(
        "rejection within 2x an allowed request (2 x allowed / rejected)",
        "hot key, 429",
        2.0 * paired("tollgate", "tollgate rejected"),
        1.0,
    );
    let mut limits = Table::new(
        "N limits: one tollgate layer against N stacked layers (ns per request)",
        &[
            "limits",
            "tollgate, one layer",
            "tollgate, N layers",
            "tower_governor, N layers (headers)",
        ],
    );
    let mut one_layer = Vec::new();
    let mut n_layers = Vec::new();
    let mut governor = Vec::new();
    for n in 1..=4usize {
        let (one, stacked, gov) = if n == 1 {
            (ours, ours, theirs)
        } else {
            (
                by(&format!("tollgate {n} limits, one layer")),
                by(&format!("tollgate {n} layers")),
                by(&format!("tower_governor {n} layers")),
            )
        };
        limits.row(&[
            n.to_string(),
            format!("{one:.1}"),
            format!("{stacked:.1}"),
            format!("{gov:.1}"),
        ]);
        one_layer.push((n as f64, one));
        n_layers.push((n as f64, stacked));
        governor.push((n as f64, gov));
        if n > 1 {
            let one = format!("tollgate {n} limits, one layer");
            section.ratio(
                "N limits in one layer (N stacked layers / one layer)",
                &format!("{n} limits"),
                paired(&format!("tollgate {n} layers"), &one),
                1.0,
            );
            section.ratio(
                "N limits in one layer vs N stacked GovernorLayers (governor / tollgate)",
                &format!("{n} limits"),
                paired(&format!("tower_governor {n} layers"), &one),
                1.0,
            );
        }
    }
    section.table(limits);
    let mut plot = Plot::new(
        "layer.svg",
        "ns per allowed request against the number of limits",
        "limits",
        "ns per request",
    );
    plot.series("tollgate, one layer", one_layer);
    plot.series("tollgate, one layer per limit", n_layers);
    plot.series("tower_governor, one layer per limit (headers)", governor);
    section.plot(plot);
    section.note(format!(
        "Load average when the run started (1, 5, 15 min): {load}."
    ));
    section.note(format!(
        "Rejected: tollgate {rejected:.1} ns (problem+json body, `Retry-After`, headers) against \
         {ours:.1} ns allowed; tower_governor's 429 {:.1} ns.",
        by("tower_governor headers rejected")
    ));
    section.write();
}
