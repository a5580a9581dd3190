//! The quickstart with a local tier in front of Redis: `GET /` allows each client IP 100
//! requests per 10 s (a token bucket: capacity 100, refilled at 10 per second), shared by every
//! instance through Redis, while most decisions never leave the process.
//!
//! ```text
//! redis-server --port 6379 --save '' --appendonly no &
//! for port in 3000 3001 3002 3003; do PORT=$port cargo run --features redis --example hybrid & done
//! for i in $(seq 1000); do echo "http://127.0.0.1:$((3000 + i % 4))/"; done \
//!   | xargs -P 64 -n 1 curl -s -o /dev/null -w '%{http_code}\n' | sort | uniq -c
//! redis-cli info commandstats
//! ```
//!
//! A thousand requests from one client spread over four instances get about 100 `200`s (plus
//! 10 per second the run lasts), never more than a single shared bucket would admit; the rest are
//! `429` with `Retry-After` and a problem+json body, as in the quickstart. Each instance leases a
//! slice of the budget from Redis in one script call (at most a quarter of the capacity, for at
//! most a second), decides locally until it is spent, and remembers a refusal until its retry-after,
//! so Redis sees a few dozen script calls instead of a thousand (`redis-cli info commandstats`).
//!
//! - `REDIS_URL` (default `redis://127.0.0.1:6379`): where the shared state lives.
//! - `FAIL_MODE=open|closed|local` (default `closed`): what happens when Redis is unreachable —
//!   let requests through (logged and counted), refuse them with `503` and `Retry-After`, or
//!   decide with a local in-memory limiter holding half the quota.
//! - `PORT` (default `3000`).

#[path = "common/fail_mode.rs"]
mod fail_mode;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use fail_mode::failure_policy;
use tollgate::key::PeerIp;
use tollgate::store::hybrid::HybridBackend;
use tollgate::store::redis::RedisBackend;
use tollgate::{Limit, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let (mode, policy) = failure_policy()?;

    // One lease serves many requests, so a request may wait a little longer for one than the
    // Redis store's default 5 ms: a busy machine then still decides by Redis, not by FAIL_MODE.
    let redis = RedisBackend::new(redis_url.clone()).timeout(Duration::from_millis(50));
    let redis_stats = redis.stats();
    let backend = HybridBackend::new(redis);
    let stats = backend.stats();
    let rate_limit = RateLimitLayer::builder()
        .limit(
            // 100 per 10 s: a bucket of 100, refilled at 10 per second.
            Limit::new("per-ip", Quota::per_second(10).burst(100))
                .key(PeerIp::new())
                .on_store_error(policy),
        )
        .backend(backend)
        .build()?;

    let app = Router::new()
        .route("/", get(|| async { "Hello, world!\n" }))
        .layer(rate_limit);

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    // The URL may hold a password: print where it points, not who connects.
    let host = redis_url
        .rsplit_once('@')
        .map_or(redis_url.as_str(), |(_, host)| host);
    println!(
        "state in Redis at {host}, local tier on; when Redis is unreachable: FAIL_MODE={mode}"
    );
    println!(
        "try: for i in $(seq 6); do curl -si http://{addr}/ | grep -iE '^(HTTP|x-ratelimit|retry-after)'; done"
    );
    // Report how many decisions stayed local, now and then.
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        let mut last = (0, 0, 0);
        loop {
            tick.tick().await;
            let now = (
                stats.local_allowed() + stats.local_rejected(),
                stats.redis_calls(),
                redis_stats.local_fallback() + redis_stats.fail_open() + redis_stats.fail_closed(),
            );
            if now != last {
                println!(
                    "decided locally: {}, redis calls: {}, decided by FAIL_MODE while redis was unavailable: {}",
                    now.0, now.1, now.2
                );
                last = now;
            }
        }
    });
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
