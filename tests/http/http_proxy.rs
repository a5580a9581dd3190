//! Client IPs behind trusted proxies, through real TCP connections from 127.0.0.1: forwarding
//! headers are believed only from trusted peers, and only their rightmost untrusted hop.

use axum::routing::get;
use axum::Router;
use reqwest::StatusCode;
use tollgate::key::{ClientIp, KeyExtractor, PeerIp};
use tollgate::{Limit, Quota, RateLimitLayer};

use crate::harness::http_server;

/// A server allowing 2 requests per hour per key, answering with the remaining count.
async fn serve(key: impl KeyExtractor) -> String {
    let layer = RateLimitLayer::new(Limit::new("per-client", Quota::per_hour(2)).key(key)).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    format!("{}/", http_server::serve_url(app).await)
}

async fn status(url: &str, xff: Option<&str>) -> StatusCode {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut req = http.get(url);
    if let Some(xff) = xff {
        req = req.header("x-forwarded-for", xff);
    }
    req.send().await.unwrap().status()
}

#[tokio::test]
async fn untrusted_peer_cannot_pick_a_fresh_key_with_x_forwarded_for() {
    // Our proxies live in 10.0.0.0/8; the test client connects from 127.0.0.1, untrusted.
    let url = serve(ClientIp::trusting(["10.0.0.0/8"]).unwrap()).await;
    assert_eq!(status(&url, Some("198.51.100.1")).await, StatusCode::OK);
    assert_eq!(status(&url, Some("198.51.100.2")).await, StatusCode::OK);
    // Every spoofed address was ignored: all three count against 127.0.0.1.
    assert_eq!(
        status(&url, Some("198.51.100.3")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status(&url, None).await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn trusted_proxy_forwards_the_rightmost_untrusted_hop() {
    // Now 127.0.0.1 plays our proxy.
    let url = serve(ClientIp::trusting(["127.0.0.1/32"]).unwrap()).await;
    // The client forged "6.6.6.6"; the proxy appended the address it saw, 203.0.113.7.
    for forged in ["6.6.6.6, 203.0.113.7", "7.7.7.7, 203.0.113.7"] {
        assert_eq!(status(&url, Some(forged)).await, StatusCode::OK, "{forged}");
    }
    // A third request from 203.0.113.7, whatever it forges, is over its limit.
    assert_eq!(
        status(&url, Some("8.8.8.8, 203.0.113.7")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another client behind the same proxy has its own budget.
    assert_eq!(status(&url, Some("203.0.113.8")).await, StatusCode::OK);
    // A chain of trusted hops only: the leftmost is the client (here 127.0.0.1 itself).
    assert_eq!(status(&url, Some("127.0.0.1")).await, StatusCode::OK);
    // Garbage cannot mint keys: it stops the walk at the trusted hop (the proxy, 127.0.0.1).
    assert_eq!(status(&url, Some("garbage")).await, StatusCode::OK);
    assert_eq!(
        status(&url, Some("more-garbage")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn peer_ip_ignores_forwarding_headers() {
    let url = serve(PeerIp::new()).await;
    assert_eq!(status(&url, Some("198.51.100.1")).await, StatusCode::OK);
    assert_eq!(status(&url, Some("198.51.100.2")).await, StatusCode::OK);
    assert_eq!(
        status(&url, Some("198.51.100.3")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}
