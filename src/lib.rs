//! Rate limiting as Tower middleware.
//!
//! `tollgate` puts named rate limits in front of any [`tower`](https://docs.rs/tower) service
//! over `http` requests: axum routers (`Router::layer`, or per route with `Router::route_layer`),
//! tonic servers, plain hyper services. Each limit is a [`Quota`] enforced by one of six
//! [algorithms](algorithm), counted per [key] (peer IP, client IP behind trusted proxies,
//! API key, principal, route, or one global key) at a [cost] per request, in an in-memory
//! LRU-bounded [store] or (feature `redis`) a shared Redis. Several limits in one layer
//! are all-or-nothing: a request refused by one spends nothing from the others.
//!
//! Every response carries `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`
//! (optionally the IETF `RateLimit` / `RateLimit-Policy` fields, see [`headers`]); a refused
//! request gets `429 Too Many Requests` with `Retry-After` and an RFC 9457 problem+json body (a
//! gRPC `RESOURCE_EXHAUSTED` for gRPC calls), pluggable through [`response::Rejection`].
//!
//! # Quick start
//!
//! An axum app whose `GET /` allows each client IP a burst of 5 requests refilled at 1 per
//! second (`cargo run --example quickstart` runs it):
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use tollgate::key::PeerIp;
//! use tollgate::{Limit, Quota, RateLimitLayer};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let app = Router::new()
//!     .route("/", get(|| async { "Hello, world!" }))
//!     .layer(RateLimitLayer::new(
//!         Limit::new("per-ip", Quota::per_second(1).burst(5)).key(PeerIp::new()),
//!     )?);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // PeerIp reads the address recorded by `into_make_service_with_connect_info`.
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! The same limit around any service, checked here with `tower::ServiceExt::oneshot`:
//!
//! ```
//! use std::convert::Infallible;
//! use std::net::SocketAddr;
//! use http::{Request, Response, StatusCode};
//! use tollgate::key::PeerIp;
//! use tollgate::{Decision, Limit, Quota, RateLimitLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(
//!         Limit::new("per-ip", Quota::per_second(1).burst(5)).key(PeerIp::new()),
//!     )?)
//!     .service(service_fn(|req: Request<()>| async move {
//!         // Handlers see the decision.
//!         let left = req.extensions().get::<Decision>().map_or(0, |d| d.remaining());
//!         Ok::<_, Infallible>(Response::new(format!("{left} left")))
//!     }));
//!
//! let request = || {
//!     let mut req = Request::get("/").body(()).unwrap();
//!     req.extensions_mut().insert("203.0.113.9:5000".parse::<SocketAddr>().unwrap());
//!     req
//! };
//! for remaining in ["4", "3", "2", "1", "0"] {
//!     let res = svc.clone().oneshot(request()).await?;
//!     assert_eq!(res.status(), StatusCode::OK);
//!     assert_eq!(res.headers()["x-ratelimit-limit"], "5");
//!     assert_eq!(res.headers()["x-ratelimit-remaining"], remaining);
//! }
//! let res = svc.clone().oneshot(request()).await?;
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(res.headers()["retry-after"], "1");
//! assert_eq!(res.headers()["content-type"], "application/problem+json");
//! # Ok(())
//! # }
//! ```
//!
//! # Modules
//!
//! | module | what it holds |
//! |---|---|
//! | [`rate_limit`] | [`RateLimitLayer`] and its builder, [`Limit`], [`RateLimit`], the response future and body |
//! | [`quota`] | [`Quota`]: `Quota::per_second(10).burst(50)`, parsing of `"100/min"` |
//! | [`algorithm`] | token bucket, GCRA, fixed window, sliding window, sliding log, leaky bucket, and how to choose |
//! | [`key`] | key extractors: who a request is counted against |
//! | [`cost`] | cost functions: how much a request spends |
//! | [`store`] | where state lives: the in-memory store, Redis (feature `redis`) |
//! | [`headers`] | `X-RateLimit-*`, IETF `RateLimit` / `RateLimit-Policy`, `Retry-After` |
//! | [`response`] | rejections: problem+json, gRPC, and the [`Rejection`](response::Rejection) trait |
//! | [`clock`] | time sources, including a manual clock for tests |
//! | [`plan`] | plans: which quota applies to a request (per API key, per header, per principal) |
//! | [`policy`] | limits as data (TOML or any serde format), compiled into [`Limit`]s, and reloads (feature `serde`) |
//! | [`concurrency`] | a limit on requests in flight per key, released when the response body ends |
//! | [`outbound`] | client side: keep a client to its upstreams' limits (shaping, `Retry-After`, retries, adaptive rate) |
//! | [`metrics`] | the metrics recorded with the `metrics` feature: names, labels, `describe()` |
//!
//! # Features
//!
//! | feature | enables |
//! |---|---|
//! | `axum` | [`PeerIp`](key::PeerIp) reads axum's `ConnectInfo`; route keys and cost tables read `MatchedPath` |
//! | `redis` | the Redis store, single node or Cluster |
//! | `tonic` | [`PeerIp`](key::PeerIp) and [`ClientIp`](key::ClientIp) read tonic's `TcpConnectInfo`; gRPC rejections carry `grpc-status-details-bin` (`RetryInfo`, `QuotaFailure`) |
//! | `serde` | [`policy`]: limits, plans and keys described as data in any serde format |
//! | `toml` | `Policy::from_toml_str` / `from_toml_file` and the policy file watcher (implies `serde`) |
//! | `reqwest` | [`OutboundMiddleware`](outbound::reqwest::OutboundMiddleware): the [`outbound`] layer as a `reqwest-middleware` middleware, for reqwest 0.12 clients |
//! | `metrics` | decisions, near-limit, store latency and errors, breaker state and keys held through the [`metrics`](https://docs.rs/metrics) facade ([`metrics`](mod@metrics)) |
//!
//! # Paths
//!
//! The types almost every user touches are re-exported at the crate root, and the root path is
//! the canonical one used throughout these docs, the README and the examples:
//! [`RateLimitLayer`], [`RateLimitLayerBuilder`], [`Limit`], [`MissingKey`], [`RateLimit`],
//! [`Quota`], [`AlgorithmKind`], [`Decision`], [`Name`], [`ConfigError`], [`StoreError`],
//! [`StoreErrorKind`], [`RequestView`] and [`Decisions`]. Their module paths (`tollgate::rate_limit::Limit`,
//! `tollgate::quota::Quota`, ...) keep working and name the same items. Everything else (key
//! extractors, costs, stores, clocks, headers, rejections) is used through its module:
//! `tollgate::key::PeerIp`, `tollgate::store::memory::MemoryBackend`, `tollgate::clock::ManualClock`.
//!
//! # Versioning
//!
//! `tollgate` follows semantic versioning; while it is `0.x`, a minor release (`0.1` → `0.2`)
//! may break the API and a patch release does not. The minimum supported Rust version (MSRV) is
//! the `rust-version` in `Cargo.toml`, checked in CI; raising it is a minor release. See the
//! README for the feature flags' stability.
// docs.rs builds with nightly and `--cfg docsrs`: `doc_cfg` marks each item with the features it
// needs. `.ci/run` also builds the docs on stable with `--cfg docsrs` to check those cfg paths,
// adding `--cfg tollgate_docs_stable` to leave out this nightly-only attribute.
#![cfg_attr(all(docsrs, not(tollgate_docs_stable)), feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

