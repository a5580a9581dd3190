//! The Redis store behind Sentinel (`RedisBackend::sentinel`), against a primary, one replica
//! and three Sentinels (`down-after-milliseconds 1000`) the harness starts on loopback: every
//! algorithm decides through the Sentinels exactly as on the node itself, two stores share one
//! limit, and a real failover under load.
//!
//! The failover test SIGKILLs the primary while 8 tasks (4 per store, two stores) decide
//! continuously, and asserts, with slack for a loaded 2-core machine:
//! - each store decides again by Redis (the limits fail closed, so an admission is Redis's)
//!   within **10 s** of the kill (typically about 3 s: the Sentinels' 1 s down-after plus the
//!   election and promotion);
//! - the limit is still shared through the promoted replica: on a fresh key of capacity 50, the
//!   two stores together admit at most 50, and exactly 50 unless the failure policy decided some
//!   checks; the key lives on the promoted node, and each store counts the new primary in
//!   `RedisStats::reconnects`;
//! - decisions lost (admitted on the old primary, but not in the promoted replica's state) are
//!   at most **2 %** of the decisions admitted before the kill (on loopback the replica trails
//!   by well under a millisecond, and the measured loss is typically 0 to a few decisions).
//!
//! `cargo test --all-features --test redis -- redis_sentinel --nocapture` prints the figures:
//! time to decide again, decisions lost, and the replication lag seen just before the kill.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, LimitCheck, LimitSpec};
use tollgate::Quota;

use crate::harness::redis_sentinel::{RedisSentinel, MASTER};
use crate::harness::stores::{decide, node_store, one, prefix, spec};
use crate::redis_secure::Logs;

/// A Sentinel set the tests that kill nothing share.
fn shared() -> &'static RedisSentinel {
    static SET: OnceLock<RedisSentinel> = OnceLock::new();
    SET.get_or_init(|| RedisSentinel::start(1))
}

fn sentinel_backend(set: &RedisSentinel) -> RedisBackend {
    RedisBackend::sentinel(set.sentinel_addrs(), MASTER)
}

#[tokio::test]
async fn every_algorithm_decides_through_the_sentinels_as_on_the_node() {
    let set = shared();
    for kind in AlgorithmKind::ALL {
        let limits = [spec("sentinel", Quota::per_minute(4), kind)];
        let clock = ManualClock::new();
        let node = node_store(&set.primary().url(), "sentinel-node", &clock, &limits);
        let via_sentinel = sentinel_backend(set)
            .prefix(prefix("sentinel-algo"))
            .clock(clock.clone())
            .timeout(Duration::from_secs(3))
            .build(&limits)
            .unwrap();
        let mut allowed = 0;
        for step in 0..16 {
            let expected = one(&node, "client", 1).await.unwrap();
            let got = one(&via_sentinel, "client", 1).await.unwrap();
            assert_eq!(got, expected, "{kind:?}, step {step}");
            allowed += usize::from(got.allowed());
            clock.advance(Duration::from_secs(7));
        }
        assert!(
            (4..16).contains(&allowed),
            "{kind:?}: the limit both admitted and refused ({allowed} of 16)"
        );
        assert_eq!(via_sentinel.stats().errors(), 0, "{kind:?}");
    }
}

