//! Plan resolvers: which of a limit's plans a request is counted at.
//!
//! A [`PlanResolver`](super::PlanResolver) answers, per request, with a
//! [`Resolution`](super::Resolution). These cover the usual sources:
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
//! A [`PolicyName`](crate::PolicyName) holds its text inline, so a resolver that reads plan
//! names from requests keeps nothing per name: a client sending random names cannot grow
//! memory. Restrict the names it accepts with `.plans([..])`.
//!
//! # Examples
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

mod cached;
mod extension;
mod header;
mod map;
mod names;

pub use cached::CachedLookup;
pub use extension::{AssignedPlan, PlanFromExtension};
pub use header::PlanFromHeader;
pub use map::PlanMap;
