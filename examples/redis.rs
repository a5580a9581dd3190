//! The quickstart with its state in Redis: `GET /` allows each client IP a burst of 5 requests,
//! refilled at 1 per second (a token bucket), and every instance of the app shares the limit.
//!
//! ```text
//! redis-server --port 6379 --save '' --appendonly no &
//! PORT=3000 cargo run --features redis --example redis &
//! PORT=3001 cargo run --features redis --example redis &
//! for i in $(seq 5); do
//!   curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/
//!   curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3001/
//! done
//! ```
//!
//! Ten requests spread over two instances get exactly five `200`s: the bucket lives in Redis, not
//! in either process. The rest are `429` with `Retry-After` and a problem+json body.
//!
//! - `REDIS_URL` (default `redis://127.0.0.1:6379`): where the state lives; credentials go in it
//!   (`redis://user:password@host:6379`), and `rediss://` needs the `redis-tls` feature.
//! - `REDIS_SENTINELS` (comma-separated `host:port`, e.g. `10.0.0.1:26379,10.0.0.2:26379`) and
//!   `REDIS_MASTER` (default `mymaster`): instead of `REDIS_URL`, the primary the Sentinels
//!   monitor under that master name, followed through failovers.
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
use tollgate::store::redis::RedisBackend;
use tollgate::{Limit, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let (mode, policy) = failure_policy()?;

    let sentinels = std::env::var("REDIS_SENTINELS").ok();
    let master = std::env::var("REDIS_MASTER").unwrap_or_else(|_| "mymaster".into());
    let backend = match &sentinels {
        Some(list) => RedisBackend::sentinel(list.split(',').map(str::trim), master.clone()),
        None => RedisBackend::new(redis_url.clone()),
    };
    let stats = backend.stats();
    let rate_limit = RateLimitLayer::builder()
        .limit(
            Limit::new("per-ip", Quota::per_second(1).burst(5))
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
    let host = match &sentinels {
        Some(list) => format!("the primary of {master:?} (sentinels {list})"),
        None => redis_url
            .rsplit_once('@')
            .map_or(redis_url.as_str(), |(_, host)| host)
            .to_owned(),
    };
    println!("state in Redis at {host}; when Redis is unreachable: FAIL_MODE={mode}");
    println!(
        "try: for i in $(seq 6); do curl -si http://{addr}/ | grep -iE '^(HTTP|x-ratelimit|retry-after)'; done"
    );
    // Report what the failure policy did, now and then.
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        let mut last = (0, 0, 0);
        loop {
            tick.tick().await;
            let now = (
                stats.fail_open(),
                stats.fail_closed(),
                stats.local_fallback(),
            );
            if now != last {
                println!(
                    "redis unavailable: {} let through, {} refused, {} decided locally (breaker open: {})",
                    now.0,
                    now.1,
                    now.2,
                    stats.breaker_open()
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
