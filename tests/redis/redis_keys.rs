//! Key hygiene: hostile client keys cannot escape the prefix or choose a hash slot, long keys are
//! bounded, idle keys expire, and corrupted or wrong-type values at a limiter key have a
//! documented outcome (reset to fresh, counted) instead of a panic.

use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::redis::RedisBackend;
use tollgate::store::{Backend, LimitCheck};
use tollgate::Quota;

use crate::harness::redis_cluster::RedisCluster;
use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{decide, one, prefix, spec};

fn hostile() -> Vec<Vec<u8>> {
    vec![
        b"{victim}".to_vec(),
        b"}{victim}{".to_vec(),
        b"{}".to_vec(),
        b"\r\n*1\r\n$8\r\nFLUSHALL\r\n".to_vec(),
        b"a\nb c\td".to_vec(),
        vec![0, 1, 2, 255, 254, b'{', 128],
        "ünïcödé {ключ}".as_bytes().to_vec(),
        b"tollgate:{0000000000000000}:tb:burst:e.b:x".to_vec(),
        vec![b'{'; 10_000],
        vec![b'x'; 1 << 20],
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_cannot_escape_the_prefix_or_choose_a_slot() {
    let cluster = RedisCluster::start();
    let prefix = prefix("hostile");
    let limits = [
        // Hourly quotas: no key may expire before the keys are listed, however slow the machine.
        spec("burst", Quota::per_hour(5), AlgorithmKind::TokenBucket),
        spec("route", Quota::per_hour(5), AlgorithmKind::Gcra),
    ];
    let store = RedisBackend::cluster(cluster.urls())
        .prefix(prefix.clone())
        .hash_secret("test secret")
        .timeout(Duration::from_secs(3))
        .build(&limits)
        .unwrap();
    let mut slots = std::collections::HashSet::new();
    for bytes in hostile() {
        let key = Key::bytes(bytes.clone());
        let scoped = Key::bytes(bytes.clone()).scoped("GET", "/{x}\n");
        // Both limits of the client, one scoped to a route, in one call: one slot, so no
        // CROSSSLOT error, and it is decided.
        let checks = [
            LimitCheck::new(0, key.clone(), 1),
            LimitCheck::new(1, scoped.clone(), 1),
        ];
        let d = decide(&store, &checks).await.expect("decided");
        assert!(d.allowed());
        let a = store.redis_key(0, &key).unwrap();
        let b = store.redis_key(1, &scoped).unwrap();
        for k in [&a, &b] {
            assert!(k.starts_with(&format!("{prefix}:{{")), "{k:?}");
            assert_eq!(k.matches('{').count(), 1, "{k:?}");
            assert_eq!(k.matches('}').count(), 1, "{k:?}");
            assert!(k.bytes().all(|c| c.is_ascii_graphic()), "{k:?}");
            assert!(
                k.len() < 256,
                "a {}-byte client key became a {}-byte Redis key",
                bytes.len(),
                k.len()
            );
        }
        // The slot is the slot of our tag, whatever the client sent, and both limits share it.
        let tag = &a[prefix.len() + 1..a.find('}').unwrap() + 1];
        let slot = cluster.keyslot(&a);
        assert_eq!(slot, cluster.keyslot(tag), "{a:?}");
        assert_eq!(slot, cluster.keyslot(&b));
        slots.insert(slot);
    }
    // Keys that name a slot ("{victim}") do not all land in the slot they name.
    assert!(slots.len() > 3, "hostile keys spread over slots: {slots:?}");
    assert_ne!(
        cluster.keyslot(&store.redis_key(0, &Key::string("{victim}")).unwrap()),
        cluster.keyslot("victim")
    );
    // Everything stored is inside the namespace, and small.
    let stored = cluster.keys("*");
    assert_eq!(stored.len(), 2 * hostile().len(), "{stored:?}");
    for k in &stored {
        assert!(k.starts_with(&format!("{prefix}:{{")), "{k:?}");
        assert!(k.len() < 256);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keys_expire_for_every_algorithm() {
    let server = RedisServer::start();
    let kinds: Vec<AlgorithmKind> = AlgorithmKind::ALL
        .into_iter()
        .filter(|k| {
            RedisBackend::new("redis://127.0.0.1:1")
                .build(&[spec("p", Quota::per(Duration::from_millis(300), 3), *k)])
                .is_ok()
        })
        .collect();
    for kind in &kinds {
        // Short quotas: fully restored (and expired) within 300 ms of the last write, 600 ms for
        // the sliding window counter, which needs two windows.
        let idle_ms = match kind {
            AlgorithmKind::SlidingWindow => 600,
            _ => 300,
        };
        let store = RedisBackend::new(server.url())
            .prefix(prefix("expire"))
            .timeout(Duration::from_secs(3))
            .build(&[spec(
                "short",
                Quota::per(Duration::from_millis(300), 3),
                *kind,
            )])
            .unwrap();
        for client in ["a", "b", "c"] {
            for _ in 0..5 {
                one(&store, client, 1).await.unwrap();
            }
            let key = store.redis_key(0, &Key::string(client)).unwrap();
            let pttl: i64 = server.cmd(&["PTTL", &key]);
            assert!(0 < pttl && pttl <= idle_ms, "{kind}: PTTL {pttl} ms");
            assert!(
                pttl > idle_ms - 200,
                "{kind}: PTTL {pttl} ms is the idle timeout"
            );
        }
    }
    assert!(server.cmd::<i64>(&["DBSIZE"]) >= 3 * kinds.len() as i64);
    let deadline = Instant::now() + Duration::from_secs(3);
    while server.cmd::<i64>(&["DBSIZE"]) > 0 {
        assert!(Instant::now() < deadline, "keys did not expire");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_or_wrong_type_state_is_reset_to_fresh() {
    let server = RedisServer::start();
    let quota = Quota::per_second(2);
    // A fixed explicit time, so every request sees the same window.
    let clock = tollgate::clock::ManualClock::new();
    clock.set_micros(1_700_000_000_000_000);
    for kind in AlgorithmKind::ALL {
        let Ok(store) = RedisBackend::new(server.url())
            .prefix(prefix("corrupt"))
            .clock(clock.clone())
            .timeout(Duration::from_secs(3))
            .build(&[spec("c", quota, kind)])
        else {
            continue;
        };
        let fresh = one(&store, "fresh", 1).await.unwrap();
        let corruptions: [&[&str]; 7] = [
            &["SET", "{k}", "garbage"],
            &["SET", "{k}", "99999999999999999999:1"],
            &["SET", "{k}", "1:2:3:4:5:6:7"],
            &["SET", "{k}", "-5:-5"],
            &["LPUSH", "{k}", "x"],
            &["HSET", "{k}", "tokens", "5"],
            &["SADD", "{k}", "1"],
        ];
        for (i, c) in corruptions.iter().enumerate() {
            let client = format!("victim-{i}");
            let key = store.redis_key(0, &Key::string(client.clone())).unwrap();
            let _: redis::Value = server.cmd(&["DEL", &key]);
            let args: Vec<&str> = c
                .iter()
                .map(|a| if *a == "{k}" { key.as_str() } else { a })
                .collect();
            let _: redis::Value = server.cmd(&args);
            let before = store.stats().corrupt_resets();
            let d = one(&store, &client, 1)
                .await
                .expect("decided, not an error");
            // The same decision as for a fresh key (reset times follow the server clock).
            assert_eq!(
                (d.allowed(), d.remaining(), d.limit()),
                (fresh.allowed(), fresh.remaining(), fresh.limit()),
                "{kind} {c:?}"
            );
            assert_eq!(
                store.stats().corrupt_resets(),
                before + 1,
                "{kind} {c:?}: counted"
            );
            // Healed: the key holds valid state, and the next request is charged normally.
            let d2 = one(&store, &client, 1).await.expect("decided");
            assert_eq!(
                store.stats().corrupt_resets(),
                before + 1,
                "{kind} {c:?}: healed"
            );
            assert_eq!(d2.remaining(), 0, "{kind} {c:?}");
        }
        assert_eq!(store.stats().errors(), 0);
    }
}
