//! A fixed window's batched checks (the fused path, `fw_fast` in `scripts/fixed_window_fast.lua`, and
//! its compact reply) decide as the general path does, and keep the key's TTL within a window:
//! checked against a real `redis-server` and its clock. Windows of an hour; a test that would
//! cross the end of one waits for the next first (at most 20 s). Bounds asserted: each client's
//! remaining count exactly; reset and retry within 5 s of the window's end by this machine's
//! clock (the server shares it); the TTL kept to the marker (at most 30 min) by a write inside a
//! window, and at least the time to the window's end less 5 s after the write that opens it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::redis::RedisBackend;
use tollgate::store::Backend;
use tollgate::Quota;

use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{prefix, spec};
use crate::redis_expiry::{batched_round, CLIENTS};

const LIMIT: u64 = 4;
const HOUR_MS: u64 = 3_600_000;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Milliseconds to the end of the current hour-long window (windows from the epoch).
pub(crate) fn to_window_end_ms() -> u64 {
    HOUR_MS - unix_ms() % HOUR_MS
}

fn near(got: Duration, want_ms: u64, what: &str) {
    let got = got.as_millis() as u64;
    assert!(
        got.abs_diff(want_ms) <= 5_000,
        "{what}: {got} ms, expected about {want_ms} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_fixed_window_checks_decide_as_the_general_path_and_keep_the_ttl() {
    if to_window_end_ms() < 20_000 {
        tokio::time::sleep(Duration::from_millis(to_window_end_ms() + 100)).await;
    }
    let server = RedisServer::start();
    let store = Arc::new(
        RedisBackend::new(server.url())
            .prefix(prefix("fw-batch"))
            .max_in_flight(1)
            .timeout(Duration::from_secs(10))
            .build(&[spec(
                "window",
                Quota::per_hour(LIMIT),
                AlgorithmKind::FixedWindow,
            )])
            .expect("a store"),
    );
    let keys: Vec<String> = (0..CLIENTS)
        .map(|c| store.redis_key(0, &Key::string(format!("c{c}"))).unwrap())
        .collect();
    let marker_ms: i64 = 1_800_000;
    let batches_before = store.stats().batches();
    for round in 0..=LIMIT {
        if round > 0 {
            for key in &keys {
                let _: i64 = server.cmd(&["PEXPIRE", key, &marker_ms.to_string()]);
            }
        }
        let decisions = batched_round(&server, &store).await;
        let end = to_window_end_ms();
        for (c, (d, key)) in decisions.iter().zip(&keys).enumerate() {
            let at = format!("round {round}, client {c}: {d:?}");
            let pttl: i64 = server.cmd(&["PTTL", key]);
            if round < LIMIT {
                assert!(d.allowed(), "{at}");
                assert_eq!(d.remaining(), LIMIT - 1 - round, "{at}");
            } else {
                assert!(!d.allowed(), "{at}");
                assert_eq!(d.remaining(), 0, "{at}");
                near(d.retry_after().expect("a wait"), end, &at);
            }
            near(d.reset(), end, &at);
            if round == 0 {
                // The write that opens the window sets the TTL, to its end at least.
                assert!(pttl as u64 + 5_000 >= end, "{at}: PTTL {pttl} ms");
            } else {
                // Later writes in the window keep it; a refusal writes nothing.
                assert!(
                    pttl <= marker_ms,
                    "{at}: PTTL {pttl} ms, the TTL was set again"
                );
            }
        }
    }
    let batches = store.stats().batches() - batches_before;
    assert!(
        batches <= (LIMIT + 1) * 2 + 1,
        "{} requests went in {batches} batches, so the batch path was not taken",
        (LIMIT + 1) * CLIENTS as u64
    );
    assert_eq!(store.stats().errors(), 0);
}
