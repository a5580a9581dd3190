//! The decision steps of a request, in order: skip predicate, keys, plan or override, cost, one
//! store check for the enforcing limits ([`begin`]), then the answer turned into a refusal or
//! an [`Outcome`] ([`finish`]), the shadow limits' check ([`shadow_step`]) and, for a shaped
//! request, its turn. [`RateLimit::call`](super::RateLimit) runs them, and the
//! [`ResponseFuture`](super::ResponseFuture) runs the rest when the store answers later.

use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};

use super::applied::{Applied, OwnedCheck, QuotaChoice, MAX_LOOKUPS};
use super::follow_up::{self, Followup, ShadowStatus};
use super::limit::overrides::Active;
use super::limit::CompiledLimit;
use super::outcome::{merge_extensions, Outcome};
use super::refuse::{blocked, missing_key, refuse, refuse_by, refuse_on_error};
use super::shaping::{self, ShapedDelay};
use super::shared::Shared;
use super::snapshot::Snapshot;
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::key::Key;
use crate::metrics;
use crate::plan::{Resolution, UnknownPlan};
use crate::request::RequestView;
use crate::response::{RejectReason, RejectionBody};
use crate::store::{Checked, Decisions, LimitCheck, PlanQuota, Store, MAX_LIMITS};

/// The first step of a request, done in `call`. The request stays with the caller (it is
/// moved once, to the inner service or the future, not through every step).
// Large variants by design: boxing the decisions would allocate on every request, and these
// values only live on the stack between the store check and the future.
#[allow(clippy::large_enum_variant)]
pub(super) enum Begin<St: Store> {
    /// Call the inner service (with an outcome to report, unless no limit applied).
    Proceed(Option<Outcome>, Option<Followup<St>>),
    /// Answer with this response without calling the inner service.
    Reject(Response<RejectionBody>),
    /// Wait for the store.
    Pending(St::Future, Applied, Arc<Snapshot<St>>, Option<Followup<St>>),
    /// Wait for the shadow limits' check, then call the inner service.
    Shadow(St::Future, Option<Outcome>, Followup<St>),
    /// Wait for the shadow limits' check started with the enforcing one (in the followup),
    /// then call the inner service.
    ShadowStarted(Option<Outcome>, Followup<St>),
    /// Wait for a plan lookup, then begin again (the lookups so far).
    Resolve(Pin<Box<dyn Future<Output = ()> + Send>>, u8),
}

/// The result of a store check.
#[allow(clippy::large_enum_variant)]
enum Finish {
    Proceed(Outcome),
    Reject(Response<RejectionBody>),
}

/// Skip predicate, key, plan and cost extraction, and the store check. `lookups`: how many plan
/// lookups already ran for this request (after [`MAX_LOOKUPS`], the plan is unknown).
///
/// One set of steps, [`begin_with`], compiled for the layer's shape: the on-stack check buffer
/// sized to the layer (one limit is the common case and two, a burst and a quota or a route and
/// a ceiling, the next; building and dropping eight `LimitCheck`s for them costs more than the
/// check itself), and, for one [plain](CompiledLimit::is_plain) limit, without the branches a
/// plain limit never takes.
#[inline(always)]
pub(super) fn begin<ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    req: &mut Request<ReqBody>,
    lookups: u8,
) -> Begin<St> {
    let snapshot = shared.current.load();
    match &*snapshot.limits {
        [limit] if limit.is_plain() => begin_with::<1, true, _, _>(shared, &snapshot, req, lookups),
        [_] => begin_with::<1, false, _, _>(shared, &snapshot, req, lookups),
        [_, _] => begin_with::<2, false, _, _>(shared, &snapshot, req, lookups),
        _ => begin_with::<MAX_LIMITS, false, _, _>(shared, &snapshot, req, lookups),
    }
}

