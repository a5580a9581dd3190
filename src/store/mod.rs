//! Where limiter state lives: the [`Backend`] / [`Store`] traits and their implementations.
//!
//! A [`Backend`] is configuration (`MemoryBackend::new().max_keys(100_000)`); the layer builder
//! calls [`Backend::build`] once with every limit it holds and gets a [`Store`]. Per request, the
//! service calls [`Store::check`] with one [`LimitCheck`] per applicable limit and gets one
//! [`Decision`] per check, all-or-nothing: if any limit rejects, none is charged.

use crate::decision::Decision;

mod backend;
#[cfg(feature = "redis")]
pub mod hybrid;
mod limit;
pub mod memory;
mod plan_quota;
#[cfg(feature = "redis")]
pub mod redis;

pub use backend::{Backend, Checked, Store};
pub use limit::{FailurePolicy, LimitCheck, LimitSpec};

#[cfg(feature = "redis")]
pub use self::redis::{RedisBackend, RedisStore};
pub use memory::{MemoryBackend, MemoryStore};
pub(crate) use plan_quota::QuotaPin;
#[doc(hidden)]
pub use plan_quota::{kept_quotas, with_quota_registry_locked};
pub use plan_quota::{PlanQuota, KEPT_QUOTAS};

/// The most limits one layer may hold. Stack layers for more.
pub const MAX_LIMITS: usize = 8;

/// Up to [`MAX_LIMITS`] decisions, one per [`LimitCheck`], in the same order.
///
/// Up to [`INLINE`](Self::INLINE) decisions are held inline (no allocation: the common one- and
/// two-limit layers), more on the heap. It is moved on every request from the store to the
/// layer: two decisions and 24 bytes (a [`Decision`] holds its limit's and plan's names
/// inline, 128 bytes), a copy with no pointer to follow and no count to update.
#[derive(Clone)]
pub struct Decisions {
    items: Items,
    len: u8,
    /// The store's clock reading the checks were decided at, or [`NOT_DECIDED`].
    at: u64,
}

/// Where a [`Decisions`]' items live.
// The inline variant is the one nearly every request uses; boxing it would allocate per request.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Items {
    Inline([Decision; Decisions::INLINE]),
    Heap(Box<[Decision; MAX_LIMITS]>),
}

/// `Decisions::at` when the store reported no time.
const NOT_DECIDED: u64 = u64::MAX;

impl std::fmt::Debug for Decisions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decisions")
            .field("decisions", &self.as_slice())
            .field("decided_at", &self.decided_at())
            .finish()
    }
}

impl Default for Decisions {
    #[inline]
    fn default() -> Self {
        Self::new()
    }
}

impl Decisions {
    /// How many decisions are held without allocating.
    pub const INLINE: usize = 2;

    /// No decisions yet.
    #[inline]
    pub const fn new() -> Self {
        Self {
            items: Items::Inline([Decision::EMPTY; Self::INLINE]),
            len: 0,
            at: NOT_DECIDED,
        }
    }

    /// One decision, decided at `at` (the single-limit hot path builds its answer at once).
    #[inline]
    pub(crate) const fn one(decision: Decision, at: u64) -> Self {
        Self {
            items: Items::Inline([decision, Decision::EMPTY]),
            len: 1,
            at,
        }
    }

    /// Appends a decision.
    ///
    /// # Panics
    /// If more than [`MAX_LIMITS`] are pushed; builders never configure more.
    #[inline]
    pub fn push(&mut self, d: Decision) {
        let len = usize::from(self.len);
        assert!(len < MAX_LIMITS, "more than {MAX_LIMITS} decisions");
        match &mut self.items {
            Items::Inline(items) if len < Self::INLINE => items[len] = d,
            Items::Inline(items) => {
                let mut heap = Box::new([Decision::EMPTY; MAX_LIMITS]);
                heap[..Self::INLINE].copy_from_slice(items);
                heap[len] = d;
                self.items = Items::Heap(heap);
            }
            Items::Heap(items) => items[len] = d,
        }
        self.len += 1;
    }

    /// The time (µs on the store's clock: the memory store's [`Clock`](crate::clock::Clock),
    /// Redis `TIME`) at which the checks were decided and charged, when the store reports it.
    /// [`Store::refund`] takes it back to give a reservation back exactly.
    #[inline]
    pub fn decided_at(&self) -> Option<u64> {
        (self.at != NOT_DECIDED).then_some(self.at)
    }

    /// Records the time the checks were decided at (see [`decided_at`](Self::decided_at)).
    /// `u64::MAX` (585,000 years) reads as not reported.
    #[inline]
    pub fn set_decided_at(&mut self, at: u64) {
        self.at = at;
    }

    /// The decisions, in check order.
    #[inline]
    pub fn as_slice(&self) -> &[Decision] {
        let len = usize::from(self.len);
        match &self.items {
            Items::Inline(items) => &items[..len],
            Items::Heap(items) => &items[..len],
        }
    }

    /// Mutable access, in check order.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [Decision] {
        let len = usize::from(self.len);
        match &mut self.items {
            Items::Inline(items) => &mut items[..len],
            Items::Heap(items) => &mut items[..len],
        }
    }

    /// Number of decisions.
    #[inline]
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether every limit allowed.
    #[inline]
    pub fn allowed(&self) -> bool {
        self.as_slice().iter().all(Decision::allowed)
    }

    /// The first rejecting decision, which names the limit that rejected.
    pub fn rejected(&self) -> Option<&Decision> {
        self.as_slice().iter().find(|d| !d.allowed())
    }

    /// The decision to report in headers: the rejecting one if any, else the limit closest to
    /// exhaustion (smallest `remaining / limit`).
    pub fn reported(&self) -> Option<&Decision> {
        if let Some(r) = self.rejected() {
            return Some(r);
        }
        self.as_slice()
            .iter()
            .reduce(|best, d| if d.is_tighter_than(best) { d } else { best })
    }
}

#[cfg(test)]
mod decisions_tests {
    use std::time::Duration;

    use super::*;

    fn d(remaining: u64) -> Decision {
        Decision::allowed_with(10, remaining, Duration::from_secs(1))
    }

    #[test]
    fn decisions_spill_to_the_heap_in_order_and_stay_small() {
        // Moved on every request: two inline decisions and the length and time.
        assert!(std::mem::size_of::<Decisions>() <= 2 * std::mem::size_of::<Decision>() + 24);
        let mut all = Decisions::new();
        assert!(all.is_empty() && all.decided_at().is_none());
        for i in 0..MAX_LIMITS as u64 {
            all.push(d(i));
            assert_eq!(all.len(), i as usize + 1);
            let remaining: Vec<u64> = all.as_slice().iter().map(Decision::remaining).collect();
            assert_eq!(remaining, (0..=i).collect::<Vec<_>>());
        }
        all.as_mut_slice()[7] = d(9);
        all.set_decided_at(42);
        let copy = all.clone();
        assert_eq!(copy.as_slice(), all.as_slice());
        assert_eq!(copy.as_slice()[7].remaining(), 9);
        assert_eq!(copy.decided_at(), Some(42));
        assert_eq!(copy.reported().unwrap().remaining(), 0);
        let one = Decisions::one(d(3), 7);
        assert_eq!((one.len(), one.decided_at()), (1, Some(7)));
        assert_eq!(one.as_slice(), &[d(3)]);
    }

    #[test]
    #[should_panic(expected = "more than 8 decisions")]
    fn a_ninth_decision_panics() {
        let mut all = Decisions::new();
        for _ in 0..=MAX_LIMITS {
            all.push(d(1));
        }
    }
}
