//! gRPC: a tonic server with the standard health service (`grpc.health.v1.Health`), limited per
//! client IP by a token bucket of capacity 5 refilled at 1 per second, with the in-memory store.
//!
//! ```text
//! cargo run --example grpc
//! cargo run --example grpc_client   # in another terminal: six Check calls
//! ```
//!
//! The first five calls answer `SERVING` with `x-ratelimit-limit: 5` and `x-ratelimit-remaining`
//! 4, 3, 2, 1, 0 in the response metadata; the sixth fails with `RESOURCE_EXHAUSTED`, whose
//! `grpc-status-details-bin` decodes to a `google.rpc.RetryInfo` (`retry_delay` 1 s) and a
//! `google.rpc.QuotaFailure` naming the limit `per-ip`. `PORT` changes the port (default 50051).
//!
//! `PeerIp` reads the client address from the `TcpConnectInfo` tonic records for every
//! connection: with tollgate's `tonic` feature nothing else is needed.

use std::net::SocketAddr;

use tollgate::key::PeerIp;
use tollgate::{Limit, Quota, RateLimitLayer};
use tonic::transport::Server;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rate_limit = RateLimitLayer::new(
        Limit::new("per-ip", Quota::per_second(1).burst(5)).key(PeerIp::new()),
    )?;

    // The health service reports the whole server ("") as SERVING.
    let (_reporter, health) = tonic_health::server::health_reporter();

    let port = std::env::var("PORT").unwrap_or_else(|_| "50051".into());
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    println!("listening on {addr} (gRPC, grpc.health.v1.Health)");
    println!("try: PORT={port} cargo run --example grpc_client");
    Server::builder()
        .layer(rate_limit)
        .add_service(health)
        .serve(addr)
        .await?;
    Ok(())
}