/// [`begin`] with room for `N` checks (`N >= snapshot.limits.len()`). `PLAIN`: every limit is
/// [plain](CompiledLimit::is_plain), so the branches for `when`, plans, shadow mode, charge by
/// outcome and shaping are left out (they would not be taken: the same steps, less code).
///
/// What an allowed request does is kept here; what it rarely needs (a missing key, an
/// override, a plan, work after the response) is in functions of their own, out of line, so
/// the code every request runs stays compact.
fn begin_with<const N: usize, const PLAIN: bool, ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    snapshot: &Arc<Snapshot<St>>,
    req: &mut Request<ReqBody>,
    lookups: u8,
) -> Begin<St> {
    debug_assert!(snapshot.limits.len() <= N);
    debug_assert!(!PLAIN || snapshot.limits.iter().all(CompiledLimit::is_plain));
    let view = RequestView::new(req);
    if let Some(skip) = &shared.skip
        && skip(&view)
    {
        return Begin::Proceed(None, None);
    }
    let mut checks: [LimitCheck<'_>; N] =
        std::array::from_fn(|_| LimitCheck::new(0, Key::global(), 0));
    // Quotas of per-key overrides, lent to the checks.
    let mut overridden: [Option<PlanQuota>; N] = [None; N];
    let mut keys: [Option<Key<'_>>; N] = std::array::from_fn(|_| None);
    let mut applied = Applied::new();
    let mut followup: Option<Followup<St>> = None;
    // A request of a layer that shapes, refused or dropped before its turn, gives every charge
    // back: each check is kept.
    let shaping = !PLAIN && snapshot.limits.iter().any(|l| l.shape.is_some());
    let mut n = 0;
    for (i, limit) in snapshot.limits.iter().enumerate() {
        if let (false, Some(when)) = (PLAIN, &limit.when)
            && !when(&view)
        {
            continue;
        }
        let key = match limit.key.extract(&view) {
            Ok(key) => key,
            Err(error) => match missing_key(shared, limit, view, &error) {
                None => continue,
                Some(response) => return Begin::Reject(response),
            },
        };
        // Per-key overrides first (they outrank plans), then the plan.
        let mut plan = QuotaChoice::Own;
        match shared.overrides.get(limit.name, &key) {
            None if PLAIN || limit.resolver.is_none() => {}
            None => match plan_of(shared, limit, view, &key, lookups) {
                PlanStep::Quota(p) => plan = p,
                PlanStep::Skip => continue,
                PlanStep::Reject(response) => return Begin::Reject(response),
                PlanStep::Lookup(lookup) => {
                    drop((key, keys, checks));
                    return Begin::Resolve(lookup, lookups + 1);
                }
            },
            Some(Active::Quota(q)) => {
                overridden[n] = Some(q);
                plan = QuotaChoice::Overridden;
            }
            Some(Active::Exempt) => continue,
            Some(Active::Block) => match blocked(shared, limit, view) {
                None => continue,
                Some(response) => return Begin::Reject(response),
            },
        }
        let cost = limit.cost(&view);
        let capacity = match plan {
            QuotaChoice::Own => limit.capacity,
            QuotaChoice::Overridden => overridden[n].map_or(limit.capacity, |q| q.capacity()),
            QuotaChoice::Plan(p) => limit.plans[usize::from(p)].quota.capacity(),
        };
        if !PLAIN && (limit.mode.is_shadow() || limit.charge.by_outcome() || shaping) {
            let quota = match plan {
                QuotaChoice::Own if limit.explicit_quota => Some(limit.base),
                QuotaChoice::Own => None,
                QuotaChoice::Overridden => overridden[n],
                QuotaChoice::Plan(p) => Some(limit.plans[usize::from(p)].quota),
            };
            let check = OwnedCheck {
                limit: i,
                key: key.clone().into_owned(),
                // A shadow check above its capacity is decided (impossible: a would-be
                // refusal) and charges nothing; an enforcing one refuses the request first.
                cost,
                quota,
                plan: plan
                    .plan_index()
                    .and_then(|p| limit.plans.get(p))
                    .map(|p| p.name),
            };
            let shaped = limit.shape.is_some() && plan == QuotaChoice::Own;
            if follow_up::keep(
                shared,
                snapshot,
                &mut followup,
                limit,
                check,
                shaped,
                shaping,
            ) {
                // A shadow limit: decided in a store call of its own, for a request the
                // enforcing limits allow.
                continue;
            }
        }
        if cost > capacity && applied.too_costly.is_none() {
            applied.too_costly = Some(n as u8);
        }
        if let (QuotaChoice::Overridden, None, Some(q)) =
            (plan, applied.override_quota, overridden[n])
        {
            applied.override_quota = Some(*q.quota());
        }
        applied.limit[n] = i as u8;
        applied.cost[n] = cost;
        applied.quota[n] = plan;
        keys[n] = Some(key);
        n += 1;
    }
    applied.len = n as u8;
    if n == 0 {
        drop((keys, checks));
        return match followup {
            Some(mut f) if !f.shadow.is_empty() => {
                // Only shadow limits decide: nested in another layer, the response carries
                // their decision for it to merge, as an enforcing one's would.
                f.response_extensions |= req.extensions().get::<Decision>().is_some();
                shadow_step(None, f)
            }
            f => Begin::Proceed(None, f),
        };
    }
    for (j, key) in keys.iter_mut().enumerate().take(n) {
        let i = usize::from(applied.limit[j]);
        let limit = &snapshot.limits[i];
        let check = LimitCheck::new(i, key.take().unwrap_or_else(Key::global), applied.cost[j]);
        checks[j] = match applied.quota[j] {
            QuotaChoice::Own if limit.explicit_quota => check.with_quota(&limit.base),
            QuotaChoice::Own => check,
            QuotaChoice::Overridden => match &overridden[j] {
                Some(q) => check.with_quota(q),
                None => check,
            },
            QuotaChoice::Plan(p) => check.with_quota(&limit.plans[usize::from(p)].quota),
        };
    }
    if applied.too_costly.is_some() {
        // The request can never pass: charge nothing, only read the limits for the headers.
        for check in &mut checks[..n] {
            check.cost = 0;
        }
    } else if let Some(f) = followup.as_mut() {
        // Shaping: the store may give this request a place at the end of its schedule.
        f.deciding = shared.waiting.deciding(&f.shaped);
    }
    let checked = snapshot.store.check(&checks[..n]);
    drop((keys, checks));
    match checked {
        Checked::Ready(result) => answered(shared, snapshot, req, &applied, result, followup),
        Checked::Pending(future) => {
            if let Some(f) = followup.as_mut() {
                f.start_shadow();
            }
            Begin::Pending(future, applied, Arc::clone(snapshot), followup)
        }
    }
}

/// The store answered the enforcing check: refuse, or check the shadow limits, or proceed.
pub(super) fn answered<ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    snapshot: &Snapshot<St>,
    req: &mut Request<ReqBody>,
    applied: &Applied,
    result: Result<Decisions, StoreError>,
    mut followup: Option<Followup<St>>,
) -> Begin<St> {
    match finish(shared, snapshot, req, applied, result, followup.as_mut()) {
        Finish::Proceed(outcome) => match followup {
            Some(f) if !f.shadow.is_empty() => shadow_step(Some(outcome), f),
            f => Begin::Proceed(Some(outcome), f),
        },
        Finish::Reject(response) => {
            if let Some(f) = followup {
                f.abandon_shadow();
            }
            Begin::Reject(response)
        }
    }
}

/// Checks the shadow limits of a request the enforcing limits allowed (see
/// [`Followup::check_shadow`]), or waits for them.
pub(super) fn shadow_step<St: Store>(
    mut outcome: Option<Outcome>,
    mut followup: Followup<St>,
) -> Begin<St> {
    match followup.check_shadow(&mut outcome) {
        ShadowStatus::Recorded => Begin::Proceed(outcome, Some(followup)),
        ShadowStatus::Started => Begin::ShadowStarted(outcome, followup),
        ShadowStatus::Pending(future) => Begin::Shadow(future, outcome, followup),
    }
}

/// What a limit with plans does next.
enum PlanStep {
    /// Decide at this quota (a plan, or the limit's own).
    Quota(QuotaChoice),
    /// A shadow limit that would refuse: skip it.
    Skip,
    /// Refuse the request (an unknown plan).
    Reject(Response<RejectionBody>),
    /// Wait for this lookup, then begin again.
    Lookup(Pin<Box<dyn Future<Output = ()> + Send>>),
}

/// The plan `limit` decides `key` at (its resolver's answer).
#[inline(never)]
fn plan_of<St>(
    shared: &Shared<St>,
    limit: &CompiledLimit,
    view: RequestView<'_>,
    key: &Key<'_>,
    lookups: u8,
) -> PlanStep {
    let Some(resolver) = &limit.resolver else {
        return PlanStep::Quota(QuotaChoice::Own);
    };
    let resolution = match resolver.resolve(&view, key) {
        Resolution::Lookup(lookup) if lookups < MAX_LOOKUPS => return PlanStep::Lookup(lookup),
        Resolution::Lookup(_) => Resolution::Unknown,
        other => other,
    };
    let known = match resolution {
        Resolution::Plan(name) => limit.plans.iter().position(|p| p.name == name),
        Resolution::Default => None,
        _ => None,
    };
    match (known, resolution) {
        (Some(p), _) => PlanStep::Quota(QuotaChoice::Plan(p as u8)),
        (None, Resolution::Default) => PlanStep::Quota(QuotaChoice::Own),
        (None, _) => match limit.on_unknown_plan {
            UnknownPlan::Reject { status } if limit.mode.is_shadow() => {
                tracing::debug!(policy = %limit.name, %status, "no plan for this request; a shadow limit would have refused it");
                PlanStep::Skip
            }
            UnknownPlan::Reject { status } => {
                tracing::debug!(policy = %limit.name, %status, "no plan for this request; refused");
                PlanStep::Reject(refuse(
                    shared,
                    view,
                    RejectReason::UnknownPlan {
                        policy: limit.name,
                        status,
                    },
                ))
            }
            _ => PlanStep::Quota(QuotaChoice::Own),
        },
    }
}

/// Turns the store's answer into a rejection, or a request ready for the inner service.
///
/// The allowed path is kept short; refusals, store errors and shaping live in functions of
/// their own, out of line, so that the code an allowed request runs stays compact (it shares
/// the instruction cache with the application's).
fn finish<ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    snapshot: &Snapshot<St>,
    req: &mut Request<ReqBody>,
    applied: &Applied,
    result: Result<Decisions, StoreError>,
    followup: Option<&mut Followup<St>>,
) -> Finish {
    let mut decisions = match result {
        Ok(decisions) if decisions.len() == usize::from(applied.len) => decisions,
        Ok(decisions) => {
            let error = StoreError::new(
                StoreErrorKind::InvalidResponse,
                format!(
                    "store returned {} decisions for {} checks",
                    decisions.len(),
                    applied.len
                ),
            );
            return Finish::Reject(refuse_on_error(shared, snapshot, req, applied, error));
        }
        Err(error) => {
            return Finish::Reject(refuse_on_error(shared, snapshot, req, applied, error))
        }
    };
    // Attribute every decision to its limit and plan, whatever the store did.
    // Shaping: the longest wait among the shaped limits, and which check it is.
    let mut shaped = (Duration::ZERO, 0);
    for (j, (d, (limit, _))) in decisions
        .as_mut_slice()
        .iter_mut()
        .zip(applied.checks())
        .enumerate()
    {
        if let (Some(shape), QuotaChoice::Own) = (&snapshot.limits[limit].shape, applied.quota[j]) {
            let (own, wait) = shape.unwiden(*d);
            *d = own;
            // A request that spends nothing (cost 0) never waits.
            if wait > shaped.0 && applied.cost[j] > 0 {
                shaped = (wait, j);
            }
        }
        *d = d.with_policy(snapshot.limits[limit].name);
        if let Some(plan) = applied.plan(snapshot, j) {
            *d = d.with_plan(plan.name);
        }
    }

    // Which decision refuses the request, if any: a cost above capacity first, then the
    // store's first rejection.
    let refusal = match applied.too_costly {
        Some(i) => Some(usize::from(i)),
        None => decisions.as_slice().iter().position(|d| !d.allowed()),
    };
    if let Some(i) = refusal {
        return Finish::Reject(refuse_by(shared, snapshot, req, applied, decisions, i));
    }

    // There is at least one decision, so `reported` is `Some`. The tightest decision the
    // store counted is reported; one it did not count (failure policy `Open`) only when no
    // other was counted, and then no header shows it.
    let reported = decisions
        .as_slice()
        .iter()
        .filter(|d| d.is_counted())
        .reduce(|best, d| if d.is_tighter_than(best) { d } else { best })
        .or_else(|| decisions.reported())
        .copied()
        .unwrap_or_else(|| Decision::allowed_with(0, 0, Duration::ZERO));
    for d in decisions.as_slice() {
        metrics::record_decision(d, false, shared.near_limit);
    }
    let mut outcome = Outcome::new(shared, snapshot, applied, &decisions, reported);
    if let Some(f) = followup {
        f.reserved_at = decisions.decided_at();
        // Shaping: a request that must wait takes a place among the waiting ones; one that
        // need not wait was given no place.
        if shaped.0.is_zero() {
            f.deciding = None;
        } else {
            if let Err(mut response) = take_turn(
                shared,
                snapshot,
                req,
                applied,
                &decisions,
                shaped,
                f,
                &mut outcome,
            ) {
                outcome.refusal(req).apply(&mut response);
                return Finish::Reject(response);
            }
        }
    }
    let several = snapshot.limits.len() > 1;
    if merge_extensions(req.extensions_mut(), &decisions, &reported, several) {
        outcome.extension = true;
    }
    Finish::Proceed(outcome)
}