/// Two stores deciding `per_store` checks each on `key` from 4 tasks apiece; the admissions.
async fn admitted_together(stores: [&RedisStore; 2], limit: usize, key: &str) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for store in stores {
        for _ in 0..4 {
            let (store, admitted, key) = (store.clone(), admitted.clone(), key.to_owned());
            tasks.push(tokio::spawn(async move {
                for _ in 0..20 {
                    let checks = [LimitCheck::new(limit, Key::string(key.clone()), 1)];
                    if decide(&store, &checks).await.is_ok_and(|d| d.allowed()) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

/// A store for `limits` under `prefix`, with real time and a timeout generous enough for a
/// loaded machine.
fn instance(set: &RedisSentinel, prefix: &str, limits: &[LimitSpec]) -> RedisStore {
    sentinel_backend(set)
        .prefix(prefix)
        .timeout(Duration::from_millis(250))
        .probe_interval(Duration::from_millis(100))
        .build(limits)
        .unwrap()
}

/// A token bucket of `capacity` that refills one unit an hour: its remaining count is what was
/// admitted.
fn counter(name: &str, capacity: u64) -> LimitSpec {
    spec(
        name,
        Quota::per_hour(1).burst(capacity),
        AlgorithmKind::TokenBucket,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_behind_the_sentinels_share_one_limit() {
    let set = shared();
    let limits = [counter("shared", 50)];
    let prefix = prefix("sentinel-shared");
    let a = instance(set, &prefix, &limits);
    let b = instance(set, &prefix, &limits);
    assert_eq!(admitted_together([&a, &b], 0, "one-key").await, 50);
}

const LOAD_CAPACITY: u64 = 1_000_000;
const TASKS_PER_STORE: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_is_followed_within_10s_and_the_limit_stays_shared() {
    let mut set = RedisSentinel::start(1);
    let limits = [counter("load", LOAD_CAPACITY), counter("fresh", 50)];
    let prefix = prefix("sentinel-failover");
    let stores = [
        instance(&set, &prefix, &limits),
        instance(&set, &prefix, &limits),
    ];
    let killed_at: Arc<OnceLock<Instant>> = Arc::default();
    let decided_again: Arc<[Mutex<Option<Duration>>; 2]> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (s, store) in stores.iter().enumerate() {
        for t in 0..TASKS_PER_STORE {
            let (store, killed_at, decided_again, stop) = (
                store.clone(),
                killed_at.clone(),
                decided_again.clone(),
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
                        if let Some(at) = killed_at.get() {
                            decided_again[s]
                                .lock()
                                .unwrap()
                                .get_or_insert_with(|| at.elapsed());
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
    // Decisions admitted once the primary is dead come from the promoted replica.
    let signalled = Instant::now();
    let old = tokio::task::block_in_place(|| set.kill_primary());
    killed_at.set(signalled).unwrap();
    let promoted = tokio::task::block_in_place(|| set.wait_failover(old, Duration::from_secs(30)));
    let sentinels_switched = killed_at.get().unwrap().elapsed();
    // Load until both stores decide again (or well past the bound), plus half a second more.
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
    let again: Vec<Option<Duration>> = decided_again.iter().map(|d| *d.lock().unwrap()).collect();

    // What the promoted replica holds for each key: one more decision reads it.
    let mut lost = 0u64;
    let mut unanswered = 0u64;
    let mut total = 0u64;
    for (s, (key, count)) in admitted.iter().enumerate() {
        let store = &stores[s / TASKS_PER_STORE];
        let d = one(store, key, 1)
            .await
            .expect("decided after the failover");
        let held = LOAD_CAPACITY - d.remaining() - 1;
        total += count;
        lost += count.saturating_sub(held);
        // Written before the kill and replicated, but the answer was lost with the primary.
        unanswered += held.saturating_sub(*count);
    }

    // The limit is shared through the promoted replica.
    let closed_before: u64 = stores.iter().map(|s| s.stats().fail_closed()).sum();
    let fresh = admitted_together([&stores[0], &stores[1]], 1, "fresh-after-failover").await;
    let closed = stores.iter().map(|s| s.stats().fail_closed()).sum::<u64>() - closed_before;
    let fresh_key = stores[0]
        .redis_key(1, &Key::string("fresh-after-failover"))
        .unwrap();
    let on_promoted: i64 = set.cmd(set.node(promoted), &["EXISTS", &fresh_key]);

    println!(
        "sentinel failover: sentinels switched {sentinels_switched:?} after the kill; stores decided again after {again:?}; \
         {total} decisions admitted, {lost} lost ({:.3} %), {unanswered} written but unanswered; \
         replication lag before the kill at most {lag_bytes} bytes; fresh key: {fresh} of 50 admitted, {closed} by the failure policy",
        100.0 * lost as f64 / total.max(1) as f64
    );
    for (s, at) in again.iter().enumerate() {
        let at = at.unwrap_or_else(|| panic!("store {s} never decided again"));
        assert!(
            at <= Duration::from_secs(10),
            "store {s} decided again {at:?} after the kill"
        );
    }
    assert!(total > 0, "the load admitted decisions");
    assert!(
        lost * 50 <= total,
        "lost {lost} of {total} decisions admitted (more than 2 %)"
    );
    assert!(fresh <= 50, "{fresh} admitted on a limit of 50");
    assert!(
        fresh + closed >= 50,
        "{fresh} admitted, {closed} decided by the failure policy"
    );
    assert_eq!(on_promoted, 1, "the fresh key lives on the promoted node");
    for store in &stores {
        assert!(
            store.stats().reconnects() >= 1,
            "the new primary counts as a reconnect: {:?}",
            store.stats()
        );
    }
}

/// A manual failover (`SENTINEL FAILOVER`): the old primary stays up as a replica (writes to it
/// answer `READONLY`) and the Sentinels announce `+switch-master`; the store moves to the
/// promoted node (a write there is decided by Redis within 10 s of the old primary's
/// demotion) and keeps the key's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_is_left_for_the_promoted_one() {
    let set = RedisSentinel::start(1);
    let store = instance(&set, &prefix("sentinel-demote"), &[counter("demote", 1000)]);
    let first = one(&store, "k", 1).await.unwrap();
    assert_eq!(first.remaining(), 999);
    let old = set.primary().port();
    let _: String = set.cmd(&set.sentinels[0], &["SENTINEL", "FAILOVER", MASTER]);
    let promoted = tokio::task::block_in_place(|| set.wait_failover(old, Duration::from_secs(30)));
    // The Sentinels then make the old primary a replica of the promoted one.
    let demoted = Instant::now();
    while set
        .cmd::<Vec<redis::Value>>(set.node(old), &["ROLE"])
        .first()
        != Some(&redis::Value::BulkString(b"slave".to_vec()))
    {
        assert!(
            demoted.elapsed() < Duration::from_secs(30),
            "the old primary was not demoted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start = Instant::now();
    let again = loop {
        if let Ok(d) = one(&store, "k", 1).await {
            break d;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            store.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        again.remaining(),
        998,
        "the promoted node holds the key's state"
    );
    println!(
        "sentinel manual failover: {old} -> {promoted}, decided {:?} after the demotion",
        start.elapsed()
    );
}

const NODE_PASSWORD: &str = "node-pw-51f0c2d9-never-printed";
const SENTINEL_PASSWORD: &str = "sentinel-pw-8e27ab46-never-printed";

/// Sentinels and nodes with passwords of their own: the store decides with both right, and
/// with either wrong its checks go to the failure policy, with neither password in an error or
/// a log line.
#[tokio::test]
async fn the_primary_and_the_sentinels_authenticate_with_their_own_passwords() {
    let mut set = RedisSentinel::start(1);
    set.secure(NODE_PASSWORD, SENTINEL_PASSWORD);
    let logs = Logs::default();
    let _guard = logs.install();
    let limits = [counter("auth", 10)];
    let backend = |node: &str, sentinel: &str| {
        sentinel_backend(&set)
            .prefix(prefix("sentinel-auth"))
            .credentials("default", node)
            .sentinel_credentials("default", sentinel)
            .timeout(Duration::from_secs(1))
            .connect_timeout(Duration::from_millis(300))
            .build(&limits)
            .unwrap()
    };
    let store = backend(NODE_PASSWORD, SENTINEL_PASSWORD);
    assert_eq!(one(&store, "k", 1).await.unwrap().remaining(), 9);
    for (node, sentinel) in [
        (NODE_PASSWORD, "wrong-sentinel-password"),
        ("wrong-node-password", SENTINEL_PASSWORD),
    ] {
        let store = backend(node, sentinel);
        let err = one(&store, "k", 1).await.unwrap_err();
        assert!(!err.to_string().contains("never-printed"), "{err}");
        assert!(!format!("{store:?}").contains("never-printed"));
    }
    // The URL form of a Sentinel's password works too.
    let url = format!("redis://:{SENTINEL_PASSWORD}@{}", set.sentinels[1].addr());
    let store = RedisBackend::sentinel([url], MASTER)
        .prefix(prefix("sentinel-auth-url"))
        .credentials("default", NODE_PASSWORD)
        .timeout(Duration::from_secs(1))
        .build(&limits)
        .unwrap();
    assert!(one(&store, "k", 1).await.unwrap().allowed());
    let text = logs.text();
    assert!(
        text.contains("redis primary found"),
        "the resolver logs: {text}"
    );
    assert!(!text.contains("never-printed"), "{text}");
}

/// `rediss://` Sentinels: the Sentinel and the primary it names are both reached over TLS, with
/// the builder's certificates (the test's CA and client certificate).
#[cfg(feature = "redis-tls")]
#[tokio::test]
async fn tls_sentinels_name_a_primary_reached_over_tls() {
    use crate::harness::redis_server::{free_port, RedisServer};
    use crate::redis_secure::tls::TestCertificates;
    let Some(certs) = TestCertificates::make("sentinel-tls") else {
        return;
    };
    let read = |name: &str| certs.read(name);
    // The Sentinel's own connections to the primary go over TLS too.
    let tls = |port: &str| {
        let mut args = certs.server_args(port);
        args.extend(["--tls-replication".into(), "yes".into()]);
        args
    };
    let node_port = free_port().to_string();
    let node_args = tls(&node_port);
    let _primary =
        RedisServer::start_with(&node_args.iter().map(String::as_str).collect::<Vec<_>>());
    let sentinel_port = free_port().to_string();
    let mut sentinel_args = tls(&sentinel_port);
    sentinel_args.push("--sentinel".into());
    let config = format!("sentinel monitor {MASTER} 127.0.0.1 {node_port} 1\n");
    let _sentinel = RedisServer::start_configured(
        Some(&config),
        &sentinel_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let store = RedisBackend::sentinel([format!("rediss://127.0.0.1:{sentinel_port}")], MASTER)
        .tls_root_certificate(read("ca.crt"))
        .tls_client_certificate(read("client.crt"), read("client.key"))
        .prefix(prefix("sentinel-tls"))
        .timeout(Duration::from_secs(3))
        .build(&[counter("tls", 10)])
        .unwrap();
    let d = one(&store, "k", 1).await.unwrap();
    assert_eq!(d.remaining(), 9);
}

#[test]
fn bad_sentinel_settings_are_config_errors_that_never_print_credentials() {
    let limits = [counter("a", 1)];
    let cases = [
        (
            RedisBackend::sentinel(Vec::<String>::new(), "m"),
            "redis.sentinel",
        ),
        (
            RedisBackend::sentinel(["127.0.0.1:26379"], " "),
            "redis.sentinel.master",
        ),
        (
            RedisBackend::sentinel(["user:secret@host"], "m"),
            "redis.sentinel",
        ),
        (RedisBackend::sentinel(["10.0.0.1"], "m"), "redis.sentinel"),
        (
            RedisBackend::sentinel(["http://u:secret@h:1"], "m"),
            "redis.sentinel",
        ),
    ];
    for (backend, field) in cases {
        let err = backend.build(&limits).unwrap_err();
        assert_eq!(err.field(), field, "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
    let backend = RedisBackend::sentinel(["redis://u:secret@h:26379", "h2:26379"], "m")
        .credentials("node", "secret-node")
        .sentinel_credentials("default", "secret-sentinel");
    let debug = format!("{backend:?}");
    assert!(!debug.contains("secret"), "{debug}");
    assert!(
        debug.contains("h2:26379") && debug.contains("***@h:26379"),
        "{debug}"
    );
}
