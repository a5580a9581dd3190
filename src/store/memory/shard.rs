//! One shard of a table: a bounded slab of per-key states in exact least-recently-used order,
//! indexed by key fingerprint.
//!
//! Layout, chosen so that a key costs a few tens of bytes however long it is:
//!
//! - `entries: Vec<Entry<S>>` is a dense slab. An entry is the key's 64-bit fingerprint, two
//!   `u32` links of an intrusive doubly linked LRU list and the algorithm state (for the token
//!   bucket: 8 + 4 + 4 + 16 = 32 bytes). Slots are never freed: a slot is reused in place when its
//!   key is as good as fresh (see [`Shard::vacancy`]), so the slab never exceeds the shard's
//!   capacity.
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

/// The "no slot" link.
const NIL: u32 = u32::MAX;

/// The slab's first allocation, in entries.
const MIN_ALLOC: usize = 8;

/// How many of its least recently used keys a full shard examines, from the least recently used
/// on, for one it may recycle (one whose state is as good as fresh). Bounded, so a shard full of
/// keys that are still recovering costs a new key at most this many checks, never a walk of the
/// whole shard.
pub(crate) const SCAN: usize = 8;

/// Where a new key can go, found by [`Shard::vacancy`] and used by [`Shard::occupy`] under the
/// same lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vacancy {
    /// The shard has room: append a slot.
    Grow,
    /// Recycle this slot, whose key is as good as fresh.
    Reuse(u32),
    /// The shard is full and none of its [`SCAN`] least recently used keys may be forgotten.
    Full,
}

/// One key's slot.
#[derive(Debug)]
struct Entry<S> {
    /// The key's fingerprint (see the module docs of `store::memory`).
    fp: u64,
    /// The next more recently used slot, or `NIL` at the head.
    prev: u32,
    /// The next less recently used slot, or `NIL` at the tail.
    next: u32,
    /// The algorithm's per-key state.
    state: S,
}

