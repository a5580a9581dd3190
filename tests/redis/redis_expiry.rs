//! A token bucket's batched writes keep the key's TTL when it still covers the refill
//! (`KEEPTTL`, "Expiry" in `scripts/token_bucket.lua`) and set it otherwise, so that a key never
//! expires before its bucket is full again: checked against a real `redis-server` and its clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::Backend;
use tollgate::{Decision, Quota};

use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{one, prefix, spec};

pub(crate) const CLIENTS: usize = 12;

fn store(server: &RedisServer, quota: Quota) -> Arc<RedisStore> {
    Arc::new(
        RedisBackend::new(server.url())
            .prefix(prefix("expiry"))
            .max_in_flight(1)
            .timeout(Duration::from_secs(10))
            .build(&[spec("bucket", quota, AlgorithmKind::TokenBucket)])
            .expect("a store"),
    )
}

/// One request from each of `CLIENTS` clients (keys `c0`, `c1`, ...), all queued while the
/// server is stopped so that they go in one batch (the fused path needs a batch that reads its
/// keys ahead), with the store's `max_in_flight` at 1. Returns each client's decision.
pub(crate) async fn batched_round(server: &RedisServer, store: &Arc<RedisStore>) -> Vec<Decision> {
    server.pause();
    // The first request queued goes alone (max_in_flight 1): a filler, so that the clients'
    // requests all wait for the next batch.
    let filler = {
        let store = store.clone();
        tokio::spawn(async move { one(&*store, "filler", 1).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let store = store.clone();
            tokio::spawn(async move { one(&*store, &format!("c{c}"), 1).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    server.resume();
    filler.await.unwrap().expect("decided");
    let mut decisions = Vec::new();
    for t in tasks {
        decisions.push(t.await.unwrap().expect("decided"));
    }
    decisions
}

/// [`batched_round`] where every client is allowed: each client's remaining count.
async fn allowed_round(server: &RedisServer, store: &Arc<RedisStore>) -> Vec<u64> {
    let decisions = batched_round(server, store).await;
    for d in &decisions {
        assert!(d.allowed(), "{d:?}");
    }
    decisions.iter().map(Decision::remaining).collect()
}

/// One token a day, ten of burst: the key's TTL is ten days, a cell 30 hours, and a write keeps
/// the TTL while the bucket it leaves refills within 8.75 days (at most 8 tokens spent). Before
/// each round every key's TTL is cut to a marker; a write that keeps the TTL leaves the marker,
/// one that sets it puts back the ten days.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_writes_keep_the_ttl_only_while_it_covers_the_refill() {
    let server = RedisServer::start();
    let store = store(&server, Quota::per_day(1).burst(10));
    let ten_days_ms: i64 = 10 * 86_400_000;
    let marker_ms: i64 = 5 * 86_400_000;
    let keys: Vec<String> = (0..CLIENTS)
        .map(|c| store.redis_key(0, &Key::string(format!("c{c}"))).unwrap())
        .collect();
    let batches_before = store.stats().batches();
    for round in 0..9u64 {
        if round > 0 {
            for key in &keys {
                let _: i64 = server.cmd(&["PEXPIRE", key, &marker_ms.to_string()]);
            }
        }
        let remaining = allowed_round(&server, &store).await;
        for (c, key) in keys.iter().enumerate() {
            assert_eq!(remaining[c], 9 - round, "round {round}, client {c}");
            let pttl: i64 = server.cmd(&["PTTL", key]);
            let spent = 10 - remaining[c];
            if round > 0 && spent <= 8 {
                // Refills within 8 days: the write kept the TTL.
                assert!(
                    pttl <= marker_ms,
                    "round {round}, client {c}: {spent} spent, PTTL {pttl} ms: the TTL was set again"
                );
            } else {
                // A fresh key (general path), or 9 spent (9 days to refill): the TTL was set.
                assert!(
                    pttl > ten_days_ms - 60_000 && pttl <= ten_days_ms,
                    "round {round}, client {c}: {spent} spent, PTTL {pttl} ms: the TTL was kept"
                );
            }
        }
    }
    let batches = store.stats().batches() - batches_before;
    assert!(
        batches <= 9 * 2 + 1,
        "{} requests went in {batches} batches, so the batch path was not taken",
        9 * CLIENTS
    );
    assert_eq!(store.stats().errors(), 0);
}

/// Real time, short quota (a token every 100 ms, eight of burst: an 800 ms TTL, 100 ms cells):
/// clients at different rates, some keeping their buckets nearly full (their writes keep the
/// TTL), some draining them (theirs set it). After every allowed request, the key is still there
/// and lives at least until its bucket is full again (Redis's own clock, 3 ms of slack for the
/// millisecond rounding of TTLs). Keeping the TTL on every write fails this within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_outlives_its_refill_whatever_the_rate() {
    let server = RedisServer::start();
    let store = store(&server, Quota::per(Duration::from_millis(100), 1).burst(8));
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let started = Instant::now();
    let mut checked = 0;
    let mut kept = 0;
    let mut tick = 0usize;
    while started.elapsed() < Duration::from_millis(2500) {
        tick += 1;
        // Client c sends on every (c % 4 + 1)th tick of 40 ms: every 40 ms drains a bucket, every
        // 160 ms keeps it full.
        let tasks: Vec<_> = (0..CLIENTS)
            .filter(|c| tick.is_multiple_of(c % 4 + 1))
            .map(|c| {
                let (store, mut conn) = (store.clone(), conn.clone());
                let key = store.redis_key(0, &Key::string(format!("r{c}"))).unwrap();
                tokio::spawn(async move {
                    let sent = Instant::now();
                    let d = one(&*store, &format!("r{c}"), 1).await.expect("decided");
                    let pttl: i64 = redis::cmd("PTTL")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    (c, d, pttl, sent.elapsed())
                })
            })
            .collect();
        for t in tasks {
            let (c, d, pttl, elapsed) = t.await.unwrap();
            if !d.allowed() {
                continue;
            }
            checked += 1;
            // The key must live until (decided + reset); it was decided after `sent`, and PTTL
            // was read `elapsed` after `sent`.
            let lives_ms = pttl + i64::try_from(elapsed.as_millis()).unwrap();
            let needs_ms = i64::try_from(d.reset().as_millis()).unwrap();
            assert!(
                pttl > 0 && lives_ms + 3 >= needs_ms,
                "client {c}: refills in {needs_ms} ms but its key expires in {pttl} ms ({elapsed:?} after the request): {d:?}"
            );
            if pttl < 760 - i64::try_from(elapsed.as_millis()).unwrap() {
                kept += 1; // not set by this write: it kept an older TTL
            }
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(checked > 100, "only {checked} allowed requests");
    assert!(
        kept > 0,
        "no write kept its TTL, so the keeping path was not tested"
    );
    assert_eq!(store.stats().errors(), 0);
}

/// A state whose last write is ahead of Redis's clock (the clock went back, or another
/// server's clock was ahead): the write that follows keeps the key until its TTL past that
/// time, not past Redis's `now`, on the general path (a request alone) and on the fused one (a
/// batch). The TTL travels as digits whatever its size (ten days here, 864,000,000 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_after_the_clock_went_back_keeps_the_key_past_the_last_write() {
    let server = RedisServer::start();
    let store = store(&server, Quota::per_day(1).burst(10));
    let ten_days_ms: i64 = 10 * 86_400_000;
    let ahead_ms: i64 = 60_000;
    let mut conn = server.conn();
    let (secs, micros): (String, String) = redis::cmd("TIME").query(&mut conn).unwrap();
    let now_us: i64 = secs.parse::<i64>().unwrap() * 1_000_000 + micros.parse::<i64>().unwrap();
    let keys: Vec<String> = (0..CLIENTS)
        .map(|c| store.redis_key(0, &Key::string(format!("c{c}"))).unwrap())
        .collect();
    // An untouched bucket (deficit 0) last written a minute from now.
    let plant = |conn: &mut redis::Connection| {
        let mut state = 0i64.to_le_bytes().to_vec();
        state.extend_from_slice(&(now_us + ahead_ms * 1000).to_le_bytes());
        for key in &keys {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(&state)
                .arg("PX")
                .arg(1000)
                .query(conn)
                .unwrap();
        }
    };
    let check = |path: &str| {
        for key in &keys {
            let pttl: i64 = server.cmd(&["PTTL", key]);
            assert!(
                pttl > ten_days_ms + ahead_ms - 30_000 && pttl <= ten_days_ms + ahead_ms,
                "{path}: PTTL {pttl} ms, not the TTL past the last write"
            );
        }
    };
    // The general path: one request at a time (a batch of one reads nothing ahead).
    plant(&mut conn);
    for c in 0..CLIENTS {
        let d = one(&*store, &format!("c{c}"), 1).await.expect("decided");
        assert!(d.allowed() && d.remaining() == 9, "{d:?}");
    }
    check("one at a time");
    // The fused path: all in one batch.
    plant(&mut conn);
    let remaining = allowed_round(&server, &store).await;
    assert_eq!(remaining, vec![9; CLIENTS], "each planted bucket was full");
    check("in one batch");
    assert_eq!(store.stats().errors(), 0);
}
