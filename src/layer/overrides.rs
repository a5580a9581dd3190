//! Per-key overrides of a layer's limits, set at runtime: a custom quota, block or exempt.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::decision::PolicyName;
use crate::key::Key;
use crate::plan::Override;
use crate::store::PlanQuota;

/// An override as the request path uses it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Active {
    Quota(PlanQuota),
    Block,
    Exempt,
}

type Map = HashMap<(PolicyName, Box<[u8]>), (Override, Option<PlanQuota>)>;

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
    pub(crate) fn get(&self, limit: PolicyName, key: &Key<'_>) -> Option<Active> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.lookup(limit, key)
    }

    #[inline(never)]
    fn lookup(&self, limit: PolicyName, key: &Key<'_>) -> Option<Active> {
        let mut bytes = Vec::with_capacity(32);
        key.write_canonical(&mut bytes);
        let map = self.map.load();
        let (value, quota) = map.get(&(limit, bytes.into_boxed_slice()))?;
        Some(match value {
            Override::Quota(_) => Active::Quota((*quota)?),
            Override::Block => Active::Block,
            Override::Exempt => Active::Exempt,
        })
    }

    pub(crate) fn set(
        &self,
        limit: PolicyName,
        key: &Key<'_>,
        value: Override,
        quota: Option<PlanQuota>,
    ) {
        let mut bytes = Vec::new();
        key.write_canonical(&mut bytes);
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mut map = Map::clone(&self.map.load());
        map.insert((limit, bytes.into_boxed_slice()), (value, quota));
        let len = map.len();
        self.map.store(Arc::new(map));
        self.len.store(len, Ordering::Relaxed);
    }

    pub(crate) fn remove(&self, limit: PolicyName, key: &Key<'_>) -> bool {
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

    /// Every override, to recompile quotas for a limit whose algorithm a reload changed.
    pub(crate) fn entries(&self) -> Vec<(PolicyName, Box<[u8]>, Override)> {
        self.map
            .load()
            .iter()
            .map(|((l, k), (v, _))| (*l, k.clone(), *v))
            .collect()
    }

    pub(crate) fn recompile(&self, limit: PolicyName, key: Box<[u8]>, quota: Option<PlanQuota>) {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mut map = Map::clone(&self.map.load());
        if let Some(entry) = map.get_mut(&(limit, key)) {
            entry.1 = quota;
        }
        self.map.store(Arc::new(map));
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
