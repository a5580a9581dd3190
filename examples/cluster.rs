//! The quickstart on a Redis Cluster: `GET /` allows each client IP a burst of 5 requests,
//! refilled at 1 per second, shared by every instance of the app. A client's limits hash to one
//! slot (the hash tag is derived from the client key), so each decision is one atomic script on
//! one master.
//!
//! ```text
//! # a 3-master cluster on ports 7000-7002
//! for p in 7000 7001 7002; do
//!   redis-server --port $p --cluster-enabled yes --cluster-config-file nodes-$p.conf \
//!     --save '' --appendonly no --daemonize yes
//! done
//! redis-cli --cluster create 127.0.0.1:7000 127.0.0.1:7001 127.0.0.1:7002 \
//!   --cluster-replicas 0 --cluster-yes
//! PORT=3000 cargo run --features redis --example cluster &
//! PORT=3001 cargo run --features redis --example cluster &
//! for i in $(seq 5); do
//!   curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/
//!   curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3001/
//! done
//! ```
//!
//! Ten requests over two instances: exactly five `200`s.
//!
//! - `REDIS_CLUSTER_NODES` (default `redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002`):
//!   seed nodes, comma-separated.
//! - `FAIL_MODE=open|closed|local` (default `closed`), as in the `redis` example.
//! - `PORT` (default `3000`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tollgate::key::PeerIp;
use tollgate::store::redis::RedisBackend;
use tollgate::store::FailurePolicy;
use tollgate::{Limit, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = std::env::var("REDIS_CLUSTER_NODES").unwrap_or_else(|_| {
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002".into()
    });
    let nodes: Vec<String> = nodes.split(',').map(|s| s.trim().to_owned()).collect();
    let mode = std::env::var("FAIL_MODE").unwrap_or_else(|_| "closed".into());
    let policy = match mode.to_ascii_lowercase().as_str() {
        "open" => FailurePolicy::Open,
        "closed" => FailurePolicy::Closed {
            retry_after: Duration::from_secs(1),
        },
        "local" => FailurePolicy::Local { share: 0.5 },
        other => return Err(format!("FAIL_MODE={other:?}: use open, closed or local").into()),
    };

    let rate_limit = RateLimitLayer::builder()
        .limit(
            Limit::new("per-ip", Quota::per_second(1).burst(5))
                .key(PeerIp::new())
                .on_store_error(policy),
        )
        .backend(RedisBackend::cluster(nodes.clone()))
        .build()?;

    let app = Router::new()
        .route("/", get(|| async { "Hello, world!\n" }))
        .layer(rate_limit);

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!(
        "state in the Redis Cluster at {}; when it is unreachable: FAIL_MODE={mode}",
        nodes.join(", ")
    );
    println!(
        "try: for i in $(seq 6); do curl -si http://{addr}/ | grep -iE '^(HTTP|x-ratelimit|retry-after)'; done"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
