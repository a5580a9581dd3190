//! [`PlanFromExtension`]: the plan an authentication layer put in the request extensions.

use std::borrow::Cow;
use std::sync::Arc;

use super::names::PlanNames;
use crate::key::Key;
use crate::plan::{PlanResolver, Resolution};
use crate::request::RequestView;

/// The plan of the authenticated caller, inserted into the request extensions by authentication
/// middleware that runs before the rate limiter; read by [`PlanFromExtension`].
///
/// ```
/// use tollgate::plan::AssignedPlan;
///
/// let mut req = http::Request::get("/").body(()).unwrap();
/// // In the auth layer, once the caller's account is known:
/// let plan_from_db = String::from("pro");
/// req.extensions_mut().insert(AssignedPlan::new(plan_from_db));
/// assert_eq!(req.extensions().get::<AssignedPlan>().unwrap().name(), "pro");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AssignedPlan(Cow<'static, str>);

impl AssignedPlan {
    /// The plan named `name` (`"pro"`: no allocation; a `String` from a database works too).
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self(name.into())
    }

    /// The plan's name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// Resolves the plan from the [`AssignedPlan`] in the request extensions.
///
/// No `AssignedPlan` (an anonymous request): [`Resolution::Default`], the limit's own quota. A
/// name that is not a plausible plan name (non-empty printable ASCII without spaces, at most
/// [`Name::MAX_LEN`](crate::Name::MAX_LEN) bytes), or outside
/// [`plans`](Self::plans) when set: [`Resolution::Unknown`].
///
/// ```
/// use tollgate::key::Key;
/// use tollgate::plan::{AssignedPlan, PlanFromExtension, PlanResolver, Resolution};
/// use tollgate::RequestView;
///
/// let resolver = PlanFromExtension::new().plans(["free", "pro"]);
/// let resolve = |plan: Option<&'static str>| {
///     let mut req = http::Request::get("/").body(()).unwrap();
///     if let Some(plan) = plan {
///         req.extensions_mut().insert(AssignedPlan::new(plan));
///     }
///     resolver.resolve(&RequestView::new(&req), &Key::global())
/// };
/// assert!(matches!(resolve(Some("pro")), Resolution::Plan(p) if p.as_str() == "pro"));
/// assert!(matches!(resolve(Some("enterprise")), Resolution::Unknown));
/// assert!(matches!(resolve(None), Resolution::Default));
/// ```
#[derive(Debug, Clone)]
pub struct PlanFromExtension {
    names: Arc<PlanNames>,
}

impl PlanFromExtension {
    /// Reads [`AssignedPlan`] from the request extensions.
    pub fn new() -> Self {
        Self {
            names: Arc::new(PlanNames::open()),
        }
    }

    /// Accepts only these plan names; any other is [`Resolution::Unknown`].
    #[must_use]
    pub fn plans<I>(mut self, names: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.names = Arc::new(PlanNames::fixed(names));
        self
    }
}

impl Default for PlanFromExtension {
    fn default() -> Self {
        Self::new()
    }
}

impl PlanResolver for PlanFromExtension {
    fn resolve(&self, req: &RequestView<'_>, _key: &Key<'_>) -> Resolution {
        match req.extensions().get::<AssignedPlan>() {
            Some(plan) => self.names.resolve(plan.name()),
            None => Resolution::Default,
        }
    }
}
