//! Redis and Redis Cluster backend (feature `redis`): one limit shared by every instance.
//!
//! Ten instances that each keep their own counters allow ten times the limit. With a
//! [`RedisBackend`], every instance decides against the same state in Redis, atomically:
//!
//! - **one Lua script per algorithm** (in `src/store/redis/scripts/`) mirrors the Rust transition
//!   in [`algorithm`](crate::algorithm) exactly — the same integer formulas, in microseconds
//!   (Lua numbers are doubles, exact below 2^53, which [`Quota::validate`] guarantees; integer
//!   division is corrected for rounding; the leaky-bucket meter runs the token bucket's functions,
//!   as its Rust transition wraps a token bucket) — and reads, decides and writes in one atomic step. A
//!   store's script is a shared prelude, the scripts of the algorithms it uses, its limits'
//!   parameters as constants and a driver; it runs by `EVALSHA` (re-sent with `EVAL` when the
//!   server answers `NOSCRIPT`, e.g. after a restart or `SCRIPT FLUSH`). State is stored as
//!   little-endian 64-bit integers (Lua's `struct`), so no value ever passes through a decimal
//!   or float conversion;
//! - **time comes from Redis `TIME`**, so application clocks cannot mint tokens
//!   ([`RedisBackend::clock`] passes an explicit time instead, for tests and simulations);
//! - **idle keys expire**: a write sets the key's TTL to the algorithm's
//!   [`idle_timeout_micros`](crate::algorithm::Algorithm::idle_timeout_micros) rounded up to
//!   milliseconds, the time after which the state is indistinguishable from a fresh key (a
//!   bucket carrying spending above its capacity after a plan change or reload lives until all
//!   of it has refilled). A rejected request writes nothing. A token bucket's batched checks keep the key's TTL
//!   (`SET ... KEEPTTL`, about 30 % less Redis CPU per write than setting it) while it provably
//!   outlasts the refill the write leaves: the write falls within an eighth of the TTL of the
//!   key's last write and leaves less than the TTL less that eighth to refill (see
//!   `scripts/token_bucket.lua`). A key so written never lives longer than one whose every write sets the TTL, and expires
//!   only once its bucket is full. This assumes, as the state itself does, that every instance
//!   sharing the keys runs the limit at the same quota (a different quota travels as a plan,
//!   whose writes always set the TTL), and needs Redis 6.0 or later (`KEEPTTL`);
//! - **one connection per store**: a multiplexed, auto-reconnecting
//!   [`ConnectionManager`](redis::aio::ConnectionManager) for a node, the async Cluster
//!   connection for a Cluster, a multiplexed connection to the primary the Sentinels name
//!   ([`RedisBackend::sentinel`]), replaced when it fails over; never a connection per
//!   request. Concurrent checks are coalesced into one script call
//!   ([`RedisBackend::batching`]): while a script call is on the wire, new checks queue, and the
//!   next call takes them all, each still decided on its own and all-or-nothing, in arrival
//!   order (the batcher yields once before sending while another call is on the wire, so that
//!   the callers its reply just woke join the next call). Under load this roughly halves Redis's
//!   CPU per decision (measured in `benches/redis.rs`).
//! - **a Cluster batches per master**: each master has its own batcher, and a batch goes to its
//!   master in one script call whatever the hash slots of its keys. Redis refuses declared keys
//!   of several slots in one call (`CROSSSLOT`, whatever the script's flags), so a master's
//!   batch passes its keys as arguments; the script is the store's usual one, without a shebang,
//!   so it behaves exactly as on a single node (out of memory, it fails at its first write,
//!   before anything is written). Before anything is written, the script reads every key of the
//!   batch: a key whose slot that master no longer serves (resharding, failover, a slot being
//!   migrated) fails the whole call with nothing applied — Redis serves a slot or not for the
//!   whole run of a script — and its checks are sent again slot by slot (each once, routed by
//!   their keys, following `MOVED` and `ASK`) while the store reads the slot map again
//!   ([`RedisStats::split_batches`]). A check for a master not known yet (before the slot map is
//!   first read) is sent on its own. Breakers, timeouts and failure policies apply to each check
//!   as without batching; a dead master's batches do not hold up the others'.
//!
//! # Several limits per request
//!
//! A request's limits are all-or-nothing: every limit decides, and only if all allow is any
//! charged. Precisely:
//!
//! - **single node**: all limits of a request are decided in *one* script call, whatever their
//!   keys. The guarantee is exact: a rejected request charges nothing, ever.
//! - **Cluster, same hash slot**: the hash tag of a key is derived from the client key (without
//!   its route scope), so all limits of one client — burst and daily quota, per-route limits —
//!   share a slot and are decided in one script call, exactly as on a single node.
//! - **Cluster, different slots** (a per-client limit plus a global ceiling): each slot's group is
//!   decided and charged atomically on its own (*reserve*; in its master's batch, as a request
//!   of its own would be), all groups concurrently. If any
//!   group rejects (or fails closed), the groups that charged are given back by a refund script
//!   (*refund*) before the response is returned, as of the reservation's time and applied at
//!   the time of the refund (the store's clock, or the server's `TIME`); the refunded limits are
//!   then reported as they stand, as a single node would report them. Between reserve and
//!   refund (one round trip) other requests see those units as spent, so a concurrent request
//!   may be refused that a single node would have admitted: the error only ever goes that way,
//!   and no limit is ever over-admitted. If the refund cannot be delivered (Redis fails in between), the units
//!   stay spent until they refill, counted in [`RedisStats::refund_failures`]. A refund gives
//!   back only what its reservation still takes (the algorithm's
//!   [`refund`](crate::algorithm::Algorithm::refund), mirrored by the script): to the same
//!   window (fixed and sliding window) or log entry (sliding log), nothing once the window has
//!   moved on; for the buckets (token, leaky, GCRA) the cost less what refilled since the
//!   reservation, which a key without it may have lost to being full. A limit is never left
//!   fuller than it would be had the reservation never been made.
//!
//! # Plans, refunds and reloads
//!
//! A check may carry a quota of its own ([`LimitCheck::with_quota`](crate::store::LimitCheck::with_quota):
//! a plan chosen per request); it is decided at that quota, which must be for the limit's
//! algorithm (a [`StoreError`](crate::StoreError) says so otherwise). Its parameters go with the
//! check, so one script serves every plan; a check without one sends only its limit and cost. A key
//! whose plan changes keeps what it spent: before deciding, the script converts the state
//! written at the old quota to the new one by the rule of
//! [`Algorithm::rebase`](crate::algorithm::Algorithm::rebase) (each algorithm's "Plan changes"),
//! in the same integers, and stores the result, whatever the decision (the only write a
//! rejected check makes). To know the old quota, a key written at a quota other than its
//! limit's own carries a mark after its state: that quota's parameters, 24 bytes. Keys of
//! limits never checked with a plan carry no mark.
//!
//! Every check reports the Redis `TIME` it was decided at ([`Decisions::decided_at`](crate::Decisions::decided_at);
//! on a Cluster, the earliest of its masters'; none when a failure policy decided a limit), which
//! [`Store::refund`](crate::store::Store::refund) takes back to give the charge back as of then.
//! [`Store::reconfigure`](crate::store::Store::reconfigure) builds a store for new limits on the
//! same connections, breakers and statistics. Keys are named by limit name and algorithm, so
//! counters survive; keys of a limit whose quota changed are read as the store they were
//! written by wrote them, and converted as for a plan change.
//!
//! # Keys
//!
//! `{prefix}:{TAG}:{algorithm}:{limit}:h.{HMAC}`, for example
//! `tollgate:{4be1c3a0d2f59e17}:tb:burst:h.9f2c41d07a5be3e8c06d2b7f14a9e051`. The prefix defaults
//! to `tollgate` ([`RedisBackend::prefix`]). Client keys (API keys, tokens, user ids, IPs) never
//! appear in Redis key names or in the logs in clear: the last part is 128 bits of
//! HMAC-SHA-256 of the client key (with its route scope), and the tag an HMAC of the client key
//! alone, so every limit of one client shares one hash slot that the client cannot choose. The
//! HMAC is keyed with [`RedisBackend::hash_secret`]: set the same secret on every instance, and
//! nobody who reads Redis without it can reverse a key or search for keys that land in a chosen
//! slot. Without a secret the HMAC is keyed with the empty string: still no key in clear, but
//! low-entropy keys (IPv4 addresses, small ids) can be recovered by hashing every candidate.
//!
//! The global key is written readably (`e.global`), and IP keys are when the operator opts in
//! with [`RedisBackend::readable_keys`] (`e.ip:203.0.113.7`), percent-encoded so no `{`, `}`,
//! space or control byte can escape the namespace. Every key name is under 256 bytes.
//!
//! # Memory and eviction
//!
//! A limiter key is small and bounded: 8 to 24 bytes of state for every algorithm but the
//! sliding log, which keeps one 16-byte entry per admission in its window and is therefore
//! refused above [`MAX_SLIDING_LOG`] per window on Redis (at most 24 + 16 × (2 × count + 64)
//! bytes per key, counting entries that left the window and await compaction). Every key
//! expires once its state equals a fresh key's, and no later than its last write plus the idle
//! timeout (a write after Redis's clock went back adds the step).
//!
//! Which `maxmemory-policy` the limiter needs, and why: the [Redis
//! guide](crate::guide::redis#memory-eviction-and-maxmemory-policy). When it connects, the store
//! reads the policy with `CONFIG GET maxmemory-policy`, logs a warning for a policy that may
//! evict limiter keys and reports it in [`RedisStats::maxmemory_policy`] (`None` when the
//! server refuses `CONFIG`).
//!
//! # When Redis cannot decide
//!
//! Every limit must choose a [`FailurePolicy`] (building fails with
//! a [`ConfigError`] otherwise):
//!
//! - `Open`: the limit allows, uncounted ([`Decision::uncounted`](crate::Decision::uncounted):
//!   the layer writes no rate-limit headers for it); a `tracing` warning is logged and
//!   [`RedisStats::fail_open`] counts it;
//! - `Closed { retry_after }`: the check fails with a [`StoreError`](crate::StoreError) carrying
//!   `retry_after`, which the layer turns into `503` with `Retry-After` and a problem+json body;
//! - `Local { share }`: a local in-memory limiter holding `share` of the quota (count and burst,
//!   rounded down, at least 1) decides, and its numbers are what the response's rate-limit
//!   headers show.
//!
//! Each call has a tight timeout ([`RedisBackend::timeout`], default 5 ms). There is one
//! circuit breaker per node (the node of a single-node store; each master of a Cluster, found
//! with `CLUSTER SLOTS`). After [`RedisBackend::breaker_threshold`] consecutive failed calls to a
//! node its breaker opens: requests whose keys live there are decided by their policies at once,
//! without paying the timeout, while a background task probes that node every
//! [`RedisBackend::probe_interval`]; the first answer within the timeout closes the breaker.
//! Keys on the other masters of a Cluster keep being decided by Redis. Recovery needs no restart.
//!
//! On a Cluster, a master's probe reads the slot map again (its breaker closes as soon as the
//! master serves no slot: a replica took over, and its keys go to the new master) and pings
//! the master on a connection of its own, never through the Cluster connection, which would
//! reconnect to every node for a node it cannot reach and hold every call meanwhile. The
//! breaker closes when the master answers and the Cluster connection answers too (within
//! [`RedisBackend::connect_timeout`]); a Cluster connection that does not while the master does
//! is stuck, and is replaced by a new one ([`RedisStats::reconnects`]). So one dead master
//! leaves the others deciding: with about 270 concurrent clients and one of three masters
//! SIGKILLed, the healthy masters' keys are decided again within 2 s (`promises`
//! test `cluster_dead_master`).
//!
//! Every setting is checked when the store is built: a value that would switch limiting off,
//! hang or overflow (a zero or `Duration::MAX` timeout, `max_in_flight(0)`, ...) is a
//! [`ConfigError`] naming the field and the value to use instead.
//!
//! A store works from any tokio runtime: it keeps one connection (and batching task) per runtime
//! it is used from, so a store built or first used in one runtime keeps deciding in another, or
//! after the first one was dropped ([`RedisStats::reconnects`]). A batching task found stopped is
//! restarted ([`RedisStats::batcher_restarts`]); the requests it held were decided by their
//! failure policies. A call that timed out may still have been applied by
//! Redis (it was sent), so during a slowdown a few requests can be charged without being admitted.
//!
//! Unreadable state at a limiter key — a value of the wrong type (`WRONGTYPE`), garbage, numbers
//! out of range — never panics and never fails the request: the script deletes the key and treats
//! it as fresh (a full bucket), logs a warning (naming the key by its hashed name only) and counts
//! it in [`RedisStats::corrupt_resets`].
//! A key only becomes unreadable if something else writes to the limiter's namespace, and
//! resetting heals it, where refusing would leave a key without expiry broken forever.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate::key::Key;
//! use tollgate::store::redis::RedisBackend;
//! use tollgate::store::{Backend, Checked, FailurePolicy, LimitCheck, LimitSpec, Store};
//! use tollgate::{AlgorithmKind, Name, Quota};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = [LimitSpec::new(
//!     Name::new("burst"),
//!     Quota::per_second(1).burst(5),
//!     AlgorithmKind::TokenBucket,
//! )
//! .on_store_error(FailurePolicy::Closed { retry_after: Duration::from_secs(1) })];
//! let store = RedisBackend::new("redis://127.0.0.1:6379")
//!     .timeout(Duration::from_millis(10))
//!     .build(&limits)?;
//! let check = [LimitCheck::new(0, Key::string("alice"), 1)];
//! let decisions = match store.check(&check) {
//!     Checked::Ready(r) => r?,
//!     Checked::Pending(f) => f.await?,
//! };
//! assert!(decisions.allowed());
//! # Ok(())
//! # }
//! ```
//!
//! A Cluster is configured with its seed nodes:
//!
//! ```
//! use tollgate::store::redis::RedisBackend;
//!
//! let backend = RedisBackend::cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
//!     .prefix("myapp-rl")
//!     .hash_secret("shared by every instance");
//! # let _ = backend;
//! ```
//!
//! [`ConfigError`]: crate::error::ConfigError
//! [`FailurePolicy`]: crate::store::FailurePolicy
//! [`Quota::validate`]: crate::quota::Quota::validate

