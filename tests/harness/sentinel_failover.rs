//! A Sentinel-monitored primary SIGKILLed under load, measured ([`kill_the_primary_under_load`]):
//! a primary, one replica and three Sentinels (`down-after-milliseconds 1000`), two stores (two
//! instances of an app) deciding continuously from 4 tasks each, the primary killed after 1 s of
//! load. It measures when the replica became the primary, when every Sentinel named it, when
//! each store decided by Redis again, how many admitted decisions the promoted replica did not
//! hold, and the replication lag while the load ran. Used by `tests/redis/redis_sentinel.rs`
//! (which asserts the bounds) and `benches/failover.rs` (which reports the figures of several
//! runs).
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, LimitSpec};
use tollgate::Quota;

use super::redis_sentinel::{RedisSentinel, MASTER};
use super::stores::{one, prefix, spec};

/// The capacity of the load's ledger limit (limit 0 of the stores): a token bucket refilling
/// one unit an hour, so that a key's `remaining` counts the decisions Redis has kept for it.
pub const LEDGER: u64 = 1_000_000;
/// Tasks deciding through each of the two stores, one key each.
pub const TASKS_PER_STORE: usize = 4;
/// The store's per-call timeout (generous: the machine is shared and runs debug builds).
pub const STORE_TIMEOUT: Duration = Duration::from_millis(250);

/// A store behind the Sentinels of `set` for `limits` under `prefix`, with real time, a timeout
/// generous enough for a loaded machine and a 100 ms probe interval.
pub fn instance(set: &RedisSentinel, prefix: &str, limits: &[LimitSpec]) -> RedisStore {
    RedisBackend::sentinel(set.sentinel_addrs(), MASTER)
        .prefix(prefix)
        .timeout(STORE_TIMEOUT)
        .probe_interval(Duration::from_millis(100))
        .build(limits)
        .unwrap()
}

/// A token bucket of `capacity` that refills one unit an hour (failure policy `Closed`): its
/// remaining count is what was admitted.
pub fn counter(name: &str, capacity: u64) -> LimitSpec {
    spec(
        name,
        Quota::per_hour(1).burst(capacity),
        AlgorithmKind::TokenBucket,
    )
}

/// What one failover did, every time measured from the kill. The Sentinels, the promoted node
/// and the stores are still up, for checks after it.
pub struct SentinelFailover {
    pub set: RedisSentinel,
    /// The two stores, sharing one prefix.
    pub stores: [RedisStore; 2],
    /// The port of the promoted replica.
    pub promoted: u16,
    /// When the replica first answered `ROLE` as a master (polled every 10 ms; `None`: not
    /// within 30 s).
    pub replica_promoted: Option<Duration>,
    /// When every Sentinel named the promoted replica and it answered `ROLE` as a master
    /// (polled every 50 ms).
    pub sentinels_switched: Duration,
    /// For each store, when it first admitted a check after the kill (the limits fail closed,
    /// so an admission is Redis's; `None`: not within 20 s of the Sentinels' switch).
    pub decided_again: [Option<Duration>; 2],
    /// The decisions admitted during the whole run.
    pub admitted: u64,
    /// The decisions admitted before the kill (told to the clients by the old primary).
    pub admitted_before_kill: u64,
    /// Admitted decisions the promoted replica's state did not hold (summed over the keys).
    pub lost: u64,
    /// Decisions the promoted replica held that no client was told of (written before the kill
    /// and replicated, but the answer died with the primary).
    pub unanswered: u64,
    /// The largest replication lag sampled every 100 ms during the second of load before the
    /// kill, in bytes of the replication stream (an upper bound per sample).
    pub lag_bytes: i64,
}

impl SentinelFailover {
    /// When both stores had decided again (`None`: one never did).
    pub fn both_decided_again(&self) -> Option<Duration> {
        Some(self.decided_again[0]?.max(self.decided_again[1]?))
    }
}

