//! Where limiter state lives: the [`Backend`] / [`Store`] traits and their implementations.
//!
//! A [`Backend`] is configuration (`MemoryBackend::new().max_keys(100_000)`); the layer builder
//! calls [`Backend::build`] once with every limit it holds and gets a [`Store`]. Per request, the
//! service calls [`Store::check`] with one [`LimitCheck`] per applicable limit and gets one
//! [`Decision`] per check, all-or-nothing: if any limit rejects, none is charged.

use std::future::Future;
use std::time::Duration;

use crate::algorithm::AlgorithmKind;
use crate::decision::{Decision, PolicyName};
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::quota::Quota;

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;

#[cfg(feature = "redis")]
pub use self::redis::{RedisBackend, RedisStore};
pub use memory::{MemoryBackend, MemoryStore};

/// The most limits one layer may hold. Stack layers for more.
pub const MAX_LIMITS: usize = 8;

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
#[derive(Debug, Clone)]
pub struct LimitCheck<'a> {
    /// Index of the limit in the slice given to [`Backend::build`].
    pub limit: usize,
    /// The key extracted for this limit.
    pub key: Key<'a>,
    /// Units to spend.
    pub cost: u64,
}

/// Up to [`MAX_LIMITS`] decisions, one per [`LimitCheck`], in the same order.
#[derive(Debug, Clone, Copy)]
pub struct Decisions {
    items: [Decision; MAX_LIMITS],
    len: usize,
}

impl Default for Decisions {
    fn default() -> Self {
        Self {
            items: [Decision::allowed_with(0, 0, Duration::ZERO); MAX_LIMITS],
            len: 0,
        }
    }
}

impl Decisions {
    /// No decisions yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a decision.
    ///
    /// # Panics
    /// If more than [`MAX_LIMITS`] are pushed; builders never configure more.
    #[inline]
    pub fn push(&mut self, d: Decision) {
        self.items[self.len] = d;
        self.len += 1;
    }

    /// The decisions, in check order.
    #[inline]
    pub fn as_slice(&self) -> &[Decision] {
        &self.items[..self.len]
    }

    /// Mutable access, in check order.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [Decision] {
        &mut self.items[..self.len]
    }

    /// Number of decisions.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether every limit allowed.
    #[inline]
    pub fn allowed(&self) -> bool {
        self.as_slice().iter().all(Decision::allowed)
    }

    /// The first rejecting decision, which names the limit that rejected.
    pub fn rejected(&self) -> Option<&Decision> {
        self.as_slice().iter().find(|d| !d.allowed())
    }

    /// The decision to report in headers: the rejecting one if any, else the limit closest to
    /// exhaustion (smallest `remaining / limit`).
    pub fn reported(&self) -> Option<&Decision> {
        if let Some(r) = self.rejected() {
            return Some(r);
        }
        self.as_slice()
            .iter()
            .reduce(|best, d| if d.is_tighter_than(best) { d } else { best })
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
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    type Future = S::Future;

    #[inline]
    fn check(&self, checks: &[LimitCheck<'_>]) -> Checked<Self::Future> {
        (**self).check(checks)
    }
}
