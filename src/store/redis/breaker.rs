//! Circuit breakers: one per Redis node a store talks to (the node itself, or each Cluster
//! master), so a dead master only short-circuits the keys it serves.
//!
//! A breaker opens after `threshold` consecutive failed calls to its node. While open, calls to
//! that node are decided by the failure policies without being sent, and one probe task pings
//! that node until it answers. The probe is tracked by a token it holds: if the probe dies
//! without closing the breaker (its runtime was shut down), the token is gone and the next
//! request starts a new probe, so a breaker can never stay open for ever.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

use arc_swap::ArcSwap;

use super::stats::RedisStats;

/// The breaker of one node.
#[derive(Debug, Default)]
pub(crate) struct Breaker {
    failures: AtomicU32,
    open: AtomicBool,
    /// The running probe's token; dead when no probe runs.
    probe: Mutex<Weak<()>>,
    /// The node's address (`""`: the single node, or a Cluster node not known yet), for the
    /// `tollgate_breaker_open` gauge.
    node: Box<str>,
}

impl Breaker {
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Relaxed)
    }

    /// A call succeeded: the failure streak ends.
    pub(crate) fn on_success(&self) {
        if self.failures.load(Relaxed) != 0 {
            self.failures.store(0, Relaxed);
        }
    }

    /// A call failed. Returns true when this failure opened the breaker.
    pub(crate) fn on_failure(&self, threshold: u32, stats: &RedisStats) -> bool {
        let streak = self.failures.fetch_add(1, Relaxed).saturating_add(1);
        if streak >= threshold && !self.open.swap(true, Relaxed) {
            stats.breaker_opened();
            crate::metrics::record_breaker(&self.node, true);
            return true;
        }
        false
    }

    /// Closes the breaker after a successful probe.
    pub(crate) fn close(&self, stats: &RedisStats) {
        self.failures.store(0, Relaxed);
        if self.open.swap(false, Relaxed) {
            stats.breaker_closed();
            crate::metrics::record_breaker(&self.node, false);
        }
    }

    /// Claims the probe: a token for the new probe task to hold, or `None` if a live probe
    /// already runs.
    pub(crate) fn claim_probe(&self) -> Option<Arc<()>> {
        let mut probe = self.probe.lock().unwrap_or_else(|e| e.into_inner());
        if probe.upgrade().is_some() {
            return None;
        }
        let token = Arc::new(());
        *probe = Arc::downgrade(&token);
        Some(token)
    }
}

/// The breakers of a store's nodes, by node address (`host:port`; `""` for a single node or a
/// Cluster node not known yet). Breakers outlive topology changes: an address keeps its breaker.
///
/// Finding a node's breaker takes no lock: the table is replaced whole (under `adding`) when a
/// node is first seen, which happens once per master.
#[derive(Debug, Default)]
pub(crate) struct Breakers {
    by_node: ArcSwap<HashMap<Box<str>, Arc<Breaker>>>,
    /// Held while a breaker is added, so that two new nodes at once both stay.
    adding: Mutex<()>,
    /// The breaker for a single node, and for Cluster calls whose node is not known.
    default: Arc<Breaker>,
}

impl Breakers {
    pub(crate) fn default_breaker(&self) -> &Arc<Breaker> {
        &self.default
    }

    /// The breaker of the node at `addr`.
    pub(crate) fn node(&self, addr: &str) -> Arc<Breaker> {
        if let Some(b) = self.by_node.load().get(addr) {
            return b.clone();
        }
        let _adding = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        let map = self.by_node.load_full();
        if let Some(b) = map.get(addr) {
            return b.clone();
        }
        let b = Arc::new(Breaker {
            node: addr.into(),
            ..Breaker::default()
        });
        let mut map = HashMap::clone(&map);
        map.insert(addr.into(), b.clone());
        self.by_node.store(Arc::new(map));
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_the_threshold_and_closes_on_demand() {
        let stats = RedisStats::default();
        let b = Breaker::default();
        assert!(!b.on_failure(3, &stats));
        b.on_success();
        assert!(!b.on_failure(3, &stats));
        assert!(!b.on_failure(3, &stats));
        assert!(b.on_failure(3, &stats), "third consecutive failure opens");
        assert!(b.is_open() && stats.breaker_open());
        assert!(!b.on_failure(3, &stats), "already open: no second trip");
        assert_eq!(stats.breaker_trips(), 1);
        b.close(&stats);
        assert!(!b.is_open() && !stats.breaker_open());
    }

    #[test]
    fn a_dead_probe_can_be_replaced() {
        let b = Breaker::default();
        let token = b.claim_probe().expect("first probe");
        assert!(b.claim_probe().is_none(), "one probe at a time");
        drop(token); // the probe task died (e.g. its runtime shut down)
        assert!(b.claim_probe().is_some(), "a new probe may start");
    }

    #[test]
    fn breakers_are_per_node() {
        let stats = RedisStats::default();
        let breakers = Breakers::default();
        let a = breakers.node("127.0.0.1:7000");
        assert!(a.on_failure(1, &stats));
        assert!(breakers.node("127.0.0.1:7000").is_open());
        assert!(!breakers.node("127.0.0.1:7001").is_open());
        assert!(!breakers.default_breaker().is_open());
    }

    #[test]
    fn nodes_added_at_once_each_keep_one_breaker() {
        let breakers = Breakers::default();
        let addrs: Vec<String> = (0..32).map(|i| format!("127.0.0.1:{}", 7000 + i)).collect();
        let got: Vec<Vec<Arc<Breaker>>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| s.spawn(|| addrs.iter().map(|a| breakers.node(a)).collect()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for (i, addr) in addrs.iter().enumerate() {
            let b = breakers.node(addr);
            assert_eq!(&*b.node, addr.as_str());
            for seen in &got {
                assert!(Arc::ptr_eq(&seen[i], &b), "{addr}: one breaker");
            }
        }
    }
}