/// A bounded map from fingerprint to state with exact LRU eviction.
pub(crate) struct Shard<S> {
    index: HashTable<u32>,
    entries: Vec<Entry<S>>,
    /// The tag of each entry's state, or empty while every tag is 0.
    tags: Vec<u32>,
    /// Most recently used slot.
    head: u32,
    /// Least recently used slot: the next to be evicted.
    tail: u32,
    /// Most entries this shard holds (at least 1, less than `NIL`).
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
        debug_assert!((1..NIL).contains(&cap));
        Self {
            index: HashTable::new(),
            entries: Vec::new(),
            tags: Vec::new(),
            head: NIL,
            tail: NIL,
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

    /// The slot of `fp`, marked most recently used.
    // Always inlined: it is most of a check, and six tables' checks (one per algorithm) made
    // the compiler call it out of line (11 more instructions per check, measured).
    #[inline(always)]
    pub(crate) fn lookup(&mut self, fp: u64) -> Option<u32> {
        let entries = &self.entries;
        let slot = *self
            .index
            .find(fp, |&slot| entries[slot as usize].fp == fp)?;
        self.touch(slot);
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
    /// forgotten first, freely: the
    /// least recently used key when the shard has room (so idle keys are recycled before the
    /// slab grows), or, when the shard is full, the least recently used such key among the
    /// [`SCAN`] least recently used. Any other key has spent budget it has not yet regained, and
    /// forgetting it would hand that budget back, so a full shard without a recyclable key
    /// answers [`Vacancy::Full`].
    pub(crate) fn vacancy(&self, recyclable: impl Fn(&S, u32) -> bool) -> Vacancy {
        let full = self.entries.len() >= self.cap as usize;
        if !full {
            return match self.tail {
                NIL => Vacancy::Grow,
                tail if recyclable(&self.entries[tail as usize].state, self.tag(tail)) => {
                    Vacancy::Reuse(tail)
                }
                _ => Vacancy::Grow,
            };
        }
        let mut slot = self.tail;
        for _ in 0..SCAN {
            if slot == NIL {
                break;
            }
            let entry = &self.entries[slot as usize];
            if recyclable(&entry.state, self.tag(slot)) {
                return Vacancy::Reuse(slot);
            }
            slot = entry.prev;
        }
        Vacancy::Full
    }

    /// Inserts `fp` (which must not be present) with a fresh state at tag 0, as the most recently used
    /// key, where `vacancy` (from [`vacancy`](Self::vacancy), under the same lock) says, and
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
                self.unlink(slot);
                let entry = &mut self.entries[slot as usize];
                entry.fp = fp;
                entry.state = S::default();
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
                    prev: NIL,
                    next: NIL,
                    state: S::default(),
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
        self.push_front(slot);
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

    /// Marks `slot` most recently used.
    #[inline]
    fn touch(&mut self, slot: u32) {
        if self.head != slot {
            self.unlink(slot);
            self.push_front(slot);
        }
    }

    /// Takes `slot` out of the LRU list.
    #[inline]
    fn unlink(&mut self, slot: u32) {
        let Entry { prev, next, .. } = self.entries[slot as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.entries[next as usize].prev = prev;
        }
    }

    /// Puts an unlinked `slot` at the head of the LRU list.
    #[inline]
    fn push_front(&mut self, slot: u32) {
        let old_head = self.head;
        {
            let entry = &mut self.entries[slot as usize];
            entry.prev = NIL;
            entry.next = old_head;
        }
        if old_head == NIL {
            self.tail = slot;
        } else {
            self.entries[old_head as usize].prev = slot;
        }
        self.head = slot;
    }

    /// The most keys this shard holds (tests only).
    #[cfg(test)]
    pub(crate) fn cap(&self) -> u32 {
        self.cap
    }

    /// Fingerprints from most to least recently used (tests only).
    #[cfg(test)]
    fn lru_order(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut slot = self.head;
        while slot != NIL {
            out.push(self.entries[slot as usize].fp);
            slot = self.entries[slot as usize].next;
        }
        out
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
        assert_eq!(shard.lru_order(), [3, 2, 1]);
        assert_eq!(shard.len(), 3);
    }

    #[test]
    fn recovered_keys_are_recycled_least_recently_used_first() {
        let mut shard = Shard::new(4);
        for fp in 1..=4 {
            insert(&mut shard, fp, fp);
        }
        // 2 and 3 recover; 1 (least recently used) has not.
        for fp in [2, 3] {
            let slot = shard.lookup(fp).unwrap();
            *shard.state_mut(slot) = 0;
        }
        // Order now (most recent first): 3, 2, 4, 1. 2 is the least recently used fresh key.
        assert_eq!(shard.lru_order(), [3, 2, 4, 1]);
        insert(&mut shard, 5, 5).unwrap();
        assert_eq!(get(&mut shard, 2), None, "2 was recycled");
        assert_eq!(get(&mut shard, 1), Some(1), "1 was kept: it has spent");
        insert(&mut shard, 6, 6).unwrap();
        assert_eq!(get(&mut shard, 3), None, "then 3");
        assert_eq!(insert(&mut shard, 7, 7), None);
        assert_eq!(shard.len(), 4);
    }

    #[test]
    fn the_scan_is_bounded() {
        let cap = 3 * SCAN as u32;
        let mut shard = Shard::new(cap);
        for fp in 0..u64::from(cap) {
            insert(&mut shard, fp, 1);
        }
        // Only the most recently used key is fresh: beyond the scan, so not found.
        let slot = shard.lookup(0).unwrap();
        *shard.state_mut(slot) = 0;
        let slot = shard.lookup(1).unwrap();
        *shard.state_mut(slot) = 1;
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
                // Without touching it: it stays the least recently used.
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
        // The last `cap` keys are the ones kept, in reverse insertion order.
        let kept: Vec<u64> = (9 * u64::from(cap)..10 * u64::from(cap))
            .rev()
            .map(|fp| fp.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        assert_eq!(shard.lru_order(), kept);
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
    fn single_entry_list_links_stay_consistent() {
        let mut shard = Shard::new(1);
        for fp in 0..5 {
            insert(&mut shard, fp, 0);
            assert_eq!(shard.lru_order(), [fp]);
            assert_eq!(get(&mut shard, fp), Some(0));
        }
    }
}
