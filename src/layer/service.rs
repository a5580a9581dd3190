//! [`RateLimit`]: the service, and the per-request decision logic shared with its future.

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Extensions, HeaderValue, Request, Response};
use tower_service::Service;

use super::body::ResponseBody;
use super::future::ResponseFuture;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use super::layer::{RateLimitLayer, Shared, Snapshot};
use super::limit::{CompiledPlan, Limit};
use super::overrides::Active;
use super::shaping::{self, Deciding, Reservation, ShapedDelay};
use crate::decision::{Decision, PolicyName};
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::headers::{
    policy_field, ratelimit_field, set_retry_after_if_absent, RateLimitHeaders, RATELIMIT,
    RATELIMIT_POLICY,
};
use crate::key::Key;
use crate::metrics::{self, NearLimit};
use crate::plan::{Mode, Resolution, UnknownPlan};
use crate::quota::Quota;
use crate::request::RequestView;
use crate::response::{RejectReason, Rejected, RejectionBody};
use crate::store::memory::MemoryStore;
use crate::store::{Checked, Decisions, LimitCheck, PlanQuota, Store, MAX_LIMITS};

/// Rate-limits requests to the inner service `S`. Created by [`RateLimitLayer`]; see the
/// [module docs](crate::layer).
///
/// Allowed requests reach `S` with the reported [`Decision`] in their extensions, and all
/// [`Decisions`] too when the layer holds more than one limit or layers are nested (with a
/// single limit, the `Decision` is the only one); responses get rate-limit headers, and the
/// reported [`Decision`] in their extensions when
/// [`response_extensions`](crate::layer::RateLimitLayerBuilder::response_extensions) is on (for
/// logging or metrics middleware further out) or the layer is nested in another. Refused requests never reach `S`: they are
/// answered by the layer's [`Rejection`](crate::response::Rejection).
pub struct RateLimit<S, St = MemoryStore> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl RateLimit<(), MemoryStore> {
    /// A [`RateLimitLayer`] with one limit and every default (in-memory store): shorthand for
    /// [`RateLimitLayer::new`].
    pub fn layer(limit: Limit) -> Result<RateLimitLayer, ConfigError> {
        RateLimitLayer::new(limit)
    }
}

impl<S, St> RateLimit<S, St> {
    /// Wraps `inner` with the limits of `layer`.
    pub fn new(inner: S, layer: &RateLimitLayer<St>) -> Self {
        Self {
            inner,
            shared: Arc::clone(&layer.shared),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, St> Clone for RateLimit<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for RateLimit<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limits", &self.shared.current.load().limits)
            .finish_non_exhaustive()
    }
}

impl<S, St, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, St>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, St>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        match begin(&self.shared, &mut req, 0) {
            // shaping hook: a request that must wait for its turn waits in the future.
            Begin::Proceed(outcome, followup) if shaping_wait(&followup).is_some() => {
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                ResponseFuture::shaped(req, inner, Arc::clone(&self.shared), outcome, followup)
            }
            Begin::Proceed(outcome, followup) => {
                ResponseFuture::inner(self.inner.call(req), outcome, followup)
            }
            Begin::Reject(response) => ResponseFuture::rejected(response),
            begin => {
                // The store (or a plan lookup) answers later: keep the instance that was polled
                // ready for then, and leave a fresh clone in its place (it will be polled ready
                // before its own call).
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                ResponseFuture::waiting(begin, req, inner, Arc::clone(&self.shared))
            }
        }
    }
}

/// Which limits were checked for a request, at what cost and quota, in check order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Applied {
    limit: [u8; MAX_LIMITS],
    cost: [u64; MAX_LIMITS],
    /// Index into the limit's plans, or [`NO_PLAN`] / [`OVERRIDDEN`].
    plan: [u8; MAX_LIMITS],
    len: u8,
    /// The first check whose cost exceeds its quota's capacity (all costs were zeroed: a peek).
    too_costly: Option<u8>,
    /// The quota of the first check decided at a per-key override (for rejection bodies).
    override_quota: Option<Quota>,
}

/// Plan lookups one request may wait for (a lookup another request led may be abandoned when
/// that request is dropped, and is then led again); after them the plan is unknown.
const MAX_LOOKUPS: u8 = 3 * MAX_LIMITS as u8;

/// The check is decided at the limit's own quota.
const NO_PLAN: u8 = u8::MAX;
/// The check is decided at a per-key override's quota.
const OVERRIDDEN: u8 = u8::MAX - 1;

impl Applied {
    fn new() -> Self {
        Self {
            limit: [0; MAX_LIMITS],
            cost: [0; MAX_LIMITS],
            plan: [NO_PLAN; MAX_LIMITS],
            len: 0,
            too_costly: None,
            override_quota: None,
        }
    }

