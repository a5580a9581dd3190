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
//!   `scripts/token_bucket.lua`). A key so written never lives longer than before, and expires
//!   only once its bucket is full. This assumes, as the state itself does, that every instance
//!   sharing the keys runs the limit at the same quota (a different quota travels as a plan,
//!   whose writes always set the TTL), and needs Redis 6.0 or later (`KEEPTTL`);
//! - **one connection per store**: a multiplexed, auto-reconnecting
//!   [`ConnectionManager`](redis::aio::ConnectionManager) for a node, the async Cluster
//!   connection for a Cluster; never a connection per request. Concurrent checks are coalesced
//!   into one script call ([`RedisBackend::batching`]): while a script call is on the wire, new
//!   checks queue, and the next call takes them all, each still decided on its own and
//!   all-or-nothing, in arrival order. Under load this roughly halves Redis's CPU per decision
//!   (measured in `benches/redis.rs`).
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
//! check, so one script serves every plan; a check without one sends what it always did. A key
//! whose plan changes keeps what it spent: before deciding, the script converts the state
//! written at the old quota to the new one by the rule of
//! [`Algorithm::rebase`](crate::algorithm::Algorithm::rebase) (each algorithm's "Plan changes"),
//! in the same integers, and stores the result, whatever the decision (the only write a
//! rejected check makes). To know the old quota, a key written at a quota other than its
//! limit's own carries a mark after its state: that quota's parameters, 24 bytes. Keys of
//! limits never checked with a plan are exactly as before.
//!
//! Every check reports the Redis `TIME` it was decided at ([`Decisions::decided_at`](crate::store::Decisions::decided_at);
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
//! What Redis does when it reaches `maxmemory` decides whether a flood of distinct keys can
//! reset a budget:
//!
//! - `noeviction` (Redis's default; recommended): nothing is evicted. Redis refuses scripts that
//!   write, so a request that would be admitted fails and is decided by the limit's
//!   [`FailurePolicy`] (`Closed`: refused with 503; `Open`: allowed and counted in
//!   [`RedisStats::fail_open`]; `Local`: the local limiter), while a request that is rejected
//!   writes nothing and is still rejected by Redis. An exhausted client never regains budget.
//! - any `allkeys-*` or `volatile-*` policy: Redis may evict limiter keys (they all carry an
//!   expiry), and an evicted key is a fresh budget. When it connects, the store reads the policy
//!   with `CONFIG GET maxmemory-policy`, logs a warning for these policies and reports it in
//!   [`RedisStats::maxmemory_policy`]. A server that refuses `CONFIG` leaves it `None`.
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
//! use tollgate::{AlgorithmKind, PolicyName, Quota};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = [LimitSpec::new(
//!     PolicyName::new("burst"),
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

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::AlgorithmKind;
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::quota::Quota;
use crate::store::memory::MemoryBackend;
use crate::store::{Backend, FailurePolicy, LimitSpec, MAX_LIMITS};

mod breaker;
mod conn;
mod keys;
mod memory_policy;
pub(crate) mod script;
mod stats;
mod store;

pub use stats::RedisStats;
pub use store::{RedisFuture, RedisStore};

pub(crate) use keys::{encode_name, validate_prefix, KeyEncoder, MAX_NAME, MAX_PREFIX};
pub(crate) use store::lease::{LeaseRequest, LeaseScript};

use conn::Target;
use script::LuaScript;

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

/// Configuration of a Redis (or Redis Cluster) store; see the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::redis::RedisBackend;
///
/// let backend = RedisBackend::new("redis://127.0.0.1:6379")
///     .prefix("api-rl")
///     .timeout(Duration::from_millis(3))
///     .breaker_threshold(3)
///     .probe_interval(Duration::from_millis(500));
/// # let _ = backend;
/// ```
#[must_use]
pub struct RedisBackend {
    target: TargetSpec,
    prefix: String,
    hash_secret: Vec<u8>,
    readable_keys: bool,
    timeout: Duration,
    connect_timeout: Duration,
    breaker_threshold: u32,
    probe_interval: Duration,
    clock: Option<Arc<dyn Clock>>,
    batching: bool,
    max_batch: usize,
    max_in_flight: usize,
    local: Option<LocalBuilder>,
    stats: RedisStats,
}

