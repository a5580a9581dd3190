//! [`RedisSlots`]: concurrency slots shared by every instance through Redis, held as leases
//! that expire, so an instance that dies holding slots cannot leak them.
//!
//! Each key's slots are one sorted set whose members are the lease ids of the requests in
//! flight, scored by the Redis `TIME` (µs) at which each lease expires. Taking a slot is one Lua
//! script: drop the expired leases, count the rest, add ours if there is room. Giving it back is
//! a `ZREM`. While a request is in flight its instance renews the lease every third of its
//! length (one background task per layer and tokio runtime, not per request), so only the leases
//! of an instance that stopped renewing (crashed, partitioned, frozen) expire.
//!
//! The set's name is built as the rate store builds its keys (`store/redis/keys.rs`): the client
//! key appears only as a keyed hash (HMAC-SHA-256 with [`RedisSlots::hash_secret`]), so API keys
//! and tokens never reach Redis in clear, and a name is at most 282 bytes whatever the client sent
//! (a client's: the prefix and the limit name plus 58 bytes):
//!
//! ```text
//! {prefix}:{TAG}:cc:{limit}:h.{32 hex digits}
//! tollgate:{4be1c3a0d2f59e17}:cc:uploads:h.9f2c41d07a5be3e8c06d2b7f14a9e051
//! ```
//!
//! Connections follow the runtime: a layer used from several tokio runtimes (one after the other,
//! or at once) gets a connection and a background task in each, so a runtime that shuts down
//! takes only its own with it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::runtime::Id as RuntimeId;
use tokio::sync::mpsc;

use super::body::Slot;
use super::future::Leasing;
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::key::Key;
use crate::store::redis::{encode_name, validate_prefix, KeyEncoder, MAX_NAME, MAX_PREFIX};

/// Takes a slot. KEYS[1]: the key's lease set; ARGV: max in flight, lease µs, lease id.
/// Returns `{1, in_flight}` with the slot taken, `{0, in_flight}` when all are taken.
const ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[1]) then
  return {0, n}
end
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(lease / 1000) + 1)
return {1, n + 1}
";

/// Renews a lease that is still held. KEYS[1]: the lease set; ARGV: lease µs, lease id.
/// Returns 1 when renewed, 0 when the lease had already expired (and was dropped).
const RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease = tonumber(ARGV[1])
local exp = redis.call('ZSCORE', KEYS[1], ARGV[2])
if not exp or tonumber(exp) <= now then
  redis.call('ZREM', KEYS[1], ARGV[2])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(lease / 1000) + 1)
return 1
";

/// Shortest lease accepted: renewal runs every third of it.
const MIN_LEASE: Duration = Duration::from_millis(30);
/// Longest lease accepted: how long a crashed instance's slots may stay taken.
const MAX_LEASE: Duration = Duration::from_secs(3600);
/// The algorithm code in slot key names (the rate store's are `tb`, `gcra`, ...).
const KEY_KIND: &str = "cc";
/// The most runtimes a layer keeps a connection for at once (the oldest is dropped beyond).
const MAX_RUNTIMES: usize = 8;

/// Concurrency slots in Redis, for [`ConcurrencyLimitLayerBuilder::redis`](super::ConcurrencyLimitLayerBuilder::redis).
///
/// ```
/// use std::time::Duration;
/// use tollgate::concurrency::RedisSlots;
///
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// let slots = RedisSlots::new(client)
///     .lease(Duration::from_secs(10)) // a crashed instance's slots are free 10 s later
///     .prefix("myapp")
///     .hash_secret("shared by every instance");
/// # let _ = slots;
/// # Ok::<(), redis::RedisError>(())
/// ```
///
/// One Redis node (or a proxy in front of several): every key's slots are one Redis key, taken
/// and renewed by scripts that run on the node holding it, with the node's `TIME`. Key names
/// hold the client key only as a keyed hash, `<prefix>:{<16 hex>}:cc:<limit name>:h.<32 hex>`:
/// 58 bytes plus the prefix and the limit name (77 with the defaults), whatever the client sent.
#[derive(Clone)]
pub struct RedisSlots {
    client: redis::Client,
    lease: Duration,
    prefix: String,
    hash_secret: Vec<u8>,
}

