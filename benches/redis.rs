//! Decisions per second against one local `redis-server` (started by this bench on a free port),
//! and against a local Cluster, side by side in one run:
//!
//! - the store's public API (`Store::check`), unbatched and with batching (concurrent decisions
//!   coalesced into one script call), at concurrency 1, 64 and 256, with p50/p99 latency;
//! - (a) the same decision sent as a plain per-request `EVAL` of the seeds' token-bucket script,
//!   over one multiplexed connection, at the same concurrency;
//! - (b) `redis-benchmark` running that script by `EVALSHA`, unpipelined and with `-P 16` (the
//!   pipelined ceiling), parsed from its CSV output;
//! - (c) the floor: `redis-benchmark -P 16` running a script that does only the Redis work a
//!   batched decision needs (its share of one `MGET`, one `SET ... KEEPTTL`: the store's writes
//!   keep the key's TTL while it covers the refill), 16 keys per call;
//! - the store on a 3-master Redis Cluster (started by this bench on free loopback ports),
//!   unbatched and batched per master, at concurrency 64 and 256, with the Redis CPU a decision
//!   costs the master that decides it.
//!
//! ```text
//! cargo bench --features redis --bench redis
//! BENCH_SECS=5 BENCH_ROUNDS=7 cargo bench --features redis --bench redis   # longer runs
//! ```

#[path = "../tests/harness/mod.rs"]
mod harness;
#[path = "common/report.rs"]
mod report;
#[path = "common/seed.rs"]
mod seed;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::redis_cluster::RedisCluster;
use harness::redis_server::{require, RedisServer};
use seed::{cpu_of, run_redis_benchmark, seed_command, SEED_TOKEN_BUCKET};
use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, Checked, FailurePolicy, LimitCheck, LimitSpec, Store};
use tollgate::{Name, Quota};

/// The least Redis work a batched decision can take, for the floor: per key, its share of one
/// `MGET` of the call's keys and one `SET` of a 16-byte state that keeps the key's expiry (what
/// the store's script does for a token-bucket key of a batch written again within an eighth of
/// its TTL, as every key of this bench is, without deciding anything).
const FLOOR_SCRIPT: &str = "redis.call('MGET', unpack(KEYS)) \
     for i = 1, #KEYS do redis.call('SET', KEYS[i], '0123456789abcdef', 'KEEPTTL') end \
     return 1";

/// Keys per call of the floor script: about the store's mean batch at 64 callers.
const FLOOR_BATCH: u64 = 16;

const KEYS: u64 = 10_000;
const CONCURRENCY: [usize; 3] = [1, 64, 256];
const CLUSTER_CONCURRENCY: [usize; 2] = [64, 256];

#[derive(Debug, Clone, Copy)]
struct Result {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    /// redis-server CPU per decision, µs.
    redis_us: f64,
    /// This process's CPU per decision, µs.
    client_us: f64,
    /// Time inside EVAL/EVALSHA per decision (INFO commandstats), µs.
    script_us: f64,
    /// Decisions per script call (batched store only; 1 otherwise).
    mean_batch: f64,
}

/// (redis-server CPU s, own CPU s, µs inside scripts) so far.
type Sampler = Arc<dyn Fn() -> (f64, f64, f64) + Send + Sync>;

fn secs() -> Duration {
    let s = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(s)
}

/// Runs `op` from `concurrency` tasks for the bench duration (after a short warm-up).
async fn drive<F, Fut>(sample: &Sampler, concurrency: usize, op: F) -> Result
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
    let cpu0 = sample();
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(secs()).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed();
    let cpu1 = sample();
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let n = all.len().max(1) as f64;
    Result {
        per_sec: all.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        redis_us: (cpu1.0 - cpu0.0) * 1e6 / n,
        client_us: (cpu1.1 - cpu0.1) * 1e6 / n,
        script_us: (cpu1.2 - cpu0.2) / n,
        mean_batch: 1.0,
    }
}

fn store(url: &str, batching: bool) -> RedisStore {
    configure(RedisBackend::new(url), batching)
}

/// The same store on a Cluster.
fn cluster_store(urls: &[String], batching: bool) -> RedisStore {
    configure(RedisBackend::cluster(urls.iter().cloned()), batching)
}

fn configure(backend: RedisBackend, batching: bool) -> RedisStore {
    let spec = LimitSpec::new(
        Name::new("bench"),
        Quota::per_second(1_000).burst(100_000),
        AlgorithmKind::TokenBucket,
    );
    configure_limit(backend, batching, spec)
}

/// The default store with one fixed window of `count` a minute: 10 000 000 never refuses (the
/// bench's keys see about 1 000 a minute each), 1 refuses all but each key's first check of a
/// minute.
fn fixed_window_store(url: &str, count: u64) -> RedisStore {
    let spec = LimitSpec::new(
        Name::new("bench"),
        Quota::per_minute(count),
        AlgorithmKind::FixedWindow,
    );
    configure_limit(RedisBackend::new(url), true, spec)
}

