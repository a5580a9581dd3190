//! [`PlanQuota`]: a quota compiled for one algorithm, chosen per request.

use std::fmt;

use crate::algorithm::{
    Algorithm, AlgorithmKind, FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow,
    TokenBucket,
};
use crate::error::ConfigError;
use crate::quota::Quota;

/// A quota compiled for one algorithm: what a [`LimitCheck`](super::LimitCheck) carries when a
/// request is decided at a quota other than its limit's own (a plan chosen per request, a
/// per-key override, a limit changed by a policy reload).
///
/// Compile it once (when the plan or policy is built) and lend it to every check: a check then
/// costs the store no parsing or validation. Its algorithm must be the limit's; a store answers
/// a mismatch with an error rather than guessing.
///
/// ```
/// use tollgate::store::PlanQuota;
/// use tollgate::{AlgorithmKind, Quota};
///
/// let pro = PlanQuota::new(AlgorithmKind::FixedWindow, Quota::per_minute(20)).unwrap();
/// assert_eq!(pro.capacity(), 20);
/// assert_eq!(pro.algorithm(), AlgorithmKind::FixedWindow);
///
/// // Windows take no burst: the error says so when the plan is built, not per request.
/// let err = PlanQuota::new(AlgorithmKind::FixedWindow, Quota::per_minute(20).burst(40));
/// assert!(err.unwrap_err().to_string().contains("burst"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PlanQuota {
    pub(crate) compiled: CompiledAlgorithm,
}

/// One of the six algorithms, built for a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompiledAlgorithm {
    TokenBucket(TokenBucket),
    Gcra(Gcra),
    FixedWindow(FixedWindow),
    SlidingWindow(SlidingWindow),
    SlidingLog(SlidingLog),
    LeakyBucket(LeakyBucket),
}

impl PlanQuota {
    /// `quota` enforced by `algorithm`, validated as a [`Limit`](crate::Limit) would be.
    pub fn new(algorithm: AlgorithmKind, quota: Quota) -> Result<Self, ConfigError> {
        let compiled = match algorithm {
            AlgorithmKind::TokenBucket => CompiledAlgorithm::TokenBucket(TokenBucket::new(quota)?),
            AlgorithmKind::Gcra => CompiledAlgorithm::Gcra(Gcra::new(quota)?),
            AlgorithmKind::FixedWindow => CompiledAlgorithm::FixedWindow(FixedWindow::new(quota)?),
            AlgorithmKind::SlidingWindow => {
                CompiledAlgorithm::SlidingWindow(SlidingWindow::new(quota)?)
            }
            AlgorithmKind::SlidingLog => CompiledAlgorithm::SlidingLog(SlidingLog::new(quota)?),
            AlgorithmKind::LeakyBucket => CompiledAlgorithm::LeakyBucket(LeakyBucket::new(quota)?),
        };
        Ok(Self { compiled })
    }

    /// The quota.
    pub fn quota(&self) -> &Quota {
        match &self.compiled {
            CompiledAlgorithm::TokenBucket(a) => a.quota(),
            CompiledAlgorithm::Gcra(a) => a.quota(),
            CompiledAlgorithm::FixedWindow(a) => a.quota(),
            CompiledAlgorithm::SlidingWindow(a) => a.quota(),
            CompiledAlgorithm::SlidingLog(a) => a.quota(),
            CompiledAlgorithm::LeakyBucket(a) => a.quota(),
        }
    }

    /// The algorithm enforcing it.
    pub fn algorithm(&self) -> AlgorithmKind {
        match &self.compiled {
            CompiledAlgorithm::TokenBucket(_) => AlgorithmKind::TokenBucket,
            CompiledAlgorithm::Gcra(_) => AlgorithmKind::Gcra,
            CompiledAlgorithm::FixedWindow(_) => AlgorithmKind::FixedWindow,
            CompiledAlgorithm::SlidingWindow(_) => AlgorithmKind::SlidingWindow,
            CompiledAlgorithm::SlidingLog(_) => AlgorithmKind::SlidingLog,
            CompiledAlgorithm::LeakyBucket(_) => AlgorithmKind::LeakyBucket,
        }
    }

    /// The largest cost one request can be granted under it.
    pub fn capacity(&self) -> u64 {
        match &self.compiled {
            CompiledAlgorithm::TokenBucket(a) => a.capacity(),
            CompiledAlgorithm::Gcra(a) => a.capacity(),
            CompiledAlgorithm::FixedWindow(a) => a.capacity(),
            CompiledAlgorithm::SlidingWindow(a) => a.capacity(),
            CompiledAlgorithm::SlidingLog(a) => a.capacity(),
            CompiledAlgorithm::LeakyBucket(a) => a.capacity(),
        }
    }
}

impl fmt::Debug for PlanQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanQuota")
            .field("algorithm", &self.algorithm())
            .field("quota", self.quota())
            .finish()
    }
}