type LocalBuilder =
    Box<dyn FnOnce(&[LimitSpec]) -> Result<Box<dyn store::LocalStore>, ConfigError> + Send>;

#[derive(Debug, Clone)]
enum TargetSpec {
    Node(String),
    Cluster(Vec<String>),
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("target", &self.target)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("breaker_threshold", &self.breaker_threshold)
            .field("probe_interval", &self.probe_interval)
            .field("clock", &self.clock)
            .field("batching", &self.batching)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A single Redis node at `url` (`redis://[user:password@]host:port[/db]`). The URL is
    /// checked when the layer is built. Building inside a tokio runtime starts connecting and
    /// loads the script in the background; otherwise the first request connects.
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_target(TargetSpec::Node(url.into()))
    }

    /// A Redis Cluster reached through `nodes` (any subset of its nodes; the rest are discovered).
    pub fn cluster<I, S>(nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_target(TargetSpec::Cluster(
            nodes.into_iter().map(Into::into).collect(),
        ))
    }

    fn with_target(target: TargetSpec) -> Self {
        Self {
            target,
            prefix: "tollgate".to_owned(),
            hash_secret: Vec::new(),
            readable_keys: false,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            breaker_threshold: DEFAULT_BREAKER_THRESHOLD,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            clock: None,
            batching: true,
            max_batch: DEFAULT_MAX_BATCH,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            local: None,
            stats: RedisStats::default(),
        }
    }

    /// The namespace every key starts with (default `tollgate`): 1 to 64 characters of letters,
    /// digits, `.`, `_`, `:` or `-`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// A secret shared by every instance: the key of the HMAC that names each client's Redis
    /// keys and picks its hash slot (see [Keys](self#keys)). Set it in production. Without one the
    /// HMAC is keyed with the empty string: client keys still never appear in clear, but anyone
    /// who can read Redis can hash guesses (which reverses IP addresses and small ids by brute
    /// force) and search offline for keys that land in a chosen slot. Every instance must use the
    /// same secret; changing it moves every client to fresh keys (a fresh budget, once).
    pub fn hash_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.hash_secret = secret.as_ref().to_vec();
        self
    }

    /// Whether IP-address keys are written readably in Redis key names (default `false`: every
    /// client key is an HMAC). An opt-in for operators who inspect Redis by IP and may store
    /// client addresses; other keys (API keys, tokens, user ids: [`Key::bytes`] and
    /// [`Key::int`]) are never readable, as nothing tells a secret from a name.
    ///
    /// [`Key::bytes`]: crate::key::Key::bytes
    /// [`Key::int`]: crate::key::Key::int
    pub fn readable_keys(mut self, readable: bool) -> Self {
        self.readable_keys = readable;
        self
    }

    /// How long one Redis call may take before the failure policy decides (default 5 ms).
    ///
    /// Until Redis has answered once (at start-up, while the connection and the script are set
    /// up), a call may take up to [`connect_timeout`](Self::connect_timeout) instead, so the
    /// first requests are not refused for the cost of connecting.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long establishing a connection may take (default 500 ms): it bounds the background
    /// reconnects, the calls made before Redis has answered for the first time, and, while a
    /// Cluster master's breaker is open, the probe's slot-map read and its check that the
    /// Cluster connection answers (see [When Redis cannot decide](self#when-redis-cannot-decide)).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Consecutive failed calls that open the circuit breaker (default 5).
    pub fn breaker_threshold(mut self, failures: u32) -> Self {
        self.breaker_threshold = failures;
        self
    }

    /// How often Redis is probed while the circuit breaker is open (default 200 ms).
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// Decides at `clock`'s time instead of the Redis server's `TIME`. For tests and
    /// simulations: in production, application clocks that disagree would let instances mint
    /// tokens, which server time prevents. Like `TIME`, the time sent is Unix time:
    /// `clock.now_micros() + clock.unix_offset_micros()` (a [`ManualClock`](crate::clock::ManualClock)'s
    /// offset is 0 unless set), so calendar-aligned windows fall where the memory store puts them.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Whether concurrent checks are coalesced into one script call (default on): on a single
    /// node, into calls to it; on a Cluster, into calls to each master, whatever the hash slots
    /// of the keys it serves (see [the module docs](self)). Each request is still decided
    /// all-or-nothing, in arrival order, exactly as if sent alone; batching only saves round
    /// trips and per-call overhead. [`max_batch`](Self::max_batch) and
    /// [`max_in_flight`](Self::max_in_flight) apply to each batcher (each master's, on a
    /// Cluster).
    pub fn batching(mut self, enabled: bool) -> Self {
        self.batching = enabled;
        self
    }

    /// The most requests coalesced into one script call (default 64). A batch runs as one
    /// script, so this also bounds how long one call keeps Redis busy (about 4 µs per decision).
    pub fn max_batch(mut self, max: usize) -> Self {
        self.max_batch = max;
        self
    }

    /// How many batched script calls may be on the wire at once (default 4). Requests arriving
    /// while that many are in flight wait and form the next batch.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max;
        self
    }

    /// The in-memory backend used for limits whose failure policy is
    /// [`FailurePolicy::Local`] (default: [`MemoryBackend::new`]): set its key bound, or a clock
    /// for tests.
    pub fn local_fallback<C: Clock>(mut self, backend: MemoryBackend<C>) -> Self {
        self.local = Some(Box::new(move |specs| {
            Ok(Box::new(backend.build(specs)?) as Box<dyn store::LocalStore>)
        }));
        self
    }

    /// A handle to the counters of the store this backend will build.
    pub fn stats(&self) -> RedisStats {
        self.stats.clone()
    }
}

