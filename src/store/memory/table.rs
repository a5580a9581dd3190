//! One limit's keys and algorithm, spread over independently locked shards: the check of one
//! limit (the hot path), a refund, and a shard locked for a check across several limits.

use std::fmt;
use std::sync::Arc;

use parking_lot::MutexGuard;

use super::overflow::Overflow;
use super::rebase::{self, shift, AtQuota, Compiled, Quoted, UnixOffset};
use super::seqlock::{ShardCell, ShardGuard};
use super::shard::{Shard, Vacancy};
use crate::algorithm::{Algorithm, AlgorithmKind};
use crate::decision::{Decision, Name};
use crate::error::StoreError;
use crate::store::PlanQuota;

/// A value alone on its cache lines, so neighbouring shards' locks do not false-share.
#[repr(align(128))]
struct Padded<T>(T);

/// One shard of a table, behind its lock, on its own cache lines.
type LockedShard<A> = Padded<ShardCell<<A as Algorithm>::State>>;

/// The keys of one limit, typed by its algorithm.
///
/// Each key's state carries the tag of the quota it was written under (see `rebase`): 0 for
/// `algorithm`, the table's own, or a [`PlanQuota`]'s.
///
/// The keys live behind `Arc`s, so a reload can [`share`](Self::share) them with a new store
/// while the table itself (what a check reads first) stays inline in each store.
pub(crate) struct Table<A: Compiled> {
    algorithm: A,
    name: Name,
    shards: Arc<[LockedShard<A>]>,
    /// `shards.len() - 1` (the count is a power of two).
    mask: usize,
    overflow: Arc<Overflow<A::State>>,
    /// Whether the quota follows the calendar: then `now` is the clock's Unix time.
    wall_clock: bool,
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
/// Bits 32 and up: a shard places a key by the low 32 bits of its fingerprint (see
/// `shard::home`), so the shard choice must not use them, or every key in a shard would share
/// them.
#[inline]
fn shard_of(fp: u64, mask: usize) -> usize {
    (fp >> 32) as usize & mask
}

impl<A: Compiled> Table<A> {
    /// A table of `shards` shards (a power of two, at most `max_keys`) holding at most
    /// `max_keys` keys in all: each shard gets an equal share, the first `max_keys % shards`
    /// one more.
    pub(super) fn new(algorithm: A, name: Name, max_keys: usize, shards: usize) -> Self {
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
            overflow: Arc::new(Overflow::new()),
            wall_clock: algorithm.quota().calendar().is_some(),
            algorithm,
        }
    }

