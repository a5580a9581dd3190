//! Plans: per-request quotas, and how a limit chooses one.
//!
//! A [`Limit`](crate::Limit) may hold several named [`Plan`]s, each its own quota, and a
//! [`PlanResolver`] that picks one per request (from a request extension set by auth
//! middleware, a header, or a cached lookup of the API key). All plans of a limit share its
//! state: **a key whose plan changes keeps what it spent** — an upgrade is no reset gift, a
//! downgrade no double charge (each algorithm's docs say exactly how).
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use tollgate::key::{HeaderKey, Key, KeyValue};
//! use tollgate::plan::{Plan, Resolution, UnknownPlan};
//! use tollgate::{AlgorithmKind, Limit, PolicyName, Quota, RateLimitLayer, RequestView};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limit = Limit::new("api", Quota::per_minute(5))
//!     .algorithm(AlgorithmKind::FixedWindow)
//!     .key(HeaderKey::new("x-api-key")?)
//!     .plan(Plan::new("free", Quota::per_minute(5)))
//!     .plan(Plan::new("pro", Quota::per_minute(20)))
//!     .resolve_plan(|_: &RequestView<'_>, key: &Key<'_>| match key.value() {
//!         KeyValue::Bytes(b) if b.as_ref() == b"free-key-1" => Resolution::Plan(PolicyName::new("free")),
//!         KeyValue::Bytes(b) if b.as_ref() == b"pro-key-1" => Resolution::Plan(PolicyName::new("pro")),
//!         _ => Resolution::Unknown,
//!     })
//!     .on_unknown_plan(UnknownPlan::reject(StatusCode::UNAUTHORIZED));
//! let svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(limit)?)
//!     .service(service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) }));
//!
//! let call = |key: &str| Request::get("/").header("x-api-key", key).body(()).unwrap();
//! let res = svc.clone().oneshot(call("pro-key-1")).await?;
//! assert_eq!(res.headers()["x-ratelimit-limit"], "20");
//! let res = svc.clone().oneshot(call("free-key-1")).await?;
//! assert_eq!(res.headers()["x-ratelimit-limit"], "5");
//! let res = svc.clone().oneshot(call("stolen-key")).await?;
//! assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
//! # Ok(())
//! # }
//! ```

/// The most plans one limit may hold (one-off quotas are per-key overrides).
pub const MAX_PLANS: usize = 250;

#[allow(clippy::module_inception)]
mod plan;
pub mod resolve;
mod resolver;

pub use plan::Plan;
pub use resolve::{AssignedPlan, CachedLookup, PlanFromExtension, PlanFromHeader, PlanMap};
pub use resolver::{PlanResolver, Resolution, UnknownPlan};
