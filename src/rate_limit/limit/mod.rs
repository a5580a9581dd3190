//! [`Limit`]: one named limit of a layer, and its options ([`MissingKey`], [`Mode`],
//! [`Charge`], per-key [`Override`]s).

mod options;
pub(super) mod overrides;
mod shape;

use std::fmt;
use std::sync::Arc;

pub use options::{Charge, Mode};
pub use overrides::Override;
pub(crate) use shape::CompiledShape;
pub use shape::Shape;

use crate::algorithm::AlgorithmKind;
use crate::cost::Cost;
use crate::decision::Name;
use crate::error::ConfigError;
use crate::key::{KeyExtractor, MissingKey};
use crate::plan::{Plan, PlanResolver, UnknownPlan, MAX_PLANS};
use crate::quota::Quota;
use crate::request::RequestView;
use crate::store::{FailurePolicy, LimitSpec, PlanQuota};

/// A predicate choosing the requests a limit applies to.
pub(crate) type WhenFn = dyn Fn(&RequestView<'_>) -> bool + Send + Sync;

/// One named limit: a [`Quota`] enforced by an algorithm, per key, at a cost per request.
///
/// ```
/// use tollgate::key::{Key, KeyError};
/// use tollgate::{AlgorithmKind, Limit, MissingKey, Quota, RequestView};
///
/// fn tenant<'r>(req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
///     req.headers()
///         .get("x-tenant")
///         .map(|v| Key::bytes(v.as_bytes()))
///         .ok_or_else(|| KeyError::new("missing x-tenant header"))
/// }
///
/// let limit = Limit::new("per-tenant", Quota::per_minute(600).burst(100))
///     .algorithm(AlgorithmKind::Gcra)
///     .key(tenant)
///     .cost(|req: &RequestView<'_>| if req.method() == "POST" { 5 } else { 1 })
///     .on_missing_key(MissingKey::reject_with(http::StatusCode::UNAUTHORIZED));
/// assert_eq!(limit.name().as_str(), "per-tenant");
/// ```
#[derive(Clone)]
pub struct Limit {
    name: Name,
    quota: Quota,
    algorithm: AlgorithmKind,
    key: Option<Arc<dyn KeyExtractor>>,
    cost: Option<Arc<dyn Cost>>,
    on_missing_key: MissingKey,
    on_store_error: Option<FailurePolicy>,
    plans: Vec<Plan>,
    resolver: Option<Arc<dyn PlanResolver>>,
    on_unknown_plan: UnknownPlan,
    when: Option<Arc<WhenFn>>,
    mode: Mode,
    charge: Charge,
    shape: Option<Shape>,
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("algorithm", &self.algorithm)
            .field("key", &self.key.as_ref().map(|_| ".."))
            .field("cost", &self.cost.as_ref().map(|c| c.max_cost()))
            .field("on_missing_key", &self.on_missing_key)
            .field("on_store_error", &self.on_store_error)
            .field("plans", &self.plans)
            .field("resolver", &self.resolver.as_ref().map(|_| ".."))
            .field("on_unknown_plan", &self.on_unknown_plan)
            .field("when", &self.when.as_ref().map(|_| ".."))
            .field("mode", &self.mode)
            .field("charge", &self.charge)
            .field("shape", &self.shape)
            .finish()
    }
}

impl Limit {
    /// A limit named `name` enforcing `quota` with the token bucket, costing 1 per request.
    ///
    /// A key extractor must be set with [`key`](Self::key) before the layer is built. Names
    /// appear in headers and bodies, so they must be printable ASCII of at most
    /// [`Name::MAX_LEN`] (47) bytes, and unique per layer; building refuses others with a
    /// [`ConfigError`] naming `limit.name`.
    pub fn new(name: impl AsRef<str>, quota: Quota) -> Self {
        Self {
            name: Name::new(name),
            quota,
            algorithm: AlgorithmKind::default(),
            key: None,
            cost: None,
            on_missing_key: MissingKey::default(),
            on_store_error: None,
            plans: Vec::new(),
            resolver: None,
            on_unknown_plan: UnknownPlan::default(),
            when: None,
            mode: Mode::default(),
            charge: Charge::default(),
            shape: None,
        }
    }

    /// Adds a named plan: a quota a [resolver](Self::resolve_plan) can choose per request. See
    /// [`plan`](crate::plan).
    #[must_use]
    pub fn plan(mut self, plan: Plan) -> Self {
        self.plans.push(plan);
        self
    }

