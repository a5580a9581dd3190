//! The layer on a real tonic server (`Server::builder().layer(..)`, the standard health service)
//! called by a real tonic client over 127.0.0.1: unary `Check` and server-streaming `Watch`,
//! Google's error model on rejections, per-method keys, metadata API keys, a missing key, and
//! several limits that are all-or-nothing.

use std::net::SocketAddr;
use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::cost::CostTable;
use tollgate::key::MissingKey;
use tollgate::key::{ClientIp, GlobalKey, GrpcMethod, HeaderKey, PeerIp};
use tollgate::store::{memory::MemoryBackend, Store};
use tollgate::{Limit, Quota, RateLimitLayer};
use tonic::metadata::MetadataMap;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::HealthReporter;
use tonic_types::StatusExt;

/// Hang guard for every network wait: generous, never a timing assertion.
const GUARD: Duration = Duration::from_secs(20);

/// Serves the health service behind `layer` on 127.0.0.1 and returns its address and reporter.
async fn serve<S: Store>(layer: RateLimitLayer<S>) -> (SocketAddr, HealthReporter) {
    let (reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    (addr, reporter)
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = tokio::time::timeout(
        GUARD,
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect(),
    )
    .await
    .expect("connect hung")
    .unwrap();
    HealthClient::new(channel)
}

/// A `Check` request for the whole server, with optional `x-api-key` metadata.
fn check_request(api_key: Option<&str>) -> tonic::Request<HealthCheckRequest> {
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    if let Some(key) = api_key {
        req.metadata_mut().insert("x-api-key", key.parse().unwrap());
    }
    req
}

async fn check(
    client: &mut HealthClient<Channel>,
    api_key: Option<&str>,
) -> Result<tonic::Response<HealthCheckResponse>, Status> {
    tokio::time::timeout(GUARD, client.check(check_request(api_key)))
        .await
        .expect("Check hung")
}

fn meta<'m>(metadata: &'m MetadataMap, name: &str) -> &'m str {
    metadata
        .get(name)
        .unwrap_or_else(|| panic!("no {name} metadata in {metadata:?}"))
        .to_str()
        .unwrap()
}

fn remaining(metadata: &MetadataMap) -> &str {
    meta(metadata, "x-ratelimit-remaining")
}

/// The next message's status on a `Watch` stream.
async fn next(stream: &mut tonic::Streaming<HealthCheckResponse>) -> ServingStatus {
    tokio::time::timeout(GUARD, stream.message())
        .await
        .expect("stream hung")
        .unwrap()
        .expect("a message")
        .status()
}

/// The one `QuotaFailure` violation's subject, and the `RetryInfo` delay if any.
fn details(status: &Status) -> (String, Option<Duration>) {
    let details = status.get_error_details();
    let failure = details.quota_failure().expect("a QuotaFailure detail");
    assert_eq!(failure.violations.len(), 1, "{failure:?}");
    let retry = details.retry_info().and_then(|r| r.retry_delay);
    (failure.violations[0].subject.clone(), retry)
}

#[tokio::test]
async fn unary_calls_are_limited_per_ip_with_googles_error_model() {
    // The snippet from the docs, with a manual clock so the refill cannot race the test.
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(clock.clone()))
        .limit(Limit::new("per-ip", Quota::per_second(1).burst(5)).key(PeerIp::new()))
        .build()
        .unwrap();
    let (addr, _reporter) = serve(layer).await;
    let mut client = client(addr).await;

    for left in ["4", "3", "2", "1", "0"] {
        let res = check(&mut client, None).await.unwrap();
        assert_eq!(res.get_ref().status(), ServingStatus::Serving);
        assert_eq!(meta(res.metadata(), "x-ratelimit-limit"), "5");
        assert_eq!(remaining(res.metadata()), left);
    }

    let status = check(&mut client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.message(),
        "rate limit \"per-ip\" (1/s burst 5) exhausted; retry in 1 s"
    );
    let md = status.metadata();
    assert_eq!(meta(md, "retry-after"), "1");
    assert_eq!(meta(md, "grpc-retry-pushback-ms"), "1000");
    assert_eq!(meta(md, "x-ratelimit-limit"), "5");
    assert_eq!(remaining(md), "0");

    let error = status.get_error_details();
    assert_eq!(
        error.retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(1))
    );
    let violation = &error.quota_failure().unwrap().violations[0];
    assert_eq!(violation.subject, "per-ip");
    assert_eq!(violation.description, "1 per second, bursts of up to 5");
    assert!(!violation.description.contains("127.0.0.1"));

    // A second later one token is back.
    clock.advance(Duration::from_secs(1));
    let res = check(&mut client, None).await.unwrap();
    assert_eq!(remaining(res.metadata()), "0");
}

