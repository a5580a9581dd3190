//! A shard behind its lock whose held keys can also be read without it: how a refusal is
//! decided without writing shared memory.
//!
//! Most checks of a key that has spent its budget are refused, and a refusal changes nothing.
//! Under the shard's lock alone, every check still writes the lock's cache line twice (lock and
//! unlock), so two cores checking keys of the same shard pass that line back and forth on
//! every check, refusals included: at a thousand keys on two threads, `perf annotate` put more
//! than half of a check's time on the lock word and its transfer between the cores.
//!
//! So a [`ShardCell`] is also a sequence lock. Its `version` is odd while a [`ShardGuard`] is
//! alive (every locked access, whatever it writes) and moves on by two each time. A reader
//! ([`ShardCell::read_unlocked`]) notes an even version, copies the key's slot (fingerprint,
//! quota tag and state, all atomics: see `slot` and `atomic_state`) without the lock, and keeps the copy only if
//! the version is the same afterwards: then no locked access overlapped the copy, and it is the
//! key's state as a locked read at that instant would have seen it. The table answers a refusal
//! from such a copy (a refusal writes nothing under the lock either). An allowed check decides
//! on the copy too, then locks, and stores its charged copy only if the guard's starting version
//! is still the one the copy was read at ([`ShardGuard::unchanged_since`]: no other locked
//! access came in between, so the slot is exactly what was copied); otherwise it is decided
//! again under the lock. A reader writes no shared memory, so refusals on several cores share
//! the shard's cache lines instead of trading them.
//!
//! The slots never move while the shard lives (see `segments`): a growing table allocates its new
//! slots and places its keys again, and publishes its new length under the version, so a
//! reader needs no reference count or epoch to hold a slot. No `unsafe`: a copy that mixes two
//! writes is a set of values that were each written, thrown away by the version check, and
//! every slot a reader can reach stays allocated.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::atomic_state::SlotState;
use super::segments::SlotTable;
use super::shard::Shard;
use super::slot::Slot;

/// Read-only polls of a held shard lock before falling back to parking_lot's own wait.
const SPINS: u32 = 64;

/// A shard, its lock, and what readers without the lock need (see the module docs).
pub(crate) struct ShardCell<S: SlotState> {
    lock: Mutex<Shard<S>>,
    /// Even while no [`ShardGuard`] is alive, odd while one is.
    version: AtomicU64,
    /// The shard's slots (the shard holds the same).
    table: Arc<SlotTable<S>>,
    /// The table's length, as readers without the lock know it.
    len: AtomicUsize,
}

impl<S: SlotState> ShardCell<S> {
    /// A cell holding `shard`.
    pub(crate) fn new(shard: Shard<S>) -> Self {
        Self {
            table: Arc::clone(shard.table()),
            len: AtomicUsize::new(shard.table_len()),
            lock: Mutex::new(shard),
            version: AtomicU64::new(0),
        }
    }

    /// Locks the shard, which is held only for one lookup and one decision (tens of
    /// nanoseconds).
    ///
    /// parking_lot's contended path spins a few times, then yields the thread (a system call),
    /// which costs far more than the wait itself when another thread holds the lock for a
    /// single check. This polls the lock word without writing it (so the holder keeps its cache
    /// line) for a short while first, and falls back to the ordinary `lock` (which parks) only
    /// when the holder is slow, e.g. descheduled.
    #[inline]
    pub(crate) fn lock(&self) -> ShardGuard<'_, S> {
        let shard = match self.lock.try_lock() {
            Some(shard) => shard,
            None => lock_contended(&self.lock),
        };
        let version = self.version.load(Ordering::Relaxed);
        self.version
            .store(version.wrapping_add(1), Ordering::Relaxed);
        // A reader that sees any write made under this guard then sees this odd version, or a
        // later one, when it checks.
        fence(Ordering::Release);
        ShardGuard {
            cell: self,
            version,
            shard,
        }
    }

    /// The key `fp` as it stands, copied without the lock, if the shard holds it, its state
    /// can be copied ([`SlotState::COPYABLE`]) and no locked access overlapped the copy;
    /// `None` otherwise (then ask under the lock).
    #[inline(always)]
    pub(crate) fn read_unlocked(&self, fp: u64) -> Option<Seen<'_, S>> {
        if !S::COPYABLE {
            return None;
        }
        let version = self.version.load(Ordering::Acquire);
        if version & 1 == 1 {
            return None;
        }
        let len = self.len.load(Ordering::Relaxed);
        let found = Shard::peek(&self.table, len, fp);
        // Every load above happens before the version is read again.
        fence(Ordering::Acquire);
        if self.version.load(Ordering::Relaxed) != version {
            return None;
        }
        let (slot, state, tag) = found?;
        Some(Seen {
            slot,
            state,
            tag,
            version,
        })
    }
}

/// A held key as [`ShardCell::read_unlocked`] found it.
pub(crate) struct Seen<'a, S: SlotState> {
    /// Its slot.
    pub(crate) slot: &'a Slot<S>,
    /// Its state.
    pub(crate) state: S,
    /// The tag of the quota its state was written under.
    pub(crate) tag: u32,
    /// The shard's version it was read at.
    pub(crate) version: u64,
}

#[cfg(test)]
impl<S: SlotState> ShardCell<S> {
    /// The version now (tests only).
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }
}

#[cold]
fn lock_contended<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    for _ in 0..SPINS {
        std::hint::spin_loop();
        if !mutex.is_locked()
            && let Some(guard) = mutex.try_lock()
        {
            return guard;
        }
    }
    mutex.lock()
}

/// A locked shard: the version is odd while it lives.
pub(crate) struct ShardGuard<'a, S: SlotState> {
    cell: &'a ShardCell<S>,
    /// The (even) version before this guard.
    version: u64,
    shard: MutexGuard<'a, Shard<S>>,
}

impl<S: SlotState> Deref for ShardGuard<'_, S> {
    type Target = Shard<S>;

    #[inline]
    fn deref(&self) -> &Shard<S> {
        &self.shard
    }
}

impl<S: SlotState> DerefMut for ShardGuard<'_, S> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Shard<S> {
        &mut self.shard
    }
}

impl<S: SlotState> Drop for ShardGuard<'_, S> {
    #[inline]
    fn drop(&mut self) {
        if self.shard.take_grown() {
            self.publish();
        }
        // Then the lock is released (the field is dropped after this).
        self.cell
            .version
            .store(self.version.wrapping_add(2), Ordering::Release);
    }
}

impl<S: SlotState> ShardGuard<'_, S> {
    /// Whether no other locked access came since a reader saw the shard at `version`: then
    /// every slot is as that reader found it.
    #[inline(always)]
    pub(crate) fn unchanged_since(&self, version: u64) -> bool {
        self.version == version
    }

    /// Shows readers the shard's new table length.
    #[cold]
    fn publish(&self) {
        self.cell
            .len
            .store(self.shard.table_len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_held_past_the_spin_is_still_taken_once_released() {
        // The holder keeps the lock far longer than the spin lasts: the waiter falls back to
        // parking, wakes at the release, and sees what the holder wrote.
        let mutex = Mutex::new(0u32);
        let held = mutex.lock();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let mut value = match mutex.try_lock() {
                    Some(value) => value,
                    None => lock_contended(&mutex),
                };
                *value += 1;
                *value
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            let mut held = held;
            *held = 10;
            drop(held);
            assert_eq!(waiter.join().unwrap(), 11);
        });
        assert_eq!(*mutex.lock(), 11);
    }
}
