//! Where limiter state lives: the [`Backend`] / [`Store`] traits and their implementations.
//!
//! A [`Backend`] is configuration (`MemoryBackend::new().max_keys(100_000)`); the layer builder
//! calls [`Backend::build`] once with every limit it holds and gets a [`Store`]. Per request, the
//! service calls [`Store::check`] with one [`LimitCheck`] per applicable limit and gets one
//! [`Decision`](crate::Decision) per check, all-or-nothing: if any limit rejects, none is charged.

use std::future::Future;
use std::time::Duration;

use crate::algorithm::AlgorithmKind;
use crate::decision::PolicyName;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::quota::Quota;

#[cfg(feature = "redis")]
pub mod hybrid;
pub mod memory;
mod plan_quota;
#[cfg(feature = "redis")]
pub mod redis;

#[cfg(feature = "redis")]
pub use self::redis::{RedisBackend, RedisStore};
pub use memory::{MemoryBackend, MemoryStore};
pub(crate) use plan_quota::QuotaPin;
#[doc(hidden)]
pub use plan_quota::{kept_quotas, with_quota_registry_locked};
pub use plan_quota::{PlanQuota, KEPT_QUOTAS};

pub(crate) use crate::decision::Decisions;
pub use crate::decision::MAX_LIMITS;

/// What a backend needs to know about one limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitSpec {
    name: PolicyName,
    quota: Quota,
    algorithm: AlgorithmKind,
    on_store_error: Option<FailurePolicy>,
}

impl LimitSpec {
    /// A limit named `name` enforcing `quota` with `algorithm`.
    pub fn new(name: PolicyName, quota: Quota, algorithm: AlgorithmKind) -> Self {
        Self {
            name,
            quota,
            algorithm,
            on_store_error: None,
        }
    }

    /// Sets what happens when the backend cannot decide.
    #[must_use]
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.on_store_error = Some(policy);
        self
    }

    /// The limit's name.
    pub fn name(&self) -> PolicyName {
        self.name
    }

    /// The limit's quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The limit's algorithm.
    pub fn algorithm(&self) -> AlgorithmKind {
        self.algorithm
    }

    /// The failure policy, if one was chosen.
    pub fn failure_policy(&self) -> Option<FailurePolicy> {
        self.on_store_error
    }

    /// Validates the quota for the algorithm.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.algorithm.validate(&self.quota)
    }
}

/// What a limit does when its backend cannot decide (unreachable, timed out, corrupted).
///
/// There is no default for shared backends: choosing is part of configuring a limit.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through; the event is logged and counted.
    Open,
    /// Refuse with `503 Service Unavailable` and `Retry-After`.
    Closed {
        /// The `Retry-After` sent with the 503.
        retry_after: Duration,
    },
    /// Decide with a local in-memory limiter holding `share` (0 < share ≤ 1) of the quota.
    Local {
        /// Fraction of the quota each instance may spend while the backend is down.
        share: f64,
    },
}

/// One limit to check for one request.
///
/// ```
/// use tollgate::key::Key;
/// use tollgate::store::{LimitCheck, PlanQuota};
/// use tollgate::{AlgorithmKind, Quota};
///
/// // Limit 0, for alice, one unit, at the limit's own quota.
/// let check = LimitCheck::new(0, Key::string("alice"), 1);
/// assert!(check.quota.is_none());
///
/// // The same, at the quota of alice's plan.
/// let pro = PlanQuota::new(AlgorithmKind::TokenBucket, Quota::per_minute(1_000)).unwrap();
/// let check = check.with_quota(&pro);
/// assert_eq!(check.quota.unwrap().capacity(), 1_000);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LimitCheck<'a> {
    /// Index of the limit in the slice given to [`Backend::build`].
    pub limit: usize,
    /// The key extracted for this limit.
    pub key: Key<'a>,
    /// Units to spend.
    pub cost: u64,
    /// The quota that applies to this request, when it is not the limit's own (a plan chosen
    /// per request, or a per-key override). Its algorithm is always the limit's.
    pub quota: Option<&'a PlanQuota>,
}

impl<'a> LimitCheck<'a> {
    /// Checks `key` against limit `limit` (its index in the slice given to
    /// [`Backend::build`]) at the limit's own quota, spending `cost`.
    #[inline]
    pub fn new(limit: usize, key: Key<'a>, cost: u64) -> Self {
        Self {
            limit,
            key,
            cost,
            quota: None,
        }
    }

    /// Decides this check at `quota` instead of the limit's own quota.
    #[inline]
    #[must_use]
    pub fn with_quota(mut self, quota: &'a PlanQuota) -> Self {
        self.quota = Some(quota);
        self
    }
}

/// A store's answer: ready now (in-memory) or later (network).
// `Ready` carries the decisions inline on purpose: it is the in-memory hot path, and boxing it
// would allocate on every request. The size difference only costs a memcpy of a few hundred bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Checked<F> {
    /// Decided synchronously.
    Ready(Result<Decisions, StoreError>),
    /// Decision pending on I/O.
    Pending(F),
}

/// Configuration of where state lives; turned into a [`Store`] by the layer builder. See
/// [`Store`] for an example of implementing both.
pub trait Backend {
    /// The store this backend builds.
    type Store: Store;

