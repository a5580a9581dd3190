//! The work after the enforcing check ([`Followup`]): shadow limits (checked in a store call of
//! their own), charges the response decides (refunds), and a shaped request's reservation.

use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::applied::OwnedCheck;
use super::limit::{CompiledLimit, Mode};
use super::outcome::Outcome;
use super::shaping::{Deciding, Reservation};
use super::shared::Shared;
use super::snapshot::Snapshot;
use crate::decision::{Decision, Name};
use crate::error::StoreError;
use crate::headers::RateLimitHeaders;
use crate::metrics::{self, NearLimit};
use crate::store::{Checked, Decisions, LimitCheck, Store};

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
    pub(super) snapshot: Arc<Snapshot<St>>,
    pub(super) shadow: Vec<OwnedCheck>,
    pub(super) by_outcome: Vec<OwnedCheck>,
    pub(super) reserved_at: Option<u64>,
    /// When the shadow limits were charged, if all of them allowed (they decide together).
    pub(super) shadow_at: Option<u64>,
    pub(super) near: NearLimit,
    pub(super) headers: RateLimitHeaders,
    /// Whether a response shadow limits alone decided carries their decision (opted in, or
    /// the layer is nested in another).
    pub(super) response_extensions: bool,
    /// Shaping: the checks of the shaped limits, and what a waiting request reserved.
    pub(super) shaped: Vec<OwnedCheck>,
    /// Shaping: the request's other enforcing checks (kept in a layer with a shaped limit), given
    /// back with the shaped ones when the request never gets its turn.
    pub(super) unshaped: Vec<OwnedCheck>,
    pub(super) reservation: Option<Reservation>,
    /// Shaping: marks the request's schedule as being decided until the request has its place
    /// or is decided without one (see [`Deciding`]).
    pub(super) deciding: Option<Deciding>,
    /// The shadow limits' check, started together with the enforcing one when that one waits
    /// for the store, so that a request waits for one store call, not two in a row.
    pub(super) shadow_check: Option<ShadowCheck<St>>,
    /// Whether the enforcing limits allowed the request: from then on, the shadow limits keep
    /// their charge as the enforcing ones do, whatever becomes of the request.
    pub(super) enforced: bool,
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
                        if let Some(refund) = give_back(future.await)
                            && let Err(error) = refund.await {
                                tracing::warn!(error = %error, "rate-limit store could not give a shadow charge back");
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
pub(super) enum ShadowCheck<St: Store> {
    Pending(Pin<Box<St::Future>>),
    Done(Result<Decisions, StoreError>),
}

/// The reservation of a request that must wait for its turn (shaping), if any.
#[inline]
pub(crate) fn shaping_wait<St: Store>(followup: &Option<Followup<St>>) -> Option<&Reservation> {
    followup.as_ref().and_then(|f| f.reservation.as_ref())
}

impl<St: Store> Followup<St> {
    /// Starts the shadow limits' check now, while the enforcing check is pending: both store
    /// calls then run at once, and the request waits for the slower of the two, which is
    /// bounded by one store timeout.
    pub(super) fn start_shadow(&mut self) {
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
    pub(super) fn record_shadow(
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
            let plan = check.plan.unwrap_or(Name::new(""));
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

    /// Gives back the charges a response with `status` does not keep; the store calls still
    /// to wait for.
    #[inline(never)]
    pub(super) fn start_refunds(&self, status: http::StatusCode) -> Vec<St::Future> {
        let mut pending = Vec::new();
        for refund in self.refunds(status) {
            match refund {
                Checked::Pending(f) => pending.push(f),
                Checked::Ready(Err(error)) => {
                    tracing::warn!(error = %error, "rate-limit store could not give a charge back");
                }
                Checked::Ready(Ok(_)) => {}
            }
        }
        pending
    }

    /// The refunds of the charges this response does not keep: the enforcing limits' and the
    /// shadow limits' (charged at different times), each one store call.
    fn refunds(&self, status: http::StatusCode) -> Vec<Checked<St::Future>> {
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

/// Records `check` for the work after the enforcing check (a shadow limit, charges decided by
/// the response, shaping). Returns whether the limit is a shadow one (checked in a call of its
/// own, not with the enforcing ones).
#[inline(never)]
pub(super) fn keep<St: Store>(
    shared: &Shared<St>,
    snapshot: &Arc<Snapshot<St>>,
    followup: &mut Option<Followup<St>>,
    limit: &CompiledLimit,
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

/// What became of the shadow limits' check once the enforcing limits allowed the request.
pub(super) enum ShadowStatus<F> {
    /// Decided and recorded.
    Recorded,
    /// Started with the enforcing check, still to answer (see [`Followup::poll_shadow`]).
    Started,
    /// Sent now: the store answers later.
    Pending(F),
}

impl<St: Store> Followup<St> {
    /// Checks the shadow limits of a request the enforcing limits allowed, or takes the answer
    /// of the check started together with theirs; records what is decided in `outcome`.
    pub(super) fn check_shadow(
        &mut self,
        outcome: &mut Option<Outcome>,
    ) -> ShadowStatus<St::Future> {
        // The shadow limits of a request decide together, all-or-nothing among themselves (as
        // they would if they enforced), and never with the enforcing limits.
        self.enforced = true;
        match self.shadow_check.take() {
            Some(ShadowCheck::Done(result)) => {
                self.record_shadow(result, outcome);
                return ShadowStatus::Recorded;
            }
            Some(pending) => {
                self.shadow_check = Some(pending);
                return ShadowStatus::Started;
            }
            None => {}
        }
        let checks: Vec<LimitCheck<'_>> = self.shadow.iter().map(OwnedCheck::as_check).collect();
        let checked = self.snapshot.store.check(&checks);
        drop(checks);
        match checked {
            Checked::Ready(result) => {
                self.record_shadow(result, outcome);
                ShadowStatus::Recorded
            }
            Checked::Pending(future) => ShadowStatus::Pending(future),
        }
    }

    /// Finishes the shadow check started with the enforcing one (its answer has come).
    pub(super) fn finish_started_shadow(&mut self, outcome: &mut Option<Outcome>) {
        if let Some(ShadowCheck::Done(result)) = self.shadow_check.take() {
            self.record_shadow(result, outcome);
        }
    }
}
