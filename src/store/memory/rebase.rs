//! The quota a check decides at (the limit's own, or a [`PlanQuota`]'s), and a key's state
//! carried over to it from the quota the state was written under.
//!
//! Each key's state carries the tag of the quota it was written under (see `slot`): 0 for the
//! table's own quota, a [`PlanQuota`]'s tag otherwise. A check at another quota than the state's
//! converts the state first ([`Algorithm::rebase`]), so the key keeps what it spent.

use super::atomic_state::SlotState;
use super::shard::Shard;
use crate::algorithm::{
    Algorithm, AlgorithmKind, FixedWindow, Gcra, LeakyBucket, RebaseAcross, SlidingLog,
    SlidingWindow, TokenBucket,
};
use crate::decision::Name;
use crate::error::{StoreError, StoreErrorKind};
use crate::store::plan_quota::{self, CompiledAlgorithm};
use crate::store::PlanQuota;

/// An algorithm that a [`PlanQuota`] can hold: lets a table, typed by its algorithm, take the
/// same type out of a plan.
pub(crate) trait Compiled:
    Algorithm<State: SlotState + Clone> + RebaseAcross + Copy + PartialEq
{
    /// The kind, for error messages.
    const KIND: AlgorithmKind;

    /// This algorithm, if `compiled` is one of this type.
    fn from_compiled(compiled: &CompiledAlgorithm) -> Option<&Self>;
}

macro_rules! compiled {
    ($($t:ident),*) => {$(
        impl Compiled for $t {
            const KIND: AlgorithmKind = AlgorithmKind::$t;

            #[inline]
            fn from_compiled(compiled: &CompiledAlgorithm) -> Option<&Self> {
                match compiled {
                    CompiledAlgorithm::$t(a) => Some(a),
                    _ => None,
                }
            }
        }
    )*};
}

compiled!(
    TokenBucket,
    Gcra,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    LeakyBucket
);

/// Reads the store's clock's Unix offset, µs
/// ([`Clock::unix_offset_micros`](crate::clock::Clock::unix_offset_micros)). A check calls it
/// only to carry a time between the clock's time base and Unix time (a key whose state was
/// written at a calendar-aligned quota checked at a plain one, or the reverse).
pub(crate) type UnixOffset<'a> = &'a dyn Fn() -> u64;

/// Whether `algorithm` decides on Unix time (a calendar-aligned quota) rather than on the
/// clock's time.
#[inline]
fn on_unix_time<A: Algorithm>(algorithm: &A) -> bool {
    algorithm.quota().calendar().is_some()
}

/// `now`, read on the time base of `on`, read on the time base of `to`.
#[inline]
pub(super) fn shift<A: Algorithm>(on: &A, to: &A, now: u64, offset: UnixOffset<'_>) -> u64 {
    match (on_unix_time(on), on_unix_time(to)) {
        (true, false) => now.saturating_sub(offset()),
        (false, true) => now.saturating_add(offset()),
        _ => now,
    }
}

/// The quota a check decides at: the algorithm built for it, and the tag that names it in the
/// table's states.
pub(crate) struct AtQuota<'a, A> {
    pub(super) algorithm: &'a A,
    pub(super) tag: u32,
}

impl<A> Clone for AtQuota<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for AtQuota<'_, A> {}

/// The table's own quota, named without carrying anything (see `Table::check`).
#[derive(Clone, Copy)]
pub(crate) struct Own;

/// What names the quota of a check: [`Own`] or an [`AtQuota`].
pub(crate) trait Quoted<'a, A: Compiled>: Copy {
    /// The quota, given the table's own algorithm.
    fn resolve(self, own: &'a A) -> AtQuota<'a, A>;
}