/// Starts a primary, a replica and three Sentinels, loads them through two stores (limits:
/// the [`LEDGER`] limit, then `more_limits`) for 1 s, SIGKILLs the primary and keeps the load
/// until both stores decided again (at most 20 s after the Sentinels' switch) plus 500 ms.
/// Must run on a multi-thread runtime.
pub async fn kill_the_primary_under_load(more_limits: &[LimitSpec]) -> SentinelFailover {
    let mut set = RedisSentinel::start(1);
    let mut limits = vec![counter("load", LEDGER)];
    limits.extend_from_slice(more_limits);
    let prefix = prefix("sentinel-failover");
    let stores = [0, 1].map(|_| instance(&set, &prefix, &limits));
    let killed_at: Arc<OnceLock<Instant>> = Arc::default();
    let decided_again: Arc<[Mutex<Option<Duration>>; 2]> = Arc::default();
    let before_kill = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (s, store) in stores.iter().enumerate() {
        for t in 0..TASKS_PER_STORE {
            let (store, killed_at, decided_again, before_kill, stop) = (
                store.clone(),
                killed_at.clone(),
                decided_again.clone(),
                before_kill.clone(),
                stop.clone(),
            );
            // Each task its own key: what it admitted is what that key's state must hold.
            let key = format!("load-{s}-{t}");
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let d = one(&store, &key, 1).await;
                    if d.is_ok_and(|d| d.allowed()) {
                        admitted += 1;
                        match killed_at.get() {
                            Some(at) => {
                                decided_again[s]
                                    .lock()
                                    .unwrap()
                                    .get_or_insert_with(|| at.elapsed());
                            }
                            None => {
                                before_kill.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    } else {
                        // Decided by the failure policy: do not spin while Redis is away.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                (key, admitted)
            }));
        }
    }
    // Load on the first primary for a second, sampling the replication lag meanwhile.
    let mut lag_bytes = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        lag_bytes = lag_bytes.max(tokio::task::block_in_place(|| set.replication_lag_bytes()));
    }
    let replica_url = set.nodes[1].url();
    // Decisions admitted once the primary is dead come from the promoted replica.
    let signalled = Instant::now();
    let old = tokio::task::block_in_place(|| set.kill_primary());
    killed_at.set(signalled).unwrap();
    let watch = std::thread::spawn(move || watch_promotion(&replica_url, signalled));
    let promoted = tokio::task::block_in_place(|| set.wait_failover(old, Duration::from_secs(30)));
    let sentinels_switched = signalled.elapsed();
    // Load until both stores decide again (or well past any bound), plus half a second more.
    let deadline = Instant::now() + Duration::from_secs(20);
    while decided_again.iter().any(|d| d.lock().unwrap().is_none()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut admitted = Vec::new();
    for t in tasks {
        admitted.push(t.await.unwrap());
    }
    let replica_promoted = tokio::task::block_in_place(|| watch.join().unwrap());

    // What the promoted replica holds for each key: one more decision reads it.
    let (mut lost, mut unanswered, mut total) = (0u64, 0u64, 0u64);
    for (s, (key, count)) in admitted.iter().enumerate() {
        let store = &stores[s / TASKS_PER_STORE];
        let d = one(store, key, 1)
            .await
            .expect("decided after the failover");
        let held = LEDGER - d.remaining() - 1;
        total += count;
        lost += count.saturating_sub(held);
        unanswered += held.saturating_sub(*count);
    }
    let decided_again = [0, 1].map(|s| *decided_again[s].lock().unwrap());
    SentinelFailover {
        set,
        stores,
        promoted,
        replica_promoted,
        sentinels_switched,
        decided_again,
        admitted: total,
        admitted_before_kill: before_kill.load(Ordering::Relaxed),
        lost,
        unanswered,
        lag_bytes,
    }
}

/// When (from `since`) the node at `url` first answers `ROLE` as a master, polled every 10 ms
/// for at most 30 s, each time on a new connection (the Sentinels disconnect the clients of the
/// replica they promote).
fn watch_promotion(url: &str, since: Instant) -> Option<Duration> {
    let client = redis::Client::open(url).unwrap();
    let master = |conn: &mut redis::Connection| {
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(conn).ok()?;
        Some(role.first()? == &redis::Value::BulkString(b"master".to_vec()))
    };
    while since.elapsed() < Duration::from_secs(30) {
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(1));
        if conn.as_mut().ok().and_then(master) == Some(true) {
            return Some(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}
