//! What a store is told about limits: [`LimitSpec`] (one limit, when the store is built),
//! [`FailurePolicy`] (what a limit does when its store cannot decide) and [`LimitCheck`] (one
//! limit to check for one request).

use std::time::Duration;

use super::PlanQuota;
use crate::algorithm::AlgorithmKind;
use crate::decision::Name;
use crate::error::ConfigError;
use crate::key::Key;
use crate::quota::Quota;

/// What a backend needs to know about one limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitSpec {
    name: Name,
    quota: Quota,
    algorithm: AlgorithmKind,
    on_store_error: Option<FailurePolicy>,
}

impl LimitSpec {
    /// A limit named `name` enforcing `quota` with `algorithm`.
    pub fn new(name: Name, quota: Quota, algorithm: AlgorithmKind) -> Self {
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
    pub fn name(&self) -> Name {
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
    /// Index of the limit in the slice given to [`Backend::build`](super::Backend::build).
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
    /// [`Backend::build`](super::Backend::build)) at the limit's own quota, spending `cost`.
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
