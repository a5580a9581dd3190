//! The process-wide registry of plan quotas: it names each distinct quota (algorithm and
//! [`Quota`]) by a tag, which stores keep beside a key's state, and keeps the quota a tag names
//! while a layer in service holds it or while it is among the [`KEPT_QUOTAS`] most recently used
//! (see [`PlanQuota`](super::PlanQuota) for what this promises).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::compiled_algorithm::CompiledAlgorithm;
use crate::algorithm::AlgorithmKind;
use crate::error::ConfigError;
use crate::quota::Quota;

/// How many quotas that no layer in service holds the process keeps (see [`PlanQuota`](crate::store::PlanQuota)).
pub const KEPT_QUOTAS: usize = 1024;

/// Keeps a quota's tag in the registry while it lives (see `PlanQuota::pin`).
pub(crate) struct QuotaPin {
    tag: u32,
    quotas: &'static Quotas,
}

impl QuotaPin {
    /// Pins `tag`, the quota `key` compiled as `compiled`.
    fn new(
        quotas: &'static Quotas,
        tag: u32,
        key: (AlgorithmKind, Quota),
        compiled: CompiledAlgorithm,
    ) -> Self {
        quotas.update(|r| r.pin(tag, key, compiled));
        Self { tag, quotas }
    }
}

/// Keeps `tag`, the quota `key` compiled as `compiled`, while the pin lives.
pub(super) fn pin(tag: u32, key: (AlgorithmKind, Quota), compiled: CompiledAlgorithm) -> QuotaPin {
    QuotaPin::new(&REGISTRY, tag, key, compiled)
}

/// The tag of `quota` enforced by `algorithm`, compiled as `compiled`: the kept one, or a new
/// one.
pub(super) fn tag(
    algorithm: AlgorithmKind,
    quota: Quota,
    compiled: CompiledAlgorithm,
) -> Result<u32, ConfigError> {
    REGISTRY.tag(algorithm, quota, compiled)
}

impl Drop for QuotaPin {
    fn drop(&mut self) {
        self.quotas.update(|r| r.unpin(self.tag));
    }
}

impl fmt::Debug for QuotaPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("QuotaPin").field(&self.tag).finish()
    }
}

/// The quotas kept, by tag and by quota (see [`PlanQuota`](crate::store::PlanQuota)). Changed under a mutex when quotas
/// are compiled and layers built or dropped (configuration time); stores and
/// [`PlanQuota::new`](crate::store::PlanQuota::new) read a published snapshot of it without a lock.
struct Quotas {
    registry: Mutex<Registry>,
    /// The registry as published: every tag given is in it before the tag is handed out; it
    /// may still hold quotas forgotten since (they are then kept a little longer).
    published: ArcSwap<Published>,
    /// Stamps uses (compiles and releases) in order, without a lock: a compile that finds its
    /// quota published stamps the entry's `last` with it.
    clock: Arc<AtomicU64>,
}

/// The last use of an entry, written without the registry's lock.
type Last = Arc<AtomicU64>;

/// A snapshot of the registry: a full copy, and the quotas given since (at most `DELTA`), so
/// that giving a tag copies at most `DELTA` entries and a full copy is made once per
/// `DELTA` tags given (or once per half the registry's size in quotas forgotten).
#[derive(Default)]
struct Published {
    full: Arc<Full>,
    since: Vec<(u32, (AlgorithmKind, Quota), CompiledAlgorithm, Last)>,
}

#[derive(Default)]
struct Full {
    tags: HashMap<(AlgorithmKind, Quota), (u32, Last)>,
    compiled: HashMap<u32, CompiledAlgorithm>,
}

/// Quotas given between two full copies of the registry.
const DELTA: usize = 64;

impl Published {
    fn compiled(&self, tag: u32) -> Option<CompiledAlgorithm> {
        match self.since.iter().find(|e| e.0 == tag) {
            Some(e) => Some(e.2),
            None => self.full.compiled.get(&tag).copied(),
        }
    }

    /// The tag of `key` and its entry's last use.
    fn tag(&self, key: (AlgorithmKind, Quota)) -> Option<(u32, &AtomicU64)> {
        match self.since.iter().rev().find(|e| e.1 == key) {
            Some(e) => Some((e.0, &e.3)),
            None => self.full.tags.get(&key).map(|(tag, last)| (*tag, &**last)),
        }
    }
}

