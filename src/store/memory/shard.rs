//! One shard of a table: a bounded open-addressing hash table of per-key states, with
//! second-chance ("clock") recency.
//!
//! Layout, chosen so that a check of a held key reads one place in memory, and a key costs a few
//! tens of bytes however long it is:
//!
//! - `table` is the table itself, in segments that never move (see `segments`): each slot holds a
//!   key's 64-bit fingerprint (0 marks an empty slot; a fingerprint of 0 is stored as 1), the
//!   algorithm state, the tag of the quota it was written under and its place in the clock with
//!   a referenced bit (for the token bucket: 8 + 16 + 4 + 4 = 32 bytes), all atomics, so that a
//!   reader without the lock can copy them (see `seqlock`); every write is made under the lock. A key lives at its home slot (the fingerprint's
//!   low 32 bits scaled to the table's length) or after it (linear probing, wrapping), so a
//!   lookup reads the home slot and usually nothing further: no index, no second array. Keys are
//!   kept in Robin Hood order (along a run, no key sits further from its home than the key after
//!   it, less one), so a lookup of a key not held stops as soon as it meets a key closer to its
//!   home than the search is: a few slots, where plain linear probing reads on to the next empty
//!   slot.
//! - The table is never more than four fifths full: with `cap` keys it has `⌈cap × 5/4⌉ + 1`
//!   slots (40 bytes per token-bucket key when full). It grows by doubling, clamped to that
//!   length (allocating the segments it reaches, then placing every key again), so an insertion
//!   moves every key a logarithmic number of times in all, and nothing allocates on a lookup or
//!   once the table has its full length.
//! - `clock: Vec<u32>` lists the keys' slots in the order the clock hand visits them (4 bytes
//!   per key): a new key takes the place of the key it replaces, or the end, so the hand meets
//!   keys in the order they arrived, whatever their hashes. Only a search for room reads it.
//! - Removing a key (to recycle its slot) shifts the keys after it back by one until a key at its
//!   home or an empty slot (backward-shift deletion), so there are no tombstones and the table
//!   never degrades under churn.
//!
//! Recency is a second-chance clock: an allowed check of a held key (or any check under the lock)
//! sets its slot's referenced bit, in the cache line the check reads and writes anyway (a linked
//! LRU list would write the two neighbouring entries too); a refusal answered without the lock
//! (see `seqlock`) leaves it, as a refused key has spent budget and is never recycled anyway. Looking for room, a hand sweeps the table, clearing the bits
//! it passes, and prefers a key whose bit was clear (not used since the hand last passed) among
//! those as good as fresh. Which fresh key goes is only a matter of efficiency: a key as good as
//! fresh decides exactly like a key never seen, so the order never changes a decision, only
//! which idle key a new one replaces.

use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::atomic_state::SlotState;
use super::segments::{SlotTable, Slots};
use super::slot::{Entry, Slot, REFERENCED};

/// The table's first length, in slots.
const MIN_SLOTS: usize = 8;

/// How many keys a full shard examines, from its clock hand on, for one it may recycle (one
/// whose state is as good as fresh). Bounded, so a shard full of keys that are still recovering
/// costs a new key at most this many checks, never a walk of the whole shard.
pub(crate) const SCAN: usize = 8;

/// Where a new key can go, found by [`Shard::vacancy`] and used by [`Shard::occupy`] under the
/// same lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vacancy {
    /// The shard has room: add the key.
    Grow,
    /// Recycle this slot, whose key is as good as fresh.
    Reuse(u32),
    /// The shard is full and none of the [`SCAN`] keys at its clock hand may be forgotten.
    Full,
}

