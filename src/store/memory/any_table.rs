//! A table of any algorithm: the algorithm is chosen once, when the store is built, and each
//! check costs one `match`, with no boxing or virtual call.

use super::rebase::{Own, UnixOffset};
use super::table::{Locked, Table};
use crate::algorithm::{
    Algorithm, AlgorithmKind, FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow,
    TokenBucket,
};
use crate::decision::{Decision, Name};
use crate::error::{ConfigError, StoreError};
use crate::quota::Quota;
use crate::store::{LimitSpec, PlanQuota};

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
        dispatch!(AnyTable, self, t => Ok(t.check(fp, now, cost, t.at_quota(quota)?, offset)))
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
            Ok(t.refund(fp, reserved_at, now, cost, t.at_quota(quota)?, offset))
        })
    }

    /// Which keys this table holds, the same in every store that shares them (see
    /// [`share`](Self::share)): the order in which checks across several limits lock tables,
    /// so that checks on a store and on the store a reload made from it (whose limits may be in
    /// another order) lock shared tables in the same order and cannot deadlock.
    pub(crate) fn identity(&self) -> usize {
        dispatch!(AnyTable, self, t => t.identity())
    }

    /// Whether a check at `quota` can be decided by this table (its algorithm is the table's).
    pub(crate) fn accepts(&self, quota: Option<&PlanQuota>) -> Result<(), StoreError> {
        dispatch!(AnyTable, self, t => t.at_quota(quota).map(drop))
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
                AnyLocked::TokenBucket(t.lock(fp, now, cost, t.at_quota(quota)?, offset))
            }
            AnyTable::Gcra(t) => AnyLocked::Gcra(t.lock(fp, now, cost, t.at_quota(quota)?, offset)),
            AnyTable::FixedWindow(t) => {
                AnyLocked::FixedWindow(t.lock(fp, now, cost, t.at_quota(quota)?, offset))
            }
            AnyTable::SlidingWindow(t) => {
                AnyLocked::SlidingWindow(t.lock(fp, now, cost, t.at_quota(quota)?, offset))
            }
            AnyTable::SlidingLog(t) => {
                AnyLocked::SlidingLog(t.lock(fp, now, cost, t.at_quota(quota)?, offset))
            }
            AnyTable::LeakyBucket(t) => {
                AnyLocked::LeakyBucket(t.lock(fp, now, cost, t.at_quota(quota)?, offset))
            }
        })
    }

    /// The limit's name.
    pub(crate) fn name(&self) -> Name {
        dispatch!(AnyTable, self, t => t.name())
    }

    /// The table's algorithm.
    pub(crate) fn kind(&self) -> AlgorithmKind {
        dispatch!(AnyTable, self, t => t.kind())
    }

    /// The table's own quota: the quota of the states at tag 0.
    pub(crate) fn quota(&self) -> Quota {
        dispatch!(AnyTable, self, t => *t.algorithm().quota())
    }

    pub(crate) fn overflowed(&self) -> u64 {
        dispatch!(AnyTable, self, t => t.overflowed())
    }

    /// Whether this limit decides on wall-clock (Unix) time: a calendar-aligned quota.
    #[inline]
    pub(crate) fn wall_clock(&self) -> bool {
        dispatch!(AnyTable, self, t => t.wall_clock())
    }

    pub(crate) fn shards(&self) -> usize {
        dispatch!(AnyTable, self, t => t.shard_count())
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
