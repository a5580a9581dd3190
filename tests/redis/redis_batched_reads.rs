//! A batch reads its keys ahead (one MGET, `scripts/driver.lua`): a key that appears several times
//! in one batch is decided against the writes of the decisions before it, and a corrupted or
//! wrong-type key is still detected, reset and counted once, for every algorithm; and a token
//! bucket's fused batch path decides as the general path does.

use std::sync::Arc;
use std::time::Duration;

use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, MAX_BATCH};
use tollgate::store::{Backend, LimitCheck};
use tollgate::Quota;

use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{decide, one, prefix, spec};
use crate::redis_fixed_window_batch::to_window_end_ms;

const CLIENTS: usize = 12;
const REPEATS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_and_corrupted_keys_in_one_batch_decide_as_one_at_a_time() {
    let server = RedisServer::start();
    for kind in AlgorithmKind::ALL {
        // Two per minute: of three requests from one client in one batch, exactly two pass.
        let store = Arc::new(
            RedisBackend::new(server.url())
                .prefix(prefix("batched-reads"))
                .max_in_flight(1)
                .timeout(Duration::from_secs(10))
                .build(&[spec("b", Quota::per_minute(2), kind)])
                .expect("a store"),
        );
        // Connected before the server is paused.
        one(&*store, "warm-up", 1).await.expect("decided");
        let key = |c: usize| {
            store
                .redis_key(0, &Key::string(format!("client-{c}")))
                .unwrap()
        };
        let _: redis::Value = server.cmd(&["HSET", &key(0), "tokens", "5"]);
        let _: redis::Value = server.cmd(&["SET", &key(1), "garbage"]);
        let _: redis::Value = server.cmd(&["SET", &key(2), &"\u{7f}".repeat(16)]);
        let corrupt_before = store.stats().corrupt_resets();
        let batches_before = store.stats().batches();
        // Everything queues while the server is stopped, then goes in (at most) two batches:
        // the first request alone, the rest together.
        server.pause();
        let mut tasks = Vec::new();
        for r in 0..REPEATS {
            for c in 0..CLIENTS {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    let d = one(&*store, &format!("client-{c}"), 1).await;
                    (c, r, d)
                }));
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.resume();
        let mut allowed = [0usize; CLIENTS];
        for t in tasks {
            let (c, _, d) = t.await.unwrap();
            let d = d.unwrap_or_else(|e| panic!("{kind}: client {c}: {e}"));
            allowed[c] += usize::from(d.allowed());
        }
        let batches = store.stats().batches() - batches_before;
        assert!(
            batches <= 3,
            "{kind}: {} requests went in {batches} batches, so the batch path was not taken",
            CLIENTS * REPEATS
        );
        assert_eq!(
            allowed, [2; CLIENTS],
            "{kind}: each client passes twice of three"
        );
        assert_eq!(
            store.stats().corrupt_resets() - corrupt_before,
            3,
            "{kind}: each corrupted key is reset once, however often it appears"
        );
        assert_eq!(store.stats().errors(), 0, "{kind}");
    }
}

/// A store's first limit, when a token bucket or a fixed window, takes a fused path for a batch's
/// checks of cost 1 whose state was read ahead (`tb_fast` in token_bucket_fast.lua, `fw_fast` in
/// fixed_window_fast.lua), answered by a compact record; the same limit as a store's second limit
/// takes the general path. Both answer the same rounds of batched requests alike: fresh keys
/// (written with `SET ... NX` on the fused path), allowed and then rejected ones (the token
/// bucket's refusals go to the general path; the fixed window's are fused too). Reset and retry
/// agree within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fused_paths_decide_as_the_general_path() {
    let server = RedisServer::start();
    // One token an hour, and windows of an hour (a run that would cross one's end waits for the
    // next): nothing refills while the test runs, so counts are exact.
    let cases = [
        (AlgorithmKind::TokenBucket, Quota::per_day(24).burst(3)),
        (AlgorithmKind::FixedWindow, Quota::per_hour(3)),
    ];
    for (kind, quota) in cases {
        if kind == AlgorithmKind::FixedWindow && to_window_end_ms() < 20_000 {
            tokio::time::sleep(Duration::from_millis(to_window_end_ms() + 100)).await;
        }
        fused_against_general(&server, kind, quota).await;
    }
}

