//! [`PlanQuota`]: a quota compiled for one algorithm, chosen per request.

use std::fmt;

use crate::algorithm::{
    Algorithm, AlgorithmKind, FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow,
    TokenBucket,
};
use crate::error::ConfigError;
use crate::quota::Quota;

mod compiled_algorithm;
mod registry;

pub(crate) use compiled_algorithm::CompiledAlgorithm;
pub use registry::KEPT_QUOTAS;
pub(crate) use registry::{compiled, QuotaPin};
#[doc(hidden)]
pub use registry::{kept_quotas, with_quota_registry_locked};

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
///
/// A key keeps what it spent when the quota it is checked at changes: the store converts its
/// state with [`Algorithm::rebase`] (see each algorithm's **Plan changes**). To know which
/// quota a state was written under, every distinct quota (algorithm and [`Quota`]) gets a
/// number, its *tag*, and stores keep the tag beside the key's state. A tag is never given to
/// another quota.
///
/// The process keeps a tag's quota (a few hundred bytes) while a layer built with it serves
/// (its limits' and plans' quotas, and its per-key overrides' quotas while each override is
/// set), and otherwise while it is among the [`KEPT_QUOTAS`] quotas most recently compiled
/// (`PlanQuota::new`, of a new quota or of one already kept) or released by a layer, so that
/// keys written under a quota a reload replaced are converted from it when next seen. Memory
/// is thus bounded by the quotas in force plus `KEPT_QUOTAS`, however many reloads. A key
/// whose state was written under a quota no longer kept is counted as having spent its whole
/// budget at the moment it is next checked, under the quota it is checked at: never a fresh
/// budget (if it is never checked again, its slot may be reused once the state looks refilled
/// under the limit's own quota).
///
/// Compiling takes a process-wide mutex only for a quota not compiled before; checks never
/// take it (stores read the tags from a snapshot, without a lock).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PlanQuota {
    pub(crate) compiled: CompiledAlgorithm,
    /// This quota's tag: never 0, which a store keeps for its limit's own quota. Equal quotas
    /// compiled while it is kept share a tag.
    pub(crate) tag: u32,
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
        let tag = registry::tag(algorithm, quota, compiled)?;
        Ok(Self { compiled, tag })
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

    /// Keeps this quota's tag while the pin lives (see [`PlanQuota`]): a layer pins the quotas
    /// it serves (limits', plans' and per-key overrides').
    pub(crate) fn pin(&self) -> QuotaPin {
        registry::pin(self.tag, (self.algorithm(), *self.quota()), self.compiled)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_quotas_share_a_tag_and_the_registry_names_them() {
        let q = Quota::per_minute(7_919);
        let a = PlanQuota::new(AlgorithmKind::Gcra, q).unwrap();
        let b = PlanQuota::new(AlgorithmKind::Gcra, q).unwrap();
        let c = PlanQuota::new(AlgorithmKind::TokenBucket, q).unwrap();
        let d = PlanQuota::new(AlgorithmKind::Gcra, q.burst(2)).unwrap();
        assert_eq!(a.tag, b.tag);
        assert_ne!(a.tag, 0);
        assert_ne!(a.tag, c.tag);
        assert_ne!(a.tag, d.tag);
        assert_eq!(compiled(a.tag), Some(a.compiled));
        assert_eq!(compiled(c.tag), Some(c.compiled));
        assert_eq!(compiled(0), None);
        assert_eq!(compiled(u32::MAX), None);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
