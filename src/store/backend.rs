//! The [`Backend`] and [`Store`] traits: configuration of where limiter state lives, and the
//! store it builds, which decides requests against limits.

use std::future::Future;

use super::{Decisions, LimitCheck, LimitSpec};
use crate::error::{ConfigError, StoreError};

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
/// [`MemoryStore`](super::memory::MemoryStore) and (feature `redis`) `RedisStore` implement it; so
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
/// use tollgate::store::{Backend, Checked, LimitCheck, LimitSpec, memory::MemoryBackend, Store};
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
    /// written under keeps what the key spent (see [`PlanQuota`](super::PlanQuota)).
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