async fn fused_against_general(server: &RedisServer, kind: AlgorithmKind, quota: Quota) {
    let build = |limits: &[_]| {
        Arc::new(
            RedisBackend::new(server.url())
                .prefix(prefix("fused"))
                .max_in_flight(1)
                .timeout(Duration::from_secs(10))
                .build(limits)
                .expect("a store"),
        )
    };
    let limit = spec("limit", quota, kind);
    let fused = build(std::slice::from_ref(&limit));
    let general = build(&[spec("first", quota, AlgorithmKind::Gcra), limit]);
    for store in [&fused, &general] {
        one(&**store, "warm-up", 1).await.expect("decided");
    }
    let batches_before = fused.stats().batches();
    for round in 0..5 {
        // Both stores' requests queue while the server is stopped, then go in a few batches.
        server.pause();
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            for (limit, store) in [(0, &fused), (1, &general)] {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    let checks = [LimitCheck::new(limit, Key::string(format!("c{c}")), 1)];
                    let d = decide(&*store, &checks).await.expect("decided");
                    (c, limit, d.as_slice()[0])
                }));
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.resume();
        let mut got = [[None; 2]; CLIENTS];
        for t in tasks {
            let (c, limit, d) = t.await.unwrap();
            got[c][limit] = Some(d);
        }
        for (c, [f, g]) in got.iter().enumerate() {
            let (f, g) = (f.unwrap(), g.unwrap());
            let at = format!("{kind}, round {round}, client {c}: fused {f:?}, general {g:?}");
            assert_eq!(f.allowed(), round < 3, "{at}");
            assert_eq!(
                (f.allowed(), f.remaining()),
                (g.allowed(), g.remaining()),
                "{at}"
            );
            assert_eq!(f.remaining(), 2u64.saturating_sub(round), "{at}");
            let near = |a: Duration, b: Duration| a.abs_diff(b) < Duration::from_secs(2);
            assert!(near(f.reset(), g.reset()), "{at}");
            let (fr, gr) = (f.retry_after().unwrap(), g.retry_after().unwrap());
            assert!(near(fr, gr), "{at}");
            assert_eq!(fr.is_zero(), f.allowed(), "{at}");
        }
    }
    let batches = fused.stats().batches() - batches_before;
    assert!(
        batches <= 5 * 3,
        "{kind}: {} requests went in {batches} batches, so the batch path was not taken",
        5 * CLIENTS
    );
    assert_eq!(fused.stats().errors() + general.stats().errors(), 0);
}

