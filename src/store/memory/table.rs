//! One limit's state: an algorithm and its keys, spread over independently locked shards.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::cell::{ShardCell, ShardGuard};
use super::shard::{Shard, Vacancy};
use crate::algorithm::{
    Algorithm, AlgorithmKind, FixedWindow, Gcra, LeakyBucket, RebaseAcross, SlidingLog,
    SlidingWindow, TokenBucket,
};
use crate::decision::{Decision, PolicyName};
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::metrics::KeysGauge;
use crate::quota::Quota;
use crate::store::plan_quota::{self, Compiled};
use crate::store::{LimitSpec, PlanQuota};

/// A value alone on its cache lines, so neighbouring shards' locks do not false-share.
#[repr(align(128))]
struct Padded<T>(T);

/// One shard of a table, behind its lock, on its own cache lines.
type LockedShard<A> = Padded<ShardCell<<A as Algorithm>::State>>;

/// Reads the store's clock's Unix offset, µs
/// ([`Clock::unix_offset_micros`](crate::clock::Clock::unix_offset_micros)). A check calls it
/// only to carry a time between the clock's time base and Unix time (a key whose state was
/// written at a calendar-aligned quota checked at a plain one, or the reverse).
pub(crate) type UnixOffset<'a> = &'a dyn Fn() -> u64;

/// Whether `algorithm` decides on Unix time (a calendar-aligned quota) rather than on the
/// clock's time.
#[inline]
fn on_unix_time<A: Algorithm>(algorithm: &A) -> bool {
    algorithm.quota().calendar().is_some()
}

/// `now`, read on the time base of `on`, read on the time base of `to`.
#[inline]
fn shift<A: Algorithm>(on: &A, to: &A, now: u64, offset: UnixOffset<'_>) -> u64 {
    match (on_unix_time(on), on_unix_time(to)) {
        (true, false) => now.saturating_sub(offset()),
        (false, true) => now.saturating_add(offset()),
        _ => now,
    }
}

/// Microseconds between two warnings that a table is deciding new keys by its overflow bucket.
const OVERFLOW_WARN_EVERY: u64 = 10_000_000;

/// The keys of one limit, typed by its algorithm.
///
/// Each key's state carries the tag of the quota it was written under (see the shard's tags):
/// 0 for `algorithm`, the table's own, or a [`PlanQuota`]'s. A check at another quota than the
/// state's rebases the state first ([`Algorithm::rebase`]), so the key keeps what it spent.
///
/// The keys live behind `Arc`s, so a reload can [`share`](Self::share) them with a new store
/// while the table itself (what a check reads first) stays inline in each store.
pub(crate) struct Table<A: Compiled> {
    algorithm: A,
    name: PolicyName,
    shards: Arc<[LockedShard<A>]>,
    /// `shards.len() - 1` (the count is a power of two).
    mask: usize,
    overflow: Arc<Overflow<A::State>>,
    /// Whether the quota follows the calendar: then `now` is the clock's Unix time.
    wall_clock: bool,
}

/// A table's overflow bucket and its bookkeeping, shared like its keys.
struct Overflow<S> {
    /// The state shared by every new key while its shard is full of keys still recovering:
    /// one bucket of the table's own quota, whatever quota the key is checked at (see "Bound
    /// and eviction" in the module docs). Locked only while holding one of this table's
    /// shards, and never while taking another lock.
    state: Padded<Mutex<S>>,
    /// Checks decided by the overflow bucket.
    overflowed: AtomicU64,
    /// When (clock µs, plus 1; 0 = never) the overflow was last logged.
    warned: AtomicU64,
    /// Keys held, for the `tollgate_keys` gauge (feature `metrics`; counted on growth only).
    keys: KeysGauge,
}

impl<A: Compiled> fmt::Debug for Table<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("name", &self.name)
            .field("algorithm", &self.algorithm)
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

/// Which shard a fingerprint lives in.
///
/// Bits 32 and up: hashbrown takes a bucket from the low bits and its 7-bit tag from the top
/// bits, so the shard choice must not be either, or every key in a shard would share them.
#[inline]
fn shard_of(fp: u64, mask: usize) -> usize {
    (fp >> 32) as usize & mask
}

/// The algorithm a check decides with, and the tag that names it in the table's states.
pub(crate) struct Plan<'a, A> {
    algorithm: &'a A,
    tag: u32,
}

impl<A> Clone for Plan<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Plan<'_, A> {}

/// The table's own quota, named without carrying anything (see [`Table::check`]).
#[derive(Clone, Copy)]
pub(crate) struct Own;

/// What names the quota of a check: [`Own`] or a [`Plan`].
pub(crate) trait Quoted<'a, A: Compiled>: Copy {
    /// The plan, given the table.
    fn plan(self, table: &'a Table<A>) -> Plan<'a, A>;
}

