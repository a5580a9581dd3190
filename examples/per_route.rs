//! Per-route limits and costs under a global ceiling, with the IETF headers turned on.
//!
//! ```text
//! cargo run --example per_route
//! curl -si http://127.0.0.1:3000/search | grep -iE '^(HTTP|x-ratelimit|ratelimit|retry-after)'
//! for i in $(seq 3); do curl -si -X POST http://127.0.0.1:3000/export | grep -iE '^(HTTP|x-ratelimit|retry-after)'; done
//! ```
//!
//! - Every route shares one layer with two limits, checked all-or-nothing: `per-ip` (120 units
//!   per minute per client IP, where `/search` costs 2 and `POST /export` 20) and `global` (a
//!   ceiling of 1,000 units per minute for the whole server).
//! - `/export` also has its own stricter limit, applied with `route_layer`: 2 exports per minute
//!   per client IP.
//! - `/health` is exempt.
//!
//! The third `POST /export` within a minute gets `429`, named by the `export` limit. Stacked
//! layers count independently: the outer layer has already charged that refused export to
//! `per-ip` and `global`. Limits that must be all-or-nothing belong in one layer.

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::Router;
use http::Method;
use tollgate::cost::CostTable;
use tollgate::key::{GlobalKey, PeerIp};
use tollgate::{Limit, Quota, RateLimitLayer, RequestView};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Weighted costs: an export is 20 times a plain request.
    let costs = CostTable::new(1)
        .route("/search", 2)
        .method_route(Method::POST, "/export", 20);

    let shared = RateLimitLayer::builder()
        .limit(
            Limit::new("per-ip", Quota::per_minute(120))
                .key(PeerIp::new())
                .cost(costs.clone()),
        )
        .limit(
            Limit::new("global", Quota::per_minute(1_000))
                .key(GlobalKey)
                .cost(costs),
        )
        .ietf_headers(true)
        .skip(|req: &RequestView<'_>| req.uri().path() == "/health")
        .build()?;

    let exports = RateLimitLayer::builder()
        .limit(Limit::new("export", Quota::per_minute(2)).key(PeerIp::new()))
        .ietf_headers(true)
        .build()?;

    let app = Router::new()
        .route("/", get(|| async { "home\n" }))
        .route("/search", get(|| async { "results\n" }))
        .route(
            "/export",
            post(|| async { "export started\n" }).route_layer(exports),
        )
        .route("/health", get(|| async { "ok\n" }))
        .layer(shared);

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!(
        "try: curl -si http://{addr}/search | grep -iE '^(HTTP|x-ratelimit|ratelimit|retry-after)'"
    );
    println!(
        "     for i in $(seq 3); do curl -si -X POST http://{addr}/export | grep -iE '^(HTTP|x-ratelimit|retry-after)'; done"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
