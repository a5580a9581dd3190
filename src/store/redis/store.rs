//! [`RedisStore`]: the [`Store`] implementation, and the store's shared state ([`Inner`]) with
//! its connection of the current runtime. A check is routed into script calls
//! ([`routing`](super::routing)), sent ([`call`](super::call)), and decided by the failure
//! policies where Redis cannot decide ([`fallback`](super::fallback)).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use super::backend::{build_local, compile_limits, LocalBuilder};
use super::breaker::Breakers;
use super::call::unix_micros;
use super::conn::{Handle, LinkConfig, Links, Target};
use super::fallback::{Fallback, LocalCheck, LocalStore};
use super::keys::KeyEncoder;
use super::script::{LimitInfo, LuaScript};
use super::slots::SlotCache;
use super::stats::RedisStats;
use crate::clock::Clock;
use crate::error::{StoreError, StoreErrorKind};
use crate::key::Key;
use crate::store::{Checked, Decisions, FailurePolicy, LimitCheck, LimitSpec, Store, MAX_LIMITS};

type BoxFuture = Pin<Box<dyn Future<Output = Result<Decisions, StoreError>> + Send + 'static>>;

/// Limits decided by Redis, shared by every clone of a [`RedisStore`]. Built by
/// [`RedisBackend`](super::RedisBackend); see the [module docs](super).
///
/// Cloning is cheap and clones share the connection, counters and circuit breaker.
#[derive(Clone)]
pub struct RedisStore {
    pub(super) inner: Arc<Inner>,
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
    pub(crate) local_builder: Arc<Mutex<Option<LocalBuilder>>>,
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
        let calls = inner.route(checks, now, None);
        let local: Vec<LocalCheck<'static>> = checks
            .iter()
            .filter(|c| matches!(inner.policies[c.limit], FailurePolicy::Local { .. }))
            .map(|c| LocalCheck::from(c).into_owned())
            .collect();
        Checked::Pending(RedisFuture {
            inner: Box::pin(inner.clone().run(calls, (limits, n), local)),
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
        let calls = inner.route(checks, now, Some(reserved_at));
        Checked::Pending(RedisFuture {
            inner: Box::pin(inner.clone().give_back(calls, checks.len())),
        })
    }

    /// A store deciding `limits` on the same connections, circuit breakers, statistics and
    /// settings (and the local fallback's counters, for `Local` limits of the same name), with
    /// its own script. Redis keys are named by the limit's name and algorithm, so every limit of
    /// the same name and algorithm keeps its counters; a limit whose quota changed keeps what
    /// each key spent (as a plan change does: see [`PlanQuota`](crate::store::PlanQuota)), new
    /// limits start fresh, and the keys of limits that are gone expire.
    ///
    /// ```no_run
    /// use tollgate::store::redis::RedisBackend;
    /// use tollgate::store::{Backend, FailurePolicy, LimitSpec, Store};
    /// use tollgate::{AlgorithmKind, Name, Quota};
    ///
    /// # fn demo() -> Result<(), tollgate::ConfigError> {
    /// let api = |q| {
    ///     LimitSpec::new(Name::new("api"), q, AlgorithmKind::FixedWindow)
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
        let mut compiled = compile_limits(limits)?;
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
                    build_local(builder, &compiled.local_specs)?
                }
            })
        } else {
            None
        };
        let script = Arc::new(LuaScript::for_limits(&compiled.infos));
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

impl Inner {
    pub(super) fn link_config(&self) -> LinkConfig<'_> {
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
            if let Some(q) = c.quota
                && q.algorithm() != info.algorithm
            {
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
    pub(super) fn handle(self: &Arc<Self>) -> Result<Handle, StoreError> {
        let (handle, fresh) = self.links.get(&self.link_config())?;
        if fresh {
            self.connected.store(false, Ordering::Relaxed);
            let weak = Arc::downgrade(self);
            let stats = self.stats.clone();
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
                super::memory_policy::check(&conn, &stats).await;
            });
        }
        Ok(handle)
    }
}