pub mod algorithm;
pub mod clock;
pub mod concurrency;
pub mod cost;
mod decision;
mod error;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
pub mod headers;
pub mod key;
pub mod metrics;
pub mod outbound;
pub mod plan;
#[cfg(feature = "serde")]
pub mod policy;
pub mod quota;
pub mod rate_limit;
mod request;
pub mod response;
pub mod store;

pub use algorithm::AlgorithmKind;
pub use decision::{Decision, Decisions, Name};
pub use error::{ConfigError, StoreError, StoreErrorKind};
pub use key::MissingKey;
pub use quota::Quota;
pub use rate_limit::{Limit, RateLimit, RateLimitLayer, RateLimitLayerBuilder};
pub use request::RequestView;

/// Compiles and runs every Rust code block of `README.md` as a doctest (`cargo test
/// --all-features`), so the README cannot drift from the API.
#[cfg(all(
    doctest,
    feature = "axum",
    feature = "redis",
    feature = "tonic",
    feature = "toml",
    feature = "metrics"
))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Compiles and runs every Rust code block of the guides in `docs/guide/` as doctests, as
/// `ReadmeDoctests` does for the README.
#[cfg(all(
    doctest,
    feature = "axum",
    feature = "redis",
    feature = "tonic",
    feature = "toml",
    feature = "metrics",
    feature = "reqwest"
))]
pub mod guide_doctests {
    #[doc = include_str!("../docs/guide/concurrency.md")]
    pub struct Concurrency;
    #[doc = include_str!("../docs/guide/grpc.md")]
    pub struct Grpc;
    #[doc = include_str!("../docs/guide/hybrid.md")]
    pub struct Hybrid;
    #[doc = include_str!("../docs/guide/outbound.md")]
    pub struct Outbound;
    #[doc = include_str!("../docs/guide/plans.md")]
    pub struct Plans;
    #[doc = include_str!("../docs/guide/redis.md")]
    pub struct Redis;
    #[doc = include_str!("../docs/guide/shaping.md")]
    pub struct Shaping;
}

#[cfg(test)]
mod structure_tests;
