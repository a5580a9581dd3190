//! [`RedisStore`]: the [`Store`] implementation.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::breaker::{Breaker, Breakers};
use super::conn::{
    slot_of_tag, BatchError, Handle, Job, LinkConfig, Links, NodeProbe, SlotCache, Target,
};
use super::keys::KeyEncoder;
use super::script::{
    decision, reply_ints, Group, Ints, LimitArg, LimitInfo, LuaScript, Mode, QuotaArg,
};
use super::stats::RedisStats;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::key::Key;
use crate::store::memory::MemoryStore;
use crate::store::{
    Checked, Decisions, FailurePolicy, LimitCheck, LimitSpec, PlanQuota, Store, MAX_LIMITS,
};

// Leases for the hybrid store: a child module, so it uses the connection handling below as is.
#[path = "lease.rs"]
pub(crate) mod lease;

type BoxFuture = Pin<Box<dyn Future<Output = Result<Decisions, StoreError>> + Send + 'static>>;

/// Limits decided by Redis, shared by every clone of a [`RedisStore`]. Built by
/// [`RedisBackend`](super::RedisBackend); see the [module docs](super).
///
/// Cloning is cheap and clones share the connection, counters and circuit breaker.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) limits: Vec<LimitInfo>,
    pub(crate) policies: Vec<FailurePolicy>,
    pub(crate) keys: KeyEncoder,
    pub(crate) script: Arc<LuaScript>,
    pub(crate) target: Target,
    pub(crate) cluster: bool,
    pub(crate) connect_timeout: Duration,
    pub(crate) timeout: Duration,
    pub(crate) breaker_threshold: u32,
    pub(crate) probe_interval: Duration,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) batching: Option<(usize, usize)>,
    pub(crate) local: Option<Box<dyn LocalStore>>,
    /// The backend's local fallback builder, until a store needs it (shared with the stores
    /// reconfigured from this one).
    pub(crate) local_builder: Arc<Mutex<Option<super::LocalBuilder>>>,
    // Everything below is shared (Arc) with the stores reconfigured from this one.
    pub(crate) stats: RedisStats,
    /// The connection (and batcher) of each tokio runtime the store is used from.
    pub(crate) links: Arc<Links>,
    /// One circuit breaker per node.
    pub(crate) breakers: Arc<Breakers>,
    /// The Cluster's slot map (empty for a single node, or until read), which picks a group's
    /// breaker and batcher; read again at most once per probe interval.
    pub(crate) slots: Arc<SlotCache>,
    /// Set once Redis has answered; until then calls may take `connect_timeout`.
    pub(crate) connected: Arc<AtomicBool>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.inner;
        f.debug_struct("RedisStore")
            .field("cluster", &i.cluster)
            .field(
                "limits",
                &i.limits.iter().map(|l| l.name).collect::<Vec<_>>(),
            )
            .field("timeout", &i.timeout)
            .field("stats", &i.stats)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    pub(crate) fn from_inner(inner: Inner) -> Self {
        let store = Self {
            inner: Arc::new(inner),
        };
        // Built inside a runtime (the usual case): connect and load the script now, so the first
        // request does not pay for it within its tight timeout.
        if tokio::runtime::Handle::try_current().is_ok() {
            let _ = store.inner.handle();
        }
        store
    }

    /// The store's counters (failure policies, timeouts, circuit breaker, batching).
    pub fn stats(&self) -> RedisStats {
        self.inner.stats.clone()
    }

    /// The Redis key that holds limit `limit`'s state for `key` (for inspection and tests).
    ///
    /// Returns `None` if `limit` is not a configured limit index.
    pub fn redis_key(&self, limit: usize, key: &Key<'_>) -> Option<String> {
        let info = self.inner.limits.get(limit)?;
        Some(
            self.inner
                .keys
                .encode(info.short, &info.name_enc, key, &mut Vec::new())
                .key,
        )
    }
}

/// The future of a Redis-backed check: a decision within the timeout, or the failure policies'
/// answer.
pub struct RedisFuture {
    inner: BoxFuture,
}

impl std::fmt::Debug for RedisFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisFuture")
    }
}