impl fmt::Debug for RedisSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSlots")
            .field("lease", &self.lease)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisSlots {
    /// Slots in the Redis `client` connects to, with 30 s leases under the prefix `tollgate`.
    /// Connects on first use, once in each tokio runtime the layer is used from.
    pub fn new(client: redis::Client) -> Self {
        Self {
            client,
            lease: Duration::from_secs(30),
            prefix: String::from("tollgate"),
            hash_secret: Vec::new(),
        }
    }

    /// How long a slot outlives the instance holding it (default 30 s). Live requests are
    /// renewed every third of it. From 30 ms to 1 hour; anything else is a
    /// [`ConfigError`] for the field `lease` when the layer is built.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The namespace the key names start with (default `tollgate`): 1 to 64 characters of
    /// letters, digits, `.`, `_`, `:` or `-` (one trailing `:` is dropped, the names add their
    /// own); anything else is a [`ConfigError`] for the field `prefix` when the layer is built.
    /// Slot keys never collide with the rate store's under the same prefix (their kind is `cc`).
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The secret client keys are hashed with (HMAC-SHA-256) in key names (default: empty).
    /// Every instance sharing the slots must use the same secret, or they count apart. Without
    /// a secret no client key is stored in clear either, but anyone reading Redis can hash
    /// guesses, which reverses low-entropy keys (IP addresses, small ids).
    #[must_use]
    pub fn hash_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.hash_secret = secret.as_ref().to_vec();
        self
    }

    pub(crate) fn build(
        self,
        name: &str,
        max_in_flight: u32,
    ) -> Result<Arc<RedisTable>, ConfigError> {
        if !(MIN_LEASE..=MAX_LEASE).contains(&self.lease) {
            return Err(ConfigError::new(
                "lease",
                format!(
                    "a concurrency lease of {:?} is out of range: use 30 ms to 1 hour (the default is 30 s; live requests are renewed every third of it, a crashed instance's slots stay taken that long)",
                    self.lease
                ),
            ));
        }
        let prefix = self.prefix.strip_suffix(':').unwrap_or(&self.prefix);
        validate_prefix(prefix).map_err(|_| {
            ConfigError::new(
                "prefix",
                format!(
                    "the concurrency key prefix {:?} must be 1 to {MAX_PREFIX} characters of letters, digits, '.', '_', ':' or '-'",
                    self.prefix
                ),
            )
        })?;
        let name = encode_name(name).map_err(|_| {
            ConfigError::new(
                "name",
                format!(
                    "the concurrency limit name {name:?} is part of its Redis key names and must be 1 to {MAX_NAME} bytes once escaped (other bytes than letters, digits and ._:/@- take 3); pick a shorter name"
                ),
            )
        })?;
        let keys = KeyEncoder::new(prefix, &self.hash_secret, false)?;
        // Lease ids only need to differ between instances: a random seed, the process and the
        // wall clock.
        let instance = {
            use std::hash::BuildHasher;
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            foldhash::fast::RandomState::default().hash_one((std::process::id(), nanos))
        };
        Ok(Arc::new(RedisTable {
            client: self.client,
            lease_us: u64::try_from(self.lease.as_micros()).unwrap_or(u64::MAX),
            lease: self.lease,
            keys,
            name,
            max_in_flight,
            instance,
            next: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
            released: Mutex::new(Vec::new()),
            links: Mutex::new(Vec::new()),
            acquire: redis::Script::new(ACQUIRE),
        }))
    }
}

/// A lease this instance holds: its Redis key, and the runtime whose task renews it.
struct Live {
    key: Vec<u8>,
    runtime: RuntimeId,
}

/// A connection and a background task, both on one tokio runtime. The task owns the receiving
/// end of `wake`: when the runtime shuts down the task is dropped, and `wake` reports closed.
struct Link {
    runtime: RuntimeId,
    conn: ConnectionManager,
    wake: mpsc::Sender<()>,
}

/// A lease to give back: its set and its id.
type Release = (Vec<u8>, String);

