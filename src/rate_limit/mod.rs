//! The rate-limiting middleware: [`RateLimitLayer`], [`RateLimit`] and their parts.
//!
//! A [`RateLimitLayer`] holds one or more named [`Limit`]s (up to
//! [`MAX_LIMITS`](crate::store::MAX_LIMITS)) and the store that keeps their state. For each
//! request, [`RateLimit`]:
//!
//! 1. lets requests matching the [skip predicate](RateLimitLayerBuilder::skip) through untouched;
//! 2. extracts each limit's key and cost from the request (a missing key is refused or skips that
//!    limit, see [`MissingKey`](crate::key::MissingKey)); a cost larger than a limit's capacity is refused with `413`
//!    without charging anything, since waiting would never help;
//! 3. checks every limit in one store call, **all-or-nothing**: if any limit refuses, none is
//!    charged;
//! 4. refuses with the [`Rejection`](crate::response::Rejection) (by default `429` with
//!    `Retry-After` and an RFC 9457 problem+json body, or a gRPC `RESOURCE_EXHAUSTED`), or calls
//!    the inner service with the [`Decision`](crate::Decision) in the request extensions, and
//!    all [`Decisions`](crate::Decisions) too when the layer holds several limits or
//!    layers are nested (a single limit's `Decision` is the only one);
//! 5. writes the rate-limit [headers](crate::headers) on every response it decided, allowed or
//!    refused, and with
//!    [`response_extensions(true)`](RateLimitLayerBuilder::response_extensions) puts the
//!    reported `Decision` in the response extensions. When layers are nested, the inner one's
//!    responses carry its decision, the more pressing decision (a rejection, else the one
//!    closer to exhaustion) wins `X-RateLimit-*` and the extensions, and each layer appends its
//!    IETF items. When the store could not decide a limit, the headers show what did: the local
//!    limiter's own numbers under
//!    [`FailurePolicy::Local`](crate::store::FailurePolicy::Local), and nothing for a limit
//!    let through uncounted under [`FailurePolicy::Open`](crate::store::FailurePolicy::Open)
//!    (its [`Decision`](crate::Decision) is [uncounted](crate::Decision::is_counted)): no
//!    `X-RateLimit-*` unless another limit was counted, and no `RateLimit` item for it.
//!
//! With the in-memory store the check is synchronous: the response future is the inner
//! service's future plus the headers to write, with no allocation. With a networked store the
//! future first waits for the check, holding the inner service instance that was polled ready.
//!
//! It works as axum's `Router::layer` (every route), `Router::route_layer` (one route, after
//! routing), inside `tower::ServiceBuilder`, and around any `Service<http::Request<B>>` such as
//! a plain hyper service. One layer shared by several routes shares its budgets; layers stacked
//! on top of each other count independently (an outer layer has already charged a request an
//! inner one refuses), so limits that must be all-or-nothing belong in one layer.
//!
//! # Examples
//!
//! The default: a token bucket of 5 refilling 1 per second, per client (here keyed by an
//! `x-client` header; [`PeerIp`](crate::key::PeerIp) for real servers):
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use tollgate::key::HeaderKey;
//! use tollgate::{Limit, Quota, RateLimitLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::new(
//!     Limit::new("per-client", Quota::per_second(1).burst(5)).key(HeaderKey::new("x-client")?),
//! )?;
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|_req: Request<()>| async {
//!         Ok::<_, Infallible>(Response::new(String::from("hello")))
//!     }));
//!
//! let request = || Request::get("/").header("x-client", "alice").body(()).unwrap();
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
//! Customised: a burst limit and a daily quota checked together, a global ceiling, weighted
//! costs, the IETF headers, reset as delta seconds, an exempt health check, and requests
//! without an API key refused with `401`:
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Method, Request, Response, StatusCode};
//! use tollgate::cost::CostTable;
//! use tollgate::headers::ResetFormat;
//! use tollgate::key::{GlobalKey, HeaderKey};
//! use tollgate::{AlgorithmKind, Limit, MissingKey, Quota, RateLimitLayer, RequestView};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let api_key = HeaderKey::new("x-api-key")?;
//! let costs = CostTable::new(1).method(Method::POST, 5);
//! let layer = RateLimitLayer::builder()
//!     .limit(
//!         Limit::new("burst", Quota::per_second(10).burst(20))
//!             .algorithm(AlgorithmKind::Gcra)
//!             .key(api_key.clone())
//!             .cost(costs.clone())
//!             .on_missing_key(MissingKey::reject_with(StatusCode::UNAUTHORIZED)),
//!     )
//!     .limit(
//!         Limit::new("daily", Quota::per_day(5_000))
//!             .algorithm(AlgorithmKind::FixedWindow)
//!             .key(api_key)
//!             .cost(costs)
//!             .on_missing_key(MissingKey::reject_with(StatusCode::UNAUTHORIZED)),
//!     )
//!     .limit(Limit::new("global", Quota::per_second(1_000)).key(GlobalKey))
//!     .ietf_headers(true)
//!     .reset_format(ResetFormat::DeltaSeconds)
//!     .skip(|req: &RequestView<'_>| req.uri().path() == "/health")
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|_req: Request<()>| async {
//!         Ok::<_, Infallible>(Response::new(String::new()))
//!     }));
//!
//! let res = svc
//!     .clone()
//!     .oneshot(Request::post("/orders").header("x-api-key", "k1").body(())?)
//!     .await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["x-ratelimit-limit"], "20"); // burst: 15 of 20 left is the tightest
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "15");
//! assert_eq!(res.headers()["x-ratelimit-reset"], "1"); // full again in 0.5 s, rounded up
//! assert_eq!(
//!     res.headers()["ratelimit"],
//!     r#""burst";r=15;t=1, "daily";r=4995;t=86400, "global";r=999;t=1"#
//! );
//!
//! let res = svc.clone().oneshot(Request::get("/orders").body(())?).await?;
//! assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
//!
//! let res = svc.clone().oneshot(Request::get("/health").body(())?).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert!(res.headers().get("x-ratelimit-limit").is_none());
//! # Ok(())
//! # }
//! ```

mod applied;
mod audit;
mod body;
mod builder;
mod decide;
mod follow_up;
mod future;
#[allow(clippy::module_inception)]
mod layer;
mod limit;
mod outcome;
mod refuse;
mod reload;
mod service;
mod shaping;
mod shared;
mod snapshot;

pub use audit::{AuditEvent, Change};
pub use body::ResponseBody;
pub use builder::RateLimitLayerBuilder;
pub use future::ResponseFuture;
pub use layer::{RateLimitLayer, StoreRef};
pub use limit::{Charge, Limit, Mode, Override, Shape};
pub use service::RateLimit;
pub use shaping::{ShapedDelay, DEFAULT_MAX_WAITING};

#[cfg(test)]
mod tests;
