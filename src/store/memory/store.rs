//! [`MemoryStore`]: decides checks against in-process tables, synchronously.

use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::any_table::{AnyLocked, AnyTable};
use crate::clock::{Clock, DefaultClock};
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::key::Key;
use crate::store::{Checked, Decisions, LimitCheck, LimitSpec, PlanQuota, Store, MAX_LIMITS};

/// The in-memory store: one bounded, sharded table per limit. Built by
/// [`MemoryBackend`](super::MemoryBackend); see the [module docs](super).
///
/// Every [`Store::check`] is decided synchronously ([`Checked::Ready`]). For use without the
/// HTTP layer, [`check_one`](Self::check_one) checks one key against one limit.
pub struct MemoryStore<C = DefaultClock> {
    limits: Box<[StoreLimit]>,
    /// Seeded per store, so that nobody outside can aim keys at one shard (see "Keys" in
    /// `docs/internals/memory-store.md`). Kept by
    /// [`reconfigure`](Store::reconfigure), so shared tables see the same fingerprints.
    hasher: foldhash::quality::RandomState,
    max_keys: usize,
    shards: usize,
    clock: Arc<C>,
}

/// One limit of a store: its table (whose keys are shared with the stores a reload derives
/// from this one) and the quota its checks default to.
struct StoreLimit {
    table: AnyTable,
    /// The limit's quota when it is not the table's own (a reload changed it): a check
    /// without a quota of its own is decided at this one.
    quota: Option<PlanQuota>,
}

impl<C: fmt::Debug> fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tables: Vec<_> = self.limits.iter().map(|l| &l.table).collect();
        f.debug_struct("MemoryStore")
            .field("tables", &tables)
            .field("max_keys", &self.max_keys)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// The [`Store::Future`] of [`MemoryStore`]: it has no values, because the memory store always
/// answers [`Checked::Ready`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryFuture {}

impl Future for MemoryFuture {
    type Output = Result<Decisions, StoreError>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        match *self.get_mut() {}
    }
}

impl<C: Clock> MemoryStore<C> {
    pub(crate) fn new(tables: Vec<AnyTable>, max_keys: usize, shards: usize, clock: C) -> Self {
        Self {
            limits: tables
                .into_iter()
                .map(|table| StoreLimit { table, quota: None })
                .collect(),
            hasher: foldhash::quality::RandomState::default(),
            max_keys,
            shards,
            clock: Arc::new(clock),
        }
    }

    /// Checks `key` against the limit at index `limit` (its position in the slice given to
    /// [`Backend::build`](crate::store::Backend::build)) and charges `cost` if allowed.
    ///
    /// This is the direct API: one clock read, one hash, no lock for a refusal of a held key
    /// and one for a charge. The decision is attributed to
    /// the limit's name. The only error is an out-of-range `limit`. The check is decided at
    /// the limit's quota; [`check_all`](Self::check_all) takes a [`LimitCheck`] with a
    /// [`PlanQuota`] of its own.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::clock::ManualClock;
    /// use tollgate::key::Key;
    /// use tollgate::store::{Backend, LimitSpec, memory::MemoryBackend};
    /// use tollgate::{AlgorithmKind, Name, Quota};
    ///
    /// let clock = ManualClock::new();
    /// let spec = LimitSpec::new(
    ///     Name::new("login"),
    ///     Quota::per_second(1).burst(2),
    ///     AlgorithmKind::TokenBucket,
    /// );
    /// let store = MemoryBackend::new().clock(clock.clone()).build(&[spec]).unwrap();
    /// let alice = Key::string("alice");
    ///
    /// assert_eq!(store.check_one(0, &alice, 1).unwrap().remaining(), 1);
    /// assert_eq!(store.check_one(0, &alice, 1).unwrap().remaining(), 0);
    /// let rejected = store.check_one(0, &alice, 1).unwrap();
    /// assert!(!rejected.allowed());
    /// assert_eq!(rejected.policy().as_str(), "login");
    /// assert_eq!(rejected.retry_after(), Some(Duration::from_secs(1)));
    ///
    /// clock.advance(Duration::from_secs(1));
    /// assert!(store.check_one(0, &alice, 1).unwrap().allowed());
    /// assert!(store.check_one(7, &alice, 1).is_err(), "there is no limit 7");
    /// ```
    #[inline]
    pub fn check_one(
        &self,
        limit: usize,
        key: &Key<'_>,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let limit = self.limit(limit)?;
        let fp = self.fingerprint(key);
        let now = self.clock.now_micros();
        let offset = || self.clock.unix_offset_micros();
        match &limit.quota {
            None => {
                Ok(limit
                    .table
                    .check_own(fp, self.now_for(&limit.table, None, now), cost, &offset))
            }
            quota => {
                let quota = quota.as_ref();
                let at = self.now_for(&limit.table, quota, now);
                limit.table.check(fp, at, cost, quota, &offset)
            }
        }
    }

