//! Routing: a request's checks become script calls. On a single node (or when every key shares
//! a hash slot) all of them go in one call, decided all-or-nothing; on a Cluster, checks are
//! grouped by the hash slot of their keys, one call per slot, each sent to the master serving
//! it (through that master's breaker and batcher).

use std::sync::Arc;

use super::breaker::Breaker;
use super::script::{Group, LimitArg, LimitInfo, QuotaArg};
use super::slots::slot_of_tag;
use super::store::Inner;
use crate::store::{LimitCheck, MAX_LIMITS};

/// One script call of a request: a group of its checks and the node that decides them.
pub(super) struct ScriptCall {
    pub(super) group: Group,
    /// The breaker of its node and the node's address (`None`: the single node, or a Cluster
    /// node not known yet), shared with the slot map.
    pub(super) node: (Arc<Breaker>, Option<Arc<str>>),
    /// The hash slot of its keys (Cluster; 0 on a single node).
    pub(super) slot: u16,
    /// The check index of each of its limits; empty when the group holds every check in order
    /// (a single node's one group, or a Cluster request whose keys share a slot).
    pub(super) positions: Vec<usize>,
}

/// Which groups a request's checks fall in: one group (a single node, or one hash slot), which
/// takes no allocation beyond the group's own, or several (a Cluster request over several slots).
pub(super) enum ScriptCalls {
    One(ScriptCall),
    Several(Vec<ScriptCall>),
}

/// The check index of each limit of `group`, from its `positions` (empty: every check in order).
pub(super) fn positions_of<'p>(group: &Group, positions: &'p [usize]) -> &'p [usize] {
    if positions.is_empty() {
        &IDENTITY[..group.len()]
    } else {
        positions
    }
}