impl<'a, A: Compiled> Quoted<'a, A> for Own {
    #[inline]
    fn plan(self, table: &'a Table<A>) -> Plan<'a, A> {
        Plan {
            algorithm: &table.algorithm,
            tag: 0,
        }
    }
}

impl<'a, A: Compiled> Quoted<'a, A> for Plan<'a, A> {
    #[inline]
    fn plan(self, _: &'a Table<A>) -> Plan<'a, A> {
        self
    }
}

impl<A: Compiled + RebaseAcross> Table<A> {
    /// A table of `shards` shards (a power of two, at most `max_keys`) holding at most
    /// `max_keys` keys in all: each shard gets an equal share, the first `max_keys % shards`
    /// one more.
    fn new(algorithm: A, name: PolicyName, max_keys: usize, shards: usize) -> Self {
        debug_assert!(shards.is_power_of_two() && shards <= max_keys);
        let (share, extra) = (max_keys / shards, max_keys % shards);
        let shards = (0..shards)
            .map(|i| {
                let cap = share + usize::from(i < extra);
                // The backend checked that a share fits below 2^31.
                let cap = u32::try_from(cap).map_or(i32::MAX as u32, |c| c.min(i32::MAX as u32));
                Padded(ShardCell::new(Shard::new(cap)))
            })
            .collect::<Arc<[_]>>();
        Self {
            name,
            mask: shards.len() - 1,
            shards,
            overflow: Arc::new(Overflow {
                state: Padded(Mutex::new(A::State::default())),
                overflowed: AtomicU64::new(0),
                warned: AtomicU64::new(0),
                keys: KeysGauge::default(),
            }),
            wall_clock: algorithm.quota().calendar().is_some(),
            algorithm,
        }
    }

    /// The same table, sharing its keys (and their spending) with this one.
    fn share(&self) -> Self {
        Self {
            algorithm: self.algorithm,
            name: self.name,
            shards: Arc::clone(&self.shards),
            mask: self.mask,
            overflow: Arc::clone(&self.overflow),
            wall_clock: self.wall_clock,
        }
    }

    /// The shard of `fp`.
    #[inline]
    fn cell(&self, fp: u64) -> &ShardCell<A::State> {
        &self.shards[shard_of(fp, self.mask)].0
    }

    /// Locks the shard of `fp` (see [`ShardCell::lock`]).
    #[inline]
    fn shard(&self, fp: u64) -> ShardGuard<'_, A::State> {
        self.cell(fp).lock()
    }

