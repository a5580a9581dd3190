//! Counters and the circuit breaker.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

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
    split_batches: AtomicU64,
    batcher_restarts: AtomicU64,
    batchers: AtomicU64,
    reconnects: AtomicU64,
    open_breakers: AtomicU32,
    maxmemory_policy: OnceLock<String>,
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
            .field("maxmemory_policy", &self.maxmemory_policy())
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

    /// How many times a circuit breaker opened (there is one per node: the node of a single-node
    /// store, or each Cluster master).
    pub fn breaker_trips(&self) -> u64 {
        self.inner.breaker_trips.load(Relaxed)
    }

    /// Whether any circuit breaker is open now (requests to its node skip Redis until a probe
    /// of that node succeeds).
    pub fn breaker_open(&self) -> bool {
        self.open_breakers() > 0
    }

    /// How many nodes' circuit breakers are open now (at most 1 for a single node; in a
    /// Cluster, one per unreachable master: keys on the other masters are still decided by
    /// Redis).
    pub fn open_breakers(&self) -> u32 {
        self.inner.open_breakers.load(Relaxed)
    }

    /// How many times the batching task was found stopped (it panicked, or its runtime shut
    /// down) and was restarted. Requests it held were decided by their failure policies.
    pub fn batcher_restarts(&self) -> u64 {
        self.inner.batcher_restarts.load(Relaxed)
    }

    /// Batching tasks running: one per tokio runtime the store decides from for a node or a
    /// Sentinel primary, one per Cluster master it has sent checks to. A Cluster master the slot
    /// map no longer names (failed over, removed) loses its batcher when the store first sends to
    /// a new master, once its calls on the wire are answered, so failovers do not add up.
    pub fn batchers(&self) -> u64 {
        self.inner.batchers.load(Relaxed)
    }

    /// How many connections were set up because the store was used from a tokio runtime
    /// that had none yet, or whose connection had died with its runtime, or because a Cluster
    /// connection stopped answering while its masters answered (it is replaced), or, behind
    /// Sentinels, because the primary was found again (a failover, a lost connection). The
    /// first is not counted.
    pub fn reconnects(&self) -> u64 {
        self.inner.reconnects.load(Relaxed)
    }

    /// The server's `maxmemory-policy`, as read with `CONFIG GET` when the store connected
    /// (`None` until then, or if the server refused `CONFIG`). Anything but `noeviction` lets
    /// Redis evict limiter keys, which gives their clients a fresh budget: see the
    /// [module docs](super#memory-and-eviction).
    pub fn maxmemory_policy(&self) -> Option<&str> {
        self.inner.maxmemory_policy.get().map(String::as_str)
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

    /// Script calls sent by the batchers (on a Cluster, one batcher per master).
    pub fn batches(&self) -> u64 {
        self.inner.batches.load(Relaxed)
    }

    /// Requests decided through the batcher (divide by [`batches`](Self::batches) for the mean
    /// batch size).
    pub fn batched_calls(&self) -> u64 {
        self.inner.batched_calls.load(Relaxed)
    }

    /// Cluster batches a master refused whole because it no longer served one of their hash
    /// slots (resharding, failover): nothing of them was applied, and their checks were sent
    /// again slot by slot (each once, counted in [`batches`](Self::batches) again).
    pub fn split_batches(&self) -> u64 {
        self.inner.split_batches.load(Relaxed)
    }

    pub(crate) fn add_split_batch(&self) {
        self.inner.split_batches.fetch_add(1, Relaxed);
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

    /// A call failed.
    pub(crate) fn on_failure(&self, timeout: bool) {
        self.inner.errors.fetch_add(1, Relaxed);
        if timeout {
            self.inner.timeouts.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn breaker_opened(&self) {
        self.inner.breaker_trips.fetch_add(1, Relaxed);
        self.inner.open_breakers.fetch_add(1, Relaxed);
    }

    pub(crate) fn breaker_closed(&self) {
        self.inner.open_breakers.fetch_sub(1, Relaxed);
    }

    /// Counts a batching task from its start until it ends (however it ends).
    pub(crate) fn batcher_running(&self) -> BatcherRunning {
        self.inner.batchers.fetch_add(1, Relaxed);
        BatcherRunning(self.clone())
    }

    pub(crate) fn add_batcher_restart(&self) {
        self.inner.batcher_restarts.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_reconnect(&self) {
        self.inner.reconnects.fetch_add(1, Relaxed);
    }

    pub(crate) fn set_maxmemory_policy(&self, policy: String) {
        let _ = self.inner.maxmemory_policy.set(policy);
    }
}

/// A batching task, counted in [`RedisStats::batchers`] until it is dropped.
pub(crate) struct BatcherRunning(RedisStats);

impl Drop for BatcherRunning {
    fn drop(&mut self) {
        self.0.inner.batchers.fetch_sub(1, Relaxed);
    }
}
