//! What the layer reports about its decisions: metrics (feature `metrics`) and traces.

use crate::decision::{Decision, PolicyName};
use crate::error::StoreError;

/// How a decision ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allowed,
    Rejected,
    ShadowRejected,
}

/// Records one limit's decision for a request.
#[inline]
pub(crate) fn decision(
    limit: PolicyName,
    plan: Option<PolicyName>,
    verdict: Verdict,
    d: &Decision,
) {
    let _ = (limit, plan, verdict, d);
}

/// Records a store failure.
#[inline]
pub(crate) fn store_error(error: &StoreError) {
    let _ = error;
}
