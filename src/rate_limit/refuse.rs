//! Refusals: the response for a request a step refuses (a missing key, a blocked key, a store
//! that failed, a limit that said no).

use std::time::Duration;

use http::{Request, Response};

use super::applied::Applied;
use super::limit::CompiledLimit;
use super::outcome::Outcome;
use super::shared::Shared;
use super::snapshot::Snapshot;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::headers::set_retry_after_if_absent;
use crate::key::{report_misconfiguration, Consequence, KeyError};
use crate::metrics;
use crate::request::RequestView;
use crate::response::{RejectReason, Rejected, RejectionBody};
use crate::store::{Decisions, Store};

/// Refuses with the layer's rejection for `reason`.
pub(super) fn refuse<St>(
    shared: &Shared<St>,
    view: RequestView<'_>,
    reason: RejectReason<'_>,
) -> Response<RejectionBody> {
    let decisions = Decisions::new();
    let rejected = Rejected::new(view, reason, &decisions);
    shared.rejection.reject(&rejected)
}

/// `limit` found no key in the request: the refusal its [`MissingKey`](super::MissingKey)
/// setting asks for, or `None` to skip the limit.
#[cold]
#[inline(never)]
pub(super) fn missing_key<St>(
    shared: &Shared<St>,
    limit: &CompiledLimit,
    view: RequestView<'_>,
    error: &KeyError,
) -> Option<Response<RejectionBody>> {
    let misconfigured = |consequence| {
        report_misconfiguration("rate limit", limit.name.as_str(), error, consequence);
    };
    match limit.on_missing_key.status_for(error) {
        None => {
            if error.is_misconfiguration() {
                misconfigured(Consequence::Skipped);
            } else {
                tracing::trace!(policy = %limit.name, reason = %error, "no rate-limit key; limit skipped");
            }
            None
        }
        Some(status) if limit.mode.is_shadow() => {
            if error.is_misconfiguration() {
                misconfigured(Consequence::Skipped);
            }
            tracing::debug!(policy = %limit.name, reason = %error, %status, "no rate-limit key; a shadow limit would have refused the request");
            None
        }
        Some(status) => {
            if error.is_misconfiguration() {
                misconfigured(Consequence::Refused);
            } else {
                tracing::debug!(policy = %limit.name, reason = %error, %status, "no rate-limit key; request refused");
            }
            let reason = RejectReason::MissingKey {
                policy: limit.name,
                error,
                status,
            };
            Some(refuse(shared, view, reason))
        }
    }
}

/// The key is blocked by an override: the refusal, or `None` for a shadow limit (skipped).
#[cold]
#[inline(never)]
pub(super) fn blocked<St>(
    shared: &Shared<St>,
    limit: &CompiledLimit,
    view: RequestView<'_>,
) -> Option<Response<RejectionBody>> {
    if limit.mode.is_shadow() {
        tracing::debug!(policy = %limit.name, "key blocked by an override; a shadow limit would have refused the request");
        return None;
    }
    tracing::debug!(policy = %limit.name, "key blocked by an override; request refused");
    Some(refuse(
        shared,
        view,
        RejectReason::Blocked { policy: limit.name },
    ))
}

/// The store failed (or answered nonsense): refuses, as the layer's rejection says.
#[cold]
#[inline(never)]
pub(super) fn refuse_on_error<ReqBody, St: Store>(
    shared: &Shared<St>,
    snapshot: &Snapshot<St>,
    req: &Request<ReqBody>,
    applied: &Applied,
    error: StoreError,
) -> Response<RejectionBody> {
    let empty = Decisions::new();
    let view = RequestView::new(req);
    if let Some(i) = applied.too_costly {
        // Refused whatever the store says; without its numbers, report capacity only.
        let i = usize::from(i);
        let limit = &snapshot.limits[usize::from(applied.limit[i])];
        let quota = applied.quota_of(snapshot, i);
        let decision =
            Decision::impossible(quota.burst_size(), 0, Duration::ZERO).with_policy(limit.name);
        let rejected = Rejected::new(
            view,
            RejectReason::CostExceedsCapacity {
                decision: &decision,
                quota,
                cost: applied.cost[i],
            },
            &empty,
        );
        tracing::debug!(policy = %limit.name, cost = applied.cost[i], capacity = quota.burst_size(), "request costs more than the limit holds");
        return shared.rejection.reject(&rejected);
    }
    tracing::warn!(error = %error, "request refused: the limit fails closed");
    let rejected = Rejected::new(
        view,
        RejectReason::StoreUnavailable { error: &error },
        &empty,
    );
    let mut response = shared.rejection.reject(&rejected);
    if let Some(secs) = rejected.retry_after_secs() {
        set_retry_after_if_absent(response.headers_mut(), secs);
    }
    response
}

/// Refuses because of decision `i` (a cost above capacity, or the store's first rejection).
#[cold]
#[inline(never)]
pub(super) fn refuse_by<ReqBody, St: Store>(
    shared: &Shared<St>,
    snapshot: &Snapshot<St>,
    req: &Request<ReqBody>,
    applied: &Applied,
    mut decisions: Decisions,
    i: usize,
) -> Response<RejectionBody> {
    if applied.too_costly.is_some() {
        let d = decisions.as_slice()[i];
        decisions.as_mut_slice()[i] =
            Decision::impossible(d.limit(), d.remaining(), d.reset()).with_policy(d.policy());
    }
    let decision = decisions.as_slice()[i];
    let limit = &snapshot.limits[usize::from(applied.limit[i])];
    let quota = applied.quota_of(snapshot, i);
    let plan = applied.plan(snapshot, i);
    let plan_name = plan.map_or("", |p| p.name.as_str());
    let view = RequestView::new(req);
    let reason = if decision.is_impossible() {
        tracing::debug!(policy = %limit.name, plan = plan_name, cost = applied.cost[i], capacity = quota.burst_size(), "request costs more than the limit holds");
        RejectReason::CostExceedsCapacity {
            decision: &decision,
            quota,
            cost: applied.cost[i],
        }
    } else {
        // Only the refusing limit counts: the others charged nothing.
        metrics::record_decision(&decision, false, shared.near_limit);
        tracing::debug!(
            policy = %limit.name,
            plan = plan_name,
            remaining = decision.remaining(),
            retry_after_ms = decision.retry_after().map_or(0, |d| d.as_millis() as u64),
            "request rate limited"
        );
        RejectReason::RateLimited {
            decision: &decision,
            quota,
        }
    };
    let mut rejected = Rejected::new(view, reason, &decisions);
    if let Some(plan) = plan {
        rejected = rejected.with_plan(plan.name, plan.link.as_deref());
    }
    let mut response = shared.rejection.reject(&rejected);
    if let Some(secs) = rejected.retry_after_secs() {
        set_retry_after_if_absent(response.headers_mut(), secs);
    }
    Outcome::new(shared, snapshot, applied, &decisions, decision)
        .refusal(req)
        .apply(&mut response);
    response
}
