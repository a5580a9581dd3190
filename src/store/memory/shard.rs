//! One shard of a table: a bounded slab of per-key states with second-chance ("clock")
//! recency, indexed by key fingerprint.
//!
//! Layout, chosen so that a key costs a few tens of bytes however long it is:
//!
//! - `entries: Vec<Entry<S>>` is a dense slab. An entry is the key's 64-bit fingerprint, its
//!   referenced bit and the algorithm state (for the token bucket: 8 + 16 + 1, padded to 32
//!   bytes). Slots are never freed: a slot is reused in place when its key is as good as fresh
//!   (see [`Shard::vacancy`]), so the slab never exceeds the shard's capacity.
//!
//! Recency is a second-chance clock, not a linked LRU list: a hit sets its entry's referenced
//! bit, in the cache line the check reads and writes anyway, where moving a node to the head of
//! a list writes its two neighbours too (two more cache misses per check once the keys outgrow
//! the cache: measured at 1 000 000 keys). Looking for room, a hand sweeps the slab, clearing
//! the bits it passes, and prefers a key whose bit was clear (not used since the hand last
//! passed) among those as good as fresh. Which fresh key goes is only a matter of efficiency:
//! a key as good as fresh decides exactly like a key never seen, so the order never changes a
//! decision, only which idle key a new one replaces.
//! - `index: HashTable<u32>` maps a fingerprint to its slot: 4 bytes plus one control byte per
//!   bucket, at most 7/8 full, so 5.7 to 11.4 bytes per key.
//! - `tags: Vec<u32>`, parallel to the slab, names the quota each state was written under (a
//!   [`PlanQuota`](crate::store::PlanQuota)'s tag; 0 is the limit's own quota). It stays empty,
//!   costing nothing per key, until a state is written under another quota; then it holds 4
//!   bytes per key.
//!
//! Nothing here allocates on a lookup; an insertion allocates only when the slab or the index
//! grows (doubling, clamped to the capacity), which happens a logarithmic number of times.

use std::fmt;

use hashbrown::HashTable;

/// The slab's first allocation, in entries.
const MIN_ALLOC: usize = 8;

/// How many keys a full shard examines, from its clock hand on, for one it may recycle (one
/// whose state is as good as fresh). Bounded, so a shard full of keys that are still recovering
/// costs a new key at most this many checks, never a walk of the whole shard.
pub(crate) const SCAN: usize = 8;

/// Where a new key can go, found by [`Shard::vacancy`] and used by [`Shard::occupy`] under the
/// same lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vacancy {
    /// The shard has room: append a slot.
    Grow,
    /// Recycle this slot, whose key is as good as fresh.
    Reuse(u32),
    /// The shard is full and none of the [`SCAN`] keys at its clock hand may be forgotten.
    Full,
}

/// One key's slot.
#[derive(Debug)]
struct Entry<S> {
    /// The key's fingerprint (see the module docs of `store::memory`).
    fp: u64,
    /// The algorithm's per-key state.
    state: S,
    /// Used since the clock hand last passed this slot.
    referenced: bool,
}

/// A bounded map from fingerprint to state with second-chance eviction of keys as good as
/// fresh.
pub(crate) struct Shard<S> {
    index: HashTable<u32>,
    entries: Vec<Entry<S>>,
    /// The tag of each entry's state, or empty while every tag is 0.
    tags: Vec<u32>,
    /// The clock hand: the next slot [`vacancy`](Self::vacancy) examines (below `entries.len()`,
    /// or 0 while the shard is empty).
    hand: u32,
    /// Most entries this shard holds (at least 1, less than `u32::MAX`).
    cap: u32,
}

impl<S> fmt::Debug for Shard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard")
            .field("len", &self.entries.len())
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

impl<S: Default> Shard<S> {
    /// An empty shard holding at most `cap` keys (`1 <= cap < u32::MAX`). Allocates nothing.
    pub(crate) fn new(cap: u32) -> Self {
        debug_assert!((1..u32::MAX).contains(&cap));
        Self {
            index: HashTable::new(),
            entries: Vec::new(),
            tags: Vec::new(),
            hand: 0,
            cap,
        }
    }