impl Backend for RedisBackend {
    type Store = RedisStore;

    fn build(self, limits: &[LimitSpec]) -> Result<RedisStore, ConfigError> {
        let (target, cluster) =
            match &self.target {
                TargetSpec::Node(url) => (
                    Target::Node(redis::Client::open(url.as_str()).map_err(|e| {
                        ConfigError::new(
                            "redis.url",
                            format!("{url:?} is not a Redis URL ({e}); use redis://host:port"),
                        )
                    })?),
                    false,
                ),
                TargetSpec::Cluster(nodes) => {
                    if nodes.is_empty() {
                        return Err(ConfigError::new(
                            "redis.cluster",
                            "no cluster nodes given; pass at least one redis://host:port",
                        ));
                    }
                    let client =
                        redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
                            .retries(2)
                            .build()
                            .map_err(|e| {
                                ConfigError::new(
                            "redis.cluster",
                            format!("invalid cluster nodes {nodes:?} ({e}); use redis://host:port"),
                        )
                            })?;
                    // A probe connects to one node directly, with the first seed's settings
                    // (credentials, TLS); the builder above has checked every seed.
                    let seed = redis::IntoConnectionInfo::into_connection_info(nodes[0].as_str())
                        .map_err(|e| {
                        ConfigError::new(
                            "redis.cluster",
                            format!(
                                "invalid cluster node {:?} ({e}); use redis://host:port",
                                nodes[0]
                            ),
                        )
                    })?;
                    (Target::Cluster(Box::new(client), Box::new(seed)), true)
                }
            };
        let keys = keys::KeyEncoder::new(&self.prefix, &self.hash_secret, self.readable_keys)?;
        self.validate()?;
        let compiled = compile_limits(limits)?;
        let (local, local_builder) = if compiled.any_local {
            (Some(build_local(self.local, &compiled.local_specs)?), None)
        } else {
            (None, self.local)
        };
        let script = Arc::new(LuaScript::assemble(
            &compiled
                .infos
                .iter()
                .map(|info| (info.algorithm, info.params))
                .collect::<Vec<_>>(),
        ));
        Ok(RedisStore::from_inner(store::Inner {
            limits: compiled.infos,
            policies: compiled.policies,
            keys,
            script,
            target,
            cluster,
            connect_timeout: self.connect_timeout,
            timeout: self.timeout,
            breaker_threshold: self.breaker_threshold,
            probe_interval: self.probe_interval,
            clock: self.clock,
            batching: self
                .batching
                .then_some((self.max_batch, self.max_in_flight)),
            local,
            local_builder: Arc::new(std::sync::Mutex::new(local_builder)),
            stats: self.stats,
            links: Default::default(),
            breakers: Default::default(),
            slots: Arc::new(conn::SlotCache::new(
                self.probe_interval,
                self.connect_timeout,
            )),
            connected: Default::default(),
        }))
    }
}