    /// What a check at `quota` (the table's own without one) decides with, or an error if
    /// `quota` is for another algorithm.
    #[inline]
    pub(crate) fn plan<'a>(
        &'a self,
        quota: Option<&'a PlanQuota>,
    ) -> Result<Plan<'a, A>, StoreError> {
        match quota {
            None => Ok(self.own()),
            Some(quota) => self.plan_at(quota),
        }
    }

    /// The table's own quota: tag 0.
    #[inline]
    pub(crate) fn own(&self) -> Plan<'_, A> {
        Plan {
            algorithm: &self.algorithm,
            tag: 0,
        }
    }

    fn plan_at<'a>(&'a self, quota: &'a PlanQuota) -> Result<Plan<'a, A>, StoreError> {
        match A::from_compiled(&quota.compiled) {
            // The table's own quota, however the plan was built: tag 0, no tags to store.
            Some(algorithm) if *algorithm == self.algorithm => Ok(Plan {
                algorithm: &self.algorithm,
                tag: 0,
            }),
            Some(algorithm) => Ok(Plan {
                algorithm,
                tag: quota.tag,
            }),
            None => Err(mismatch(self.name, A::KIND, quota)),
        }
    }

    fn kind(&self) -> AlgorithmKind {
        A::KIND
    }

    /// The algorithm that states tagged `tag` were written under, or `None` if that quota is
    /// no longer kept (see [`PlanQuota`]).
    fn algorithm_of(&self, tag: u32) -> Option<A> {
        if tag == 0 {
            return Some(self.algorithm);
        }
        // Tags stored in this table all name quotas of its algorithm.
        plan_quota::compiled(tag).and_then(|c| A::from_compiled(&c).copied())
    }

    /// Converts the state in `slot` to `plan`'s quota if it was written under another (`now`
    /// is on `plan`'s time base).
    #[inline]
    fn align(
        &self,
        shard: &mut Shard<A::State>,
        slot: u32,
        plan: Plan<'_, A>,
        now: u64,
        offset: UnixOffset<'_>,
    ) {
        let tag = shard.tag(slot);
        if tag != plan.tag {
            self.rebase(shard, slot, tag, plan, now, offset);
        }
    }

    /// The state in `slot` converted to `plan`'s quota, as a copy, if it was written under
    /// another quota that is still known (`now` is on `plan`'s time base); `None` if it was
    /// written under `plan`'s. A check decides on the copy and stores it only if it charges
    /// something: a check of cost 0, or a rejected one, writes nothing, so the key keeps the
    /// state (and the quota) it was written under, and a later change back finds it whole.
    /// A state whose quota is forgotten is converted in place (see [`rebase`](Self::rebase)).
    #[inline]
    fn converted(
        &self,
        shard: &mut Shard<A::State>,
        slot: u32,
        plan: Plan<'_, A>,
        now: u64,
        offset: UnixOffset<'_>,
    ) -> Option<A::State> {
        let tag = shard.tag(slot);
        if tag == plan.tag {
            return None;
        }
        self.convert(shard, slot, tag, plan, now, offset)
    }

    #[cold]
    fn convert(
        &self,
        shard: &mut Shard<A::State>,
        slot: u32,
        tag: u32,
        plan: Plan<'_, A>,
        now: u64,
        offset: UnixOffset<'_>,
    ) -> Option<A::State> {
        match self.algorithm_of(tag) {
            Some(from) => {
                let from_now = shift(plan.algorithm, &from, now, offset);
                let mut state = shard.read_state(slot, Clone::clone);
                plan.algorithm
                    .rebase_across(&from, &mut state, from_now, now);
                Some(state)
            }
            None => {
                self.rebase(shard, slot, tag, plan, now, offset);
                None
            }
        }
    }

    /// Stores `state`, converted to `plan`'s quota and charged, in `slot`.
    #[cold]
    fn store_converted(shard: &mut Shard<A::State>, slot: u32, plan: Plan<'_, A>, state: A::State) {
        shard.update_state(slot, |s| *s = state);
        shard.set_tag(slot, plan.tag);
    }

    #[cold]
    fn rebase(
        &self,
        shard: &mut Shard<A::State>,
        slot: u32,
        tag: u32,
        plan: Plan<'_, A>,
        now: u64,
        offset: UnixOffset<'_>,
    ) {
        match self.algorithm_of(tag) {
            Some(from) => {
                // The state's times are on `from`'s time base: read it there, at the same instant.
                let from_now = shift(plan.algorithm, &from, now, offset);
                shard.update_state(slot, |state| {
                    plan.algorithm.rebase_across(&from, state, from_now, now)
                });
            }
            // The quota the state was written under is forgotten: count the key as having
            // spent its whole budget now, never as a fresh one.
            None => shard.update_state(slot, |state| {
                *state = A::State::default();
                plan.algorithm.apply(state, now, plan.algorithm.capacity());
            }),
        }
        shard.set_tag(slot, plan.tag);
    }

    /// Decides and charges `cost` for the key `fp` at `now`, at the quota `quota` names (the
    /// table's own with [`Own`], which carries nothing: the hot path keeps its registers for
    /// the lookup).
    ///
    /// A held key is first looked up and decided without the lock, on a copy of its state
    /// (see `cell`). A refusal is answered at once: it writes nothing, under the lock or not,
    /// and the copy is the key's state at one instant between two locked accesses, so it is
    /// the refusal a locked check at that instant would have made. An allowed check then takes
    /// the lock and, if no locked access came in between (the shard's version is the one the
    /// copy was read at), stores the charged copy in the same slot: exactly what a locked check
    /// would have stored. Otherwise, and for keys not held, the check is decided under the lock.
    #[inline]
    pub(crate) fn check<'a>(
        &'a self,
        fp: u64,
        now: u64,
        cost: u64,
        quota: impl Quoted<'a, A>,
        offset: UnixOffset<'_>,
    ) -> Decision {
        let cell = self.cell(fp);
        if let Some(seen) = cell.read_unlocked(fp) {
            let plan = quota.plan(self);
            if seen.tag == plan.tag {
                let mut state = seen.state;
                let decision = plan.algorithm.check(&mut state, now, cost);
                if !decision.allowed() {
                    return decision.with_policy(self.name);
                }
                let mut shard = cell.lock();
                if shard.unchanged_since(seen.version) {
                    shard.commit(seen.slot, state);
                    drop(shard);
                    return decision.with_policy(self.name);
                }
                return self.check_locked(shard, fp, now, cost, quota, offset);
            }
        }
        self.check_locked(cell.lock(), fp, now, cost, quota, offset)
    }

    /// [`check`](Self::check) under the lock.
    #[inline]
    fn check_locked<'a>(
        &'a self,
        mut shard: ShardGuard<'_, A::State>,
        fp: u64,
        now: u64,
        cost: u64,
        quota: impl Quoted<'a, A>,
        offset: UnixOffset<'_>,
    ) -> Decision {
        let decision = match shard.lookup(fp) {
            Some(slot) => {
                let plan = quota.plan(self);
                match self.converted(&mut shard, slot, plan, now, offset) {
                    None => {
                        shard.update_state(slot, |state| plan.algorithm.check(state, now, cost))
                    }
                    Some(mut state) => {
                        let decision = plan.algorithm.check(&mut state, now, cost);
                        if decision.allowed() && cost > 0 {
                            Self::store_converted(&mut shard, slot, plan, state);
                        }
                        decision
                    }
                }
            }
            None => self.check_new(&mut shard, fp, now, cost, quota.plan(self), offset),
        };
        drop(shard);
        decision.with_policy(self.name)
    }

    /// Gives back `cost` charged at `reserved_at` to the key `fp` ([`Algorithm::refund`] at
    /// `plan`'s quota), and reports the key as it then stands. A key the shard does not hold
    /// is as good as fresh (or was decided by the overflow bucket): nothing to give back.
    pub(crate) fn refund(
        &self,
        fp: u64,
        reserved_at: u64,
        now: u64,
        cost: u64,
        plan: Plan<'_, A>,
        offset: UnixOffset<'_>,
    ) -> Decision {
        let mut shard = self.shard(fp);
        let decision = match shard.lookup(fp) {
            Some(slot) => {
                self.align(&mut shard, slot, plan, now, offset);
                shard.update_state(slot, |state| {
                    plan.algorithm.refund(state, reserved_at, now, cost);
                    plan.algorithm.decide(state, now, 0)
                })
            }
            None => plan.algorithm.decide(&A::State::default(), now, 0),
        };
        drop(shard);
        decision.with_policy(self.name)
    }

    /// A check of a key the shard does not hold: decided as a fresh key and stored if charged,
    /// or, when the shard has no room for it, decided and charged by the overflow bucket.
    #[cold]
    fn check_new(
        &self,
        shard: &mut Shard<A::State>,
        fp: u64,
        now: u64,
        cost: u64,
        plan: Plan<'_, A>,
        offset: UnixOffset<'_>,
    ) -> Decision {
        let decision = plan.algorithm.decide(&A::State::default(), now, cost);
        // Rejected (a cost above the capacity) or free: nothing to store, nothing to charge.
        if !decision.allowed() || cost == 0 {
            return decision;
        }
        let vacancy = shard.vacancy(|s, tag| self.is_fresh(s, tag, plan, now, offset));
        match shard.occupy(fp, vacancy) {
            Some(slot) => {
                if matches!(vacancy, Vacancy::Grow) {
                    self.overflow.keys.grew(self.name);
                }
                shard.set_tag(slot, plan.tag);
                shard.update_state(slot, |state| plan.algorithm.apply(state, now, cost));
                decision
            }
            None => {
                // The overflow bucket is the table's own quota, on its own time base.
                let own_now = shift(plan.algorithm, &self.algorithm, now, offset);
                let mut overflow = self.overflow_lock(own_now);
                self.algorithm.check(&mut overflow, own_now, cost)
            }
        }
    }

    /// Locks the overflow bucket (the caller holds one of this table's shards), counting and,
    /// at most every [`OVERFLOW_WARN_EVERY`] µs, logging its use.
    #[cold]
    fn overflow_lock(&self, now: u64) -> MutexGuard<'_, A::State> {
        let overflow = &*self.overflow;
        let overflowed = overflow.overflowed.fetch_add(1, Ordering::Relaxed) + 1;
        let last = overflow.warned.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last - 1) >= OVERFLOW_WARN_EVERY;
        if due
            && overflow
                .warned
                .compare_exchange(
                    last,
                    now.saturating_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            tracing::warn!(
                limit = %self.name,
                overflowed,
                "in-memory rate-limit table is full of keys still recovering their budget; \
                 new keys share one overflow bucket of the limit's quota (raise max_keys)"
            );
        }
        overflow.state.0.lock()
    }

    /// Checks decided by the overflow bucket so far.
    fn overflowed(&self) -> u64 {
        self.overflow.overflowed.load(Ordering::Relaxed)
    }

    /// Locks the shard of `fp`, for a check of `cost` at `now` at `plan`'s quota across several
    /// limits, and the overflow bucket too if that check will need it (this keeps one global
    /// lock order: tables in the order of their [`AnyTable::identity`], and within a table its
    /// shard, then its overflow
    /// bucket). A held key's state is converted to `plan`'s quota here, once.
    #[inline]
    pub(crate) fn lock<'a>(
        &'a self,
        fp: u64,
        now: u64,
        cost: u64,
        plan: Plan<'a, A>,
        offset: UnixOffset<'_>,
    ) -> Locked<'a, A> {
        let mut shard = self.shard(fp);
        let target = match shard.lookup(fp) {
            Some(slot) => match self.converted(&mut shard, slot, plan, now, offset) {
                None => Target::Slot(slot),
                Some(state) => Target::Converted(slot, state),
            },
            // Free or impossible: decided as a fresh key, never stored.
            None if cost == 0 || cost > plan.algorithm.capacity() => Target::Fresh,
            None => match shard.vacancy(|s, tag| self.is_fresh(s, tag, plan, now, offset)) {
                Vacancy::Full => {
                    // The overflow bucket is the table's own quota, on its own time base.
                    let own_now = shift(plan.algorithm, &self.algorithm, now, offset);
                    Target::Overflow(self.overflow_lock(own_now), own_now)
                }
                vacancy => Target::Vacant(vacancy),
            },
        };
        Locked {
            table: self,
            plan,
            shard,
            fp,
            target,
        }
    }

    /// Whether `state` (written under the quota tagged `tag`) behaves exactly like a fresh
    /// key's at `now` (read on `plan`'s time base) under that quota (it has been idle long
    /// enough to refill completely), so its slot may be recycled early.
    fn is_fresh(
        &self,
        state: &A::State,
        tag: u32,
        plan: Plan<'_, A>,
        now: u64,
        offset: UnixOffset<'_>,
    ) -> bool {
        let fresh = |algorithm: &A| {
            // The state's times are on its own quota's time base.
            let now = shift(plan.algorithm, algorithm, now, offset);
            algorithm.decide(state, now, 0) == algorithm.decide(&A::State::default(), now, 0)
        };
        match tag {
            0 => fresh(&self.algorithm),
            // A quota no longer kept: judged by the limit's own quota, so that the slot of a key
            // never seen again is not held forever.
            tag => fresh(&self.algorithm_of(tag).unwrap_or(self.algorithm)),
        }
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().len()).sum()
    }

    fn memory_usage(&self) -> usize {
        let shards = self.shards.len() * std::mem::size_of::<LockedShard<A>>()
            + self
                .algorithm
                .state_heap_bytes(&self.overflow.state.0.lock());
        shards
            + self
                .shards
                .iter()
                .map(|s| {
                    s.0.lock()
                        .memory_usage(|state| self.algorithm.state_heap_bytes(state))
                })
                .sum::<usize>()
    }
}

