//! [`MemorySlots`]: the in-memory slot table, one count of requests in flight per key, with a
//! FIFO queue of waiters per key and a bound on the number of keys.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use hashbrown::HashMap;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::key::Key;

/// Shards of the table: a request locks one, briefly, to take or give back a slot.
const SHARDS: usize = 16;

/// What [`MemorySlots::acquire`] answers.
#[derive(Debug)]
pub(crate) enum Acquire {
    /// A slot is held.
    Got(MemoryPermit),
    /// Every slot is taken; the request waits its turn on this receiver, which gets the slot of
    /// the next request of its key to finish.
    Queued(oneshot::Receiver<MemoryPermit>),
    /// Every slot is taken (`in_flight` requests) and the request cannot wait.
    Full {
        /// Requests in flight for the key.
        in_flight: u32,
    },
    /// The table holds its maximum number of keys, each with a request in flight.
    TooManyKeys,
}

/// Looks a borrowed key up among the owned ones.
struct Lookup<'k, 'a>(&'k Key<'a>);

impl Hash for Lookup<'_, '_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl hashbrown::Equivalent<Arc<Key<'static>>> for Lookup<'_, '_> {
    fn equivalent(&self, key: &Arc<Key<'static>>) -> bool {
        self.0 == &**key
    }
}

/// One key's slots.
#[derive(Debug)]
struct Entry {
    /// The key, shared with the permits of its requests (owned once per key, not per request).
    key: Arc<Key<'static>>,
    in_flight: u32,
    waiters: VecDeque<oneshot::Sender<MemoryPermit>>,
}

#[derive(Debug)]
struct Shard {
    keys: HashMap<Arc<Key<'static>>, Entry, foldhash::fast::RandomState>,
}

/// The in-memory slot table: at most `max_in_flight` requests per key hold a slot; keys with
/// nothing in flight and nobody waiting take no memory.
#[derive(Debug)]
pub(crate) struct MemorySlots {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    max_in_flight: u32,
    /// Keys per shard (the table's bound divided among the shards, at least 1).
    max_keys_per_shard: usize,
}

impl MemorySlots {
    pub(crate) fn new(max_in_flight: u32, max_keys: usize) -> Arc<Self> {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    keys: HashMap::with_hasher(foldhash::fast::RandomState::default()),
                })
            })
            .collect();
        Arc::new(Self {
            shards,
            hasher: foldhash::fast::RandomState::default(),
            max_in_flight,
            max_keys_per_shard: max_keys.div_ceil(SHARDS).max(1),
        })
    }

    fn shard(&self, key: &Key<'_>) -> usize {
        // The hash's high bits (multiply-shift): foldhash's low bits spread sequential keys poorly.
        ((u128::from(self.hasher.hash_one(key)) * SHARDS as u128) >> 64) as usize
    }

    /// Takes a slot for `key`, or queues for one when `queue` (the most waiters a key may have)
    /// allows.
    pub(crate) fn acquire(self: &Arc<Self>, key: &Key<'_>, queue: usize) -> Acquire {
        let shard = self.shard(key);
        let mut guard = self.shards[shard].lock();
        let keys = &mut guard.keys;
        let entry = match keys.get_mut(&Lookup(key)) {
            Some(entry) => entry,
            None => {
                if keys.len() >= self.max_keys_per_shard {
                    return Acquire::TooManyKeys;
                }
                let owned = Arc::new(key.clone().into_owned());
                keys.entry(Arc::clone(&owned)).or_insert(Entry {
                    key: owned,
                    in_flight: 0,
                    waiters: VecDeque::new(),
                })
            }
        };
        if entry.in_flight < self.max_in_flight {
            entry.in_flight += 1;
            let key = Arc::clone(&entry.key);
            drop(guard);
            return Acquire::Got(MemoryPermit {
                table: Arc::clone(self),
                key: Some(key),
                shard,
            });
        }
        // Waiters that gave up are still counted until a release skips them; drop them here so
        // they do not hold the queue's room.
        entry.waiters.retain(|w| !w.is_closed());
        if entry.waiters.len() >= queue {
            return Acquire::Full {
                in_flight: entry.in_flight,
            };
        }
        let (tx, rx) = oneshot::channel();
        entry.waiters.push_back(tx);
        Acquire::Queued(rx)
    }

    /// Gives a slot of `key` back: to the first waiter still waiting, else to the table.
    fn release(self: &Arc<Self>, key: Arc<Key<'static>>, shard: usize) {
        let mut guard = self.shards[shard].lock();
        let Some(entry) = guard.keys.get_mut(&key) else {
            return;
        };
        let mut key = Some(key);
        while let Some(waiter) = entry.waiters.pop_front() {
            let permit = MemoryPermit {
                table: Arc::clone(self),
                key: key.take(),
                shard,
            };
            match waiter.send(permit) {
                // The slot changed hands: the count stays.
                Ok(()) => return,
                // That waiter is gone: take the slot back without releasing it again.
                Err(mut permit) => key = permit.key.take(),
            }
        }
        entry.in_flight = entry.in_flight.saturating_sub(1);
        if entry.in_flight == 0
            && let Some(key) = key
        {
            guard.keys.remove(&key);
        }
    }

    /// Requests in flight for `key`.
    pub(crate) fn in_flight(&self, key: &Key<'_>) -> u32 {
        self.shards[self.shard(key)]
            .lock()
            .keys
            .get(&Lookup(key))
            .map_or(0, |e| e.in_flight)
    }

    /// Keys with a request in flight or waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().keys.len()).sum()
    }
}

