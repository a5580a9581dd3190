//! One limit's state: an algorithm and its keys, spread over independently locked shards.

use std::fmt;

use parking_lot::{Mutex, MutexGuard};

use super::shard::Shard;
use crate::algorithm::{
    Algorithm, AlgorithmKind, FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow,
    TokenBucket,
};
use crate::decision::{Decision, PolicyName};
use crate::error::ConfigError;
use crate::store::LimitSpec;

/// A value alone on its cache lines, so neighbouring shards' locks do not false-share.
#[repr(align(128))]
struct Padded<T>(T);

/// One shard of a table, behind its lock, on its own cache lines.
type LockedShard<A> = Padded<Mutex<Shard<<A as Algorithm>::State>>>;

/// The keys of one limit, typed by its algorithm.
pub(crate) struct Table<A: Algorithm> {
    algorithm: A,
    name: PolicyName,
    shards: Box<[LockedShard<A>]>,
    /// `shards.len() - 1` (the count is a power of two).
    mask: usize,
}

impl<A: Algorithm> fmt::Debug for Table<A> {
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

impl<A: Algorithm> Table<A> {
    /// A table of `shards` shards (a power of two, at most `max_keys`) holding at most
    /// `max_keys` keys in all: each shard gets an equal share, the first `max_keys % shards`
    /// one more.
    fn new(algorithm: A, name: PolicyName, max_keys: usize, shards: usize) -> Self {
        debug_assert!(shards.is_power_of_two() && shards <= max_keys);
        let (share, extra) = (max_keys / shards, max_keys % shards);
        let shards = (0..shards)
            .map(|i| {
                let cap = share + usize::from(i < extra);
                // The backend checked that a share fits below `u32::MAX`.
                let cap = u32::try_from(cap).unwrap_or(u32::MAX - 1);
                Padded(Mutex::new(Shard::new(cap)))
            })
            .collect::<Box<[_]>>();
        Self {
            algorithm,
            name,
            mask: shards.len() - 1,
            shards,
        }
    }

    #[inline]
    fn shard(&self, fp: u64) -> &Mutex<Shard<A::State>> {
        &self.shards[shard_of(fp, self.mask)].0
    }

    /// Decides and charges `cost` for the key `fp` at `now`: one lock, one lookup.
    #[inline]
    pub(crate) fn check(&self, fp: u64, now: u64, cost: u64) -> Decision {
        let mut shard = self.shard(fp).lock();
        let decision = match shard.lookup(fp) {
            Some(slot) => self.algorithm.check(shard.state_mut(slot), now, cost),
            None => {
                let decision = self.algorithm.decide(&A::State::default(), now, cost);
                if decision.allowed() && cost > 0 {
                    let slot = shard.insert(fp, |tail| self.is_fresh(tail, now));
                    self.algorithm.apply(shard.state_mut(slot), now, cost);
                }
                decision
            }
        };
        drop(shard);
        decision.with_policy(self.name)
    }

    /// Locks the shard of `fp`, for a check across several limits.
    #[inline]
    pub(crate) fn lock(&self, fp: u64) -> Locked<'_, A> {
        Locked {
            table: self,
            shard: self.shard(fp).lock(),
            fp,
            slot: None,
        }
    }

    /// Whether `state` behaves exactly like a fresh key's at `now` (it has been idle long
    /// enough to refill completely), so its slot may be recycled early.
    fn is_fresh(&self, state: &A::State, now: u64) -> bool {
        self.algorithm.decide(state, now, 0) == self.algorithm.decide(&A::State::default(), now, 0)
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().len()).sum()
    }

    fn memory_usage(&self) -> usize {
        let shards = self.shards.len() * std::mem::size_of::<LockedShard<A>>();
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

/// One limit's shard, locked for a check across several limits: decide first, apply only if
/// every limit allowed, all under the lock.
pub(crate) struct Locked<'a, A: Algorithm> {
    table: &'a Table<A>,
    shard: MutexGuard<'a, Shard<A::State>>,
    fp: u64,
    /// The key's slot, if it exists (found by `decide`).
    slot: Option<u32>,
}

impl<A: Algorithm> Locked<'_, A> {
    /// Decides `cost` at `now` without charging (refreshes the key's recency).
    #[inline]
    pub(crate) fn decide(&mut self, now: u64, cost: u64) -> Decision {
        if self.slot.is_none() {
            self.slot = self.shard.lookup(self.fp);
        }
        let decision = match self.slot {
            Some(slot) => self
                .table
                .algorithm
                .decide(self.shard.state(slot), now, cost),
            None => self.table.algorithm.decide(&A::State::default(), now, cost),
        };
        decision.with_policy(self.table.name)
    }

    /// Charges what [`decide`](Self::decide) allowed at the same `now` and `cost`.
    #[inline]
    pub(crate) fn apply(&mut self, now: u64, cost: u64) {
        let table = self.table;
        let slot = match self.slot {
            Some(slot) => slot,
            // A fresh key charged nothing stays fresh: no need to store it.
            None if cost == 0 => return,
            None => {
                let slot = self.shard.insert(self.fp, |tail| table.is_fresh(tail, now));
                self.slot = Some(slot);
                slot
            }
        };
        table.algorithm.apply(self.shard.state_mut(slot), now, cost);
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

    #[inline]
    pub(crate) fn check(&self, fp: u64, now: u64, cost: u64) -> Decision {
        dispatch!(AnyTable, self, t => t.check(fp, now, cost))
    }

    #[inline]
    pub(crate) fn lock(&self, fp: u64) -> AnyLocked<'_> {
        match self {
            AnyTable::TokenBucket(t) => AnyLocked::TokenBucket(t.lock(fp)),
            AnyTable::Gcra(t) => AnyLocked::Gcra(t.lock(fp)),
            AnyTable::FixedWindow(t) => AnyLocked::FixedWindow(t.lock(fp)),
            AnyTable::SlidingWindow(t) => AnyLocked::SlidingWindow(t.lock(fp)),
            AnyTable::SlidingLog(t) => AnyLocked::SlidingLog(t.lock(fp)),
            AnyTable::LeakyBucket(t) => AnyLocked::LeakyBucket(t.lock(fp)),
        }
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

    #[test]
    fn caps_split_the_bound_exactly() {
        let tb = TokenBucket::new(Quota::per_second(1)).unwrap();
        let table = Table::new(tb, PolicyName::new("t"), 10, 4);
        let caps: Vec<u32> = table.shards.iter().map(|s| s.0.lock().cap()).collect();
        assert_eq!(caps, [3, 3, 2, 2]);
    }
}
