//! Rate limiting as Tower middleware.
//!
//! `tollgate` puts named rate limits in front of any [`tower`](https://docs.rs/tower) service
//! over `http` requests: axum routers (`Router::layer`, or per route with `Router::route_layer`),
//! tonic servers, plain hyper services. Each limit is a [`Quota`] enforced by one of six
//! [algorithms](algorithm), counted per [key] (peer IP, client IP behind trusted proxies,
//! API key, principal, route, or one global key) at a [cost] per request, in a bounded in-memory
//! [store] or (feature `redis`) a shared Redis. Several limits in one layer
//! are all-or-nothing: a request refused by one spends nothing from the others.
//!
//! Every response carries `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`
//! (optionally the IETF `RateLimit` / `RateLimit-Policy` fields, see [`headers`]); a refused
//! request gets `429 Too Many Requests` with `Retry-After` and an RFC 9457 problem+json body (a
//! gRPC `RESOURCE_EXHAUSTED` for gRPC calls), pluggable through [`response::Rejection`].
//!
//! # Quick start
//!
//! One limit around a service, here checked with `tower::ServiceExt::oneshot`; on an axum
//! `Router` it is `.layer(..)` the same way (the [getting started](guide::getting_started)
//! guide serves it, and lists the Cargo features).
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
//!     // A burst of 5 per client IP, refilled at 1 per second.
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
//!     // What axum's `into_make_service_with_connect_info` records for PeerIp to read.
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
//! # Guides
//!
//! The [`guide`] module holds the guides by topic: [getting started](guide::getting_started),
//! [algorithms](guide::algorithms), [keys and proxies](guide::keys), [headers](guide::headers),
//! [plans and policy files](guide::plans), [Redis and Cluster](guide::redis), [the hybrid
//! tier](guide::hybrid), [gRPC](guide::grpc), [shaping](guide::shaping),
//! [concurrency](guide::concurrency), [load shedding](guide::load_shedding),
//! [outbound](guide::outbound), [metrics and operations](guide::operations), [testing your
//! app](guide::testing_your_app), [coming from tower_governor](guide::tower_governor),
//! [performance](guide::performance) and [versioning](guide::versioning). The modules below are the reference.
//!
//! # Modules
//!
//! | module | what it holds |
//! |---|---|
//! | [`rate_limit`] | [`RateLimitLayer`] and its builder, [`Limit`] and its options (modes, charging, overrides, shaping), [`RateLimit`], the response future and body |
//! | [`quota`] | [`Quota`]: `Quota::per_second(10).burst(50)`, calendar alignment, parsing of `"100/min"` |
//! | [`algorithm`] | token bucket, GCRA, fixed window, sliding window, sliding log, leaky bucket, each a pure transition |
//! | [`key`] | key extractors: who a request is counted against, and [`MissingKey`] |
//! | [`cost`] | cost functions: how much a request spends |
//! | [`plan`] | plans: which quota applies to a request (per API key, per header, per principal) |
//! | [`store`] | where state lives: memory, Redis and Redis Cluster, the hybrid tier; failure policies |
//! | [`headers`] | `X-RateLimit-*`, IETF `RateLimit` / `RateLimit-Policy`, `Retry-After` |
//! | [`response`] | refusals: problem+json, gRPC, and the [`Rejection`](response::Rejection) trait |
//! | [`clock`] | time sources, including [`ManualClock`](clock::ManualClock) for tests |
//! | [`concurrency`] | a limit on requests in flight per key, released when the response body ends |
//! | [`load_shed`] | load shedding: a concurrency limit learned from latency, shared out by priority, `503` beyond it |
//! | [`outbound`] | client side: keep a client to its upstreams' limits (shaping, `Retry-After`, retries, adaptive rate) |
//! | [`metrics`] | the metrics recorded with the `metrics` feature: names, labels, `describe()` |
//! | [`policy`](policy/index.html) | limits, plans and keys as data (TOML or any serde format), compiled into [`Limit`]s; reloads (feature `serde`) |
//! | [`guide`] | the guides by topic (documentation only) |
//!
//! # Features
//!
//! No feature is on by default; each one only adds.
//!
//! | feature | enables |
//! |---|---|
//! | `axum` | [`PeerIp`](key::PeerIp) and [`ClientIp`](key::ClientIp) read axum's `ConnectInfo`; route keys and cost tables read `MatchedPath` |
//! | `tonic` | `PeerIp` and `ClientIp` read tonic's `TcpConnectInfo`; gRPC refusals carry `grpc-status-details-bin` (`RetryInfo`, `QuotaFailure`) |
//! | `redis` | the Redis store (single node or Cluster), the hybrid tier, Redis-shared concurrency slots |
//! | `redis-tls` | `rediss://` URLs: TLS to Redis with rustls, and the CA and client certificates of [`RedisBackend`](store/redis/struct.RedisBackend.html) (implies `redis`) |
//! | `serde` | the `policy` module: limits, plans and keys described as data in any serde format |
//! | `toml` | `Policy::from_toml_str`, `Policy::from_toml_file` and the policy file watcher (implies `serde`) |
//! | `reqwest` | [`OutboundMiddleware`](outbound/reqwest/struct.OutboundMiddleware.html): the [`outbound`] layer as a `reqwest-middleware` middleware, for reqwest 0.12 clients |
//! | `metrics` | decisions, near-limit, store latency and errors, breaker state and keys held, through the [`metrics`](https://docs.rs/metrics) facade (see [`metrics`](mod@metrics)) |
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
//! Semantic versioning (while `0.x`, a minor release may break the API), MSRV Rust 1.88, and
//! what the feature flags promise: [`guide::versioning`].
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
// Documentation only: rendered by rustdoc (`doc`), and compiled as doctests with the features
// their code blocks need (`doctest`); a build has no such module. Doctests are collected
// without `cfg(doc)`, so `cargo test` with fewer features skips the guides' blocks.
#[cfg(any(
    doc,
    all(
        doctest,
        feature = "axum",
        feature = "redis",
        feature = "redis-tls",
        feature = "tonic",
        feature = "toml",
        feature = "metrics",
        feature = "reqwest"
    )
))]
// docs.rs's `doc_cfg` would badge the module with the features of its doctest cfg.
#[cfg_attr(all(docsrs, not(tollgate_docs_stable)), doc(auto_cfg = false))]
pub mod guide;
pub mod headers;
pub mod key;
pub mod load_shed;
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

#[cfg(test)]
mod structure_tests;
