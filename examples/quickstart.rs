//! Quickstart: an axum app whose `GET /` allows each client IP a burst of 5 requests, refilled at
//! 1 per second (a token bucket), with the in-memory store.
//!
//! ```text
//! cargo run --example quickstart
//! for i in $(seq 6); do curl -si http://127.0.0.1:3000/ | grep -iE '^(HTTP|x-ratelimit|retry-after)'; done
//! ```
//!
//! Five `200`s with `X-RateLimit-Limit: 5` and `X-RateLimit-Remaining` 4, 3, 2, 1, 0, then a
//! `429` with `Retry-After: 1` and an `application/problem+json` body. `PORT` changes the port.

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use tollgate::key::PeerIp;
use tollgate::{Limit, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rate_limit = RateLimitLayer::new(
        Limit::new("per-ip", Quota::per_second(1).burst(5)).key(PeerIp::new()),
    )?;

    let app = Router::new()
        .route("/", get(|| async { "Hello, world!\n" }))
        .layer(rate_limit);

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!(
        "try: for i in $(seq 6); do curl -si http://{addr}/ | grep -iE '^(HTTP|x-ratelimit|retry-after)'; done"
    );
    // PeerIp reads the peer address that `into_make_service_with_connect_info` records.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
