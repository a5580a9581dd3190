//! Service tests: `ServiceBuilder` + `oneshot`, time driven by a manual clock. The helpers
//! shared by the test files are here; [`test_store`] is a store that answers at once or later.

mod config;
mod nested;
mod responses;
#[cfg(feature = "redis")]
mod store_logs;
mod test_store;

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, ServiceBuilder};

use self::test_store::{Mode, TestBackend};
use super::*;
use crate::clock::ManualClock;
use crate::headers::{ResetFormat, RATELIMIT};
use crate::key::HeaderKey;
use crate::Decisions;
use crate::{Decision, Quota};

/// Key: the `x-client` header (a stand-in for a client identity).
fn client() -> HeaderKey {
    HeaderKey::new("x-client").unwrap()
}

/// Echoes the reported decision's remaining count, as a handler reading extensions would.
async fn handler(req: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
    if let Some(d) = req.extensions().get::<Decision>() {
        res.headers_mut()
            .insert("x-seen-remaining", d.remaining().into());
    }
    if let Some(all) = req.extensions().get::<Decisions>() {
        res.headers_mut()
            .insert("x-seen-count", (all.len() as u64).into());
    }
    Ok(res)
}

fn get(path: &str, client: &str) -> Request<()> {
    Request::get(path)
        .header("x-client", client)
        .body(())
        .unwrap()
}

/// A request from peer `ip`, as a hyper or axum server records it.
fn from_peer(ip: &str) -> Request<()> {
    let mut req = Request::get("/").body(()).unwrap();
    req.extensions_mut()
        .insert(std::net::SocketAddr::new(ip.parse().unwrap(), 40_000));
    req
}

type Svc = super::RateLimit<
    tower::util::ServiceFn<fn(Request<()>) -> HandlerFuture>,
    test_store::TestStore,
>;
type HandlerFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>,
>;

fn boxed_handler(req: Request<()>) -> HandlerFuture {
    Box::pin(handler(req))
}

fn service(builder: RateLimitLayerBuilder<TestBackend>) -> Svc {
    let layer = builder.build().unwrap();
    ServiceBuilder::new().layer(layer).service(service_fn(
        boxed_handler as fn(Request<()>) -> HandlerFuture,
    ))
}

fn builder(clock: &ManualClock, mode: Mode) -> RateLimitLayerBuilder<TestBackend> {
    RateLimitLayer::builder()
        .backend(TestBackend::new(clock, mode))
        .reset_format(ResetFormat::DeltaSeconds)
}

fn burst5() -> Limit {
    Limit::new("burst", Quota::per_second(1).burst(5)).key(client())
}

/// `(name, remaining)` of every item of the IETF `RateLimit` fields.
fn ietf_remaining<B>(res: &Response<B>) -> Vec<(String, u64)> {
    res.headers()
        .get_all(RATELIMIT)
        .iter()
        .flat_map(|v| v.to_str().unwrap().split(", "))
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap().trim_matches('"').to_owned();
            let r = parts
                .find_map(|p| p.strip_prefix("r="))
                .unwrap()
                .parse()
                .unwrap();
            (name, r)
        })
        .collect()
}

async fn body_json(res: Response<ResponseBody<Full<Bytes>>>) -> serde_json::Value {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

fn header<B>(res: &Response<B>, name: impl http::header::AsHeaderName) -> &str {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or("<none>")
}