/// A batch of the most checks a store takes (`MAX_BATCH`, 1 024), on fresh keys (the general
/// path: five reply integers each, 5 121 in all, packed in pieces) and then on the same keys
/// again (the fused path: one each): every check is decided, in at most 3 batches per round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_is_decided_on_either_path() {
    let server = RedisServer::start();
    let store = Arc::new(
        RedisBackend::new(server.url())
            .prefix(prefix("full-batch"))
            .max_batch(MAX_BATCH)
            .max_in_flight(1)
            .timeout(Duration::from_secs(10))
            .build(&[spec("b", Quota::per_minute(10), AlgorithmKind::TokenBucket)])
            .expect("a store"),
    );
    one(&*store, "warm-up", 1).await.expect("decided");
    for round in 0..2u64 {
        let batches_before = store.stats().batches();
        server.pause();
        // The first request queued goes alone (max_in_flight 1); the rest wait for one batch.
        let filler = {
            let store = store.clone();
            tokio::spawn(async move { one(&*store, "filler", 1).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        let tasks: Vec<_> = (0..MAX_BATCH)
            .map(|c| {
                let store = store.clone();
                tokio::spawn(async move { one(&*store, &format!("c{c}"), 1).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.resume();
        filler.await.unwrap().expect("decided");
        for (c, t) in tasks.into_iter().enumerate() {
            let d = t.await.unwrap().expect("decided");
            assert!(d.allowed(), "round {round}, client {c}: {d:?}");
            assert_eq!(d.remaining(), 9 - round, "round {round}, client {c}");
        }
        let batches = store.stats().batches() - batches_before;
        assert!(batches <= 3, "round {round}: {batches} batches");
    }
    assert_eq!(store.stats().errors(), 0);
}

/// The lead (`scripts/lead.lua`) decides a batch with the fused check until a key needs the
/// general path, and the driver goes on from that key: in one batch where every other client
/// has spent its budget (a refusal, which the token bucket leaves to the general path) and a
/// few keys hold another type (left to the general path by `SET ... NX`), every client gets
/// its own decision, in order, whichever key comes first. Fresh keys written by the fused path
/// expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_lead_leaves_midway_is_decided_in_order() {
    let server = RedisServer::start();
    for kind in [AlgorithmKind::TokenBucket, AlgorithmKind::FixedWindow] {
        if kind == AlgorithmKind::FixedWindow && to_window_end_ms() < 20_000 {
            tokio::time::sleep(Duration::from_millis(to_window_end_ms() + 100)).await;
        }
        let quota = match kind {
            AlgorithmKind::TokenBucket => Quota::per_day(24).burst(2),
            _ => Quota::per_hour(2),
        };
        let store = Arc::new(
            RedisBackend::new(server.url())
                .prefix(prefix("lead-midway"))
                .max_in_flight(1)
                .timeout(Duration::from_secs(10))
                .build(&[spec("m", quota, kind)])
                .expect("a store"),
        );
        one(&*store, "warm-up", 1).await.expect("decided");
        let name = |c: usize| format!("{kind}-c{c}");
        // Even clients spend their two units; clients 3 and 7 hold a hash.
        for c in (0..CLIENTS).step_by(2) {
            for _ in 0..2 {
                assert!(one(&*store, &name(c), 1).await.unwrap().allowed());
            }
        }
        let key = |c: usize| store.redis_key(0, &Key::string(name(c))).unwrap();
        for c in [3, 7] {
            let _: redis::Value = server.cmd(&["HSET", &key(c), "tokens", "5"]);
        }
        let corrupt_before = store.stats().corrupt_resets();
        let batches_before = store.stats().batches();
        server.pause();
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let store = store.clone();
                let name = name(c);
                tokio::spawn(async move { (c, one(&*store, &name, 1).await) })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.resume();
        for t in tasks {
            let (c, d) = t.await.unwrap();
            let d = d.expect("decided");
            let at = format!("{kind}, client {c}: {d:?}");
            if c % 2 == 0 {
                assert!(!d.allowed(), "{at}");
                assert_eq!(d.remaining(), 0, "{at}");
                // A day's token, or the rest of the hour's window (at least 20 s, see above).
                assert!(d.retry_after().unwrap() > Duration::from_secs(10), "{at}");
            } else {
                // Fresh (or reset from a hash): one of two units spent.
                assert!(d.allowed(), "{at}");
                assert_eq!(d.remaining(), 1, "{at}");
            }
        }
        assert!(store.stats().batches() - batches_before <= 3, "{kind}");
        assert_eq!(store.stats().corrupt_resets() - corrupt_before, 2, "{kind}");
        assert_eq!(store.stats().errors(), 0, "{kind}");
        for c in [1, 3, 5] {
            let ttl: i64 = server.cmd(&["PTTL", &key(c)]);
            assert!(
                ttl > 0,
                "{kind}, client {c}: a fresh key expires (PTTL {ttl})"
            );
        }
    }
}
