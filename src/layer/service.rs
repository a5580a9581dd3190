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
use super::layer::{RateLimitLayer, Shared};
use super::limit::Limit;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::headers::{
    policy_field, ratelimit_field, set_retry_after_if_absent, RateLimitHeaders, RATELIMIT,
    RATELIMIT_POLICY,
};
use crate::key::Key;
use crate::request::RequestView;
use crate::response::{RejectReason, Rejected, RejectionBody};
use crate::store::memory::MemoryStore;
use crate::store::{Checked, Decisions, LimitCheck, Store, MAX_LIMITS};

/// Rate-limits requests to the inner service `S`. Created by [`RateLimitLayer`]; see the
/// [module docs](crate::layer).
///
/// Allowed requests reach `S` with the reported [`Decision`] in their extensions, and all
/// [`Decisions`] too when the layer holds more than one limit or layers are nested (with a
/// single limit, the `Decision` is the only one); responses get rate-limit headers and the reported [`Decision`] in their
/// extensions (for logging or metrics middleware further out). Refused requests never
/// reach `S`: they are answered by the layer's [`Rejection`](crate::response::Rejection).
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
            .field("limits", &self.shared.limits)
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

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        match begin(&self.shared, req) {
            Begin::Proceed(req, outcome) => ResponseFuture::inner(self.inner.call(req), outcome),
            Begin::Reject(response) => ResponseFuture::rejected(response),
            Begin::Pending(check, req, plan) => {
                // The store answers later: keep the instance that was polled ready for then, and
                // leave a fresh clone in its place (it will be polled ready before its own call).
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                ResponseFuture::checking(check, req, inner, plan, Arc::clone(&self.shared))
            }
        }
    }
}

/// Which limits were checked for a request, at what cost, in check order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    limit: [u8; MAX_LIMITS],
    cost: [u64; MAX_LIMITS],
    len: u8,
    /// The first check whose cost exceeds its limit's capacity (all costs were zeroed: a peek).
    too_costly: Option<u8>,
}

impl Plan {
    fn checks(&self) -> impl Iterator<Item = (usize, u64)> + Clone + '_ {
        (0..usize::from(self.len)).map(|i| (usize::from(self.limit[i]), self.cost[i]))
    }
}

/// What to write on a response: the reported decision and, when enabled, the IETF fields
/// (rendered when the decision is made, so the future holds no reference to the layer).
#[derive(Debug)]
pub(crate) struct Outcome {
    headers: RateLimitHeaders,
    reported: Decision,
    ietf: Option<(HeaderValue, HeaderValue)>,
}

impl Outcome {
    fn new<St>(
        shared: &Shared<St>,
        plan: &Plan,
        decisions: &Decisions,
        reported: Decision,
    ) -> Self {
        let ietf = if shared.headers.writes_ietf() {
            let policy = if usize::from(plan.len) == shared.limits.len() {
                shared.policy_header.clone()
            } else {
                policy_field(plan.checks().map(|(limit, _)| {
                    (
                        shared.limits[limit].name.as_str(),
                        &shared.limits[limit].quota,
                    )
                }))
            };
            policy.zip(ratelimit_field(decisions.as_slice().iter()))
        } else {
            None
        };
        Self {
            headers: shared.headers,
            reported,
            ietf,
        }
    }

