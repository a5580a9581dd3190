//! Per-thread caches of metric handles with a limit (and plan) label.
//!
//! Registering a handle (`metrics::counter!` with labels built at run time) allocates the label
//! list and makes the recorder look the key up; the handles are cached per thread instead,
//! keyed by the interned names' addresses, for the recorder they came from. No lock, no atomic:
//! each thread has its own. Bounded by [`MAX_CACHED`] entries (the label sets are bounded by the
//! configuration anyway).

use std::cell::RefCell;
use std::collections::HashMap;

use metrics::{Counter, Gauge, Recorder};

use super::{DECISIONS_TOTAL, KEYS, NEAR_LIMIT_TOTAL, OUTCOMES};
use crate::decision::{Decision, PolicyName};

/// Entries a thread keeps before it starts over.
const MAX_CACHED: usize = 1024;

pub(super) struct DecisionCounters {
    pub(super) outcome: [Counter; 3],
    pub(super) near: Counter,
}

#[derive(Default)]
struct Cache {
    /// The address of the recorder the handles belong to.
    recorder: usize,
    decisions: HashMap<(usize, usize), DecisionCounters, foldhash::fast::FixedState>,
    keys: HashMap<usize, Gauge, foldhash::fast::FixedState>,
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
            cache.decisions.clear();
            cache.keys.clear();
            cache.recorder = recorder;
        }
        f(&mut cache)
    })
}

#[inline]
pub(super) fn with_decision_counters(decision: &Decision, f: impl FnOnce(&DecisionCounters)) {
    let (limit, plan) = (decision.policy(), decision.plan());
    let id = (limit.id(), plan.map_or(0, PolicyName::id));
    with_cache(|cache| {
        if cache.decisions.len() >= MAX_CACHED && !cache.decisions.contains_key(&id) {
            cache.decisions.clear();
        }
        let counters = cache
            .decisions
            .entry(id)
            .or_insert_with(|| register(limit, plan));
        f(counters);
    });
}

#[cold]
fn register(limit: PolicyName, plan: Option<PolicyName>) -> DecisionCounters {
    let (limit, plan) = (limit.as_str(), plan.map_or("", |p| p.as_str()));
    DecisionCounters {
        outcome: OUTCOMES.map(|outcome| {
            metrics::counter!(DECISIONS_TOTAL, "limit" => limit, "plan" => plan, "outcome" => outcome)
        }),
        near: metrics::counter!(NEAR_LIMIT_TOTAL, "limit" => limit, "plan" => plan),
    }
}

pub(super) fn with_keys_gauge(limit: PolicyName, f: impl FnOnce(&Gauge)) {
    with_cache(|cache| {
        if cache.keys.len() >= MAX_CACHED && !cache.keys.contains_key(&limit.id()) {
            cache.keys.clear();
        }
        let gauge = cache
            .keys
            .entry(limit.id())
            .or_insert_with(|| metrics::gauge!(KEYS, "limit" => limit.as_str()));
        f(gauge);
    });
}