/// A store's limits, checked and compiled for the script.
pub(crate) struct CompiledLimits {
    pub(crate) infos: Vec<script::LimitInfo>,
    pub(crate) policies: Vec<FailurePolicy>,
    /// The local fallback's limits (each limit's share of its quota, when `Local`).
    pub(crate) local_specs: Vec<LimitSpec>,
    pub(crate) any_local: bool,
}

/// Checks `limits` (count, unique names, failure policies, Redis bounds) and compiles them.
pub(crate) fn compile_limits(limits: &[LimitSpec]) -> Result<CompiledLimits, ConfigError> {
    if limits.is_empty() || limits.len() > MAX_LIMITS {
        return Err(ConfigError::new(
            "limits",
            format!("configure 1 to {MAX_LIMITS} limits per layer; stack layers for more"),
        ));
    }
    let mut infos = Vec::with_capacity(limits.len());
    let mut policies = Vec::with_capacity(limits.len());
    let mut local_specs = Vec::with_capacity(limits.len());
    let mut any_local = false;
    for (i, spec) in limits.iter().enumerate() {
        spec.validate()?;
        let name = spec.name();
        if limits[..i].iter().any(|s| s.name() == name) {
            return Err(ConfigError::new(
                "limit.name",
                format!(
                    "two limits are named {:?}; names must be unique because they name the Redis keys",
                    name.as_str()
                ),
            ));
        }
        let policy = spec.failure_policy().ok_or_else(|| {
            ConfigError::new(
                "failure_policy",
                format!(
                    "limit {:?} has no failure policy; a Redis-backed limit must say what happens when Redis is unreachable: set FailurePolicy::Open, FailurePolicy::Closed {{ retry_after }} or FailurePolicy::Local {{ share }} with Limit::on_store_error",
                    name.as_str()
                ),
            )
        })?;
        let local_spec = match policy {
            FailurePolicy::Local { share } => {
                any_local = true;
                LimitSpec::new(name, local_quota(spec, share)?, spec.algorithm())
            }
            _ => LimitSpec::new(name, *spec.quota(), spec.algorithm()),
        };
        local_specs.push(local_spec);
        let info = script::limit_info(spec, keys::encode_name(name.as_str())?)?;
        if spec.algorithm() == AlgorithmKind::SlidingLog && info.limit > MAX_SLIDING_LOG {
            return Err(ConfigError::new(
                "quota.count",
                format!(
                    "limit {:?}: a sliding log on Redis keeps one entry per admission, so its count must be at most {MAX_SLIDING_LOG} (got {}); use AlgorithmKind::SlidingWindow for larger limits",
                    name.as_str(),
                    info.limit
                ),
            ));
        }
        infos.push(info);
        policies.push(policy);
    }
    Ok(CompiledLimits {
        infos,
        policies,
        local_specs,
        any_local,
    })
}

/// The local fallback store for `specs`: `builder`'s ([`RedisBackend::local_fallback`]), or a
/// default [`MemoryBackend`]'s.
pub(crate) fn build_local(
    builder: Option<LocalBuilder>,
    specs: &[LimitSpec],
) -> Result<Box<dyn store::LocalStore>, ConfigError> {
    match builder {
        Some(build) => build(specs),
        None => Ok(Box::new(MemoryBackend::new().build(specs)?)),
    }
}

