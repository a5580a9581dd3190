//! A shard's slots, in segments that are allocated as the table grows and never move or go
//! away while the shard lives: a reader without the shard's lock (see `seqlock`) can hold a slot
//! without a reference count, and a table that grows keeps its slots where they are (its keys are
//! taken out into a temporary list and placed again).
//!
//! Segments are all one size, a power of two: at least [`MIN_SEGMENT`] slots, and large enough
//! that a full shard needs at most [`MAX_SEGMENTS`] of them, so finding a slot's segment is a
//! shift and its pointer is one of a few cache lines that every check reads. Segments are
//! allocated as the table's length reaches them, and the last one is cut at the shard's full
//! length: a full shard holds the same bytes as one array of its length.

use std::ops::Index;
use std::sync::OnceLock;

use super::atomic_state::SlotState;
use super::slot::Slot;

/// Fewest slots in a segment: a shard's first allocation.
const MIN_SEGMENT: usize = 256;

/// Most segments a shard has.
const MAX_SEGMENTS: usize = 64;

/// One segment: allocated once, when the table first reaches it.
type Segment<S> = OnceLock<Box<[Slot<S>]>>;

/// Every slot a shard of `full` slots can have, in segments.
pub(crate) struct SlotTable<S: SlotState> {
    segments: Box<[Segment<S>]>,
    /// log2 of the segment size.
    shift: u32,
    /// The shard's full length: no slot beyond it.
    full: usize,
}

impl<S: SlotState> SlotTable<S> {
    /// Room for `full` slots (at least 1), none allocated yet.
    pub(crate) fn new(full: usize) -> Self {
        let full = full.max(1);
        let size = full
            .div_ceil(MAX_SEGMENTS)
            .next_power_of_two()
            .max(MIN_SEGMENT);
        let shift = size.trailing_zeros();
        Self {
            segments: (0..full.div_ceil(size)).map(|_| OnceLock::new()).collect(),
            shift,
            full,
        }
    }

    /// The segment of slot `i` and its index in it.
    #[inline(always)]
    fn locate(&self, i: usize) -> (usize, usize) {
        (i >> self.shift, i & ((1 << self.shift) - 1))
    }

    /// Allocates (empty) every slot below `n` not allocated yet (`n` at most the full length).
    pub(crate) fn reserve(&self, n: usize) {
        debug_assert!(n <= self.full);
        if n == 0 {
            return;
        }
        for k in 0..=self.locate(n - 1).0 {
            let start = k << self.shift;
            let end = ((k + 1) << self.shift).min(self.full);
            self.segments[k].get_or_init(|| (start..end).map(|_| Slot::default()).collect());
        }
    }

    /// Slot `i`, if allocated (for readers without the lock, who may know a length that is
    /// being published).
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> Option<&Slot<S>> {
        let (k, j) = self.locate(i);
        self.segments.get(k)?.get()?.get(j)
    }

    /// Heap bytes allocated for slots and segment pointers.
    pub(crate) fn allocated_bytes(&self) -> usize {
        let slots: usize = self
            .segments
            .iter()
            .filter_map(OnceLock::get)
            .map(|s| s.len())
            .sum();
        slots * std::mem::size_of::<Slot<S>>()
            + self.segments.len() * std::mem::size_of::<Segment<S>>()
    }
}

/// The first `len` slots of a [`SlotTable`], all allocated: the table as the shard's lock
/// holder sees it.
pub(crate) struct Slots<'a, S: SlotState> {
    pub(crate) table: &'a SlotTable<S>,
    pub(crate) len: usize,
}

impl<S: SlotState> Clone for Slots<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: SlotState> Copy for Slots<'_, S> {}

impl<'a, S: SlotState> Slots<'a, S> {
    /// How many slots.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every slot, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &'a Slot<S>> + 'a {
        let (table, len) = (self.table, self.len);
        (0..len).map(move |i| &table[i])
    }
}

impl<S: SlotState> Index<usize> for SlotTable<S> {
    type Output = Slot<S>;

    /// Slot `i`, which must be allocated.
    #[inline(always)]
    fn index(&self, i: usize) -> &Slot<S> {
        match self.get(i) {
            Some(slot) => slot,
            None => unallocated(i),
        }
    }
}

impl<S: SlotState> Index<usize> for Slots<'_, S> {
    type Output = Slot<S>;

    #[inline(always)]
    fn index(&self, i: usize) -> &Slot<S> {
        debug_assert!(i < self.len);
        &self.table[i]
    }
}

#[cold]
#[inline(never)]
fn unallocated(i: usize) -> ! {
    panic!("slot {i} is not allocated")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_few_and_cover_the_full_length_only() {
        let small: SlotTable<u64> = SlotTable::new(100);
        assert_eq!(
            (small.segments.len(), small.shift),
            (1, 8),
            "one segment of 256"
        );
        let large: SlotTable<u64> = SlotTable::new(1_000_000);
        assert!(large.segments.len() <= MAX_SEGMENTS);
        assert!(large.segments.len() << large.shift >= 1_000_000);
        assert!(large.get(0).is_none(), "nothing allocated yet");
        let size = 1 << large.shift;
        large.reserve(10);
        assert!(large.get(size - 1).is_some(), "a whole segment at a time");
        assert!(large.get(size).is_none(), "only the segments reserved");
        large.reserve(1_000_000);
        assert!(large.get(999_999).is_some());
        assert!(large.get(1_000_000).is_none(), "cut at the full length");
        let slot = std::mem::size_of::<Slot<u64>>();
        assert_eq!(
            large.allocated_bytes(),
            1_000_000 * slot + large.segments.len() * std::mem::size_of::<Segment<u64>>()
        );
    }
}