    /// Chooses the plan of each request (default: none, every request is decided at the limit's
    /// own quota).
    #[must_use]
    pub fn resolve_plan(mut self, resolver: impl PlanResolver) -> Self {
        self.resolver = Some(Arc::new(resolver));
        self
    }

    /// What to do with a request whose plan the resolver does not know (default: decide it at
    /// the limit's own quota).
    #[must_use]
    pub fn on_unknown_plan(mut self, outcome: UnknownPlan) -> Self {
        self.on_unknown_plan = outcome;
        self
    }

    /// Applies this limit only to requests matching `predicate` (a route, a method); the others
    /// are not counted by it.
    ///
    /// ```
    /// use tollgate::key::PeerIp;
    /// use tollgate::{Limit, Quota, RequestView};
    ///
    /// let logins = Limit::new("login", Quota::per_minute(3))
    ///     .key(PeerIp::new())
    ///     .when(|req: &RequestView<'_>| req.method() == "POST" && req.uri().path() == "/login");
    /// # let _ = logins;
    /// ```
    #[must_use]
    pub fn when(
        mut self,
        predicate: impl Fn(&RequestView<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.when = Some(Arc::new(predicate));
        self
    }

    /// Enforce (the default) or shadow: see [`Mode`].
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Which requests count: every admitted one (the default) or by response status. See
    /// [`Charge`].
    #[must_use]
    pub fn charge(mut self, charge: Charge) -> Self {
        self.charge = charge;
        self
    }

    /// Shapes instead of refusing: a request that does not fit now waits for its turn, up to
    /// `shape`'s `max_wait` (a [`Duration`](std::time::Duration) or a
    /// [`Shape`]), first come first served per key, then proceeds; beyond
    /// `max_wait` or the queue bounds it is refused as usual. The wait is in the request's and
    /// the response's extensions as a [`ShapedDelay`](super::ShapedDelay). See
    /// [`Shape`] for how it works.
    ///
    /// The token bucket, GCRA and the leaky bucket shape; the window algorithms cannot (their
    /// units return all at once), and neither can a limit with plans or in shadow mode: building
    /// the layer says so.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::key::GlobalKey;
    /// use tollgate::{AlgorithmKind, Limit, Quota};
    ///
    /// // A fragile downstream sees at most 5 requests per second, evenly spaced; callers wait
    /// // up to 3 s for their turn.
    /// let limit = Limit::new("downstream", Quota::per_second(5).burst(1))
    ///     .algorithm(AlgorithmKind::Gcra)
    ///     .key(GlobalKey)
    ///     .shape(Duration::from_secs(3));
    /// # let _ = limit;
    /// ```
    #[must_use]
    pub fn shape(mut self, shape: impl Into<Shape>) -> Self {
        self.shape = Some(shape.into());
        self
    }

    /// The limit's plans.
    pub fn plans(&self) -> &[Plan] {
        &self.plans
    }

    /// The limit's mode.
    pub fn current_mode(&self) -> Mode {
        self.mode
    }

    /// The algorithm enforcing the quota (default: [`AlgorithmKind::TokenBucket`]).
    #[must_use]
    pub fn algorithm(mut self, algorithm: AlgorithmKind) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Who a request is counted against. Required.
    #[must_use]
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// How many units a request spends (default: 1).
    #[must_use]
    pub fn cost(mut self, cost: impl Cost) -> Self {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// What to do when no key can be extracted (default: [`MissingKey::Reject`]: `400`, or
    /// `500` when the server is misconfigured).
    #[must_use]
    pub fn on_missing_key(mut self, outcome: MissingKey) -> Self {
        self.on_missing_key = outcome;
        self
    }

    /// What a shared backend does when it cannot decide (see [`FailurePolicy`]). The in-memory
    /// store never fails.
    #[must_use]
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.on_store_error = Some(policy);
        self
    }

    /// The limit's name.
    pub fn name(&self) -> Name {
        self.name
    }

    /// The limit's quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The limit's algorithm (set with [`algorithm`](Self::algorithm)).
    pub fn current_algorithm(&self) -> AlgorithmKind {
        self.algorithm
    }

    /// What happens when no key can be extracted.
    pub fn missing_key(&self) -> MissingKey {
        self.on_missing_key
    }

    /// The largest cost a single request can be granted: the quota's burst size.
    pub fn capacity(&self) -> u64 {
        self.quota.burst_size()
    }

    /// What the backend needs to know about this limit. For a [shaped](Self::shape) limit the
    /// quota is the one the store decides at: the burst widened by what may wait.
    pub fn spec(&self) -> LimitSpec {
        // A shaped limit is decided at its widened tolerance (see `shaping`).
        let quota = self
            .shape
            .as_ref()
            .and_then(|s| shape::compile(s, &self.quota, self.algorithm).ok())
            .map_or(self.quota, |s| s.widen(&self.quota));
        let spec = LimitSpec::new(self.name, quota, self.algorithm);
        match self.on_store_error {
            Some(policy) => spec.on_store_error(policy),
            None => spec,
        }
    }

    /// Validates the limit and freezes it for the service.
    pub(crate) fn compile(&self) -> Result<CompiledLimit, ConfigError> {
        crate::decision::refuse_over_long("limit.name", "limit name", self.name)?;
        let name = self.name.as_str();
        let bad = |field: &'static str, message: String| {
            ConfigError::new(field, format!("limit \"{name}\": {message}"))
        };
        if name.is_empty() || !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(bad(
                "limit.name",
                String::from(
                    "the name must be non-empty printable ASCII (it is sent in headers and bodies), e.g. \"per-ip\"",
                ),
            ));
        }
        self.algorithm
            .validate(&self.quota)
            .map_err(|e| bad(e.field(), e.message().to_owned()))?;
        let key = self.key.clone().ok_or_else(|| {
            bad(
                "limit.key",
                String::from(
                    "no key extractor; call .key(..) with e.g. PeerIp::new() to count per client, or GlobalKey for one shared limit",
                ),
            )
        })?;
        let capacity = self.capacity();
        if let Some(max) = self.cost.as_ref().and_then(|c| c.max_cost())
            && max > capacity
        {
            return Err(bad(
                    "limit.cost",
                    format!(
                        "the cost function can charge {max} units but the quota {} holds at most {capacity}, so such requests could never pass; raise the burst to at least {max} or lower the cost",
                        self.quota
                    ),
                ));
        }
        if let MissingKey::RejectWith { status } = self.on_missing_key
            && !(status.is_client_error() || status.is_server_error())
        {
            return Err(bad(
                    "limit.on_missing_key",
                    format!("rejecting with {status} is not a refusal; use a 4xx or 5xx status, or MissingKey::Skip"),
                ));
        }
        if let UnknownPlan::Reject { status } = self.on_unknown_plan
            && !(status.is_client_error() || status.is_server_error())
        {
            return Err(bad(
                    "limit.on_unknown_plan",
                    format!("rejecting with {status} is not a refusal; use a 4xx or 5xx status, or UnknownPlan::Default"),
                ));
        }
        let shape = match &self.shape {
            None => None,
            Some(_) if !self.plans.is_empty() => {
                return Err(bad(
                    "limit.shape",
                    String::from("a limit with plans cannot shape yet; shape a separate limit without plans, or drop .shape(..)"),
                ))
            }
            Some(_) if self.mode.is_shadow() => {
                return Err(bad(
                    "limit.shape",
                    String::from("a shadow limit never delays or refuses, so it cannot shape; enforce it, or drop .shape(..)"),
                ))
            }
            Some(s) => Some(
                shape::compile(s, &self.quota, self.algorithm)
                    .map_err(|e| bad(e.field(), e.message().to_owned()))?,
            ),
        };
        let store_quota = shape.map_or(self.quota, |s| s.widen(&self.quota));
        let base = PlanQuota::new(self.algorithm, store_quota)
            .map_err(|e| bad(e.field(), e.message().to_owned()))?;
        if self.plans.len() > MAX_PLANS {
            return Err(bad(
                "limit.plans",
                format!(
                    "{} plans, but a limit holds at most {MAX_PLANS}; use per-key overrides for one-off quotas",
                    self.plans.len()
                ),
            ));
        }
        let mut plans: Vec<CompiledPlan> = Vec::with_capacity(self.plans.len());
        for plan in &self.plans {
            crate::decision::refuse_over_long(
                "limit.plans.name",
                &format!("limit \"{name}\": plan name"),
                plan.name(),
            )?;
            let pname = plan.name();
            let pname = pname.as_str();
            if pname.is_empty() || !pname.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
                return Err(bad(
                    "limit.plans.name",
                    format!("plan name {pname:?} must be non-empty printable ASCII without spaces, e.g. \"pro\""),
                ));
            }
            if plans.iter().any(|p| p.name == plan.name()) {
                return Err(bad(
                    "limit.plans.name",
                    format!("plan \"{pname}\" is defined twice; plan names must be unique within a limit"),
                ));
            }
            let quota = PlanQuota::new(self.algorithm, *plan.quota())
                .map_err(|e| bad(e.field(), format!("plan \"{pname}\": {}", e.message())))?;
            if let Some(max) = self.cost.as_ref().and_then(|c| c.max_cost())
                && max > quota.capacity()
            {
                return Err(bad(
                        "limit.cost",
                        format!(
                            "plan \"{pname}\": the cost function can charge {max} units but the quota {} holds at most {}; raise the plan's burst or lower the cost",
                            plan.quota(),
                            quota.capacity()
                        ),
                    ));
            }
            plans.push(CompiledPlan {
                name: plan.name(),
                quota,
                link: plan.link_url().map(Arc::from),
            });
        }
        if !plans.is_empty() && self.resolver.is_none() {
            return Err(bad(
                "limit.resolve_plan",
                String::from("the limit has plans but nothing chooses between them; add .resolve_plan(..), e.g. a PlanFromHeader or a closure"),
            ));
        }
        let pins = std::iter::once(&base)
            .chain(plans.iter().map(|p| &p.quota))
            .map(PlanQuota::pin)
            .collect();
        Ok(CompiledLimit {
            _pins: pins,
            name: self.name,
            quota: self.quota,
            algorithm: self.algorithm,
            capacity,
            key,
            cost: self.cost.clone(),
            on_missing_key: self.on_missing_key,
            base,
            plans: plans.into_boxed_slice(),
            resolver: self.resolver.clone(),
            on_unknown_plan: self.on_unknown_plan,
            when: self.when.clone(),
            mode: self.mode,
            charge: self.charge.clone(),
            explicit_quota: false,
            shadow_rejections: std::sync::atomic::AtomicU64::new(0),
            shape,
        })
    }
}

