//! The in-memory store: per-limit sharded tables with a hard key bound and second-chance
//! eviction that never forgets a key before it has regained what it spent.
//!
//! [`MemoryBackend`] is the configuration (key bound, shards, clock); the layer builder turns it
//! into a [`MemoryStore`], which decides every check synchronously, without allocating or
//! boxing for a key it already holds.
//!
//! ```
//! use tollgate::key::Key;
//! use tollgate::store::{Backend, LimitSpec, memory::MemoryBackend};
//! use tollgate::{AlgorithmKind, Name, Quota};
//!
//! // Defaults: 100,000 keys per limit, shards from the CPU count, the default clock.
//! let spec = LimitSpec::new(
//!     Name::new("per-ip"),
//!     Quota::per_second(5),
//!     AlgorithmKind::TokenBucket,
//! );
//! let store = MemoryBackend::new().build(&[spec]).unwrap();
//! let key = Key::string("203.0.113.7");
//! let remaining: Vec<u64> = (0..6).map(|_| store.check_one(0, &key, 1).unwrap().remaining()).collect();
//! assert_eq!(remaining, [4, 3, 2, 1, 0, 0]);
//! assert!(!store.check_one(0, &key, 1).unwrap().allowed());
//! ```
//!
//! Customised: a small bound, a manual clock, and two limits checked all-or-nothing through
//! [`Store::check`](crate::store::Store::check):
//!
//! ```
//! use std::time::Duration;
//! use tollgate::clock::ManualClock;
//! use tollgate::key::Key;
//! use tollgate::store::{Backend, Checked, LimitCheck, LimitSpec, memory::MemoryBackend, Store};
//! use tollgate::{AlgorithmKind, Name, Quota};
//!
//! let clock = ManualClock::new();
//! let limits = [
//!     LimitSpec::new(Name::new("burst"), Quota::per_second(10), AlgorithmKind::TokenBucket),
//!     LimitSpec::new(Name::new("daily"), Quota::per_day(2), AlgorithmKind::TokenBucket),
//! ];
//! let store = MemoryBackend::new()
//!     .max_keys(10_000)
//!     .shards(4)
//!     .clock(clock.clone())
//!     .build(&limits)
//!     .unwrap();
//! let user = Key::int(42);
//! let checks = [
//!     LimitCheck::new(0, user.clone(), 1),
//!     LimitCheck::new(1, user.clone(), 1),
//! ];
//! let check = |store: &tollgate::store::memory::MemoryStore<ManualClock>| match store.check(&checks) {
//!     Checked::Ready(decisions) => decisions.unwrap(),
//!     Checked::Pending(never) => match never {},
//! };
//! assert!(check(&store).allowed());
//! assert!(check(&store).allowed());
//! // The daily quota rejects the third request, so the burst limit is not charged for it.
//! let third = check(&store);
//! assert_eq!(third.rejected().unwrap().policy().as_str(), "daily");
//! assert_eq!(third.as_slice()[0].remaining(), 8);
//! assert_eq!(store.check_one(0, &user, 0).unwrap().remaining(), 8);
//! ```
//!
//! # What a user can rely on
//!
//! - **A hard key bound.** Each limit holds at most [`max_keys`](MemoryBackend::max_keys) keys
//!   (default 100,000), split over independently locked shards. A check decides synchronously,
//!   without allocating for a key the store already holds.
//!
//! - **Bound and eviction.** A new key takes the place of an idle key that has fully recovered
//!   its budget, preferring one not used lately (a second-chance clock, close to LRU): eviction
//!   never hands a spent budget back. When a new key finds its shard full of keys still
//!   recovering, it is decided by the limit's overflow bucket, one budget of the limit's quota
//!   shared by all such keys; each such check is counted ([`MemoryStore::overflowed`]) and
//!   logged at WARN. Size `max_keys` for the clients active within one idle timeout (for
//!   `per_day` limits: a day), with a few percent of headroom, as shards fill unevenly.
//!
//! - **Memory per key.** Keys are kept as 64-bit fingerprints of a hash seeded per store, so a
//!   key costs the same whether it is an IPv4 address or a 1 MB header: about 44 bytes per key
//!   for the token bucket, GCRA, fixed window and leaky bucket, 54 for the sliding window, 84
//!   for the sliding log plus 16 bytes per entry it holds (about 4.4 MB for a full token-bucket
//!   limit at the default bound). [`MemoryStore::memory_usage`] reports it.
//!
//! - **All or nothing.** A check of several limits charges every limit or none, atomically.
//!
//! - **Plans and reloads.** A check at a [`PlanQuota`](crate::store::PlanQuota) keeps what the
//!   key spent under its previous quota, and [`Store::reconfigure`](crate::store::Store::reconfigure)
//!   keeps the counters of every limit with the same name and algorithm.
//!
//! How the store does this (the lock-free refusal path, the table, eviction, the figures behind
//! the memory per key) is described for maintainers in `docs/internals/memory-store.md` in the
//! repository.

mod any_table;
mod atomic_state;
mod backend;
mod overflow;
mod rebase;
mod segments;
mod seqlock;
mod shard;
mod slot;
mod store;
mod table;

pub use backend::MemoryBackend;
pub use store::{MemoryFuture, MemoryStore};
