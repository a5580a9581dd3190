//! `tollgate::outbound` around a tonic `Channel`, against a tonic server behind tollgate's own
//! server layer: the server's `RESOURCE_EXHAUSTED` (trailers-only, with `grpc-retry-pushback-ms`
//! and `RetryInfo` in `grpc-status-details-bin`, as `src/response/grpc*.rs` writes them; the
//! layer reads the pushback first, and `RetryInfo` alone is checked in `tests/outbound/outbound.rs`)
//! pauses the client for every caller, and the next call waits it out instead of being refused. Real time: the pauses are
//! about a second, and only lower bounds (a sleep never ends early) are asserted.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tollgate::key::GlobalKey;
use tollgate::outbound::{NoReplay, OutboundLayer};
use tollgate::{Limit, Quota, RateLimitLayer};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::ServiceBuilder;

const GUARD: Duration = Duration::from_secs(20);

/// A health server allowing one call per second, with or without `X-RateLimit-*` on answers.
async fn serve(x_ratelimit: bool) -> SocketAddr {
    let layer = RateLimitLayer::builder()
        .limit(Limit::new("global", Quota::per_second(1).burst(1)).key(GlobalKey))
        .x_ratelimit_headers(x_ratelimit)
        .build()
        .unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    addr
}

async fn channel(addr: SocketAddr) -> Channel {
    tokio::time::timeout(
        GUARD,
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect(),
    )
    .await
    .unwrap()
    .unwrap()
}

fn check() -> tonic::Request<HealthCheckRequest> {
    tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    })
}

#[tokio::test]
async fn resource_exhausted_pauses_a_channel_and_the_next_call_waits_it_out() {
    // No X-RateLimit-* on answers: the refusal is the first the client hears of the limit.
    let channel = channel(serve(false).await).await;
    // gRPC calls are POSTs with a streaming body: never replayed.
    let layer = OutboundLayer::builder().replay(NoReplay).build().unwrap();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(channel);
    let mut a = HealthClient::new(svc.clone());
    let mut b = HealthClient::new(svc);

    tokio::time::timeout(GUARD, a.check(check()))
        .await
        .unwrap()
        .unwrap();
    // The bucket of one is empty: the server refuses, with RetryInfo of 1 s.
    let err = tokio::time::timeout(GUARD, a.check(check()))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    // The request URI carries no authority above the Channel: the key is "".
    let paused = layer.status("").unwrap().paused_for();
    assert!(paused > Duration::from_millis(500), "{paused:?}");
    // Another client on the same layer waits for the pause and is served.
    let started = Instant::now();
    tokio::time::timeout(GUARD, b.check(check()))
        .await
        .unwrap()
        .unwrap();
    assert!(started.elapsed() >= paused.saturating_sub(Duration::from_millis(20)));
}

#[tokio::test]
async fn remaining_zero_holds_the_next_call_back_before_any_refusal() {
    let channel = channel(serve(true).await).await;
    let layer = OutboundLayer::builder().replay(NoReplay).build().unwrap();
    let mut client = HealthClient::new(ServiceBuilder::new().layer(layer.clone()).service(channel));
    tokio::time::timeout(GUARD, client.check(check()))
        .await
        .unwrap()
        .unwrap();
    // `X-RateLimit-Remaining: 0` with its reset: the layer waits instead of being refused.
    let paused = layer.status("").unwrap().paused_for();
    assert!(paused > Duration::ZERO);
    let started = Instant::now();
    let res = tokio::time::timeout(GUARD, client.check(check()))
        .await
        .unwrap();
    assert!(res.is_ok(), "{res:?}");
    assert!(started.elapsed() >= paused.saturating_sub(Duration::from_millis(20)));
}