    fn checks(&self) -> impl Iterator<Item = (usize, u64)> + Clone + '_ {
        (0..usize::from(self.len)).map(|i| (usize::from(self.limit[i]), self.cost[i]))
    }

    /// The quota check `i` was decided at.
    fn quota<'s, St>(&'s self, snapshot: &'s Snapshot<St>, i: usize) -> &'s Quota {
        let limit = &snapshot.limits[usize::from(self.limit[i])];
        match self.plan[i] {
            NO_PLAN => &limit.quota,
            OVERRIDDEN => self.override_quota.as_ref().unwrap_or(&limit.quota),
            p => limit.plans[usize::from(p)].quota.quota(),
        }
    }

    /// The plan check `i` was decided at, if one.
    fn plan<'s, St>(&self, snapshot: &'s Snapshot<St>, i: usize) -> Option<&'s CompiledPlan> {
        let limit = &snapshot.limits[usize::from(self.limit[i])];
        limit.plans.get(usize::from(self.plan[i]))
    }

    /// Whether every check is at its limit's own quota.
    fn at_own_quotas(&self) -> bool {
        self.plan[..usize::from(self.len)]
            .iter()
            .all(|&p| p == NO_PLAN)
    }
}

/// A check that outlives the request: a shadow limit (decided in a store call of its own), or a
/// charge to give back when the response says so.
#[derive(Debug, Clone)]
pub(crate) struct OwnedCheck {
    pub(super) limit: usize,
    pub(super) key: Key<'static>,
    pub(super) cost: u64,
    quota: Option<PlanQuota>,
    plan: Option<PolicyName>,
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

/// Work after the enforcing check: shadow limits, and charges decided by the response. Boxed
/// (it is rare, and allocates anyway), so the request's future stays small.
pub(crate) struct Followup<St: Store>(Box<FollowupData<St>>);

impl<St: Store> std::ops::Deref for Followup<St> {
    type Target = FollowupData<St>;

    fn deref(&self) -> &FollowupData<St> {
        &self.0
    }
}

impl<St: Store> std::ops::DerefMut for Followup<St> {
    fn deref_mut(&mut self) -> &mut FollowupData<St> {
        &mut self.0
    }
}

/// What a [`Followup`] holds.
pub(crate) struct FollowupData<St: Store> {
    snapshot: Arc<Snapshot<St>>,
    shadow: Vec<OwnedCheck>,
    by_outcome: Vec<OwnedCheck>,
    reserved_at: Option<u64>,
    /// When the shadow limits were charged, if all of them allowed (they decide together).
    shadow_at: Option<u64>,
    near: NearLimit,
    headers: RateLimitHeaders,
    /// Whether a response shadow limits alone decided carries their decision (opted in, or
    /// the layer is nested in another).
    response_extensions: bool,
    /// Shaping: the checks of the shaped limits, and what a waiting request reserved.
    shaped: Vec<OwnedCheck>,
    /// Shaping: the request's other enforcing checks (kept in a layer with a shaped limit), given
    /// back with the shaped ones when the request never gets its turn.
    unshaped: Vec<OwnedCheck>,
    pub(crate) reservation: Option<Reservation>,
    /// Shaping: marks the request's schedule as being decided until the request has its place
    /// or is decided without one (see [`Deciding`]).
    deciding: Option<Deciding>,
    /// The shadow limits' check, started together with the enforcing one when that one waits
    /// for the store, so that a request waits for one store call, not two in a row.
    shadow_check: Option<ShadowCheck<St>>,
    /// Whether the enforcing limits allowed the request: from then on, the shadow limits keep
    /// their charge as the enforcing ones do, whatever becomes of the request.
    enforced: bool,
}

impl<St: Store> FollowupData<St> {
    /// Gives back what the shadow check started with the enforcing one charged, if it allowed
    /// (in the background when its answer is still to come).
    fn give_back_shadow(&mut self) {
        let Some(check) = self.shadow_check.take() else {
            return;
        };
        let snapshot = Arc::clone(&self.snapshot);
        let shadow = mem::take(&mut self.shadow);
        let give_back = move |result: Result<Decisions, StoreError>| {
            let Ok(decisions) = result else {
                return None;
            };
            let at = decisions.decided_at()?;
            if !decisions.allowed() {
                return None;
            }
            let checks: Vec<LimitCheck<'_>> = shadow.iter().map(OwnedCheck::as_check).collect();
            match snapshot.store.refund(&checks, at) {
                Checked::Ready(Err(error)) => {
                    tracing::warn!(error = %error, "rate-limit store could not give a shadow charge back");
                    None
                }
                Checked::Ready(Ok(_)) => None,
                Checked::Pending(future) => Some(future),
            }
        };
        match check {
            ShadowCheck::Done(result) => {
                if let Some(future) = give_back(result) {
                    spawn_refund(future);
                }
            }
            ShadowCheck::Pending(future) => {
                match tokio::runtime::Handle::try_current() {
                    Ok(handle) => {
                        handle.spawn(async move {
                        if let Some(refund) = give_back(future.await) {
                            if let Err(error) = refund.await {
                                tracing::warn!(error = %error, "rate-limit store could not give a shadow charge back");
                            }
                        }
                    });
                    }
                    Err(_) => {
                        tracing::debug!("no Tokio runtime to finish a refused request's shadow check on; dropped");
                    }
                }
            }
        }
    }
}

impl<St: Store> Drop for FollowupData<St> {
    /// A request dropped while its enforcing check was pending (its client went away) was
    /// never allowed: the shadow check started with it gives its charge back, as for a refusal.
    fn drop(&mut self) {
        if !self.enforced {
            self.give_back_shadow();
        }
    }
}

/// The shadow limits' check, started early.
// Held once per request that has shadow limits, inside its response future; boxing the decided
// variant would allocate for every such request to save bytes that are not copied.
#[allow(clippy::large_enum_variant)]
enum ShadowCheck<St: Store> {
    Pending(Pin<Box<St::Future>>),
    Done(Result<Decisions, StoreError>),
}

/// The reservation of a request that must wait for its turn (shaping), if any.
#[inline]
pub(crate) fn shaping_wait<St: Store>(followup: &Option<Followup<St>>) -> Option<&Reservation> {
    followup.as_ref().and_then(|f| f.reservation.as_ref())
}

impl<St: Store> Followup<St> {
    /// Whether no shadow limit waits to be checked.
    pub(crate) fn shadow_is_empty(&self) -> bool {
        self.shadow.is_empty()
    }

