//! The hybrid store next to the plain Redis store and the `redis-benchmark` ceiling, side by
//! side in one run against one local `redis-server` (started by this bench on a free port):
//! decisions per second, p50/p99 latency and Redis script calls per decision at concurrency 1,
//! 64 and 256, on 1 000 active keys in random order through `Store::check`, default
//! configuration but a 50 ms Redis timeout for both (token bucket, 500/s burst 500 per key,
//! closed on failure; answers of the failure policy are not counted as decisions), alternating
//! rounds, medians (a ratio: the median over the rounds of each round's hybrid over plain). Every
//! run also counts what the hybrid store admitted against what one shared bucket per key allows
//! from its first request (over-admission must be 0).
//!
//! ```text
//! cargo bench --features redis --bench hybrid
//! BENCH_SECS=3 BENCH_ROUNDS=5 cargo bench --features redis --bench hybrid
//! ```

#[path = "../tests/harness/mod.rs"]
mod harness;
#[path = "common/seed.rs"]
mod seed;

#[path = "common/report.rs"]
mod report;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::redis_server::{require, RedisServer};
use seed::{run_redis_benchmark, seed_command, SEED_TOKEN_BUCKET};
use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::hybrid::HybridBackend;
use tollgate::store::redis::RedisBackend;
use tollgate::store::{Backend, Checked, FailurePolicy, LimitCheck, LimitSpec, Store};
use tollgate::{Name, Quota};

const KEYS: u64 = 1_000;
const CONCURRENCY: [usize; 3] = [1, 64, 256];
const RATE: u64 = 500;
/// Both stores wait this long for Redis (the default 5 ms trips the breaker on a busy 2-core
/// machine, and answers by the failure policy are not decisions).
const TIMEOUT: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, Default)]
struct Point {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    calls_per_decision: f64,
    admitted: u64,
    /// Checks the failure policy answered (Redis too slow or down): not decisions.
    errors: u64,
    /// What one bucket per key allows from each key's first request to the end of the run.
    fair: u64,
}

fn secs() -> Duration {
    let s = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(s)
}

fn limits() -> [LimitSpec; 1] {
    [LimitSpec::new(
        Name::new("per-key"),
        Quota::per_second(RATE).burst(RATE),
        AlgorithmKind::TokenBucket,
    )
    .on_store_error(FailurePolicy::Closed {
        retry_after: Duration::from_secs(1),
    })]
}

fn script_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split(['=', ',']).nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Runs `store` from `concurrency` tasks on random keys (fresh ones: a new prefix per run).
async fn drive<S: Store + Clone>(server: &RedisServer, store: S, concurrency: usize) -> Point {
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let calls0 = script_calls(server);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let (store, stop, admitted, errors) = (
            store.clone(),
            stop.clone(),
            admitted.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 16);
            let mut x = (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let checks = [LimitCheck::new(0, Key::int(x % KEYS), 1)];
                let t0 = Instant::now();
                let r = match store.check(&checks) {
                    Checked::Ready(r) => r,
                    Checked::Pending(f) => f.await,
                };
                match r {
                    Ok(d) => {
                        lat.push(t0.elapsed());
                        if d.allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    // Not a decision: counted apart (the failure policy answered).
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if x.is_multiple_of(64) {
                    tokio::task::yield_now().await;
                }
            }
            lat
        }));
    }
    tokio::time::sleep(secs()).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    let calls = script_calls(server) - calls0;
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let n = all.len().max(1) as f64;
    Point {
        per_sec: all.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        calls_per_decision: calls as f64 / n,
        admitted: admitted.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        fair: KEYS * RATE + (KEYS as f64 * RATE as f64 * elapsed.as_secs_f64()).ceil() as u64,
    }
}

/// The `redis-benchmark -P 16` ceiling of the seeds' script, requests per second.
fn redis_benchmark(server: &RedisServer, sha: &str) -> f64 {
    run_redis_benchmark(server, &seed_command(sha), 300_000, 16, KEYS).0
}

fn median(mut v: Vec<Point>) -> Point {
    v.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
    v[v.len() / 2]
}