/// Shaping: reserves the request's turn for the `shaped` wait, or gives the response refusing
/// it (the caller writes the outcome on it).
#[inline(never)]
#[allow(clippy::too_many_arguments, clippy::result_large_err)]
fn take_turn<ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    snapshot: &Snapshot<St>,
    req: &mut Request<ReqBody>,
    applied: &Applied,
    decisions: &Decisions,
    (wait, j): (Duration, usize),
    f: &mut Followup<St>,
    outcome: &mut Outcome,
) -> Result<(), Response<RejectionBody>> {
    let decision = decisions.as_slice()[j];
    let quota = applied.quota_of(snapshot, j);
    // Each shaped limit's own wait: the request's place in that limit's schedule.
    let waits: Vec<(usize, Duration)> = decisions
        .as_slice()
        .iter()
        .zip(applied.checks())
        .enumerate()
        .filter_map(|(k, (d, (limit, _)))| {
            let shape = snapshot.limits[limit].shape.as_ref()?;
            (applied.quota[k] == QuotaChoice::Own && d.is_counted()).then(|| (limit, shape.wait(d)))
        })
        .collect();
    let checks = (mem::take(&mut f.shaped), mem::take(&mut f.unshaped));
    let deciding = f.deciding.take();
    let reservation = shaping::reserve(
        &shared.waiting,
        &*shared.rejection,
        &f.snapshot,
        req,
        checks,
        (f.reserved_at, deciding),
        (wait, &waits),
        (&decision, quota),
        decisions,
    )?;
    outcome.shaped = Some(ShapedDelay::new(reservation.delay()));
    f.reservation = Some(reservation);
    Ok(())
}