impl Quotas {
    fn new(keep: usize) -> Self {
        let clock = Arc::new(AtomicU64::new(0));
        Self {
            registry: Mutex::new(Registry::new(keep, Arc::clone(&clock))),
            published: ArcSwap::from_pointee(Published::default()),
            clock,
        }
    }

    /// Changes the registry, then publishes the tags it gave, and a full copy once enough
    /// changed.
    fn update<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        let mut registry = self.registry.lock();
        let out = f(&mut registry);
        let given = std::mem::take(&mut registry.given);
        if registry.forgotten > registry.entries.len() / 2 + 16 {
            self.publish_full(&mut registry);
        } else if !given.is_empty() {
            let published = self.published.load();
            if published.since.len() + given.len() > DELTA {
                drop(published);
                self.publish_full(&mut registry);
            } else {
                let mut since = published.since.clone();
                since.extend(given.iter().filter_map(|&tag| {
                    let e = registry.entries.get(&tag)?;
                    Some((tag, (e.algorithm, e.quota), e.compiled, Arc::clone(&e.last)))
                }));
                self.published.store(Arc::new(Published {
                    full: Arc::clone(&published.full),
                    since,
                }));
            }
        }
        out
    }

    fn publish_full(&self, registry: &mut Registry) {
        registry.forgotten = 0;
        let tags = registry
            .entries
            .iter()
            .map(|(&tag, e)| ((e.algorithm, e.quota), (tag, Arc::clone(&e.last))))
            .collect();
        let compiled = registry
            .entries
            .iter()
            .map(|(&tag, e)| (tag, e.compiled))
            .collect();
        self.published.store(Arc::new(Published {
            full: Arc::new(Full { tags, compiled }),
            since: Vec::new(),
        }));
    }

    /// The algorithm `tag` names, if kept.
    fn compiled(&self, tag: u32) -> Option<CompiledAlgorithm> {
        self.published.load().compiled(tag)
    }

    /// The tag of `quota` enforced by `algorithm`, compiled as `compiled`: a use of it, as
    /// recent as a new quota's (a published one is stamped without the lock).
    fn tag(
        &self,
        algorithm: AlgorithmKind,
        quota: Quota,
        compiled: CompiledAlgorithm,
    ) -> Result<u32, ConfigError> {
        if let Some((tag, last)) = self.published.load().tag((algorithm, quota)) {
            last.fetch_max(
                self.clock.fetch_add(1, Ordering::Relaxed) + 1,
                Ordering::Relaxed,
            );
            return Ok(tag);
        }
        self.update(|r| r.intern(algorithm, quota, compiled))
    }
}

static REGISTRY: LazyLock<Quotas> = LazyLock::new(|| Quotas::new(KEPT_QUOTAS));

/// The quotas kept: those pinned by a layer in service, and the `keep` unpinned ones most
/// recently compiled or released.
struct Registry {
    /// The tag of each quota kept.
    tags: HashMap<(AlgorithmKind, Quota), u32>,
    /// Each kept quota, by tag.
    entries: HashMap<u32, Entry>,
    /// Every unpinned tag, by the use it was queued at (least recent first). An entry used
    /// since without the lock (its `last` is later) is queued again at that use when it comes
    /// first, rather than forgotten.
    recent: BTreeMap<u64, u32>,
    /// Stamps uses (shared with [`Quotas::clock`]).
    clock: Arc<AtomicU64>,
    /// The last tag given (tags are never given twice).
    last: u32,
    /// How many unpinned quotas are kept: [`KEPT_QUOTAS`].
    keep: usize,
    /// Tags given (or kept again) by the current change, to publish.
    given: Vec<u32>,
    /// Quotas forgotten since the last full publication.
    forgotten: usize,
}

struct Entry {
    algorithm: AlgorithmKind,
    quota: Quota,
    compiled: CompiledAlgorithm,
    /// Layers in service holding it.
    pins: u32,
    /// The use it is queued at in `recent`, if unpinned.
    queued: u64,
    /// Its last use: `queued` or later.
    last: Last,
}

