//! Per-key overrides of a layer's limits, set at runtime: a custom quota, block or exempt.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::algorithm::AlgorithmKind;
use crate::decision::Name;
use crate::key::Key;
use crate::store::{PlanQuota, QuotaPin};

/// A runtime decision about one key of one limit, set with
/// [`RateLimitLayer::set_override`](crate::RateLimitLayer::set_override): it outlives policy reloads.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Override {
    /// Decide this key at `quota` (a custom deal for one customer). The key keeps what it spent.
    Quota(crate::quota::Quota),
    /// Refuse every request of this key with `403 Forbidden` and a problem+json body.
    Block,
    /// This limit does not apply to this key.
    Exempt,
}

/// An override as the request path uses it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Active {
    Quota(PlanQuota),
    Block,
    Exempt,
}

/// An override's quota, compiled for its limit's algorithm, and the pin that keeps its tag
/// while the override exists (in any map a reader may still hold): so that a reload or another
/// set finds it under the same tag, and the key's state stays convertible, however many other
/// quotas the process compiles meanwhile (see [`PlanQuota`]).
#[derive(Debug)]
pub(crate) struct Pinned {
    quota: PlanQuota,
    _pin: QuotaPin,
}

impl Pinned {
    pub(crate) fn new(quota: PlanQuota) -> Arc<Self> {
        Arc::new(Self {
            _pin: quota.pin(),
            quota,
        })
    }
}

type Map = HashMap<(Name, Box<[u8]>), (Override, Option<Arc<Pinned>>)>;

/// The overrides of one layer: copy-on-write, read without a lock, checked only while any
/// exist (one relaxed load otherwise).
#[derive(Default)]
pub(crate) struct OverrideTable {
    map: ArcSwap<Map>,
    /// The committed map's length; written only under `writing`, after the map.
    len: AtomicUsize,
    /// Serialises writers (rare), so `len` always ends as the last map's length.
    writing: std::sync::Mutex<()>,
}

impl OverrideTable {
    /// The override for `key` of `limit`, if any.
    #[inline]
    pub(crate) fn get(&self, limit: Name, key: &Key<'_>) -> Option<Active> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.lookup(limit, key)
    }

    #[inline(never)]
    fn lookup(&self, limit: Name, key: &Key<'_>) -> Option<Active> {
        let mut bytes = Vec::with_capacity(32);
        key.write_canonical(&mut bytes);
        let map = self.map.load();
        let (value, quota) = map.get(&(limit, bytes.into_boxed_slice()))?;
        Some(match value {
            Override::Quota(_) => Active::Quota(quota.as_ref()?.quota),
            Override::Block => Active::Block,
            Override::Exempt => Active::Exempt,
        })
    }

    pub(crate) fn set(
        &self,
        limit: Name,
        key: &Key<'_>,
        value: Override,
        quota: Option<PlanQuota>,
    ) {
        let mut bytes = Vec::new();
        key.write_canonical(&mut bytes);
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let quota = quota.map(Pinned::new);
        let mut map = Map::clone(&self.map.load());
        // The replaced override's pin is released once no reader holds the old map.
        map.insert((limit, bytes.into_boxed_slice()), (value, quota));
        let len = map.len();
        self.map.store(Arc::new(map));
        self.len.store(len, Ordering::Relaxed);
    }

    pub(crate) fn remove(&self, limit: Name, key: &Key<'_>) -> bool {
        let mut bytes = Vec::new();
        key.write_canonical(&mut bytes);
        let k = (limit, bytes.into_boxed_slice());
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mut map = Map::clone(&self.map.load());
        let removed = map.remove(&k).is_some();
        let len = map.len();
        self.map.store(Arc::new(map));
        self.len.store(len, Ordering::Relaxed);
        removed
    }

