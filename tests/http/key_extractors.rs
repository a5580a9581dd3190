//! Key extractors behind real servers on 127.0.0.1, driven by a real HTTP client: the peer address
//! from axum's `ConnectInfo` and from a hyper server's `SocketAddr` extension, trusted-proxy
//! spoofing cases, and the matched route as seen by `Router::layer` and `Router::route_layer`.
#![cfg(feature = "axum")]

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Extension, Request};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tollgate::cost::{Cost, CostTable};
use tollgate::key::{ClientIp, ForwardedHeader, GlobalKey, KeyExtractor, PeerIp, RouteKey};
use tollgate::RequestView;
use tower::util::MapRequestLayer;

use crate::harness::http_server::serve_url as serve;

/// What the extractor under test made of a request, stashed by the layer for the handler.
#[derive(Clone)]
struct Extracted(String);

/// A layer standing where a rate limiter would: it runs `extractor` and records the outcome.
fn extracting(
    extractor: impl KeyExtractor,
) -> MapRequestLayer<impl FnMut(Request) -> Request + Clone> {
    let extractor = Arc::new(extractor);
    MapRequestLayer::new(move |mut req: Request| {
        let outcome = match extractor.extract(&RequestView::new(&req)) {
            Ok(key) => key.to_string(),
            Err(err) => format!(
                "error(misconfiguration={}): {err}",
                err.is_misconfiguration()
            ),
        };
        req.extensions_mut().insert(Extracted(outcome));
        req
    })
}

async fn echo(Extension(Extracted(outcome)): Extension<Extracted>) -> String {
    outcome
}