    /// [`Store::check`] without the [`Checked`] wrapper: decides every check, all-or-nothing,
    /// at one instant, which the answer reports ([`Decisions::decided_at`]).
    ///
    /// A check with a [`quota`](LimitCheck::quota) is decided at that quota, and a key whose
    /// state was written under another quota keeps what it spent (see
    /// [`Algorithm::rebase`](crate::algorithm::Algorithm::rebase)).
    ///
    /// Errors (and then nothing is charged) if a check names a limit this store does not have,
    /// names the same limit twice, or carries a quota of another algorithm than its limit's.
    ///
    /// ```
    /// use tollgate::clock::ManualClock;
    /// use tollgate::key::Key;
    /// use tollgate::store::{Backend, LimitCheck, LimitSpec, memory::MemoryBackend, PlanQuota};
    /// use tollgate::{AlgorithmKind, Name, Quota};
    ///
    /// let spec = LimitSpec::new(Name::new("api"), Quota::per_hour(100), AlgorithmKind::Gcra);
    /// let store = MemoryBackend::new().clock(ManualClock::new()).build(&[spec]).unwrap();
    /// let pro = PlanQuota::new(AlgorithmKind::Gcra, Quota::per_hour(1_000)).unwrap();
    /// let alice = Key::string("alice");
    ///
    /// // 60 spent on the limit's own quota, then alice upgrades: 940 left, not 1,000.
    /// assert!(store.check_all(&[LimitCheck::new(0, alice.clone(), 60)]).unwrap().allowed());
    /// let d = store.check_all(&[LimitCheck::new(0, alice.clone(), 0).with_quota(&pro)]).unwrap();
    /// assert_eq!(d.as_slice()[0].remaining(), 940);
    /// assert_eq!(d.decided_at(), Some(0));
    /// ```
    #[inline(always)]
    pub fn check_all(&self, checks: &[LimitCheck<'_>]) -> Result<Decisions, StoreError> {
        match checks {
            // The hot path: one limit. The answer is built once, in place (no `push`, no copy
            // of a half-built `Decisions`).
            [one] => {
                let limit = self.limit(one.limit)?;
                let fp = self.fingerprint(&one.key);
                let now = self.clock.now_micros();
                let quota = one.quota.or(limit.quota.as_ref());
                let at = self.now_for(&limit.table, quota, now);
                let offset = || self.clock.unix_offset_micros();
                let decision = match quota {
                    None => limit.table.check_own(fp, at, one.cost, &offset),
                    quota => limit.table.check(fp, at, one.cost, quota, &offset)?,
                };
                Ok(Decisions::one(decision, now))
            }
            checks => self.check_other(checks),
        }
    }

    /// [`check_all`](Self::check_all) of no check or of several.
    #[inline(never)]
    fn check_other(&self, checks: &[LimitCheck<'_>]) -> Result<Decisions, StoreError> {
        let mut decisions = Decisions::new();
        if checks.is_empty() {
            decisions.set_decided_at(self.clock.now_micros());
        } else {
            self.check_many(checks, &mut decisions)?;
        }
        Ok(decisions)
    }

    /// Gives back what an allowed check of the same `checks` charged at `reserved_at` (its
    /// [`Decisions::decided_at`]), for every limit, each at its check's quota: see
    /// [`Store::refund`] and [`Algorithm::refund`](crate::algorithm::Algorithm::refund) for
    /// what comes back when the refund arrives late. Answers each limit as it stands after the
    /// refund (at cost 0), at the time the store's clock reads (reported as `decided_at`).
    ///
    /// A key the store no longer holds has recovered its budget (or was decided by the overflow
    /// bucket, which keeps its charge): nothing is given back. Errors, changing nothing, for the
    /// same bad checks as [`check_all`](Self::check_all).
    ///
    /// ```
    /// use tollgate::clock::ManualClock;
    /// use tollgate::key::Key;
    /// use tollgate::store::{Backend, LimitCheck, LimitSpec, memory::MemoryBackend};
    /// use tollgate::{AlgorithmKind, Name, Quota};
    ///
    /// let spec = LimitSpec::new(Name::new("login"), Quota::per_minute(3), AlgorithmKind::FixedWindow);
    /// let store = MemoryBackend::new().clock(ManualClock::new()).build(&[spec]).unwrap();
    /// let checks = [LimitCheck::new(0, Key::string("203.0.113.7"), 1)];
    /// let reserved = store.check_all(&checks).unwrap();
    /// assert_eq!(reserved.as_slice()[0].remaining(), 2);
    /// // The login succeeded: it does not count.
    /// let after = store.refund_all(&checks, reserved.decided_at().unwrap()).unwrap();
    /// assert_eq!(after.as_slice()[0].remaining(), 3);
    /// ```
    pub fn refund_all(
        &self,
        checks: &[LimitCheck<'_>],
        reserved_at: u64,
    ) -> Result<Decisions, StoreError> {
        self.validate(checks)?;
        let now = self.clock.now_micros();
        let mut decisions = Decisions::new();
        for check in checks {
            let limit = self.limit(check.limit)?;
            let fp = self.fingerprint(&check.key);
            let quota = check.quota.or(limit.quota.as_ref());
            // Both times on the base this limit decides at (Unix time for a calendar).
            let at = self.now_for(&limit.table, quota, reserved_at);
            let now = self.now_for(&limit.table, quota, now);
            let offset = || self.clock.unix_offset_micros();
            decisions.push(
                limit
                    .table
                    .refund(fp, at, now, check.cost, quota, &offset)?,
            );
        }
        decisions.set_decided_at(now);
        Ok(decisions)
    }

    /// Checks that every check names a limit of this store, once, at a quota of its algorithm;
    /// returns the position of each limit's check.
    fn validate(&self, checks: &[LimitCheck<'_>]) -> Result<[usize; MAX_LIMITS], StoreError> {
        let mut position = [NONE; MAX_LIMITS];
        for (i, check) in checks.iter().enumerate() {
            let limit = self.limit(check.limit)?;
            if position[check.limit] != NONE {
                return Err(invalid(format!(
                    "limit {} is checked twice in one request; check each limit once",
                    check.limit
                )));
            }
            limit.table.accepts(check.quota)?;
            position[check.limit] = i;
        }
        Ok(position)
    }

    /// Several limits, atomically: lock every involved shard in the order of its table's
    /// identity (a global order, shared with every store that shares the table after a reload,
    /// so two checks cannot deadlock), decide all, apply all only if all allow.
    fn check_many(
        &self,
        checks: &[LimitCheck<'_>],
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        // Position in `checks` of each limit's check; validates indices, duplicates, quotas.
        let position = self.validate(checks)?;
        // Hash before taking any lock.
        let mut fps = [0u64; MAX_LIMITS];
        for (fp, check) in fps.iter_mut().zip(checks) {
            *fp = self.fingerprint(&check.key);
        }
        let clock_now = self.clock.now_micros();
        // Each check's time: the clock's, or its Unix time for a calendar-aligned limit.
        let mut nows = [clock_now; MAX_LIMITS];

        let mut locked: [Option<AnyLocked<'_>>; MAX_LIMITS] = Default::default();
        // Tables locked in the order of their identity, which stores sharing them agree on.
        let mut order = [(usize::MAX, NONE, NONE); MAX_LIMITS];
        let mut n = 0;
        for (index, (limit, &i)) in self.limits.iter().zip(&position).enumerate() {
            if i != NONE {
                order[n] = (limit.table.identity(), index, i);
                n += 1;
            }
        }
        let order = &mut order[..n];
        order.sort_unstable();
        for &(_, index, i) in order.iter() {
            let limit = &self.limits[index];
            let quota = checks[i].quota.or(limit.quota.as_ref());
            nows[i] = self.now_for(&limit.table, quota, clock_now);
            let offset = || self.clock.unix_offset_micros();
            locked[i] = Some(
                limit
                    .table
                    .lock(fps[i], nows[i], checks[i].cost, quota, &offset)?,
            );
        }
        let locked = &mut locked[..checks.len()];

        let mut all_allowed = true;
        for ((slot, check), &now) in locked.iter_mut().zip(checks).zip(&nows) {
            if let Some(shard) = slot {
                let decision = shard.decide(now, check.cost);
                all_allowed &= decision.allowed();
                decisions.push(decision);
            }
        }
        let reported = decisions.as_mut_slice();
        for (((slot, check), decision), &now) in
            locked.iter_mut().zip(checks).zip(reported).zip(&nows)
        {
            if let Some(shard) = slot {
                if all_allowed {
                    shard.apply(now, check.cost);
                } else if decision.allowed() {
                    // Not charged after all: report this limit's actual state.
                    *decision = shard.decide(now, 0);
                }
            }
        }
        decisions.set_decided_at(clock_now);
        Ok(())
    }

    /// [`Store::reconfigure`]: a store deciding `limits` that shares this store's table (its
    /// keys and what they spent) for every limit of the same name and algorithm, with fresh
    /// tables for the others, the same key bound, shards, clock and key hashing. A shared
    /// limit whose quota changed decides at the new quota, and each key keeps what it spent
    /// (see [`Algorithm::rebase`](crate::algorithm::Algorithm::rebase)).
    fn reconfigured(&self, limits: &[LimitSpec]) -> Result<Self, ConfigError> {
        if limits.len() > MAX_LIMITS {
            return Err(ConfigError::new(
                "limits",
                format!(
                    "{} limits on one layer; use at most {MAX_LIMITS}, or stack another layer",
                    limits.len()
                ),
            ));
        }
        let mut taken = [false; MAX_LIMITS];
        let mut next = Vec::with_capacity(limits.len());
        for spec in limits {
            spec.validate()?;
            let same = self.limits.iter().enumerate().find(|(i, old)| {
                !taken[*i]
                    && old.table.name() == spec.name()
                    && old.table.kind() == spec.algorithm()
            });
            next.push(match same {
                Some((i, old)) => {
                    taken[i] = true;
                    let quota = (old.table.quota() != *spec.quota())
                        .then(|| PlanQuota::new(spec.algorithm(), *spec.quota()))
                        .transpose()?;
                    StoreLimit {
                        table: old.table.share(),
                        quota,
                    }
                }
                None => StoreLimit {
                    table: AnyTable::new(spec, self.max_keys, self.shards)?,
                    quota: None,
                },
            });
        }
        tracing::debug!(
            limits = limits.len(),
            kept = taken.iter().filter(|&&t| t).count(),
            "reconfigured in-memory rate-limit store"
        );
        Ok(Self {
            limits: next.into_boxed_slice(),
            hasher: self.hasher,
            max_keys: self.max_keys,
            shards: self.shards,
            clock: Arc::clone(&self.clock),
        })
    }

    /// Keys held, over all limits.
    pub fn len(&self) -> usize {
        self.limits.iter().map(|l| l.table.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys held for the limit at index `limit`, or `None` if there is no such limit.
    pub fn len_of(&self, limit: usize) -> Option<usize> {
        self.limits.get(limit).map(|l| l.table.len())
    }

    /// Checks decided by the limits' overflow buckets so far: checks of new keys that found
    /// their shard full of keys still recovering their budget (see "Bound and eviction" in the
    /// [module docs](super)). Anything above 0 means `max_keys` is too small for the traffic,
    /// or a flood of distinct keys is under way.
    pub fn overflowed(&self) -> u64 {
        self.limits.iter().map(|l| l.table.overflowed()).sum()
    }

    /// The most keys held per limit.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Shards per limit.
    pub fn shards(&self) -> usize {
        self.limits.first().map_or(0, |l| l.table.shards())
    }

    /// Number of limits.
    pub fn limits(&self) -> usize {
        self.limits.len()
    }

    /// Heap bytes held by the tables: their slots and clocks (allocated capacity included) and the
    /// per-key heap data an algorithm owns (a sliding log's entries). It walks every key, so
    /// call it for monitoring, not per request. A table shared with another store (see
    /// [`Store::reconfigure`]) is counted by each.
    pub fn memory_usage(&self) -> usize {
        self.limits
            .iter()
            .map(|l| l.table.memory_usage())
            .sum::<usize>()
            + std::mem::size_of_val::<[StoreLimit]>(&self.limits)
    }

    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    #[inline]
    fn limit(&self, limit: usize) -> Result<&StoreLimit, StoreError> {
        match self.limits.get(limit) {
            Some(limit) => Ok(limit),
            None => Err(invalid(format!(
                "limit index {limit} is out of range: this store holds {} limits",
                self.limits.len()
            ))),
        }
    }

    /// The time a check at `quota` (`table`'s own without one) decides at, given the clock's
    /// reading `now`: `now` itself, or for a calendar-aligned quota its Unix time
    /// (`now + unix_offset_micros()`).
    #[inline]
    fn now_for(&self, table: &AnyTable, quota: Option<&PlanQuota>, now: u64) -> u64 {
        let wall = match quota {
            None => table.wall_clock(),
            Some(quota) => quota.quota().calendar().is_some(),
        };
        if wall {
            now.saturating_add(self.clock.unix_offset_micros())
        } else {
            now
        }
    }

    /// The key's fingerprint: one seeded hash of the key. An unscoped IPv4 address or number
    /// (the usual keys) is hashed as one `u128` that says which kind it is, anything else
    /// through `Key`'s `Hash`: distinct keys are distinct inputs either way, so they collide
    /// only by chance (see "Keys" in `docs/internals/memory-store.md`).
    #[inline]
    fn fingerprint(&self, key: &Key<'_>) -> u64 {
        use crate::key::KeyValue;
        use std::net::IpAddr;
        if key.scope().is_none() {
            match key.value() {
                KeyValue::Ip(IpAddr::V4(ip)) => {
                    return self
                        .hasher
                        .hash_one((1u128 << 64) | u128::from(ip.to_bits()))
                }
                KeyValue::Int(n) => return self.hasher.hash_one((2u128 << 64) | u128::from(*n)),
                _ => {}
            }
        }
        self.hasher.hash_one(key)
    }
}

/// No check for this limit.
const NONE: usize = usize::MAX;

#[cold]
fn invalid(message: String) -> StoreError {
    tracing::warn!(%message, "invalid in-memory rate-limit check");
    StoreError::new(StoreErrorKind::Other, message)
}

impl<C: Clock> Store for MemoryStore<C> {
    type Future = MemoryFuture;

    #[inline(always)]
    // Without the `metrics` feature the timer is `()`.
    #[cfg_attr(not(feature = "metrics"), allow(clippy::let_unit_value))]
    fn check(&self, checks: &[LimitCheck<'_>]) -> Checked<MemoryFuture> {
        let timer = crate::metrics::memory_check_start();
        let decisions = self.check_all(checks);
        crate::metrics::memory_check_done(timer);
        Checked::Ready(decisions)
    }

    fn refund(&self, checks: &[LimitCheck<'_>], reserved_at: u64) -> Checked<MemoryFuture> {
        Checked::Ready(self.refund_all(checks, reserved_at))
    }

    fn reconfigure(&self, limits: &[LimitSpec]) -> Result<Self, ConfigError> {
        self.reconfigured(limits)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{
        Algorithm, AlgorithmKind, FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow,
        TokenBucket,
    };
    use crate::clock::ManualClock;
    use crate::decision::Name;
    use crate::quota::Quota;
    use crate::store::{memory::MemoryBackend, Backend, LimitSpec};

    fn tb(name: &str, quota: Quota) -> LimitSpec {
        LimitSpec::new(Name::new(name), quota, AlgorithmKind::TokenBucket)
    }

    fn store_with(
        limits: &[LimitSpec],
        backend: MemoryBackend,
    ) -> (MemoryStore<ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        let store = backend.clock(clock.clone()).build(limits).unwrap();
        (store, clock)
    }

    fn remaining(store: &MemoryStore<ManualClock>, limit: usize, key: &Key<'_>) -> u64 {
        store.check_one(limit, key, 0).unwrap().remaining()
    }

    fn check(store: &MemoryStore<ManualClock>, checks: &[LimitCheck<'_>]) -> Decisions {
        match store.check(checks) {
            Checked::Ready(decisions) => decisions.unwrap(),
            Checked::Pending(never) => match never {},
        }
    }

    #[test]
    fn eviction_never_resets_a_spent_budget() {
        let cap = 1_000;
        let (store, _) = store_with(
            &[tb("a", Quota::per_day(10))],
            MemoryBackend::new().max_keys(cap).shards(8),
        );
        let victim = Key::string("victim");
        while store.check_one(0, &victim, 1).unwrap().allowed() {}
        // A flood of 10 x max_keys distinct keys, each charged: none of them may push the
        // exhausted victim out (that would hand its day's budget back).
        let mut admitted = 0;
        let mut full = 0;
        for i in 0..10 * cap as u64 {
            admitted += u64::from(store.check_one(0, &Key::int(i), 1).unwrap().allowed());
            assert!(store.len() <= cap);
            if i == 5 * cap as u64 {
                full = store.memory_usage();
            }
        }
        let d = store.check_one(0, &victim, 1).unwrap();
        assert!(!d.allowed(), "the victim regained budget: {d:?}");
        assert_eq!(d.remaining(), 0);
        assert_eq!(
            store.memory_usage(),
            full,
            "memory stops growing at the bound"
        );
        // The flood got the keys that fit, then one overflow bucket of the quota for the rest.
        let held = store.len() as u64 - 1;
        assert_eq!(admitted, held + 10);
        assert_eq!(store.overflowed(), 10 * cap as u64 - held);
        // Keys held keep their charge; a key that never fit is decided by the overflow bucket.
        assert_eq!(remaining(&store, 0, &Key::int(0)), 9);
        assert!(!store
            .check_one(0, &Key::int(10 * cap as u64), 1)
            .unwrap()
            .allowed());
    }

    #[test]
    fn recovered_keys_are_evicted_unused_first() {
        let (store, clock) = store_with(
            &[tb("a", Quota::per_second(1).burst(5))],
            MemoryBackend::new().max_keys(3).shards(1),
        );
        let [a, b, c, d, e, f] = ["a", "b", "c", "d", "e", "f"].map(Key::string);
        store.check_one(0, &a, 1).unwrap();
        store.check_one(0, &b, 1).unwrap();
        store.check_one(0, &c, 5).unwrap();
        clock.advance(Duration::from_secs(1));
        // a and b have recovered, c (5 s to refill) has not. Touching a gives it a second
        // chance: b, not used since, goes first.
        store.check_one(0, &a, 0).unwrap();
        store.check_one(0, &d, 1).unwrap(); // takes b's slot
        store.check_one(0, &e, 1).unwrap(); // c is not recovered: takes a's slot
        assert_eq!(store.overflowed(), 0);
        assert_eq!(store.len(), 3);
        assert_eq!(remaining(&store, 0, &c), 1, "c kept what it spent");
        assert_eq!(remaining(&store, 0, &d), 4);
        assert_eq!(remaining(&store, 0, &e), 4);
        // Nobody left to recycle: f is decided by the overflow bucket, which starts full.
        let got = store.check_one(0, &f, 2).unwrap();
        assert!(got.allowed());
        assert_eq!(got.remaining(), 3);
        assert_eq!(store.overflowed(), 1);
        assert_eq!(store.len(), 3);
        assert_eq!(
            remaining(&store, 0, &b),
            5,
            "a cost-0 probe of b stores nothing"
        );
        assert_eq!(store.len(), 3);
    }

    #[test]
    fn multi_limit_checks_use_the_overflow_bucket_all_or_nothing() {
        let (store, _) = store_with(
            &[
                tb("per-key", Quota::per_day(2)),
                tb("wide", Quota::per_day(100)),
            ],
            MemoryBackend::new().max_keys(1).shards(1),
        );
        let checks = |k: u64| [0, 1].map(|limit| LimitCheck::new(limit, Key::int(k), 1));
        assert!(check(&store, &checks(0)).allowed());
        // Key 1 finds both tables full of key 0 (not recovered): both limits use their
        // overflow bucket, which admits 2 per day for "per-key".
        assert!(check(&store, &checks(1)).allowed());
        assert!(check(&store, &checks(2)).allowed());
        let third = check(&store, &checks(3));
        assert_eq!(third.rejected().unwrap().policy().as_str(), "per-key");
        assert_eq!(store.overflowed(), 6);
        assert_eq!(store.len(), 2);
        // "wide"'s overflow bucket was charged for the two admitted overflow checks only.
        assert_eq!(remaining(&store, 1, &Key::int(0)), 99);
        assert_eq!(store.check_one(1, &Key::int(9), 1).unwrap().remaining(), 97);
    }

    #[test]
    fn manual_clock_drives_refill() {
        let (store, clock) = store_with(
            &[tb("refill", Quota::per_second(10).burst(20))],
            MemoryBackend::new(),
        );
        let key = Key::string("k");
        for i in 0..20 {
            let d = store.check_one(0, &key, 1).unwrap();
            assert!(d.allowed(), "{i}");
            assert_eq!(d.policy().as_str(), "refill");
        }
        clock.advance(Duration::from_millis(50));
        let d = store.check_one(0, &key, 1).unwrap();
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(50)));
        clock.advance(Duration::from_millis(50));
        assert!(store.check_one(0, &key, 1).unwrap().allowed());
        clock.advance(Duration::from_secs(3));
        assert_eq!(remaining(&store, 0, &key), 20);
    }

    #[test]
    fn same_decisions_as_the_algorithm() {
        // The store is the algorithm plus storage: replay a stream against both.
        let quota = Quota::per_second(3).burst(4);
        let bucket = TokenBucket::new(quota).unwrap();
        let (store, clock) = store_with(&[tb("same", quota)], MemoryBackend::new());
        let mut states = [Default::default(), Default::default(), Default::default()];
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            clock.advance(Duration::from_micros(x % 300_000));
            let (key, cost) = ((x >> 20) % 3, (x >> 30) % 3);
            let want = bucket
                .check(&mut states[key as usize], clock.now_micros(), cost)
                .with_policy(Name::new("same"));
            assert_eq!(store.check_one(0, &Key::int(key), cost).unwrap(), want);
        }
    }

    /// Replays a random stream over three keys through the store and through `algorithm`'s pure
    /// transition, and asserts identical decisions.
    fn replay<A: Algorithm>(algorithm: A, kind: AlgorithmKind, quota: Quota) {
        let name = Name::new(kind.as_str());
        let spec = LimitSpec::new(name, quota, kind);
        let (store, clock) = store_with(&[spec], MemoryBackend::new().max_keys(2).shards(1));
        let mut states: Vec<A::State> = (0..3).map(|_| Default::default()).collect();
        // The store's one shard: its slots (key, referenced) and its clock hand.
        let mut held: Vec<(u64, bool)> = Vec::new();
        let mut hand = 0usize;
        let mut overflow_state = A::State::default();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..3_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            clock.advance(Duration::from_micros(x % 400_000));
            let (key, cost) = ((x >> 20) % 3, (x >> 30) % 4);
            let now = clock.now_micros();
            let slot = key as usize;
            // The store holds two keys. A third one takes the slot of a key that is as good as
            // fresh; if neither is, it is decided by the overflow bucket.
            let fresh = |states: &[A::State], k: u64| {
                algorithm.decide(&states[k as usize], now, 0)
                    == algorithm.decide(&A::State::default(), now, 0)
            };
            let new_key = !held.iter().any(|&(k, _)| k == key);
            if new_key {
                states[slot] = Default::default();
            }
            let charged =
                new_key && cost > 0 && algorithm.decide(&states[slot], now, cost).allowed();
            let overflow =
                charged && held.len() == 2 && !held.iter().any(|&(k, _)| fresh(&states, k));
            let want = if overflow {
                algorithm.check(&mut overflow_state, now, cost)
            } else {
                algorithm.check(&mut states[slot], now, cost)
            }
            .with_policy(name);
            let got = store.check_one(0, &Key::int(key), cost).unwrap();
            assert_eq!(
                got, want,
                "{kind} step {step}: key {key} cost {cost} at {now}"
            );
            // Mirror the store's bookkeeping (`Shard::vacancy`): a known key is referenced; an
            // unknown key is stored only if it was charged, in the slot the clock hand finds.
            if let Some(slot) = held.iter_mut().find(|(k, _)| *k == key) {
                slot.1 = true;
            } else if charged && held.len() < 2 {
                // Room: the key at the hand is recycled if fresh, else the table grows.
                let reuse = !held.is_empty() && {
                    let at = hand;
                    held[at].1 = false;
                    hand = (hand + 1) % held.len();
                    let fresh_at = fresh(&states, held[at].0);
                    if fresh_at {
                        held[at] = (key, true);
                    }
                    fresh_at
                };
                if !reuse {
                    held.push((key, true));
                }
            } else if charged {
                // Full: the hand clears what it passes and takes the first unreferenced fresh
                // key, else the first referenced fresh one (the hand then resumes after it).
                let mut fallback = None;
                let mut taken = None;
                for _ in 0..2 {
                    let at = hand;
                    hand = (hand + 1) % 2;
                    let referenced = std::mem::replace(&mut held[at].1, false);
                    if fresh(&states, held[at].0) {
                        if !referenced {
                            taken = Some(at);
                            break;
                        }
                        fallback.get_or_insert(at);
                    }
                }
                if taken.is_none()
                    && let Some(at) = fallback
                {
                    hand = (at + 1) % 2;
                    taken = Some(at);
                }
                if let Some(at) = taken {
                    held[at] = (key, true);
                }
            }
            assert_eq!(store.len(), held.len(), "{kind} step {step}");
        }
    }

    #[test]
    fn every_algorithm_decides_exactly_as_its_transition() {
        let quota = Quota::per_second(3);
        for kind in AlgorithmKind::ALL {
            match kind {
                AlgorithmKind::TokenBucket => replay(TokenBucket::new(quota).unwrap(), kind, quota),
                AlgorithmKind::Gcra => replay(Gcra::new(quota).unwrap(), kind, quota),
                AlgorithmKind::FixedWindow => replay(FixedWindow::new(quota).unwrap(), kind, quota),
                AlgorithmKind::SlidingWindow => {
                    replay(SlidingWindow::new(quota).unwrap(), kind, quota)
                }
                AlgorithmKind::SlidingLog => replay(SlidingLog::new(quota).unwrap(), kind, quota),
                AlgorithmKind::LeakyBucket => replay(LeakyBucket::new(quota).unwrap(), kind, quota),
            }
        }
    }

    #[test]
    fn every_algorithm_is_all_or_nothing_and_bounded() {
        for kind in AlgorithmKind::ALL {
            let limits = [
                LimitSpec::new(Name::new("x"), Quota::per_minute(10), kind),
                tb("gate", Quota::per_minute(1)),
            ];
            let (store, _) = store_with(&limits, MemoryBackend::new().max_keys(100).shards(1));
            let user = Key::string("user");
            let checks = [
                LimitCheck::new(0, user.clone(), 1),
                LimitCheck::new(1, user.clone(), 1),
            ];
            assert!(check(&store, &checks).allowed(), "{kind}");
            let rejected = check(&store, &checks);
            assert_eq!(
                rejected.rejected().unwrap().policy().as_str(),
                "gate",
                "{kind}"
            );
            assert_eq!(
                rejected.as_slice()[0].remaining(),
                9,
                "{kind}: reported uncharged"
            );
            assert_eq!(
                remaining(&store, 0, &user),
                9,
                "{kind}: not charged by the rejection"
            );

            let admitted = (0..1_000)
                .filter(|&i| store.check_one(0, &Key::int(i), 1).unwrap().allowed())
                .count();
            assert_eq!(store.len_of(0), Some(100), "{kind}");
            // 99 keys fit beside "user"; the other 901 share one overflow bucket of 10.
            assert_eq!(admitted, 99 + 10, "{kind}");
            assert_eq!(store.overflowed(), 901, "{kind}");
            assert_eq!(remaining(&store, 0, &user), 9, "{kind}: user kept");
            assert_eq!(
                remaining(&store, 0, &Key::int(0)),
                9,
                "{kind}: first key kept"
            );
        }
    }

    #[test]
    fn several_limits_are_all_or_nothing() {
        let (store, _) = store_with(
            &[
                tb("wide", Quota::per_minute(10)),
                tb("narrow", Quota::per_minute(1)),
            ],
            MemoryBackend::new(),
        );
        let user = Key::string("user");
        let checks = [
            LimitCheck::new(0, user.clone(), 1),
            LimitCheck::new(1, user.clone(), 1),
        ];
        let first = check(&store, &checks);
        assert!(first.allowed());
        assert_eq!(first.as_slice()[0].remaining(), 9);
        assert_eq!(first.as_slice()[1].remaining(), 0);
        assert_eq!(first.reported().unwrap().policy().as_str(), "narrow");

        for _ in 0..3 {
            let rejected = check(&store, &checks);
            assert!(!rejected.allowed());
            assert_eq!(rejected.rejected().unwrap().policy().as_str(), "narrow");
            let wide = rejected.as_slice()[0];
            assert!(wide.allowed(), "wide alone would allow");
            assert_eq!(wide.policy().as_str(), "wide");
            assert_eq!(wide.remaining(), 9, "reported uncharged");
        }
        assert_eq!(remaining(&store, 0, &user), 9, "wide was never charged");

        // Check order does not matter; the global lock order is by limit.
        let reversed = [checks[1].clone(), checks[0].clone()];
        let d = check(&store, &reversed);
        assert_eq!(d.as_slice()[0].policy().as_str(), "narrow");
        assert!(!d.as_slice()[0].allowed());
        assert_eq!(remaining(&store, 0, &user), 9);
    }

    #[test]
    fn several_limits_on_new_keys_charge_each() {
        let (store, _) = store_with(
            &[
                tb("per-key", Quota::per_minute(2)),
                tb("global", Quota::per_minute(3)),
            ],
            MemoryBackend::new(),
        );
        let admitted = ["a", "a", "a", "b", "b", "c"].map(|k| {
            check(
                &store,
                &[
                    LimitCheck::new(0, Key::string(k), 1),
                    LimitCheck::new(1, Key::global(), 1),
                ],
            )
            .allowed()
        });
        assert_eq!(admitted, [true, true, false, true, false, false]);
        assert_eq!(remaining(&store, 1, &Key::global()), 0);
        assert_eq!(remaining(&store, 0, &Key::string("b")), 1);
        assert_eq!(store.len_of(0), Some(2), "c was rejected: not stored");
    }

    #[test]
    fn bad_checks_are_errors_and_charge_nothing() {
        let (store, _) = store_with(
            &[tb("a", Quota::per_minute(5)), tb("b", Quota::per_minute(5))],
            MemoryBackend::new(),
        );
        let key = Key::int(1);
        let out_of_range = [
            LimitCheck::new(0, key.clone(), 1),
            LimitCheck::new(2, key.clone(), 1),
        ];
        assert!(store.check_all(&out_of_range).is_err());
        assert!(store.check_all(&out_of_range[1..]).is_err());
        assert!(store.check_one(9, &key, 1).is_err());
        let twice = [
            LimitCheck::new(0, key.clone(), 1),
            LimitCheck::new(0, key.clone(), 1),
        ];
        let err = store.check_all(&twice).unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
        assert!(store.is_empty());
        assert!(store.check_all(&[]).unwrap().is_empty());
    }

    #[test]
    fn impossible_cost_is_not_stored() {
        let (store, _) = store_with(&[tb("a", Quota::per_minute(5))], MemoryBackend::new());
        let d = store.check_one(0, &Key::int(1), 6).unwrap();
        assert!(d.is_impossible());
        assert!(store.is_empty());
    }

    #[test]
    fn huge_keys_work_and_cost_no_memory() {
        let (store, _) = store_with(&[tb("a", Quota::per_minute(3))], MemoryBackend::new());
        // Every shard has its first segment of slots (see `segments`) once it holds a key.
        for k in 0..200 {
            store.check_one(0, &Key::int(k), 1).unwrap();
        }
        let before = store.memory_usage();
        let mut value = vec![b'x'; 1 << 20];
        let huge = Key::bytes(&value[..]);
        assert_eq!(store.check_one(0, &huge, 1).unwrap().remaining(), 2);
        assert_eq!(store.check_one(0, &huge, 1).unwrap().remaining(), 1);
        // The last byte matters: a different 1 MB key is a different key.
        *value.last_mut().unwrap() = b'y';
        assert_eq!(
            store
                .check_one(0, &Key::bytes(&value[..]), 1)
                .unwrap()
                .remaining(),
            2
        );
        assert!(
            store.memory_usage() - before < 4096,
            "grew by {} bytes for two 1 MB keys",
            store.memory_usage() - before
        );
        assert_eq!(store.len(), 202);
    }

    #[test]
    fn memory_usage_counts_sliding_log_entries() {
        let spec = LimitSpec::new(
            Name::new("log"),
            Quota::per_hour(1_000),
            AlgorithmKind::SlidingLog,
        );
        let (store, clock) = store_with(&[spec], MemoryBackend::new().max_keys(100).shards(1));
        // 100 keys x 5,000 admission attempts at distinct times: at most 1,000 entries each.
        for t in 0..5_000u64 {
            clock.set_micros(t);
            for k in 0..100 {
                store.check_one(0, &Key::int(k), 1).unwrap();
            }
        }
        let usage = store.memory_usage();
        let entries = 100 * 1_000 * std::mem::size_of::<crate::algorithm::LogEntry>();
        assert!(
            usage >= entries,
            "{usage} bytes reported for {entries} of entries"
        );
        assert!(
            usage < entries + 64 * 1024,
            "{usage}: the allocation is bounded"
        );
    }

    #[test]
    fn idle_keys_are_recycled_before_the_store_grows() {
        let (store, clock) = store_with(
            &[tb("a", Quota::per_second(10))],
            MemoryBackend::new().max_keys(100).shards(1),
        );
        store.check_one(0, &Key::int(1), 10).unwrap();
        store.check_one(0, &Key::int(2), 1).unwrap();
        // Key 1 needs the full second to refill; key 2 only 100 ms.
        clock.advance(Duration::from_millis(999));
        store.check_one(0, &Key::int(2), 0).unwrap();
        // The clock hand meets key 1, the oldest, which has not recovered: the table grows.
        store.check_one(0, &Key::int(3), 1).unwrap();
        assert_eq!(store.len(), 3, "key 1 is not fresh yet");
        clock.advance(Duration::from_millis(1));
        store.check_one(0, &Key::int(2), 0).unwrap();
        store.check_one(0, &Key::int(3), 0).unwrap();
        store.check_one(0, &Key::int(4), 1).unwrap();
        // The hand meets key 2, recovered: key 4 takes its slot instead of growing the table.
        assert_eq!(store.len(), 3, "a recovered key's slot was reused");
        assert_eq!(remaining(&store, 0, &Key::int(1)), 10);
    }

    #[test]
    fn index_stays_compact_under_churn_at_the_cap() {
        let cap = 10_000;
        let (store, clock) = store_with(
            &[tb("a", Quota::per_second(10))],
            MemoryBackend::new().max_keys(cap).shards(1),
        );
        // A key charged 1 recovers in 100 ms; 10 µs per key recycles keys charged
        // `cap` keys ago, so every insertion at the cap replaces one.
        for i in 0..cap as u64 {
            clock.advance(Duration::from_micros(10));
            store.check_one(0, &Key::int(i), 1).unwrap();
        }
        let full = store.memory_usage();
        for i in cap as u64..30 * cap as u64 {
            clock.advance(Duration::from_micros(10));
            store.check_one(0, &Key::int(i), 1).unwrap();
        }
        assert_eq!(store.len(), cap);
        assert_eq!(store.overflowed(), 0);
        let per_key = store.memory_usage() as f64 / cap as f64;
        assert!(per_key <= 32.0 + 12.9 + 1.0, "{per_key} bytes per key");
        assert!(
            store.memory_usage() <= full + full / 3,
            "{} > {full}",
            store.memory_usage()
        );
    }

    #[test]
    fn checks_without_the_lock_stay_exact_while_the_table_grows() {
        // One shard, so every key shares it: new keys keep growing the table (and moving the
        // other keys' slots) while two threads check a spent key (refused without the lock) and
        // a hot key (allowed under the lock, refused without it once spent).
        let (store, _) = store_with(
            &[tb("t", Quota::per_hour(50))],
            MemoryBackend::new().shards(1).max_keys(20_000),
        );
        let spent = Key::string("spent");
        for _ in 0..50 {
            assert!(store.check_one(0, &spent, 1).unwrap().allowed());
        }
        let admitted = std::sync::atomic::AtomicU64::new(0);
        let wrong = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                for k in 0..10_000 {
                    let d = store.check_one(0, &Key::int(k), 1).unwrap();
                    assert!(d.allowed() && d.remaining() == 49, "new key {k}: {d:?}");
                }
            });
            for _ in 0..2 {
                s.spawn(|| {
                    let hot = Key::string("hot");
                    for _ in 0..20_000 {
                        let d = store.check_one(0, &spent, 1).unwrap();
                        if d.allowed() || d.remaining() != 0 {
                            wrong.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        if store.check_one(0, &hot, 1).unwrap().allowed() {
                            admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(
            wrong.into_inner(),
            0,
            "the spent key was allowed or misreported"
        );
        assert_eq!(
            admitted.into_inner(),
            50,
            "the hot key admitted exactly its capacity"
        );
        for k in 0..10_000 {
            assert_eq!(
                remaining(&store, 0, &Key::int(k)),
                49,
                "key {k} charged once"
            );
        }
        assert_eq!(store.len(), 10_002);
    }

    #[test]
    fn concurrent_checks_admit_exactly_the_capacity() {
        let capacity = 2_000;
        let (store, _) = store_with(
            &[tb("hot", Quota::per_hour(capacity))],
            MemoryBackend::new(),
        );
        let admitted = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let key = Key::string("one key");
                    for _ in 0..capacity {
                        if store.check_one(0, &key, 1).unwrap().allowed() {
                            admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.into_inner(), capacity);
    }

    #[test]
    fn a_reload_that_reorders_limits_cannot_deadlock_checks_in_flight() {
        // The old store checks (a, b), the reloaded one (b, a): the same two tables, which
        // both lock in one order, so neither can hold one table's shard waiting for the other.
        let limits = [
            tb("a", Quota::per_hour(1_000_000)),
            tb("b", Quota::per_hour(1_000_000)),
        ];
        let (old, _) = store_with(&limits, MemoryBackend::new());
        let new = old.reconfigure(&[limits[1], limits[0]]).unwrap();
        let stores = std::sync::Arc::new((old, new));
        let (done, finished) = std::sync::mpsc::channel();
        for t in 0..4 {
            let (stores, done) = (std::sync::Arc::clone(&stores), done.clone());
            std::thread::spawn(move || {
                let store = if t % 2 == 0 { &stores.0 } else { &stores.1 };
                let checks = [
                    LimitCheck::new(0, Key::global(), 1),
                    LimitCheck::new(1, Key::global(), 1),
                ];
                let allowed = (0..20_000)
                    .filter(|_| check(store, &checks).allowed())
                    .count();
                done.send(allowed).unwrap();
            });
        }
        let allowed: usize = (0..4)
            .map(|_| {
                finished
                    .recv_timeout(std::time::Duration::from_secs(60))
                    .expect("checks on the old and the reloaded store deadlocked")
            })
            .sum();
        assert_eq!(allowed, 80_000);
        let (old, new) = &*stores;
        assert_eq!(remaining(old, 0, &Key::global()), 1_000_000 - 80_000);
        assert_eq!(remaining(new, 0, &Key::global()), 1_000_000 - 80_000);
    }

    #[test]
    fn concurrent_multi_limit_checks_stay_consistent() {
        // Four users of 40 each under a global 100: exactly 100 pass, and every pass
        // charged both its user and the global limit.
        let (store, _) = store_with(
            &[
                tb("user", Quota::per_hour(40)),
                tb("global", Quota::per_hour(100)),
            ],
            MemoryBackend::new(),
        );
        let per_user: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4u64)
                .map(|u| {
                    let store = &store;
                    s.spawn(move || {
                        let checks = [
                            LimitCheck::new(0, Key::int(u), 1),
                            LimitCheck::new(1, Key::global(), 1),
                        ];
                        (0..60).filter(|_| check(store, &checks).allowed()).count() as u64
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(per_user.iter().sum::<u64>(), 100);
        for (u, n) in per_user.iter().enumerate() {
            assert_eq!(remaining(&store, 0, &Key::int(u as u64)), 40 - n);
        }
        assert_eq!(remaining(&store, 1, &Key::global()), 0);
    }

    #[test]
    fn memory_future_is_uninhabited() {
        assert_eq!(std::mem::size_of::<MemoryFuture>(), 0);
        let (store, _) = store_with(&[tb("a", Quota::per_minute(1))], MemoryBackend::new());
        let checks = [LimitCheck::new(0, Key::global(), 1)];
        assert!(matches!(store.check(&checks), Checked::Ready(Ok(_))));
    }
}