/// A plan, compiled for its limit's algorithm.
#[derive(Debug)]
pub(crate) struct CompiledPlan {
    pub(crate) name: Name,
    pub(crate) quota: PlanQuota,
    pub(crate) link: Option<Arc<str>>,
}

/// A validated limit, as the service uses it.
pub(crate) struct CompiledLimit {
    /// Keeps the tags of `base` and the plans' quotas while the limit serves (see
    /// [`PlanQuota`]).
    pub(crate) _pins: Box<[crate::store::QuotaPin]>,
    pub(crate) name: Name,
    pub(crate) quota: Quota,
    pub(crate) algorithm: AlgorithmKind,
    pub(crate) capacity: u64,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) cost: Option<Arc<dyn Cost>>,
    pub(crate) on_missing_key: MissingKey,
    /// The limit's own quota, compiled: passed explicitly when `explicit_quota`.
    pub(crate) base: PlanQuota,
    pub(crate) plans: Box<[CompiledPlan]>,
    pub(crate) resolver: Option<Arc<dyn PlanResolver>>,
    pub(crate) on_unknown_plan: UnknownPlan,
    pub(crate) when: Option<Arc<WhenFn>>,
    pub(crate) mode: Mode,
    pub(crate) charge: Charge,
    /// Whether checks at the limit's own quota name it (after a reload the store's tables may
    /// have been built for an earlier quota of the limit).
    pub(crate) explicit_quota: bool,
    /// Would-be rejections of a shadow limit (sampled logging).
    pub(crate) shadow_rejections: std::sync::atomic::AtomicU64,
    /// How the limit shapes, if it does: its store decides at `base`, the widened quota.
    pub(crate) shape: Option<CompiledShape>,
}

impl CompiledLimit {
    /// Whether the limit is only a key and a cost: no `when`, plans, shadow mode, charge by
    /// outcome or shaping (what most limits are, and what the layer's short path handles).
    #[inline]
    pub(crate) fn is_plain(&self) -> bool {
        self.when.is_none()
            && self.resolver.is_none()
            && self.shape.is_none()
            && !self.mode.is_shadow()
            && !self.charge.by_outcome()
    }

    #[inline]
    pub(crate) fn cost(&self, req: &RequestView<'_>) -> u64 {
        match &self.cost {
            Some(cost) => cost.cost(req),
            None => 1,
        }
    }
}

impl fmt::Debug for CompiledLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}