/// The error for a check at a quota compiled for another algorithm than the limit's.
#[cold]
fn mismatch(name: PolicyName, kind: AlgorithmKind, quota: &PlanQuota) -> StoreError {
    let message = format!(
        "limit {name} decides with {kind}, but the check's quota ({}) is compiled for {}; build \
         the PlanQuota with AlgorithmKind::{kind:?}, the limit's algorithm",
        quota.quota(),
        quota.algorithm(),
    );
    tracing::warn!(%message, "invalid in-memory rate-limit check");
    StoreError::new(StoreErrorKind::Other, message)
}

/// Which state a locked check decides and charges.
enum Target<'a, S> {
    /// The key's slot.
    Slot(u32),
    /// The key's slot, whose state was written under another quota, and that state converted
    /// to the check's: stored only if charged.
    Converted(u32, S),
    /// A key not held, checked at no cost (or above the capacity): a fresh state, not stored.
    Fresh,
    /// A key not held, stored where this says if charged.
    Vacant(Vacancy),
    /// A key not held, in a shard with no room for it: the overflow bucket, and the check's
    /// time on the time base of the table's own quota.
    Overflow(MutexGuard<'a, S>, u64),
}

/// One limit's shard, locked for a check across several limits: decide first, apply only if
/// every limit allowed, all under the lock.
pub(crate) struct Locked<'a, A: Compiled> {
    table: &'a Table<A>,
    plan: Plan<'a, A>,
    shard: ShardGuard<'a, A::State>,
    fp: u64,
    target: Target<'a, A::State>,
}