    /// Builds the store for `limits` (validated already), or says what is misconfigured.
    fn build(self, limits: &[LimitSpec]) -> Result<Self::Store, ConfigError>;
}

/// Decides requests against limits, all-or-nothing.
///
/// [`MemoryStore`] and (feature `redis`) `RedisStore` implement it; so
/// can a store of your own, built by a [`Backend`] of your own. A store may keep state anywhere,
/// deciding each limit with the [algorithm](crate::algorithm) its [`LimitSpec`] names, or wrap
/// another store, as this one does to count the checks that reach it:
///
/// ```
/// use std::convert::Infallible;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use http::{Request, Response, StatusCode};
/// use tollgate::key::GlobalKey;
/// use tollgate::store::{Backend, Checked, LimitCheck, LimitSpec, MemoryBackend, Store};
/// use tollgate::{ConfigError, Limit, Quota, RateLimitLayer};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// struct Counted<S> {
///     inner: S,
///     checks: Arc<AtomicU64>,
/// }
///
/// impl<S: Store> Store for Counted<S> {
///     type Future = S::Future;
///
///     fn check(&self, checks: &[LimitCheck<'_>]) -> Checked<Self::Future> {
///         self.checks.fetch_add(1, Ordering::Relaxed);
///         self.inner.check(checks)
///     }
/// }
///
/// struct CountedBackend<B>(B, Arc<AtomicU64>);
///
/// impl<B: Backend> Backend for CountedBackend<B> {
///     type Store = Counted<B::Store>;
///
///     fn build(self, limits: &[LimitSpec]) -> Result<Self::Store, ConfigError> {
///         Ok(Counted { inner: self.0.build(limits)?, checks: self.1 })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let checks = Arc::new(AtomicU64::new(0));
/// let layer = RateLimitLayer::builder()
///     .backend(CountedBackend(MemoryBackend::new(), checks.clone()))
///     .limit(Limit::new("global", Quota::per_hour(1)).key(GlobalKey))
///     .build()?;
/// let svc = ServiceBuilder::new()
///     .layer(layer)
///     .service(service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) }));
///
/// let res = svc.clone().oneshot(Request::new(())).await?;
/// assert_eq!(res.status(), StatusCode::OK);
/// let res = svc.clone().oneshot(Request::new(())).await?;
/// assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(checks.load(Ordering::Relaxed), 2);
/// # Ok(())
/// # }
/// ```
pub trait Store: Send + Sync + 'static {
    /// The future of a pending check.
    type Future: Future<Output = Result<Decisions, StoreError>> + Send + 'static;

    /// Checks every limit in `checks` and charges them only if all allow. Returns one decision
    /// per check, in order, each attributed to its limit's name.
    fn check(&self, checks: &[LimitCheck<'_>]) -> Checked<Self::Future>;

    /// Gives back what an allowed [`check`](Self::check) of the same `checks` charged at
    /// `reserved_at` (its [`Decisions::decided_at`]): the layer's charge-by-outcome refunds a
    /// request whose response is not to be counted. A refund never makes a key fuller than a
    /// key that never saw the reservation (see [`Algorithm::refund`](crate::algorithm::Algorithm::refund)),
    /// so refunds arriving late never let a limit admit more than its quota.
    ///
    /// Returns one decision per check, as it stands after the refund, at cost 0. The default
    /// answers an error: a store of your own supports charge-by-outcome by implementing it.
    fn refund(&self, checks: &[LimitCheck<'_>], reserved_at: u64) -> Checked<Self::Future> {
        let _ = (checks, reserved_at);
        Checked::Ready(Err(StoreError::new(
            crate::error::StoreErrorKind::Other,
            "this store cannot give charges back; implement Store::refund to count by outcome",
        )))
    }

    /// A store deciding `limits` that keeps this store's state (and connections) for every
    /// limit of the same name and algorithm: a policy reload builds the new configuration's
    /// store this way, so counters survive it. Limits that are new get fresh state; limits
    /// that are gone are dropped. A check at a different quota than the one a key's state was
    /// written under keeps what the key spent (see [`PlanQuota`]).
    ///
    /// The default answers an error: the store cannot be reloaded.
    fn reconfigure(&self, limits: &[LimitSpec]) -> Result<Self, ConfigError>
    where
        Self: Sized,
    {
        let _ = limits;
        Err(ConfigError::new(
            "store",
            "this store cannot be reconfigured while serving; implement Store::reconfigure, or rebuild the layer",
        ))
    }
}

impl<S: Store> Store for std::sync::Arc<S> {
    type Future = S::Future;

    #[inline]
    fn check(&self, checks: &[LimitCheck<'_>]) -> Checked<Self::Future> {
        (**self).check(checks)
    }

    #[inline]
    fn refund(&self, checks: &[LimitCheck<'_>], reserved_at: u64) -> Checked<Self::Future> {
        (**self).refund(checks, reserved_at)
    }

    fn reconfigure(&self, limits: &[LimitSpec]) -> Result<Self, ConfigError> {
        (**self).reconfigure(limits).map(std::sync::Arc::new)
    }
}