    /// Recompiles the quota of every override whose limit `algorithm_of` names with an
    /// algorithm other than its quota's (`compile` gives the new quota, or `None` when the
    /// quota does not fit that algorithm: the key is then decided as if it had no override).
    /// Others keep their quota, tag and pin. One new map, whatever the number of overrides.
    pub(crate) fn recompile(
        &self,
        algorithm_of: impl Fn(Name) -> Option<AlgorithmKind>,
        compile: impl Fn(AlgorithmKind, crate::Quota) -> Option<PlanQuota>,
    ) {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.map.load_full();
        let mut map: Option<Map> = None;
        for ((limit, key), (value, quota)) in current.iter() {
            let Override::Quota(q) = value else { continue };
            let Some(algorithm) = algorithm_of(*limit) else {
                continue;
            };
            if quota.as_ref().map(|p| p.quota.algorithm()) == Some(algorithm) {
                continue;
            }
            let recompiled = compile(algorithm, *q).map(Pinned::new);
            let map = map.get_or_insert_with(|| Map::clone(&current));
            if let Some(entry) = map.get_mut(&(*limit, key.clone())) {
                entry.1 = recompiled;
            }
        }
        if let Some(map) = map {
            self.map.store(Arc::new(map));
        }
    }
}

/// A digest of a key for audit events: correlates events of one process without logging the
/// key. Seeded randomly per process, so a log reader cannot enumerate small key spaces (IPv4
/// addresses) against it; the same key has another digest after a restart.
pub(crate) fn key_digest(key: &Key<'_>) -> String {
    static SEED: std::sync::OnceLock<foldhash::quality::RandomState> = std::sync::OnceLock::new();
    let mut bytes = Vec::new();
    key.write_canonical(&mut bytes);
    let mut h = SEED.get_or_init(Default::default).build_hasher();
    h.write(&bytes);
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;

    fn quota_of(table: &OverrideTable, limit: Name, key: &Key<'_>) -> Option<Arc<Pinned>> {
        let mut bytes = Vec::new();
        key.write_canonical(&mut bytes);
        let map = table.map.load();
        map.get(&(limit, bytes.into_boxed_slice()))?.1.clone()
    }

    #[test]
    fn a_reload_recompiles_only_overrides_whose_algorithm_changed() {
        let table = OverrideTable::default();
        let (api, web, gone) = (Name::new("api"), Name::new("web"), Name::new("gone"));
        let key = Key::string("big-co");
        let q = Quota::per_hour(5_000);
        for limit in [api, web, gone] {
            let quota = PlanQuota::new(AlgorithmKind::Gcra, q).unwrap();
            table.set(limit, &key, Override::Quota(q), Some(quota));
        }
        table.set(api, &Key::string("x"), Override::Block, None);
        let before = [api, web, gone].map(|l| quota_of(&table, l, &key).unwrap());

        // api keeps GCRA, web changes to a fixed window, gone is not in the new set.
        table.recompile(
            |name| {
                (name == api)
                    .then_some(AlgorithmKind::Gcra)
                    .or((name == web).then_some(AlgorithmKind::FixedWindow))
            },
            |algorithm, quota| PlanQuota::new(algorithm, quota).ok(),
        );
        let after = [api, web, gone].map(|l| quota_of(&table, l, &key).unwrap());
        assert!(
            Arc::ptr_eq(&before[0], &after[0]),
            "unchanged: same quota and pin"
        );
        assert!(
            Arc::ptr_eq(&before[2], &after[2]),
            "no such limit: left as it was"
        );
        assert_eq!(after[1].quota.algorithm(), AlgorithmKind::FixedWindow);
        assert_eq!(*after[1].quota.quota(), q);
        assert!(matches!(
            table.get(api, &Key::string("x")),
            Some(Active::Block)
        ));

        // A quota the new algorithm refuses: the override applies none, and is compiled again
        // when its limit's algorithm next changes.
        let bursty = Quota::per_hour(5_000).burst(6_000);
        let quota = PlanQuota::new(AlgorithmKind::Gcra, bursty).unwrap();
        table.set(api, &key, Override::Quota(bursty), Some(quota));
        table.recompile(
            |_| Some(AlgorithmKind::FixedWindow),
            |algorithm, quota| PlanQuota::new(algorithm, quota).ok(),
        );
        assert!(quota_of(&table, api, &key).is_none());
        assert!(table.get(api, &key).is_none());
        table.recompile(
            |_| Some(AlgorithmKind::TokenBucket),
            |algorithm, quota| PlanQuota::new(algorithm, quota).ok(),
        );
        let now = quota_of(&table, api, &key).unwrap();
        assert_eq!(now.quota.algorithm(), AlgorithmKind::TokenBucket);
        assert_eq!(*now.quota.quota(), bursty);
    }
}
