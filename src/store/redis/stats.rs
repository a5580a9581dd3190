//! Counters and the circuit breaker.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Live counters of a Redis store: how often Redis could not decide and what the failure
/// policies did about it.
///
/// A cheap handle (clones share the counters). Get one from
/// [`RedisBackend::stats`](super::RedisBackend::stats) before handing the backend to a layer,
/// or from [`RedisStore::stats`](super::RedisStore::stats).
///
/// ```
/// use tollgate::store::redis::RedisBackend;
///
/// let backend = RedisBackend::new("redis://127.0.0.1:6379");
/// let stats = backend.stats();
/// assert_eq!(stats.fail_open(), 0);
/// assert!(!stats.breaker_open());
/// ```
#[derive(Clone, Default)]
pub struct RedisStats {
    inner: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    fail_open: AtomicU64,
    fail_closed: AtomicU64,
    local_fallback: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    breaker_trips: AtomicU64,
    short_circuited: AtomicU64,
    corrupt_resets: AtomicU64,
    refunds: AtomicU64,
    refund_failures: AtomicU64,
    batches: AtomicU64,
    batched_calls: AtomicU64,
    consecutive_failures: AtomicU32,
    breaker_open: AtomicBool,
    probing: AtomicBool,
}

impl std::fmt::Debug for RedisStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStats")
            .field("fail_open", &self.fail_open())
            .field("fail_closed", &self.fail_closed())
            .field("local_fallback", &self.local_fallback())
            .field("errors", &self.errors())
            .field("timeouts", &self.timeouts())
            .field("breaker_trips", &self.breaker_trips())
            .field("breaker_open", &self.breaker_open())
            .field("corrupt_resets", &self.corrupt_resets())
            .field("refunds", &self.refunds())
            .finish_non_exhaustive()
    }
}

impl RedisStats {
    /// Limit decisions let through without Redis (failure policy `Open`).
    pub fn fail_open(&self) -> u64 {
        self.inner.fail_open.load(Relaxed)
    }

    /// Requests refused because Redis could not decide (failure policy `Closed`).
    pub fn fail_closed(&self) -> u64 {
        self.inner.fail_closed.load(Relaxed)
    }

    /// Limit decisions made by the local fallback limiter (failure policy `Local`).
    pub fn local_fallback(&self) -> u64 {
        self.inner.local_fallback.load(Relaxed)
    }

    /// Failed Redis calls (connection errors, server errors, invalid replies, timeouts).
    pub fn errors(&self) -> u64 {
        self.inner.errors.load(Relaxed)
    }

    /// Redis calls that did not answer within the timeout (also counted in [`errors`](Self::errors)).
    pub fn timeouts(&self) -> u64 {
        self.inner.timeouts.load(Relaxed)
    }

    /// How many times the circuit breaker opened.
    pub fn breaker_trips(&self) -> u64 {
        self.inner.breaker_trips.load(Relaxed)
    }

    /// Whether the circuit breaker is open now (requests skip Redis until a probe succeeds).
    pub fn breaker_open(&self) -> bool {
        self.inner.breaker_open.load(Relaxed)
    }

    /// Requests decided by the failure policy without trying Redis, because the breaker was open.
    pub fn short_circuited(&self) -> u64 {
        self.inner.short_circuited.load(Relaxed)
    }

    /// Limiter keys that held unreadable state (wrong type, garbage) and were reset to fresh.
    pub fn corrupt_resets(&self) -> u64 {
        self.inner.corrupt_resets.load(Relaxed)
    }

    /// Reservations given back because another slot's limit rejected (Cluster only).
    pub fn refunds(&self) -> u64 {
        self.inner.refunds.load(Relaxed)
    }

    /// Refunds that could not be delivered (the reserved units stay spent until they refill).
    pub fn refund_failures(&self) -> u64 {
        self.inner.refund_failures.load(Relaxed)
    }

    /// Script calls sent by the batcher.
    pub fn batches(&self) -> u64 {
        self.inner.batches.load(Relaxed)
    }

    /// Requests decided through the batcher (divide by [`batches`](Self::batches) for the mean
    /// batch size).
    pub fn batched_calls(&self) -> u64 {
        self.inner.batched_calls.load(Relaxed)
    }

    pub(crate) fn add_fail_open(&self, n: u64) {
        self.inner.fail_open.fetch_add(n, Relaxed);
    }
    pub(crate) fn add_fail_closed(&self) {
        self.inner.fail_closed.fetch_add(1, Relaxed);
    }
    pub(crate) fn add_local_fallback(&self, n: u64) {
        self.inner.local_fallback.fetch_add(n, Relaxed);
    }
    pub(crate) fn add_short_circuited(&self) {
        self.inner.short_circuited.fetch_add(1, Relaxed);
    }
    pub(crate) fn add_corrupt_reset(&self) {
        self.inner.corrupt_resets.fetch_add(1, Relaxed);
    }
    pub(crate) fn add_refund(&self, ok: bool) {
        if ok {
            self.inner.refunds.fetch_add(1, Relaxed);
        } else {
            self.inner.refund_failures.fetch_add(1, Relaxed);
        }
    }
    pub(crate) fn record_batch(&self, calls: usize) {
        self.inner.batches.fetch_add(1, Relaxed);
        self.inner.batched_calls.fetch_add(calls as u64, Relaxed);
    }

    /// A call succeeded: the breaker's failure streak ends.
    pub(crate) fn on_success(&self) {
        if self.inner.consecutive_failures.load(Relaxed) != 0 {
            self.inner.consecutive_failures.store(0, Relaxed);
        }
    }

    /// A call failed. Returns true when this failure opened the breaker (the caller starts the
    /// probe).
    pub(crate) fn on_failure(&self, timeout: bool, threshold: u32) -> bool {
        self.inner.errors.fetch_add(1, Relaxed);
        if timeout {
            self.inner.timeouts.fetch_add(1, Relaxed);
        }
        let streak = self.inner.consecutive_failures.fetch_add(1, Relaxed) + 1;
        if streak >= threshold && !self.inner.breaker_open.swap(true, Relaxed) {
            self.inner.breaker_trips.fetch_add(1, Relaxed);
            return true;
        }
        false
    }

    /// Closes the breaker after a successful probe.
    pub(crate) fn close_breaker(&self) {
        self.inner.consecutive_failures.store(0, Relaxed);
        self.inner.breaker_open.store(false, Relaxed);
    }

    /// Claims the single probe task; false if one is already running.
    pub(crate) fn start_probing(&self) -> bool {
        !self.inner.probing.swap(true, Relaxed)
    }

    pub(crate) fn stop_probing(&self) {
        self.inner.probing.store(false, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_after_the_threshold_and_closes_on_demand() {
        let s = RedisStats::default();
        assert!(!s.on_failure(false, 3));
        s.on_success();
        assert!(!s.on_failure(true, 3));
        assert!(!s.on_failure(false, 3));
        assert!(s.on_failure(false, 3), "third consecutive failure opens");
        assert!(s.breaker_open());
        assert!(!s.on_failure(false, 3), "already open: no second trip");
        assert_eq!((s.errors(), s.timeouts(), s.breaker_trips()), (5, 1, 1));
        s.close_breaker();
        assert!(!s.breaker_open());
        assert!(s.start_probing());
        assert!(!s.start_probing());
        s.stop_probing();
        assert!(s.start_probing());
    }
}