impl RedisBackend {
    /// Checks every knob: a value that would switch limiting off, hang, or overflow is a
    /// [`ConfigError`] naming the field and what to use instead.
    fn validate(&self) -> Result<(), ConfigError> {
        let duration = |field: &'static str, d: Duration, example: &str| {
            if d.is_zero() || d > MAX_TIMEOUT {
                Err(ConfigError::new(
                    field,
                    format!(
                        "{d:?} is out of range: use a positive duration of at most {MAX_TIMEOUT:?}, e.g. {example}"
                    ),
                ))
            } else {
                Ok(())
            }
        };
        duration(
            "redis.timeout",
            self.timeout,
            "Duration::from_millis(5) (the default)",
        )?;
        duration(
            "redis.connect_timeout",
            self.connect_timeout,
            "Duration::from_millis(500) (the default)",
        )?;
        duration(
            "redis.probe_interval",
            self.probe_interval,
            "Duration::from_millis(200) (the default)",
        )?;
        if self.breaker_threshold == 0 || self.breaker_threshold > MAX_BREAKER_THRESHOLD {
            return Err(ConfigError::new(
                "redis.breaker_threshold",
                format!(
                    "{} is out of range: the breaker opens after 1 to {MAX_BREAKER_THRESHOLD} consecutive failures; the default is {DEFAULT_BREAKER_THRESHOLD}",
                    self.breaker_threshold
                ),
            ));
        }
        if self.max_batch == 0 || self.max_batch > MAX_BATCH {
            return Err(ConfigError::new(
                "redis.max_batch",
                format!(
                    "{} is out of range: a batch holds 1 to {MAX_BATCH} requests; the default is {DEFAULT_MAX_BATCH} (use .batching(false) to send each request alone)",
                    self.max_batch
                ),
            ));
        }
        if self.max_in_flight == 0 || self.max_in_flight > MAX_IN_FLIGHT {
            return Err(ConfigError::new(
                "redis.max_in_flight",
                format!(
                    "{} is out of range: 1 to {MAX_IN_FLIGHT} batches may be on the wire at once (0 would send nothing); the default is {DEFAULT_MAX_IN_FLIGHT}",
                    self.max_in_flight
                ),
            ));
        }
        Ok(())
    }
}

/// The quota a local fallback limiter holds: `share` of the count (and of an explicit burst),
/// rounded down, at least 1.
fn local_quota(spec: &LimitSpec, share: f64) -> Result<Quota, ConfigError> {
    if !(share > 0.0 && share <= 1.0) {
        return Err(ConfigError::new(
            "failure_policy.share",
            format!(
                "limit {:?}: the local share must be in (0, 1], e.g. 0.25 for one of four instances; got {share}",
                spec.name().as_str()
            ),
        ));
    }
    let local = local_share(spec.quota(), share);
    spec.algorithm().validate(&local)?;
    Ok(local)
}

