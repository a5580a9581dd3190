//! [`RedisSlots`]: concurrency slots shared by every instance through Redis, held as leases
//! that expire, so an instance that dies holding slots cannot leak them.
//!
//! Each key's slots are one sorted set, `<prefix><limit>:<key>`, whose members are the lease
//! ids of the requests in flight, scored by the Redis `TIME` (µs) at which each lease expires.
//! Taking a slot is one Lua script: drop the expired leases, count the rest, add ours if there
//! is room. Giving it back is a `ZREM`. While a request is in flight its instance renews the
//! lease every third of its length (one background task per layer, not per request), so only
//! the leases of an instance that stopped renewing (crashed, partitioned, frozen) expire.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{mpsc, OnceCell};

use super::body::Slot;
use super::future::Leasing;
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::key::Key;

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

/// Concurrency slots in Redis, for [`ConcurrencyLimitLayerBuilder::redis`](super::ConcurrencyLimitLayerBuilder::redis).
///
/// ```
/// use std::time::Duration;
/// use tollgate::concurrency::RedisSlots;
///
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// let slots = RedisSlots::new(client)
///     .lease(Duration::from_secs(10)) // a crashed instance's slots are free 10 s later
///     .prefix("myapp:inflight:");
/// # let _ = slots;
/// # Ok::<(), redis::RedisError>(())
/// ```
///
/// One Redis node (or a proxy in front of several): every key's slots are one Redis key, taken
/// and renewed by scripts that run on the node holding it, with the node's `TIME`.
#[derive(Clone)]
pub struct RedisSlots {
    client: redis::Client,
    lease: Duration,
    prefix: String,
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
    /// Slots in the Redis `client` connects to, with 30 s leases under the prefix
    /// `tollgate:cc:`. Connects on first use.
    pub fn new(client: redis::Client) -> Self {
        Self {
            client,
            lease: Duration::from_secs(30),
            prefix: String::from("tollgate:cc:"),
        }
    }

    /// How long a slot outlives the instance holding it (default 30 s). Live requests are
    /// renewed every third of it; at least 30 ms.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The prefix of the Redis keys (default `tollgate:cc:`).
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    pub(crate) fn build(
        self,
        name: &str,
        max_in_flight: u32,
    ) -> Result<Arc<RedisTable>, ConfigError> {
        if self.lease < MIN_LEASE {
            return Err(ConfigError::new(
                "lease",
                format!(
                    "a concurrency lease of {:?} is renewed too often to be reliable; use at least 30 ms (the default is 30 s)",
                    self.lease
                ),
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
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
            conn: OnceCell::new(),
            lease_us: u64::try_from(self.lease.as_micros()).unwrap_or(u64::MAX / 4),
            lease: self.lease,
            prefix: format!("{}{name}:", self.prefix),
            max_in_flight,
            instance,
            next: AtomicU64::new(0),
            live: Arc::new(Mutex::new(HashMap::new())),
            tx,
            rx: Mutex::new(Some(rx)),
            acquire: redis::Script::new(ACQUIRE),
        }))
    }
}

/// A message to the layer's background task.
enum Cmd {
    Release { key: Vec<u8>, id: String },
}

/// The leases this instance holds: id → Redis key.
type Live = Arc<Mutex<HashMap<String, Vec<u8>>>>;

/// A built [`RedisSlots`]: the connection, the live leases and the background task's channel.
pub(crate) struct RedisTable {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    lease_us: u64,
    lease: Duration,
    prefix: String,
    max_in_flight: u32,
    instance: u64,
    next: AtomicU64,
    live: Live,
    tx: mpsc::UnboundedSender<Cmd>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<Cmd>>>,
    acquire: redis::Script,
}

impl fmt::Debug for RedisTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTable")
            .field("prefix", &self.prefix)
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
    async fn conn(&self) -> Result<ConnectionManager, StoreError> {
        self.conn
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_number_of_retries(1);
                ConnectionManager::new_with_config(self.client.clone(), config).await
            })
            .await
            .cloned()
            .map_err(|e| store_error(&e))
    }

    /// Starts the renewal task, once, on the runtime polling the first acquire.
    fn start(self: &Arc<Self>) {
        let Some(rx) = self.rx.lock().take() else {
            return;
        };
        let weak = Arc::downgrade(self);
        let live = Arc::clone(&self.live);
        let lease = self.lease;
        let lease_us = self.lease_us;
        tokio::spawn(background(weak, live, rx, lease, lease_us));
    }

    /// Takes a slot of `key`.
    pub(crate) fn acquire(self: &Arc<Self>, key: &Key<'_>) -> Leasing {
        let mut redis_key = self.prefix.clone().into_bytes();
        key.write_canonical(&mut redis_key);
        let id = format!(
            "{:016x}-{}",
            self.instance,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let table = Arc::clone(self);
        Box::pin(async move {
            table.start();
            let mut conn = table.conn().await?;
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
            table.live.lock().insert(sent.id.clone(), sent.key.clone());
            Ok(Ok(Slot::Redis(sent)))
        })
    }
}

/// Gives leases back and renews the live ones, until the table is dropped.
async fn background(
    table: std::sync::Weak<RedisTable>,
    live: Live,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    lease: Duration,
    lease_us: u64,
) {
    let renew = redis::Script::new(RENEW);
    let mut tick = tokio::time::interval(lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            cmd = rx.recv() => {
                let Some(Cmd::Release { key, id }) = cmd else { return };
                let Some(table) = table.upgrade() else { return };
                let Ok(mut conn) = table.conn().await else {
                    tracing::warn!("concurrency slot not given back (Redis unreachable); it expires with its lease");
                    continue;
                };
                let r: Result<i64, _> = redis::cmd("ZREM").arg(&key[..]).arg(&id).query_async(&mut conn).await;
                if let Err(error) = r {
                    tracing::warn!(%error, "concurrency slot not given back; it expires with its lease");
                }
            }
            _ = tick.tick() => {
                let Some(table) = table.upgrade() else { return };
                let leases: Vec<(String, Vec<u8>)> =
                    live.lock().iter().map(|(id, k)| (id.clone(), k.clone())).collect();
                if leases.is_empty() {
                    continue;
                }
                let Ok(mut conn) = table.conn().await else { continue };
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

/// A slot held in Redis; dropping it gives the slot back (through the layer's background task,
/// so dropping never blocks).
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
            table.live.lock().remove(&self.id);
            let _ = table.tx.send(Cmd::Release {
                key: std::mem::take(&mut self.key),
                id: std::mem::take(&mut self.id),
            });
        }
    }
}