async fn get_text(url: &str, headers: &[(&str, &str)]) -> String {
    let mut req = reqwest::Client::new().get(url);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn peer_ip_from_connect_info() {
    let app = Router::new()
        .route("/", get(echo))
        .layer(extracting(PeerIp::new()));
    let base = serve(app).await;
    // A forged header changes nothing.
    let key = get_text(&base, &[("x-forwarded-for", "203.0.113.9")]).await;
    assert_eq!(key, "ip:127.0.0.1");
}

#[tokio::test]
async fn untrusted_peer_cannot_spoof_its_address() {
    // The server trusts only 10.0.0.0/8; the test client connects from 127.0.0.1.
    let client_ip = ClientIp::trusting(["10.0.0.0/8"])
        .unwrap()
        .headers([
            ForwardedHeader::Forwarded,
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::XRealIp,
        ])
        .unwrap();
    let app = Router::new()
        .route("/", get(echo))
        .layer(extracting(client_ip));
    let base = serve(app).await;
    for (name, value) in [
        ("x-forwarded-for", "203.0.113.9"),
        ("x-forwarded-for", "10.0.0.1"),
        ("forwarded", "for=203.0.113.9"),
        ("x-real-ip", "203.0.113.9"),
    ] {
        let key = get_text(&base, &[(name, value)]).await;
        assert_eq!(key, "ip:127.0.0.1", "{name}: {value}");
    }
}

#[tokio::test]
async fn trusted_proxy_chain_yields_rightmost_untrusted_hop() {
    // Here the test client plays the proxy at 127.0.0.1, with another proxy at 10.0.0.7 before it.
    let client_ip = ClientIp::trusting(["127.0.0.0/8", "10.0.0.0/8"]).unwrap();
    let app = Router::new()
        .route("/", get(echo))
        .layer(extracting(client_ip.clone()));
    let base = serve(app).await;

    // The client at 203.0.113.9 prepended a fake entry; the proxies appended what they saw.
    let key = get_text(
        &base,
        &[("x-forwarded-for", "1.2.3.4, 203.0.113.9, 10.0.0.7")],
    )
    .await;
    assert_eq!(key, "ip:203.0.113.9");
    // Every hop trusted: the leftmost.
    let key = get_text(&base, &[("x-forwarded-for", "10.1.1.1, 10.0.0.7")]).await;
    assert_eq!(key, "ip:10.1.1.1");
    // Garbage reported by the proxy at 10.0.0.7: keyed by that proxy, never by the garbage.
    let key = get_text(
        &base,
        &[("x-forwarded-for", "203.0.113.9, bogus, 10.0.0.7")],
    )
    .await;
    assert_eq!(key, "ip:10.0.0.7");
    // IPv6 clients share a key per /64.
    let a = get_text(&base, &[("x-forwarded-for", "2001:db8:1:2::1, 10.0.0.7")]).await;
    let b = get_text(&base, &[("x-forwarded-for", "2001:db8:1:2:aaaa::1")]).await;
    let c = get_text(&base, &[("x-forwarded-for", "2001:db8:1:3::1")]).await;
    assert_eq!(a, "ip:2001:db8:1:2::");
    assert_eq!(a, b);
    assert_ne!(a, c);

    // RFC 7239, with brackets and ports.
    let forwarded = client_ip.headers([ForwardedHeader::Forwarded]).unwrap();
    let app = Router::new()
        .route("/", get(echo))
        .layer(extracting(forwarded));
    let base = serve(app).await;
    let key = get_text(
        &base,
        &[(
            "forwarded",
            "for=1.2.3.4, for=\"[2001:db8:cafe::17]:4711\";proto=https, for=10.0.0.7",
        )],
    )
    .await;
    assert_eq!(key, "ip:2001:db8:cafe::");
}

#[tokio::test]
async fn matched_route_through_layer_and_route_layer() {
    let per_route = RouteKey::new(PeerIp::new());
    let app = Router::new()
        .route("/users/{id}", get(echo).post(echo))
        .layer(extracting(per_route));
    let base = serve(app).await;
    assert_eq!(
        get_text(&format!("{base}/users/1"), &[]).await,
        "GET /users/{id}|ip:127.0.0.1"
    );
    assert_eq!(
        get_text(&format!("{base}/users/2"), &[]).await,
        "GET /users/{id}|ip:127.0.0.1"
    );
    let post = reqwest::Client::new()
        .post(format!("{base}/users/2"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(post, "POST /users/{id}|ip:127.0.0.1");

    let nested = Router::new().nest(
        "/api",
        Router::new()
            .route("/items/{id}", get(echo))
            .route_layer(extracting(RouteKey::new(GlobalKey))),
    );
    let base = serve(nested).await;
    assert_eq!(
        get_text(&format!("{base}/api/items/9"), &[]).await,
        "GET /api/items/{id}|global"
    );
}

#[tokio::test]
async fn unmatched_requests_are_reported_or_named() {
    // `Router::layer` also wraps the fallback, where no route matched.
    let strict = Router::new()
        .route("/a", get(echo))
        .fallback(echo)
        .layer(extracting(RouteKey::new(GlobalKey)));
    let base = serve(strict).await;
    let text = get_text(&format!("{base}/nowhere"), &[]).await;
    assert!(text.starts_with("error(misconfiguration=true)"), "{text}");

    let named = Router::new()
        .route("/a", get(echo))
        .fallback(echo)
        .layer(extracting(
            RouteKey::new(GlobalKey).unmatched_as("<unmatched>"),
        ));
    let base = serve(named).await;
    assert_eq!(
        get_text(&format!("{base}/x/1"), &[]).await,
        "GET <unmatched>|global"
    );
    assert_eq!(
        get_text(&format!("{base}/x/2"), &[]).await,
        "GET <unmatched>|global"
    );
}

#[tokio::test]
async fn cost_table_sees_the_matched_route() {
    let table = CostTable::new(1).route("/users/{id}", 7);
    let app = Router::new().route(
        "/users/{id}",
        get(move |req: Request| async move { table.cost(&RequestView::new(&req)).to_string() }),
    );
    let base = serve(app).await;
    assert_eq!(get_text(&format!("{base}/users/5"), &[]).await, "7");
}

#[tokio::test]
async fn plain_hyper_server_with_socket_addr_extension() {
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, peer) = listener.accept().await.unwrap();
        let service = service_fn(
            move |mut req: hyper::Request<hyper::body::Incoming>| async move {
                // What a hyper server does so that PeerIp and ClientIp can see the peer.
                req.extensions_mut().insert(peer);
                let key = PeerIp::new()
                    .extract(&RequestView::new(&req))
                    .map(|k| k.to_string())
                    .unwrap_or_else(|e| e.to_string());
                Ok::<_, Infallible>(hyper::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from(key),
                )))
            },
        );
        http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await
            .unwrap();
    });
    assert_eq!(
        get_text(&format!("http://{addr}/"), &[]).await,
        "ip:127.0.0.1"
    );
}