impl<A: Compiled> Locked<'_, A> {
    /// Decides `cost` (the cost given to [`Table::lock`], or 0) at `now` without charging.
    #[inline]
    pub(crate) fn decide(&mut self, now: u64, cost: u64) -> Decision {
        let algorithm = self.plan.algorithm;
        let decision = match &self.target {
            Target::Slot(slot) => self
                .shard
                .read_state(*slot, |state| algorithm.decide(state, now, cost)),
            Target::Converted(_, state) => algorithm.decide(state, now, cost),
            Target::Fresh | Target::Vacant(_) => algorithm.decide(&A::State::default(), now, cost),
            Target::Overflow(state, own_now) => self.table.algorithm.decide(state, *own_now, cost),
        };
        decision.with_policy(self.table.name)
    }

    /// Charges what [`decide`](Self::decide) allowed at the same `now` and `cost`.
    #[inline]
    pub(crate) fn apply(&mut self, now: u64, cost: u64) {
        let algorithm = self.plan.algorithm;
        let slot = match &mut self.target {
            Target::Slot(slot) => *slot,
            // Charged nothing: the key keeps the state it was written under.
            Target::Converted(..) if cost == 0 => return,
            Target::Converted(slot, state) => {
                let slot = *slot;
                algorithm.apply(state, now, cost);
                let state = std::mem::take(state);
                self.shard.update_state(slot, |s| *s = state);
                self.shard.set_tag(slot, self.plan.tag);
                self.target = Target::Slot(slot);
                return;
            }
            // A fresh key charged nothing stays fresh: no need to store it.
            Target::Fresh => return,
            Target::Vacant(_) if cost == 0 => return,
            Target::Vacant(vacancy) => {
                // The vacancy was found under this lock, so it is still there.
                let Some(slot) = self.shard.occupy(self.fp, *vacancy) else {
                    return;
                };
                if matches!(vacancy, Vacancy::Grow) {
                    self.table.overflow.keys.grew(self.table.name);
                }
                self.shard.set_tag(slot, self.plan.tag);
                self.target = Target::Slot(slot);
                slot
            }
            Target::Overflow(state, own_now) => {
                return self.table.algorithm.apply(state, *own_now, cost)
            }
        };
        self.shard
            .update_state(slot, |state| algorithm.apply(state, now, cost));
    }
}