/// A bounded map from fingerprint to state with second-chance eviction of keys as good as
/// fresh.
pub(crate) struct Shard<S: SlotState> {
    /// Every slot the table can have (allocated as it grows), shared with readers without the
    /// lock (see `seqlock`).
    table: Arc<SlotTable<S>>,
    /// The table's length: 0 until the first key, then [`MIN_SLOTS`] or more (or the full
    /// length, if that is less).
    len: usize,
    /// The slot of every key held, in the clock's order.
    clock: Vec<u32>,
    /// The clock hand: the index in `clock` that [`vacancy`](Self::vacancy) examines next.
    hand: u32,
    /// Most keys this shard holds (at least 1, below 2^31).
    cap: u32,
    /// Whether the table grew since [`take_grown`](Self::take_grown) last asked.
    grown: bool,
}

impl<S: SlotState> fmt::Debug for Shard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard")
            .field("len", &self.clock.len())
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

/// The table's length once a shard of `cap` keys is full: four fifths full at most.
fn full_length(cap: u32) -> usize {
    (cap as usize * 5).div_ceil(4) + 1
}

/// The slot of the key `fp` among `n` slots that `slot_at` reads (`None`: not readable, the
/// walk stops), and its index: from its home slot on, in Robin Hood order, so it stops at an
/// empty slot or at a key closer to its home than the walk is. At most `n` slots, so the walk
/// ends even over slots that change under it (see `seqlock`).
#[inline(always)]
fn probe<'a, S: SlotState>(
    n: usize,
    fp: u64,
    slot_at: impl Fn(usize) -> Option<&'a Slot<S>>,
) -> Option<(usize, &'a Slot<S>)> {
    if n == 0 {
        return None;
    }
    let fp = stored(fp);
    let mut i = home(fp, n);
    for dist in 0..n {
        let slot = slot_at(i)?;
        let here = slot.fp();
        if here == fp {
            return Some((i, slot));
        }
        if here == 0 || (dist > 0 && distance(here, i, n) < dist) {
            return None;
        }
        i += 1;
        if i == n {
            i = 0;
        }
    }
    None
}

/// The stored form of a fingerprint: never 0, which marks an empty slot.
#[inline(always)]
fn stored(fp: u64) -> u64 {
    fp.max(1)
}

/// The home slot of `fp` in a table of `n` slots: its low 32 bits scaled to `n` (the shard was
/// chosen by bits 32 and up, see `table::shard_of`).
#[inline(always)]
fn home(fp: u64, n: usize) -> usize {
    (((fp & 0xFFFF_FFFF) * n as u64) >> 32) as usize
}

/// How far slot `i` is from the home of the key `fp` it holds, in a table of `n` slots.
#[inline(always)]
fn distance(fp: u64, i: usize, n: usize) -> usize {
    let h = home(fp, n);
    if i >= h {
        i - h
    } else {
        i + n - h
    }
}

impl<S: SlotState> Shard<S> {
    /// An empty shard holding at most `cap` keys (`1 <= cap < 2^31`). Allocates no slot yet.
    pub(crate) fn new(cap: u32) -> Self {
        debug_assert!((1..REFERENCED).contains(&cap));
        Self {
            table: Arc::new(SlotTable::new(full_length(cap))),
            len: 0,
            clock: Vec::new(),
            hand: 0,
            cap,
            grown: false,
        }
    }