impl Registry {
    fn new(keep: usize, clock: Arc<AtomicU64>) -> Self {
        Self {
            tags: HashMap::new(),
            entries: HashMap::new(),
            recent: BTreeMap::new(),
            clock,
            last: 0,
            keep,
            given: Vec::new(),
            forgotten: 0,
        }
    }

    /// The tag of `quota` enforced by `algorithm` (compiled as `compiled`): the kept one, or a
    /// new one.
    fn intern(
        &mut self,
        algorithm: AlgorithmKind,
        quota: Quota,
        compiled: CompiledAlgorithm,
    ) -> Result<u32, ConfigError> {
        if let Some(&tag) = self.tags.get(&(algorithm, quota)) {
            self.used(tag);
            return Ok(tag);
        }
        let Some(tag) = self.last.checked_add(1) else {
            return Err(ConfigError::new(
                "quota",
                "more than 4,294,967,295 distinct plan quotas compiled in one process; reuse \
                 PlanQuota values (equal quotas share one) instead of compiling a new quota per key",
            ));
        };
        self.last = tag;
        self.insert(tag, (algorithm, quota), compiled, 0);
        self.used(tag);
        Ok(tag)
    }

    fn insert(
        &mut self,
        tag: u32,
        (algorithm, quota): (AlgorithmKind, Quota),
        compiled: CompiledAlgorithm,
        pins: u32,
    ) {
        self.tags.entry((algorithm, quota)).or_insert(tag);
        self.entries.insert(
            tag,
            Entry {
                algorithm,
                quota,
                compiled,
                pins,
                queued: 0,
                last: Arc::new(AtomicU64::new(0)),
            },
        );
        self.given.push(tag);
    }

    /// Pins `tag` (the quota `key`, compiled as `compiled`): kept again if it was forgotten
    /// meanwhile (a tag names one quota only, so it is still that one).
    fn pin(&mut self, tag: u32, key: (AlgorithmKind, Quota), compiled: CompiledAlgorithm) {
        match self.entries.get_mut(&tag) {
            Some(entry) => {
                if entry.pins == 0 {
                    self.recent.remove(&entry.queued);
                }
                entry.pins += 1;
            }
            None => self.insert(tag, key, compiled, 1),
        }
    }

    fn unpin(&mut self, tag: u32) {
        if let Some(entry) = self.entries.get_mut(&tag) {
            entry.pins -= 1;
            if entry.pins == 0 {
                self.used(tag);
            }
        }
    }

    /// `tag` was used: if unpinned, it becomes the most recent, and the least recent unpinned
    /// tags beyond `keep` are forgotten.
    fn used(&mut self, tag: u32) {
        let Some(entry) = self.entries.get_mut(&tag) else {
            return;
        };
        if entry.pins > 0 {
            return;
        }
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        entry.last.fetch_max(now, Ordering::Relaxed);
        self.recent.remove(&entry.queued);
        entry.queued = now;
        self.recent.insert(now, tag);
        while self.recent.len() > self.keep {
            let Some((at, old)) = self.recent.pop_first() else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&old) else {
                continue;
            };
            let last = entry.last.load(Ordering::Relaxed);
            if last > at {
                // Compiled again since it was queued (found published): as recent as that.
                // Stamps are unique, so `last` is no other item's.
                entry.queued = last;
                self.recent.insert(last, old);
                continue;
            }
            let key = (entry.algorithm, entry.quota);
            self.entries.remove(&old);
            if self.tags.get(&key) == Some(&old) {
                self.tags.remove(&key);
            }
            self.forgotten += 1;
        }
    }
}

/// The algorithm tag `tag` (not 0) names, if it is kept (see [`PlanQuota`](crate::store::PlanQuota)).
pub(crate) fn compiled(tag: u32) -> Option<CompiledAlgorithm> {
    REGISTRY.compiled(tag)
}

/// The number of quotas the process keeps (see [`PlanQuota`](crate::store::PlanQuota)): how tests see its memory.
#[doc(hidden)]
pub fn kept_quotas() -> usize {
    REGISTRY.registry.lock().entries.len()
}

