//! Counters of a hybrid store.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Live counters of a [`HybridStore`](super::HybridStore): how many decisions stayed local and
/// how many reached Redis.
///
/// A cheap handle (clones share the counters). Get one from
/// [`HybridBackend::stats`](super::HybridBackend::stats) before handing the backend to a layer.
///
/// ```
/// use tollgate::store::hybrid::HybridBackend;
/// use tollgate::store::redis::RedisBackend;
///
/// let backend = HybridBackend::new(RedisBackend::new("redis://127.0.0.1:6379"));
/// let stats = backend.stats();
/// assert_eq!(stats.redis_calls(), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct HybridStats {
    inner: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    local_allowed: AtomicU64,
    local_rejected: AtomicU64,
    leases: AtomicU64,
    leased_units: AtomicU64,
    lease_refusals: AtomicU64,
    plain_checks: AtomicU64,
    failures: AtomicU64,
}

impl HybridStats {
    /// Requests admitted from a local lease, without a Redis call.
    pub fn local_allowed(&self) -> u64 {
        self.inner.local_allowed.load(Relaxed)
    }

    /// Requests refused from the local memory of a Redis refusal, without a Redis call.
    pub fn local_rejected(&self) -> u64 {
        self.inner.local_rejected.load(Relaxed)
    }

    /// Lease calls Redis answered (granted or refused).
    pub fn leases(&self) -> u64 {
        self.inner.leases.load(Relaxed)
    }

    /// Units Redis leased in all.
    pub fn leased_units(&self) -> u64 {
        self.inner.leased_units.load(Relaxed)
    }

    /// Lease calls Redis refused (nothing fit).
    pub fn lease_refusals(&self) -> u64 {
        self.inner.lease_refusals.load(Relaxed)
    }

    /// Requests checked plainly by the Redis store (limits that do not lease, plans, full table).
    pub fn plain_checks(&self) -> u64 {
        self.inner.plain_checks.load(Relaxed)
    }

    /// Lease calls that failed (Redis down, timed out, breaker open): decided by the failure
    /// policies.
    pub fn failures(&self) -> u64 {
        self.inner.failures.load(Relaxed)
    }

    /// Script calls this store sent to Redis: leases, plain checks and failed attempts.
    pub fn redis_calls(&self) -> u64 {
        self.leases() + self.plain_checks() + self.failures()
    }

    pub(crate) fn add_local(&self, allowed: bool) {
        if allowed {
            self.inner.local_allowed.fetch_add(1, Relaxed);
        } else {
            self.inner.local_rejected.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn add_lease(&self, granted: u64) {
        self.inner.leases.fetch_add(1, Relaxed);
        if granted == 0 {
            self.inner.lease_refusals.fetch_add(1, Relaxed);
        } else {
            self.inner.leased_units.fetch_add(granted, Relaxed);
        }
    }

    pub(crate) fn add_plain(&self) {
        self.inner.plain_checks.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_failure(&self) {
        self.inner.failures.fetch_add(1, Relaxed);
    }
}