    /// Number of keys held.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Heap bytes held by this shard (slab and index, allocated capacity included), plus what
    /// `heap` says each state owns on the heap.
    pub(crate) fn memory_usage(&self, heap: impl Fn(&S) -> usize) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry<S>>()
            + self.index.allocation_size()
            + self.tags.capacity() * std::mem::size_of::<u32>()
            + self.entries.iter().map(|e| heap(&e.state)).sum::<usize>()
    }

    /// The slot of `fp`, marked referenced.
    // Always inlined: it is most of a check, and six tables' checks (one per algorithm) made
    // the compiler call it out of line (11 more instructions per check, measured).
    #[inline(always)]
    pub(crate) fn lookup(&mut self, fp: u64) -> Option<u32> {
        let entries = &self.entries;
        let slot = *self
            .index
            .find(fp, |&slot| entries[slot as usize].fp == fp)?;
        self.entries[slot as usize].referenced = true;
        Some(slot)
    }

    /// The state in `slot`.
    #[inline]
    pub(crate) fn state(&self, slot: u32) -> &S {
        &self.entries[slot as usize].state
    }

    /// The state in `slot`, mutably.
    #[inline]
    pub(crate) fn state_mut(&mut self, slot: u32) -> &mut S {
        &mut self.entries[slot as usize].state
    }

    /// The tag of the quota the state in `slot` was written under (0: the limit's own).
    #[inline]
    pub(crate) fn tag(&self, slot: u32) -> u32 {
        self.tags.get(slot as usize).copied().unwrap_or(0)
    }

    /// Records that the state in `slot` is now written under the quota tagged `tag`. The
    /// first tag other than 0 allocates the shard's tags (4 bytes per slot of the slab).
    pub(crate) fn set_tag(&mut self, slot: u32, tag: u32) {
        if self.tags.is_empty() {
            if tag == 0 {
                return;
            }
            self.tags.reserve_exact(self.entries.capacity());
            self.tags.resize(self.entries.len(), 0);
        }
        self.tags[slot as usize] = tag;
    }

    /// Where a new key can go without forgetting a key that has spent budget.
    ///
    /// A key whose state `recyclable` (given the state and its tag) says is as good as fresh is
    /// forgotten first, freely. While the shard has room, the key at the clock hand is recycled
    /// if it is as good as fresh (so idle keys are recycled before the slab grows); otherwise
    /// the slab grows. When the shard is full, the hand examines up to [`SCAN`] keys, clearing
    /// their referenced bits, and takes the first unreferenced one that is as good as fresh,
    /// or else the first referenced one that is. Any other key has spent budget it has not yet
    /// regained, and forgetting it would hand that budget back, so a full shard without a
    /// recyclable key among those answers [`Vacancy::Full`].
    pub(crate) fn vacancy(&mut self, recyclable: impl Fn(&S, u32) -> bool) -> Vacancy {
        let len = self.entries.len();
        if len < self.cap as usize {
            if len == 0 {
                return Vacancy::Grow;
            }
            let slot = self.hand;
            let tag = self.tag(slot);
            let entry = &mut self.entries[slot as usize];
            entry.referenced = false;
            let reuse = recyclable(&entry.state, tag);
            self.advance_hand();
            return if reuse {
                Vacancy::Reuse(slot)
            } else {
                Vacancy::Grow
            };
        }
        let mut fallback = None;
        for _ in 0..SCAN.min(len) {
            let slot = self.hand;
            self.advance_hand();
            let tag = self.tag(slot);
            let entry = &mut self.entries[slot as usize];
            let referenced = std::mem::replace(&mut entry.referenced, false);
            if recyclable(&entry.state, tag) {
                if !referenced {
                    return Vacancy::Reuse(slot);
                }
                fallback.get_or_insert(slot);
            }
        }
        match fallback {
            Some(slot) => {
                // On from the slot taken, not past the keys examined after it: those were
                // looked at, not recycled, and the next sweep starts with them.
                self.hand = slot;
                self.advance_hand();
                Vacancy::Reuse(slot)
            }
            None => Vacancy::Full,
        }
    }

    /// Moves the clock hand to the next slot of the slab, wrapping.
    #[inline]
    fn advance_hand(&mut self) {
        let next = self.hand as usize + 1;
        self.hand = if next < self.entries.len() {
            next as u32
        } else {
            0
        };
    }

    /// Inserts `fp` (which must not be present) with a fresh state at tag 0, referenced, where `vacancy` (from [`vacancy`](Self::vacancy), under the same lock) says, and
    /// returns its slot; `None` for [`Vacancy::Full`].
    pub(crate) fn occupy(&mut self, fp: u64, vacancy: Vacancy) -> Option<u32> {
        let slot = match vacancy {
            Vacancy::Full => return None,
            Vacancy::Reuse(slot) => {
                let old = self.entries[slot as usize].fp;
                if let Ok(found) = self.index.find_entry(old, |&s| s == slot) {
                    found.remove();
                } else {
                    debug_assert!(false, "recycled slot missing from the index");
                }
                let entry = &mut self.entries[slot as usize];
                entry.fp = fp;
                entry.state = S::default();
                entry.referenced = true;
                if let Some(tag) = self.tags.get_mut(slot as usize) {
                    *tag = 0;
                }
                slot
            }
            Vacancy::Grow => {
                let len = self.entries.len();
                debug_assert!(len < self.cap as usize, "grew a full shard");
                if len == self.entries.capacity() {
                    // Double, but never past the cap: a full shard holds exactly `cap` entries.
                    let target = (len * 2).max(MIN_ALLOC).min(self.cap as usize);
                    self.entries.reserve_exact(target - len);
                }
                self.entries.push(Entry {
                    fp,
                    state: S::default(),
                    referenced: true,
                });
                if !self.tags.is_empty() {
                    if self.tags.len() == self.tags.capacity() {
                        // Never more room than the slab's.
                        let room = self.entries.capacity() - self.tags.len();
                        self.tags.reserve_exact(room);
                    }
                    self.tags.push(0);
                }
                // `len < cap < u32::MAX`, so the slot fits.
                len as u32
            }
        };
        self.index_insert(fp, slot);
        Some(slot)
    }

    /// [`vacancy`](Self::vacancy) then [`occupy`](Self::occupy) (tests only).
    #[cfg(test)]
    pub(crate) fn insert(&mut self, fp: u64, recyclable: impl Fn(&S, u32) -> bool) -> Option<u32> {
        let vacancy = self.vacancy(recyclable);
        self.occupy(fp, vacancy)
    }

    /// Adds `slot` (whose entry already holds `fp`) to the index.
    ///
    /// Removing a key can leave a tombstone in the index, and once tombstones use up its spare
    /// room, hashbrown would rehash: in place if at most half full, otherwise by doubling. A
    /// full shard that keeps evicting is more than half full, so left alone its index would
    /// double once for nothing. Instead, when no room is left, the index is rebuilt in place
    /// from the slab, and doubled only if the rebuilt table would have less than one eighth of
    /// its keys' worth of room left (so rebuilds stay rare: amortised, at most eight
    /// re-insertions per insertion). Either way the index stays within 5.7 to 12.9 bytes per key.
    fn index_insert(&mut self, fp: u64, slot: u32) {
        let Self { index, entries, .. } = self;
        let hasher = |&s: &u32| entries[s as usize].fp;
        if index.len() < index.capacity() {
            index.insert_unique(fp, slot, hasher);
            return;
        }
        // Every slot of the slab, `slot` included, is a live key.
        let keys = entries.len();
        index.clear();
        let room = index.capacity();
        if keys > room || room - keys < (keys / 8).max(1) {
            index.reserve((room + 1).max(keys), hasher);
        }
        for s in 0..keys as u32 {
            index.insert_unique(entries[s as usize].fp, s, hasher);
        }
    }

    /// The most keys this shard holds (tests only).
    #[cfg(test)]
    pub(crate) fn cap(&self) -> u32 {
        self.cap
    }

    /// Fingerprints in slab order, with their referenced bits, and the hand (tests only).
    #[cfg(test)]
    fn clock(&self) -> (Vec<(u64, bool)>, u32) {
        let slots = self.entries.iter().map(|e| (e.fp, e.referenced)).collect();
        (slots, self.hand)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// States are `u64`s; 0 is "as good as fresh".
    fn fresh(s: &u64, _tag: u32) -> bool {
        *s == 0
    }

    fn insert(shard: &mut Shard<u64>, fp: u64, value: u64) -> Option<u32> {
        let slot = shard.insert(fp, fresh)?;
        *shard.state_mut(slot) = value;
        Some(slot)
    }

    fn get(shard: &mut Shard<u64>, fp: u64) -> Option<u64> {
        shard.lookup(fp).map(|slot| *shard.state(slot))
    }

    #[test]
    fn lookup_finds_inserted_keys_and_misses_others() {
        let mut shard = Shard::new(4);
        insert(&mut shard, 10, 100);
        insert(&mut shard, 20, 200);
        assert_eq!(get(&mut shard, 10), Some(100));
        assert_eq!(get(&mut shard, 20), Some(200));
        assert_eq!(get(&mut shard, 30), None);
        assert_eq!(shard.len(), 2);
    }

    #[test]
    fn a_full_shard_never_forgets_a_spender() {
        let mut shard = Shard::new(3);
        for fp in 1..=3 {
            insert(&mut shard, fp, fp);
        }
        assert_eq!(shard.vacancy(fresh), Vacancy::Full);
        assert_eq!(insert(&mut shard, 4, 4), None, "no room, nobody recovered");
        for fp in 1..=3 {
            assert_eq!(get(&mut shard, fp), Some(fp), "key {fp} kept");
        }
        assert_eq!(shard.len(), 3);
    }

    #[test]
    fn recovered_keys_are_recycled_and_spenders_kept() {
        let mut shard = Shard::new(4);
        for fp in 1..=4 {
            insert(&mut shard, fp, fp);
        }
        // 2 and 3 recover; 1 and 4 have not.
        for fp in [2, 3] {
            let slot = shard.lookup(fp).unwrap();
            *shard.state_mut(slot) = 0;
        }
        insert(&mut shard, 5, 5).unwrap();
        insert(&mut shard, 6, 6).unwrap();
        assert_eq!(get(&mut shard, 2), None, "2 was recycled");
        assert_eq!(get(&mut shard, 3), None, "3 was recycled");
        assert_eq!(insert(&mut shard, 7, 7), None, "nobody else has recovered");
        assert_eq!(shard.len(), 4);
        for fp in [1, 4, 5, 6] {
            assert!(get(&mut shard, fp).is_some(), "key {fp} kept: it has spent");
        }
    }

    /// Sets the state of `fp` without a lookup, so its referenced bit stays as it is.
    fn set_quietly(shard: &mut Shard<u64>, fp: u64, value: u64) {
        let entries = &shard.entries;
        let slot = *shard
            .index
            .find(fp, |&s| entries[s as usize].fp == fp)
            .unwrap();
        shard.entries[slot as usize].state = value;
    }

    #[test]
    fn a_recently_used_fresh_key_gets_a_second_chance() {
        let mut shard = Shard::new(3);
        for fp in 1..=3 {
            insert(&mut shard, fp, fp);
        }
        // All three have recovered; 1 and 2 were used since the hand last passed, 3 was not.
        for (slot, entry) in shard.entries.iter_mut().enumerate() {
            entry.state = 0;
            entry.referenced = slot < 2;
        }
        shard.hand = 0;
        insert(&mut shard, 4, 4).unwrap();
        assert_eq!(
            shard.clock(),
            (vec![(1, false), (2, false), (4, true)], 0),
            "3 made room; the hand cleared 1 and 2 on its way and went round"
        );
        // Now 2 is used again and 1 is not: 1 goes next.
        assert_eq!(get(&mut shard, 2), Some(0));
        insert(&mut shard, 5, 5).unwrap();
        assert_eq!(shard.clock(), (vec![(5, true), (2, true), (4, true)], 1));
    }

    #[test]
    fn the_scan_is_bounded() {
        let cap = 3 * SCAN as u32;
        let mut shard = Shard::new(cap);
        for fp in 0..u64::from(cap) {
            insert(&mut shard, fp, 1);
        }
        // Only one key is fresh, just beyond the scan from the hand (keys are in slots 0, 1, ...).
        let (_, hand) = shard.clock();
        let beyond = (u64::from(hand) + SCAN as u64) % u64::from(cap);
        set_quietly(&mut shard, beyond, 0);
        let calls = std::cell::Cell::new(0);
        let vacancy = shard.vacancy(|s, _| {
            calls.set(calls.get() + 1);
            *s == 0
        });
        assert_eq!(vacancy, Vacancy::Full);
        assert_eq!(calls.get(), SCAN);
    }

    #[test]
    fn reused_slot_is_reset_to_default() {
        let mut shard = Shard::new(1);
        insert(&mut shard, 1, 0);
        let slot = shard.insert(2, fresh).unwrap();
        assert_eq!(*shard.state(slot), 0);
        assert_eq!(get(&mut shard, 1), None);
    }

    #[test]
    fn stays_at_cap_under_churn_and_never_over_allocates() {
        let cap = 1000;
        let mut shard = Shard::new(cap);
        let mix = |fp: u64| fp.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for fp in 0..10 * u64::from(cap) {
            // Each key has recovered (state 0) by the time `cap` newer keys have arrived.
            if let Some(old) = fp.checked_sub(u64::from(cap)) {
                // Without a lookup: it stays unreferenced once the hand has passed it.
                let entries = &shard.entries;
                let slot = *shard
                    .index
                    .find(mix(old), |&s| entries[s as usize].fp == mix(old))
                    .unwrap();
                shard.entries[slot as usize].state = 0;
            }
            insert(&mut shard, mix(fp), fp + 1).unwrap();
        }
        assert_eq!(shard.len(), cap as usize);
        assert_eq!(
            shard.entries.capacity(),
            cap as usize,
            "slab growth is clamped to the cap"
        );
        // The last `cap` keys are the ones kept.
        for fp in 9 * u64::from(cap)..10 * u64::from(cap) {
            assert_eq!(get(&mut shard, mix(fp)), Some(fp + 1), "key {fp} kept");
        }
    }

    #[test]
    fn recyclable_tail_is_reused_before_growing() {
        let mut shard = Shard::new(10);
        insert(&mut shard, 1, 0);
        insert(&mut shard, 2, 5);
        // Tail (key 1, state 0) is recyclable under "state == 0".
        let slot = shard.insert(3, fresh).unwrap();
        assert_eq!(shard.len(), 2);
        assert_eq!(get(&mut shard, 1), None);
        assert_eq!(*shard.state(slot), 0);
        // Tail is now key 2 (state 5): not recyclable, so the slab grows.
        shard.insert(4, fresh).unwrap();
        assert_eq!(shard.len(), 3);
    }

    #[test]
    fn tags_cost_nothing_until_set_and_follow_their_slots() {
        let mut shard = Shard::new(100);
        for fp in 1..=20 {
            let slot = insert(&mut shard, fp, fp).unwrap();
            shard.set_tag(slot, 0);
        }
        assert!(shard.tags.is_empty(), "tag 0 everywhere allocates nothing");
        let slot = shard.lookup(7).unwrap();
        shard.set_tag(slot, 3);
        assert_eq!(shard.tags.len(), 20);
        assert!(shard.tags.capacity() <= shard.entries.capacity());
        let eight = shard.lookup(8).unwrap();
        assert_eq!((shard.tag(slot), shard.tag(eight)), (3, 0));
        for fp in 21..=60 {
            let slot = insert(&mut shard, fp, fp).unwrap();
            assert_eq!(shard.tag(slot), 0, "a new key starts at tag 0");
            shard.set_tag(slot, fp as u32);
        }
        assert_eq!(shard.tags.len(), shard.entries.len());
        assert!(shard.tags.capacity() <= shard.entries.capacity());
        let fifty = shard.lookup(50).unwrap();
        assert_eq!(shard.tag(fifty), 50);
        // Recyclability is decided with the state's tag; a recycled slot goes back to tag 0.
        let mut full = Shard::new(2);
        insert(&mut full, 1, 0);
        let one = full.lookup(1).unwrap();
        full.set_tag(one, 9);
        let two = full.insert(2, |_, _| false).unwrap();
        *full.state_mut(two) = 5;
        assert_eq!(full.vacancy(|s, tag| *s == 0 && tag == 0), Vacancy::Full);
        let slot = full.insert(3, |s, tag| *s == 0 && tag == 9).unwrap();
        assert_eq!((slot, full.tag(slot)), (one, 0));
    }

    #[test]
    fn a_single_slot_is_recycled_in_place() {
        let mut shard = Shard::new(1);
        for fp in 0..5 {
            insert(&mut shard, fp, 0);
            assert_eq!(shard.clock(), (vec![(fp, true)], 0));
            assert_eq!(get(&mut shard, fp), Some(0));
        }
    }
}
