//! How a key's state is kept in its slot: in atomics, so a check that only reads it can copy it
//! without the shard's lock (see `seqlock`).
//!
//! The states of the bucket and window algorithms are two or three integers, each kept in an
//! `AtomicU64` of its own: the same bytes as the plain state, read and written with relaxed
//! loads and stores (plain moves on x86 and ARM), under the shard's lock for every write. A
//! sliding log's state owns a heap buffer, which cannot be copied that way, so it sits behind a
//! one-byte lock of its own and is never read without the shard's lock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::algorithm::{
    FixedWindowState, GcraState, LeakyBucketState, SlidingLogState, SlidingWindowState,
    TokenBucketState,
};

/// A state as a slot keeps it.
pub(crate) trait SlotState: Default + Send + Sync + 'static {
    /// What the slot holds.
    type Cell: Default + Send + Sync;

    /// Whether [`copy`](Self::copy) works: the state is plain integers.
    const COPYABLE: bool;

    /// `f` of the state (under the shard's lock).
    fn read<R>(cell: &Self::Cell, f: impl FnOnce(&Self) -> R) -> R;

    /// `f` of the state, which it may change (under the shard's lock). An unchanged state is
    /// not written back.
    fn update<R>(cell: &Self::Cell, f: impl FnOnce(&mut Self) -> R) -> R;

    /// Replaces the state (under the shard's lock).
    fn store(cell: &Self::Cell, state: Self);

    /// The state, leaving a fresh one (under the shard's lock).
    fn take(cell: &Self::Cell) -> Self;

    /// A copy of the state, read without the shard's lock: `None` unless
    /// [`COPYABLE`](Self::COPYABLE). The integers are read one by one, so the copy may mix two
    /// writes: the caller checks that no write overlapped it (see `seqlock`).
    fn copy(cell: &Self::Cell) -> Option<Self>;
}

/// A plain state of `$n` integers, its fields in that order.
macro_rules! plain_state {
    ($($t:ty: $n:literal [$($field:ident),+]);* $(;)?) => {$(
        impl SlotState for $t {
            type Cell = [AtomicU64; $n];

            const COPYABLE: bool = true;

            #[inline(always)]
            fn read<R>(cell: &Self::Cell, f: impl FnOnce(&Self) -> R) -> R {
                f(&load(cell))
            }

            #[inline(always)]
            fn update<R>(cell: &Self::Cell, f: impl FnOnce(&mut Self) -> R) -> R {
                let before: Self = load(cell);
                let mut state = before;
                let result = f(&mut state);
                // Unchanged (a refusal): the slot's cache line stays clean.
                if state != before {
                    let [$($field),+] = cell;
                    $($field.store(state.$field, Relaxed);)+
                }
                result
            }

            #[inline(always)]
            fn store(cell: &Self::Cell, state: Self) {
                let [$($field),+] = cell;
                $($field.store(state.$field, Relaxed);)+
            }

            #[inline]
            fn take(cell: &Self::Cell) -> Self {
                let state = load(cell);
                for word in cell {
                    word.store(0, Relaxed);
                }
                state
            }

            #[inline(always)]
            fn copy(cell: &Self::Cell) -> Option<Self> {
                Some(load(cell))
            }
        }

        impl Loaded<$n> for $t {
            #[inline(always)]
            fn from_cell(cell: &[AtomicU64; $n]) -> Self {
                let [$($field),+] = cell;
                Self { $($field: $field.load(Relaxed)),+ }
            }
        }
    )*};
}

/// Reads a plain state out of its cell.
trait Loaded<const N: usize> {
    fn from_cell(cell: &[AtomicU64; N]) -> Self;
}

#[inline(always)]
fn load<T: Loaded<N>, const N: usize>(cell: &[AtomicU64; N]) -> T {
    T::from_cell(cell)
}

plain_state! {
    TokenBucketState: 2 [deficit, last];
    GcraState: 2 [tat, sub];
    FixedWindowState: 2 [window, count];
    SlidingWindowState: 3 [last, prev, cur];
    LeakyBucketState: 2 [level, last];
}

impl SlotState for SlidingLogState {
    type Cell = Mutex<SlidingLogState>;

    const COPYABLE: bool = false;

    // Uncontended: only the holder of the shard's lock takes it.
    fn read<R>(cell: &Self::Cell, f: impl FnOnce(&Self) -> R) -> R {
        f(&cell.lock())
    }

    fn update<R>(cell: &Self::Cell, f: impl FnOnce(&mut Self) -> R) -> R {
        f(&mut cell.lock())
    }

    fn store(cell: &Self::Cell, state: Self) {
        *cell.lock() = state;
    }

    fn take(cell: &Self::Cell) -> Self {
        std::mem::take(&mut *cell.lock())
    }

    fn copy(_: &Self::Cell) -> Option<Self> {
        None
    }
}

/// `u64` states, for the shard's own tests.
#[cfg(test)]
impl SlotState for u64 {
    type Cell = AtomicU64;

    const COPYABLE: bool = true;

    fn read<R>(cell: &Self::Cell, f: impl FnOnce(&Self) -> R) -> R {
        f(&cell.load(Relaxed))
    }

    fn update<R>(cell: &Self::Cell, f: impl FnOnce(&mut Self) -> R) -> R {
        let mut state = cell.load(Relaxed);
        let result = f(&mut state);
        cell.store(state, Relaxed);
        result
    }

    fn store(cell: &Self::Cell, state: Self) {
        cell.store(state, Relaxed);
    }

    fn take(cell: &Self::Cell) -> Self {
        cell.swap(0, Relaxed)
    }

    fn copy(cell: &Self::Cell) -> Option<Self> {
        Some(cell.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_state_round_trips_through_its_cell() {
        let state = SlidingWindowState {
            last: 1,
            prev: 2,
            cur: 3,
        };
        let cell = <SlidingWindowState as SlotState>::Cell::default();
        SlidingWindowState::update(&cell, |s| *s = state);
        assert_eq!(SlidingWindowState::copy(&cell), Some(state));
        SlidingWindowState::update(&cell, |s| s.cur = 7);
        assert_eq!(SlidingWindowState::read(&cell, |s| s.cur), 7);
        assert_eq!(SlidingWindowState::take(&cell).prev, 2);
        assert_eq!(
            SlidingWindowState::copy(&cell),
            Some(SlidingWindowState::default()),
            "taking leaves a fresh state"
        );
        assert_eq!(
            std::mem::size_of::<<TokenBucketState as SlotState>::Cell>(),
            std::mem::size_of::<TokenBucketState>(),
            "a cell is the state's own size"
        );
    }

    #[test]
    fn a_sliding_log_is_never_copied_unlocked() {
        let cell = <SlidingLogState as SlotState>::Cell::default();
        assert!(SlidingLogState::copy(&cell).is_none());
    }
}
