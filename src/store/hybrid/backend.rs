//! [`HybridBackend`]: configuration of a hybrid store.

use std::sync::Arc;

use super::lease_plan::LeasePlan;
use super::stats::HybridStats;
use super::store::{HybridStore, Inner};
use super::table::Table;
use crate::clock::{Clock, SystemClock};
use crate::error::ConfigError;
use crate::store::redis::RedisBackend;
use crate::store::{Backend, LimitSpec};

/// The default [`HybridBackend::max_lease`]: one instance holds at most a quarter of a key's
/// capacity.
pub const DEFAULT_MAX_LEASE: f64 = 0.25;
/// The default [`HybridBackend::max_keys`].
pub const DEFAULT_MAX_KEYS: usize = 100_000;
/// The largest accepted [`HybridBackend::max_keys`].
pub const MAX_KEYS: usize = 1 << 26;

/// Configuration of a [`HybridStore`]: a local tier in front of a [`RedisBackend`] (single
/// node or Cluster). See the [module docs](super).
///
/// ```
/// use tollgate::store::hybrid::HybridBackend;
/// use tollgate::store::redis::RedisBackend;
///
/// let backend = HybridBackend::new(RedisBackend::new("redis://127.0.0.1:6379"))
///     // the one knob: the largest share of a key's capacity one instance may lease
///     .max_lease(0.1);
/// # let _ = backend;
/// ```
#[must_use]
pub struct HybridBackend {
    redis: RedisBackend,
    max_lease: f64,
    max_keys: usize,
    clock: Arc<dyn Clock>,
    stats: HybridStats,
}

impl std::fmt::Debug for HybridBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridBackend")
            .field("redis", &self.redis)
            .field("max_lease", &self.max_lease)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl HybridBackend {
    /// A local tier in front of `redis`, whose settings (timeout, breaker, failure policies,
    /// key names) all apply.
    pub fn new(redis: RedisBackend) -> Self {
        Self {
            redis,
            max_lease: DEFAULT_MAX_LEASE,
            max_keys: DEFAULT_MAX_KEYS,
            clock: Arc::new(SystemClock::new()),
            stats: HybridStats::default(),
        }
    }

    /// The staleness/accuracy knob: the largest share of a key's capacity (in (0, 1], default
    /// [`DEFAULT_MAX_LEASE`]) one instance may hold as a lease. Larger: fewer Redis calls for
    /// hot keys; smaller: less budget held by one instance (under-admission across instances)
    /// and shorter leases. A lease lives as long as the quota takes to refill it, at most 1 s.
    pub fn max_lease(mut self, share: f64) -> Self {
        self.max_lease = share;
        self
    }

    /// The most keys the local tier keeps state for (default [`DEFAULT_MAX_KEYS`]); keys beyond
    /// it are checked plainly in Redis until idle keys are dropped.
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }

    /// The clock leases expire by (default [`SystemClock`]); for tests, a
    /// [`ManualClock`](crate::clock::ManualClock), usually the one given to
    /// [`RedisBackend::clock`] too.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The store's counters (shared with the store this backend builds).
    pub fn stats(&self) -> HybridStats {
        self.stats.clone()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !(self.max_lease > 0.0 && self.max_lease <= 1.0) {
            return Err(ConfigError::new(
                "hybrid.max_lease",
                format!(
                    "{} is out of range: use a share of the capacity in (0, 1], e.g. {DEFAULT_MAX_LEASE} (the default)",
                    self.max_lease
                ),
            ));
        }
        if self.max_keys == 0 || self.max_keys > MAX_KEYS {
            return Err(ConfigError::new(
                "hybrid.max_keys",
                format!(
                    "{} is out of range: keep state for 1 to {MAX_KEYS} keys; the default is {DEFAULT_MAX_KEYS}",
                    self.max_keys
                ),
            ));
        }
        Ok(())
    }
}

impl Backend for HybridBackend {
    type Store = HybridStore;

    fn build(self, limits: &[LimitSpec]) -> Result<HybridStore, ConfigError> {
        self.validate()?;
        let redis = self.redis.build(limits)?;
        let script = redis.lease_script();
        if script.is_none() {
            tracing::warn!("the Redis store's script has an unexpected layout; the hybrid store checks every request in Redis");
        }
        Ok(HybridStore::from_inner(Inner {
            plans: limits
                .iter()
                .map(|s| LeasePlan::of(s, self.max_lease))
                .collect(),
            script,
            redis,
            table: Table::new(self.max_keys),
            clock: self.clock,
            stats: self.stats,
            max_lease: self.max_lease,
            max_keys: self.max_keys,
        }))
    }
}
