//! [`Waiting`] (the layer's bound on waiting requests) and [`Reservation`] (what a waiting
//! request holds, given back if it is dropped before its turn): [`reserve`] makes an allowed
//! request wait.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};

use super::schedules::{Deciding, Entry, Held, PendingRefund, ScheduleKey, Schedules};
use super::ShapedDelay;
use crate::decision::Decision;
use crate::quota::Quota;
use crate::rate_limit::applied::OwnedCheck;
use crate::rate_limit::snapshot::Snapshot;
use crate::response::{RejectReason, Rejected, RejectionBody};
use crate::store::{Checked, Decisions, LimitCheck, Store};

/// The bound on requests waiting in one layer, across keys, and the places they hold.
#[derive(Debug)]
pub(crate) struct Waiting {
    count: Arc<AtomicUsize>,
    max: usize,
    schedules: Arc<Schedules>,
}

impl Waiting {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            count: Arc::new(AtomicUsize::new(0)),
            max,
            schedules: Arc::new(Schedules::new()),
        }
    }

    /// A place among the waiting requests, if one is free.
    fn enter(&self) -> Option<WaitSlot> {
        let mut n = self.count.load(Ordering::Relaxed);
        loop {
            if n >= self.max {
                return None;
            }
            match self
                .count
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(WaitSlot(Arc::clone(&self.count))),
                Err(now) => n = now,
            }
        }
    }
}

/// One place among a layer's waiting requests; given back on drop.
struct WaitSlot(Arc<AtomicUsize>);