impl<'a, A: Compiled> Quoted<'a, A> for Own {
    #[inline]
    fn resolve(self, own: &'a A) -> AtQuota<'a, A> {
        AtQuota::own(own)
    }
}

impl<'a, A: Compiled> Quoted<'a, A> for AtQuota<'a, A> {
    #[inline]
    fn resolve(self, _: &'a A) -> AtQuota<'a, A> {
        self
    }
}

impl<'a, A: Compiled> AtQuota<'a, A> {
    /// The table's own quota `own`: tag 0.
    #[inline]
    pub(super) fn own(own: &'a A) -> Self {
        Self {
            algorithm: own,
            tag: 0,
        }
    }

    /// What a check at `quota` decides with, in the table of the limit `name` whose own
    /// algorithm is `own` (`own` itself without a quota), or an error if `quota` is for another
    /// algorithm.
    #[inline]
    pub(super) fn of(
        own: &'a A,
        name: Name,
        quota: Option<&'a PlanQuota>,
    ) -> Result<Self, StoreError> {
        match quota {
            None => Ok(Self::own(own)),
            Some(quota) => Self::plan(own, name, quota),
        }
    }

    fn plan(own: &'a A, name: Name, quota: &'a PlanQuota) -> Result<Self, StoreError> {
        match A::from_compiled(&quota.compiled) {
            // The table's own quota, however the plan was built: tag 0, no tags to store.
            Some(algorithm) if algorithm == own => Ok(Self::own(own)),
            Some(algorithm) => Ok(Self {
                algorithm,
                tag: quota.tag,
            }),
            None => Err(mismatch(name, A::KIND, quota)),
        }
    }
}

/// The error for a check at a quota compiled for another algorithm than the limit's.
#[cold]
fn mismatch(name: Name, kind: AlgorithmKind, quota: &PlanQuota) -> StoreError {
    let message = format!(
        "limit {name} decides with {kind}, but the check's quota ({}) is compiled for {}; build \
         the PlanQuota with AlgorithmKind::{kind:?}, the limit's algorithm",
        quota.quota(),
        quota.algorithm(),
    );
    tracing::warn!(%message, "invalid in-memory rate-limit check");
    StoreError::new(StoreErrorKind::Other, message)
}

/// The algorithm that states tagged `tag` were written under in a table whose own algorithm is
/// `own`, or `None` if that quota is no longer kept (see [`PlanQuota`]).
fn algorithm_of<A: Compiled>(own: &A, tag: u32) -> Option<A> {
    if tag == 0 {
        return Some(*own);
    }
    // Tags stored in this table all name quotas of its algorithm.
    plan_quota::compiled(tag).and_then(|c| A::from_compiled(&c).copied())
}

/// Converts the state in `slot` to `at`'s quota if it was written under another (`now` is on
/// `at`'s time base).
#[inline]
pub(super) fn align<A: Compiled>(
    own: &A,
    shard: &mut Shard<A::State>,
    slot: u32,
    at: AtQuota<'_, A>,
    now: u64,
    offset: UnixOffset<'_>,
) {
    let tag = shard.tag(slot);
    if tag != at.tag {
        rebase(own, shard, slot, tag, at, now, offset);
    }
}

/// The state in `slot` converted to `at`'s quota, as a copy, if it was written under another
/// quota that is still known (`now` is on `at`'s time base); `None` if it was written under
/// `at`'s. A check decides on the copy and stores it only if it charges something: a check of
/// cost 0, or a rejected one, writes nothing, so the key keeps the state (and the quota) it was
/// written under, and a later change back finds it whole. A state whose quota is forgotten is
/// converted in place (see [`rebase`]).
#[inline]
pub(super) fn converted<A: Compiled>(
    own: &A,
    shard: &mut Shard<A::State>,
    slot: u32,
    at: AtQuota<'_, A>,
    now: u64,
    offset: UnixOffset<'_>,
) -> Option<A::State> {
    let tag = shard.tag(slot);
    if tag == at.tag {
        return None;
    }
    convert(own, shard, slot, tag, at, now, offset)
}

#[cold]
fn convert<A: Compiled>(
    own: &A,
    shard: &mut Shard<A::State>,
    slot: u32,
    tag: u32,
    at: AtQuota<'_, A>,
    now: u64,
    offset: UnixOffset<'_>,
) -> Option<A::State> {
    match algorithm_of(own, tag) {
        Some(from) => {
            let from_now = shift(at.algorithm, &from, now, offset);
            let mut state = shard.read_state(slot, Clone::clone);
            at.algorithm.rebase_across(&from, &mut state, from_now, now);
            Some(state)
        }
        None => {
            rebase(own, shard, slot, tag, at, now, offset);
            None
        }
    }
}

/// Stores `state`, converted to `at`'s quota and charged, in `slot`.
#[cold]
pub(super) fn store_converted<A: Compiled>(
    shard: &mut Shard<A::State>,
    slot: u32,
    at: AtQuota<'_, A>,
    state: A::State,
) {
    shard.update_state(slot, |s| *s = state);
    shard.set_tag(slot, at.tag);
}

/// Converts the state in `slot`, written under the quota tagged `tag`, to `at`'s quota in
/// place.
#[cold]
fn rebase<A: Compiled>(
    own: &A,
    shard: &mut Shard<A::State>,
    slot: u32,
    tag: u32,
    at: AtQuota<'_, A>,
    now: u64,
    offset: UnixOffset<'_>,
) {
    match algorithm_of(own, tag) {
        Some(from) => {
            // The state's times are on `from`'s time base: read it there, at the same instant.
            let from_now = shift(at.algorithm, &from, now, offset);
            shard.update_state(slot, |state| {
                at.algorithm.rebase_across(&from, state, from_now, now)
            });
        }
        // The quota the state was written under is forgotten: count the key as having spent
        // its whole budget now, never as a fresh one.
        None => shard.update_state(slot, |state| {
            *state = A::State::default();
            at.algorithm.apply(state, now, at.algorithm.capacity());
        }),
    }
    shard.set_tag(slot, at.tag);
}

/// Whether `state` (written under the quota tagged `tag`, in a table whose own algorithm is
/// `own`) behaves exactly like a fresh key's at `now` (read on `at`'s time base) under that
/// quota (it has been idle long enough to refill completely), so its slot may be recycled early.
pub(super) fn is_fresh<A: Compiled>(
    own: &A,
    state: &A::State,
    tag: u32,
    at: AtQuota<'_, A>,
    now: u64,
    offset: UnixOffset<'_>,
) -> bool {
    let fresh = |algorithm: &A| {
        // The state's times are on its own quota's time base.
        let now = shift(at.algorithm, algorithm, now, offset);
        algorithm.decide(state, now, 0) == algorithm.decide(&A::State::default(), now, 0)
    };
    match tag {
        0 => fresh(own),
        // A quota no longer kept: judged by the limit's own quota, so that the slot of a key
        // never seen again is not held forever.
        tag => fresh(&algorithm_of(own, tag).unwrap_or(*own)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    #[test]
    fn a_table_takes_only_its_own_algorithm_out_of_a_plan_quota() {
        let gcra = PlanQuota::new(AlgorithmKind::Gcra, Quota::per_second(5)).unwrap();
        assert!(Gcra::from_compiled(&gcra.compiled).is_some());
        assert!(TokenBucket::from_compiled(&gcra.compiled).is_none());
        let own = Gcra::new(Quota::per_second(5)).unwrap();
        let name = Name::new("t");
        let at = AtQuota::of(&own, name, Some(&gcra)).unwrap();
        assert_eq!(at.tag, 0, "the table's own quota, however it was compiled");
        let pro = PlanQuota::new(AlgorithmKind::Gcra, Quota::per_second(50)).unwrap();
        assert_eq!(AtQuota::of(&own, name, Some(&pro)).unwrap().tag, pro.tag);
        let other = PlanQuota::new(AlgorithmKind::TokenBucket, Quota::per_second(5)).unwrap();
        assert!(AtQuota::of(&own, name, Some(&other)).is_err());
    }
}