/// Expands `$body` once per algorithm, with `$t` bound to the typed table (or locked shard).
macro_rules! dispatch {
    ($enum:ident, $value:expr, $t:ident => $body:expr) => {
        match $value {
            $enum::TokenBucket($t) => $body,
            $enum::Gcra($t) => $body,
            $enum::FixedWindow($t) => $body,
            $enum::SlidingWindow($t) => $body,
            $enum::SlidingLog($t) => $body,
            $enum::LeakyBucket($t) => $body,
        }
    };
}

/// A table of any algorithm: the algorithm is chosen once, when the store is built, and each
/// check costs one `match`, with no boxing or virtual call.
#[derive(Debug)]
pub(crate) enum AnyTable {
    TokenBucket(Table<TokenBucket>),
    Gcra(Table<Gcra>),
    FixedWindow(Table<FixedWindow>),
    SlidingWindow(Table<SlidingWindow>),
    SlidingLog(Table<SlidingLog>),
    LeakyBucket(Table<LeakyBucket>),
}

impl AnyTable {
    /// The table for `spec`, holding at most `max_keys` keys over `shards` shards.
    pub(crate) fn new(
        spec: &LimitSpec,
        max_keys: usize,
        shards: usize,
    ) -> Result<Self, ConfigError> {
        let (quota, name) = (*spec.quota(), spec.name());
        Ok(match spec.algorithm() {
            AlgorithmKind::TokenBucket => {
                AnyTable::TokenBucket(Table::new(TokenBucket::new(quota)?, name, max_keys, shards))
            }
            AlgorithmKind::Gcra => {
                AnyTable::Gcra(Table::new(Gcra::new(quota)?, name, max_keys, shards))
            }
            AlgorithmKind::FixedWindow => {
                AnyTable::FixedWindow(Table::new(FixedWindow::new(quota)?, name, max_keys, shards))
            }
            AlgorithmKind::SlidingWindow => AnyTable::SlidingWindow(Table::new(
                SlidingWindow::new(quota)?,
                name,
                max_keys,
                shards,
            )),
            AlgorithmKind::SlidingLog => {
                AnyTable::SlidingLog(Table::new(SlidingLog::new(quota)?, name, max_keys, shards))
            }
            AlgorithmKind::LeakyBucket => {
                AnyTable::LeakyBucket(Table::new(LeakyBucket::new(quota)?, name, max_keys, shards))
            }
        })
    }

    /// Decides and charges `cost` for `fp` at `now` at the table's own quota: the hot path.
    #[inline]
    pub(crate) fn check_own(
        &self,
        fp: u64,
        now: u64,
        cost: u64,
        offset: UnixOffset<'_>,
    ) -> Decision {
        dispatch!(AnyTable, self, t => t.check(fp, now, cost, Own, offset))
    }

