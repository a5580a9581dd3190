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

/// Up to [`MAX_LIMITS`] decisions, one per [`LimitCheck`], in the same order.
///
/// Up to [`INLINE`](Self::INLINE) decisions are held inline (no allocation: the common one- and
/// two-limit layers), more on the heap. It is moved on every request from the store to the
/// layer: two decisions and 24 bytes (a [`Decision`] holds its limit's and plan's names
/// inline, 128 bytes), a copy with no pointer to follow and no count to update.
#[derive(Clone)]
pub struct Decisions {
    items: Items,
    len: u8,
    /// The store's clock reading the checks were decided at, or [`NOT_DECIDED`].
    at: u64,
}

/// Where a [`Decisions`]' items live.
// The inline variant is the one nearly every request uses; boxing it would allocate per request.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Items {
    Inline([Decision; Decisions::INLINE]),
    Heap(Box<[Decision; MAX_LIMITS]>),
}

/// `Decisions::at` when the store reported no time.
const NOT_DECIDED: u64 = u64::MAX;

impl std::fmt::Debug for Decisions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decisions")
            .field("decisions", &self.as_slice())
            .field("decided_at", &self.decided_at())
            .finish()
    }
}

impl Default for Decisions {
    #[inline]
    fn default() -> Self {
        Self::new()
    }
}

impl Decisions {
    /// How many decisions are held without allocating.
    pub const INLINE: usize = 2;

    /// No decisions yet.
    #[inline]
    pub const fn new() -> Self {
        Self {
            items: Items::Inline([Decision::EMPTY; Self::INLINE]),
            len: 0,
            at: NOT_DECIDED,
        }
    }

    /// One decision, decided at `at` (the single-limit hot path builds its answer at once).
    #[inline]
    pub(crate) const fn one(decision: Decision, at: u64) -> Self {
        Self {
            items: Items::Inline([decision, Decision::EMPTY]),
            len: 1,
            at,
        }
    }

    /// Appends a decision.
    ///
    /// # Panics
    /// If more than [`MAX_LIMITS`] are pushed; builders never configure more.
    #[inline]
    pub fn push(&mut self, d: Decision) {
        let len = usize::from(self.len);
        assert!(len < MAX_LIMITS, "more than {MAX_LIMITS} decisions");
        match &mut self.items {
            Items::Inline(items) if len < Self::INLINE => items[len] = d,
            Items::Inline(items) => {
                let mut heap = Box::new([Decision::EMPTY; MAX_LIMITS]);
                heap[..Self::INLINE].copy_from_slice(items);
                heap[len] = d;
                self.items = Items::Heap(heap);
            }
            Items::Heap(items) => items[len] = d,
        }
        self.len += 1;
    }

    /// The time (µs on the store's clock: the memory store's [`Clock`](crate::clock::Clock),
    /// Redis `TIME`) at which the checks were decided and charged, when the store reports it.
    /// [`Store::refund`] takes it back to give a reservation back exactly.
    #[inline]
    pub fn decided_at(&self) -> Option<u64> {
        (self.at != NOT_DECIDED).then_some(self.at)
    }

    /// Records the time the checks were decided at (see [`decided_at`](Self::decided_at)).
    /// `u64::MAX` (585,000 years) reads as not reported.
    #[inline]
    pub fn set_decided_at(&mut self, at: u64) {
        self.at = at;
    }

    /// The decisions, in check order.
    #[inline]
    pub fn as_slice(&self) -> &[Decision] {
        let len = usize::from(self.len);
        match &self.items {
            Items::Inline(items) => &items[..len],
            Items::Heap(items) => &items[..len],
        }
    }

    /// Mutable access, in check order.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [Decision] {
        let len = usize::from(self.len);
        match &mut self.items {
            Items::Inline(items) => &mut items[..len],
            Items::Heap(items) => &mut items[..len],
        }
    }

    /// Number of decisions.
    #[inline]
    pub fn len(&self) -> usize {
        usize::from(self.len)
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

#[cfg(test)]
mod decisions_tests {
    use super::*;

    fn d(remaining: u64) -> Decision {
        Decision::allowed_with(10, remaining, Duration::from_secs(1))
    }

    #[test]
    fn decisions_spill_to_the_heap_in_order_and_stay_small() {
        // Moved on every request: two inline decisions and the length and time.
        assert!(std::mem::size_of::<Decisions>() <= 2 * std::mem::size_of::<Decision>() + 24);
        let mut all = Decisions::new();
        assert!(all.is_empty() && all.decided_at().is_none());
        for i in 0..MAX_LIMITS as u64 {
            all.push(d(i));
            assert_eq!(all.len(), i as usize + 1);
            let remaining: Vec<u64> = all.as_slice().iter().map(Decision::remaining).collect();
            assert_eq!(remaining, (0..=i).collect::<Vec<_>>());
        }
        all.as_mut_slice()[7] = d(9);
        all.set_decided_at(42);
        let copy = all.clone();
        assert_eq!(copy.as_slice(), all.as_slice());
        assert_eq!(copy.as_slice()[7].remaining(), 9);
        assert_eq!(copy.decided_at(), Some(42));
        assert_eq!(copy.reported().unwrap().remaining(), 0);
        let one = Decisions::one(d(3), 7);
        assert_eq!((one.len(), one.decided_at()), (1, Some(7)));
        assert_eq!(one.as_slice(), &[d(3)]);
    }

    #[test]
    #[should_panic(expected = "more than 8 decisions")]
    fn a_ninth_decision_panics() {
        let mut all = Decisions::new();
        for _ in 0..=MAX_LIMITS {
            all.push(d(1));
        }
    }
}