thread_local! {
    /// The buffer a request's keys are encoded in (see [`KeyEncoder::encode`]), kept per thread
    /// so that routing a request allocates nothing for it.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The largest [`SCRATCH`] kept between requests, in bytes.
const SCRATCH_KEEP: usize = 4096;

/// Check positions of a single node's one group.
const IDENTITY: [usize; MAX_LIMITS] = {
    let mut a = [0; MAX_LIMITS];
    let mut i = 0;
    while i < MAX_LIMITS {
        a[i] = i;
        i += 1;
    }
    a
};

impl Inner {
    /// The breaker (and address) of the node serving `tag`'s slot: two reference counts, no
    /// lock and no allocation once the node's breaker exists.
    pub(super) fn node_of(&self, tag: &[u8]) -> (Arc<Breaker>, Option<Arc<str>>) {
        match self
            .slots
            .map()
            .node_and_breaker(slot_of_tag(tag), &self.breakers)
        {
            Some((addr, breaker)) => (breaker, Some(addr.clone())),
            None => (self.breakers.default_breaker().clone(), None),
        }
    }

    /// The script call(s) for `checks`: a check (`reserved_at` `None`) or a refund of a check
    /// charged at `reserved_at`.
    pub(super) fn route(
        &self,
        checks: &[LimitCheck<'_>],
        now: Option<u64>,
        reserved_at: Option<u64>,
    ) -> ScriptCalls {
        SCRATCH.with_borrow_mut(|scratch| {
            let calls = self.route_in(checks, now, reserved_at, scratch);
            // A huge key may have grown the buffer: keep it small for the next request.
            if scratch.capacity() > SCRATCH_KEEP {
                *scratch = Vec::new();
            }
            calls
        })
    }

    fn route_in(
        &self,
        checks: &[LimitCheck<'_>],
        now: Option<u64>,
        reserved_at: Option<u64>,
        scratch: &mut Vec<u8>,
    ) -> ScriptCalls {
        let arg = |c: &LimitCheck<'_>| LimitArg {
            limit: c.limit,
            cost: c.cost,
            quota: quota_arg(c, &self.limits[c.limit]),
        };
        if !self.cluster || checks.len() == 1 {
            // On a single node every limit goes in one script call, whatever its slot; so does
            // a Cluster request of one limit.
            let mut group = Group {
                keys: Vec::with_capacity(checks.len()),
                limits: Vec::with_capacity(checks.len()),
                now,
                reserved_at,
            };
            let mut tag = [0u8; 16];
            for c in checks {
                let info = &self.limits[c.limit];
                let enc = self
                    .keys
                    .encode(info.short, &info.name_enc, &c.key, scratch);
                tag = enc.tag;
                group.keys.push(enc.key);
                group.limits.push(arg(c));
            }
            let (node, slot) = if self.cluster {
                (self.node_of(&tag), slot_of_tag(&tag))
            } else {
                ((self.breakers.default_breaker().clone(), None), 0)
            };
            return ScriptCalls::One(ScriptCall {
                group,
                node,
                slot,
                positions: Vec::new(),
            });
        }
        let mut calls: Vec<ScriptCall> = Vec::with_capacity(1);
        let mut tags: Vec<[u8; 16]> = Vec::with_capacity(1);
        for (i, c) in checks.iter().enumerate() {
            let info = &self.limits[c.limit];
            let enc = self
                .keys
                .encode(info.short, &info.name_enc, &c.key, scratch);
            let g = match tags.iter().position(|t| *t == enc.tag) {
                Some(g) => g,
                None => {
                    tags.push(enc.tag);
                    calls.push(ScriptCall {
                        group: Group {
                            now,
                            reserved_at,
                            ..Group::default()
                        },
                        node: self.node_of(&enc.tag),
                        slot: slot_of_tag(&enc.tag),
                        positions: Vec::with_capacity(checks.len()),
                    });
                    calls.len() - 1
                }
            };
            let p = &mut calls[g];
            p.group.keys.push(enc.key);
            p.group.limits.push(arg(c));
            p.positions.push(i);
        }
        if calls.len() == 1 {
            let mut one = calls.pop().expect("one group");
            one.positions.clear(); // every check, in order
            return ScriptCalls::One(one);
        }
        ScriptCalls::Several(calls)
    }
}

/// The quota a check is sent with: its plan's, else the limit's own when the script holds
/// another (after a reconfiguration changed it), else none (the script's constants).
#[inline]
fn quota_arg(c: &LimitCheck<'_>, info: &LimitInfo) -> Option<QuotaArg> {
    match c.quota {
        None => info.own,
        Some(q) => Some(QuotaArg::of(q)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::AlgorithmKind;
    use crate::key::Key;
    use crate::quota::Quota;
    use crate::store::redis::{RedisBackend, RedisStore};
    use crate::store::{Backend, FailurePolicy, LimitSpec, PlanQuota};
    use crate::Name;

    /// A store of `n` limits (`l0`, `l1`, ...) on `backend`; building connects to nothing.
    fn store(backend: RedisBackend, n: usize) -> RedisStore {
        let limits: Vec<LimitSpec> = (0..n)
            .map(|i| {
                LimitSpec::new(
                    Name::new(format!("l{i}")),
                    Quota::per_minute(10),
                    AlgorithmKind::TokenBucket,
                )
                .on_store_error(FailurePolicy::Open)
            })
            .collect();
        backend.build(&limits).unwrap()
    }

    fn node(n: usize) -> RedisStore {
        store(RedisBackend::new("redis://127.0.0.1:1"), n)
    }

    fn cluster(n: usize) -> RedisStore {
        store(RedisBackend::cluster(["redis://127.0.0.1:1"]), n)
    }

    fn check<'a>(limit: usize, client: &str, cost: u64) -> LimitCheck<'a> {
        LimitCheck::new(limit, Key::string(client.to_owned()), cost)
    }

    /// The hash tag of a Redis key (between its braces), as Redis hashes it.
    fn tag(key: &str) -> &str {
        let start = key.find('{').unwrap() + 1;
        &key[start..start + key[start..].find('}').unwrap()]
    }

    fn key(store: &RedisStore, c: &LimitCheck<'_>) -> String {
        store.redis_key(c.limit, &c.key).unwrap()
    }

    #[test]
    fn a_single_node_sends_every_check_in_one_call_in_order() {
        let store = node(3);
        let checks = [
            check(0, "alice", 1),
            check(1, "bob", 2),
            check(2, "carol", 3),
        ];
        let ScriptCalls::One(call) = store.inner.route(&checks, None, None) else {
            panic!("one call on a single node");
        };
        let keys: Vec<String> = checks.iter().map(|c| key(&store, c)).collect();
        assert_eq!(call.group.keys, keys);
        let limits: Vec<(usize, u64)> = call
            .group
            .limits
            .iter()
            .map(|l| (l.limit, l.cost))
            .collect();
        assert_eq!(limits, [(0, 1), (1, 2), (2, 3)]);
        assert!(call.positions.is_empty(), "every check, in order");
        assert_eq!(positions_of(&call.group, &call.positions), [0, 1, 2]);
        assert_eq!((call.slot, call.node.1), (0, None));
    }

    #[test]
    fn a_cluster_groups_checks_by_hash_slot_and_keeps_their_positions() {
        let store = cluster(4);
        let checks = [
            check(0, "alice", 1),
            check(1, "bob", 1),
            check(2, "alice", 2),
            check(3, "carol", 1),
        ];
        let ScriptCalls::Several(calls) = store.inner.route(&checks, None, None) else {
            panic!("one call per slot");
        };
        // In the order of each slot's first check; each call's keys share its slot.
        let positions: Vec<&[usize]> = calls.iter().map(|c| &c.positions[..]).collect();
        assert_eq!(positions, [&[0, 2][..], &[1], &[3]]);
        for call in &calls {
            for (key, &p) in call.group.keys.iter().zip(&call.positions) {
                assert_eq!(*key, self::key(&store, &checks[p]));
                assert_eq!(call.slot, slot_of_tag(tag(key).as_bytes()), "{key}");
            }
            assert_eq!(call.node.1, None, "no slot map read yet");
        }
        let alice: Vec<(usize, u64)> = calls[0]
            .group
            .limits
            .iter()
            .map(|l| (l.limit, l.cost))
            .collect();
        assert_eq!(alice, [(0, 1), (2, 2)]);
    }

    #[test]
    fn a_cluster_request_in_one_slot_is_one_call() {
        let store = cluster(2);
        let checks = [check(0, "alice", 1), check(1, "alice", 1)];
        let ScriptCalls::One(call) = store.inner.route(&checks, None, None) else {
            panic!("one slot, one call");
        };
        assert!(call.positions.is_empty());
        assert_eq!(call.group.keys.len(), 2);
        assert_eq!(call.slot, slot_of_tag(tag(&call.group.keys[0]).as_bytes()));
        let ScriptCalls::One(one) = store.inner.route(&checks[..1], None, None) else {
            panic!("one check, one call");
        };
        assert_eq!(one.slot, call.slot);
    }

    #[test]
    fn a_call_carries_its_times_and_a_plans_quota() {
        let store = node(2);
        let plan = PlanQuota::new(AlgorithmKind::TokenBucket, Quota::per_second(5)).unwrap();
        let checks = [check(0, "alice", 1), check(1, "alice", 1).with_quota(&plan)];
        let ScriptCalls::One(call) = store.inner.route(&checks, Some(7), Some(3)) else {
            panic!("one call");
        };
        assert_eq!((call.group.now, call.group.reserved_at), (Some(7), Some(3)));
        assert_eq!(
            call.group.limits[0].quota, None,
            "the script's own parameters"
        );
        assert_eq!(call.group.limits[1].quota, Some(QuotaArg::of(&plan)));
    }
}