fn configure_limit(backend: RedisBackend, batching: bool, spec: LimitSpec) -> RedisStore {
    let spec = spec.on_store_error(FailurePolicy::Open);
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    backend
        .prefix("bench")
        .batching(batching)
        .max_batch(env(
            "BENCH_MAX_BATCH",
            tollgate::store::redis::DEFAULT_MAX_BATCH,
        ))
        .max_in_flight(env(
            "BENCH_IN_FLIGHT",
            tollgate::store::redis::DEFAULT_MAX_IN_FLIGHT,
        ))
        // Measure Redis, not the failure policy: a generous timeout.
        .timeout(Duration::from_secs(2))
        .build(&[spec])
        .unwrap()
}

async fn bench_store(
    sample: &Sampler,
    url: &str,
    batching: bool,
    concurrency: usize,
) -> (Result, f64) {
    bench_built(sample, store(url, batching), concurrency).await
}

async fn bench_built(sample: &Sampler, store: RedisStore, concurrency: usize) -> (Result, f64) {
    let store = Arc::new(store);
    // A Cluster store reads its slot map in the background; until then it does not batch.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = store.clone();
    let r = drive(sample, concurrency, move |k| {
        let s = s.clone();
        async move {
            let checks = [LimitCheck::new(0, Key::int(k), 1)];
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

async fn bench_eval(sample: &Sampler, url: &str, concurrency: usize) -> Result {
    let client = redis::Client::open(url).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    drive(sample, concurrency, move |k| {
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

/// envoy ratelimit's fixed window: per decision, `INCRBY key 1` and `EXPIRE key 60` in one
/// pipeline over one multiplexed connection, on a key named after the minute (as envoy's
/// `<domain>_<key>_<value>_<window start>`); allowed while the count is at most the limit.
async fn bench_envoy(sample: &Sampler, url: &str, concurrency: usize) -> Result {
    let client = redis::Client::open(url).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    drive(sample, concurrency, move |k| {
        let mut conn = conn.clone();
        async move {
            let minute = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                / 60
                * 60;
            let key = format!("bench_fixed_window_{k}_{minute}");
            let (count,): (u64,) = redis::pipe()
                .cmd("INCRBY")
                .arg(&key)
                .arg(1)
                .cmd("EXPIRE")
                .arg(&key)
                .arg(60)
                .ignore()
                .query_async(&mut conn)
                .await
                .unwrap();
            std::hint::black_box(count <= ENVOY_LIMIT);
        }
    })
    .await
}

/// The envoy-style point's limit: never reached, like the store's 10 000 000 a minute.
const ENVOY_LIMIT: u64 = 10_000_000;

/// `redis-benchmark` with the seeds' script by EVALSHA; returns requests per second and
/// redis-server CPU µs per request.
fn redis_benchmark(server: &RedisServer, sha: &str, pipeline: u32) -> (f64, f64) {
    let n = if pipeline > 1 { 300_000 } else { 200_000 };
    run_redis_benchmark(server, &seed_command(sha), n, pipeline, KEYS)
}

/// `redis-benchmark -P 16` with [`FLOOR_SCRIPT`] on [`FLOOR_BATCH`] random keys per call (of
/// [`KEYS`] in all); returns keys per second and redis-server CPU µs per key.
fn redis_floor(server: &RedisServer, sha: &str) -> (f64, f64) {
    let mut args = vec![
        "EVALSHA".to_string(),
        sha.to_string(),
        FLOOR_BATCH.to_string(),
    ];
    args.extend((0..FLOOR_BATCH).map(|i| format!("floor{i}:__rand_int__")));
    let (rps, cpu) = run_redis_benchmark(server, &args, 60_000, 16, KEYS / FLOOR_BATCH);
    (rps * FLOOR_BATCH as f64, cpu / FLOOR_BATCH as f64)
}

/// A key of the floor (c'): shaped as the store's (`<prefix>:{<tag>}:tb:<limit>:h.<hash>`,
/// 68 bytes), with redis-benchmark's 12-digit random number and the key's place in the call as
/// its tag.
fn store_shaped_key(random: &str, place: u64) -> String {
    format!("bench:{{{random}{place:04}}}:tb:bench:h.4a22f0ae7a2af804f3a1bdb0701d23c4")
}

/// The floor (c') on [`store_shaped_key`]s that hold a TTL, as every key a store writes must:
/// keys per second and redis-server CPU µs per key. The keys are written with a TTL first.
fn redis_floor_store_keys(server: &RedisServer, sha: &str) -> (f64, f64) {
    let randoms = KEYS / FLOOR_BATCH;
    let fill = format!(
        "for i = 0, {last_place} do for r = 0, {last_random} do \
         redis.call('SET', string.format('bench:{{%012d%04d}}:tb:bench:h.4a22f0ae7a2af804f3a1bdb0701d23c4', r, i), \
         '0123456789abcdef', 'PX', 3600000) end end return 1",
        last_place = FLOOR_BATCH - 1,
        last_random = randoms - 1,
    );
    let _: i64 = server.cmd(&["EVAL", &fill, "0"]);
    let mut args = vec![
        "EVALSHA".to_string(),
        sha.to_string(),
        FLOOR_BATCH.to_string(),
    ];
    args.extend((0..FLOOR_BATCH).map(|i| store_shaped_key("__rand_int__", i)));
    let (rps, cpu) = run_redis_benchmark(server, &args, 60_000, 16, randoms);
    (rps * FLOOR_BATCH as f64, cpu / FLOOR_BATCH as f64)
}

/// CPU seconds this process has used so far (user + system), from /proc/self/stat.
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    // After the command name: state is field 3, utime 14 and stime 15 (1-based, in ticks).
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(14) + ticks(15)) / 100.0
}

/// One server's CPU seconds (`INFO cpu`) and the µs its scripts ran (`INFO commandstats`).
fn server_cpu(url: &str) -> (f64, f64) {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let cpu: String = redis::cmd("INFO").arg("cpu").query(&mut conn).unwrap();
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .unwrap();
    (cpu_of(&cpu), script_usec(&stats))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with nothing to measure.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    require("redis-benchmark");
    let server = RedisServer::start();
    let url = server.url();
    let sha: String = server.cmd(&["SCRIPT", "LOAD", SEED_TOKEN_BUCKET]);
    // A 3-master Cluster (no replicas) on free loopback ports, for the Cluster points.
    let cluster = RedisCluster::start();
    let cluster_urls = cluster.urls();

    println!(
        "redis bench: one local redis-server, {KEYS} keys, token bucket, {:?} per point; CPU columns are µs of CPU per decision",
        secs()
    );
    // BENCH_RT=current runs the client on one thread (no cross-thread wake-ups).
    let current = std::env::var("BENCH_RT").as_deref() == Ok("current");
    let rt = if current {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let sampler: Sampler = {
        let url = url.clone();
        Arc::new(move || {
            let (cpu, script) = server_cpu(&url);
            (cpu, own_cpu(), script)
        })
    };
    let cluster_sampler: Sampler = {
        let urls = cluster_urls.clone();
        Arc::new(move || {
            let mut sum = (0.0, own_cpu(), 0.0);
            for url in &urls {
                let (cpu, script) = server_cpu(url);
                sum.0 += cpu;
                sum.2 += script;
            }
            sum
        })
    };
    let cluster_point = |batching: bool, c: usize| {
        let store = rt.block_on(async { cluster_store(&cluster_urls, batching) });
        let (mut r, mean) = rt.block_on(bench_built(&cluster_sampler, store, c));
        r.mean_batch = mean;
        r
    };
    // For profiling one point, with the floor after it:
    // BENCH_ONLY=eval|direct|batched|cluster|cluster-direct|envoy|fixed|fixed-refusing BENCH_C=64.
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        let c = std::env::var("BENCH_C")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(64);
        let r = match only.as_str() {
            "eval" => rt.block_on(bench_eval(&sampler, &url, c)),
            "cluster" => cluster_point(true, c),
            "cluster-direct" => cluster_point(false, c),
            "direct" => rt.block_on(bench_store(&sampler, &url, false, c)).0,
            "envoy" => rt.block_on(bench_envoy(&sampler, &url, c)),
            "fixed" | "fixed-refusing" => {
                let count = if only == "fixed" { 10_000_000 } else { 1 };
                let store = rt.block_on(async { fixed_window_store(&url, count) });
                let (mut r, mean) = rt.block_on(bench_built(&sampler, store, c));
                r.mean_batch = mean;
                r
            }
            _ => {
                let (mut r, mean) = rt.block_on(bench_store(&sampler, &url, true, c));
                r.mean_batch = mean;
                r
            }
        };
        let floor_sha: String = server.cmd(&["SCRIPT", "LOAD", FLOOR_SCRIPT]);
        let (_, floor_cpu) = redis_floor(&server, &floor_sha);
        let (_, keyed_cpu) = redis_floor_store_keys(&server, &floor_sha);
        println!(
            "{only} at {c}: {}  mean batch {:.1}; floor {floor_cpu:.2} µs per key: {:.2}x; on the store's key names with TTLs {keyed_cpu:.2} µs: {:.2}x",
            show(r),
            r.mean_batch,
            r.redis_us / floor_cpu,
            r.redis_us / keyed_cpu
        );
        return;
    }
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5)
        .max(1);
    println!(
        "client runtime: {}; {rounds} rounds, each: the -P 16 ceiling, the default store at 64 and 256, the ceiling again, the floor, then the other points",
        if current {
            "tokio current_thread"
        } else {
            "tokio multi_thread, 2 workers"
        }
    );
    let (p1, p1_cpu) = redis_benchmark(&server, &sha, 1);
    println!("(b) redis-benchmark -P 1:  {p1:>8.0}/s (redis {p1_cpu:.2} µs CPU per request)");
    let floor_sha: String = server.cmd(&["SCRIPT", "LOAD", FLOOR_SCRIPT]);
    let mut ceilings = Vec::new();
    // The floor of each round: (keys/s, Redis CPU µs per key).
    let mut floors = Vec::new();
    // The floor (c') of each round, on the store's key names with TTLs.
    let mut keyed_floors = Vec::new();
    // points[round][(concurrency index, variant)]
    let mut points: Vec<Vec<(usize, Variant, Result)>> = Vec::new();
    // Each round's fixed-window points.
    let mut fixed_rounds: Vec<FixedWindowRound> = Vec::new();
    // (concurrency, batched, result) of every round's Cluster points.
    let mut cluster_points: Vec<(usize, bool, Result)> = Vec::new();
    for round in 0..rounds {
        let before = redis_benchmark(&server, &sha, 16);
        let mut this = Vec::new();
        let mut point = |v: Variant, c: usize| {
            let ci = CONCURRENCY.iter().position(|&x| x == c).unwrap();
            let r = match v {
                Variant::Eval => rt.block_on(bench_eval(&sampler, &url, c)),
                Variant::Unbatched => rt.block_on(bench_store(&sampler, &url, false, c)).0,
                Variant::Batched => {
                    let (mut r, mean) = rt.block_on(bench_store(&sampler, &url, true, c));
                    r.mean_batch = mean;
                    r
                }
            };
            println!(
                "  concurrency {c:>3}: {:<24}{}{}",
                v.short(),
                show(r),
                if v == Variant::Batched {
                    format!("  mean batch {:.1}", r.mean_batch)
                } else {
                    String::new()
                }
            );
            this.push((ci, v, r));
        };
        // The default store at 64 and 256 callers between two runs of the ceiling, the
        // round's ceiling being their mean: the machine's speed drifts within seconds.
        println!(
            "round {}: (b) redis-benchmark -P 16: {:>8.0}/s (redis {:.2} µs CPU per request): the pipelined ceiling, before",
            round + 1,
            before.0,
            before.1
        );
        point(Variant::Batched, 64);
        point(Variant::Batched, 256);
        let after = redis_benchmark(&server, &sha, 16);
        let (p16, p16_cpu) = ((before.0 + after.0) / 2.0, (before.1 + after.1) / 2.0);
        println!(
            "  (b) redis-benchmark -P 16: {:>8.0}/s (redis {:.2} µs CPU per request): after; the round's ceiling {p16:.0}/s, {p16_cpu:.2} µs",
            after.0, after.1
        );
        ceilings.push((p16, p16_cpu));
        let (floor, floor_cpu) = redis_floor(&server, &floor_sha);
        println!(
            "  (c) floor, {FLOOR_BATCH} keys per call, -P 16: {floor:>8.0} keys/s (redis {floor_cpu:.2} µs CPU per key)"
        );
        floors.push((floor, floor_cpu));
        let keyed = redis_floor_store_keys(&server, &floor_sha);
        println!(
            "  (c') floor on the store's key names, with TTLs: {:>8.0} keys/s (redis {:.2} µs CPU per key)",
            keyed.0, keyed.1
        );
        keyed_floors.push(keyed);
        let fixed = FixedWindowRound {
            envoy: rt.block_on(bench_envoy(&sampler, &url, 64)),
            store: fixed_point(&rt, &sampler, &url, 10_000_000),
            refusing: fixed_point(&rt, &sampler, &url, 1),
        };
        println!(
            "  fixed window at 64, envoy-style INCRBY + EXPIRE: {}",
            show(fixed.envoy)
        );
        println!(
            "  fixed window at 64, store:                       {}  mean batch {:.1}",
            show(fixed.store),
            fixed.store.mean_batch
        );
        println!(
            "  fixed window at 64, store, refusing:             {}  mean batch {:.1}",
            show(fixed.refusing),
            fixed.refusing.mean_batch
        );
        fixed_rounds.push(fixed);
        point(Variant::Batched, 1);
        for v in [Variant::Unbatched, Variant::Eval] {
            for c in CONCURRENCY {
                point(v, c);
            }
        }
        points.push(this);
        for c in CLUSTER_CONCURRENCY {
            let direct = cluster_point(false, c);
            let batched = cluster_point(true, c);
            println!("  cluster (3 masters), concurrency {c}:");
            println!("    store, unbatched      {}", show(direct));
            println!(
                "    store, batched        {}  mean batch {:.1}",
                show(batched),
                batched.mean_batch
            );
            cluster_points.push((c, false, direct));
            cluster_points.push((c, true, batched));
        }
    }
    let ceiling = median(ceilings.iter().map(|c| c.0).collect());
    let ceiling_cpu = median(ceilings.iter().map(|c| c.1).collect());
    let floor = median(floors.iter().map(|f| f.0).collect());
    let floor_cpu = median(floors.iter().map(|f| f.1).collect());
    // The median of each figure over the rounds.
    let med = |ci: usize, v: Variant, f: &dyn Fn(&Result) -> f64| {
        median(
            points
                .iter()
                .flat_map(|round| round.iter())
                .filter(|(c, var, _)| *c == ci && *var == v)
                .map(|(_, _, r)| f(r))
                .collect(),
        )
    };
    // A point against its own round's ceiling, the median over the rounds: the default store at
    // 64 and 256 runs between the round's two ceilings, seconds apart, so what slows the
    // machine for a while slows both (the round's other points come later in it).
    let paired = |ci: usize, v: Variant, g: &dyn Fn(&Result, (f64, f64)) -> f64| {
        per_round_median(&points, &ceilings, ci, v, g)
    };
    let ci64 = CONCURRENCY.iter().position(|&c| c == 64).unwrap();
    let ci256 = CONCURRENCY.iter().position(|&c| c == 256).unwrap();
    let vs_ceiling = |ci| paired(ci, Variant::Batched, &|r, ceil| r.per_sec / ceil.0);
    let p99_64 = med(ci64, Variant::Batched, &|r| r.p99.as_secs_f64() * 1e3);
    let cpu_64 = med(ci64, Variant::Batched, &|r| r.redis_us);
    // The default store's Redis CPU per decision at 64 over its round's floor per key.
    let over_floor = per_round_median(&points, &floors, ci64, Variant::Batched, &|r, floor| {
        r.redis_us / floor.1
    });
    let keyed_floor = median(keyed_floors.iter().map(|f| f.0).collect());
    let keyed_floor_cpu = median(keyed_floors.iter().map(|f| f.1).collect());
    let over_keyed_floor = per_round_median(
        &points,
        &keyed_floors,
        ci64,
        Variant::Batched,
        &|r, floor| r.redis_us / floor.1,
    );
    println!(
        "floor (median of {rounds}): {floor_cpu:.2} µs of Redis CPU per key; the batched store at 64 spends {over_floor:.2}x its round's floor per decision ({over_keyed_floor:.2}x the floor on its key names with TTLs, {keyed_floor_cpu:.2} µs)"
    );
    println!(
        "medians of {rounds} rounds: ceiling {ceiling:.0}/s; batched {:.2}x its round's ceiling at 64, {:.2}x at 256; batched at 64: p99 {p99_64:.2} ms, redis CPU {cpu_64:.2} µs per decision",
        vs_ceiling(ci64),
        vs_ceiling(ci256),
    );
    let cluster_med = |c: usize, batched: bool, f: &dyn Fn(&Result) -> f64| {
        median(
            cluster_points
                .iter()
                .filter(|(pc, b, _)| *pc == c && *b == batched)
                .map(|(_, _, r)| f(r))
                .collect(),
        )
    };
    let fixed_ratio = median(
        fixed_rounds
            .iter()
            .map(|f| f.store.redis_us / f.envoy.redis_us)
            .collect(),
    );
    println!(
        "fixed window at 64 (median of {rounds}): the store spends {fixed_ratio:.2}x the Redis CPU of envoy's INCRBY + EXPIRE per decision"
    );
    write_section(&Figures {
        rounds,
        fixed: &fixed_rounds,
        p1,
        p1_cpu,
        floor,
        floor_cpu,
        over_floor,
        keyed_floor,
        keyed_floor_cpu,
        over_keyed_floor,
        ceiling,
        ceiling_cpu,
        med: &med,
        paired: &paired,
        cluster: &cluster_med,
    });
}

/// One round's fixed-window points at 64 callers.
#[derive(Debug, Clone, Copy)]
struct FixedWindowRound {
    /// envoy ratelimit's way: INCRBY + EXPIRE pipelined per decision.
    envoy: Result,
    /// The default store with one fixed window that never refuses.
    store: Result,
    /// The same with a window of 1 a minute: nearly every check refused.
    refusing: Result,
}

/// The default store with one fixed window of `count` a minute at 64 callers.
fn fixed_point(rt: &tokio::runtime::Runtime, sampler: &Sampler, url: &str, count: u64) -> Result {
    let store = rt.block_on(async { fixed_window_store(url, count) });
    let (mut r, mean) = rt.block_on(bench_built(sampler, store, 64));
    r.mean_batch = mean;
    r
}

/// Which way a point sent its decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Eval,
    Unbatched,
    Batched,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Batched, Variant::Unbatched, Variant::Eval];

    fn short(self) -> &'static str {
        match self {
            Variant::Eval => "(a) per-request EVAL",
            Variant::Unbatched => "store, unbatched",
            Variant::Batched => "store, batched",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Variant::Eval => "(a) per-request EVAL of the seeds' script",
            Variant::Unbatched => "RedisStore, batching(false)",
            Variant::Batched => "RedisStore, default (batched)",
        }
    }
}

/// The median over the rounds of `g(point, that round's figure)` for the `v` point at
/// concurrency index `ci`: `per_round[i]` is round `i`'s ceiling or floor.
fn per_round_median(
    points: &[Vec<(usize, Variant, Result)>],
    per_round: &[(f64, f64)],
    ci: usize,
    v: Variant,
    g: &dyn Fn(&Result, (f64, f64)) -> f64,
) -> f64 {
    median(
        points
            .iter()
            .zip(per_round)
            .flat_map(|(round, &figure)| {
                round
                    .iter()
                    .filter(move |(c, var, _)| *c == ci && *var == v)
                    .map(move |(_, _, r)| g(r, figure))
            })
            .collect(),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

type Median<'a> = &'a dyn Fn(usize, Variant, &dyn Fn(&Result) -> f64) -> f64;

struct Figures<'a> {
    rounds: usize,
    fixed: &'a [FixedWindowRound],
    p1: f64,
    p1_cpu: f64,
    /// The floor script's keys per second and Redis CPU µs per key.
    floor: f64,
    floor_cpu: f64,
    /// The default store's Redis CPU per decision at 64 callers over the floor's per key, the
    /// median over the rounds of each round's pair.
    over_floor: f64,
    /// The floor (c') on the store's key names with TTLs: keys per second, Redis CPU µs per key,
    /// and the store's figure over it.
    keyed_floor: f64,
    keyed_floor_cpu: f64,
    over_keyed_floor: f64,
    ceiling: f64,
    ceiling_cpu: f64,
    med: Median<'a>,
    /// Medians over the rounds of a point's figure against its round's ceiling (rate, Redis
    /// CPU per request).
    paired: Paired<'a>,
    /// Medians of the Cluster points: (concurrency, batched, figure).
    cluster: ClusterMedian<'a>,
}

type Paired<'a> = &'a dyn Fn(usize, Variant, &dyn Fn(&Result, (f64, f64)) -> f64) -> f64;

type ClusterMedian<'a> = &'a dyn Fn(usize, bool, &dyn Fn(&Result) -> f64) -> f64;

/// The `redis` section of BENCHMARKS.md (target/bench-report/redis.json).
fn write_section(f: &Figures<'_>) {
    let med = f.med;
    let method = format!(
        "One `redis-server` ({}) started by the bench on a free loopback port, no persistence. \
         {KEYS} keys drawn at random, a token bucket of 1 000/s with a burst of 100 000 (never \
         refusing), {:?} per point after a 0.5 s warm-up, from a tokio runtime with 2 worker \
         threads; each of 1, 64 and 256 tasks sends one decision at a time through \
         `Store::check` (a `RedisStore` with its default configuration, and with \
         `batching(false)`), or (a) as a per-request `EVAL` of the seeds' token-bucket script over \
         one multiplexed connection. The ceiling is (b) `redis-benchmark -c 50 -P 16` running that \
         script by `EVALSHA` on the same server: what one Redis does when the client costs \
         nothing. {} rounds, each the ceiling, the default store at 64 and 256 callers, the \
         ceiling again (the round's ceiling is the mean of the two), the floor (c), then the \
         other points; \
         figures are medians over the rounds, and a ratio to the ceiling is the median over the \
         rounds of a point over its round's ceiling. Redis CPU per decision is the server's `used_cpu_user + \
         used_cpu_sys` (INFO cpu) over the point, divided by the decisions; script time is \
         `INFO commandstats` usec of EVAL/EVALSHA per decision.",
        redis_version(),
        secs(),
        f.rounds
    );
    let mut section = report::Section::new(
        "redis",
        "Redis store: decisions per second against one redis-server",
        "cargo bench --features redis --bench redis",
        &method,
    );
    let mut table = report::Table::new(
        format!("Medians of {} rounds", f.rounds),
        &[
            "concurrency",
            "client",
            "decisions/s",
            "vs ceiling",
            "p50",
            "p99",
            "Redis CPU µs/decision",
            "in-script µs/decision (wall)",
            "client CPU µs/decision",
            "mean batch",
        ],
    );
    for (ci, c) in CONCURRENCY.iter().enumerate() {
        for v in Variant::ALL {
            let rate = med(ci, v, &|r| r.per_sec);
            table.row(&[
                c.to_string(),
                v.label().to_string(),
                format!("{rate:.0}"),
                format!("{:.2}x", (f.paired)(ci, v, &|r, ceil| r.per_sec / ceil.0)),
                format!("{:.0} µs", med(ci, v, &|r| r.p50.as_secs_f64() * 1e6)),
                format!("{:.0} µs", med(ci, v, &|r| r.p99.as_secs_f64() * 1e6)),
                format!("{:.2}", med(ci, v, &|r| r.redis_us)),
                format!("{:.2}", med(ci, v, &|r| r.script_us)),
                format!("{:.2}", med(ci, v, &|r| r.client_us)),
                if v == Variant::Batched {
                    format!("{:.1}", med(ci, v, &|r| r.mean_batch))
                } else {
                    "1".to_string()
                },
            ]);
        }
    }
    section.table(table);
    let mut ceiling = report::Table::new(
        "redis-benchmark, 50 connections: EVALSHA of the seeds' script, and (c) the floor",
        &["pipeline", "requests/s", "Redis CPU µs/request"],
    );
    ceiling.row(&[
        "-P 1".to_string(),
        format!("{:.0}", f.p1),
        format!("{:.2}", f.p1_cpu),
    ]);
    ceiling.row(&[
        format!("-P 16 (the ceiling, median of {})", f.rounds),
        format!("{:.0}", f.ceiling),
        format!("{:.2}", f.ceiling_cpu),
    ]);
    ceiling.row(&[
        format!(
            "-P 16, (c) the floor: {FLOOR_BATCH} keys per call, per key (median of {})",
            f.rounds
        ),
        format!("{:.0}", f.floor),
        format!("{:.2}", f.floor_cpu),
    ]);
    ceiling.row(&[
        format!(
            "-P 16, (c') the floor on the store's key names, with TTLs, per key (median of {})",
            f.rounds
        ),
        format!("{:.0}", f.keyed_floor),
        format!("{:.2}", f.keyed_floor_cpu),
    ]);
    section.table(ceiling);
    let xs: Vec<f64> = CONCURRENCY.iter().map(|&c| c as f64).collect();
    let mut rate = report::Plot::new(
        "redis.svg",
        "Decisions per second against one redis-server",
        "concurrent callers",
        "decisions per second",
    )
    .log_x();
    let mut p99 = report::Plot::new(
        "redis-p99.svg",
        "p99 latency of a decision",
        "concurrent callers",
        "p99 latency (ms)",
    )
    .log_x();
    for v in Variant::ALL {
        let series = |g: &dyn Fn(&Result) -> f64| -> Vec<(f64, f64)> {
            xs.iter()
                .enumerate()
                .map(|(ci, &x)| (x, med(ci, v, g)))
                .collect()
        };
        rate.series(v.label(), series(&|r| r.per_sec));
        p99.series(v.label(), series(&|r| r.p99.as_secs_f64() * 1e3));
    }
    rate.series(
        "(b) redis-benchmark -P 16 ceiling",
        xs.iter().map(|&x| (x, f.ceiling)).collect(),
    );
    section.plot(rate).plot(p99);
    let ci = |c: usize| CONCURRENCY.iter().position(|&x| x == c).unwrap();
    let what = "RedisStore (default) / its round's -P 16 ceiling, decisions/s";
    for (c, target) in [(64, 1.0), (256, 1.5)] {
        let ratio = (f.paired)(ci(c), Variant::Batched, &|r, ceil| r.per_sec / ceil.0);
        section.ratio(what, &format!("concurrency {c}"), ratio, target);
    }
    // The same comparison in Redis's own CPU, the resource that bounds both when Redis is the
    // bottleneck (one thread): capacity = 1 / CPU per decision. Other load on the machine moves
    // wall-clock rates far more than it moves CPU per decision.
    let what = "Redis-bound capacity: its round's ceiling's Redis CPU per request / RedisStore's per decision";
    for (c, target) in [(64, 1.0), (256, 1.5)] {
        let ratio = (f.paired)(ci(c), Variant::Batched, &|r, ceil| ceil.1 / r.redis_us);
        section.ratio(what, &format!("concurrency {c}"), ratio, target);
    }
    let cpu = med(ci(64), Variant::Batched, &|r| r.redis_us);
    section.ratio(
        "Redis CPU budget 3 µs / Redis CPU per decision",
        &format!("concurrency 64 ({cpu:.2} µs)"),
        3.0 / cpu,
        1.0,
    );
    section.ratio(
        "Redis CPU budget 3 µs / the floor's Redis CPU per key (c)",
        &format!("{FLOOR_BATCH} keys per call ({:.2} µs)", f.floor_cpu),
        3.0 / f.floor_cpu,
        1.0,
    );
    let p99_64 = med(ci(64), Variant::Batched, &|r| r.p99.as_secs_f64() * 1e3);
    section.ratio(
        "p99 budget 2 ms / p99 of a decision",
        &format!("concurrency 64 ({p99_64:.2} ms)"),
        2.0 / p99_64,
        1.0,
    );
    section.note(
        "Redis CPU includes the server's network work (reading commands, writing replies): \
         batching divides it by the batch; the script column is the time inside EVAL/EVALSHA.",
    );
    section.note(
        "(c) The floor: `redis-benchmark -P 16` running a script that only does the Redis work \
         every batched decision needs, one `MGET` of its call's keys and one `SET ... KEEPTTL` of \
         a 16-byte value per key (a token bucket's batched write keeps the key's TTL while it \
         covers the refill, as it does for this bench's keys, written many times per eighth of \
         their TTL), 16 keys per call, on \
         the same server, once a round after the ceiling. No store that writes every decided key \
         can spend less Redis CPU per decision than that on this machine; the store's figure \
         above it is the decision itself (Lua) and reading the call.",
    );
    section.note(format!(
        "The default store at 64 callers spends {:.2}x the floor's Redis CPU per key on a \
         decision (the median over the rounds of each round's store point over that round's \
         floor): the 3 µs budget would need {:.2}x; the target is at most 2x.",
        f.over_floor,
        3.0 / f.floor_cpu
    ));
    section.ratio(
        "Twice the floor's Redis CPU per key (c) / RedisStore's per decision",
        &format!("concurrency 64 ({:.2}x the floor)", f.over_floor),
        2.0 / f.over_floor,
        1.0,
    );
    section.note(format!(
        "(c') The same floor on keys shaped as the store's (`bench:{{<16 characters>}}:tb:bench:h.<32 hex digits>`, \
         68 bytes where (c)'s are 19) that hold a TTL (written with one first), as every key a \
         store writes must: {:.2} µs per key. The default store at 64 callers spends {:.2}x that \
         per decision (the median over the rounds of each round's pair).",
        f.keyed_floor_cpu, f.over_keyed_floor
    ));
    fixed_window_part(&mut section, f);
    let mut cluster = report::Table::new(
        format!(
            "Redis Cluster, 3 masters on this machine, medians of {} rounds",
            f.rounds
        ),
        &[
            "concurrency",
            "client",
            "decisions/s",
            "p50",
            "p99",
            "Redis CPU µs/decision (on its node)",
            "vs one node's ceiling CPU",
            "mean batch",
        ],
    );
    for c in CLUSTER_CONCURRENCY {
        for batched in [true, false] {
            let m = |g: &dyn Fn(&Result) -> f64| (f.cluster)(c, batched, g);
            let cpu = m(&|r| r.redis_us);
            cluster.row(&[
                c.to_string(),
                if batched {
                    "RedisStore on a Cluster, default (batched per master)"
                } else {
                    "RedisStore on a Cluster, batching(false)"
                }
                .to_string(),
                format!("{:.0}", m(&|r| r.per_sec)),
                format!("{:.0} µs", m(&|r| r.p50.as_secs_f64() * 1e6)),
                format!("{:.0} µs", m(&|r| r.p99.as_secs_f64() * 1e6)),
                format!("{cpu:.2}"),
                format!("{:.2}x", f.ceiling_cpu / cpu),
                format!("{:.1}", m(&|r| r.mean_batch)),
            ]);
        }
    }
    section.table(cluster);
    section.note(
        "Cluster: the same store and load on a 3-master Cluster (no replicas) started by the \
         bench on loopback ports of the same machine, so the three servers and the client share \
         its cores. A batch holds the checks of one master, whatever their hash slots. Redis CPU \
         is the sum over the masters divided by the decisions: the CPU a decision costs the \
         master that decides it. The ceiling column compares it with the -P 16 ceiling's Redis \
         CPU per request on one node (capacity per master = 1 / CPU per decision).",
    );
    section.write();
}

/// The fixed window against envoy ratelimit's pipeline: a table, its ratio and what a refused
/// request spends.
fn fixed_window_part(section: &mut report::Section, f: &Figures<'_>) {
    let med = |g: &dyn Fn(&FixedWindowRound) -> f64| median(f.fixed.iter().map(g).collect());
    let mut table = report::Table::new(
        format!(
            "Fixed window against envoy ratelimit's pipeline, concurrency 64, medians of {} rounds",
            f.rounds
        ),
        &[
            "client",
            "decisions/s",
            "p50",
            "p99",
            "Redis CPU µs/decision",
            "client CPU µs/decision",
            "mean batch",
        ],
    );
    type Point = fn(&FixedWindowRound) -> Result;
    let points: [(&str, Point); 3] = [
        (
            "(d) envoy-style: INCRBY + EXPIRE pipelined per decision",
            |r| r.envoy,
        ),
        ("RedisStore, default, one fixed window (allowing)", |r| {
            r.store
        }),
        ("RedisStore, default, one fixed window (refusing)", |r| {
            r.refusing
        }),
    ];
    for (label, point) in points {
        table.row(&[
            label.to_string(),
            format!("{:.0}", med(&|r| point(r).per_sec)),
            format!("{:.0} µs", med(&|r| point(r).p50.as_secs_f64() * 1e6)),
            format!("{:.0} µs", med(&|r| point(r).p99.as_secs_f64() * 1e6)),
            format!("{:.2}", med(&|r| point(r).redis_us)),
            format!("{:.2}", med(&|r| point(r).client_us)),
            format!("{:.1}", med(&|r| point(r).mean_batch)),
        ]);
    }
    section.table(table);
    let over = med(&|r| r.store.redis_us / r.envoy.redis_us);
    section.ratio(
        "envoy-style pipeline's Redis CPU per decision / RedisStore's, one fixed window",
        &format!("concurrency 64 ({over:.2}x envoy's)"),
        1.0 / over,
        1.0 / 1.5,
    );
    section.note(format!(
        "(d) envoy ratelimit's fixed window as its Redis backend sends it: per decision, \
         `INCRBY key 1` and `EXPIRE key 60` in one pipeline, on a key named after the minute, over \
         one multiplexed connection from the same runtime (redis-rs), against the default store \
         with one fixed window of a minute (10 000 000 a minute: never refusing; and 1 a minute: \
         refusing all but each key's first check), in the same round, on the same {KEYS} keys. \
         The ratio is the median over the rounds of the store's Redis CPU per decision over \
         envoy's: {over:.2}x. What a refused request spends: envoy's is the same two commands \
         as an allowed one (`INCRBY` counts past the limit and `EXPIRE` sets the key's TTL \
         again); the store's is its share of the batch's call and `MGET`, the unpacking of the \
         state it read and one integer of reply, with no write (the refusing row; the key keeps \
         its count and TTL)."
    ));
}

fn redis_version() -> String {
    let out = Command::new("redis-server").arg("--version").output();
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(|v| format!("Redis {v}")))
        })
        .unwrap_or_else(|| "Redis".to_string())
}

/// usec spent in EVAL and EVALSHA so far (INFO commandstats).
fn script_usec(stats: &str) -> f64 {
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split(',')
                .find_map(|kv| kv.split_once("usec="))
                .filter(|(k, _)| !k.ends_with('_'))
                .and_then(|(_, v)| v.parse::<f64>().ok())
        })
        .sum()
}

fn show(r: Result) -> String {
    format!(
        "{:>8.0}/s  p50 {:>8.2?}  p99 {:>8.2?}  cpu: redis {:>5.2} (script {:>5.2}), client {:>5.2}",
        r.per_sec, r.p50, r.p99, r.redis_us, r.script_us, r.client_us
    )
}