    /// The same table, sharing its keys with this one (for a reload).
    pub(crate) fn share(&self) -> Self {
        match self {
            AnyTable::TokenBucket(t) => AnyTable::TokenBucket(t.share()),
            AnyTable::Gcra(t) => AnyTable::Gcra(t.share()),
            AnyTable::FixedWindow(t) => AnyTable::FixedWindow(t.share()),
            AnyTable::SlidingWindow(t) => AnyTable::SlidingWindow(t.share()),
            AnyTable::SlidingLog(t) => AnyTable::SlidingLog(t.share()),
            AnyTable::LeakyBucket(t) => AnyTable::LeakyBucket(t.share()),
        }
    }

    /// Decides and charges `cost` for `fp` at `now`, at `quota` (the table's own without
    /// one); an error, charging nothing, if `quota` is for another algorithm.
    #[inline]
    pub(crate) fn check(
        &self,
        fp: u64,
        now: u64,
        cost: u64,
        quota: Option<&PlanQuota>,
        offset: UnixOffset<'_>,
    ) -> Result<Decision, StoreError> {
        dispatch!(AnyTable, self, t => Ok(t.check(fp, now, cost, t.plan(quota)?, offset)))
    }

    /// Gives back `cost` charged at `reserved_at` to `fp`, at `quota`.
    pub(crate) fn refund(
        &self,
        fp: u64,
        reserved_at: u64,
        now: u64,
        cost: u64,
        quota: Option<&PlanQuota>,
        offset: UnixOffset<'_>,
    ) -> Result<Decision, StoreError> {
        dispatch!(AnyTable, self, t => {
            Ok(t.refund(fp, reserved_at, now, cost, t.plan(quota)?, offset))
        })
    }

    /// Which keys this table holds, the same in every store that shares them (see
    /// [`share`](Self::share)): the order in which checks across several limits lock tables,
    /// so that checks on a store and on the store a reload made from it (whose limits may be in
    /// another order) lock shared tables in the same order and cannot deadlock.
    pub(crate) fn identity(&self) -> usize {
        dispatch!(AnyTable, self, t => Arc::as_ptr(&t.shards).cast::<u8>() as usize)
    }

    /// Whether a check at `quota` can be decided by this table (its algorithm is the table's).
    pub(crate) fn accepts(&self, quota: Option<&PlanQuota>) -> Result<(), StoreError> {
        dispatch!(AnyTable, self, t => t.plan(quota).map(drop))
    }

    /// Locks `fp`'s shard for a check of `cost` at `now` at `quota` across several limits.
    #[inline]
    pub(crate) fn lock<'a>(
        &'a self,
        fp: u64,
        now: u64,
        cost: u64,
        quota: Option<&'a PlanQuota>,
        offset: UnixOffset<'_>,
    ) -> Result<AnyLocked<'a>, StoreError> {
        Ok(match self {
            AnyTable::TokenBucket(t) => {
                AnyLocked::TokenBucket(t.lock(fp, now, cost, t.plan(quota)?, offset))
            }
            AnyTable::Gcra(t) => AnyLocked::Gcra(t.lock(fp, now, cost, t.plan(quota)?, offset)),
            AnyTable::FixedWindow(t) => {
                AnyLocked::FixedWindow(t.lock(fp, now, cost, t.plan(quota)?, offset))
            }
            AnyTable::SlidingWindow(t) => {
                AnyLocked::SlidingWindow(t.lock(fp, now, cost, t.plan(quota)?, offset))
            }
            AnyTable::SlidingLog(t) => {
                AnyLocked::SlidingLog(t.lock(fp, now, cost, t.plan(quota)?, offset))
            }
            AnyTable::LeakyBucket(t) => {
                AnyLocked::LeakyBucket(t.lock(fp, now, cost, t.plan(quota)?, offset))
            }
        })
    }

    /// The limit's name.
    pub(crate) fn name(&self) -> PolicyName {
        dispatch!(AnyTable, self, t => t.name)
    }

    /// The table's algorithm.
    pub(crate) fn kind(&self) -> AlgorithmKind {
        dispatch!(AnyTable, self, t => t.kind())
    }

    /// The table's own quota: the quota of the states at tag 0.
    pub(crate) fn quota(&self) -> Quota {
        dispatch!(AnyTable, self, t => *t.algorithm.quota())
    }

    pub(crate) fn overflowed(&self) -> u64 {
        dispatch!(AnyTable, self, t => t.overflowed())
    }

    /// Whether this limit decides on wall-clock (Unix) time: a calendar-aligned quota.
    #[inline]
    pub(crate) fn wall_clock(&self) -> bool {
        dispatch!(AnyTable, self, t => t.wall_clock)
    }

    pub(crate) fn shards(&self) -> usize {
        dispatch!(AnyTable, self, t => t.shards.len())
    }

    pub(crate) fn len(&self) -> usize {
        dispatch!(AnyTable, self, t => t.len())
    }

    pub(crate) fn memory_usage(&self) -> usize {
        dispatch!(AnyTable, self, t => t.memory_usage())
    }
}