/// Runs `f` while holding the quota registry's lock: how tests show that requests never take
/// it.
#[doc(hidden)]
pub fn with_quota_registry_locked<R>(f: impl FnOnce() -> R) -> R {
    let _held = REGISTRY.registry.lock();
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Gcra, TokenBucket};

    /// A quota compiled in a registry of a test's own.
    struct Compiled {
        tag: u32,
        compiled: CompiledAlgorithm,
        quota: Quota,
    }

    #[test]
    fn unpinned_quotas_are_kept_while_recent_then_forgotten() {
        // A registry of its own (keeping 4), so that other tests' quotas are not churned.
        let quotas: &'static Quotas = Box::leak(Box::new(Quotas::new(4)));
        let compile = |n: u64| {
            let quota = Quota::per_hour(n);
            let compiled = CompiledAlgorithm::TokenBucket(TokenBucket::new(quota).unwrap());
            let tag = quotas
                .update(|r| r.intern(AlgorithmKind::TokenBucket, quota, compiled))
                .unwrap();
            Compiled {
                tag,
                compiled,
                quota,
            }
        };
        let kept = |tag| quotas.registry.lock().entries.get(&tag).map(|e| e.compiled);
        let a = compile(60);
        assert_eq!(compile(60).tag, a.tag, "equal quotas share a tag");
        for n in 1..=3 {
            compile(n);
        }
        assert_eq!(kept(a.tag), Some(a.compiled), "among the 4 most recent");
        compile(4);
        assert_eq!(kept(a.tag), None, "a fifth forgets the least recent");
        let b = compile(60);
        assert_ne!(
            b.tag, a.tag,
            "a tag is never given to another quota, even an equal one"
        );

        // Pinned (a layer in service): kept however many others come.
        let pin = QuotaPin::new(
            quotas,
            b.tag,
            (AlgorithmKind::TokenBucket, b.quota),
            b.compiled,
        );
        for n in 100..200 {
            compile(n);
        }
        assert_eq!(kept(b.tag), Some(b.compiled));
        assert_eq!(
            quotas.registry.lock().entries.len(),
            5,
            "the pinned one and the 4 most recent"
        );
        // Released: the most recent, kept until 4 others are used.
        drop(pin);
        for n in 200..203 {
            compile(n);
        }
        assert!(kept(b.tag).is_some());
        compile(203);
        assert_eq!(kept(b.tag), None);
        assert_eq!(quotas.registry.lock().entries.len(), 4);

        // Re-using a kept quota keeps `recent` bounded.
        for _ in 0..10_000 {
            compile(203);
        }
        assert!(quotas.registry.lock().recent.len() <= 4);
    }

    #[test]
    fn compiling_a_kept_quota_again_makes_it_recent_without_the_lock() {
        let quotas: &'static Quotas = Box::leak(Box::new(Quotas::new(4)));
        // Through `Quotas::tag`, as `PlanQuota::new` does: a published quota is found without
        // the lock.
        let compile = |n: u64| {
            let quota = Quota::per_hour(n);
            let compiled = CompiledAlgorithm::Gcra(Gcra::new(quota).unwrap());
            quotas.tag(AlgorithmKind::Gcra, quota, compiled).unwrap()
        };
        let kept = |tag| quotas.registry.lock().entries.contains_key(&tag);
        let a = compile(60);
        for n in 1..=3 {
            compile(n);
        }
        let found = {
            let _held = quotas.registry.lock();
            // The fast path takes no lock: it completes while the registry is locked.
            let quota = Quota::per_hour(60);
            let compiled = CompiledAlgorithm::Gcra(Gcra::new(quota).unwrap());
            quotas.tag(AlgorithmKind::Gcra, quota, compiled).unwrap()
        };
        assert_eq!(found, a);
        // Now the most recent: 1, 2 and 3 are forgotten before it.
        let four = compile(4);
        let five = compile(5);
        let six = compile(6);
        assert!(kept(a), "a quota compiled again is as recent as a new one");
        assert!(kept(four) && kept(five) && kept(six));
        assert_eq!(quotas.registry.lock().entries.len(), 4);
        compile(7);
        assert!(!kept(a), "then forgotten in its turn");
        assert_eq!(quotas.registry.lock().recent.len(), 4);
    }
}