use std::time::Duration;

mod backend;
mod batcher;
mod breaker;
mod call;
mod cluster_nodes;
mod conn;
mod fallback;
mod keys;
mod lease;
mod memory_policy;
mod probe;
mod routing;
pub(crate) mod script;
mod sentinel;
mod sentinel_backend;
mod sentinel_subscription;
mod slots;
mod stats;
mod store;

pub use backend::RedisBackend;
pub use stats::RedisStats;
pub use store::{RedisFuture, RedisStore};

pub(crate) use keys::{encode_name, validate_prefix, KeyEncoder, MAX_NAME, MAX_PREFIX};
pub(crate) use lease::{LeaseRequest, LeaseScript};

/// The default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(5);
/// The default number of consecutive failures that opens the circuit breaker.
pub const DEFAULT_BREAKER_THRESHOLD: u32 = 5;
/// The default interval between probes while the circuit breaker is open.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(200);
/// The default largest number of requests coalesced into one script call.
pub const DEFAULT_MAX_BATCH: usize = 64;
/// The default number of batched script calls on the wire at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4;
/// The default time a connection may take to be established.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// The longest accepted [`RedisBackend::timeout`], [`RedisBackend::connect_timeout`] and
/// [`RedisBackend::probe_interval`]: a rate limiter that waits longer than this for Redis is
/// better served by its failure policy.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest accepted [`RedisBackend::max_batch`] (a batch runs as one script and keeps Redis
/// busy for about 4 µs per request).
pub const MAX_BATCH: usize = 1024;
/// The largest accepted [`RedisBackend::max_in_flight`].
pub const MAX_IN_FLIGHT: usize = 64;
/// The largest accepted [`RedisBackend::breaker_threshold`].
pub const MAX_BREAKER_THRESHOLD: u32 = 1_000_000;
/// The largest count a [sliding log](crate::algorithm::SlidingLog) may have on Redis: its key
/// holds one 16-byte entry per admission in the window, so a key is at most 16 KB and an
/// admission rewrites at most that much. Use the sliding window counter (16 bytes whatever the
/// count) for larger limits.
pub const MAX_SLIDING_LOG: u64 = crate::algorithm::SlidingLog::MAX_COUNT;
