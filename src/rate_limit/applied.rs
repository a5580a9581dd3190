//! What a request was checked against: [`Applied`] (the checks of the enforcing call, on the
//! stack) and [`OwnedCheck`] (a check kept for work after it: shadow limits, refunds, shaping).

use crate::decision::Name;
use crate::key::Key;
use crate::quota::Quota;
use crate::store::{LimitCheck, PlanQuota, MAX_LIMITS};

use super::limit::CompiledPlan;
use super::snapshot::Snapshot;

/// Which limits were checked for a request, at what cost and quota, in check order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Applied {
    /// Each check's limit (an index into the snapshot's limits).
    pub(super) limit: [u8; MAX_LIMITS],
    pub(super) cost: [u64; MAX_LIMITS],
    /// The quota each check is decided at.
    pub(super) quota: [QuotaChoice; MAX_LIMITS],
    pub(super) len: u8,
    /// The first check whose cost exceeds its quota's capacity (all costs were zeroed: a peek).
    pub(super) too_costly: Option<u8>,
    /// The quota of the first check decided at a per-key override (for rejection bodies).
    pub(super) override_quota: Option<Quota>,
}

/// Which quota a check is decided at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QuotaChoice {
    /// The limit's own quota.
    Own,
    /// A per-key override's quota.
    Overridden,
    /// One of the limit's plans (an index into them).
    Plan(u8),
}

impl QuotaChoice {
    /// The plan's index, if the choice is a plan.
    pub(super) fn plan_index(self) -> Option<usize> {
        match self {
            QuotaChoice::Plan(p) => Some(usize::from(p)),
            QuotaChoice::Own | QuotaChoice::Overridden => None,
        }
    }
}

/// Plan lookups one request may wait for (a lookup another request led may be abandoned when
/// that request is dropped, and is then led again); after them the plan is unknown.
pub(super) const MAX_LOOKUPS: u8 = 3 * MAX_LIMITS as u8;

impl Applied {
    pub(super) fn new() -> Self {
        Self {
            limit: [0; MAX_LIMITS],
            cost: [0; MAX_LIMITS],
            quota: [QuotaChoice::Own; MAX_LIMITS],
            len: 0,
            too_costly: None,
            override_quota: None,
        }
    }

    pub(super) fn checks(&self) -> impl Iterator<Item = (usize, u64)> + Clone + '_ {
        (0..usize::from(self.len)).map(|i| (usize::from(self.limit[i]), self.cost[i]))
    }

    /// The quota check `i` was decided at.
    pub(super) fn quota_of<'s, St>(&'s self, snapshot: &'s Snapshot<St>, i: usize) -> &'s Quota {
        let limit = &snapshot.limits[usize::from(self.limit[i])];
        match self.quota[i] {
            QuotaChoice::Own => &limit.quota,
            QuotaChoice::Overridden => self.override_quota.as_ref().unwrap_or(&limit.quota),
            QuotaChoice::Plan(p) => limit.plans[usize::from(p)].quota.quota(),
        }
    }

    /// The plan check `i` was decided at, if one.
    pub(super) fn plan<'s, St>(
        &self,
        snapshot: &'s Snapshot<St>,
        i: usize,
    ) -> Option<&'s CompiledPlan> {
        let limit = &snapshot.limits[usize::from(self.limit[i])];
        limit.plans.get(self.quota[i].plan_index()?)
    }

    /// Whether every check is at its limit's own quota.
    pub(super) fn at_own_quotas(&self) -> bool {
        self.quota[..usize::from(self.len)]
            .iter()
            .all(|&q| q == QuotaChoice::Own)
    }
}

/// A check that outlives the request: a shadow limit (decided in a store call of its own), or a
/// charge to give back when the response says so.
#[derive(Debug, Clone)]
pub(crate) struct OwnedCheck {
    pub(super) limit: usize,
    pub(super) key: Key<'static>,
    pub(super) cost: u64,
    pub(super) quota: Option<PlanQuota>,
    pub(super) plan: Option<Name>,
}

impl OwnedCheck {
    pub(crate) fn as_check(&self) -> LimitCheck<'_> {
        let check = LimitCheck::new(self.limit, self.key.clone(), self.cost);
        match &self.quota {
            Some(q) => check.with_quota(q),
            None => check,
        }
    }
}
