//! Decisions per second against one local `redis-server` (started by this bench on a free port),
//! side by side in one run:
//!
//! - the store's public API (`Store::check`), unbatched and with batching (concurrent decisions
//!   coalesced into one script call), at concurrency 1, 64 and 256, with p50/p99 latency;
//! - (a) the same decision sent as a plain per-request `EVAL` of the seeds' token-bucket script,
//!   over one multiplexed connection, at the same concurrency;
//! - (b) `redis-benchmark` running that script by `EVALSHA`, unpipelined and with `-P 16` (the
//!   pipelined ceiling), parsed from its CSV output.
//!
//! ```text
//! cargo bench --features redis --bench redis
//! BENCH_SECS=5 cargo bench --features redis --bench redis   # longer runs
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, Checked, FailurePolicy, LimitCheck, LimitSpec, Store};
use tollgate::{PolicyName, Quota};

/// The token bucket of the seeds (`001`), verbatim: server `TIME` in ms, a hash per key.
const SEED_TOKEN_BUCKET: &str = r#"
local capacity = tonumber(ARGV[1])
local rate     = tonumber(ARGV[2])
local cost     = tonumber(ARGV[3])

local t   = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local state  = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts     = tonumber(state[2]) or now

tokens = math.min(capacity, tokens + (now - ts) / 1000 * rate)
local allowed = tokens >= cost
if allowed then tokens = tokens - cost end

redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000) + 1000)

local retry_ms = 0
if not allowed then retry_ms = math.ceil((cost - tokens) / rate * 1000) end
return { allowed and 1 or 0, math.floor(tokens), retry_ms }
"#;

const KEYS: u64 = 10_000;
const CONCURRENCY: [usize; 3] = [1, 64, 256];

#[derive(Debug, Clone, Copy)]
struct Result {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
}