    /// Writes rate-limit headers and the reported decision on `response`, merging with what a
    /// nested rate-limit layer already wrote: the more pressing decision wins `X-RateLimit-*`
    /// and the extension, and the IETF lists are appended to.
    pub(crate) fn apply<B>(self, response: &mut Response<B>) {
        let ours_wins = match response.extensions_mut().get_mut::<Decision>() {
            Some(theirs) => {
                let wins = more_pressing(&self.reported, theirs);
                if wins {
                    *theirs = self.reported;
                }
                wins
            }
            None => {
                response.extensions_mut().insert(self.reported);
                true
            }
        };
        if ours_wins {
            self.headers
                .write_x_ratelimit(&self.reported, response.headers_mut());
        }
        if let Some((policy, ratelimit)) = self.ietf {
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
/// `Decisions` on the common path).
fn merge_extensions(
    ext: &mut Extensions,
    decisions: &Decisions,
    reported: &Decision,
    several: bool,
) {
    let theirs = match ext.get_mut::<Decision>() {
        Some(existing) => {
            let theirs = *existing;
            if more_pressing(reported, existing) {
                *existing = *reported;
            }
            Some(theirs)
        }
        None => {
            ext.insert(*reported);
            None
        }
    };
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
                    ext.insert(*decisions);
                }
                return;
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
}

/// The first step of a request, done in `call`.
// Large variants by design: boxing the decisions would allocate on every request, and these
// values only live on the stack between the store check and the future.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Begin<ReqBody, F> {
    /// Call the inner service (with an outcome to report, unless no limit applied).
    Proceed(Request<ReqBody>, Option<Outcome>),
    /// Answer with this response without calling the inner service.
    Reject(Response<RejectionBody>),
    /// Wait for the store.
    Pending(F, Request<ReqBody>, Plan),
}

/// The result of a store check.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Finish<ReqBody> {
    Proceed(Request<ReqBody>, Outcome),
    Reject(Response<RejectionBody>),
}

/// Skip predicate, key and cost extraction, and the store check.
fn begin<ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    req: Request<ReqBody>,
) -> Begin<ReqBody, St::Future> {
    // Size the on-stack check buffer to the layer: one limit is the common case, and building
    // (and dropping) eight `LimitCheck`s for it costs more than the check itself.
    if shared.limits.len() == 1 {
        begin_with::<1, _, _>(shared, req)
    } else {
        begin_with::<MAX_LIMITS, _, _>(shared, req)
    }
}