fn show(p: &Point) -> String {
    format!(
        "{:>9.0}/s  p50 {:>8.2?}  p99 {:>8.2?}  {:.4} script calls/decision  admitted {} of at most {}  failed {}",
        p.per_sec, p.p50, p.p99, p.calls_per_decision, p.admitted, p.fair, p.errors
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    require("redis-benchmark");
    let server = RedisServer::start();
    let url = server.url();
    let sha: String = server.cmd(&["SCRIPT", "LOAD", SEED_TOKEN_BUCKET]);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut n = 0u32;
    let mut prefix = || {
        n += 1;
        format!("bench-hybrid-{}-{n}", std::process::id())
    };
    let ceiling = redis_benchmark(&server, &sha);
    println!(
        "hybrid bench: {KEYS} keys, token bucket {RATE}/s burst {RATE} per key, {:?} per point, {rounds} alternating rounds (medians)",
        secs()
    );
    println!("redis-benchmark -P 16 ceiling (EVALSHA, 50 connections): {ceiling:.0}/s");
    let mut plain_points = Vec::new();
    let mut hybrid_points = Vec::new();
    let mut over = 0u64;
    // Per concurrency: the median over the rounds of each round's hybrid over plain.
    let mut ratios = Vec::new();
    for c in CONCURRENCY {
        let (mut plain, mut hybrid) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let store = rt.block_on(async {
                RedisBackend::new(url.clone())
                    .prefix(prefix())
                    .timeout(TIMEOUT)
                    .build(&limits())
                    .unwrap()
            });
            plain.push(rt.block_on(drive(&server, store, c)));
            let store = rt.block_on(async {
                HybridBackend::new(
                    RedisBackend::new(url.clone())
                        .prefix(prefix())
                        .timeout(TIMEOUT),
                )
                .build(&limits())
                .unwrap()
            });
            let h = rt.block_on(drive(&server, store, c));
            over = over.max(h.admitted.saturating_sub(h.fair));
            hybrid.push(h);
        }
        let per_sec = |points: &[Point]| points.iter().map(|p| p.per_sec).collect::<Vec<_>>();
        let ratio = report::median_ratio(&per_sec(&hybrid), &per_sec(&plain));
        ratios.push(ratio);
        let (p, h) = (median(plain), median(hybrid));
        println!("concurrency {c}:");
        println!("  plain Redis store {}", show(&p));
        println!("  hybrid store      {}", show(&h));
        println!("  hybrid / plain (median of the rounds' ratios): {ratio:.1}x");
        plain_points.push((c, p));
        hybrid_points.push((c, h));
    }
    println!(
        "largest over-admission of any hybrid run: {over} (bound: 0 from each key's first request)"
    );

    let mut section = report::Section::new(
        "hybrid",
        "Hybrid local + Redis tier",
        "cargo bench --features redis --bench hybrid",
        "One local `redis-server`; 1 000 active keys in random order through `Store::check`, default configuration but a 50 ms Redis timeout for both (token bucket 500/s burst 500 per key); only answers Redis or the local tier decided count as decisions; the plain Redis store (batching on) and the hybrid store in alternating rounds, medians (a ratio: the median of the rounds' ratios); script calls counted with `INFO commandstats`; the `redis-benchmark -P 16` ceiling runs the seeds' token-bucket script by EVALSHA.",
    );
    let mut table = report::Table::new(
        format!("Decisions per second, 1 000 keys (redis-benchmark -P 16 ceiling: {ceiling:.0}/s)"),
        &[
            "concurrency",
            "store",
            "decisions/s",
            "p50",
            "p99",
            "Redis calls / decision",
            "admitted / one bucket allows",
            "failed",
        ],
    );
    for ((c, p), (_, h)) in plain_points.iter().zip(&hybrid_points) {
        for (name, x) in [("plain Redis", p), ("hybrid", h)] {
            table.row(&[
                c.to_string(),
                name.to_string(),
                format!("{:.0}", x.per_sec),
                format!("{:.2?}", x.p50),
                format!("{:.2?}", x.p99),
                format!("{:.4}", x.calls_per_decision),
                format!("{} / {}", x.admitted, x.fair),
                x.errors.to_string(),
            ]);
        }
    }
    section.table(table);
    let mut plot = report::Plot::new(
        "hybrid.svg",
        "Hybrid vs plain Redis store, 1 000 keys",
        "concurrency",
        "decisions per second",
    )
    .log_x();
    plot.series(
        "plain Redis store",
        plain_points
            .iter()
            .map(|(c, p)| (*c as f64, p.per_sec))
            .collect(),
    );
    plot.series(
        "hybrid store",
        hybrid_points
            .iter()
            .map(|(c, p)| (*c as f64, p.per_sec))
            .collect(),
    );
    plot.series(
        "redis-benchmark -P 16 ceiling",
        CONCURRENCY.iter().map(|c| (*c as f64, ceiling)).collect(),
    );
    section.plot(plot);
    for (c, ratio) in CONCURRENCY.iter().zip(&ratios) {
        let target = if *c == 64 { 10.0 } else { 1.0 };
        section.ratio(
            "decisions/s, hybrid vs plain Redis store",
            &format!("1 000 keys, concurrency {c}"),
            *ratio,
            target,
        );
    }
    section.note(format!(
        "Over-admission of any hybrid run against one shared bucket per key from its first request: {over} (the bound is 0)."
    ));
    section.write();
}
