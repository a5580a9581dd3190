//! A table's overflow bucket: the one state that decides every new key while its shard is full
//! of keys still recovering their budget, and the count and warning of its use.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::decision::Name;
use crate::metrics::KeysGauge;

/// Microseconds between two warnings that a table is deciding new keys by its overflow bucket.
pub(super) const OVERFLOW_WARN_EVERY: u64 = 10_000_000;

/// The overflow state alone on its cache lines, so the shards' locks beside it do not
/// false-share with it.
#[repr(align(128))]
struct Padded<S>(Mutex<S>);

/// A table's overflow bucket and its bookkeeping, shared (by `Arc`) like the table's keys.
pub(super) struct Overflow<S> {
    /// The state shared by every new key while its shard is full of keys still recovering:
    /// one bucket of the table's own quota, whatever quota the key is checked at. Locked only
    /// while holding one of the table's shards, and never while taking another lock.
    state: Padded<S>,
    /// Checks decided by the overflow bucket.
    overflowed: AtomicU64,
    /// When (clock µs, plus 1; 0 = never) the overflow was last logged.
    warned: AtomicU64,
    /// Keys held, for the `tollgate_keys` gauge (feature `metrics`; counted on growth only).
    pub(super) keys: KeysGauge,
}

impl<S: Default> Overflow<S> {
    pub(super) fn new() -> Self {
        Self {
            state: Padded(Mutex::new(S::default())),
            overflowed: AtomicU64::new(0),
            warned: AtomicU64::new(0),
            keys: KeysGauge::default(),
        }
    }
}

impl<S> Overflow<S> {
    /// Locks the bucket of the limit `name` (the caller holds one of its table's shards) at
    /// `now` (µs on the time base of the table's own quota), counting and, at most every
    /// [`OVERFLOW_WARN_EVERY`] µs, logging its use.
    #[cold]
    pub(super) fn lock(&self, name: Name, now: u64) -> MutexGuard<'_, S> {
        let overflowed = self.overflowed.fetch_add(1, Ordering::Relaxed) + 1;
        let last = self.warned.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last - 1) >= OVERFLOW_WARN_EVERY;
        if due
            && self
                .warned
                .compare_exchange(
                    last,
                    now.saturating_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            tracing::warn!(
                limit = %name,
                overflowed,
                "in-memory rate-limit table is full of keys still recovering their budget; \
                 new keys share one overflow bucket of the limit's quota (raise max_keys)"
            );
        }
        self.state.0.lock()
    }

    /// `f` of the bucket's state, without counting a use (for memory figures).
    pub(super) fn inspect<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        f(&self.state.0.lock())
    }

    /// Checks decided by the overflow bucket so far.
    pub(super) fn overflowed(&self) -> u64 {
        self.overflowed.load(Ordering::Relaxed)
    }
}
