//! [`HybridStore`]: decides from local leases, leases from Redis, remembers refusals.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Notify;

use super::lease_plan::LeasePlan;
use super::stats::HybridStats;
use super::table::Table;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::key::Key;
use crate::store::redis::{LeaseRequest, LeaseScript, RedisStore};
use crate::store::{Checked, Decisions, FailurePolicy, LimitCheck, LimitSpec, Store, MAX_LIMITS};

type BoxFuture = Pin<Box<dyn Future<Output = Result<Decisions, StoreError>> + Send + 'static>>;

/// How many times a check waits for a lease (its own or another request's) before it is checked
/// plainly: leases granted meanwhile may all go to other requests.
const ROUNDS: usize = 32;

/// How long a lease call may take before it counts as failed. Requests wait for it only as long
/// as the Redis store's timeout (then their failure policy decides); the call itself goes on, so
/// the units Redis leased are not lost to a slow round trip.
const LEASE_DEADLINE: std::time::Duration = std::time::Duration::from_millis(250);

/// A local tier in front of a [`RedisStore`]; built by [`HybridBackend`](super::HybridBackend),
/// see the [module docs](super).
///
/// Cloning is cheap; clones share the leases, the Redis store and the counters.
#[derive(Clone)]
pub struct HybridStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) redis: RedisStore,
    pub(crate) script: Option<LeaseScript>,
    pub(crate) plans: Vec<LeasePlan>,
    pub(crate) table: Table,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) stats: HybridStats,
    pub(crate) max_lease: f64,
    pub(crate) max_keys: usize,
}

impl std::fmt::Debug for HybridStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridStore")
            .field("redis", &self.inner.redis)
            .field("max_lease", &self.inner.max_lease)
            .field("stats", &self.inner.stats)
            .finish_non_exhaustive()
    }
}

impl HybridStore {
    pub(crate) fn from_inner(inner: Inner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The store's counters.
    pub fn stats(&self) -> HybridStats {
        self.inner.stats.clone()
    }

    /// The Redis store behind the local tier (its own [`stats`](RedisStore::stats), keys).
    pub fn redis(&self) -> &RedisStore {
        &self.inner.redis
    }

    /// Keys the local tier holds state for.
    pub fn local_keys(&self) -> usize {
        self.inner.table.len()
    }

    /// The largest lease (units) limit `limit` hands one instance, and how long (µs) a lease
    /// lives; `None` for a limit that does not lease (or an unknown index).
    pub fn lease_bounds(&self, limit: usize) -> Option<(u64, u64)> {
        let p = self.inner.plans.get(limit)?;
        p.leasable.then_some((p.max_units, p.ttl))
    }
}

/// The future of a check that needs Redis: a lease, a plain check, or the failure policies.
pub struct HybridFuture {
    inner: BoxFuture,
}

impl std::fmt::Debug for HybridFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HybridFuture")
    }
}

