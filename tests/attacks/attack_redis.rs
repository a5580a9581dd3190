//! Attacks on the Redis store (issue 7), each against real `redis-server` processes the tests
//! start on free loopback ports, bounded in count and time, and each asserting its bound:
//!
//! - a flood of distinct keys never gives an exhausted victim its budget back (no eviction, and
//!   Redis out of memory under `noeviction` fails closed);
//! - a slow Redis (`DEBUG SLEEP`, SIGSTOP) under 2 000 concurrent requests: nothing hangs,
//!   nothing is admitted beyond the limit, process memory stays bounded;
//! - a dead Cluster master only short-circuits the keys it serves;
//! - hostile limit names and keys: no panic, no client key in clear in Redis or in the logs;
//! - runtime switching: a store used from one tokio runtime, then another, then after the first
//!   was dropped, keeps deciding by Redis;
//! - the sliding log at its Redis cap: state bounded, cost per request measured.
//!
//! Figures are printed (`cargo test --all-features --test attacks -- attack_redis:: --nocapture`).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore, MAX_SLIDING_LOG};
use tollgate::store::{Backend, FailurePolicy, LimitCheck, LimitSpec};
use tollgate::{Name, Quota};

use crate::harness::isolated::run_alone;
use crate::harness::redis_cluster::RedisCluster;
use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{decide, one, prefix};

/// A generous bound for anything that must not hang.
const HANG_GUARD: Duration = Duration::from_secs(20);

fn server() -> &'static RedisServer {
    static S: OnceLock<RedisServer> = OnceLock::new();
    S.get_or_init(RedisServer::start)
}

fn limit(name: &str, quota: Quota, kind: AlgorithmKind, policy: FailurePolicy) -> LimitSpec {
    LimitSpec::new(Name::new(name), quota, kind).on_store_error(policy)
}

const CLOSED: FailurePolicy = FailurePolicy::Closed {
    retry_after: Duration::from_secs(1),
};

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Allowed, rejected, failed: the outcome of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Rejected,
    Failed,
}

async fn outcome(store: &RedisStore, key: &str) -> Outcome {
    match tokio::time::timeout(HANG_GUARD, one(store, key, 1)).await {
        Err(_) => panic!("a request hung for {HANG_GUARD:?}"),
        Ok(Ok(d)) if d.allowed() => Outcome::Allowed,
        Ok(Ok(_)) => Outcome::Rejected,
        Ok(Err(_)) => Outcome::Failed,
    }
}

