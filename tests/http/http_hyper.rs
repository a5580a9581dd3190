//! The layer on a plain hyper server (no axum), through `tower::ServiceBuilder`.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use reqwest::StatusCode;
use tollgate::key::PeerIp;
use tollgate::{Limit, Quota, RateLimitLayer};
use tower::ServiceBuilder;

async fn hello(_: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

#[tokio::test]
async fn limits_a_plain_hyper_service() {
    let layer =
        RateLimitLayer::new(Limit::new("per-ip", Quota::per_hour(2)).key(PeerIp::new())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            // hyper does not record the peer: put it where PeerIp looks, then rate-limit.
            let svc = ServiceBuilder::new()
                .map_request(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert::<SocketAddr>(peer);
                    req
                })
                .layer(layer.clone())
                .service_fn(hello);
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc))
                    .await;
            });
        }
    });

    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{addr}/");
    for remaining in ["1", "0"] {
        let res = http.get(&url).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-ratelimit-remaining"], remaining);
        assert_eq!(res.text().await.unwrap(), "hello");
    }
    let res = http.get(&url).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "1800");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["policy"], "per-ip");
}