    /// Starts the shadow limits' check now, while the enforcing check is pending: both store
    /// calls then run at once, and the request waits for the slower of the two, which is
    /// bounded by one store timeout.
    fn start_shadow(&mut self) {
        if self.shadow.is_empty() || self.shadow_check.is_some() {
            return;
        }
        let checks: Vec<LimitCheck<'_>> = self.shadow.iter().map(OwnedCheck::as_check).collect();
        let checked = self.snapshot.store.check(&checks);
        drop(checks);
        self.shadow_check = Some(match checked {
            Checked::Ready(result) => ShadowCheck::Done(result),
            Checked::Pending(future) => ShadowCheck::Pending(Box::pin(future)),
        });
    }

    /// Drives the early shadow check; ready when it has answered (or was never started).
    pub(crate) fn poll_shadow(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(ShadowCheck::Pending(future)) = &mut self.shadow_check {
            let result = std::task::ready!(future.as_mut().poll(cx));
            self.shadow_check = Some(ShadowCheck::Done(result));
        }
        Poll::Ready(())
    }

    /// The enforcing limits refused the request: the shadow limits, checked at the same time,
    /// give back what they charged (they decide only requests the enforcing limits allow), in
    /// the background when their answer is still to come.
    pub(crate) fn abandon_shadow(mut self) {
        self.give_back_shadow();
    }

    /// Records the shadow decisions: counted, sampled in the log, and folded into the headers
    /// when the limit asks for them.
    fn record_shadow(
        &mut self,
        result: Result<Decisions, StoreError>,
        outcome: &mut Option<Outcome>,
    ) {
        let decisions = match result {
            Ok(decisions) => decisions,
            Err(error) => {
                tracing::warn!(error = %error, "rate-limit store failed on a shadow limit; ignored");
                return;
            }
        };
        if decisions.allowed() {
            self.shadow_at = decisions.decided_at();
        }
        let mut shown = Decisions::new();
        for (d, check) in decisions.as_slice().iter().zip(&self.shadow) {
            let limit = &self.snapshot.limits[check.limit];
            let plan = check.plan.unwrap_or(PolicyName::new(""));
            let plan = plan.as_str();
            let mut d = d.with_policy(limit.name);
            if let Some(p) = check.plan {
                d = d.with_plan(p);
            }
            metrics::record_decision(&d, true, self.near);
            if !d.allowed() {
                let n = limit.shadow_rejections.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() || n.is_multiple_of(1000) {
                    tracing::info!(policy = %limit.name, plan, would_be_rejections = n, remaining = d.remaining(), "shadow limit would have refused this request");
                }
            }
            if matches!(limit.mode, Mode::Shadow { headers: true }) && d.is_counted() {
                let seen = if d.allowed() {
                    d
                } else {
                    Decision::allowed_with(d.limit(), 0, d.reset())
                };
                shown.push(seen.with_policy(limit.name));
            }
        }
        if shown.is_empty() {
            return;
        }
        match outcome {
            Some(outcome) => outcome.fold_in(&shown),
            None => {
                // No enforcing limit applied: the shadow decisions are all there is to show.
                let reported = shown
                    .reported()
                    .copied()
                    .unwrap_or_else(|| Decision::allowed_with(0, 0, Duration::ZERO));
                *outcome = Some(Outcome {
                    headers: self.headers,
                    reported,
                    ietf: None,
                    shaped: None,
                    extension: self.response_extensions,
                });
            }
        }
    }

