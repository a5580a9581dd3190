//! Key extractors: who a request is counted against.
//!
//! A [`KeyExtractor`] turns a [`RequestView`](crate::RequestView) into a [`Key`]. Keys borrow
//! from the request where they can, so extracting a header or a route costs no allocation.
//!
//! | extractor | key | use it when |
//! |---|---|---|
//! | [`PeerIp`] | the TCP peer's address (IPv6 grouped by `/64`) | clients connect directly |
//! | [`ClientIp`] | the client's address reported by **trusted** proxies | behind a load balancer |
//! | [`HeaderKey`] | a header's value (`x-api-key`), gRPC metadata too | API keys checked before the limiter |
//! | [`Principal`] | a typed value an auth layer put in the extensions | per user / tenant |
//! | [`RouteKey`] | another key, per method and matched route | per-endpoint budgets |
//! | [`GrpcMethod`] | another key, per gRPC method (`/package.Service/Method`) | per-RPC budgets |
//! | [`GlobalKey`] | one key for all | a ceiling protecting a backend |
//! | [`FirstOf`], [`KeyExtractor::or`] | the first extractor that has a key | users, else IPs |
//! | a `fn`, or a closure in [`key_fn`] | anything | see [`KeyExtractor`] |
//!
//! When no key can be extracted the extractor returns a [`KeyError`] (never panics): either the
//! request lacks what the key needs, or, for [misconfigurations](KeyError::is_misconfiguration),
//! the server was set up so that no request can have one. The layer decides what such a request
//! gets.
//!
//! # Examples
//!
//! Per client address behind a proxy at `10.0.0.0/8`, in a layer: each client has its own budget,
//! and a client that reaches the server directly cannot pick one by forging `X-Forwarded-For`.
//!
//! ```
//! use std::convert::Infallible;
//! use std::net::SocketAddr;
//!
//! use http::{Request, Response, StatusCode};
//! use tollgate::key::ClientIp;
//! use tollgate::{Limit, Quota, RateLimitLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let layer = RateLimitLayer::new(
//!     Limit::new("per-client", Quota::per_minute(1)).key(ClientIp::trusting(["10.0.0.0/8"]).unwrap()),
//! )
//! .unwrap();
//! let app = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) }));
//!
//! let request = |peer: &str, forwarded_for: &str| {
//!     let mut req = Request::get("/").header("x-forwarded-for", forwarded_for).body(()).unwrap();
//!     req.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
//!     req
//! };
//!
//! // Two clients behind the proxy at 10.0.0.2: one request each.
//! for client in ["203.0.113.9", "198.51.100.4"] {
//!     let res = app.clone().oneshot(request("10.0.0.2:443", client)).await.unwrap();
//!     assert_eq!(res.status(), StatusCode::OK);
//!     assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
//! }
//! // A forged entry on the left changes nothing: the proxy appended the real address.
//! let res = app.clone().oneshot(request("10.0.0.2:443", "192.0.2.1, 203.0.113.9")).await.unwrap();
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//!
//! // Straight from the internet, the header is ignored: the key is the peer, 192.0.2.50.
//! let res = app.clone().oneshot(request("192.0.2.50:5000", "192.0.2.1")).await.unwrap();
//! assert_eq!(res.status(), StatusCode::OK);
//! let res = app.clone().oneshot(request("192.0.2.50:5000", "192.0.2.2")).await.unwrap();
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert!(res.headers().contains_key("retry-after"));
//! # }
//! ```
//!
//! The extractor alone, on a request:
//!
//! ```
//! use std::net::SocketAddr;
//! use tollgate::key::{ClientIp, KeyExtractor};
//! use tollgate::RequestView;
//!
//! let key = ClientIp::trusting(["10.0.0.0/8"]).unwrap();
//!
//! let mut req = http::Request::get("/")
//!     .header("x-forwarded-for", "198.51.100.1, 203.0.113.9")
//!     .body(())
//!     .unwrap();
//! req.extensions_mut().insert("10.0.0.2:443".parse::<SocketAddr>().unwrap());
//! assert_eq!(key.extract(&RequestView::new(&req)).unwrap().to_string(), "ip:203.0.113.9");
//! ```
//!
//! Per signed-in user and endpoint, anonymous callers per address:
//!
//! ```
//! use std::net::SocketAddr;
//! use tollgate::key::{Key, KeyExtractor, PeerIp, Principal, RouteKey};
//! use tollgate::RequestView;
//!
//! #[derive(Clone)]
//! struct User {
//!     id: u64,
//! }
//!
//! let key = RouteKey::new(Principal::new(|u: &User| Key::int(u.id)).or(PeerIp::new()))
//!     .unmatched_as("other");
//!
//! let mut req = http::Request::get("/search").body(()).unwrap();
//! req.extensions_mut().insert("192.0.2.7:5000".parse::<SocketAddr>().unwrap());
//! assert_eq!(key.extract(&RequestView::new(&req)).unwrap().to_string(), "GET other|ip:192.0.2.7");
//!
//! req.extensions_mut().insert(User { id: 42 });
//! assert_eq!(key.extract(&RequestView::new(&req)).unwrap().to_string(), "GET other|int:42");
//! ```
//!
//! A function of your own:
//!
//! ```
//! use tollgate::key::{Key, KeyError, KeyExtractor};
//! use tollgate::RequestView;
//!
//! /// Per `?tenant=` query parameter (only sensible if an earlier layer validated it).
//! fn by_tenant<'r>(req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
//!     req.uri()
//!         .query()
//!         .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("tenant=")))
//!         .map(Key::string)
//!         .ok_or_else(|| KeyError::new("missing tenant query parameter"))
//! }
//!
//! let req = http::Request::get("/items?tenant=acme&page=2").body(()).unwrap();
//! assert_eq!(by_tenant.extract(&RequestView::new(&req)).unwrap().to_string(), "b:acme");
//! ```

mod client_ip;
mod error;
mod extractor;
mod first_of;
mod forwarded;
mod global;
mod grpc_method;
mod header;
mod ip;
mod missing;
mod notice;
mod peer;
mod principal;
mod route;
mod value;

pub use client_ip::{ClientIp, ForwardedHeader, X_FORWARDED_FOR, X_REAL_IP};
pub use error::KeyError;
pub use extractor::{key_fn, KeyExtractor};
pub use first_of::FirstOf;
pub use global::GlobalKey;
pub use grpc_method::GrpcMethod;
pub use header::HeaderKey;
pub use ip::Cidr;
pub use missing::MissingKey;
pub use peer::PeerIp;
pub use principal::Principal;
pub use route::RouteKey;
pub use value::{Key, KeyValue};

pub(crate) use notice::{report_misconfiguration, Consequence};
pub(crate) use route::matched_route;