fn secs() -> Duration {
    let s = std::env::var("BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    Duration::from_secs_f64(s)
}

/// Runs `op` from `concurrency` tasks for the bench duration (after a short warm-up).
async fn drive<F, Fut>(concurrency: usize, op: F) -> Result
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let (op, measuring, stop) = (op.clone(), measuring.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 16);
            let mut x = (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let start = Instant::now();
                op(x % KEYS).await;
                if measuring.load(Ordering::Relaxed) {
                    lat.push(start.elapsed());
                }
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(secs()).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    let pct = |p: f64| all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1))).copied().unwrap_or_default();
    Result {
        per_sec: all.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

fn store(url: &str, batching: bool) -> RedisStore {
    let spec = LimitSpec::new(
        PolicyName::new("bench"),
        Quota::per_second(1_000).burst(100_000),
        AlgorithmKind::TokenBucket,
    )
    .on_store_error(FailurePolicy::Open);
    RedisBackend::new(url)
        .prefix("bench")
        .batching(batching)
        // Measure Redis, not the failure policy: a generous timeout.
        .timeout(Duration::from_secs(2))
        .build(&[spec])
        .unwrap()
}

async fn bench_store(url: &str, batching: bool, concurrency: usize) -> (Result, f64) {
    let store = Arc::new(store(url, batching));
    let s = store.clone();
    let r = drive(concurrency, move |k| {
        let s = s.clone();
        async move {
            let checks = [LimitCheck {
                limit: 0,
                key: Key::int(k),
                cost: 1,
            }];
            let d = match s.check(&checks) {
                Checked::Ready(r) => r,
                Checked::Pending(f) => f.await,
            };
            assert!(d.is_ok());
        }
    })
    .await;
    let stats = store.stats();
    assert_eq!(stats.errors(), 0, "{stats:?}");
    let mean_batch = if stats.batches() > 0 {
        stats.batched_calls() as f64 / stats.batches() as f64
    } else {
        1.0
    };
    (r, mean_batch)
}

async fn bench_eval(url: &str, concurrency: usize) -> Result {
    let client = redis::Client::open(url).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    drive(concurrency, move |k| {
        let mut conn = conn.clone();
        async move {
            let r: Vec<i64> = redis::cmd("EVAL")
                .arg(SEED_TOKEN_BUCKET)
                .arg(1)
                .arg(format!("rl:{k}"))
                .arg(100_000)
                .arg(1_000)
                .arg(1)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(r.len(), 3);
        }
    })
    .await
}

/// `redis-benchmark` with the seeds' script by EVALSHA; returns requests per second.
fn redis_benchmark(port: u16, sha: &str, pipeline: u32) -> f64 {
    let n = if pipeline > 1 { 600_000 } else { 200_000 };
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-c", "50"])
        .args(["-n", &n.to_string(), "-P", &pipeline.to_string(), "-r", &KEYS.to_string(), "--csv"])
        .args(["EVALSHA", sha, "1", "rl:__rand_int__", "100000", "1000", "1"])
        .output()
        .expect("run redis-benchmark (Debian package redis-tools / redis-server)");
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms",...  then one row per test.
    text.lines()
        .filter(|l| l.starts_with("\"EVALSHA"))
        .filter_map(|l| l.split(',').nth(1))
        .filter_map(|v| v.trim_matches('"').parse::<f64>().ok())
        .next()
        .unwrap_or_else(|| panic!("cannot parse redis-benchmark output:\n{text}"))
}

/// CPU seconds redis-server has used so far (user + system).
fn redis_cpu(server: &support::RedisServer) -> f64 {
    let info: String = server.cmd(&["INFO", "cpu"]);
    info.lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum()
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing we need.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    support::require("redis-benchmark");
    let server = support::RedisServer::start();
    let url = server.url();
    let sha: String = server.cmd(&["SCRIPT", "LOAD", SEED_TOKEN_BUCKET]);

    println!("redis bench: one local redis-server, {KEYS} keys, token bucket, {:?} per point", secs());
    let (ceiling_p1, ceiling_p16) = if std::env::var("BENCH_ONLY").is_ok() {
        (0.0, 1.0)
    } else {
        (redis_benchmark(server.port(), &sha, 1), redis_benchmark(server.port(), &sha, 16))
    };
    println!("(b) redis-benchmark EVALSHA seeds' script, -c 50:  -P 1: {ceiling_p1:>9.0}/s   -P 16: {ceiling_p16:>9.0}/s (the ceiling)");

    // BENCH_RT=current runs the client on one thread (no cross-thread wake-ups).
    let rt = if std::env::var("BENCH_RT").as_deref() == Ok("current") {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    println!(
        "{:>11} | {:>26} | {:>26} | {:>36}",
        "concurrency", "(a) per-request EVAL", "store, unbatched", "store, batched (mean batch)"
    );
    // For profiling one point: BENCH_ONLY=eval|direct|batched BENCH_C=64.
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        let c = std::env::var("BENCH_C").ok().and_then(|c| c.parse().ok()).unwrap_or(64);
        let (cpu0, t0) = (redis_cpu(&server), Instant::now());
        let r = match only.as_str() {
            "eval" => rt.block_on(bench_eval(&url, c)),
            "direct" => rt.block_on(bench_store(&url, false, c)).0,
            _ => rt.block_on(bench_store(&url, true, c)).0,
        };
        let busy = (redis_cpu(&server) - cpu0) / t0.elapsed().as_secs_f64();
        println!(
            "{only} at {c}: {:.0}/s p50 {:?} p99 {:?}; redis-server busy {:.0}% of a core",
            r.per_sec,
            r.p50,
            r.p99,
            busy * 100.0
        );
        return;
    }
    let mut batched_64 = None;
    for c in CONCURRENCY {
        let eval = rt.block_on(bench_eval(&url, c));
        let (direct, _) = rt.block_on(bench_store(&url, false, c));
        let (batched, mean) = rt.block_on(bench_store(&url, true, c));
        let fmt = |r: Result| format!("{:>8.0}/s p99 {:>7.2?}", r.per_sec, r.p99);
        println!(
            "{c:>11} | {:>26} | {:>26} | {:>26} ({mean:>5.1})",
            fmt(eval),
            fmt(direct),
            fmt(batched)
        );
        if c == 64 {
            batched_64 = Some((direct, batched));
        }
    }
    let best = |r: Result| r.per_sec / ceiling_p16;
    if let Some((direct, batched)) = batched_64 {
        println!(
            "at concurrency 64: unbatched {:.2}x, batched {:.2}x the -P 16 ceiling; p50/p99 unbatched {:?}/{:?}, batched {:?}/{:?}",
            best(direct),
            best(batched),
            direct.p50,
            direct.p99,
            batched.p50,
            batched.p99
        );
    }
}