    /// The same table, sharing its keys (and their spending) with this one.
    pub(super) fn share(&self) -> Self {
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
    pub(super) fn at_quota<'a>(
        &'a self,
        quota: Option<&'a PlanQuota>,
    ) -> Result<AtQuota<'a, A>, StoreError> {
        AtQuota::of(&self.algorithm, self.name, quota)
    }

    /// The table's own quota: tag 0.
    #[cfg(test)]
    fn own(&self) -> AtQuota<'_, A> {
        AtQuota::own(&self.algorithm)
    }

    /// The limit's name.
    pub(super) fn name(&self) -> Name {
        self.name
    }

    /// The table's algorithm.
    pub(super) fn kind(&self) -> AlgorithmKind {
        A::KIND
    }

    /// The table's own algorithm: the one of the states at tag 0.
    pub(super) fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// Whether this limit decides on wall-clock (Unix) time: a calendar-aligned quota.
    #[inline]
    pub(super) fn wall_clock(&self) -> bool {
        self.wall_clock
    }

    /// How many shards.
    pub(super) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Which keys this table holds: the same in every table that [`share`](Self::share)s them.
    pub(super) fn identity(&self) -> usize {
        Arc::as_ptr(&self.shards).cast::<u8>() as usize
    }

    /// Decides and charges `cost` for the key `fp` at `now`, at the quota `quoted` names (the
    /// table's own with [`Own`](super::rebase::Own), which carries nothing: the hot path keeps
    /// its registers for the lookup).
    ///
    /// A held key is first looked up and decided without the lock, on a copy of its state
    /// (see `seqlock`). A refusal is answered at once: it writes nothing, under the lock or
    /// not, and the copy is the key's state at one instant between two locked accesses, so it
    /// is the refusal a locked check at that instant would have made. An allowed check then
    /// takes the lock and, if no locked access came in between (the shard's version is the one
    /// the copy was read at), stores the charged copy in the same slot: exactly what a locked
    /// check would have stored. Otherwise, and for keys not held, the check is decided under
    /// the lock.
    #[inline]
    pub(super) fn check<'a>(
        &'a self,
        fp: u64,
        now: u64,
        cost: u64,
        quoted: impl Quoted<'a, A>,
        offset: UnixOffset<'_>,
    ) -> Decision {
        let cell = self.cell(fp);
        if let Some(seen) = cell.read_unlocked(fp) {
            let at = quoted.resolve(&self.algorithm);
            if seen.tag == at.tag {
                let mut state = seen.state;
                let decision = at.algorithm.check(&mut state, now, cost);
                if !decision.allowed() {
                    return decision.with_policy(self.name);
                }
                let mut shard = cell.lock();
                if shard.unchanged_since(seen.version) {
                    shard.commit(seen.slot, state);
                    drop(shard);
                    return decision.with_policy(self.name);
                }
                return self.check_locked(shard, fp, now, cost, quoted, offset);
            }
        }
        self.check_locked(cell.lock(), fp, now, cost, quoted, offset)
    }

    /// [`check`](Self::check) under the lock.
    #[inline]
    fn check_locked<'a>(
        &'a self,
        mut shard: ShardGuard<'_, A::State>,
        fp: u64,
        now: u64,
        cost: u64,
        quoted: impl Quoted<'a, A>,
        offset: UnixOffset<'_>,
    ) -> Decision {
        let own = &self.algorithm;
        let decision = match shard.lookup(fp) {
            Some(slot) => {
                let at = quoted.resolve(own);
                match rebase::converted(own, &mut shard, slot, at, now, offset) {
                    None => shard.update_state(slot, |state| at.algorithm.check(state, now, cost)),
                    Some(mut state) => {
                        let decision = at.algorithm.check(&mut state, now, cost);
                        if decision.allowed() && cost > 0 {
                            rebase::store_converted(&mut shard, slot, at, state);
                        }
                        decision
                    }
                }
            }
            None => self.check_new(&mut shard, fp, now, cost, quoted.resolve(own), offset),
        };
        drop(shard);
        decision.with_policy(self.name)
    }

    /// Gives back `cost` charged at `reserved_at` to the key `fp` ([`Algorithm::refund`] at
    /// `at`'s quota), and reports the key as it then stands. A key the shard does not hold
    /// is as good as fresh (or was decided by the overflow bucket): nothing to give back.
    pub(super) fn refund(
        &self,
        fp: u64,
        reserved_at: u64,
        now: u64,
        cost: u64,
        at: AtQuota<'_, A>,
        offset: UnixOffset<'_>,
    ) -> Decision {
        let mut shard = self.shard(fp);
        let decision = match shard.lookup(fp) {
            Some(slot) => {
                rebase::align(&self.algorithm, &mut shard, slot, at, now, offset);
                shard.update_state(slot, |state| {
                    at.algorithm.refund(state, reserved_at, now, cost);
                    at.algorithm.decide(state, now, 0)
                })
            }
            None => at.algorithm.decide(&A::State::default(), now, 0),
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
        at: AtQuota<'_, A>,
        offset: UnixOffset<'_>,
    ) -> Decision {
        let decision = at.algorithm.decide(&A::State::default(), now, cost);
        // Rejected (a cost above the capacity) or free: nothing to store, nothing to charge.
        if !decision.allowed() || cost == 0 {
            return decision;
        }
        let vacancy = shard.vacancy(|s, tag| self.is_fresh(s, tag, at, now, offset));
        match shard.occupy(fp, vacancy) {
            Some(slot) => {
                if matches!(vacancy, Vacancy::Grow) {
                    self.overflow.keys.grew(self.name);
                }
                shard.set_tag(slot, at.tag);
                shard.update_state(slot, |state| at.algorithm.apply(state, now, cost));
                decision
            }
            None => {
                // The overflow bucket is the table's own quota, on its own time base.
                let own_now = shift(at.algorithm, &self.algorithm, now, offset);
                let mut overflow = self.overflow.lock(self.name, own_now);
                self.algorithm.check(&mut overflow, own_now, cost)
            }
        }
    }

    /// Whether the slot of `state` (tagged `tag`) may be recycled for a new key checked at
    /// `at`'s quota at `now` (see [`rebase::is_fresh`]).
    fn is_fresh(
        &self,
        state: &A::State,
        tag: u32,
        at: AtQuota<'_, A>,
        now: u64,
        offset: UnixOffset<'_>,
    ) -> bool {
        rebase::is_fresh(&self.algorithm, state, tag, at, now, offset)
    }

    /// Checks decided by the overflow bucket so far.
    pub(super) fn overflowed(&self) -> u64 {
        self.overflow.overflowed()
    }

    /// Locks the shard of `fp`, for a check of `cost` at `now` at `at`'s quota across several
    /// limits, and the overflow bucket too if that check will need it (this keeps one global
    /// lock order: tables in the order of their [`identity`](Self::identity), and within a
    /// table its shard, then its overflow bucket). A held key's state is converted to `at`'s
    /// quota here, once.
    #[inline]
    pub(super) fn lock<'a>(
        &'a self,
        fp: u64,
        now: u64,
        cost: u64,
        at: AtQuota<'a, A>,
        offset: UnixOffset<'_>,
    ) -> Locked<'a, A> {
        let mut shard = self.shard(fp);
        let target = match shard.lookup(fp) {
            Some(slot) => {
                match rebase::converted(&self.algorithm, &mut shard, slot, at, now, offset) {
                    None => Target::Slot(slot),
                    Some(state) => Target::Converted(slot, state),
                }
            }
            // Free or impossible: decided as a fresh key, never stored.
            None if cost == 0 || cost > at.algorithm.capacity() => Target::Fresh,
            None => match shard.vacancy(|s, tag| self.is_fresh(s, tag, at, now, offset)) {
                Vacancy::Full => {
                    // The overflow bucket is the table's own quota, on its own time base.
                    let own_now = shift(at.algorithm, &self.algorithm, now, offset);
                    Target::Overflow(self.overflow.lock(self.name, own_now), own_now)
                }
                vacancy => Target::Vacant(vacancy),
            },
        };
        Locked {
            table: self,
            at,
            shard,
            fp,
            target,
        }
    }

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().len()).sum()
    }

    /// Heap bytes held: the shards, their slots and clocks, and what the states own.
    pub(super) fn memory_usage(&self) -> usize {
        let shards = self.shards.len() * std::mem::size_of::<LockedShard<A>>()
            + self
                .overflow
                .inspect(|state| self.algorithm.state_heap_bytes(state));
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
    at: AtQuota<'a, A>,
    shard: ShardGuard<'a, A::State>,
    fp: u64,
    target: Target<'a, A::State>,
}