/// A locked shard of any algorithm's table.
pub(crate) enum AnyLocked<'a> {
    TokenBucket(Locked<'a, TokenBucket>),
    Gcra(Locked<'a, Gcra>),
    FixedWindow(Locked<'a, FixedWindow>),
    SlidingWindow(Locked<'a, SlidingWindow>),
    SlidingLog(Locked<'a, SlidingLog>),
    LeakyBucket(Locked<'a, LeakyBucket>),
}

impl AnyLocked<'_> {
    #[inline]
    pub(crate) fn decide(&mut self, now: u64, cost: u64) -> Decision {
        dispatch!(AnyLocked, self, l => l.decide(now, cost))
    }

    #[inline]
    pub(crate) fn apply(&mut self, now: u64, cost: u64) {
        dispatch!(AnyLocked, self, l => l.apply(now, cost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    #[test]
    fn shard_choice_avoids_hashbrown_bits() {
        // Keys differing only in the low 32 bits or the top 7 bits share a shard...
        assert_eq!(
            shard_of(0x0000_0005_0000_0001, 7),
            shard_of(0xFE00_0005_FFFF_FFFF, 7)
        );
        // ...and bits 32.. pick it.
        assert_eq!(shard_of(0x0000_0003_0000_0000, 7), 3);
    }

    /// Counts WARN events (a minimal subscriber: the crate has no subscriber dependency).
    struct Warnings(std::sync::Arc<AtomicU64>);

    impl tracing::Subscriber for Warnings {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if *event.metadata().level() == tracing::Level::WARN {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn overflow_is_counted_and_logged_at_most_every_ten_seconds() {
        // A unit comes back every 8,640 s: key 1 does not recover during the test.
        let tb = TokenBucket::new(Quota::per_day(10)).unwrap();
        let table = Table::new(tb, PolicyName::new("t"), 1, 1);
        let own = table.own();
        let warnings = std::sync::Arc::new(AtomicU64::new(0));
        let subscriber = Warnings(warnings.clone());
        tracing::subscriber::with_default(subscriber, || {
            assert!(table.check(1, 0, 1, own, &|| 0).allowed());
            // Key 1 has spent: keys 2.. go to the overflow bucket, 1,000 checks in 10 s.
            for i in 0..1_000u64 {
                table.check(2 + i, i * 10_000, 1, own, &|| 0);
            }
            assert_eq!(table.overflowed(), 1_000);
            assert_eq!(warnings.load(Ordering::Relaxed), 1, "one warning per 10 s");
            table.check(5_000, OVERFLOW_WARN_EVERY, 1, own, &|| 0);
            assert_eq!(warnings.load(Ordering::Relaxed), 2);
            table.check(5_001, OVERFLOW_WARN_EVERY + 1, 1, own, &|| 0);
            assert_eq!(warnings.load(Ordering::Relaxed), 2);
        });
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn a_refusal_of_a_held_key_writes_nothing_and_an_allowed_check_locks() {
        let tb = TokenBucket::new(Quota::per_hour(2)).unwrap();
        let table = Table::new(tb, PolicyName::new("t"), 10, 1);
        let version = || table.shards[0].0.version();
        let fp = 42;
        assert!(
            table.check(fp, 0, 1, Own, &|| 0).allowed(),
            "a new key, under the lock"
        );
        let before = version();
        let second = table.check(fp, 0, 1, Own, &|| 0);
        assert!(second.allowed() && second.remaining() == 0);
        assert_eq!(
            version(),
            before + 2,
            "an allowed check takes the lock once"
        );
        let refused = table.check(fp, 0, 1, Own, &|| 0);
        assert!(!refused.allowed());
        assert_eq!(refused.policy().as_str(), "t");
        assert_eq!(refused.remaining(), 0);
        assert_eq!(
            refused.retry_after(),
            Some(std::time::Duration::from_secs(1800))
        );
        assert_eq!(version(), before + 2, "a refusal took no lock");
        // The refusal is the one the locked path makes (through the multi-limit path).
        let mut locked = table.lock(fp, 0, 1, table.own(), &|| 0);
        assert_eq!(locked.decide(0, 1), refused);
    }

    #[test]
    fn caps_split_the_bound_exactly() {
        let tb = TokenBucket::new(Quota::per_second(1)).unwrap();
        let table = Table::new(tb, PolicyName::new("t"), 10, 4);
        let caps: Vec<u32> = table.shards.iter().map(|s| s.0.lock().cap()).collect();
        assert_eq!(caps, [3, 3, 2, 2]);
    }
}
