//! The in-memory store: per-limit sharded tables with a hard key bound and second-chance
//! eviction that never forgets a key before it has regained what it spent.
//!
//! [`MemoryBackend`] is the configuration (key bound, shards, clock); the layer builder turns it
//! into a [`MemoryStore`], which decides every check synchronously, without allocating or
//! boxing for a key it already holds.
//!
//! ```
//! use tollgate::key::Key;
//! use tollgate::store::{Backend, LimitSpec, MemoryBackend};
//! use tollgate::{AlgorithmKind, PolicyName, Quota};
//!
//! // Defaults: 100,000 keys per limit, shards from the CPU count, the default clock.
//! let spec = LimitSpec::new(
//!     PolicyName::new("per-ip"),
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
//! use tollgate::store::{Backend, Checked, LimitCheck, LimitSpec, MemoryBackend, Store};
//! use tollgate::{AlgorithmKind, PolicyName, Quota};
//!
//! let clock = ManualClock::new();
//! let limits = [
//!     LimitSpec::new(PolicyName::new("burst"), Quota::per_second(10), AlgorithmKind::TokenBucket),
//!     LimitSpec::new(PolicyName::new("daily"), Quota::per_day(2), AlgorithmKind::TokenBucket),
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
//! let check = |store: &tollgate::store::MemoryStore<ManualClock>| match store.check(&checks) {
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
//! # Design
//!
//! **Tables and shards.** The store holds one table per limit, typed by its algorithm when the
//! store is built (an `enum` of tables, so a check costs one `match`, never a virtual call or a
//! box). A table is split into a power-of-two number of shards, each behind its own
//! `parking_lot` mutex on its own cache lines. A single-limit check reads the clock once, hashes
//! the key, and finds the key's slot *without* the lock: each shard is also a sequence lock (a
//! version that every locked access makes odd while it runs), and a key's slot is atomics (see
//! `slot.rs`, `cell.rs`), so a reader can copy the key's state and know that no write overlapped
//! the copy. A refusal is answered from that copy (it writes nothing, so it is exactly the
//! refusal a locked check at that instant makes), and writes no shared memory: refusals on
//! several cores share the shard's cache lines instead of trading the lock's line on every
//! check. An allowed check then locks the shard and, if no locked access came in between,
//! stores the charged copy in the same slot; otherwise (and for keys not held) it is decided
//! under the lock. The slots are allocated in segments that never move while the shard lives
//! (`slots.rs`), so a reader needs no reference count or epoch. No `unsafe` code is involved. A
//! sliding log's state owns a heap buffer and is always read under the lock.
//!
//! **Several limits, all-or-nothing.** A check of several limits hashes every key, reads the
//! clock once, then locks the involved shards in one global order (of their tables' identities,
//! which the stores that a reload makes share, so concurrent checks cannot deadlock), decides every limit, and charges them only if every one
//! allowed, all before unlocking. The whole check is therefore atomic: no other check observes a
//! partial charge, and a rejected request leaves every limit's state exactly as it was (the
//! keys only become more recently used). When one limit rejects, the decisions of the limits
//! that would have allowed are re-evaluated at cost 0, so their `remaining` and `reset` describe
//! their actual, uncharged state. Each limit may appear once per check; naming a limit twice or
//! one that does not exist is a [`StoreError`](crate::StoreError), and nothing is charged.
//!
//! **Keys.** A [`Key`](crate::key::Key) borrows from the request; the store never copies it.
//! It is hashed with [foldhash](https://docs.rs/foldhash) (quality variant) seeded at random
//! per store, to a 64-bit fingerprint, and only the fingerprint is kept: a key costs the same
//! eight bytes whether it is an IPv4 address or a 1 MB header. foldhash because it hashes a short
//! key in a few nanoseconds (SipHash takes several times longer, on the hot path of every
//! request), and seeded because an attacker who cannot know the seed cannot predict which shard
//! or bucket a key lands in, so cannot aim many keys at one shard or build collision chains.
//! (foldhash is not a cryptographic function; it resists such attacks, it does not prove them
//! impossible.) Two distinct keys with equal fingerprints would share one state: with `n` keys
//! held, a new key collides with probability `n / 2^64`, about 5 × 10⁻¹⁵ at the default bound
//! of 100,000, and the chance that any two of the 100,000 collide is about 3 × 10⁻¹⁰.
//!
//! **Bound and eviction.** Each table holds at most [`max_keys`](MemoryBackend::max_keys) keys,
//! split exactly over its shards. A shard is an open-addressing hash table holding each key's
//! state in its slot (linear probing, at most 4/5 full), so a check of a held key reads one
//! place in memory, and a clock of the keys in the order they arrived, for eviction. Shards fill
//! unevenly, by about `1 / sqrt(keys per shard)`, so leave some headroom over the number of keys
//! you expect to be active: a few percent at a million keys. (By default a bound under 8,192
//! keys gets one shard; larger bounds get shards of at least 4,096 keys.)
//!
//! *Eviction never resets a budget.* Forgetting a key hands back whatever it had spent, so only
//! a key whose state is as good as a fresh key's at that instant (it has been idle long enough to
//! recover completely: [`Algorithm::idle_timeout_micros`](crate::algorithm::Algorithm::idle_timeout_micros)
//! at most, longer for a key carrying spending above a lower quota's capacity) is ever forgotten, and then freely: a new key takes the slot of such a key among the
//! 8 at the shard's clock hand, which walks the keys oldest first and prefers one not used since
//! it last passed (a second chance: an allowed check sets a bit in the key's own slot, where an exact LRU
//! list would also write two neighbouring entries); while the shard still has room, the key at
//! the hand is recycled if it has recovered, before the table grows. A key
//! that has spent budget is kept until it has regained it by itself, however many other keys
//! arrive. When a new key is charged and its shard is full with no recovered key among those 8,
//! it is decided by the limit's **overflow bucket**: one state of the limit's quota, shared by
//! every such key of the table, so while the table is full of spenders all new keys together
//! get one client's budget (`count` per `period`, after the burst). Each such check is counted
//! ([`MemoryStore::overflowed`]) and logged at WARN (at most once per 10 s per limit, with the
//! limit's name and the count). A flood of distinct keys therefore costs a victim nothing: its
//! spent budget stays spent (tested in `eviction_never_resets_a_spent_budget` and
//! `tests/attack_memory.rs`); what it can cost is availability for *new* clients, bounded by
//! the overflow bucket, until the flood's keys recover. Size `max_keys` for the clients active
//! within one idle timeout (for `per_day` limits: a day). A request that is rejected or costs 0
//! on an unknown key stores nothing (a fresh key is the default state).
//!
//! **Plans and reloads.** A [`LimitCheck`](crate::store::LimitCheck) may carry a
//! [`PlanQuota`](crate::store::PlanQuota) (the quota of the client's plan, or a per-key
//! override), and is then decided at that quota; a quota of another algorithm than the limit's
//! is a [`StoreError`](crate::StoreError) and charges nothing. Each key remembers which quota
//! its state was written under (a 4-byte tag in its slot), and a check at another quota
//! first converts the state with [`Algorithm::rebase`](crate::algorithm::Algorithm::rebase):
//! the key keeps what it spent, whichever way its plan moved. Eviction judges a key by the
//! quota it was written under, so a key on a slow plan is never recycled early by its limit's
//! faster quota. The overflow bucket is always decided at the quota its table was built with.
//! [`Store::reconfigure`](crate::store::Store::reconfigure) builds a store for a new set of
//! limits that shares (by `Arc`) the table of every limit with the same name and algorithm, so
//! their counters survive a reload (a changed quota is then applied as above), with the same
//! clock and key hashing; new limits start fresh. [`Store::refund`](crate::store::Store::refund)
//! gives a charge back at the check's quota.
//!
//! **Memory.** Per key, a slot of the 8-byte fingerprint, the algorithm's state (16 bytes for
//! the token bucket), the 4-byte quota tag and a 4-byte place in the clock (32 bytes for the
//! token bucket), in a table at most 4/5 full, plus 4 bytes of clock order: 44 bytes per
//! token-bucket key in a full table (46 measured at a million keys, whose shards are not all
//! full: see `benches/memory.rs`), about 4.4 MB for a full table at the default bound. The
//! table's length grows by doubling but never past its full length (`⌈share × 5/4⌉ + 1`
//! slots); its slots are allocated in equal segments of at least 256 slots and at most 1/64 of
//! the full length each (see `slots.rs`), so a shard's first key allocates one segment (8 KB
//! per shard for the token bucket at the default bound, 1.6 % of a full shard at most), and
//! removing a key shifts its probe run back, so churn leaves no tombstones. Slots of states of
//! three integers (sliding window) take 40 bytes, and a sliding log's 64 (56 before its state
//! went behind a one-byte lock of its own, see `slot.rs`). A sliding log keeps its entries on the heap, outside the table: at most 16 bytes
//! × `count` per key (`count` is at most [`SlidingLog::MAX_COUNT`](crate::algorithm::SlidingLog::MAX_COUNT)),
//! counted by [`MemoryStore::memory_usage`].
//!
//! **Time.** The clock is a type parameter (default [`DefaultClock`](crate::clock::DefaultClock),
//! the CPU's counter via quanta), read once per check outside any lock. Reading the time is a
//! large share of a check, so the default is the cheapest clock exact to the microsecond that
//! needs no thread: [`SystemClock`](crate::clock::SystemClock) (`Instant`, a `clock_gettime`
//! call) costs about twice as much per read on the 2-core machines of `benches/memory.rs`;
//! [`CoarseClock`](crate::clock::CoarseClock) is cheaper still (one atomic load, at a resolution
//! of 1 ms, with a ticking thread). A calendar-aligned limit
//! ([`Quota::aligned`](crate::Quota::aligned), [`Quota::per_month`](crate::Quota::per_month))
//! decides on the clock's Unix time, `now_micros() + unix_offset_micros()`
//! ([`Clock::unix_offset_micros`](crate::clock::Clock::unix_offset_micros)); the others on
//! `now_micros()` alone.
//!
//! **Hot path.** A single-limit [`Store::check`](crate::store::Store::check) costs what
//! [`MemoryStore::check_one`] costs: it builds its [`Decisions`](crate::store::Decisions) (120
//! bytes, moved to the layer without a `memcpy` call) in place, and an unscoped IPv4 or integer
//! key is fingerprinted as one 128-bit value. What remains, per check: the clock read, one hash,
//! one probe of the table (usually its home slot: one cache line) and the algorithm, plus, for an
//! allowed check, one lock and the referenced bit.

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
