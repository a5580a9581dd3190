//! Per-thread caches of metric handles with a limit (and plan) label.
//!
//! Registering a handle (`metrics::counter!` with labels built at run time) allocates the label
//! list and makes the recorder look the key up; the handles are cached per thread instead,
//! keyed by the names themselves (a [`Name`] is inline text: comparing two is a compare
//! of 48 bytes, with no pointer to chase), for the recorder they came from. No lock, no atomic:
//! each thread has its own. Bounded by [`MAX_CACHED`] entries (the label sets are bounded by the
//! configuration anyway). The decision counters a thread used last are checked first, without
//! hashing: a layer with one limit (or a run of requests of one plan) finds them with one compare.

use std::cell::RefCell;
use std::collections::HashMap;

use metrics::{Counter, Gauge, Recorder};

use super::{DECISIONS_TOTAL, KEYS, NEAR_LIMIT_TOTAL, OUTCOMES};
use crate::decision::{Decision, Name};

/// Entries a thread keeps before it starts over.
const MAX_CACHED: usize = 1024;

pub(super) struct DecisionCounters {
    pub(super) outcome: [Counter; 3],
    pub(super) near: Counter,
}

/// A limit's name and its plan's.
type DecisionId = (Name, Option<Name>);

#[derive(Default)]
struct Cache {
    /// The address of the recorder the handles belong to.
    recorder: usize,
    /// The counters, in the order they were registered.
    decisions: Vec<(DecisionId, DecisionCounters)>,
    /// Where each id's counters are in `decisions`.
    index: HashMap<DecisionId, usize, foldhash::fast::FixedState>,
    /// The entry of `decisions` used last. After a clear it may be out of range or name another
    /// id's entry: its id is compared before it is used.
    last: usize,
    keys: HashMap<Name, Gauge, foldhash::fast::FixedState>,
}

impl Cache {
    fn clear(&mut self) {
        self.decisions.clear();
        self.index.clear();
        self.keys.clear();
    }

    /// The entry of `decisions` for `id`, registered now if it is new; it becomes `last`.
    #[cold]
    #[inline(never)]
    fn find(&mut self, id: DecisionId) -> usize {
        let at = match self.index.get(&id) {
            Some(&at) => at,
            None => {
                if self.decisions.len() >= MAX_CACHED {
                    self.decisions.clear();
                    self.index.clear();
                }
                self.decisions.push((id, register(id.0, id.1)));
                self.index.insert(id, self.decisions.len() - 1);
                self.decisions.len() - 1
            }
        };
        self.last = at;
        at
    }
}

thread_local!(static CACHE: RefCell<Cache> = RefCell::new(Cache::default()));

/// The recorder in use on this thread (a thread-local one, the global one, or the no-op).
#[inline]
fn recorder_address() -> usize {
    metrics::with_recorder(|r| std::ptr::from_ref::<dyn Recorder>(r).cast::<()>() as usize)
}

/// Runs `f` with this thread's cache, emptied first if the recorder changed.
#[inline]
fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    let recorder = recorder_address();
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.recorder != recorder {
            cache.clear();
            cache.recorder = recorder;
        }
        f(&mut cache)
    })
}

#[inline]
pub(super) fn with_decision_counters(decision: &Decision, f: impl FnOnce(&DecisionCounters)) {
    let id = (decision.policy(), decision.plan());
    with_cache(|cache| {
        let at = match cache.decisions.get(cache.last) {
            Some((last, _)) if *last == id => cache.last,
            _ => cache.find(id),
        };
        f(&cache.decisions[at].1);
    });
}

#[cold]
fn register(limit: Name, plan: Option<Name>) -> DecisionCounters {
    // Owned labels: the names live no longer than the policy that holds them.
    let (limit, plan) = (
        limit.as_str().to_owned(),
        plan.map_or(String::new(), |p| p.as_str().to_owned()),
    );
    DecisionCounters {
        outcome: OUTCOMES.map(|outcome| {
            metrics::counter!(DECISIONS_TOTAL, "limit" => limit.clone(), "plan" => plan.clone(), "outcome" => outcome)
        }),
        near: metrics::counter!(NEAR_LIMIT_TOTAL, "limit" => limit, "plan" => plan),
    }
}

pub(super) fn with_keys_gauge(limit: Name, f: impl FnOnce(&Gauge)) {
    with_cache(|cache| {
        if cache.keys.len() >= MAX_CACHED && !cache.keys.contains_key(&limit) {
            cache.keys.clear();
        }
        let gauge = cache
            .keys
            .entry(limit)
            .or_insert_with(|| metrics::gauge!(KEYS, "limit" => limit.as_str().to_owned()));
        f(gauge);
    });
}
