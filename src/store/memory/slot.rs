//! One slot of a shard's table: a key's fingerprint, state, quota tag and place in the clock,
//! all atomics, so a reader without the shard's lock can copy them (see `seqlock`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use super::atomic_state::SlotState;

/// The bit of [`Slot::place`] that says the key was used since the clock hand last passed.
pub(super) const REFERENCED: u32 = 1 << 31;

/// One slot of the table. Its fields are atomics so that a reader without the shard's lock can
/// copy a key's slot (see `seqlock`); every write happens under the lock, with relaxed stores.
#[derive(Debug, Default)]
pub(crate) struct Slot<S: SlotState> {
    /// The key's fingerprint (see `MemoryStore::fingerprint`), never 0; 0: empty.
    pub(super) fp: AtomicU64,
    /// The algorithm's per-key state.
    pub(super) state: S::Cell,
    /// The tag of the quota the state was written under (0: the limit's own).
    pub(super) tag: AtomicU32,
    /// The key's index in the clock, and [`REFERENCED`] if it was used since the hand last
    /// passed it.
    pub(super) place: AtomicU32,
}

/// A slot's contents, moved out of the table or on their way into it.
pub(super) struct Entry<S> {
    pub(super) fp: u64,
    pub(super) state: S,
    pub(super) tag: u32,
    pub(super) place: u32,
}

impl<S: SlotState> Slot<S> {
    #[inline(always)]
    pub(super) fn fp(&self) -> u64 {
        self.fp.load(Relaxed)
    }

    #[inline(always)]
    pub(super) fn place(&self) -> u32 {
        self.place.load(Relaxed)
    }

    /// Marks the key used since the clock hand last passed, writing only when that changes: a
    /// key checked again and again then leaves its slot's cache line clean.
    #[inline(always)]
    pub(super) fn mark_referenced(&self) {
        let place = self.place();
        if place & REFERENCED == 0 {
            self.place.store(place | REFERENCED, Relaxed);
        }
    }

    /// The contents, leaving the slot empty.
    pub(super) fn take(&self) -> Entry<S> {
        let entry = Entry {
            fp: self.fp(),
            state: S::take(&self.state),
            tag: self.tag.load(Relaxed),
            place: self.place(),
        };
        self.fp.store(0, Relaxed);
        self.tag.store(0, Relaxed);
        self.place.store(0, Relaxed);
        entry
    }

    /// Fills the (empty) slot with `entry`.
    pub(super) fn put(&self, entry: Entry<S>) {
        S::store(&self.state, entry.state);
        self.tag.store(entry.tag, Relaxed);
        self.place.store(entry.place, Relaxed);
        self.fp.store(entry.fp, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    use super::*;
    use crate::algorithm::{
        FixedWindowState, GcraState, LeakyBucketState, SlidingLogState, SlidingWindowState,
        TokenBucketState,
    };

    #[test]
    fn a_slot_is_its_fields_and_no_more() {
        // The figures of docs/internals/memory-store.md ("Memory").
        assert_eq!(size_of::<Slot<TokenBucketState>>(), 32);
        assert_eq!(size_of::<Slot<GcraState>>(), 32);
        assert_eq!(size_of::<Slot<FixedWindowState>>(), 32);
        assert_eq!(size_of::<Slot<LeakyBucketState>>(), 32);
        assert_eq!(size_of::<Slot<SlidingWindowState>>(), 40);
        assert_eq!(size_of::<Slot<SlidingLogState>>(), 64);
    }
}