    /// The refunds of the charges this response does not keep: the enforcing limits' and the
    /// shadow limits' (charged at different times), each one store call.
    pub(crate) fn refunds(&self, status: http::StatusCode) -> Vec<Checked<St::Future>> {
        let mut out = Vec::new();
        let shadow_charged = if self.shadow_at.is_some() {
            &self.shadow[..]
        } else {
            &[]
        };
        for (checks, at) in [
            (&self.by_outcome[..], self.reserved_at),
            (shadow_charged, self.shadow_at),
        ] {
            let refund: Vec<LimitCheck<'_>> = checks
                .iter()
                .filter(|c| {
                    let charge = &self.snapshot.limits[c.limit].charge;
                    charge.by_outcome() && !charge.keeps(status)
                })
                .map(OwnedCheck::as_check)
                .collect();
            if refund.is_empty() {
                continue;
            }
            let Some(at) = at else {
                tracing::warn!("the rate-limit store reports no decision time; charge by outcome cannot give this request back");
                continue;
            };
            tracing::trace!(refunds = refund.len(), %status, "response not counted; giving the charge back");
            out.push(self.snapshot.store.refund(&refund, at));
        }
        out
    }
}

/// Waits for `refund` in the background (on the current Tokio runtime, if any).
fn spawn_refund<F>(refund: F)
where
    F: Future<Output = Result<Decisions, StoreError>> + Send + 'static,
{
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            if let Err(error) = refund.await {
                tracing::warn!(error = %error, "rate-limit store could not give a shadow charge back");
            }
        });
    }
}

/// What to write on a response: the reported decision and, when enabled, the IETF fields
/// (rendered when the decision is made, so the future holds no reference to the layer).
#[derive(Debug)]
pub(crate) struct Outcome {
    headers: RateLimitHeaders,
    reported: Decision,
    /// Boxed: rare (opt-in), and allocating anyway; the future stays small without it.
    ietf: Option<Box<(HeaderValue, HeaderValue)>>,
    /// How long the request waited for its turn (shaping).
    shaped: Option<ShapedDelay>,
    /// Whether the response gets the reported decision in its extensions: opted in, a refusal,
    /// or a layer nested in another (which merges the decisions).
    extension: bool,
}

impl Outcome {
    fn new<St>(
        shared: &Shared<St>,
        snapshot: &Snapshot<St>,
        applied: &Applied,
        decisions: &Decisions,
        reported: Decision,
    ) -> Self {
        // A decision the store did not count (failure policy `Open`) has no budget to show.
        let counted = decisions.as_slice().iter().any(Decision::is_counted);
        let ietf = if shared.headers.writes_ietf() && counted {
            let policy =
                if usize::from(applied.len) == snapshot.limits.len() && applied.at_own_quotas() {
                    snapshot.policy_header.clone()
                } else {
                    policy_field((0..usize::from(applied.len)).map(|i| {
                        (
                            snapshot.limits[usize::from(applied.limit[i])].name.as_str(),
                            applied.quota(snapshot, i),
                        )
                    }))
                };
            policy
                .zip(ratelimit_field(
                    decisions.as_slice().iter().filter(|d| d.is_counted()),
                ))
                .map(Box::new)
        } else {
            None
        };
        Self {
            headers: shared.headers,
            reported,
            ietf,
            shaped: None,
            extension: shared.response_extensions,
        }
    }

    /// The outcome of refusing `req`: its response carries the decision when this layer is
    /// nested in another one (which put its decision in the request's extensions), so that the
    /// outer layer leaves this refusal's headers alone.
    fn refusal<B>(mut self, req: &Request<B>) -> Self {
        self.extension |= req.extensions().get::<Decision>().is_some();
        self
    }

    /// Adds shadow decisions that show in headers: the tighter one wins `X-RateLimit-*`.
    fn fold_in(&mut self, shown: &Decisions) {
        for d in shown.as_slice() {
            if d.is_tighter_than(&self.reported) {
                self.reported = *d;
            }
        }
        if let Some(pair) = &mut self.ietf {
            let (_, ratelimit) = &mut **pair;
            if let Some(more) = ratelimit_field(shown.as_slice().iter()) {
                let mut joined = ratelimit.as_bytes().to_vec();
                joined.extend_from_slice(b", ");
                joined.extend_from_slice(more.as_bytes());
                if let Ok(v) = HeaderValue::from_bytes(&joined) {
                    *ratelimit = v;
                }
            }
        }
    }

    /// Writes rate-limit headers and, when it should, the reported decision on `response`,
    /// merging with what a nested rate-limit layer already wrote (it puts its decision in the
    /// response's extensions when it sees ours in the request's): the more pressing decision
    /// wins `X-RateLimit-*` and the extension, and the IETF lists are appended to.
    pub(crate) fn apply<B>(self, response: &mut Response<B>) {
        if let Some(shaped) = self.shaped {
            response.extensions_mut().insert(shaped);
        }
        let ours_wins = match response.extensions_mut().get_mut::<Decision>() {
            Some(theirs) => {
                let wins = more_pressing(&self.reported, theirs);
                if wins {
                    *theirs = self.reported;
                }
                wins
            }
            None => {
                if self.extension {
                    response.extensions_mut().insert(self.reported);
                }
                true
            }
        };
        // An uncounted decision (failure policy `Open`) writes nothing.
        if ours_wins {
            self.headers
                .write_x_ratelimit(&self.reported, response.headers_mut());
        }
        if let Some(pair) = self.ietf {
            let (policy, ratelimit) = *pair;
            let headers = response.headers_mut();
            headers.append(RATELIMIT_POLICY, policy);
            headers.append(RATELIMIT, ratelimit);
        }
    }
}