/// A built [`RedisSlots`]: key names, the live leases, and a connection and background task per
/// runtime.
pub(crate) struct RedisTable {
    client: redis::Client,
    lease_us: u64,
    lease: Duration,
    keys: KeyEncoder,
    /// The limit name, escaped for key names.
    name: String,
    max_in_flight: u32,
    instance: u64,
    next: AtomicU64,
    /// Lease id → lease.
    live: Mutex<HashMap<String, Live>>,
    /// Leases to give back, sent by the next background task to run (whichever runtime it is
    /// on: releases left when a runtime shut down are sent by the next one's).
    released: Mutex<Vec<Release>>,
    links: Mutex<Vec<Link>>,
    acquire: redis::Script,
}

impl fmt::Debug for RedisTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTable")
            .field("keys", &self.keys)
            .field("name", &self.name)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

fn store_error(e: &redis::RedisError) -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        format!("concurrency slots: {e}"),
    )
}

impl RedisTable {
    /// The connection of the current tokio runtime, set up (with its background task) on first
    /// use there.
    fn link(self: &Arc<Self>) -> Result<(ConnectionManager, RuntimeId), StoreError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            StoreError::new(
                StoreErrorKind::Other,
                "concurrency slots in Redis must be used inside a tokio runtime",
            )
        })?;
        let id = runtime.id();
        let mut links = self.links.lock();
        if let Some(link) = links
            .iter()
            .find(|l| l.runtime == id && !l.wake.is_closed())
        {
            return Ok((link.conn.clone(), id));
        }
        // Runtimes that shut down took their tasks and connections with them.
        links.retain(|l| !l.wake.is_closed());
        if links.len() >= MAX_RUNTIMES {
            links.remove(0);
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            .map_err(|e| store_error(&e))?;
        let (wake, woken) = mpsc::channel(1);
        runtime.spawn(background(
            Arc::downgrade(self),
            id,
            conn.clone(),
            woken,
            self.lease,
            self.lease_us,
        ));
        if !links.is_empty() {
            tracing::info!(
                runtimes = links.len() + 1,
                "concurrency slots used from another tokio runtime; connecting there"
            );
        }
        links.push(Link {
            runtime: id,
            conn: conn.clone(),
            wake,
        });
        Ok((conn, id))
    }

    /// The leases the task of `runtime` renews: its own, and those of runtimes that are gone
    /// (a response body that outlived the runtime its request ran on), which it takes over.
    fn to_renew(&self, runtime: RuntimeId) -> Vec<(String, Vec<u8>)> {
        let running: Vec<RuntimeId> = self
            .links
            .lock()
            .iter()
            .filter(|l| !l.wake.is_closed())
            .map(|l| l.runtime)
            .collect();
        let mut live = self.live.lock();
        live.iter_mut()
            .filter_map(|(id, lease)| {
                if lease.runtime != runtime && running.contains(&lease.runtime) {
                    return None;
                }
                lease.runtime = runtime;
                Some((id.clone(), lease.key.clone()))
            })
            .collect()
    }

    /// Queues a lease to give back and wakes a running background task to send it: the
    /// current runtime's, else that of the runtime holding the lease (`owner`), else any. With
    /// none running, the next runtime to use the layer sends it.
    fn release(&self, key: Vec<u8>, id: String, owner: Option<RuntimeId>) {
        self.released.lock().push((key, id));
        let current = tokio::runtime::Handle::try_current().ok().map(|h| h.id());
        let links = self.links.lock();
        let rank = |l: &Link| {
            if Some(l.runtime) == current {
                0
            } else if Some(l.runtime) == owner {
                1
            } else {
                2
            }
        };
        let mut order: Vec<&Link> = links.iter().collect();
        order.sort_by_key(|l| rank(l));
        for link in order {
            match link.wake.try_send(()) {
                // Full: that task is woken already and takes every queued release.
                Ok(()) | Err(mpsc::error::TrySendError::Full(())) => return,
                Err(mpsc::error::TrySendError::Closed(())) => {}
            }
        }
        tracing::debug!("concurrency slot queued to be given back by the next runtime to use the layer (it expires with its lease otherwise)");
    }

    /// The name of `key`'s lease set.
    fn key_name(&self, key: &Key<'_>) -> Vec<u8> {
        let mut scratch = Vec::new();
        self.keys
            .encode(KEY_KIND, &self.name, key, &mut scratch)
            .key
            .into_bytes()
    }

    /// Takes a slot of `key`.
    pub(crate) fn acquire(self: &Arc<Self>, key: &Key<'_>) -> Leasing {
        let redis_key = self.key_name(key);
        let id = format!(
            "{:016x}-{}",
            self.instance,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let table = Arc::clone(self);
        Box::pin(async move {
            let (mut conn, runtime) = table.link()?;
            // From the moment the script is sent, Redis may take the lease whatever becomes of
            // this call: dropped while it waits (the client left) or failed (a reply that timed
            // out), the lease is given back, by a ZREM sent after the script on the same
            // connection (a no-op when the script took nothing).
            let mut sent = RedisLease {
                table: Some(Arc::clone(&table)),
                key: redis_key,
                id,
            };
            let (got, in_flight): (u8, u32) = table
                .acquire
                .key(&sent.key[..])
                .arg(table.max_in_flight)
                .arg(table.lease_us)
                .arg(&sent.id)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| store_error(&e))?;
            if got == 0 {
                // Nothing taken: nothing to give back.
                sent.table = None;
                return Ok(Err(in_flight));
            }
            table.live.lock().insert(
                sent.id.clone(),
                Live {
                    key: sent.key.clone(),
                    runtime,
                },
            );
            Ok(Ok(Slot::Redis(sent)))
        })
    }
}