impl<A: Compiled> Locked<'_, A> {
    /// Decides `cost` (the cost given to [`Table::lock`], or 0) at `now` without charging.
    #[inline]
    pub(crate) fn decide(&mut self, now: u64, cost: u64) -> Decision {
        let algorithm = self.at.algorithm;
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
        let algorithm = self.at.algorithm;
        let slot = match &mut self.target {
            Target::Slot(slot) => *slot,
            // Charged nothing: the key keeps the state it was written under.
            Target::Converted(..) if cost == 0 => return,
            Target::Converted(slot, state) => {
                let slot = *slot;
                algorithm.apply(state, now, cost);
                let state = std::mem::take(state);
                self.shard.update_state(slot, |s| *s = state);
                self.shard.set_tag(slot, self.at.tag);
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
                self.shard.set_tag(slot, self.at.tag);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::algorithm::TokenBucket;
    use crate::quota::Quota;
    use crate::store::memory::overflow::OVERFLOW_WARN_EVERY;
    use crate::store::memory::rebase::Own;

    #[test]
    fn shard_choice_ignores_the_bits_a_shard_places_keys_by() {
        // Keys differing only in the low 32 bits (a key's home slot) or the top bits share a
        // shard...
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
        let table = Table::new(tb, Name::new("t"), 1, 1);
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
        let table = Table::new(tb, Name::new("t"), 10, 1);
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
        let table = Table::new(tb, Name::new("t"), 10, 4);
        let caps: Vec<u32> = table.shards.iter().map(|s| s.0.lock().cap()).collect();
        assert_eq!(caps, [3, 3, 2, 2]);
    }
}