    /// Number of keys held.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.clock.len()
    }

    /// The table's length once the shard is full.
    fn full_length(&self) -> usize {
        full_length(self.cap)
    }

    /// Every slot, shared with readers without the lock (see `seqlock`).
    pub(crate) fn table(&self) -> &Arc<SlotTable<S>> {
        &self.table
    }

    /// The table's length, for readers without the lock (see `seqlock`).
    pub(crate) fn table_len(&self) -> usize {
        self.len
    }

    /// The table as it stands.
    #[inline(always)]
    fn slots(&self) -> Slots<'_, S> {
        Slots {
            table: &self.table,
            len: self.len,
        }
    }

    /// Whether the table's length grew since the last call.
    #[inline]
    pub(crate) fn take_grown(&mut self) -> bool {
        std::mem::take(&mut self.grown)
    }

    /// Heap bytes held by this shard (the table, allocated capacity included), plus what
    /// `heap` says each state owns on the heap.
    pub(crate) fn memory_usage(&self, heap: impl Fn(&S) -> usize) -> usize {
        self.table.allocated_bytes()
            + self.clock.capacity() * std::mem::size_of::<u32>()
            + self
                .slots()
                .iter()
                .filter(|s| s.fp() != 0)
                .map(|s| S::read(&s.state, &heap))
                .sum::<usize>()
    }

    /// The slot of `fp`, marked referenced.
    // Always inlined: it is most of a check.
    #[inline(always)]
    pub(crate) fn lookup(&mut self, fp: u64) -> Option<u32> {
        let slots = self.slots();
        let (i, slot) = probe(slots.len(), fp, |i| Some(&slots[i]))?;
        slot.mark_referenced();
        Some(i as u32)
    }

    /// The slot, state and quota tag of `fp` among the first `n` slots of `table`, copied by a
    /// reader without the lock: the walk of [`lookup`](Self::lookup), which may meet slots
    /// changing under it. What it finds means something only if no write overlapped the call
    /// (see `seqlock`). `None` if the key is not found, a slot is not allocated (`n` is being
    /// published), or the state cannot be copied ([`SlotState::COPYABLE`]).
    #[inline(always)]
    pub(crate) fn peek(table: &SlotTable<S>, n: usize, fp: u64) -> Option<(&Slot<S>, S, u32)> {
        let (_, slot) = probe(n, fp, |i| table.get(i))?;
        let tag = slot.tag.load(Relaxed);
        S::copy(&slot.state).map(|state| (slot, state, tag))
    }

    /// Stores `state` in `slot` and marks its key referenced, as a check that found it there
    /// and charged it would have: for a state read by [`peek`](Self::peek) with no write since
    /// (see `seqlock`).
    #[inline(always)]
    pub(crate) fn commit(&mut self, slot: &Slot<S>, state: S) {
        slot.mark_referenced();
        S::store(&slot.state, state);
    }

    /// `f` of the state in `slot`.
    #[inline(always)]
    pub(crate) fn read_state<R>(&self, slot: u32, f: impl FnOnce(&S) -> R) -> R {
        S::read(&self.slots()[slot as usize].state, f)
    }

    /// `f` of the state in `slot`, which it may change.
    #[inline(always)]
    pub(crate) fn update_state<R>(&mut self, slot: u32, f: impl FnOnce(&mut S) -> R) -> R {
        S::update(&self.slots()[slot as usize].state, f)
    }

    /// The tag of the quota the state in `slot` was written under (0: the limit's own).
    #[inline]
    pub(crate) fn tag(&self, slot: u32) -> u32 {
        self.slots()[slot as usize].tag.load(Relaxed)
    }

    /// Records that the state in `slot` is now written under the quota tagged `tag`.
    #[inline]
    pub(crate) fn set_tag(&mut self, slot: u32, tag: u32) {
        self.slots()[slot as usize].tag.store(tag, Relaxed);
    }

    /// Where a new key can go without forgetting a key that has spent budget.
    ///
    /// A key whose state `recyclable` (given the state and its tag) says is as good as fresh is
    /// forgotten first, freely. While the shard has room, the key at the clock hand is recycled
    /// if it is as good as fresh (so idle keys are recycled before the table grows); otherwise
    /// the key is added. When the shard is full, the hand examines up to [`SCAN`] keys,
    /// clearing their referenced bits, and takes the first unreferenced one that is as good as
    /// fresh, or else the first referenced one that is. Any other key has spent budget it has
    /// not yet regained, and forgetting it would hand that budget back, so a full shard without
    /// a recyclable key among those answers [`Vacancy::Full`], and its hand stays where it was.
    pub(crate) fn vacancy(&mut self, recyclable: impl Fn(&S, u32) -> bool) -> Vacancy {
        let len = self.clock.len();
        let is_recyclable = |entry: &Slot<S>| {
            let tag = entry.tag.load(Relaxed);
            S::read(&entry.state, |state| recyclable(state, tag))
        };
        if len < self.cap as usize {
            if len == 0 {
                return Vacancy::Grow;
            }
            let slot = self.next_key();
            let entry = &self.slots()[slot];
            entry.place.store(entry.place() & !REFERENCED, Relaxed);
            return if is_recyclable(entry) {
                Vacancy::Reuse(slot as u32)
            } else {
                Vacancy::Grow
            };
        }
        let start = self.hand;
        let mut fallback = None;
        for _ in 0..SCAN.min(len) {
            let at = self.hand;
            let slot = self.next_key();
            let entry = &self.slots()[slot];
            let place = entry.place();
            let referenced = place & REFERENCED != 0;
            if referenced {
                entry.place.store(place & !REFERENCED, Relaxed);
            }
            if is_recyclable(entry) {
                if !referenced {
                    return Vacancy::Reuse(slot as u32);
                }
                fallback.get_or_insert((slot, at));
            }
        }
        match fallback {
            Some((slot, at)) => {
                // On from the key taken, not past the keys examined after it: those were
                // looked at, not recycled, and the next sweep starts with them.
                self.hand = at;
                self.next_key();
                Vacancy::Reuse(slot as u32)
            }
            // Back to where it started: the hand keeps meeting the oldest keys, the first to
            // recover, and the next new key reads the keys this one just read (cached) instead
            // of another `SCAN` from all over the table.
            None => {
                self.hand = start;
                Vacancy::Full
            }
        }
    }

    /// The slot of the key at the hand, which moves on to the next (the shard holds a key).
    fn next_key(&mut self) -> usize {
        let at = self.hand as usize % self.clock.len();
        self.hand = ((at + 1) % self.clock.len()) as u32;
        self.clock[at] as usize
    }

    /// Inserts `fp` (which must not be present) with a fresh state at tag 0, referenced, where
    /// `vacancy` (from [`vacancy`](Self::vacancy), under the same lock) says, and returns its
    /// slot; `None` for [`Vacancy::Full`]. Other keys' slots may move: a slot number is good
    /// until the next `occupy`.
    pub(crate) fn occupy(&mut self, fp: u64, vacancy: Vacancy) -> Option<u32> {
        let place = match vacancy {
            Vacancy::Full => return None,
            Vacancy::Reuse(slot) => {
                let entry = &self.slots()[slot as usize];
                debug_assert!(entry.fp() != 0, "recycled an empty slot");
                let place = entry.place() & !REFERENCED;
                self.remove_at(slot as usize);
                place
            }
            Vacancy::Grow => {
                let len = self.clock.len();
                debug_assert!(len < self.cap as usize, "grew a full shard");
                // Four fifths full at most (the full length keeps `cap` keys at that load).
                if (len + 1) * 5 > self.len * 4 {
                    self.grow();
                }
                if len == self.clock.capacity() {
                    // Double, but never past the cap.
                    let target = (len * 2).max(MIN_SLOTS).min(self.cap as usize);
                    self.clock.reserve_exact(target - len);
                }
                self.clock.push(0);
                len as u32
            }
        };
        let entry = Entry {
            fp: stored(fp),
            state: S::default(),
            tag: 0,
            place: place | REFERENCED,
        };
        Some(self.place(entry) as u32)
    }

    /// Puts `entry` (a key not held) in the table in Robin Hood order, moving the keys after it
    /// that are closer to their homes one slot on, and returns its slot.
    fn place(&mut self, mut entry: Entry<S>) -> usize {
        let slots = Slots {
            table: &self.table,
            len: self.len,
        };
        let n = slots.len();
        let mut i = home(entry.fp, n);
        let mut dist = 0;
        let mut placed = None;
        loop {
            let here = &slots[i];
            let theirs = here.fp();
            debug_assert!(theirs != entry.fp, "inserted a key already held");
            if theirs == 0 {
                self.clock[(entry.place & !REFERENCED) as usize] = i as u32;
                here.put(entry);
                return placed.unwrap_or(i);
            }
            let theirs = distance(theirs, i, n);
            if theirs < dist {
                let displaced = here.take();
                self.clock[(entry.place & !REFERENCED) as usize] = i as u32;
                here.put(entry);
                entry = displaced;
                placed.get_or_insert(i);
                dist = theirs;
            }
            i = if i + 1 == n { 0 } else { i + 1 };
            dist += 1;
        }
    }

    /// Doubles the table (at least [`MIN_SLOTS`], at most its full length) and puts every key
    /// back at its place in it. The slots stay where they are (see `segments`): the new ones are
    /// allocated, the keys taken out and placed again.
    #[cold]
    fn grow(&mut self) {
        let n = (self.len * 2).max(MIN_SLOTS).min(self.full_length());
        self.table.reserve(n);
        let keys: Vec<Entry<S>> = self
            .slots()
            .iter()
            .filter(|s| s.fp() != 0)
            .map(Slot::take)
            .collect();
        self.len = n;
        for entry in keys {
            self.place(entry);
        }
        self.grown = true;
    }

    /// Empties slot `i`, shifting the keys after it back by one slot, up to an empty slot or a
    /// key at its home, so every key stays reachable in Robin Hood order without a tombstone.
    /// The key's place in the clock is left for the caller to fill.
    fn remove_at(&mut self, mut i: usize) {
        let slots = Slots {
            table: &self.table,
            len: self.len,
        };
        let n = slots.len();
        drop(slots[i].take());
        loop {
            let j = if i + 1 == n { 0 } else { i + 1 };
            let fp = slots[j].fp();
            if fp == 0 || distance(fp, j, n) == 0 {
                return;
            }
            let moved = slots[j].take();
            self.clock[(moved.place & !REFERENCED) as usize] = i as u32;
            slots[i].put(moved);
            i = j;
        }
    }

    /// The state in `slot` (tests only).
    #[cfg(test)]
    pub(crate) fn state(&self, slot: u32) -> S
    where
        S: Copy,
    {
        self.read_state(slot, |s| *s)
    }

    /// Sets the state in `slot` (tests only).
    #[cfg(test)]
    pub(crate) fn set_state(&mut self, slot: u32, state: S) {
        self.update_state(slot, |s| *s = state);
    }

    /// [`vacancy`](Self::vacancy) then [`occupy`](Self::occupy) (tests only).
    #[cfg(test)]
    pub(crate) fn insert(&mut self, fp: u64, recyclable: impl Fn(&S, u32) -> bool) -> Option<u32> {
        let vacancy = self.vacancy(recyclable);
        self.occupy(fp, vacancy)
    }

    /// The most keys this shard holds (tests only).
    #[cfg(test)]
    pub(crate) fn cap(&self) -> u32 {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::atomic_state::SlotState;

    /// States are `u64`s; 0 is "as good as fresh".
    fn fresh(s: &u64, _tag: u32) -> bool {
        *s == 0
    }

    fn insert(shard: &mut Shard<u64>, fp: u64, value: u64) -> Option<u32> {
        let slot = shard.insert(fp, fresh)?;
        shard.set_state(slot, value);
        Some(slot)
    }

    fn get(shard: &mut Shard<u64>, fp: u64) -> Option<u64> {
        shard.lookup(fp).map(|slot| shard.state(slot))
    }

    /// Sets the state of `fp` without a lookup, so its referenced bit stays as it is.
    fn set_quietly(shard: &mut Shard<u64>, fp: u64, value: u64) {
        let slot = shard.slots().iter().find(|s| s.fp() == stored(fp)).unwrap();
        u64::update(&slot.state, |s| *s = value);
    }

    /// The held keys in the clock's order with their referenced bits, and the hand.
    fn clock(shard: &Shard<u64>) -> (Vec<(u64, bool)>, u32) {
        let keys = shard
            .clock
            .iter()
            .map(|&i| &shard.table[i as usize])
            .map(|s| (s.fp(), s.place() & REFERENCED != 0))
            .collect();
        (keys, shard.hand)
    }

    /// Every held key is reachable from its home slot through occupied slots only, the count
    /// is right and the table is at most three quarters full.
    fn assert_consistent(shard: &mut Shard<u64>) {
        let held: Vec<u64> = shard
            .slots()
            .iter()
            .map(|s| s.fp())
            .filter(|&f| f != 0)
            .collect();
        assert_eq!(held.len(), shard.len());
        assert!(
            shard.len() * 5 <= shard.slots().len() * 4,
            "over four fifths full"
        );
        for (place, &slot) in shard.clock.iter().enumerate() {
            let s = &shard.slots()[slot as usize];
            assert!(
                s.fp() != 0 && (s.place() & !REFERENCED) as usize == place,
                "clock {place}"
            );
        }
        for fp in held {
            assert!(shard.lookup(fp).is_some(), "{fp} unreachable");
        }
        let n = shard.slots().len();
        for i in 0..n {
            let (a, b) = (&shard.slots()[i], &shard.slots()[(i + 1) % n]);
            let (a, b) = (a.fp(), b.fp());
            if a != 0 && b != 0 {
                let (da, db) = (distance(a, i, n), distance(b, (i + 1) % n, n));
                assert!(
                    db <= da + 1,
                    "Robin Hood order broken at {i}: {da} then {db}"
                );
            }
            if a == 0 && b != 0 {
                assert_eq!(distance(b, (i + 1) % n, n), 0, "a key after a hole is home");
            }
        }
    }

    #[test]
    fn lookup_finds_inserted_keys_and_misses_others() {
        let mut shard = Shard::new(4);
        assert_eq!(get(&mut shard, 10), None, "an empty shard holds nothing");
        insert(&mut shard, 10, 100);
        insert(&mut shard, 20, 200);
        insert(&mut shard, 0, 300);
        assert_eq!(get(&mut shard, 10), Some(100));
        assert_eq!(get(&mut shard, 20), Some(200));
        assert_eq!(
            get(&mut shard, 0),
            Some(300),
            "fingerprint 0 is a key like any other"
        );
        assert_eq!(get(&mut shard, 30), None);
        assert_eq!(shard.len(), 3);
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
            shard.set_state(slot, 0);
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
        assert_consistent(&mut shard);
    }

    #[test]
    fn a_recently_used_fresh_key_gets_a_second_chance() {
        let mut shard = Shard::new(3);
        for fp in 1..=3 {
            insert(&mut shard, fp, fp);
        }
        // All three have recovered; 1 and 2 were used since the hand last passed, 3 was not.
        for fp in 1..=3 {
            set_quietly(&mut shard, fp, 0);
        }
        for slot in shard.slots().iter() {
            let referenced = slot.fp() == 1 || slot.fp() == 2;
            let place = slot.place() & !REFERENCED | if referenced { REFERENCED } else { 0 };
            slot.place.store(place, Relaxed);
        }
        shard.hand = 0;
        insert(&mut shard, 4, 4).unwrap();
        let (keys, _) = clock(&shard);
        assert_eq!(
            keys,
            [(1, false), (2, false), (4, true)],
            "3 made room; the hand cleared 1 and 2 on its way"
        );
        // Now 2 is used again and 1 is not: 1 goes next.
        assert_eq!(get(&mut shard, 2), Some(0));
        insert(&mut shard, 5, 5).unwrap();
        assert_eq!(
            get(&mut shard, 1),
            None,
            "1 had not been used since the hand passed"
        );
        assert_eq!(get(&mut shard, 2), Some(0), "2 was kept");
        assert_consistent(&mut shard);
    }

    #[test]
    fn the_scan_is_bounded() {
        let cap = 3 * SCAN as u32;
        let mut shard = Shard::new(cap);
        for fp in 1..=u64::from(cap) {
            insert(&mut shard, fp, 1);
        }
        // Only one key is fresh: the one just beyond the scan from the hand.
        let beyond = shard.clock[(shard.hand as usize + SCAN) % shard.len()] as usize;
        u64::update(&shard.slots()[beyond].state, |s| *s = 0);
        let calls = std::cell::Cell::new(0);
        let vacancy = shard.vacancy(|s, _| {
            calls.set(calls.get() + 1);
            *s == 0
        });
        assert_eq!(vacancy, Vacancy::Full);
        assert_eq!(calls.get(), SCAN);
        let hand = shard.hand;
        assert_eq!(shard.vacancy(fresh), Vacancy::Full, "the same keys again");
        assert_eq!(
            shard.hand, hand,
            "a fruitless sweep leaves the hand where it was"
        );
        // Once the key at the hand recovers, it is the one recycled.
        let first = shard.clock[hand as usize] as usize;
        u64::update(&shard.slots()[first].state, |s| *s = 0);
        assert_eq!(shard.vacancy(fresh), Vacancy::Reuse(first as u32));
    }

    #[test]
    fn reused_slot_is_reset_to_default() {
        let mut shard = Shard::new(1);
        insert(&mut shard, 1, 0);
        let slot = shard.lookup(1).unwrap();
        shard.set_tag(slot, 7);
        let slot = shard.insert(2, fresh).unwrap();
        assert_eq!((shard.state(slot), shard.tag(slot)), (0, 0));
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
                set_quietly(&mut shard, mix(old), 0);
            }
            insert(&mut shard, mix(fp), fp + 1).unwrap();
        }
        assert_eq!(shard.len(), cap as usize);
        assert_eq!(
            shard.slots().len(),
            shard.full_length(),
            "growth is clamped to the full length"
        );
        // The last `cap` keys are the ones kept.
        for fp in 9 * u64::from(cap)..10 * u64::from(cap) {
            assert_eq!(get(&mut shard, mix(fp)), Some(fp + 1), "key {fp} kept");
        }
        assert_consistent(&mut shard);
    }

    #[test]
    fn removal_keeps_colliding_keys_reachable() {
        // Keys whose home slots collide and wrap around the end of the table, removed in every
        // position of their probe runs.
        for victim in 0..12u64 {
            let mut shard = Shard::new(12);
            insert(&mut shard, 1, 1);
            let n = shard.full_length() as u64;
            // Fingerprints homed at the last slots, so their runs wrap.
            let near_end = |k: u64| ((n - 1 - k % 3) << 32).div_ceil(n) | (k << 40);
            let keys: Vec<u64> = (0..11).map(near_end).collect();
            for (i, &fp) in keys.iter().enumerate() {
                insert(&mut shard, fp, i as u64 + 10);
            }
            let gone = if victim == 11 {
                1
            } else {
                keys[victim as usize]
            };
            set_quietly(&mut shard, gone, 0);
            let slots = shard.slots();
            let place = shard
                .clock
                .iter()
                .position(|&i| slots[i as usize].fp() == stored(gone));
            shard.hand = place.unwrap() as u32;
            assert_eq!(shard.insert(99, fresh).map(|_| ()), Some(()));
            assert_eq!(get(&mut shard, gone), None);
            for (i, &fp) in keys.iter().enumerate() {
                if fp != gone {
                    assert_eq!(get(&mut shard, fp), Some(i as u64 + 10), "{fp:x}");
                }
            }
            assert_consistent(&mut shard);
        }
    }

    #[test]
    fn random_operations_match_a_model() {
        use std::collections::HashMap;
        let mut shard = Shard::new(50);
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct high bits and low bits: many collisions on home slots.
            let fp = (x % 120 + 1) * 0x0000_0100_0000_0007;
            match get(&mut shard, fp) {
                Some(v) => {
                    assert_eq!(model.get(&fp), Some(&v), "step {step}");
                    let slot = shard.lookup(fp).unwrap();
                    shard.set_state(slot, (x >> 40) % 3); // 0: recovered
                    model.insert(fp, shard.state(slot));
                }
                None => {
                    assert!(!model.contains_key(&fp), "step {step}: {fp} lost");
                    let vacancy = shard.vacancy(fresh);
                    if let Vacancy::Reuse(slot) = vacancy {
                        let old = shard.slots()[slot as usize].fp();
                        assert_eq!(model.remove(&old), Some(0), "only a fresh key goes");
                    }
                    if let Some(slot) = shard.occupy(fp, vacancy) {
                        shard.set_state(slot, 1 + (x >> 50) % 2);
                        model.insert(fp, shard.state(slot));
                    } else {
                        assert_eq!(shard.len(), 50, "refused only when full");
                    }
                }
            }
            assert_eq!(shard.len(), model.len(), "step {step}");
            if step % 500 == 0 {
                assert_consistent(&mut shard);
            }
        }
        assert_consistent(&mut shard);
    }

    #[test]
    fn tags_follow_their_slots() {
        let mut shard = Shard::new(100);
        for fp in 1..=60 {
            let slot = insert(&mut shard, fp, fp).unwrap();
            assert_eq!(shard.tag(slot), 0, "a new key starts at tag 0");
            shard.set_tag(slot, fp as u32);
        }
        for fp in 1..=60 {
            let slot = shard.lookup(fp).unwrap();
            assert_eq!(shard.tag(slot), fp as u32, "after the table grew");
        }
        // Recyclability is decided with the state's tag; a recycled slot goes back to tag 0.
        let mut full = Shard::new(2);
        insert(&mut full, 1, 0);
        let one = full.lookup(1).unwrap();
        full.set_tag(one, 9);
        let two = full.insert(2, |_, _| false).unwrap();
        full.set_state(two, 5);
        assert_eq!(full.vacancy(|s, tag| *s == 0 && tag == 0), Vacancy::Full);
        let slot = full.insert(3, |s, tag| *s == 0 && tag == 9).unwrap();
        assert_eq!(full.tag(slot), 0);
        assert_eq!(get(&mut full, 1), None);
    }

    #[test]
    fn a_single_slot_is_recycled_in_place() {
        let mut shard = Shard::new(1);
        for fp in 1..6 {
            insert(&mut shard, fp, 0);
            assert_eq!(clock(&shard).0, [(fp, true)]);
            assert_eq!(get(&mut shard, fp), Some(0));
            assert_eq!(shard.len(), 1);
        }
    }

    #[test]
    fn recyclable_key_is_reused_before_growing() {
        let mut shard = Shard::new(10);
        insert(&mut shard, 1, 1);
        insert(&mut shard, 2, 5);
        set_quietly(&mut shard, 1, 0);
        // The hand at key 1, the first to arrive (state 0, recyclable).
        shard.hand = 0;
        let slot = shard.insert(3, fresh).unwrap();
        assert_eq!(shard.len(), 2);
        assert_eq!(get(&mut shard, 1), None);
        assert_eq!(shard.state(slot), 0);
        // Then at key 2 (state 5): not recyclable, so the shard grows.
        shard.insert(4, fresh).unwrap();
        assert_eq!(shard.len(), 3);
        assert_eq!(
            clock(&shard).0.iter().map(|k| k.0).collect::<Vec<_>>(),
            [3, 2, 4]
        );
    }
}