/// Whether decision `a` should be reported over `b`: a rejection over an allowance, else the
/// one closer to exhaustion.
fn more_pressing(a: &Decision, b: &Decision) -> bool {
    match (a.allowed(), b.allowed()) {
        (false, true) => true,
        (true, false) => false,
        _ => a.is_tighter_than(b),
    }
}

/// Puts the reported decision in `ext`, keeping a more pressing decision a nested layer put
/// there, and all decisions when there may be more than one: when this layer holds several
/// limits (`several`), or a nested layer already decided. A single-limit layer alone inserts
/// only its `Decision`, which is then the one and only decision (this saves boxing the whole
/// `Decisions` on the common path). Returns whether another layer had decided (this one is
/// nested in it).
fn merge_extensions(
    ext: &mut Extensions,
    decisions: &Decisions,
    reported: &Decision,
    several: bool,
) -> bool {
    // One lookup on the common path (no outer layer): insert, and put an outer layer's
    // decision back if it is the more pressing one.
    let theirs = ext.insert(*reported);
    if let Some(theirs) = theirs {
        if !more_pressing(reported, &theirs) {
            ext.insert(theirs);
        }
    }
    match ext.get_mut::<Decisions>() {
        Some(existing) => {
            for d in decisions.as_slice() {
                if existing.len() < MAX_LIMITS {
                    existing.push(*d);
                }
            }
        }
        None => {
            let Some(theirs) = theirs else {
                if several {
                    ext.insert(decisions.clone());
                }
                return false;
            };
            // A `Decision` without `Decisions`: a single-limit layer decided before us.
            let mut all = Decisions::new();
            all.push(theirs);
            for d in decisions.as_slice() {
                if all.len() < MAX_LIMITS {
                    all.push(*d);
                }
            }
            ext.insert(all);
        }
    }
    theirs.is_some()
}

/// The first step of a request, done in `call`. The request stays with the caller (it is
/// moved once, to the inner service or the future, not through every step).
// Large variants by design: boxing the decisions would allocate on every request, and these
// values only live on the stack between the store check and the future.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Begin<St: Store> {
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
pub(crate) enum Finish {
    Proceed(Outcome),
    Reject(Response<RejectionBody>),
}

/// Skip predicate, key, plan and cost extraction, and the store check. `lookups`: how many plan
/// lookups already ran for this request (after [`MAX_LOOKUPS`], the plan is unknown).
#[inline(always)]
pub(crate) fn begin<ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    req: &mut Request<ReqBody>,
    lookups: u8,
) -> Begin<St> {
    // Size the on-stack check buffer to the layer: one limit is the common case and two (a
    // burst and a quota, or a route and a ceiling) the next; building (and dropping) eight
    // `LimitCheck`s for them costs more than the check itself.
    let snapshot = shared.current.load();
    match &*snapshot.limits {
        [limit] if limit.is_plain() => begin_plain(shared, &snapshot, req),
        [_] => begin_with::<1, _, _>(shared, &snapshot, req, lookups),
        [_, _] => begin_with::<2, _, _>(shared, &snapshot, req, lookups),
        _ => begin_with::<MAX_LIMITS, _, _>(shared, &snapshot, req, lookups),
    }
}

/// [`begin`] for the most common layer: one [plain](super::limit::CompiledLimit::is_plain)
/// limit, a key and a cost. It decides as [`begin_with`] does (the same steps in the same
/// order, the same [`finish`]) with a fraction of its code, so that what every request runs
/// stays small: the rarer parts of a request (a missing key, an override) are functions of
/// their own.
#[inline]
fn begin_plain<ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    snapshot: &Arc<Snapshot<St>>,
    req: &mut Request<ReqBody>,
) -> Begin<St> {
    let limit = &snapshot.limits[0];
    let view = RequestView::new(req);
    if let Some(skip) = &shared.skip {
        if skip(&view) {
            return Begin::Proceed(None, None);
        }
    }
    let key = match limit.key.extract(&view) {
        Ok(key) => key,
        Err(error) => {
            return match missing_key(shared, limit, view, &error) {
                None => Begin::Proceed(None, None),
                Some(response) => Begin::Reject(response),
            }
        }
    };
    let (plan, overridden) = match shared.overrides.get(limit.name, &key) {
        None => (NO_PLAN, None),
        Some(Active::Quota(q)) => (OVERRIDDEN, Some(q)),
        Some(Active::Exempt) => return Begin::Proceed(None, None),
        Some(Active::Block) => {
            return match blocked(shared, limit, view) {
                None => Begin::Proceed(None, None),
                Some(response) => Begin::Reject(response),
            }
        }
    };
    let cost = limit.cost(&view);
    let mut applied = Applied::new();
    applied.len = 1;
    applied.cost[0] = cost;
    applied.plan[0] = plan;
    let capacity = overridden.map_or(limit.capacity, |q| q.capacity());
    if cost > capacity {
        // The request can never pass: charge nothing, only read the limit for the headers.
        applied.too_costly = Some(0);
    }
    applied.override_quota = overridden.map(|q| *q.quota());
    let check = LimitCheck::new(0, key, if cost > capacity { 0 } else { cost });
    let check = match &overridden {
        Some(q) => check.with_quota(q),
        None if limit.explicit_quota => check.with_quota(&limit.base),
        None => check,
    };
    let checked = snapshot.store.check(std::slice::from_ref(&check));
    drop(check);
    match checked {
        Checked::Ready(result) => match finish(shared, snapshot, req, &applied, result, None) {
            Finish::Proceed(outcome) => Begin::Proceed(Some(outcome), None),
            Finish::Reject(response) => Begin::Reject(response),
        },
        Checked::Pending(future) => Begin::Pending(future, applied, Arc::clone(snapshot), None),
    }
}

