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
//! use tollgate::{AlgorithmKind, Limit, Name, Quota, RateLimitLayer, RequestView};
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
//!         KeyValue::Bytes(b) if b.as_ref() == b"free-key-1" => Resolution::Plan(Name::new("free")),
//!         KeyValue::Bytes(b) if b.as_ref() == b"pro-key-1" => Resolution::Plan(Name::new("pro")),
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
//!
//! # Resolvers
//!
//! A [`PlanResolver`] answers, per request, with a
//! [`Resolution`]. These cover the usual sources:
//!
//! | resolver | the plan comes from | no plan there | unrecognised |
//! |---|---|---|---|
//! | [`PlanFromExtension`] | an [`AssignedPlan`] that auth middleware inserted | `Default` | `Unknown` |
//! | [`PlanFromHeader`] | a request header a trusted gateway sets (`x-plan: pro`) | `Default` | `Unknown` |
//! | [`PlanMap`] | a fixed map from the limit's key (an API key) to a plan | `Unknown` | — |
//! | [`CachedLookup`] | an async lookup of the key (a database), cached | `Unknown` (cached) | — |
//!
//! `Default` counts the request at the limit's own quota; `Unknown` applies the limit's
//! `on_unknown_plan` (the limit's own quota, or a refusal such as `401`). A plan name that is not
//! one of the limit's plans is treated as `Unknown` by the layer.
//!
//! A [`Name`](crate::Name) holds its text inline, so a resolver that reads plan
//! names from requests keeps nothing per name: a client sending random names cannot grow
//! memory. Restrict the names it accepts with `.plans([..])`.
//!
//! The plan set by an authentication layer:
//!
//! ```
//! use tollgate::key::Key;
//! use tollgate::plan::{AssignedPlan, PlanFromExtension, PlanResolver, Resolution};
//! use tollgate::RequestView;
//!
//! let resolver = PlanFromExtension::new();
//! let mut req = http::Request::get("/").body(()).unwrap();
//! req.extensions_mut().insert(AssignedPlan::new("pro"));
//! let plan = resolver.resolve(&RequestView::new(&req), &Key::global());
//! assert!(matches!(plan, Resolution::Plan(name) if name.as_str() == "pro"));
//! ```
//!
//! API keys mapped to plans, everything else unknown:
//!
//! ```
//! use tollgate::key::Key;
//! use tollgate::plan::{PlanMap, PlanResolver, Resolution};
//! use tollgate::RequestView;
//!
//! let plans = PlanMap::new().assign("free-key-1", "free").assign("pro-key-1", "pro");
//! let req = http::Request::get("/").body(()).unwrap();
//! let view = RequestView::new(&req);
//! assert!(matches!(plans.resolve(&view, &Key::string("pro-key-1")), Resolution::Plan(p) if p.as_str() == "pro"));
//! assert!(matches!(plans.resolve(&view, &Key::string("stolen")), Resolution::Unknown));
//! ```

/// The most plans one limit may hold (one-off quotas are per-key overrides).
pub const MAX_PLANS: usize = 250;

#[allow(clippy::module_inception)]
mod plan;
mod resolve;
mod resolver;

pub use plan::Plan;
pub use resolve::{AssignedPlan, CachedLookup, PlanFromExtension, PlanFromHeader, PlanMap};
pub use resolver::{PlanResolver, Resolution, UnknownPlan};