/// The background task of one runtime: gives leases back (at start, those left by runtimes
/// that are gone, then whenever woken) and renews the live ones, until the table is dropped (or
/// its link is, beyond [`MAX_RUNTIMES`]).
async fn background(
    table: Weak<RedisTable>,
    runtime: RuntimeId,
    mut conn: ConnectionManager,
    mut woken: mpsc::Receiver<()>,
    lease: Duration,
    lease_us: u64,
) {
    let renew = redis::Script::new(RENEW);
    let mut tick = tokio::time::interval(lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut release = true;
    loop {
        if release {
            let Some(table) = table.upgrade() else { return };
            let batch = std::mem::take(&mut *table.released.lock());
            drop(table);
            if !batch.is_empty() {
                let mut pipe = redis::pipe();
                for (key, id) in &batch {
                    pipe.cmd("ZREM").arg(&key[..]).arg(id).ignore();
                }
                let r: Result<(), _> = pipe.query_async(&mut conn).await;
                if let Err(error) = r {
                    tracing::warn!(%error, slots = batch.len(), "concurrency slots not given back; they expire with their leases");
                }
            }
        }
        tokio::select! {
            wake = woken.recv() => {
                if wake.is_none() {
                    return;
                }
                release = true;
            }
            _ = tick.tick() => {
                release = false;
                let Some(table) = table.upgrade() else { return };
                let leases = table.to_renew(runtime);
                drop(table);
                for (id, key) in leases {
                    let r: Result<i64, _> = renew.key(&key[..]).arg(lease_us).arg(&id).invoke_async(&mut conn).await;
                    match r {
                        Ok(1) => {}
                        Ok(_) => tracing::warn!(lease = %id, "concurrency lease expired before it was renewed; the slot may be reused while this request runs"),
                        Err(error) => tracing::warn!(%error, "concurrency lease not renewed"),
                    }
                }
            }
        }
    }
}

/// A slot held in Redis; dropping it gives the slot back (through a background task, so
/// dropping never blocks).
pub(crate) struct RedisLease {
    table: Option<Arc<RedisTable>>,
    key: Vec<u8>,
    id: String,
}

impl fmt::Debug for RedisLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLease").field("id", &self.id).finish()
    }
}

