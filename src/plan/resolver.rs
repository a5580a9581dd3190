//! [`PlanResolver`]: which plan a request is decided at.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use http::StatusCode;

use crate::decision::Name;
use crate::key::Key;
use crate::request::RequestView;

/// What a [`PlanResolver`] answers for a request.
#[non_exhaustive]
pub enum Resolution {
    /// One of the limit's plans, by name. A name the limit does not have is treated as
    /// [`Unknown`](Resolution::Unknown), and so is an over-long one (see [`Name::new`]).
    /// A [`Name`] holds its text inline and keeps nothing once dropped, so making one from
    /// request data per request is fine.
    Plan(Name),
    /// The limit's own quota.
    Default,
    /// No plan is known for this request: the limit's [`UnknownPlan`] applies.
    Unknown,
    /// A lookup is in flight. The layer awaits the future, then asks the resolver again, which
    /// must then answer from what the lookup stored (a cached lookup does).
    Lookup(Pin<Box<dyn Future<Output = ()> + Send>>),
}

impl fmt::Debug for Resolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resolution::Plan(name) => f.debug_tuple("Plan").field(name).finish(),
            Resolution::Default => f.write_str("Default"),
            Resolution::Unknown => f.write_str("Unknown"),
            Resolution::Lookup(_) => f.write_str("Lookup(..)"),
        }
    }
}

/// Chooses the plan a request is decided at, from the request and the limit's key.
///
/// Closures implement it:
///
/// ```
/// use tollgate::key::{HeaderKey, Key};
/// use tollgate::plan::{Plan, Resolution};
/// use tollgate::{Limit, Name, Quota, RequestView};
///
/// let limit = Limit::new("api", Quota::per_hour(100))
///     .key(HeaderKey::new("x-api-key").unwrap())
///     .plan(Plan::new("pro", Quota::per_hour(1_000)))
///     .resolve_plan(|_req: &RequestView<'_>, key: &Key<'_>| {
///         if key.to_string().starts_with("b:pro-") {
///             Resolution::Plan(Name::new("pro"))
///         } else {
///             Resolution::Default
///         }
///     });
/// # let _ = limit;
/// ```
pub trait PlanResolver: Send + Sync + 'static {
    /// The plan for `req`, whose key for this limit is `key`.
    fn resolve(&self, req: &RequestView<'_>, key: &Key<'_>) -> Resolution;
}

impl<F> PlanResolver for F
where
    F: Fn(&RequestView<'_>, &Key<'_>) -> Resolution + Send + Sync + 'static,
{
    fn resolve(&self, req: &RequestView<'_>, key: &Key<'_>) -> Resolution {
        self(req, key)
    }
}

/// What a limit does with a request whose plan is unknown ([`Resolution::Unknown`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UnknownPlan {
    /// Decide it at the limit's own quota. The default.
    #[default]
    Default,
    /// Refuse it with `status` (e.g. `401` for an API key no plan knows) and a problem+json body.
    Reject {
        /// The status to answer with (4xx or 5xx).
        status: StatusCode,
    },
}

impl UnknownPlan {
    /// `Reject { status }`.
    pub const fn reject(status: StatusCode) -> Self {
        UnknownPlan::Reject { status }
    }
}