/// Distinct keys at `concurrency`, until `stop` says so or `max` keys were sent; returns how
/// many were sent and how many were allowed.
async fn flood(
    store: &RedisStore,
    tag: &str,
    max: usize,
    concurrency: usize,
    stop: impl Fn() -> bool,
) -> (usize, usize) {
    let (mut sent, mut allowed) = (0, 0);
    while sent < max && !stop() {
        let tasks: Vec<_> = (sent..(sent + concurrency).min(max))
            .map(|i| {
                let store = store.clone();
                let key = format!("{tag}-{i}");
                tokio::spawn(async move { outcome(&store, &key).await })
            })
            .collect();
        sent += tasks.len();
        for t in tasks {
            allowed += usize::from(t.await.unwrap() == Outcome::Allowed);
        }
    }
    (sent, allowed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distinct_key_flood_never_restores_an_exhausted_victim() {
    let store = RedisBackend::new(server().url())
        .prefix(prefix("flood"))
        .timeout(Duration::from_secs(3))
        .build(&[limit(
            "per-client",
            Quota::per_hour(3),
            AlgorithmKind::FixedWindow,
            CLOSED,
        )])
        .unwrap();
    for _ in 0..3 {
        assert_eq!(outcome(&store, "victim").await, Outcome::Allowed);
    }
    assert_eq!(outcome(&store, "victim").await, Outcome::Rejected);
    let (sent, allowed) = flood(&store, "attacker", 20_000, 256, || false).await;
    assert_eq!(allowed, sent, "each fresh key is admitted once");
    let mut regained = 0;
    for _ in 0..5 {
        regained += usize::from(outcome(&store, "victim").await == Outcome::Allowed);
    }
    println!("flood (no maxmemory): {sent} distinct keys; victim regained {regained} of 3");
    assert_eq!(
        regained, 0,
        "a flood must never restore the victim's budget"
    );
    assert_eq!(store.stats().errors(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_under_noeviction_fails_closed_and_restores_nothing() {
    let server =
        RedisServer::start_with(&["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]);
    let stats;
    let store = {
        let backend = RedisBackend::new(server.url())
            .prefix(prefix("oom"))
            .timeout(Duration::from_secs(3))
            .breaker_threshold(1_000_000);
        stats = backend.stats();
        backend
            .build(&[limit(
                "per-client",
                Quota::per_hour(3),
                AlgorithmKind::TokenBucket,
                CLOSED,
            )])
            .unwrap()
    };
    for _ in 0..3 {
        assert_eq!(outcome(&store, "victim").await, Outcome::Allowed);
    }
    assert_eq!(outcome(&store, "victim").await, Outcome::Rejected);
    // Flood until Redis refuses writes (bounded: 100 000 keys).
    let errors = stats.clone();
    let (sent, _) = flood(&store, "attacker", 100_000, 256, move || {
        errors.errors() > 0
    })
    .await;
    assert!(
        stats.errors() > 0,
        "Redis ran out of memory within {sent} keys"
    );
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        outcomes.push(outcome(&store, "victim").await);
    }
    let regained = outcomes.iter().filter(|o| **o == Outcome::Allowed).count();
    println!(
        "flood (maxmemory 3mb, noeviction): Redis refused writes after {sent} distinct keys; victim regained {regained} (outcomes {outcomes:?}); fail_closed {}",
        stats.fail_closed()
    );
    assert_eq!(regained, 0, "out of memory fails closed, never open");
    assert_eq!(stats.maxmemory_policy(), Some("noeviction"));
}

// Current-thread: the warm-up task that reads the policy runs on this thread, under the
// subscriber set below.
#[tokio::test]
async fn an_evicting_maxmemory_policy_is_reported_and_logged() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let logs = Capture::default();
    let _guard = tracing::subscriber::set_default(logs.clone());
    let store = RedisBackend::new(server.url())
        .prefix(prefix("lru"))
        .timeout(Duration::from_secs(3))
        .build(&[limit(
            "p",
            Quota::per_hour(3),
            AlgorithmKind::TokenBucket,
            CLOSED,
        )])
        .unwrap();
    let deadline = Instant::now() + HANG_GUARD;
    while store.stats().maxmemory_policy().is_none() {
        assert!(Instant::now() < deadline, "maxmemory-policy never read");
        let _ = one(&store, "k", 1).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.stats().maxmemory_policy(), Some("allkeys-lru"));
    let text = logs.text();
    assert!(
        text.contains("maxmemory_policy=allkeys-lru") && text.contains("evict"),
        "a warning names the policy: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_under_2000_concurrent_requests_hangs_nothing_and_admits_nothing_extra() {
    // The resident set is the process's: measured alone, in a child process.
    if run_alone(
        "attack_redis::a_slow_redis_under_2000_concurrent_requests_hangs_nothing_and_admits_nothing_extra",
    )
    .is_some()
    {
        return;
    }
    let server = RedisServer::start();
    let store = RedisBackend::new(server.url())
        .prefix(prefix("slow"))
        .timeout(Duration::from_millis(20))
        .probe_interval(Duration::from_millis(50))
        .build(&[limit(
            "hot",
            Quota::per_hour(50),
            AlgorithmKind::SlidingWindow,
            CLOSED,
        )])
        .unwrap();
    // Warm: connected and the script loaded.
    let deadline = Instant::now() + HANG_GUARD;
    while outcome(&store, "warm").await != Outcome::Allowed {
        assert!(Instant::now() < deadline, "redis never answered");
    }
    let rss_before = rss_kib();
    let mut allowed = 0;
    let mut worst = Duration::ZERO;
    for stall in ["DEBUG SLEEP", "SIGSTOP"] {
        let sleeper = match stall {
            "DEBUG SLEEP" => {
                let mut conn = server.conn();
                Some(std::thread::spawn(move || {
                    let _: () = redis::cmd("DEBUG")
                        .arg("SLEEP")
                        .arg("1")
                        .query(&mut conn)
                        .unwrap();
                }))
            }
            _ => {
                server.pause();
                None
            }
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let tasks: Vec<_> = (0..2_000)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    (outcome(&store, "hot").await, t.elapsed())
                })
            })
            .collect();
        let mut latencies = Vec::with_capacity(tasks.len());
        let mut outcomes = [0usize; 3];
        for t in tasks {
            let (o, d) = t.await.unwrap();
            outcomes[o as usize] += 1;
            latencies.push(d);
        }
        let wall = started.elapsed();
        if stall == "SIGSTOP" {
            tokio::time::sleep(Duration::from_millis(500)).await;
            server.resume();
        }
        if let Some(s) = sleeper {
            s.join().unwrap();
        }
        latencies.sort();
        let p = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        worst = worst.max(p(1.0));
        allowed += outcomes[0];
        println!(
            "{stall}: 2000 concurrent requests in {wall:?}; allowed {} rejected {} failed {}; latency p50 {:?} p99 {:?} max {:?}",
            outcomes[0], outcomes[1], outcomes[2], p(0.5), p(0.99), p(1.0)
        );
    }
    // After the stall: decided by Redis again, and never beyond the limit.
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let o = outcome(&store, "hot").await;
        allowed += usize::from(o == Outcome::Allowed);
        if o != Outcome::Failed {
            break;
        }
        assert!(Instant::now() < deadline, "redis never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rss_after = rss_kib();
    println!(
        "slow redis: RSS {rss_before} KiB before, {rss_after} KiB after; worst latency {worst:?}; stats {:?}",
        store.stats()
    );
    assert!(allowed <= 50, "admitted {allowed} against a limit of 50");
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_cluster_master_only_short_circuits_the_keys_it_serves() {
    let cluster = RedisCluster::start();
    let store = RedisBackend::cluster(cluster.urls())
        .prefix(prefix("dead-master"))
        .timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .breaker_threshold(3)
        .probe_interval(Duration::from_millis(100))
        .build(&[limit(
            "per-client",
            Quota::per_hour(3),
            AlgorithmKind::FixedWindow,
            CLOSED,
        )])
        .unwrap();
    let dead_port = cluster.nodes[0].port();
    let (mut on_dead, mut healthy) = (Vec::new(), Vec::new());
    for i in 0.. {
        let client = format!("client-{i}");
        let key = store.redis_key(0, &Key::string(client.clone())).unwrap();
        if cluster.node_for(&key).port() == dead_port {
            on_dead.push(client);
        } else {
            healthy.push(client);
        }
        if on_dead.len() >= 4 && healthy.len() >= 6 {
            break;
        }
    }
    // One admission each while every master is up (this also loads the slot map).
    for c in on_dead.iter().chain(&healthy) {
        let deadline = Instant::now() + HANG_GUARD;
        while outcome(&store, c).await != Outcome::Allowed {
            assert!(Instant::now() < deadline, "the cluster never answered");
        }
    }
    cluster.nodes[0].pause();
    for c in on_dead.iter().cycle().take(6) {
        assert_eq!(
            outcome(&store, c).await,
            Outcome::Failed,
            "{c} lives on the dead master"
        );
    }
    let stats = store.stats();
    assert_eq!(stats.open_breakers(), 1, "{stats:?}");
    // Keys on the healthy masters are still decided by Redis: 2 more admissions each, then no.
    for c in &healthy {
        let got: Vec<Outcome> = {
            let mut v = Vec::new();
            for _ in 0..3 {
                v.push(outcome(&store, c).await);
            }
            v
        };
        assert_eq!(
            got,
            [Outcome::Allowed, Outcome::Allowed, Outcome::Rejected],
            "{c} lives on a healthy master; {stats:?}"
        );
    }
    // The dead master's keys fail fast (short-circuited) while its breaker is open.
    let short = stats.short_circuited();
    assert_eq!(outcome(&store, &on_dead[0]).await, Outcome::Failed);
    assert!(stats.short_circuited() > short, "{stats:?}");
    cluster.nodes[0].resume();
    let deadline = Instant::now() + HANG_GUARD;
    while stats.breaker_open() {
        assert!(Instant::now() < deadline, "the breaker never closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Back: decided by Redis, with the state it had (1 admission spent).
    assert_eq!(outcome(&store, &on_dead[1]).await, Outcome::Allowed);
    println!("dead master: {stats:?}");
}

#[test]
fn hostile_limit_names_and_keys_never_panic_or_leak_client_keys() {
    let server = server();
    let logs = Capture::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let names = ["a b", "ünï{cödé}", "%41\r\n", "x}{y", &"n".repeat(20)];
    let limits: Vec<LimitSpec> = names
        .iter()
        .map(|n| limit(n, Quota::per_hour(2), AlgorithmKind::Gcra, CLOSED))
        .collect();
    let prefix = prefix("hostile");
    let secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";
    let store = tracing::subscriber::with_default(logs.clone(), || {
        RedisBackend::new(server.url())
            .prefix(prefix.clone())
            .hash_secret("instance secret")
            .timeout(Duration::from_secs(3))
            .build(&limits)
            .unwrap()
    });
    let keys: Vec<Vec<u8>> = vec![
        secret.as_bytes().to_vec(),
        b"{victim}".to_vec(),
        b"\r\n*1\r\n$8\r\nFLUSHALL\r\n".to_vec(),
        vec![0, 255, b'{', 128],
        vec![b'x'; 1 << 20],
    ];
    tracing::subscriber::with_default(logs.clone(), || {
        rt.block_on(async {
            for k in &keys {
                let checks: Vec<LimitCheck<'_>> = (0..names.len())
                    .map(|limit| LimitCheck::new(limit, Key::bytes(&k[..]), 1))
                    .collect();
                for expect in [true, true, false] {
                    let d = decide(&store, &checks).await.expect("decided");
                    assert_eq!(d.allowed(), expect);
                }
            }
            // Corrupt the secret client's state: the reset is logged, without the key. Tests on
            // other threads with other subscribers may have cached this callsite's interest while
            // this one was being registered: recompute it, so the warning reaches `logs`.
            tracing::callsite::rebuild_interest_cache();
            let key = store.redis_key(0, &Key::bytes(secret.as_bytes())).unwrap();
            let _: () = server.cmd(&["SET", &key, "garbage"]);
            let checks = [LimitCheck::new(0, Key::bytes(secret.as_bytes()), 1)];
            decide(&store, &checks).await.expect("decided");
            assert_eq!(store.stats().corrupt_resets(), 1);
        })
    });
    let stored: Vec<String> = server.cmd(&["KEYS", &format!("{prefix}:*")]);
    assert_eq!(stored.len(), names.len() * keys.len(), "{stored:?}");
    for k in &stored {
        assert!(
            !k.contains("sk_live"),
            "a client key in clear in Redis: {k}"
        );
        assert!(!k.contains("victim"), "{k}");
        assert!(
            k.bytes().all(|b| b.is_ascii_graphic()) && k.len() < 256,
            "{k:?}"
        );
    }
    let text = logs.text();
    assert!(
        text.contains("unreadable state"),
        "the reset was logged: {text}"
    );
    assert!(
        !text.contains("sk_live"),
        "a client key in clear in the logs: {text}"
    );
}

#[test]
fn switching_runtimes_never_turns_limiting_off() {
    for batching in [true, false] {
        let stats;
        let store = {
            let backend = RedisBackend::new(server().url())
                .prefix(prefix("runtimes"))
                .timeout(Duration::from_secs(3))
                .batching(batching);
            stats = backend.stats();
            backend
                .build(&[limit(
                    "per-hour",
                    Quota::per_hour(3),
                    AlgorithmKind::FixedWindow,
                    FailurePolicy::Open,
                )])
                .unwrap()
        };
        let current = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let run = |rt: &tokio::runtime::Runtime, n: usize| {
            rt.block_on(async {
                let mut allowed = 0;
                for _ in 0..n {
                    allowed += usize::from(outcome(&store, "client").await == Outcome::Allowed);
                }
                allowed
            })
        };
        // First used on one runtime, which then stays alive but idle.
        let first = current();
        assert_eq!(run(&first, 2), 2);
        // A second runtime while the first is idle: its tasks are not running.
        let second = current();
        assert_eq!(
            run(&second, 4),
            1,
            "batching {batching}: 3 per hour, 2 spent"
        );
        // The first runtime is dropped under the store; a multi-thread runtime takes over.
        drop(first);
        let third = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        assert_eq!(run(&third, 3), 0);
        drop(second);
        drop(third);
        let fourth = current();
        assert_eq!(run(&fourth, 3), 0);
        assert_eq!(
            (stats.fail_open(), stats.errors()),
            (0, 0),
            "batching {batching}: every request was decided by Redis; {stats:?}"
        );
        assert!(stats.reconnects() >= 3, "{stats:?}");
    }
}

#[test]
fn the_sliding_log_at_its_redis_cap_is_bounded_and_cheap_to_reject() {
    let server = server();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let hour = 3_600_000_000u64;
    clock.set_micros(10 * hour);
    let cap = MAX_SLIDING_LOG;
    let store = RedisBackend::new(server.url())
        .prefix(prefix("log-cap"))
        .clock(clock.clone())
        .timeout(Duration::from_secs(3))
        .build(&[limit(
            "log",
            Quota::per_hour(cap),
            AlgorithmKind::SlidingLog,
            CLOSED,
        )])
        .unwrap();
    let key = store.redis_key(0, &Key::string("heavy")).unwrap();
    let evalsha_usec = || -> (f64, f64) {
        let info: String = server.cmd(&["INFO", "commandstats"]);
        let line = info
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .unwrap_or("cmdstat_evalsha:calls=0,usec=0");
        let field = |name: &str| -> f64 {
            line.split([':', ','])
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        (field("calls"), field("usec"))
    };
    rt.block_on(async {
        // Fill the log: one admission per µs, `cap` entries.
        for _ in 0..cap {
            assert!(one(&store, "heavy", 1).await.unwrap().allowed());
            clock.advance(Duration::from_micros(1));
        }
        let size: i64 = server.cmd(&["STRLEN", &key]);
        assert_eq!(size as u64, 24 + 16 * cap, "header + one entry per admission");
        // Rejections at the cap.
        let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
        let n = 2_000;
        for _ in 0..n {
            assert!(!one(&store, "heavy", 1).await.unwrap().allowed());
        }
        let (calls, usec) = evalsha_usec();
        assert!(calls >= n as f64);
        let rejected = usec / calls;
        // Steady state at the cap: each request one hour after an admission, so one entry
        // leaves and one is admitted.
        clock.set_micros(11 * hour);
        let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
        for _ in 0..cap {
            assert!(one(&store, "heavy", 1).await.unwrap().allowed());
            clock.advance(Duration::from_micros(1));
        }
        let (calls, usec) = evalsha_usec();
        let admitted = usec / calls;
        let size: i64 = server.cmd(&["STRLEN", &key]);
        assert!(
            size as u64 <= 24 + 16 * (2 * cap + 64),
            "{size} bytes: at most the live entries and as many dropped ones"
        );
        // The baseline: a fixed window's rejection, the smallest state there is.
        let fixed = RedisBackend::new(server.url())
            .prefix(prefix("log-cap-baseline"))
            .clock(clock.clone())
            .timeout(Duration::from_secs(3))
            .build(&[limit(
                "fixed",
                Quota::per_hour(1),
                AlgorithmKind::FixedWindow,
                CLOSED,
            )])
            .unwrap();
        assert!(one(&fixed, "light", 1).await.unwrap().allowed());
        let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
        for _ in 0..n {
            assert!(!one(&fixed, "light", 1).await.unwrap().allowed());
        }
        let (calls, usec) = evalsha_usec();
        let baseline = usec / calls;
        println!(
            "sliding log at its Redis cap ({cap}): {rejected:.1} µs of Redis time per rejected request, {admitted:.1} µs per admitted request; a fixed window's rejection: {baseline:.1} µs (INFO commandstats)"
        );
    });
}

/// A minimal `tracing` subscriber that keeps every event's fields as text.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<String>>);

impl Capture {
    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
}

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let mut text = self.0.lock().unwrap();
        text.push_str(&fields.0);
        text.push('\n');
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