/// A slot held in a [`MemorySlots`] table; dropping it gives the slot back (to the next waiter
/// of its key, first come, first served).
pub(crate) struct MemoryPermit {
    table: Arc<MemorySlots>,
    /// `None` once given back (or handed on).
    key: Option<Arc<Key<'static>>>,
    shard: usize,
}

impl std::fmt::Debug for MemoryPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPermit")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Drop for MemoryPermit {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.table.release(key, self.shard);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn got(a: Acquire) -> MemoryPermit {
        match a {
            Acquire::Got(p) => p,
            other => panic!("expected a slot, got {other:?}"),
        }
    }

    #[test]
    fn counts_per_key_and_forgets_idle_keys() {
        let t = MemorySlots::new(2, 100);
        let (a, b) = (Key::string("a"), Key::string("b"));
        let a1 = got(t.acquire(&a, 0));
        let a2 = got(t.acquire(&a, 0));
        assert!(matches!(t.acquire(&a, 0), Acquire::Full { in_flight: 2 }));
        let _b1 = got(t.acquire(&b, 0));
        assert_eq!(t.in_flight(&a), 2);
        drop(a1);
        assert_eq!(t.in_flight(&a), 1);
        drop(a2);
        assert_eq!(t.in_flight(&a), 0);
        assert_eq!(t.len(), 1, "a key with nothing in flight takes no memory");
    }

    #[test]
    fn hands_slots_to_waiters_in_order_and_skips_the_ones_that_left() {
        let t = MemorySlots::new(1, 100);
        let k = Key::int(7);
        let held = got(t.acquire(&k, 3));
        let Acquire::Queued(mut first) = t.acquire(&k, 3) else {
            panic!()
        };
        let Acquire::Queued(second) = t.acquire(&k, 3) else {
            panic!()
        };
        let Acquire::Queued(mut third) = t.acquire(&k, 3) else {
            panic!()
        };
        assert!(matches!(t.acquire(&k, 3), Acquire::Full { in_flight: 1 }));
        drop(second); // gives up
        drop(held);
        let p1 = first.try_recv().expect("the first waiter gets the slot");
        assert!(third.try_recv().is_err());
        assert_eq!(t.in_flight(&k), 1);
        drop(p1);
        let p3 = third
            .try_recv()
            .expect("the second waiter left; the third is next");
        drop(p3);
        assert_eq!(t.in_flight(&k), 0);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_slot_sent_to_a_waiter_that_then_leaves_comes_back() {
        let t = MemorySlots::new(1, 100);
        let k = Key::int(1);
        let held = got(t.acquire(&k, 1));
        let Acquire::Queued(rx) = t.acquire(&k, 1) else {
            panic!()
        };
        drop(held); // sent into the channel
        drop(rx); // never read: the permit inside is dropped and released
        assert_eq!(t.in_flight(&k), 0);
        got(t.acquire(&k, 0));
    }

    #[test]
    fn the_key_bound_refuses_new_keys_only() {
        let t = MemorySlots::new(1, 1);
        let mut held = Vec::new();
        let mut refused = 0;
        // Enough keys that every shard is reached whatever the hasher's seed.
        let tried = 10_000;
        for i in 0..tried {
            match t.acquire(&Key::int(i), 0) {
                Acquire::Got(p) => held.push(p),
                Acquire::TooManyKeys => refused += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(held.len(), SHARDS, "one key per shard");
        assert_eq!(refused, tried as usize - SHARDS);
        held.clear();
        assert_eq!(t.len(), 0);
    }
}