impl Drop for RedisLease {
    fn drop(&mut self) {
        if let Some(table) = self.table.take() {
            let owner = table.live.lock().remove(&self.id).map(|l| l.runtime);
            table.release(
                std::mem::take(&mut self.key),
                std::mem::take(&mut self.id),
                owner,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest slot key name, in bytes (282): the prefix (at most 64), `:{TAG}:cc:` (23),
    /// the escaped limit name (at most 64), `:`, and the key: `h.` and 32 hex digits for a
    /// client's key, or, for the global key (which names no client), `e.` and its escaped form,
    /// at most 128 bytes with a route scope (`MAX_ENCODED_KEY` in `store/redis/keys.rs`).
    const MAX_KEY_NAME: usize = MAX_PREFIX + 23 + MAX_NAME + 1 + 2 + 128;

    fn slots() -> RedisSlots {
        RedisSlots::new(redis::Client::open("redis://127.0.0.1:1/").unwrap())
    }

    fn name(table: &RedisTable, key: &Key<'_>) -> String {
        String::from_utf8(table.key_name(key)).unwrap()
    }

    #[test]
    fn client_keys_are_hashed_and_names_bounded() {
        let table = slots().build("concurrency", 2).unwrap();
        let secret = Key::string("sk_live_SECRET_api_key_123");
        let big = vec![b'x'; 1 << 20];
        for key in [secret.clone(), Key::bytes(&big[..]), Key::int(42)] {
            let n = name(&table, &key);
            assert!(
                !n.contains("sk_live") && !n.contains("xxxx") && !n.contains("42"),
                "{n}"
            );
            assert_eq!(n.len(), "tollgate".len() + "concurrency".len() + 58, "{n}");
            assert!(
                n.starts_with("tollgate:{") && n.contains("}:cc:concurrency:h."),
                "{n}"
            );
        }
        assert!(name(&table, &Key::global()).ends_with(":cc:concurrency:e.global"));
        // A secret changes every name; the same secret gives every instance the same names.
        let a = slots().hash_secret("one").build("concurrency", 2).unwrap();
        let b = slots().hash_secret("one").build("concurrency", 2).unwrap();
        assert_ne!(name(&a, &secret), name(&table, &secret));
        assert_eq!(name(&a, &secret), name(&b, &secret));

        // The longest prefix and name, and the longest readable key (a scoped global key).
        let long = slots()
            .prefix("p".repeat(MAX_PREFIX))
            .build(&"n".repeat(MAX_NAME), 2)
            .unwrap();
        let route = "r".repeat(200);
        for key in [Key::bytes(&big[..]), Key::global().scoped("GET", &route)] {
            assert!(name(&long, &key).len() <= MAX_KEY_NAME);
        }
        // `GET%20` + route + `%7Cglobal`: 128 bytes escaped, the most written readably.
        let scoped = Key::global().scoped("GET", &route[..113]);
        assert_eq!(name(&long, &scoped).len(), MAX_KEY_NAME);
    }

    #[test]
    fn prefix_name_and_lease_are_checked_at_build_time() {
        let field = |r: Result<Arc<RedisTable>, ConfigError>| r.unwrap_err().field();
        assert_eq!(field(slots().prefix("").build("c", 1)), "prefix");
        assert_eq!(field(slots().prefix("a{b}").build("c", 1)), "prefix");
        assert_eq!(
            field(slots().prefix("p".repeat(65)).build("c", 1)),
            "prefix"
        );
        assert_eq!(field(slots().build(&"n".repeat(65), 1)), "name");
        assert_eq!(field(slots().build(&"\u{e9}".repeat(11), 1)), "name");
        for lease in [
            Duration::ZERO,
            Duration::from_millis(29),
            MAX_LEASE + Duration::from_nanos(1),
            Duration::MAX,
        ] {
            assert_eq!(
                field(slots().lease(lease).build("c", 1)),
                "lease",
                "{lease:?}"
            );
        }
        for lease in [MIN_LEASE, MAX_LEASE] {
            slots().lease(lease).build("c", 1).unwrap();
        }
        // One trailing ':' is the names' own separator.
        let t = slots().prefix("myapp:inflight:").build("c", 1).unwrap();
        assert!(name(&t, &Key::int(1)).starts_with("myapp:inflight:{"));
    }
}