impl Future for RedisFuture {
    type Output = Result<Decisions, StoreError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl Store for RedisStore {
    type Future = RedisFuture;

    fn check(&self, checks: &[LimitCheck<'_>]) -> Checked<RedisFuture> {
        let inner = &self.inner;
        if checks.is_empty() {
            return Checked::Ready(Ok(Decisions::new()));
        }
        if let Err(e) = inner.validate(checks) {
            return Checked::Ready(Err(e));
        }
        let now = inner.clock.as_ref().map(|c| unix_micros(&**c));
        let mut limits = [0usize; MAX_LIMITS];
        for (slot, c) in limits.iter_mut().zip(checks) {
            *slot = c.limit;
        }
        let n = checks.len();
        let node = inner.breakers.default_breaker();
        if !inner.cluster && node.is_open() {
            inner.stats.add_short_circuited();
            crate::metrics::record_store_error(StoreErrorKind::Unavailable);
            inner.spawn_probe(node, None);
            tracing::debug!("redis circuit breaker open; deciding by failure policy");
            let local: Vec<LocalCheck<'_>> = checks.iter().map(LocalCheck::from).collect();
            return Checked::Ready(inner.degrade(Fallback::new(limits, n), &local));
        }
        let plan = inner.plan(checks, now, None);
        let local: Vec<LocalCheck<'static>> = checks
            .iter()
            .filter(|c| matches!(inner.policies[c.limit], FailurePolicy::Local { .. }))
            .map(|c| LocalCheck::from(c).into_owned())
            .collect();
        Checked::Pending(RedisFuture {
            inner: Box::pin(inner.clone().run(plan, (limits, n), local)),
        })
    }

    /// Gives back what an allowed [`check`](Store::check) of the same `checks` charged at
    /// `reserved_at` (its [`Decisions::decided_at`]: Redis `TIME`, or the store's clock),
    /// applied at the time of the refund, each limit at its check's quota: the refund script the
    /// store already runs for a Cluster request rejected in another slot (see [the module
    /// docs](super#several-limits-per-request)). A refund gives back only what its reservation
    /// still takes, so a late one never lets a limit admit more than its quota.
    ///
    /// On a Cluster, checks in several hash slots are refunded slot by slot, concurrently. When
    /// Redis cannot be reached (or its circuit breaker is open) the refund fails with the error
    /// and the units stay spent until they refill ([`RedisStats::refund_failures`]): failure
    /// policies decide checks, not refunds.
    fn refund(&self, checks: &[LimitCheck<'_>], reserved_at: u64) -> Checked<RedisFuture> {
        let inner = &self.inner;
        if checks.is_empty() {
            return Checked::Ready(Ok(Decisions::new()));
        }
        if let Err(e) = inner.validate(checks) {
            return Checked::Ready(Err(e));
        }
        let now = inner.clock.as_ref().map(|c| unix_micros(&**c));
        let plan = inner.plan(checks, now, Some(reserved_at));
        Checked::Pending(RedisFuture {
            inner: Box::pin(inner.clone().give_back(plan, checks.len())),
        })
    }

    /// A store deciding `limits` on the same connections, circuit breakers, statistics and
    /// settings (and the local fallback's counters, for `Local` limits of the same name), with
    /// its own script. Redis keys are named by the limit's name and algorithm, so every limit of
    /// the same name and algorithm keeps its counters; a limit whose quota changed keeps what
    /// each key spent (as a plan change does: see [`PlanQuota`]), new limits start fresh, and
    /// the keys of limits that are gone expire.
    ///
    /// ```no_run
    /// use tollgate::store::redis::RedisBackend;
    /// use tollgate::store::{Backend, FailurePolicy, LimitSpec, Store};
    /// use tollgate::{AlgorithmKind, PolicyName, Quota};
    ///
    /// # fn demo() -> Result<(), tollgate::ConfigError> {
    /// let api = |q| {
    ///     LimitSpec::new(PolicyName::new("api"), q, AlgorithmKind::FixedWindow)
    ///         .on_store_error(FailurePolicy::Open)
    /// };
    /// let store = RedisBackend::new("redis://127.0.0.1:6379").build(&[api(Quota::per_minute(5))])?;
    /// // Raised to 10 per minute: a key that spent 5 this minute has 5 left, not 10.
    /// let raised = store.reconfigure(&[api(Quota::per_minute(10))])?;
    /// # let _ = raised;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A limit whose quota changed is read, in keys it has not written since, as the store it
    /// was reconfigured from wrote them; a store built afresh reads them at its own quota.
    fn reconfigure(&self, limits: &[LimitSpec]) -> Result<Self, crate::ConfigError> {
        let old = &self.inner;
        let mut compiled = super::compile_limits(limits)?;
        for info in &mut compiled.infos {
            if let Some(earlier) = old
                .limits
                .iter()
                .find(|o| o.name == info.name && o.algorithm == info.algorithm)
            {
                info.inherit(earlier);
            }
        }
        let local = if compiled.any_local {
            Some(match &old.local {
                Some(local) => local.reconfigure(&compiled.local_specs)?,
                None => {
                    let builder = old
                        .local_builder
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take();
                    super::build_local(builder, &compiled.local_specs)?
                }
            })
        } else {
            None
        };
        let script = Arc::new(LuaScript::assemble(
            &compiled
                .infos
                .iter()
                .map(|info| (info.algorithm, info.params))
                .collect::<Vec<_>>(),
        ));
        let store = Self {
            inner: Arc::new(Inner {
                limits: compiled.infos,
                policies: compiled.policies,
                keys: old.keys.clone(),
                script,
                target: old.target.clone(),
                cluster: old.cluster,
                connect_timeout: old.connect_timeout,
                timeout: old.timeout,
                breaker_threshold: old.breaker_threshold,
                probe_interval: old.probe_interval,
                clock: old.clock.clone(),
                batching: old.batching,
                local,
                local_builder: old.local_builder.clone(),
                stats: old.stats.clone(),
                links: old.links.clone(),
                breakers: old.breakers.clone(),
                slots: old.slots.clone(),
                connected: old.connected.clone(),
            }),
        };
        store.inner.load_script();
        Ok(store)
    }
}

/// A check as the local fallback limiter takes it: its quota, if any, is scaled by the limit's
/// share when the fallback decides.
#[derive(Debug, Clone)]
struct LocalCheck<'a> {
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
    fn into_owned(self) -> LocalCheck<'static> {
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

/// One script call of a request: a group of its checks and the node that decides them.
struct Planned {
    group: Group,
    /// The breaker of its node and the node's address (`None`: the single node, or a Cluster
    /// node not known yet).
    node: (Arc<Breaker>, Option<String>),
    /// The hash slot of its keys (Cluster; 0 on a single node).
    slot: u16,
    /// The check index of each of its limits; empty when the group holds every check in order
    /// (a single node's one group, or a Cluster request whose keys share a slot).
    positions: Vec<usize>,
}

/// Which groups a request's checks fall in: one group (a single node, or one hash slot), which
/// takes no allocation beyond the group's own, or several (a Cluster request over several slots).
enum Plan {
    One(Planned),
    Several(Vec<Planned>),
}

/// A group as Redis answered it, with its check positions (empty: every check, in order).
type Reply = (Group, Vec<usize>, Result<Ints, StoreError>);

/// The replies of a plan's groups, in its order.
type Replies = std::iter::Chain<std::option::IntoIter<Reply>, std::vec::IntoIter<Reply>>;

/// The check index of each limit of `group`, from its `positions` (empty: every check in order).
fn positions_of<'p>(group: &Group, positions: &'p [usize]) -> &'p [usize] {
    if positions.is_empty() {
        &IDENTITY[..group.len()]
    } else {
        positions
    }
}

thread_local! {
    /// The buffer a request's keys are encoded in (see [`KeyEncoder::encode`]), kept per thread
    /// so that planning a request allocates nothing for it.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The largest [`SCRATCH`] kept between requests, in bytes.
const SCRATCH_KEEP: usize = 4096;

/// Check positions of a single node's one group.
const IDENTITY: [usize; MAX_LIMITS] = {
    let mut a = [0; MAX_LIMITS];
    let mut i = 0;
    while i < MAX_LIMITS {
        a[i] = i;
        i += 1;
    }
    a
};

/// A group Redis charged.
struct Applied {
    group: Group,
    now: u64,
    positions: Vec<usize>,
}

/// What is known when Redis could not decide some (or all) limits.
struct Fallback {
    limits: [usize; MAX_LIMITS],
    n: usize,
    got: [Option<Decision>; MAX_LIMITS],
    error: Option<StoreError>,
    /// Groups Redis charged, with the time it used and their check positions: refunded if the
    /// request ends up rejected.
    applied: Vec<Applied>,
}

impl Fallback {
    /// Nothing decided yet for checks of `limits` (the first `n`).
    fn new(limits: [usize; MAX_LIMITS], n: usize) -> Self {
        Self {
            limits,
            n,
            got: [None; MAX_LIMITS],
            error: None,
            applied: Vec::new(),
        }
    }
}

impl Inner {
    fn link_config(&self) -> LinkConfig<'_> {
        LinkConfig {
            target: &self.target,
            connect_timeout: self.connect_timeout,
            batching: self.batching,
            stats: &self.stats,
            slots: self.cluster.then_some(&self.slots),
        }
    }

    /// Refuses checks no configuration can decide: too many, an unknown limit index, or a quota
    /// for another algorithm than its limit's.
    fn validate(&self, checks: &[LimitCheck<'_>]) -> Result<(), StoreError> {
        if checks.len() > MAX_LIMITS || checks.iter().any(|c| c.limit >= self.limits.len()) {
            return Err(StoreError::new(
                StoreErrorKind::Other,
                format!(
                    "{} checks for {} configured limits (at most {MAX_LIMITS})",
                    checks.len(),
                    self.limits.len()
                ),
            ));
        }
        for c in checks {
            let info = &self.limits[c.limit];
            if let Some(q) = c.quota {
                if q.algorithm() != info.algorithm {
                    return Err(StoreError::new(
                        StoreErrorKind::Other,
                        format!(
                            "limit {:?} is decided by {}, but its check carries a quota for {} ({:?}); a plan's quota must use its limit's algorithm: build it with PlanQuota::new(AlgorithmKind::{:?}, ..)",
                            info.name.as_str(),
                            info.algorithm,
                            q.algorithm(),
                            q.quota(),
                            info.algorithm,
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Loads this store's script on the current runtime's connection, in the background (a
    /// reconfigured store shares a connection that was warmed up with another script). Without
    /// it, the first call sends the script (`NOSCRIPT`, then `EVAL`).
    fn load_script(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let Ok(handle) = self.handle() else {
            return;
        };
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(self.script.code());
        tokio::spawn(async move {
            if let Err(e) = handle.conn.query(&load).await {
                tracing::debug!(error = %e, "loading the reconfigured script failed; the first call will send it");
            }
        });
    }

    /// The connection of the current runtime. A new one is warmed up in the background: the
    /// script is loaded, `maxmemory-policy` checked and (Cluster) the slot map read.
    fn handle(self: &Arc<Self>) -> Result<Handle, StoreError> {
        let (handle, fresh) = self.links.get(&self.link_config())?;
        if fresh {
            self.connected.store(false, Ordering::Relaxed);
            let weak = Arc::downgrade(self);
            let conn = handle.conn.clone();
            tokio::spawn(async move {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD");
                if let Some(inner) = weak.upgrade() {
                    // The slot map first: `SCRIPT LOAD` goes to every master of a Cluster and
                    // fails while one is down, and without the map every check would share the
                    // breaker of unknown nodes.
                    if inner.cluster {
                        inner.refresh_slots(&conn).await;
                    }
                    load.arg(inner.script.code());
                } else {
                    return;
                }
                match conn.query(&load).await {
                    Ok(_) => {
                        if let Some(inner) = weak.upgrade() {
                            inner.connected.store(true, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "redis warm-up failed; the first request will retry");
                        return;
                    }
                }
                super::memory_policy::check(&conn, &weak).await;
            });
        }
        Ok(handle)
    }

    /// Replaces the current runtime's connection `generation` (a Cluster connection that stopped
    /// answering while its nodes answer a probe; see [`Links::rebuild`]) and reads the slot map
    /// on the new one. Returns the new connection's handle, or `None` if that connection was
    /// already replaced or a new one could not be opened.
    async fn rebuild(self: &Arc<Self>, generation: u64) -> Option<Handle> {
        match self.links.rebuild(&self.link_config(), generation) {
            Ok(Some(handle)) => {
                tracing::warn!(
                    "the redis cluster connection stopped answering while its nodes answer; replaced it with a new one"
                );
                self.refresh_slots(&handle.conn).await;
                Some(handle)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "could not replace the redis cluster connection");
                None
            }
        }
    }

    /// Whether `conn` answers within the connect timeout, for `slot` (see
    /// [`Conn::responsive`](super::conn::Conn::responsive)).
    async fn answers(&self, conn: &super::conn::Conn, slot: Option<u16>) -> bool {
        matches!(
            tokio::time::timeout(self.connect_timeout, conn.responsive(slot)).await,
            Ok(true)
        )
    }

    /// Reads the Cluster's slot map again (at most once per probe interval).
    async fn refresh_slots(&self, conn: &super::conn::Conn) {
        self.slots.refresh(conn).await;
    }

    /// The breaker (and address) of the node serving `tag`'s slot.
    fn node_of(&self, tag: &[u8]) -> (Arc<Breaker>, Option<String>) {
        match self.slots.map().node(slot_of_tag(tag)) {
            Some(addr) => (self.breakers.node(addr), Some(addr.to_owned())),
            None => (self.breakers.default_breaker().clone(), None),
        }
    }

    /// The script call(s) for `checks`: a check (`reserved_at` `None`) or a refund of a check
    /// charged at `reserved_at`.
    fn plan(&self, checks: &[LimitCheck<'_>], now: Option<u64>, reserved_at: Option<u64>) -> Plan {
        SCRATCH.with_borrow_mut(|scratch| {
            let plan = self.plan_in(checks, now, reserved_at, scratch);
            // A huge key may have grown the buffer: keep it small for the next request.
            if scratch.capacity() > SCRATCH_KEEP {
                *scratch = Vec::new();
            }
            plan
        })
    }

    fn plan_in(
        &self,
        checks: &[LimitCheck<'_>],
        now: Option<u64>,
        reserved_at: Option<u64>,
        scratch: &mut Vec<u8>,
    ) -> Plan {
        let arg = |c: &LimitCheck<'_>| LimitArg {
            limit: c.limit,
            cost: c.cost,
            quota: quota_arg(c, &self.limits[c.limit]),
        };
        if !self.cluster || checks.len() == 1 {
            // On a single node every limit goes in one script call, whatever its slot; so does
            // a Cluster request of one limit.
            let mut group = Group {
                keys: Vec::with_capacity(checks.len()),
                limits: Vec::with_capacity(checks.len()),
                now,
                reserved_at,
            };
            let mut tag = [0u8; 16];
            for c in checks {
                let info = &self.limits[c.limit];
                let enc = self
                    .keys
                    .encode(info.short, &info.name_enc, &c.key, scratch);
                tag = enc.tag;
                group.keys.push(enc.key);
                group.limits.push(arg(c));
            }
            let (node, slot) = if self.cluster {
                (self.node_of(&tag), slot_of_tag(&tag))
            } else {
                ((self.breakers.default_breaker().clone(), None), 0)
            };
            return Plan::One(Planned {
                group,
                node,
                slot,
                positions: Vec::new(),
            });
        }
        let mut planned: Vec<Planned> = Vec::with_capacity(1);
        let mut tags: Vec<[u8; 16]> = Vec::with_capacity(1);
        for (i, c) in checks.iter().enumerate() {
            let info = &self.limits[c.limit];
            let enc = self
                .keys
                .encode(info.short, &info.name_enc, &c.key, scratch);
            let g = match tags.iter().position(|t| *t == enc.tag) {
                Some(g) => g,
                None => {
                    tags.push(enc.tag);
                    planned.push(Planned {
                        group: Group {
                            now,
                            reserved_at,
                            ..Group::default()
                        },
                        node: self.node_of(&enc.tag),
                        slot: slot_of_tag(&enc.tag),
                        positions: Vec::with_capacity(checks.len()),
                    });
                    planned.len() - 1
                }
            };
            let p = &mut planned[g];
            p.group.keys.push(enc.key);
            p.group.limits.push(arg(c));
            p.positions.push(i);
        }
        if planned.len() == 1 {
            let mut one = planned.pop().expect("one group");
            one.positions.clear(); // every check, in order
            return Plan::One(one);
        }
        Plan::Several(planned)
    }

    /// Decides `plan`, whose checks are of `limits` (the first `n`): by Redis, and by their
    /// failure policies those Redis could not decide (`local`: those of a local fallback).
    async fn run(
        self: Arc<Self>,
        plan: Plan,
        (limits, n): ([usize; MAX_LIMITS], usize),
        local: Vec<LocalCheck<'static>>,
    ) -> Result<Decisions, StoreError> {
        let several = matches!(plan, Plan::Several(_));
        let replies = self.call_groups(plan, Mode::Check).await;
        // Built after the call, so the future does not carry it while it waits.
        let mut fb = Fallback::new(limits, n);
        // The earliest time Redis decided a group at (each master of a Cluster reads its own).
        let mut decided_at: Option<u64> = None;
        for (group, positions, result) in replies {
            let positions = positions_of(&group, &positions);
            let parsed =
                result.and_then(|ints| self.parse_group(&group, positions, &ints, &mut fb.got));
            if let Ok((now, _)) = parsed {
                decided_at = Some(decided_at.map_or(now, |at| at.min(now)));
            }
            match parsed {
                // Only a request split over several slots can need a refund.
                Ok((now, true)) if several => fb.applied.push(Applied {
                    group,
                    now,
                    positions: positions.to_vec(),
                }),
                Ok(_) => {}
                Err(e) => {
                    for &p in positions {
                        fb.got[p] = None;
                    }
                    fb.error.get_or_insert(e);
                }
            }
        }
        let applied = std::mem::take(&mut fb.applied);
        let mut result = if fb.error.is_none() {
            let mut decisions = collect(&fb);
            // Only when Redis decided every limit: a limit decided by its failure policy was
            // not charged in Redis, and a refund must not give back what was never taken.
            if let Some(at) = decided_at {
                decisions.set_decided_at(at);
            }
            Ok(decisions)
        } else {
            self.degrade(fb, &local)
        };
        let rejected = result.as_ref().map_or(true, |d| !d.allowed());
        if rejected && !applied.is_empty() {
            // Boxed, as rare and large (see `call_one`).
            Box::pin(self.refund(applied, &mut result)).await;
        }
        result
    }

    /// [`Store::refund`]: sends each group's refund (concurrently on a Cluster) and reports every
    /// limit as it stands after it. Fails with the first error; the groups that answered were
    /// refunded all the same.
    async fn give_back(self: Arc<Self>, plan: Plan, n: usize) -> Result<Decisions, StoreError> {
        let replies = self.call_groups(plan, Mode::Refund).await;
        let mut got = [None; MAX_LIMITS];
        let mut error = None;
        let mut at: Option<u64> = None;
        for (group, positions, result) in replies {
            let positions = positions_of(&group, &positions);
            let parsed =
                result.and_then(|ints| self.parse_group(&group, positions, &ints, &mut got));
            self.stats.add_refund(parsed.is_ok());
            match parsed {
                Ok((now, _)) => at = Some(at.map_or(now, |a| a.min(now))),
                Err(e) => {
                    tracing::warn!(keys = ?group.keys, error = %e, "could not refund a reservation; it stays spent until it refills");
                    error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        let mut decisions = Decisions::new();
        for d in &got[..n] {
            decisions.push(d.ok_or_else(|| {
                StoreError::new(
                    StoreErrorKind::InvalidResponse,
                    "a refund left a limit unreported",
                )
            })?);
        }
        if let Some(at) = at {
            decisions.set_decided_at(at);
        }
        Ok(decisions)
    }

    /// Gives back what Redis charged for a request that is, as a whole, not allowed (Cluster,
    /// limits in several slots), and reports the refunded limits as they now stand.
    async fn refund(
        self: &Arc<Self>,
        applied: Vec<Applied>,
        result: &mut Result<Decisions, StoreError>,
    ) {
        // Applied now (the store's clock, or the server's TIME in the script), as of the
        // reservation's time: the buckets give back only what has not refilled since.
        let now = self.clock.as_ref().map(|c| unix_micros(&**c));
        let calls = applied.iter().map(|a| {
            let mut group = a.group.clone();
            group.now = now;
            group.reserved_at = Some(a.now);
            async move {
                let conn = self.handle().ok()?.conn;
                let value = tokio::time::timeout(
                    self.timeout,
                    conn.eval(&self.script, Mode::Refund, std::iter::once(&group)),
                )
                .await
                .ok()?
                .ok()?;
                reply_ints(value).ok()
            }
        });
        let replies = futures_util::future::join_all(calls).await;
        for (a, reply) in applied.iter().zip(replies) {
            self.stats.add_refund(reply.is_some());
            let Some(ints) = reply else {
                tracing::warn!(
                    keys = ?a.group.keys,
                    "could not refund a reservation; it stays spent until it refills"
                );
                continue;
            };
            if let Ok(decisions) = result {
                let mut got = [None; MAX_LIMITS];
                if self
                    .parse_group(&a.group, &a.positions, &ints, &mut got)
                    .is_ok()
                {
                    for &p in &a.positions {
                        if let Some(d) = got[p] {
                            decisions.as_mut_slice()[p] = d;
                        }
                    }
                }
            }
        }
    }

    /// Parses one group's reply into `got`; returns the time it used and whether it charged.
    fn parse_group(
        &self,
        group: &Group,
        positions: &[usize],
        ints: &[i64],
        got: &mut [Option<Decision>; MAX_LIMITS],
    ) -> Result<(u64, bool), StoreError> {
        if ints.len() != group.reply_len() {
            return Err(StoreError::new(
                StoreErrorKind::InvalidResponse,
                format!(
                    "expected {} integers, got {}",
                    group.reply_len(),
                    ints.len()
                ),
            ));
        }
        let now = u64::try_from(ints[0]).unwrap_or(0);
        let mut all = true;
        for (j, (&p, l)) in positions.iter().zip(&group.limits).enumerate() {
            let info = &self.limits[l.limit];
            let (d, corrupt) = decision(info, l.reported_limit(info), &ints[1 + 5 * j..6 + 5 * j])?;
            if corrupt {
                self.stats.add_corrupt_reset();
                tracing::warn!(
                    policy = %info.name,
                    key = %group.keys[j],
                    "rate-limit key held unreadable state; it was reset to a fresh key"
                );
            }
            all &= d.allowed();
            got[p] = Some(d);
        }
        Ok((now, all))
    }

    /// Sends every group within the timeout: a check joins its node's batcher (each master's on
    /// a Cluster), a refund goes on its own. A group whose node's breaker is open is not sent: it
    /// fails at once.
    async fn call_groups(self: &Arc<Self>, plan: Plan, mode: Mode) -> Replies {
        match plan {
            Plan::One(p) => {
                let (group, result) = self.call_one(p.group, p.node, p.slot, mode).await;
                Some((group, p.positions, result))
                    .into_iter()
                    .chain(Vec::new())
            }
            Plan::Several(planned) => {
                let replies =
                    futures_util::future::join_all(planned.into_iter().map(|p| async move {
                        let (group, result) = self.call_one(p.group, p.node, p.slot, mode).await;
                        (group, p.positions, result)
                    }))
                    .await;
                None.into_iter().chain(replies)
            }
        }
    }

    async fn call_one(
        self: &Arc<Self>,
        group: Group,
        (breaker, addr): (Arc<Breaker>, Option<String>),
        slot: u16,
        mode: Mode,
    ) -> (Group, Result<Ints, StoreError>) {
        if breaker.is_open() {
            self.stats.add_short_circuited();
            self.spawn_probe(&breaker, addr);
            let err = StoreError::new(
                StoreErrorKind::Unavailable,
                "circuit breaker open for this redis node",
            );
            crate::metrics::record_store_error(err.kind());
            return (group, Err(err));
        }
        // Until Redis has answered once, a call may also wait for the connection to be set up.
        let timeout = if self.connected.load(Ordering::Relaxed) {
            self.timeout
        } else {
            self.timeout.max(self.connect_timeout)
        };
        let timer = crate::metrics::RedisTimer::start(); // metrics: the round trip
        let (group, result) = match self.handle() {
            Err(e) => (group, Err(CallError::Store(e))),
            Ok(handle) => match &handle.batchers {
                // The batcher coalesces checks; a refund goes on its own, and so does a check
                // for a Cluster node not known yet (the slot map is read in the background).
                Some(batchers) if mode == Mode::Check && (!self.cluster || addr.is_some()) => {
                    let batcher = batchers.get(addr.as_deref().unwrap_or(""));
                    self.send_batched(&batcher, group, slot, timeout).await
                }
                // Boxed: its future (a timer and the connection's) is large, and would make
                // every batched call's future as large, which is moved as it is polled.
                _ => {
                    Box::pin(async {
                        let result = match tokio::time::timeout(
                            timeout,
                            self.send(&handle.conn, &group, mode),
                        )
                        .await
                        {
                            Ok(r) => r,
                            Err(_) => Err(CallError::Timeout),
                        };
                        (group, result)
                    })
                    .await
                }
            },
        };
        timer.finish();
        let result = match result {
            Ok(ints) => {
                breaker.on_success();
                self.connected.store(true, Ordering::Relaxed);
                Ok(ints)
            }
            Err(e) => {
                let timed_out = matches!(e, CallError::Timeout);
                let err = e.into_store_error(timeout);
                crate::metrics::record_store_error(err.kind());
                tracing::warn!(error = %err, node = addr.as_deref().unwrap_or(""), "redis rate-limit call failed");
                self.stats.on_failure(timed_out);
                if breaker.on_failure(self.breaker_threshold, &self.stats) {
                    tracing::warn!(
                        threshold = self.breaker_threshold,
                        node = addr.as_deref().unwrap_or(""),
                        "redis circuit breaker opened; deciding by failure policy until a probe succeeds"
                    );
                    self.spawn_probe(&breaker, addr);
                }
                Err(err)
            }
        };
        (group, result)
    }

    /// One script call for one group, on the shared connection.
    async fn send(
        &self,
        conn: &super::conn::Conn,
        group: &Group,
        mode: Mode,
    ) -> Result<Ints, CallError> {
        let value = conn
            .eval(&self.script, mode, std::iter::once(group))
            .await
            .map_err(|e| CallError::Redis(e.to_string(), kind_of(&e)))?;
        let ints = reply_ints(value).map_err(CallError::Store)?;
        Ints::from_slice(&ints).ok_or_else(|| {
            CallError::Store(StoreError::new(
                StoreErrorKind::InvalidResponse,
                format!("{} integers in a reply", ints.len()),
            ))
        })
    }

    /// The group joins the batcher's next script call. If the caller gives up (timeout), the
    /// batcher skips the group unless it was already sent.
    async fn send_batched(
        &self,
        batcher: &mpsc::UnboundedSender<Job>,
        group: Group,
        slot: u16,
        timeout: Duration,
    ) -> (Group, Result<Ints, CallError>) {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            group,
            script: self.script.clone(),
            // The timeout is at most MAX_TIMEOUT (checked at build time); checked anyway.
            deadline: deadline_after(timeout),
            slot,
            reply: tx,
        };
        if let Err(mpsc::error::SendError(job)) = batcher.send(job) {
            let err = StoreError::new(StoreErrorKind::Unavailable, "the redis batcher stopped");
            return (job.group, Err(CallError::Store(err)));
        }
        // No timer here: the batcher answers every job by its deadline.
        match rx.await {
            Ok((group, Ok(ints))) => (group, Ok(ints)),
            Ok((group, Err(BatchError::Timeout))) => (group, Err(CallError::Timeout)),
            Ok((group, Err(BatchError::Redis(e)))) => {
                (group, Err(CallError::Redis(e.to_string(), kind_of(&e))))
            }
            Ok((group, Err(BatchError::Invalid(msg)))) => (
                group,
                Err(CallError::Store(StoreError::new(
                    StoreErrorKind::InvalidResponse,
                    msg,
                ))),
            ),
            // The group went with the job; the caller only needs it to refund a group Redis
            // charged, which this one was not.
            Err(_) => (
                Group::default(),
                Err(CallError::Store(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "the redis batcher dropped the call",
                ))),
            ),
        }
    }

    /// Decides the limits Redis could not decide by their failure policies.
    fn degrade(
        self: &Arc<Self>,
        mut fb: Fallback,
        checks: &[LocalCheck<'_>],
    ) -> Result<Decisions, StoreError> {
        let error = fb.error.take();
        let reason = error
            .as_ref()
            .map_or_else(|| "circuit breaker open".to_owned(), ToString::to_string);
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
            tracing::warn!(reason = %reason, "redis could not decide; failing closed");
            let kind = error
                .as_ref()
                .map_or(StoreErrorKind::Unavailable, StoreError::kind);
            let err = StoreError::new(kind, format!("the rate limiter is unavailable: {reason}"))
                .with_retry_after(retry_after);
            return Err(err);
        }
        if opened > 0 {
            self.stats.add_fail_open(opened);
            if error.is_some() {
                tracing::warn!(reason = %reason, limits = opened, "redis could not decide; failing open");
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
                    let quota = super::local_share(q.quota(), share);
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

    /// Starts the probe of `breaker`'s node, unless one is running.
    fn spawn_probe(self: &Arc<Self>, breaker: &Arc<Breaker>, addr: Option<String>) {
        // Outside a runtime (a check made from plain code) the next check in one starts it.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(token) = breaker.claim_probe() else {
            return;
        };
        let weak = Arc::downgrade(self);
        let breaker = breaker.clone();
        let interval = self.probe_interval;
        // A Cluster master is pinged on a connection of the probe's own (see `NodeProbe`).
        let mut node_probe = addr
            .as_deref()
            .and_then(|a| NodeProbe::new(&self.target, a, self.connect_timeout));
        runtime.spawn(async move {
            let _token = token;
            loop {
                tokio::time::sleep(interval).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let Ok(handle) = inner.handle() else {
                    continue;
                };
                let mut slot = None;
                if let Some(addr) = &addr {
                    // A Cluster master: if it no longer serves any slot (failed over), nothing
                    // is sent to it any more and its breaker can close.
                    inner.refresh_slots(&handle.conn).await;
                    let map = inner.slots.map();
                    slot = map.slot_of(addr);
                    if slot.is_none() {
                        breaker.close(&inner.stats);
                        tracing::info!(node = %addr, "redis node no longer serves slots; its circuit breaker closed");
                        return;
                    }
                }
                let ok = match &mut node_probe {
                    // The node answers on the probe's own connection: the breaker closes once
                    // the Cluster connection answers too. One that does not is stuck (see
                    // `Links::rebuild`), and is replaced.
                    Some(probe) => {
                        probe.ping(inner.timeout).await
                            && (inner.answers(&handle.conn, slot).await
                                || match inner.rebuild(handle.generation).await {
                                    Some(new) => inner.answers(&new.conn, slot).await,
                                    None => false,
                                })
                    }
                    None => matches!(
                        tokio::time::timeout(inner.timeout, handle.conn.responsive(None)).await,
                        Ok(true)
                    ),
                };
                if ok {
                    breaker.close(&inner.stats);
                    tracing::info!(
                        node = addr.as_deref().unwrap_or(""),
                        "redis answered a probe; circuit breaker closed"
                    );
                    return;
                }
            }
        });
    }
}

/// The quota a check is sent with: its plan's, else the limit's own when the script holds
/// another (after a reconfiguration changed it), else none (the script's constants).
#[inline]
fn quota_arg(c: &LimitCheck<'_>, info: &LimitInfo) -> Option<QuotaArg> {
    match c.quota {
        None => info.own,
        Some(q) => Some(QuotaArg::of(q)),
    }
}

/// `now + timeout`, saturating far in the future instead of overflowing.
fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + super::MAX_TIMEOUT)
}

fn collect(fb: &Fallback) -> Decisions {
    let mut out = Decisions::new();
    for d in &fb.got[..fb.n] {
        out.push(d.expect("every limit decided"));
    }
    out
}

enum CallError {
    Timeout,
    Redis(String, StoreErrorKind),
    Store(StoreError),
}

impl CallError {
    fn into_store_error(self, timeout: Duration) -> StoreError {
        match self {
            CallError::Timeout => StoreError::new(
                StoreErrorKind::Timeout,
                format!("redis did not answer within {timeout:?}"),
            ),
            CallError::Redis(msg, kind) => StoreError::new(kind, format!("redis: {msg}")),
            CallError::Store(e) => e,
        }
    }
}

fn kind_of(e: &redis::RedisError) -> StoreErrorKind {
    if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Other
    }
}

/// A configured clock's time in the domain of Redis `TIME`: Unix µs (its reading plus its
/// [`unix_offset_micros`](Clock::unix_offset_micros), 0 for a `ManualClock` left alone).
fn unix_micros(clock: &dyn Clock) -> u64 {
    clock
        .now_micros()
        .saturating_add(clock.unix_offset_micros())
}