impl Future for HybridFuture {
    type Output = Result<Decisions, StoreError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

fn pending(
    f: impl Future<Output = Result<Decisions, StoreError>> + Send + 'static,
) -> Checked<HybridFuture> {
    Checked::Pending(HybridFuture { inner: Box::pin(f) })
}

/// What the local tier could do with a request. (`Decided` is inline on purpose: it is the hot
/// path, and boxing it would allocate per request.)
#[allow(clippy::large_enum_variant)]
enum Local {
    Decided(Decisions),
    /// Some limit needs a lease.
    Need,
    /// Check plainly (table full, key written at a plan's quota).
    Plain,
}

enum Step {
    Wait(Arc<Notify>),
    Ask(Arc<Notify>, Ask),
}

/// What one lease call sends besides the key (see [`LeaseRequest`]).
#[derive(Debug, Clone, Copy)]
struct Ask {
    want: u64,
    wait: u64,
    give: u64,
    given_at: u64,
    owed: u64,
    known_spent: u64,
    known_at: u64,
    known_until: u64,
}

enum FetchError {
    Plain,
    Store(StoreError),
}

fn owned(checks: &[LimitCheck<'_>]) -> Vec<LimitCheck<'static>> {
    checks
        .iter()
        .map(|c| LimitCheck::new(c.limit, c.key.clone().into_owned(), c.cost))
        .collect()
}

impl Store for HybridStore {
    type Future = HybridFuture;

    fn check(&self, checks: &[LimitCheck<'_>]) -> Checked<HybridFuture> {
        let inner = &self.inner;
        if checks.is_empty() {
            return Checked::Ready(Ok(Decisions::new()));
        }
        if !inner.leases(checks) {
            return inner.plain(checks);
        }
        let now = inner.clock.now_micros();
        match inner.try_local(checks, now, true) {
            Local::Decided(d) => Checked::Ready(Ok(d)),
            Local::Plain => inner.plain(checks),
            Local::Need => {
                let checks = owned(checks);
                pending(inner.clone().decide(checks))
            }
        }
    }

    /// Gives back what an allowed [`check`](Store::check) charged at `reserved_at` (its
    /// [`Decisions::decided_at`]). Units taken from a lease still held go back into it (they
    /// never left this instance); anything else is refunded in Redis by
    /// [`RedisStore`]'s refund, which never leaves a key fuller than a key that never saw the
    /// reservation.
    fn refund(&self, checks: &[LimitCheck<'_>], reserved_at: u64) -> Checked<HybridFuture> {
        let inner = &self.inner;
        if checks.is_empty() {
            return Checked::Ready(Ok(Decisions::new()));
        }
        let now = inner.clock.now_micros();
        let mut local = [None; MAX_LIMITS];
        let mut rest = Vec::new();
        for (i, c) in checks.iter().enumerate().take(MAX_LIMITS) {
            let limit = inner.plans.get(c.limit).map_or(0, |p| p.limit);
            if inner.leases(std::slice::from_ref(c))
                && let Some(mut slot) = inner.table.lock(c.limit, &c.key, now)
            {
                let e = slot.entry();
                if e.leased_at == reserved_at && now < e.expires {
                    e.units = e.units.saturating_add(c.cost);
                    local[i] = Some(e.allowed(now, limit));
                    continue;
                }
            }
            rest.push(i);
        }
        let n = checks.len().min(MAX_LIMITS);
        if rest.is_empty() {
            let mut out = Decisions::new();
            for d in &local[..n] {
                out.push(d.expect("every check refunded locally"));
            }
            return Checked::Ready(Ok(out));
        }
        let sub: Vec<LimitCheck<'static>> =
            owned(&rest.iter().map(|&i| checks[i].clone()).collect::<Vec<_>>());
        let redis = inner.redis.clone();
        pending(async move {
            let got = match redis.refund(&sub, reserved_at) {
                Checked::Ready(r) => r?,
                Checked::Pending(f) => f.await?,
            };
            let mut all = local;
            for (&i, d) in rest.iter().zip(got.as_slice()) {
                all[i] = Some(*d);
            }
            let mut out = Decisions::new();
            for d in &all[..n] {
                out.push(d.ok_or_else(|| {
                    StoreError::new(
                        StoreErrorKind::InvalidResponse,
                        "a refund left a limit unreported",
                    )
                })?);
            }
            if let Some(at) = got.decided_at() {
                out.set_decided_at(at);
            }
            Ok(out)
        })
    }

    /// A store deciding `limits` on the same Redis store (reconfigured: see
    /// [`RedisStore`]'s `reconfigure`), counters and settings. Local leases are not carried
    /// over: their units stay spent in Redis until they refill (under-admission only).
    fn reconfigure(&self, limits: &[LimitSpec]) -> Result<Self, ConfigError> {
        let old = &self.inner;
        let redis = old.redis.reconfigure(limits)?;
        let script = redis.lease_script();
        Ok(Self::from_inner(Inner {
            plans: limits
                .iter()
                .map(|s| LeasePlan::of(s, old.max_lease))
                .collect(),
            script,
            redis,
            table: Table::new(old.max_keys),
            clock: old.clock.clone(),
            stats: old.stats.clone(),
            max_lease: old.max_lease,
            max_keys: old.max_keys,
        }))
    }
}

impl Inner {
    /// Whether every check can be decided from leases: its limit leases and it carries no plan.
    fn leases(&self, checks: &[LimitCheck<'_>]) -> bool {
        self.script.is_some()
            && checks.len() <= MAX_LIMITS
            && checks.iter().all(|c| {
                c.quota.is_none()
                    && c.cost > 0
                    && self.plans.get(c.limit).is_some_and(|p| p.leasable)
            })
    }

    /// A plain check by the Redis store.
    fn plain(&self, checks: &[LimitCheck<'_>]) -> Checked<HybridFuture> {
        self.stats.add_plain();
        match self.redis.check(checks) {
            Checked::Ready(r) => Checked::Ready(r),
            Checked::Pending(f) => pending(f),
        }
    }

    /// Decides from the local tier alone when it can: every limit takes its cost from its lease
    /// (all or none), or a limit Redis refused is still refused. `record`: count the request in
    /// each key's demand.
    fn try_local(&self, checks: &[LimitCheck<'_>], now: u64, record: bool) -> Local {
        let mut taken: [Option<u64>; MAX_LIMITS] = [None; MAX_LIMITS];
        let mut got: [Option<Decision>; MAX_LIMITS] = [None; MAX_LIMITS];
        let mut refused = None;
        let mut need = false;
        for (i, c) in checks.iter().enumerate() {
            let plan = &self.plans[c.limit];
            let Some(mut slot) = self.table.lock(c.limit, &c.key, now) else {
                self.release(checks, &taken, now);
                return Local::Plain;
            };
            let e = slot.entry();
            if record {
                e.demand.record(now, plan.ttl, c.cost);
            }
            if e.plain {
                drop(slot);
                self.release(checks, &taken, now);
                return Local::Plain;
            }
            if e.refuses(now, c.cost) {
                got[i] = Some(e.rejected(now, plan.limit));
                refused = Some(i);
                break;
            }
            if need {
                continue;
            }
            if e.can_take(now, c.cost) {
                e.units -= c.cost;
                taken[i] = Some(e.leased_at);
                got[i] = Some(e.allowed(now, plan.limit));
            } else {
                need = true;
            }
        }
        if let Some(r) = refused {
            self.release(checks, &taken, now);
            let mut out = Decisions::new();
            for (i, c) in checks.iter().enumerate() {
                let plan = &self.plans[c.limit];
                let d = if i == r {
                    got[i].expect("the refusal")
                } else {
                    match self.table.lock(c.limit, &c.key, now) {
                        Some(mut slot) => slot.entry().standing(now, plan.limit),
                        None => Decision::allowed_with(plan.limit, 0, Default::default()),
                    }
                };
                out.push(d.with_policy(self.redis_name(c.limit)));
            }
            self.stats.add_local(false);
            return Local::Decided(out);
        }
        if need {
            self.release(checks, &taken, now);
            return Local::Need;
        }
        let mut out = Decisions::new();
        let mut at = u64::MAX;
        for (i, c) in checks.iter().enumerate() {
            out.push(got[i].expect("taken").with_policy(self.redis_name(c.limit)));
            at = at.min(taken[i].unwrap_or(u64::MAX));
        }
        out.set_decided_at(at);
        self.stats.add_local(true);
        Local::Decided(out)
    }

    fn redis_name(&self, limit: usize) -> crate::decision::Name {
        self.redis.name_of(limit).unwrap_or_default()
    }

    /// Puts back units taken for a request that is not admitted, into the lease they came from
    /// (a unit from a lease since replaced is dropped: it was charged, so that is safe).
    fn release(&self, checks: &[LimitCheck<'_>], taken: &[Option<u64>; MAX_LIMITS], now: u64) {
        for (c, t) in checks.iter().zip(taken) {
            let Some(at) = t else { continue };
            if let Some(mut slot) = self.table.lock(c.limit, &c.key, now) {
                let e = slot.entry();
                if e.leased_at == *at {
                    e.units = e.units.saturating_add(c.cost);
                }
            }
        }
    }

    /// The slow path: lease what is missing (or wait for the lease another request asked for),
    /// then decide locally; the failure policies when Redis cannot answer.
    async fn decide(
        self: Arc<Self>,
        checks: Vec<LimitCheck<'static>>,
    ) -> Result<Decisions, StoreError> {
        for _ in 0..ROUNDS {
            let now = self.clock.now_micros();
            for c in &checks {
                match self.fetch(c, now).await {
                    Ok(()) => {}
                    Err(FetchError::Plain) => return self.plain_now(&checks).await,
                    Err(FetchError::Store(e)) => return self.degrade(&checks, e),
                }
            }
            match self.try_local(&checks, self.clock.now_micros(), false) {
                Local::Decided(d) => return Ok(d),
                Local::Plain => return self.plain_now(&checks).await,
                Local::Need => {}
            }
        }
        self.plain_now(&checks).await
    }

    async fn plain_now(&self, checks: &[LimitCheck<'_>]) -> Result<Decisions, StoreError> {
        match self.plain(checks) {
            Checked::Ready(r) => r,
            Checked::Pending(f) => f.await,
        }
    }

    /// Makes sure `c`'s key has a lease for its cost, a refusal, or that a lease was just asked
    /// for: asks Redis unless another request already does (then waits for its answer).
    async fn fetch(self: &Arc<Self>, c: &LimitCheck<'static>, now: u64) -> Result<(), FetchError> {
        let plan = self.plans[c.limit];
        let step = {
            let Some(mut slot) = self.table.lock(c.limit, &c.key, now) else {
                return Err(FetchError::Plain);
            };
            let e = slot.entry();
            if e.plain {
                return Err(FetchError::Plain);
            }
            if e.can_take(now, c.cost) || e.refuses(now, c.cost) {
                return Ok(());
            }
            if let Some(n) = &e.fetching {
                Step::Wait(n.clone())
            } else {
                let want = plan.want(e.demand.estimate(now, plan.ttl), c.cost);
                let wait = plan.wait(want, c.cost);
                let give = e.units;
                let given_at = e.leased_at;
                e.units = 0;
                let owed = std::mem::take(&mut e.owed);
                let notify = Arc::new(Notify::new());
                e.fetching = Some(notify.clone());
                Step::Ask(
                    notify,
                    Ask {
                        want,
                        wait,
                        give,
                        given_at,
                        owed,
                        known_spent: e.known_spent,
                        known_at: e.known_at,
                        known_until: e.known_until,
                    },
                )
            }
        };
        let (notify, ask) = match step {
            Step::Ask(n, ask) => (n, ask),
            Step::Wait(n) => {
                // `notify_waiters` wakes the futures created before it, polled or not; the
                // fetcher clears `fetching` under the lock before notifying, so a fetch still
                // marked after this future exists will wake it.
                let notified = n.notified();
                let still = self.table.lock(c.limit, &c.key, now).is_some_and(|mut s| {
                    s.entry()
                        .fetching
                        .as_ref()
                        .is_some_and(|f| Arc::ptr_eq(f, &n))
                });
                if still {
                    let timeout = self.redis.wait_timeout();
                    if tokio::time::timeout(timeout, notified).await.is_err() {
                        return Err(FetchError::Store(StoreError::new(
                            StoreErrorKind::Timeout,
                            format!("redis did not answer within {timeout:?}"),
                        )));
                    }
                }
                return Ok(());
            }
        };
        let job = LeaseJob {
            inner: self.clone(),
            limit: c.limit,
            key: c.key.clone(),
            cost: c.cost,
            notify,
            ask,
            sent: now,
        };
        let timeout = self.redis.wait_timeout();
        // The call runs on its own, so a request that stops waiting (its timeout, or dropped)
        // never loses the units Redis leased: they land in the entry when the reply comes.
        if tokio::runtime::Handle::try_current().is_err() {
            return job.run().await;
        }
        let task = tokio::spawn(job.run());
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(FetchError::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                "the lease call stopped",
            ))),
            Err(_) => Err(FetchError::Store(StoreError::new(
                StoreErrorKind::Timeout,
                format!("redis did not answer within {timeout:?}"),
            ))),
        }
    }

    /// Decides by the failure policies (Redis could not be reached); what they admit for leasing
    /// limits is owed to Redis, charged with the key's next lease.
    fn degrade(&self, checks: &[LimitCheck<'_>], err: StoreError) -> Result<Decisions, StoreError> {
        let decisions = self.redis.decide_by_policy(checks, err)?;
        if decisions.allowed() {
            let now = self.clock.now_micros();
            for c in checks {
                let local = matches!(
                    self.redis.policy_of(c.limit),
                    Some(FailurePolicy::Local { .. })
                );
                if !local {
                    continue;
                }
                if let Some(mut slot) = self.table.lock(c.limit, &c.key, now) {
                    let e = slot.entry();
                    e.owed = e.owed.saturating_add(c.cost).min(self.plans[c.limit].limit);
                }
            }
        }
        Ok(decisions)
    }
}

/// One lease call and what it does with the answer.
struct LeaseJob {
    inner: Arc<Inner>,
    limit: usize,
    key: Key<'static>,
    cost: u64,
    notify: Arc<Notify>,
    ask: Ask,
    /// Local time the lease was asked at: its lifetime counts from then.
    sent: u64,
}

impl LeaseJob {
    async fn run(self) -> Result<(), FetchError> {
        let inner = &self.inner;
        let guard = FetchGuard {
            inner,
            limit: self.limit,
            key: &self.key,
            notify: self.notify.clone(),
        };
        let ask = self.ask;
        let plan = inner.plans[self.limit];
        let now = self.sent;
        let Some(script) = &inner.script else {
            return Err(FetchError::Plain);
        };
        let reply = inner
            .redis
            .lease(
                script,
                LeaseRequest {
                    limit: self.limit,
                    key: &self.key,
                    want: ask.want,
                    min: self.cost,
                    wait: ask.wait,
                    give: ask.give,
                    given_at: ask.given_at,
                    owed: ask.owed,
                    known_spent: ask.known_spent,
                    known_at: ask.known_at,
                    known_until: ask.known_until,
                },
                LEASE_DEADLINE,
            )
            .await;
        let Some(mut slot) = inner
            .table
            .lock(self.limit, &self.key, inner.clock.now_micros())
        else {
            return Err(FetchError::Plain);
        };
        let e = slot.entry();
        let result = match reply {
            Ok(Some(r)) => {
                inner.stats.add_lease(r.granted);
                let d = r.decision;
                e.reset_at = now.saturating_add(d.reset().as_micros() as u64);
                if !d.is_impossible() {
                    e.known_spent = plan.limit.saturating_sub(d.remaining());
                    e.known_at = r.now;
                    e.known_until = plan.known_until(r.now);
                }
                if r.granted > 0 {
                    // Units still held (a lease granted while this one was on the wire) are
                    // given back with the next lease, measured from the older time.
                    if e.units > 0 {
                        e.units = e.units.saturating_add(r.granted);
                        e.leased_at = e.leased_at.min(r.now);
                    } else {
                        e.units = r.granted;
                        e.leased_at = r.now;
                    }
                    e.expires = now.saturating_add(plan.lifetime(r.now));
                    e.shared_remaining = d.remaining();
                    e.refused_until = 0;
                    e.dry_until = plan
                        .dry_for(d.remaining(), self.cost, ask.wait)
                        .map_or(0, |dry| now.saturating_add(dry));
                    Ok(())
                } else if d.is_impossible() {
                    // The cost exceeds the capacity: the plain check says so.
                    Err(FetchError::Plain)
                } else {
                    let retry = d.retry_after().unwrap_or_default().as_micros() as u64;
                    e.refused_until = now.saturating_add(retry.max(1));
                    e.refused_remaining = d.remaining();
                    e.shared_remaining = d.remaining();
                    Ok(())
                }
            }
            Ok(None) => {
                e.plain = true;
                Err(FetchError::Plain)
            }
            Err(err) => {
                inner.stats.add_failure();
                e.owed = e.owed.saturating_add(ask.owed).min(plan.limit);
                Err(FetchError::Store(err))
            }
        };
        drop(slot);
        drop(guard);
        result
    }
}

/// Clears a key's `fetching` mark and wakes the requests waiting for it, also when the fetching
/// request is dropped mid-call.
struct FetchGuard<'a> {
    inner: &'a Arc<Inner>,
    limit: usize,
    key: &'a Key<'static>,
    notify: Arc<Notify>,
}

impl Drop for FetchGuard<'_> {
    fn drop(&mut self) {
        let now = self.inner.clock.now_micros();
        if let Some(mut slot) = self.inner.table.lock(self.limit, self.key, now) {
            let e = slot.entry();
            if e.fetching
                .as_ref()
                .is_some_and(|f| Arc::ptr_eq(f, &self.notify))
            {
                e.fetching = None;
            }
        }
        self.notify.notify_waiters();
    }
}
