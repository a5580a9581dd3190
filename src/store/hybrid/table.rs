//! The local tier: per (limit, key) what this instance holds — the unspent units of its lease,
//! the last refusal Redis gave, the key's demand, units owed to Redis after an outage — in a
//! sharded map with a bound on its size.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::lease_plan::Demand;
use crate::decision::Decision;
use crate::key::Key;

const SHARDS: usize = 64;

/// What this instance knows about one key of one limit. Times are the local clock's (µs) unless
/// named Redis.
#[derive(Debug, Default)]
pub(crate) struct Entry {
    /// Leased units not spent yet.
    pub(crate) units: u64,
    /// When the lease stops being usable.
    pub(crate) expires: u64,
    /// Redis time of the lease (what a refund of its units is measured from).
    pub(crate) leased_at: u64,
    /// Redis's remaining for the key right after the lease (what others may still take).
    pub(crate) shared_remaining: u64,
    /// When the key would be full again, as of the lease or the refusal.
    pub(crate) reset_at: u64,
    /// Refused locally until then (a Redis refusal's retry-after).
    pub(crate) refused_until: u64,
    /// Once the lease is spent, refused locally until then: the lease left Redis with fewer
    /// units than the next lease would wait for, and they cannot have refilled before.
    pub(crate) dry_until: u64,
    /// Redis's remaining at the refusal.
    pub(crate) refused_remaining: u64,
    /// A lease call is on the wire; others wait for it.
    pub(crate) fetching: Option<Arc<Notify>>,
    /// Units admitted by the failure policy while Redis could not be reached, charged with
    /// the next lease.
    pub(crate) owed: u64,
    /// Units this instance knows the key had spent in Redis at Redis time `known_at` (µs): the
    /// capacity less Redis's remaining at its last reply for the key (a lease or a refusal).
    /// Sent with every lease call: if Redis lost the key's state meanwhile, the script charges
    /// them at `known_at` before anything else (see the module docs).
    pub(crate) known_spent: u64,
    /// Redis time (µs) of the reply `known_spent` comes from.
    pub(crate) known_at: u64,
    /// Redis time (µs) until which `known_spent` may be charged: the end of `known_at`'s window
    /// for the fixed window, of the window after it for the sliding window counter (whose
    /// estimate still weighs it there), 0 (no end: the algorithm refills it) for the buckets.
    pub(crate) known_until: u64,
    /// The key is written at a plan's quota in Redis: checked plainly.
    pub(crate) plain: bool,
    pub(crate) demand: Demand,
    pub(crate) last_seen: u64,
}

impl Entry {
    /// Whether the lease holds `cost` units at `now`.
    #[inline]
    pub(crate) fn can_take(&self, now: u64, cost: u64) -> bool {
        self.units >= cost && now < self.expires
    }

    /// Whether Redis refused the key and it is still refused at `now`.
    #[inline]
    pub(crate) fn refused(&self, now: u64) -> bool {
        now < self.refused_until
    }

    /// Whether a request of `cost` at `now` is refused without asking Redis: Redis refused the
    /// key, or the lease cannot pay for it and Redis was left dry.
    #[inline]
    pub(crate) fn refuses(&self, now: u64, cost: u64) -> bool {
        self.refused(now) || (now < self.dry_until && !self.can_take(now, cost))
    }

    /// Until when a request refused by [`refuses`](Self::refuses) is refused.
    #[inline]
    fn refused_until_at(&self, now: u64) -> u64 {
        if self.refused(now) {
            self.refused_until
        } else {
            self.dry_until
        }
    }

    /// The decision for a request admitted from the lease (after taking its units): Redis's
    /// remaining at the lease plus what this instance still holds.
    pub(crate) fn allowed(&self, now: u64, limit: u64) -> Decision {
        Decision::allowed_with(
            limit,
            self.shared_remaining.saturating_add(self.units).min(limit),
            Duration::from_micros(self.reset_at.saturating_sub(now)),
        )
    }

    /// As [`allowed`](Self::allowed), for a limit that allowed in a request another limit refused.
    pub(crate) fn standing(&self, now: u64, limit: u64) -> Decision {
        if self.refused(now) || (now < self.dry_until && self.units == 0) {
            return self.rejected(now, limit);
        }
        if now < self.expires {
            self.allowed(now, limit)
        } else {
            Decision::allowed_with(
                limit,
                self.shared_remaining.min(limit),
                Duration::from_micros(self.reset_at.saturating_sub(now)),
            )
        }
    }

    /// The decision for a request refused from the memory of a refusal.
    pub(crate) fn rejected(&self, now: u64, limit: u64) -> Decision {
        let remaining = if self.refused(now) {
            self.refused_remaining
        } else {
            self.shared_remaining
        };
        Decision::rejected(
            limit,
            remaining.min(limit),
            Duration::from_micros(self.reset_at.saturating_sub(now)),
            Duration::from_micros(self.refused_until_at(now).saturating_sub(now).max(1)),
        )
    }

    /// Whether the entry holds nothing worth keeping at `now`.
    fn idle(&self, now: u64) -> bool {
        self.fetching.is_none()
            && (self.units == 0 || now >= self.expires)
            && now >= self.refused_until
            && now >= self.dry_until
            && self.owed == 0
    }
}

pub(crate) type EntryKey = (usize, Key<'static>);

/// The sharded map of entries.
pub(crate) struct Table {
    shards: Box<[Mutex<HashMap<EntryKey, Entry>>]>,
    hasher: RandomState,
    per_shard: usize,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("per_shard", &self.per_shard)
            .finish_non_exhaustive()
    }
}

/// A locked shard, and the entry's key in it.
pub(crate) struct Slot<'t> {
    guard: MutexGuard<'t, HashMap<EntryKey, Entry>>,
    key: EntryKey,
}

impl Slot<'_> {
    /// The entry (present: [`Table::lock`] made sure).
    pub(crate) fn entry(&mut self) -> &mut Entry {
        self.guard
            .get_mut(&self.key)
            .expect("locked slots hold their entry")
    }
}

impl Table {
    /// A table for at most `max_keys` entries.
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    /// Locks the entry of `limit`'s `key`, creating it if needed. `None` when its shard is full
    /// of entries still in use: the caller checks plainly.
    pub(crate) fn lock(&self, limit: usize, key: &Key<'_>, now: u64) -> Option<Slot<'_>> {
        let h = self.hasher.hash_one((limit, key));
        let shard = &self.shards[(h as usize) % SHARDS];
        let mut guard = shard.lock().unwrap_or_else(|e| e.into_inner());
        let owned = (limit, key.clone().into_owned());
        if !guard.contains_key(&owned) {
            if guard.len() >= self.per_shard {
                guard.retain(|_, e| !e.idle(now));
                if guard.len() >= self.per_shard {
                    return None;
                }
            }
            guard.insert(owned.clone(), Entry::default());
        }
        let mut slot = Slot { guard, key: owned };
        slot.entry().last_seen = now;
        Some(slot)
    }

    /// Entries held (for tests and stats).
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}
