//! When Redis cannot decide (it failed, timed out, or its node's breaker is open), each limit's
//! [`FailurePolicy`] does: `Open` allows uncounted, `Closed` fails with a `Retry-After`, `Local`
//! asks a local in-memory limiter holding a share of the quota.

use std::sync::Arc;
use std::time::Duration;

use super::store::Inner;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::quota::Quota;
use crate::store::memory::MemoryStore;
use crate::store::{Decisions, FailurePolicy, LimitCheck, LimitSpec, PlanQuota, Store, MAX_LIMITS};

/// A check as the local fallback limiter takes it: its quota, if any, is scaled by the limit's
/// share when the fallback decides.
#[derive(Debug, Clone)]
pub(super) struct LocalCheck<'a> {
    check: LimitCheck<'a>,
    quota: Option<PlanQuota>,
}

impl<'a> From<&LimitCheck<'a>> for LocalCheck<'a> {
    fn from(c: &LimitCheck<'a>) -> Self {
        Self {
            check: LimitCheck::new(c.limit, c.key.clone(), c.cost),
            quota: c.quota.copied(),
        }
    }
}

impl LocalCheck<'_> {
    pub(super) fn into_owned(self) -> LocalCheck<'static> {
        LocalCheck {
            check: LimitCheck::new(
                self.check.limit,
                self.check.key.into_owned(),
                self.check.cost,
            ),
            quota: self.quota,
        }
    }
}

/// The local fallback limiter, whatever its clock.
pub(crate) trait LocalStore: Send + Sync + 'static {
    fn check_all(&self, checks: &[LimitCheck<'_>]) -> Result<Decisions, StoreError>;

    /// The fallback for a reconfigured store's limits, keeping the counters of those that stay.
    fn reconfigure(&self, specs: &[LimitSpec]) -> Result<Box<dyn LocalStore>, crate::ConfigError>;
}

impl<C: Clock> LocalStore for MemoryStore<C> {
    fn check_all(&self, checks: &[LimitCheck<'_>]) -> Result<Decisions, StoreError> {
        MemoryStore::check_all(self, checks)
    }

    fn reconfigure(&self, specs: &[LimitSpec]) -> Result<Box<dyn LocalStore>, crate::ConfigError> {
        Ok(Box::new(Store::reconfigure(self, specs)?))
    }
}

/// Why Redis could not decide when no call was made.
const BREAKER_OPEN: &str = "redis circuit breaker open after repeated failures";

/// What is known when Redis could not decide some (or all) limits.
pub(super) struct Fallback {
    limits: [usize; MAX_LIMITS],
    n: usize,
    /// The decisions made so far (by Redis), by check position.
    pub(super) got: [Option<Decision>; MAX_LIMITS],
    /// Why Redis could not decide the rest (`None`: its breaker is open).
    pub(super) error: Option<StoreError>,
}

impl Fallback {
    /// Nothing decided yet for checks of `limits` (the first `n`).
    pub(super) fn new(limits: [usize; MAX_LIMITS], n: usize) -> Self {
        Self {
            limits,
            n,
            got: [None; MAX_LIMITS],
            error: None,
        }
    }
}

impl Inner {
    /// Decides the limits Redis could not decide by their failure policies.
    pub(super) fn degrade(
        self: &Arc<Self>,
        mut fb: Fallback,
        checks: &[LocalCheck<'_>],
    ) -> Result<Decisions, StoreError> {
        let error = fb.error.take();
        let mut closed: Option<Duration> = None;
        let mut local_positions: Vec<usize> = Vec::new();
        let mut opened = 0;
        for i in 0..fb.n {
            if fb.got[i].is_some() {
                continue;
            }
            let info = &self.limits[fb.limits[i]];
            match self.policies[fb.limits[i]] {
                FailurePolicy::Closed { retry_after } => {
                    closed = Some(closed.map_or(retry_after, |c| c.max(retry_after)));
                }
                FailurePolicy::Local { .. } => local_positions.push(i),
                // Open (and any future policy) lets the request through, uncounted (the layer
                // writes no rate-limit headers for it).
                _ => {
                    opened += 1;
                    fb.got[i] = Some(Decision::uncounted(info.limit).with_policy(info.name));
                }
            }
        }
        if let Some(retry_after) = closed {
            self.stats.add_fail_closed();
            // The layer logs the refusal with this error; the call that failed logged its node.
            let err = error
                .unwrap_or_else(|| StoreError::new(StoreErrorKind::Unavailable, BREAKER_OPEN))
                .with_retry_after(retry_after);
            return Err(err);
        }
        if opened > 0 {
            self.stats.add_fail_open(opened);
            if let Some(error) = &error {
                tracing::warn!(error = %error, limits = opened, "redis could not decide; failing open");
            }
        }
        if local_positions.is_empty() {
            return Ok(collect(&fb));
        }
        self.stats.add_local_fallback(local_positions.len() as u64);
        let Some(local) = &self.local else {
            return Err(StoreError::new(
                StoreErrorKind::Other,
                "no local fallback store was built",
            ));
        };
        let subset: Vec<&LocalCheck<'_>> = local_positions
            .iter()
            .filter_map(|&i| checks.iter().find(|c| c.check.limit == fb.limits[i]))
            .collect();
        // A check at a plan's quota falls back to the limit's share of that quota.
        let mut shares: Vec<Option<PlanQuota>> = Vec::with_capacity(subset.len());
        for c in &subset {
            let share = match (c.quota, self.policies[c.check.limit]) {
                (Some(q), FailurePolicy::Local { share }) => {
                    let quota = local_share(q.quota(), share);
                    Some(PlanQuota::new(q.algorithm(), quota).map_err(|e| {
                        StoreError::new(
                            StoreErrorKind::Other,
                            format!("the local share of a plan's quota is invalid: {e}"),
                        )
                    })?)
                }
                _ => None,
            };
            shares.push(share);
        }
        let subset: Vec<LimitCheck<'_>> = subset
            .iter()
            .zip(&shares)
            .map(|(c, share)| match share {
                Some(q) => c.check.clone().with_quota(q),
                None => c.check.clone(),
            })
            .collect();
        let local = local.check_all(&subset)?;
        for (&p, d) in local_positions.iter().zip(local.as_slice()) {
            fb.got[p] = Some(*d);
        }
        Ok(collect(&fb))
    }
}

/// The decisions of every check, once each is decided.
pub(super) fn collect(fb: &Fallback) -> Decisions {
    let mut out = Decisions::new();
    for d in &fb.got[..fb.n] {
        out.push(d.expect("every limit decided"));
    }
    out
}

/// `share` (in (0, 1]) of `q`: its count and explicit burst, rounded down, at least 1.
pub(crate) fn local_share(q: &Quota, share: f64) -> Quota {
    let scale = |n: u64| ((n as f64 * share).floor() as u64).max(1);
    let mut local = Quota::per(q.period(), scale(q.count())).with_calendar(q.calendar());
    if q.has_explicit_burst() {
        local = local.burst(scale(q.burst_size()));
    }
    local
}