/// [`begin`] with room for `N` checks (`N >= shared.limits.len()`).
fn begin_with<const N: usize, ReqBody, St: Store>(
    shared: &Arc<Shared<St>>,
    req: Request<ReqBody>,
) -> Begin<ReqBody, St::Future> {
    let view = RequestView::new(&req);
    if let Some(skip) = &shared.skip {
        if skip(&view) {
            return Begin::Proceed(req, None);
        }
    }
    let mut checks: [LimitCheck<'_>; N] =
        std::array::from_fn(|_| LimitCheck::new(0, Key::global(), 0));
    let mut plan = Plan {
        limit: [0; MAX_LIMITS],
        cost: [0; MAX_LIMITS],
        len: 0,
        too_costly: None,
    };
    let mut n = 0;
    for (i, limit) in shared.limits.iter().enumerate() {
        let key = match limit.key.extract(&view) {
            Ok(key) => key,
            Err(error) => match limit.on_missing_key.status_for(&error) {
                None => {
                    if error.is_misconfiguration() {
                        tracing::warn!(policy = %limit.name, reason = %error, "no rate-limit key (server misconfigured); limit skipped");
                    } else {
                        tracing::trace!(policy = %limit.name, reason = %error, "no rate-limit key; limit skipped");
                    }
                    continue;
                }
                Some(status) => {
                    if error.is_misconfiguration() {
                        tracing::warn!(policy = %limit.name, reason = %error, %status, "no rate-limit key (server misconfigured); request refused");
                    } else {
                        tracing::debug!(policy = %limit.name, reason = %error, %status, "no rate-limit key; request refused");
                    }
                    let decisions = Decisions::new();
                    let rejected = Rejected::new(
                        view,
                        RejectReason::MissingKey {
                            policy: limit.name,
                            error: &error,
                            status,
                        },
                        &decisions,
                    );
                    return Begin::Reject(shared.rejection.reject(&rejected));
                }
            },
        };
        let cost = limit.cost(&view);
        if cost > limit.capacity && plan.too_costly.is_none() {
            plan.too_costly = Some(n as u8);
        }
        plan.limit[n] = i as u8;
        plan.cost[n] = cost;
        checks[n] = LimitCheck::new(i, key, cost);
        n += 1;
    }
    plan.len = n as u8;
    if n == 0 {
        return Begin::Proceed(req, None);
    }
    if plan.too_costly.is_some() {
        // The request can never pass: charge nothing, only read the limits for the headers.
        for check in &mut checks[..n] {
            check.cost = 0;
        }
    }
    let checked = shared.store.check(&checks[..n]);
    drop(checks);
    match checked {
        Checked::Ready(result) => match finish(shared, req, &plan, result) {
            Finish::Proceed(req, outcome) => Begin::Proceed(req, Some(outcome)),
            Finish::Reject(response) => Begin::Reject(response),
        },
        Checked::Pending(future) => Begin::Pending(future, req, plan),
    }
}

/// Turns the store's answer into a rejection, or a request ready for the inner service.
pub(crate) fn finish<ReqBody, St>(
    shared: &Arc<Shared<St>>,
    mut req: Request<ReqBody>,
    plan: &Plan,
    result: Result<Decisions, StoreError>,
) -> Finish<ReqBody> {
    let result = result.and_then(|mut decisions| {
        if decisions.len() != usize::from(plan.len) {
            return Err(StoreError::new(
                StoreErrorKind::InvalidResponse,
                format!(
                    "store returned {} decisions for {} checks",
                    decisions.len(),
                    plan.len
                ),
            ));
        }
        // Attribute every decision to its limit, whatever the store did.
        for (d, (limit, _)) in decisions.as_mut_slice().iter_mut().zip(plan.checks()) {
            *d = d.with_policy(shared.limits[limit].name);
        }
        Ok(decisions)
    });

    let mut decisions = match result {
        Ok(decisions) => decisions,
        Err(error) => {
            let empty = Decisions::new();
            let view = RequestView::new(&req);
            if let Some(i) = plan.too_costly {
                // Refused whatever the store says; without its numbers, report capacity only.
                let i = usize::from(i);
                let limit = &shared.limits[usize::from(plan.limit[i])];
                let decision =
                    Decision::impossible(limit.capacity, 0, Duration::ZERO).with_policy(limit.name);
                let rejected = Rejected::new(
                    view,
                    RejectReason::CostExceedsCapacity {
                        decision: &decision,
                        quota: &limit.quota,
                        cost: plan.cost[i],
                    },
                    &empty,
                );
                tracing::debug!(policy = %limit.name, cost = plan.cost[i], capacity = limit.capacity, "request costs more than the limit holds");
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
            return Finish::Reject(response);
        }
    };

    // Which decision refuses the request, if any: a cost above capacity first, then the
    // store's first rejection.
    let refusal = match plan.too_costly {
        Some(i) => {
            let i = usize::from(i);
            let d = decisions.as_slice()[i];
            decisions.as_mut_slice()[i] =
                Decision::impossible(d.limit(), d.remaining(), d.reset()).with_policy(d.policy());
            Some(i)
        }
        None => decisions.as_slice().iter().position(|d| !d.allowed()),
    };

    match refusal {
        None => {
            // There is at least one decision, so `reported` is `Some`.
            let reported = decisions
                .reported()
                .copied()
                .unwrap_or_else(|| Decision::allowed_with(0, 0, Duration::ZERO));
            let outcome = Outcome::new(shared, plan, &decisions, reported);
            let several = shared.limits.len() > 1;
            merge_extensions(req.extensions_mut(), &decisions, &reported, several);
            Finish::Proceed(req, outcome)
        }
        Some(i) => {
            let decision = decisions.as_slice()[i];
            let limit = &shared.limits[usize::from(plan.limit[i])];
            let view = RequestView::new(&req);
            let reason = if decision.is_impossible() {
                tracing::debug!(policy = %limit.name, cost = plan.cost[i], capacity = limit.capacity, "request costs more than the limit holds");
                RejectReason::CostExceedsCapacity {
                    decision: &decision,
                    quota: &limit.quota,
                    cost: plan.cost[i],
                }
            } else {
                tracing::debug!(
                    policy = %limit.name,
                    remaining = decision.remaining(),
                    retry_after_ms = decision.retry_after().map_or(0, |d| d.as_millis() as u64),
                    "request rate limited"
                );
                RejectReason::RateLimited {
                    decision: &decision,
                    quota: &limit.quota,
                }
            };
            let rejected = Rejected::new(view, reason, &decisions);
            let mut response = shared.rejection.reject(&rejected);
            if let Some(secs) = rejected.retry_after_secs() {
                set_retry_after_if_absent(response.headers_mut(), secs);
            }
            Outcome::new(shared, plan, &decisions, decision).apply(&mut response);
            Finish::Reject(response)
        }
    }
}