#[tokio::test]
async fn streams_are_refused_at_open_and_charged_once() {
    let layer =
        RateLimitLayer::new(Limit::new("per-ip", Quota::per_hour(2)).key(PeerIp::new())).unwrap();
    let (addr, reporter) = serve(layer).await;
    let mut client = client(addr).await;

    let open = |client: &mut HealthClient<Channel>| {
        let mut client = client.clone();
        async move {
            tokio::time::timeout(
                GUARD,
                client.watch(HealthCheckRequest {
                    service: String::new(),
                }),
            )
            .await
            .expect("Watch hung")
        }
    };

    let first = open(&mut client).await.unwrap();
    assert_eq!(remaining(first.metadata()), "1");
    let mut stream = first.into_inner();
    // Several messages on the open stream: the initial status, then each change.
    assert_eq!(next(&mut stream).await, ServingStatus::Serving);
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    assert_eq!(next(&mut stream).await, ServingStatus::NotServing);
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    assert_eq!(next(&mut stream).await, ServingStatus::Serving);

    // The three messages cost nothing: one unit is left for a second stream.
    let second = open(&mut client).await.unwrap();
    assert_eq!(remaining(second.metadata()), "0");

    // The third stream is refused at open, before any message.
    let status = open(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let (subject, retry) = details(&status);
    assert_eq!(subject, "per-ip");
    assert_eq!(retry, Some(Duration::from_secs(1800)));

    // The first stream is still open and delivering.
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    assert_eq!(next(&mut stream).await, ServingStatus::NotServing);
}

#[tokio::test]
async fn per_method_keys_and_method_costs() {
    let layer = RateLimitLayer::builder()
        .limit(Limit::new("per-method", Quota::per_hour(1)).key(GrpcMethod::new(PeerIp::new())))
        .limit(
            Limit::new("per-ip", Quota::per_hour(5))
                .key(PeerIp::new())
                .cost(CostTable::new(1).route("/grpc.health.v1.Health/Watch", 3)),
        )
        .build()
        .unwrap();
    let (addr, _reporter) = serve(layer).await;
    let mut client = client(addr).await;

    // Check and Watch have separate per-method budgets; Watch costs 3 of the per-ip budget.
    check(&mut client, None).await.unwrap();
    let watch = tokio::time::timeout(
        GUARD,
        client.watch(HealthCheckRequest {
            service: String::new(),
        }),
    )
    .await
    .unwrap()
    .unwrap();
    let md = watch.metadata();
    // The headers describe the limit closest to refusing: per-method, with 0 left.
    assert_eq!(remaining(md), "0");

    // Check's method budget is spent; the refusal names the per-method limit.
    let status = check(&mut client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(details(&status).0, "per-method");
}

#[tokio::test]
async fn method_costs_come_from_a_cost_table() {
    let layer = RateLimitLayer::new(
        Limit::new("per-ip", Quota::per_hour(4))
            .key(PeerIp::new())
            .cost(CostTable::new(1).route("/grpc.health.v1.Health/Watch", 3)),
    )
    .unwrap();
    let (addr, _reporter) = serve(layer).await;
    let mut client = client(addr).await;

    let watch = client
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(remaining(watch.metadata()), "1");
    let res = check(&mut client, None).await.unwrap();
    assert_eq!(remaining(res.metadata()), "0");
    // Another Watch (3) no longer fits.
    let status = client
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn metadata_api_keys_and_a_missing_key() {
    let layer = RateLimitLayer::new(
        Limit::new("per-key", Quota::per_hour(1))
            .key(HeaderKey::new("x-api-key").unwrap())
            .on_missing_key(MissingKey::reject_with(http::StatusCode::UNAUTHORIZED)),
    )
    .unwrap();
    let (addr, _reporter) = serve(layer).await;
    let mut client = client(addr).await;

    let res = check(&mut client, Some("key-a")).await.unwrap();
    assert_eq!(remaining(res.metadata()), "0");
    let status = check(&mut client, Some("key-a")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let (subject, _) = details(&status);
    assert_eq!(subject, "per-key");
    // The client's key appears nowhere in what the client is told.
    let shown = format!("{:?} {:?}", status.get_error_details(), status.metadata());
    assert!(!shown.contains("key-a"), "{shown}");
    // Another key has its own budget.
    check(&mut client, Some("key-b")).await.unwrap();

    // No x-api-key metadata: UNAUTHENTICATED, naming the limit, with no details to retry on.
    let status = check(&mut client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("per-key"), "{}", status.message());
    assert!(status.get_error_details().retry_info().is_none());
}

#[tokio::test]
async fn missing_key_defaults_to_invalid_argument() {
    let layer = RateLimitLayer::new(
        Limit::new("per-key", Quota::per_hour(1)).key(HeaderKey::new("x-api-key").unwrap()),
    )
    .unwrap();
    let (addr, _reporter) = serve(layer).await;
    let mut client = client(addr).await;
    let status = check(&mut client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

#[tokio::test]
async fn several_limits_are_all_or_nothing() {
    let layer = RateLimitLayer::builder()
        .limit(Limit::new("per-key", Quota::per_hour(2)).key(HeaderKey::new("x-api-key").unwrap()))
        .limit(Limit::new("global", Quota::per_hour(3)).key(GlobalKey))
        .build()
        .unwrap();
    let (addr, _reporter) = serve(layer).await;
    let mut client = client(addr).await;

    check(&mut client, Some("a")).await.unwrap();
    check(&mut client, Some("a")).await.unwrap();
    // Refused by per-key: the global limit is not charged for it.
    for _ in 0..3 {
        let status = check(&mut client, Some("a")).await.unwrap_err();
        assert_eq!(details(&status).0, "per-key");
    }
    // So one global unit is still there for b, and only then is global exhausted.
    let res = check(&mut client, Some("b")).await.unwrap();
    assert_eq!(remaining(res.metadata()), "0");
    let status = check(&mut client, Some("b")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(details(&status).0, "global");
}

#[tokio::test]
async fn client_ip_behind_a_trusted_proxy_reads_the_tonic_peer() {
    // The test client plays a proxy at 127.0.0.1 that forwards for two clients.
    let layer = RateLimitLayer::new(
        Limit::new("per-client", Quota::per_hour(1))
            .key(ClientIp::trusting(["127.0.0.1"]).unwrap()),
    )
    .unwrap();
    let (addr, _reporter) = serve(layer).await;
    let mut client = client(addr).await;
    let forwarded_for = |ip: &str| {
        let mut req = check_request(None);
        req.metadata_mut()
            .insert("x-forwarded-for", ip.parse().unwrap());
        req
    };

    for ip in ["203.0.113.9", "198.51.100.4"] {
        client.check(forwarded_for(ip)).await.unwrap();
    }
    let status = client
        .check(forwarded_for("203.0.113.9"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    // Without a forwarding header the proxy itself is the client, with its own budget.
    client.check(check_request(None)).await.unwrap();
}

/// Over a Unix socket tonic records no `TcpConnectInfo`: the per-IP limit cannot identify the
/// client, and says so (`INTERNAL`, with tonic's fix in the status message).
#[cfg(unix)]
#[tokio::test]
async fn a_unix_socket_server_without_a_peer_is_internal_not_unlimited() {
    use hyper_util::rt::TokioIo;
    use tokio::net::{UnixListener, UnixStream};
    use tokio_stream::wrappers::UnixListenerStream;

    let dir = std::env::temp_dir().join(format!("tollgate-grpc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("uds.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let layer =
        RateLimitLayer::new(Limit::new("per-ip", Quota::per_hour(100)).key(PeerIp::new())).unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );

    let connect_path = path.clone();
    let channel = tonic::transport::Endpoint::try_from("http://[::1]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = connect_path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let status = check(&mut client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    let message = status.message();
    assert!(
        message.starts_with(
            "rate limit \"per-ip\" cannot identify the client because the server is misconfigured: "
        ),
        "{message}"
    );
    assert!(message.contains("TcpConnectInfo"), "{message}");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
}