/// `share` (in (0, 1]) of `q`: its count and explicit burst, rounded down, at least 1.
pub(crate) fn local_share(q: &Quota, share: f64) -> Quota {
    let scale = |n: u64| ((n as f64 * share).floor() as u64).max(1);
    let mut local = Quota::per(q.period(), scale(q.count())).with_calendar(q.calendar());
    if q.has_explicit_burst() {
        local = local.burst(scale(q.burst_size()));
    }
    local
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::AlgorithmKind;
    use crate::PolicyName;

    fn spec(name: &str) -> LimitSpec {
        LimitSpec::new(
            PolicyName::new(name),
            Quota::per_second(10).burst(20),
            AlgorithmKind::TokenBucket,
        )
    }

    #[test]
    fn a_missing_failure_policy_is_a_config_error_that_says_how_to_fix_it() {
        let err = RedisBackend::new("redis://127.0.0.1:1")
            .build(&[spec("burst")])
            .unwrap_err();
        assert_eq!(err.field(), "failure_policy");
        assert!(err.message().contains("FailurePolicy::Closed"), "{err}");
        assert!(err.message().contains("\"burst\""), "{err}");
    }

    #[test]
    fn bad_settings_are_config_errors() {
        let ok = [spec("a").on_store_error(FailurePolicy::Open)];
        let cases = [
            (RedisBackend::new("http://nope"), "redis.url"),
            (RedisBackend::cluster(Vec::<String>::new()), "redis.cluster"),
            (
                RedisBackend::new("redis://h").prefix("a{b}"),
                "redis.prefix",
            ),
            (
                RedisBackend::new("redis://h").timeout(Duration::ZERO),
                "redis.timeout",
            ),
            (
                RedisBackend::new("redis://h").breaker_threshold(0),
                "redis.breaker_threshold",
            ),
            (
                RedisBackend::new("redis://h").max_batch(0),
                "redis.max_batch",
            ),
        ];
        for (backend, field) in cases {
            assert_eq!(backend.build(&ok).unwrap_err().field(), field);
        }
    }

    #[test]
    fn every_knob_that_could_switch_limiting_off_or_overflow_is_refused() {
        let ok = [spec("a").on_store_error(FailurePolicy::Open)];
        let node = || RedisBackend::new("redis://h");
        let cases = [
            (node().max_in_flight(0), "redis.max_in_flight"),
            (
                node().max_in_flight(MAX_IN_FLIGHT + 1),
                "redis.max_in_flight",
            ),
            (node().max_batch(MAX_BATCH + 1), "redis.max_batch"),
            (node().timeout(Duration::MAX), "redis.timeout"),
            (
                node().connect_timeout(Duration::MAX),
                "redis.connect_timeout",
            ),
            (
                node().connect_timeout(Duration::ZERO),
                "redis.connect_timeout",
            ),
            (node().probe_interval(Duration::MAX), "redis.probe_interval"),
            (
                node().probe_interval(Duration::ZERO),
                "redis.probe_interval",
            ),
            (
                node().breaker_threshold(u32::MAX),
                "redis.breaker_threshold",
            ),
        ];
        for (backend, field) in cases {
            let err = backend.build(&ok).unwrap_err();
            assert_eq!(err.field(), field, "{err}");
            assert!(
                err.message().contains("default"),
                "the message says what to use instead: {err}"
            );
        }
        // The bounds themselves are accepted.
        node()
            .max_in_flight(MAX_IN_FLIGHT)
            .max_batch(MAX_BATCH)
            .timeout(MAX_TIMEOUT)
            .connect_timeout(MAX_TIMEOUT)
            .probe_interval(MAX_TIMEOUT)
            .breaker_threshold(MAX_BREAKER_THRESHOLD)
            .build(&ok)
            .unwrap();
    }

    #[test]
    fn a_sliding_log_above_the_redis_bound_is_refused() {
        let log = |n: u64| {
            [LimitSpec::new(
                PolicyName::new("log"),
                Quota::per_hour(n),
                AlgorithmKind::SlidingLog,
            )
            .on_store_error(FailurePolicy::Open)]
        };
        RedisBackend::new("redis://h")
            .build(&log(MAX_SLIDING_LOG))
            .unwrap();
        let err = RedisBackend::new("redis://h")
            .build(&log(MAX_SLIDING_LOG + 1))
            .unwrap_err();
        assert_eq!(err.field(), "quota.count");
        assert!(err.message().contains("SlidingWindow"), "{err}");
    }

    #[test]
    fn duplicate_names_and_bad_shares_are_config_errors() {
        let dup = [
            spec("a").on_store_error(FailurePolicy::Open),
            spec("a").on_store_error(FailurePolicy::Open),
        ];
        assert_eq!(
            RedisBackend::new("redis://h")
                .build(&dup)
                .unwrap_err()
                .field(),
            "limit.name"
        );
        let bad_share = [spec("a").on_store_error(FailurePolicy::Local { share: 1.5 })];
        assert_eq!(
            RedisBackend::new("redis://h")
                .build(&bad_share)
                .unwrap_err()
                .field(),
            "failure_policy.share"
        );
    }

    #[test]
    fn local_share_scales_count_and_burst() {
        let q = local_quota(&spec("a"), 0.25).unwrap();
        assert_eq!((q.count(), q.burst_size()), (2, 5));
        let q = local_quota(&spec("a"), 0.01).unwrap();
        assert_eq!((q.count(), q.burst_size()), (1, 1), "never below one");
        let window = LimitSpec::new(
            PolicyName::new("w"),
            Quota::per_minute(100),
            AlgorithmKind::TokenBucket,
        );
        let q = local_quota(&window, 0.5).unwrap();
        assert!(!q.has_explicit_burst());
        assert_eq!(q.count(), 50);
    }

    #[test]
    fn building_does_not_connect() {
        // Nothing listens on port 1; building still succeeds (connections are lazy).
        let store = RedisBackend::new("redis://127.0.0.1:1")
            .build(&[spec("a").on_store_error(FailurePolicy::Open)])
            .unwrap();
        assert!(store
            .redis_key(0, &crate::key::Key::string("k"))
            .unwrap()
            .starts_with("tollgate:{"));
        assert!(store.redis_key(1, &crate::key::Key::string("k")).is_none());
    }
}