/// Refuses with the layer's rejection for `reason`.
fn refuse<St>(
    shared: &Shared<St>,
    view: RequestView<'_>,
    reason: RejectReason<'_>,
) -> Response<RejectionBody> {
    let decisions = Decisions::new();
    let rejected = Rejected::new(view, reason, &decisions);
    shared.rejection.reject(&rejected)
}

/// [`begin`] with room for `N` checks (`N >= snapshot.limits.len()`).
///
/// What an allowed request does is kept here; what it rarely needs (a missing key, an
/// override, a plan, work after the response) is in functions of their own, out of line, so
/// the code every request runs stays compact.
fn begin_with<const N: usize, ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    snapshot: &Arc<Snapshot<St>>,
    req: &mut Request<ReqBody>,
    lookups: u8,
) -> Begin<St> {
    let view = RequestView::new(req);
    if let Some(skip) = &shared.skip {
        if skip(&view) {
            return Begin::Proceed(None, None);
        }
    }
    let mut checks: [LimitCheck<'_>; N] =
        std::array::from_fn(|_| LimitCheck::new(0, Key::global(), 0));
    // Quotas of per-key overrides, lent to the checks.
    let mut overridden: [Option<PlanQuota>; N] = [None; N];
    let mut keys: [Option<Key<'_>>; N] = std::array::from_fn(|_| None);
    let mut applied = Applied::new();
    let mut followup: Option<Followup<St>> = None;
    // shaping hook: a request refused or dropped before its turn gives every charge back.
    let shaping = snapshot.limits.iter().any(|l| l.shape.is_some());
    let mut n = 0;
    for (i, limit) in snapshot.limits.iter().enumerate() {
        if let Some(when) = &limit.when {
            if !when(&view) {
                continue;
            }
        }
        let key = match limit.key.extract(&view) {
            Ok(key) => key,
            Err(error) => match missing_key(shared, limit, view, &error) {
                None => continue,
                Some(response) => return Begin::Reject(response),
            },
        };
        // Per-key overrides first (they outrank plans), then the plan.
        let mut plan = NO_PLAN;
        match shared.overrides.get(limit.name, &key) {
            None if limit.resolver.is_none() => {}
            None => match plan_of(shared, limit, view, &key, lookups) {
                PlanStep::Plan(p) => plan = p,
                PlanStep::Skip => continue,
                PlanStep::Reject(response) => return Begin::Reject(response),
                PlanStep::Lookup(lookup) => {
                    drop((key, keys, checks));
                    return Begin::Resolve(lookup, lookups + 1);
                }
            },
            Some(Active::Quota(q)) => {
                overridden[n] = Some(q);
                plan = OVERRIDDEN;
            }
            Some(Active::Exempt) => continue,
            Some(Active::Block) => match blocked(shared, limit, view) {
                None => continue,
                Some(response) => return Begin::Reject(response),
            },
        }
        let cost = limit.cost(&view);
        let capacity = match plan {
            NO_PLAN => limit.capacity,
            OVERRIDDEN => overridden[n].map_or(limit.capacity, |q| q.capacity()),
            p => limit.plans[usize::from(p)].quota.capacity(),
        };
        if limit.mode.is_shadow() || limit.charge.by_outcome() || shaping {
            let quota = match plan {
                NO_PLAN if limit.explicit_quota => Some(limit.base),
                NO_PLAN => None,
                OVERRIDDEN => overridden[n],
                p => Some(limit.plans[usize::from(p)].quota),
            };
            let check = OwnedCheck {
                limit: i,
                key: key.clone().into_owned(),
                // A shadow check above its capacity is decided (impossible: a would-be
                // refusal) and charges nothing; an enforcing one refuses the request first.
                cost,
                quota,
                plan: limit.plans.get(usize::from(plan)).map(|p| p.name),
            };
            let shaped = limit.shape.is_some() && plan == NO_PLAN;
            if follow_up(
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
        if let (OVERRIDDEN, None, Some(q)) = (plan, applied.override_quota, overridden[n]) {
            applied.override_quota = Some(*q.quota());
        }
        applied.limit[n] = i as u8;
        applied.cost[n] = cost;
        applied.plan[n] = plan;
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
                shadow_step(shared, None, f)
            }
            f => Begin::Proceed(None, f),
        };
    }
    for (j, key) in keys.iter_mut().enumerate().take(n) {
        let i = usize::from(applied.limit[j]);
        let limit = &snapshot.limits[i];
        let check = LimitCheck::new(i, key.take().unwrap_or_else(Key::global), applied.cost[j]);
        checks[j] = match applied.plan[j] {
            NO_PLAN if limit.explicit_quota => check.with_quota(&limit.base),
            NO_PLAN => check,
            OVERRIDDEN => match &overridden[j] {
                Some(q) => check.with_quota(q),
                None => check,
            },
            p => check.with_quota(&limit.plans[usize::from(p)].quota),
        };
    }
    if applied.too_costly.is_some() {
        // The request can never pass: charge nothing, only read the limits for the headers.
        for check in &mut checks[..n] {
            check.cost = 0;
        }
    } else if let Some(f) = followup.as_mut() {
        // shaping hook: the store may give this request a place at the end of its schedule.
        f.deciding = shared.waiting.deciding(&f.shaped);
    }
    let checked = snapshot.store.check(&checks[..n]);
    drop((keys, checks));
    match checked {
        Checked::Ready(result) => {
            match finish(shared, snapshot, req, &applied, result, followup.as_mut()) {
                Finish::Proceed(outcome) => match followup {
                    Some(f) if !f.shadow.is_empty() => shadow_step(shared, Some(outcome), f),
                    f => Begin::Proceed(Some(outcome), f),
                },
                Finish::Reject(response) => Begin::Reject(response),
            }
        }
        Checked::Pending(future) => {
            if let Some(f) = followup.as_mut() {
                f.start_shadow();
            }
            Begin::Pending(future, applied, Arc::clone(snapshot), followup)
        }
    }
}

/// `limit` found no key in the request: the refusal its [`MissingKey`](super::MissingKey)
/// setting asks for, or `None` to skip the limit.
#[cold]
#[inline(never)]
fn missing_key<St>(
    shared: &Shared<St>,
    limit: &super::limit::CompiledLimit,
    view: RequestView<'_>,
    error: &crate::key::KeyError,
) -> Option<Response<RejectionBody>> {
    match limit.on_missing_key.status_for(error) {
        None => {
            if error.is_misconfiguration() {
                tracing::warn!(policy = %limit.name, reason = %error, "no rate-limit key (server misconfigured); limit skipped");
            } else {
                tracing::trace!(policy = %limit.name, reason = %error, "no rate-limit key; limit skipped");
            }
            None
        }
        Some(status) if limit.mode.is_shadow() => {
            tracing::debug!(policy = %limit.name, reason = %error, %status, "no rate-limit key; a shadow limit would have refused the request");
            None
        }
        Some(status) => {
            if error.is_misconfiguration() {
                tracing::warn!(policy = %limit.name, reason = %error, %status, "no rate-limit key (server misconfigured); request refused");
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
fn blocked<St>(
    shared: &Shared<St>,
    limit: &super::limit::CompiledLimit,
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

/// What a limit with plans does next.
enum PlanStep {
    /// Decide at this plan (an index into the limit's plans), or [`NO_PLAN`].
    Plan(u8),
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
    limit: &super::limit::CompiledLimit,
    view: RequestView<'_>,
    key: &Key<'_>,
    lookups: u8,
) -> PlanStep {
    let Some(resolver) = &limit.resolver else {
        return PlanStep::Plan(NO_PLAN);
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
        (Some(p), _) => PlanStep::Plan(p as u8),
        (None, Resolution::Default) => PlanStep::Plan(NO_PLAN),
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
            _ => PlanStep::Plan(NO_PLAN),
        },
    }
}

/// Records `check` for the work after the enforcing check (a shadow limit, charges decided by
/// the response, shaping). Returns whether the limit is a shadow one (checked in a call of its
/// own, not with the enforcing ones).
#[inline(never)]
fn follow_up<St: Store>(
    shared: &Shared<St>,
    snapshot: &Arc<Snapshot<St>>,
    followup: &mut Option<Followup<St>>,
    limit: &super::limit::CompiledLimit,
    check: OwnedCheck,
    shaped: bool,
    shaping: bool,
) -> bool {
    let f = followup.get_or_insert_with(|| {
        Followup(Box::new(FollowupData {
            snapshot: Arc::clone(snapshot),
            shadow: Vec::new(),
            by_outcome: Vec::new(),
            reserved_at: None,
            shadow_at: None,
            near: shared.near_limit,
            headers: shared.headers,
            response_extensions: shared.response_extensions,
            shaped: Vec::new(),
            unshaped: Vec::new(),
            reservation: None,
            deciding: None,
            shadow_check: None,
            enforced: false,
        }))
    });
    if limit.mode.is_shadow() {
        f.shadow.push(check);
        return true;
    }
    if limit.charge.by_outcome() {
        if shaped {
            f.shaped.push(check.clone());
        } else if shaping {
            f.unshaped.push(check.clone());
        }
        f.by_outcome.push(check);
    } else if shaped {
        f.shaped.push(check);
    } else if shaping {
        f.unshaped.push(check);
    }
    false
}

/// Checks the shadow limits of a request the enforcing limits allowed, or takes the answer of
/// the check started together with theirs.
pub(crate) fn shadow_step<St: Store>(
    _shared: &Arc<Shared<St>>,
    mut outcome: Option<Outcome>,
    followup: Followup<St>,
) -> Begin<St> {
    // The shadow limits of a request decide together, all-or-nothing among themselves (as
    // they would if they enforced), and never with the enforcing limits.
    let mut followup = followup;
    followup.enforced = true;
    match followup.shadow_check.take() {
        Some(ShadowCheck::Done(result)) => {
            followup.record_shadow(result, &mut outcome);
            return Begin::Proceed(outcome, Some(followup));
        }
        Some(pending) => {
            followup.shadow_check = Some(pending);
            return Begin::ShadowStarted(outcome, followup);
        }
        None => {}
    }
    let checks: Vec<LimitCheck<'_>> = followup.shadow.iter().map(OwnedCheck::as_check).collect();
    let checked = followup.snapshot.store.check(&checks);
    drop(checks);
    match checked {
        Checked::Ready(result) => {
            let mut followup = followup;
            followup.record_shadow(result, &mut outcome);
            Begin::Proceed(outcome, Some(followup))
        }
        Checked::Pending(future) => Begin::Shadow(future, outcome, followup),
    }
}

/// Finishes a pending shadow check.
pub(crate) fn shadow_done<St: Store>(
    followup: &mut Followup<St>,
    result: Result<Decisions, StoreError>,
    outcome: &mut Option<Outcome>,
) {
    followup.record_shadow(result, outcome);
}

/// Finishes the shadow check started with the enforcing one (its answer has come).
pub(crate) fn shadow_started_done<St: Store>(
    followup: &mut Followup<St>,
    outcome: &mut Option<Outcome>,
) {
    if let Some(ShadowCheck::Done(result)) = followup.shadow_check.take() {
        followup.record_shadow(result, outcome);
    }
}

/// Turns the store's answer into a rejection, or a request ready for the inner service.
///
/// The allowed path is kept short; refusals, store errors and shaping live in functions of
/// their own, out of line, so that the code an allowed request runs stays compact (it shares
/// the instruction cache with the application's).
pub(crate) fn finish<ReqBody, St: Store>(
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
            return refuse_on_error(shared, snapshot, req, applied, error);
        }
        Err(error) => return refuse_on_error(shared, snapshot, req, applied, error),
    };
    // Attribute every decision to its limit and plan, whatever the store did.
    // shaping hook: the longest wait among the shaped limits, and which check it is.
    let mut shaped = (Duration::ZERO, 0);
    for (j, (d, (limit, _))) in decisions
        .as_mut_slice()
        .iter_mut()
        .zip(applied.checks())
        .enumerate()
    {
        if let (Some(shape), NO_PLAN) = (&snapshot.limits[limit].shape, applied.plan[j]) {
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
        return refuse_by(shared, snapshot, req, applied, decisions, i);
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
        // shaping hook: a request that must wait takes a place among the waiting ones; one
        // that need not wait was given no place.
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
    let quota = applied.quota(snapshot, j);
    // Each shaped limit's own wait: the request's place in that limit's schedule.
    let waits: Vec<(usize, Duration)> = decisions
        .as_slice()
        .iter()
        .zip(applied.checks())
        .enumerate()
        .filter_map(|(k, (d, (limit, _)))| {
            let shape = snapshot.limits[limit].shape.as_ref()?;
            (applied.plan[k] == NO_PLAN && d.is_counted()).then(|| (limit, shape.wait(d)))
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

/// The store failed (or answered nonsense): refuses, as the layer's rejection says.
#[cold]
#[inline(never)]
fn refuse_on_error<ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    snapshot: &Snapshot<St>,
    req: &Request<ReqBody>,
    applied: &Applied,
    error: StoreError,
) -> Finish {
    let empty = Decisions::new();
    let view = RequestView::new(req);
    if let Some(i) = applied.too_costly {
        // Refused whatever the store says; without its numbers, report capacity only.
        let i = usize::from(i);
        let limit = &snapshot.limits[usize::from(applied.limit[i])];
        let quota = applied.quota(snapshot, i);
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
        return Finish::Reject(shared.rejection.reject(&rejected));
    }
    tracing::warn!(error = %error, "rate-limit store failed; request refused");
    let rejected = Rejected::new(
        view,
        RejectReason::StoreUnavailable { error: &error },
        &empty,
    );
    let mut response = shared.rejection.reject(&rejected);
    if let Some(secs) = rejected.retry_after_secs() {
        set_retry_after_if_absent(response.headers_mut(), secs);
    }
    Finish::Reject(response)
}

/// Refuses because of decision `i` (a cost above capacity, or the store's first rejection).
#[cold]
#[inline(never)]
fn refuse_by<ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    snapshot: &Snapshot<St>,
    req: &Request<ReqBody>,
    applied: &Applied,
    mut decisions: Decisions,
    i: usize,
) -> Finish {
    if applied.too_costly.is_some() {
        let d = decisions.as_slice()[i];
        decisions.as_mut_slice()[i] =
            Decision::impossible(d.limit(), d.remaining(), d.reset()).with_policy(d.policy());
    }
    let decision = decisions.as_slice()[i];
    let limit = &snapshot.limits[usize::from(applied.limit[i])];
    let quota = applied.quota(snapshot, i);
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
    Finish::Reject(response)
}
