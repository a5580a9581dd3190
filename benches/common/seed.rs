//! The seeds' token-bucket script and `redis-benchmark`, for the Redis benches' ceilings.

use std::process::Command;

use super::harness::redis_server::RedisServer;

/// The token bucket of the seeds (`001`), verbatim: server `TIME` in ms, a hash per key.
pub const SEED_TOKEN_BUCKET: &str = r#"
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

/// `EVALSHA` of [`SEED_TOKEN_BUCKET`] (loaded as `sha`) on a random key `rl:N`, as
/// `redis-benchmark` takes it: 100 000 tokens, 1 000 per second, cost 1.
pub fn seed_command(sha: &str) -> Vec<String> {
    [
        "EVALSHA",
        sha,
        "1",
        "rl:__rand_int__",
        "100000",
        "1000",
        "1",
    ]
    .map(String::from)
    .to_vec()
}

/// `redis-benchmark -c 50 -n n -P pipeline -r keys` of one command; requests per second and
/// redis-server CPU µs per request.
pub fn run_redis_benchmark(
    server: &RedisServer,
    command: &[String],
    n: u64,
    pipeline: u32,
    keys: u64,
) -> (f64, f64) {
    let port = server.port();
    let cpu0 = redis_cpu(server);
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-c", "50"])
        .args([
            "-n",
            &n.to_string(),
            "-P",
            &pipeline.to_string(),
            "-r",
            &keys.to_string(),
            "--csv",
        ])
        .args(command)
        .output()
        .expect("run redis-benchmark (Debian package redis-tools / redis-server)");
    let text = String::from_utf8_lossy(&out.stdout);
    let redis_us = (redis_cpu(server) - cpu0) * 1e6 / n as f64;
    // "test","rps","avg_latency_ms",...  then one row per test.
    let rps = text
        .lines()
        .filter(|l| l.starts_with("\"EVALSHA"))
        .filter_map(|l| l.split(',').nth(1))
        .filter_map(|v| v.trim_matches('"').parse::<f64>().ok())
        .next()
        .unwrap_or_else(|| panic!("cannot parse redis-benchmark output:\n{text}"));
    (rps, redis_us)
}

/// CPU seconds redis-server has used so far (user + system).
pub fn redis_cpu(server: &RedisServer) -> f64 {
    cpu_of(&server.cmd::<String>(&["INFO", "cpu"]))
}

/// The CPU seconds (user + system) in an `INFO cpu` reply.
pub fn cpu_of(info: &str) -> f64 {
    info.lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum()
}