impl Drop for WaitSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a waiting request reserved: given back unless [`release`](Self::release)d, so a
/// request dropped while it waits frees its place in the schedule for the next one.
pub(crate) struct Reservation {
    /// Its place in its key's schedule (none when the store reports no decision time).
    place: Option<Held>,
    /// Gives back what the request's other checks were charged (and, without a place, the
    /// shaped checks' charge too).
    give_back: Option<Box<dyn FnOnce() + Send>>,
    delay: Duration,
    _slot: WaitSlot,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl Reservation {
    /// How long the request waits.
    pub(crate) fn delay(&self) -> Duration {
        self.delay
    }

    /// The request's turn has come: the reservation is spent, not given back.
    pub(crate) fn release(mut self) {
        self.give_back = None;
        if let Some(place) = self.place.take() {
            place.spend();
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let place = self.place.take();
        let give_back = self.give_back.take();
        if place.is_none() && give_back.is_none() {
            return;
        }
        tracing::debug!(
            delay_ms = self.delay.as_millis() as u64,
            "shaped request dropped while waiting; its reservation is given back"
        );
        if let Some(place) = place {
            place.cancel();
        }
        if let Some(give_back) = give_back {
            give_back();
        }
    }
}

/// Gives back the charge of `checks` made at `at`; returns the store call to wait for when the
/// store answers later.
fn refund_call<St: Store>(
    snapshot: &Snapshot<St>,
    checks: &[OwnedCheck],
    at: Option<u64>,
) -> Option<PendingRefund> {
    let Some(at) = at else {
        tracing::warn!("the rate-limit store reports no decision time; a shaped request's reservation cannot be given back");
        return None;
    };
    if checks.is_empty() {
        return None;
    }
    let checks: Vec<LimitCheck<'_>> = checks.iter().map(OwnedCheck::as_check).collect();
    match snapshot.store.refund(&checks, at) {
        Checked::Ready(Ok(_)) => None,
        Checked::Ready(Err(error)) => {
            tracing::warn!(error = %error, "rate-limit store could not give a shaped reservation back");
            None
        }
        Checked::Pending(future) => Some(Box::pin(async move {
            if let Err(error) = future.await {
                tracing::warn!(error = %error, "rate-limit store could not give a shaped reservation back");
            }
        })),
    }
}

/// Gives back the charge of `checks` made at `at`, without waiting for the store.
fn give_back<St: Store>(snapshot: &Snapshot<St>, checks: &[OwnedCheck], at: Option<u64>) {
    let Some(pending) = refund_call(snapshot, checks, at) else {
        return;
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(pending);
        }
        Err(_) => {
            tracing::warn!("no Tokio runtime to give a shaped reservation back on; it is spent");
        }
    }
}

/// The schedules of a request's shaped checks.
fn schedule_keys(checks: &[OwnedCheck]) -> Vec<ScheduleKey> {
    checks.iter().map(|c| (c.limit, c.key.clone())).collect()
}

impl Waiting {
    /// Marks a request with the shaped checks `checks` as being decided by the store (see
    /// [`Schedules::deciding`]); `None` without shaped checks.
    pub(crate) fn deciding(&self, checks: &[OwnedCheck]) -> Option<Deciding> {
        if checks.is_empty() {
            return None;
        }
        Some(self.schedules.deciding(schedule_keys(checks)))
    }
}

/// Makes an allowed request that must wait `delay` wait: records its place in each shaped
/// limit's schedule, `waits` after the decision in the schedule of the limit it names (and
/// `delay` after it in the others), taking over an earlier place a dropped request freed if
/// there is one; records
/// the delay on the request and takes a place among the layer's waiting requests. When the
/// layer's bound on waiting requests is reached, frees the place, gives the other charges back
/// and answers the refusal instead. `deciding` is the request's mark from before the store
/// decided it.
// The refusal is rare (the layer bound is reached) and built once; boxing it buys nothing.
#[allow(clippy::too_many_arguments, clippy::result_large_err)]
pub(crate) fn reserve<St: Store, ReqBody>(
    waiting: &Waiting,
    rejection: &dyn crate::response::Rejection,
    snapshot: &Arc<Snapshot<St>>,
    req: &mut Request<ReqBody>,
    checks: (Vec<OwnedCheck>, Vec<OwnedCheck>),
    (at, deciding): (Option<u64>, Option<Deciding>),
    (delay, waits): (Duration, &[(usize, Duration)]),
    shaped: (&Decision, &Quota),
    decisions: &Decisions,
) -> Result<Reservation, Response<RejectionBody>> {
    let (decision, quota) = shaped;
    // The reservation's place in a shaped limit's schedule is its turn there, the wait that
    // limit gave it after the decision: a request dropped before that turn gives back its whole
    // place, however long it waited (refunded at the decision time, a wait longer than one
    // interval would read as refilled). The other limits were charged at the decision: given
    // back from then. `turn` is when the request goes (its longest wait).
    let turn = at.map(|at| at.saturating_add(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX)));
    let (shaped_checks, others) = checks;
    let snapshot = Arc::clone(snapshot);
    let (place, wait, shaped_checks) = match (at, turn) {
        (Some(at), Some(_)) if !shaped_checks.is_empty() => {
            let keys = schedule_keys(&shaped_checks);
            let deciding = match deciding {
                Some(d) if d.keys == keys => d,
                _ => waiting.schedules.deciding(keys.clone()),
            };
            // One place per shaped check, in its own limit and key's schedule, each given back
            // on its own (a check of cost 0 holds no place).
            let entries: Vec<Entry> = shaped_checks
                .into_iter()
                .filter(|c| c.cost > 0)
                .map(|check| {
                    let refund_snapshot = Arc::clone(&snapshot);
                    // Its own place in this limit's schedule: the wait this limit gave it.
                    let own = waits
                        .iter()
                        .find(|(limit, _)| *limit == check.limit)
                        .map_or(delay, |(_, w)| *w);
                    let turn =
                        at.saturating_add(u64::try_from(own.as_micros()).unwrap_or(u64::MAX));
                    Entry {
                        key: (check.limit, check.key.clone()),
                        cost: check.cost,
                        turn,
                        refund: Box::new(move || {
                            refund_call(&refund_snapshot, std::slice::from_ref(&check), Some(turn))
                        }),
                    }
                })
                .collect();
            let keys = entries.iter().map(|e| e.key.clone()).collect();
            let schedules = Arc::clone(&waiting.schedules);
            let (id, taken) = schedules.enter(deciding, at, entries);
            let wait = Duration::from_micros(taken.saturating_sub(at));
            (
                Some(Held {
                    schedules,
                    keys,
                    id,
                }),
                wait,
                Vec::new(),
            )
        }
        // No decision time: no place to keep (and nothing the store could refund).
        _ => (None, delay, shaped_checks),
    };
    let Some(slot) = waiting.enter() else {
        if let Some(place) = place {
            place.cancel();
        }
        give_back(&snapshot, &shaped_checks, turn);
        give_back(&snapshot, &others, at);
        tracing::debug!(policy = %decision.policy(), delay_ms = delay.as_millis() as u64, "too many requests waiting in this layer; shaped request refused");
        let refused = Decision::rejected(decision.limit(), 0, decision.reset(), delay)
            .with_policy(decision.policy());
        let reason = RejectReason::RateLimited {
            decision: &refused,
            quota,
        };
        let view = crate::request::RequestView::new(req);
        let rejected = Rejected::new(view, reason, decisions);
        let mut response = rejection.reject(&rejected);
        if let Some(secs) = rejected.retry_after_secs()
            && !response.headers().contains_key(http::header::RETRY_AFTER)
        {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
        }
        return Err(response);
    };
    tracing::debug!(policy = %decision.policy(), delay_ms = wait.as_millis() as u64, delay_us = wait.as_micros() as u64, "request shaped: it waits for its turn");
    req.extensions_mut().insert(ShapedDelay::new(wait));
    Ok(Reservation {
        place,
        give_back: Some(Box::new(move || {
            give_back(&snapshot, &shaped_checks, turn);
            give_back(&snapshot, &others, at);
        })),
        delay: wait,
        _slot: slot,
    })
}
