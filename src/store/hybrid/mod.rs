//! A local tier in front of Redis (feature `redis`): most decisions never leave the process,
//! the shared limit still holds, and the bound on what the tier changes is stated.
//!
//! Every check of a [`RedisStore`](crate::store::redis::RedisStore) costs a round trip and a
//! script run, so one Redis caps the fleet at its script rate. A [`HybridStore`] keeps, per
//! instance and key, a **lease**: a slice of the key's budget taken from Redis in one script
//! call and spent there at once (the units are charged in Redis when leased). Requests are
//! decided locally from the lease until it is spent or expires; then the next call gives back
//! what is left and leases again. The store composes a Redis store (node or Cluster, with its
//! connections, timeout, circuit breakers and failure policies) and forks nothing: the lease
//! script is the Redis store's own script with a lease driver (`scripts/lease.lua`) in place of
//! its check driver, so a lease runs exactly the algorithm functions a check runs, on the same
//! keys, and plain checks and leases of one key can mix.
//!
//! # The bound, in one sentence
//!
//! **Across any number of instances, a key never admits more than one shared limiter would have
//! admitted from its first request (every unit is charged in Redis before it is used), and for
//! the buckets at most `rate × lease lifetime` more within any one window; it admits less by at
//! most what the other instances hold — at most `max_lease × capacity` units each, for at most
//! one lease lifetime (≤ 1 s) — and a key refused by Redis is refused locally for at most one
//! lease lifetime after enough for a lease refilled.**
//!
//! In detail:
//!
//! - **Over-admission: none, counted from a key's first request.** A lease is a check of cost
//!   `n` at one instant (`decide(now, 0)` says how many fit, `apply` charges them), so the fleet
//!   spends only what Redis granted. A bucket's unit may be spent up to one lease lifetime after
//!   it was charged, so over a window that starts after the key's first request the buckets may
//!   admit up to `rate × lifetime` (≤ `max_lease × capacity`) more than a limiter charging at
//!   the moment of use. The windows (fixed, sliding counter) lease only within the window that
//!   holds the lease (a lease ends with its window), which admits nothing a plain check would
//!   not: a sliding counter's estimate only falls within a window.
//! - **Under-admission: at most what is held elsewhere.** Each other instance holds at most
//!   `max_lease × capacity` units of a key, and only as many as its own demand of one lifetime
//!   (a lease is sized by the key's observed rate); held units come back with that instance's
//!   next call for the key (by the algorithm's refund, which never leaves a key fuller than a
//!   key that never saw the lease, so what refilled meanwhile is not returned twice).
//! - **Refusals are remembered.** A key Redis refused is refused locally until the retry-after
//!   Redis gave (for the buckets: until half the lease the key wants fits, at most what refills
//!   in one lifetime), so a client hammering a spent key costs each instance at most one Redis
//!   call per retry interval, and a key freed elsewhere is noticed at most one lifetime late. A
//!   lease that left a bucket with less than one request's cost is treated the same way once
//!   spent, without asking.
//! - **Lease lifetime**: the time the quota takes to refill the largest lease, at most
//!   [`MAX_LEASE_TTL_MICROS`] (1 s) and at least 1 ms.
//!
//! # Which algorithms lease
//!
//! Token bucket, leaky bucket (the meter) and GCRA lease naturally. The fixed window and the
//! sliding window counter lease within the current window (not calendar-aligned windows, which
//! are checked plainly). The **sliding log never leases**: its entries are stamped when charged,
//! so entries written at lease time would leave the log before the units are used, admitting
//! more than the limit; every sliding-log check goes to Redis. Checks at a plan's quota
//! ([`LimitCheck::with_quota`](crate::store::LimitCheck::with_quota)), checks of cost 0, keys
//! Redis holds at a plan's quota and keys beyond [`HybridBackend::max_keys`] are checked plainly
//! too.
//!
//! # Several limits, one answer
//!
//! A request's limits are all-or-nothing: each takes its cost from its own lease, and if any
//! cannot (refused, or no lease yet), the units already taken go back into the leases they came
//! from before anything else happens. A refused request spends nothing, locally or in Redis.
//!
//! # When Redis cannot decide
//!
//! Lease calls go through the Redis store's circuit breaker (one per node) and count as its
//! calls do. A request waits for a lease at most the Redis store's timeout; the call itself may
//! take up to 250 ms and its units land in the local tier when it answers, so a slow round trip
//! loses nothing. While Redis cannot answer, units already leased keep being spent (they are
//! charged in Redis already), then each limit's [`FailurePolicy`](crate::store::FailurePolicy)
//! decides as it does for the Redis store: `Open`, `Closed` (503), or `Local { share }` (the
//! Redis store's local limiter with `share` of the quota). What `Local` admits for a leasing
//! limit is **owed**: the instance charges it with its next lease of the key, as far as it fits,
//! on top of what the key had spent (below).
//!
//! # When Redis loses a key
//!
//! `FLUSHALL`, a restart without persistence, an eviction or a failover to a replica that never
//! saw the key leave it missing: a plain store would find a full budget. Each instance remembers,
//! per key, what Redis said at its last reply (lease or refusal): the capacity less the
//! remaining, at that Redis time; every lease call sends it.
//!
//! - A lease that finds the key missing (or unreadable) rebuilds it as charged that much at that
//!   time, then the algorithm refills it to now, and writes a small **birth record** next to it
//!   (same hash tag: the time, and what the key was rebuilt with), alive for the key's TTL. The
//!   fixed window charges that knowledge only within the window it was spent in (the next
//!   window starts from nothing anyway); the sliding window counter through the end of the next
//!   window, where its estimate weighs it as it weighs any previous window's count. What an
//!   instance knows of a sliding window is its estimate (the previous window's weighted share
//!   included), which the rebuild counts as spent in the window it was known in: over the next
//!   window the rebuilt key may so admit less than the lost one would have, never more.
//! - An instance whose last reply predates the birth record knew the key before it was lost:
//!   if it knew more than what the key was rebuilt with (both refilled to now), the key is
//!   rebuilt again from its knowledge, at its time (refilled and weighed as above), plus what
//!   was spent since. Such an instance, and the one that rebuilt the key from its own
//!   knowledge, lease only the request's cost that once (other instances may know more).
//! - So once every instance that knew the key has called once, the key holds the most any of
//!   them knew, refilled, plus everything granted since: the instance that heard from Redis
//!   last knew every unit leased before its reply. **Beyond what the key would have admitted
//!   without the loss, it admits at most one request per instance that knew it, and what
//!   instances that knew nothing of it lease from it before the best-informed one calls** (a
//!   cold instance leases its cost). Tests (`tests/promises/
//!   hybrid_data_loss.rs`): 4 instances on a key exhausted at 10/s, burst 100: 13 admitted in
//!   the 1.5 s after a `FLUSHALL` or a kill and empty restart (15 refill in that time); 14 when
//!   an instance that never saw the key reaches it first; a key 60/100 spent admits 40 more; a
//!   sliding window counter (100 per minute) exhausted at 59.9 s of its window and flushed
//!   admits 1 at 60.1 s and 49 more at 90 s, as it does without the loss, also when an
//!   instance that never saw the key reaches it first.
//! - A key only expires once it is full again, which the instances' knowledge then says too: a
//!   key that expired is charged nothing.
//! - Cost: each lease call runs one `EXISTS`, and one `GET` of the birth record when the
//!   instance knows something of the key; each key a lease creates has a birth record for its
//!   TTL (24 bytes of value). Keys checked plainly (the sliding log, a plan's quota, keys beyond
//!   [`HybridBackend::max_keys`]) are not covered, and a key that a plain check re-creates after
//!   a loss gets no birth record: the instances' knowledge of it is not charged.
//!
//! # Headers
//!
//! A locally admitted request reports `remaining` as Redis's remaining right after the lease
//! plus what this instance still holds, and `reset` as Redis reported it at the lease, counting
//! down: both as stale as the lease (at most one lifetime), not counting what other instances
//! spent since. A locally refused request reports the retry-after this instance will wait for,
//! which is what it will honour. [`Decisions::decided_at`](crate::Decisions::decided_at)
//! is the Redis time of the lease, so [`Store::refund`](crate::store::Store::refund) gives units
//! back to the lease they came from (or, once it is gone, to Redis by the refund rule).
//!
//! # The knob
//!
//! [`HybridBackend::max_lease`] (default [`DEFAULT_MAX_LEASE`], a quarter of the capacity): the
//! largest share of a key's capacity one instance may hold. It sets every bound above: larger
//! means fewer Redis calls for hot keys and more budget held per instance; smaller means more
//! calls and tighter bounds. `max_lease(1.0)` lets a lone instance hold a whole budget.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate::key::PeerIp;
//! use tollgate::store::hybrid::HybridBackend;
//! use tollgate::store::redis::RedisBackend;
//! use tollgate::store::FailurePolicy;
//! use tollgate::{Limit, Quota, RateLimitLayer};
//!
//! # fn demo() -> Result<(), tollgate::ConfigError> {
//! let backend = HybridBackend::new(RedisBackend::new("redis://127.0.0.1:6379"));
//! let stats = backend.stats();
//! let layer = RateLimitLayer::builder()
//!     .limit(
//!         Limit::new("per-ip", Quota::per_second(10).burst(100))
//!             .key(PeerIp::new())
//!             .on_store_error(FailurePolicy::Local { share: 0.25 }),
//!     )
//!     .backend(backend)
//!     .build()?;
//! # let _ = (layer, stats);
//! # Ok(())
//! # }
//! ```
//!
//! Through the [`Store`](crate::store::Store) interface (a Cluster here):
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate::key::Key;
//! use tollgate::store::hybrid::HybridBackend;
//! use tollgate::store::redis::RedisBackend;
//! use tollgate::store::{Backend, Checked, FailurePolicy, LimitCheck, LimitSpec, Store};
//! use tollgate::{AlgorithmKind, Name, Quota};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = [LimitSpec::new(Name::new("api"), Quota::per_minute(6_000), AlgorithmKind::Gcra)
//!     .on_store_error(FailurePolicy::Closed { retry_after: Duration::from_secs(1) })];
//! let store = HybridBackend::new(RedisBackend::cluster(["redis://127.0.0.1:7000"]))
//!     .max_lease(0.1)
//!     .build(&limits)?;
//! let check = [LimitCheck::new(0, Key::string("tenant-7"), 1)];
//! let decisions = match store.check(&check) {
//!     Checked::Ready(r) => r?,      // decided from the local lease
//!     Checked::Pending(f) => f.await?, // leased (or checked) in Redis
//! };
//! assert!(decisions.allowed());
//! # Ok(())
//! # }
//! ```

mod backend;
mod lease_plan;
mod stats;
mod store;
mod table;

pub use backend::{HybridBackend, DEFAULT_MAX_KEYS, DEFAULT_MAX_LEASE, MAX_KEYS};
pub use lease_plan::MAX_LEASE_TTL_MICROS;
pub use stats::HybridStats;
pub use store::{HybridFuture, HybridStore};
