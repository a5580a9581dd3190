//! The Redis store behind Sentinel (`RedisBackend::sentinel`), against a primary, one replica
//! and three Sentinels (`down-after-milliseconds 1000`) the harness starts on loopback: every
//! algorithm decides through the Sentinels exactly as on the node itself, two stores share one
//! limit, a real failover under load, a stalled primary (SIGSTOP) left once the Sentinels
//! promote the replica, the known primary kept while the Sentinels go away, and calls bounded by
//! the store's timeout rather than the connect timeout (each states its bound).
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
//! The failover is `tests/harness/sentinel_failover.rs` (`benches/failover.rs` reports its figures
//! over several runs). `cargo test --all-features --test redis -- redis_sentinel --nocapture`
//! prints the figures: when the replica was promoted and the Sentinels switched, time to decide
//! again, decisions lost, and the replication lag seen just before the kill.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, LimitCheck};
use tollgate::Quota;

use crate::harness::redis_sentinel::{RedisSentinel, MASTER};
use crate::harness::sentinel_failover::{
    counter, instance, kill_the_primary_under_load, STORE_TIMEOUT,
};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_behind_the_sentinels_share_one_limit() {
    let set = shared();
    let limits = [counter("shared", 50)];
    let prefix = prefix("sentinel-shared");
    let a = instance(set, &prefix, &limits);
    let b = instance(set, &prefix, &limits);
    assert_eq!(admitted_together([&a, &b], 0, "one-key").await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_is_followed_within_10s_and_the_limit_stays_shared() {
    let f = kill_the_primary_under_load(&[counter("fresh", 50)]).await;
    let (set, stores, promoted) = (&f.set, &f.stores, f.promoted);
    let (total, lost) = (f.admitted_before_kill, f.lost);

    // The limit is shared through the promoted replica.
    let closed_before: u64 = stores.iter().map(|s| s.stats().fail_closed()).sum();
    let fresh = admitted_together([&stores[0], &stores[1]], 1, "fresh-after-failover").await;
    let closed = stores.iter().map(|s| s.stats().fail_closed()).sum::<u64>() - closed_before;
    let fresh_key = stores[0]
        .redis_key(1, &Key::string("fresh-after-failover"))
        .unwrap();
    let on_promoted: i64 = set.cmd(set.node(promoted), &["EXISTS", &fresh_key]);

    println!(
        "sentinel failover: replica promoted {:?}, sentinels switched {:?} after the kill; \
         stores decided again after {:?}; {} decisions admitted ({total} before the kill), \
         {lost} lost ({:.3} % of those before the kill), {} written but unanswered; replication \
         lag before the kill at most {} bytes; fresh key: {fresh} of 50 admitted, {closed} by \
         the failure policy",
        f.replica_promoted,
        f.sentinels_switched,
        f.decided_again,
        f.admitted,
        100.0 * lost as f64 / total.max(1) as f64,
        f.unanswered,
        f.lag_bytes,
    );
    assert!(
        f.replica_promoted.is_some(),
        "the replica never became a master"
    );
    for (s, at) in f.decided_again.iter().enumerate() {
        let at = at.unwrap_or_else(|| panic!("store {s} never decided again"));
        assert!(
            at <= Duration::from_secs(10),
            "store {s} decided again {at:?} after the kill"
        );
    }
    assert!(total > 0, "the load admitted decisions before the kill");
    assert!(
        lost * 50 <= total,
        "lost {lost} of the {total} decisions admitted before the kill (more than 2 %)"
    );
    assert!(fresh <= 50, "{fresh} admitted on a limit of 50");
    assert!(
        fresh + closed >= 50,
        "{fresh} admitted, {closed} decided by the failure policy"
    );
    assert_eq!(on_promoted, 1, "the fresh key lives on the promoted node");
    for store in stores {
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

/// What sequential checks on one key decided over a span of time.
#[derive(Debug, Default)]
struct Span {
    /// Checks decided by Redis.
    decided: u32,
    /// Checks Redis did not decide (the failure policy did).
    failed: u32,
    /// The slowest check.
    slowest: Duration,
    /// Checks whose `remaining` was not one less than the check before (another node's state).
    inconsistent: u32,
    /// The last `remaining` Redis answered.
    remaining: Option<u64>,
}

/// Checks `key` one after another for `span` (a 5 ms pause between two), from `remaining` on.
async fn check_for(store: &RedisStore, key: &str, span: Duration, remaining: Option<u64>) -> Span {
    let mut out = Span {
        remaining,
        ..Span::default()
    };
    let end = Instant::now() + span;
    while Instant::now() < end {
        let start = Instant::now();
        let result = one(store, key, 1).await;
        out.slowest = out.slowest.max(start.elapsed());
        match result {
            Ok(d) => {
                out.decided += 1;
                if out.remaining.is_some_and(|r| d.remaining() + 1 != r) {
                    out.inconsistent += 1;
                }
                out.remaining = Some(d.remaining());
            }
            Err(_) => out.failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    out
}

/// The Sentinels go away while the primary stays up: first the one the store's `+switch-master`
/// subscription is on, then all of them. The store keeps the primary it knows: for 1.5 s after
/// each kill every check is decided by Redis (none by the failure policy, none slower than the
/// store's 250 ms timeout), on the same node (`remaining` counts down by one, no reconnect).
/// Once the Sentinels are back, the store subscribes again within 10 s (its backoff tops out at
/// 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_known_primary_is_kept_while_the_sentinels_go_away() {
    let mut set = RedisSentinel::start(1);
    let store = instance(&set, &prefix("sentinel-gone"), &[counter("gone", 100_000)]);
    let first = one(&store, "k", 1).await.unwrap().remaining();
    let mut on = Vec::new();
    tokio::task::block_in_place(|| {
        set.wait(Duration::from_secs(10), "the store's subscription", |s| {
            on = s.subscribed_sentinels();
            !on.is_empty()
        })
    });
    let on = on[0];
    tokio::task::block_in_place(|| set.sentinels[on].kill());
    let one_gone = check_for(&store, "k", Duration::from_millis(1500), Some(first)).await;
    tokio::task::block_in_place(|| {
        for (i, s) in set.sentinels.iter_mut().enumerate() {
            if i != on {
                s.kill();
            }
        }
    });
    let all_gone = check_for(&store, "k", Duration::from_millis(1500), one_gone.remaining).await;
    println!(
        "sentinels gone: subscribed on sentinel {on}; after killing it {one_gone:?}; after \
         killing all {all_gone:?}; {:?}",
        store.stats()
    );
    for (what, span) in [("one sentinel", &one_gone), ("every sentinel", &all_gone)] {
        assert!(span.decided > 10, "{what} gone: {span:?}");
        assert_eq!(span.failed, 0, "{what} gone: checks failed: {span:?}");
        assert_eq!(span.inconsistent, 0, "{what} gone: {span:?}");
        assert!(
            span.slowest < STORE_TIMEOUT,
            "{what} gone: a check took {:?}",
            span.slowest
        );
    }
    assert_eq!(store.stats().reconnects(), 0, "the primary was kept");

    let back = Instant::now();
    tokio::task::block_in_place(|| {
        for s in &mut set.sentinels {
            s.restart();
        }
        set.wait(Duration::from_secs(10), "a new subscription", |s| {
            !s.subscribed_sentinels().is_empty()
        });
    });
    println!(
        "sentinels back: subscribed again {:?} after the restart",
        back.elapsed()
    );
    assert!(one(&store, "k", 1).await.unwrap().allowed());
}

/// The primary stops answering (SIGSTOP: calls time out, nothing errors) and the Sentinels
/// promote the replica (down-after 1000 ms). The store logs in to the Sentinels as a user that
/// may subscribe to no channel, so it never hears `+switch-master`: only its timeouts make it
/// ask the Sentinels again (at most every 200 ms). It decides by Redis within **5 s** of the
/// replica answering `ROLE` as a master (typically about 1 s: a Sentinel names the promoted
/// replica once its next `INFO`, up to 1 s later, shows the promotion), with the key's state.
/// Once the old primary runs again (SIGCONT; it still calls itself a master until the Sentinels
/// demote it), the store sends it nothing: its script calls stay as they were while the store
/// decides for 1 s on the promoted node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_primary_is_left_once_the_sentinels_promote_the_replica() {
    let set = RedisSentinel::start(1);
    set.add_user_without_channels("deaf", "deaf-pw");
    let store = sentinel_backend(&set)
        .sentinel_credentials("deaf", "deaf-pw")
        .prefix(prefix("sentinel-stall"))
        .timeout(STORE_TIMEOUT)
        .probe_interval(Duration::from_millis(100))
        .build(&[counter("stall", 1000)])
        .unwrap();
    let mut remaining = 0;
    for _ in 0..5 {
        remaining = one(&store, "k", 1).await.unwrap().remaining();
    }
    let old = set.primary().port();
    let replica = set.nodes.iter().find(|n| n.port() != old).unwrap().url();
    // Let the replica hold every write before the primary stops.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let paused = Instant::now();
    let promoted = std::thread::spawn(move || {
        let client = redis::Client::open(replica).unwrap();
        while paused.elapsed() < Duration::from_secs(15) {
            let role = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut c| redis::cmd("ROLE").query::<Vec<redis::Value>>(&mut c));
            if role.is_ok_and(|r| r.first() == Some(&redis::Value::BulkString(b"master".to_vec())))
            {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    });
    set.node(old).pause();
    let decided = loop {
        if let Ok(d) = one(&store, "k", 1).await {
            break d;
        }
        assert!(
            paused.elapsed() < Duration::from_secs(15),
            "no decision 15 s after the primary stopped: {:?}",
            store.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let decided_at = Instant::now();
    let promoted = promoted
        .join()
        .unwrap()
        .expect("the replica was promoted within 15 s");
    let after_promotion = decided_at.saturating_duration_since(promoted);

    set.node(old).resume();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls_before = tokio::task::block_in_place(|| set.script_calls(set.node(old)));
    let resumed = check_for(
        &store,
        "k",
        Duration::from_secs(1),
        Some(decided.remaining()),
    )
    .await;
    let calls_after = tokio::task::block_in_place(|| set.script_calls(set.node(old)));
    let subscribed = tokio::task::block_in_place(|| set.subscribed_sentinels());
    println!(
        "stalled primary: replica promoted {:?} after SIGSTOP, store decided again {:?} after \
         the promotion ({:?} after SIGSTOP; remaining {remaining} -> {}); after SIGCONT {resumed:?}, \
         script calls on the old primary {calls_before} -> {calls_after}; {:?}",
        promoted - paused,
        after_promotion,
        decided_at - paused,
        decided.remaining(),
        store.stats()
    );
    assert!(
        after_promotion <= Duration::from_secs(5),
        "decided again {after_promotion:?} after the promotion"
    );
    assert!(
        decided.remaining() < remaining,
        "the promoted node holds the key's state"
    );
    assert_eq!(
        calls_after, calls_before,
        "the old primary was sent script calls after it ran again"
    );
    assert!(subscribed.is_empty(), "the store heard no announcement");
    assert!(resumed.decided > 10, "{resumed:?}");
    assert_eq!(
        (resumed.failed, resumed.inconsistent),
        (0, 0),
        "{resumed:?}"
    );
}

/// The primary's calls are bounded by the store's timeout, not the connect timeout. With a
/// timeout (2 s) longer than the connect timeout (100 ms), a primary that stalls 400 ms
/// (`CLIENT PAUSE`) still decides. With a timeout (150 ms) shorter than the connect timeout
/// (3 s), a primary that stalls 700 ms has the check decided by the failure policy within
/// **600 ms** (the 150 ms timeout plus slack for a loaded machine), then decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_the_primary_take_the_store_timeout_not_the_connect_timeout() {
    let set = RedisSentinel::start(0);
    let store = |timeout: Duration, connect: Duration| {
        sentinel_backend(&set)
            .prefix(prefix("sentinel-timeouts"))
            .timeout(timeout)
            .connect_timeout(connect)
            .build(&[counter("t", 1000)])
            .unwrap()
    };
    let primary = set.primary();
    let stall = |ms: &str| {
        let _: () =
            tokio::task::block_in_place(|| set.cmd(primary, &["CLIENT", "PAUSE", ms, "ALL"]));
        Instant::now()
    };

    let patient = store(Duration::from_secs(2), Duration::from_millis(100));
    one(&patient, "k", 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = stall("400");
    let slow = one(&patient, "k", 1).await;
    let slow_took = start.elapsed();

    tokio::time::sleep(Duration::from_millis(500)).await;
    let tight = store(Duration::from_millis(150), Duration::from_secs(3));
    one(&tight, "k", 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = stall("700");
    let stalled = one(&tight, "k", 1).await;
    let stalled_took = start.elapsed();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let again = one(&tight, "k", 1).await;
    println!(
        "response timeouts: a 400 ms stall with a 2 s timeout answered {:?} after {slow_took:?}; \
         a 700 ms stall with a 150 ms timeout answered {:?} after {stalled_took:?}",
        slow.as_ref().map(|d| d.remaining()),
        stalled.as_ref().map(|d| d.remaining()),
    );
    assert!(
        slow.is_ok(),
        "a primary slower than the connect timeout but within the store's timeout decides: {slow:?}"
    );
    assert!(slow_took >= Duration::from_millis(300), "{slow_took:?}");
    assert!(stalled.is_err(), "{stalled:?}");
    assert!(
        stalled_took < Duration::from_millis(600),
        "a stalled primary answered after {stalled_took:?} (timeout 150 ms, connect timeout 3 s)"
    );
    assert!(again.is_ok(), "{again:?}");
}
