//! [`PlanQuota`]: a quota compiled for one algorithm, chosen per request.

use std::collections::HashMap;
use std::fmt;
use std::sync::LazyLock;

use parking_lot::RwLock;

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
///
/// A key keeps what it spent when the quota it is checked at changes: the store converts its
/// state with [`Algorithm::rebase`] (see each algorithm's **Plan changes**). To know which
/// quota a state was written under, every distinct quota (algorithm and [`Quota`]) gets a
/// small number, its *tag*, when it is first compiled; stores keep the tag beside the key's
/// state. The tags live for the life of the process (a few dozen bytes per distinct quota).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PlanQuota {
    pub(crate) compiled: CompiledAlgorithm,
    /// This quota's tag in the process-wide registry: never 0, which a store keeps for its
    /// limit's own quota. Equal quotas have equal tags.
    pub(crate) tag: u32,
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
        let tag = intern(algorithm, quota, compiled)?;
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

/// Every distinct quota compiled so far, by tag (see [`PlanQuota`]): the algorithm a store
/// rebases a key's state from when the key is checked at another quota.
struct Registry {
    /// Tag `i + 1` names `by_tag[i]`.
    by_tag: Vec<CompiledAlgorithm>,
    tags: HashMap<(AlgorithmKind, Quota), u32>,
}

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(|| {
    RwLock::new(Registry {
        by_tag: Vec::new(),
        tags: HashMap::new(),
    })
});

/// The tag of `quota` enforced by `algorithm` (compiled as `compiled`), registering it if new.
fn intern(
    algorithm: AlgorithmKind,
    quota: Quota,
    compiled: CompiledAlgorithm,
) -> Result<u32, ConfigError> {
    if let Some(&tag) = REGISTRY.read().tags.get(&(algorithm, quota)) {
        return Ok(tag);
    }
    let mut registry = REGISTRY.write();
    let next = registry.by_tag.len() + 1;
    let Ok(next) = u32::try_from(next) else {
        return Err(ConfigError::new(
            "quota",
            "more than 4,294,967,295 distinct plan quotas in one process; reuse PlanQuota values \
             (equal quotas share one) instead of compiling a new quota per key",
        ));
    };
    let Registry { by_tag, tags } = &mut *registry;
    Ok(*tags.entry((algorithm, quota)).or_insert_with(|| {
        by_tag.push(compiled);
        next
    }))
}

/// The algorithm tag `tag` (not 0) names, if some [`PlanQuota`] has it.
pub(crate) fn compiled(tag: u32) -> Option<CompiledAlgorithm> {
    let index = usize::try_from(tag).ok()?.checked_sub(1)?;
    REGISTRY.read().by_tag.get(index).copied()
}

/// An algorithm that a [`PlanQuota`] can hold: lets a store's table, typed by its algorithm,
/// take the same type out of a plan.
pub(crate) trait Compiled:
    Algorithm<State: crate::store::memory::slot::SlotState> + Copy + PartialEq
{
    /// The kind, for error messages.
    const KIND: AlgorithmKind;

    /// This algorithm, if `compiled` is one of this type.
    fn from_compiled(compiled: &CompiledAlgorithm) -> Option<&Self>;
}

macro_rules! compiled {
    ($($t:ident),*) => {$(
        impl Compiled for $t {
            const KIND: AlgorithmKind = AlgorithmKind::$t;

            #[inline]
            fn from_compiled(compiled: &CompiledAlgorithm) -> Option<&Self> {
                match compiled {
                    CompiledAlgorithm::$t(a) => Some(a),
                    _ => None,
                }
            }
        }
    )*};
}

compiled!(
    TokenBucket,
    Gcra,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    LeakyBucket
);

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
        assert!(Gcra::from_compiled(&a.compiled).is_some());
        assert!(TokenBucket::from_compiled(&a.compiled).is_none());
    }
}
