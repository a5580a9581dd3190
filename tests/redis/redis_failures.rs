//! Redis failing under the limiter: killed mid-traffic, restarted, paused with SIGSTOP, its script
//! cache flushed. Every request is answered by its limit's failure policy within the timeout
//! plus a small margin, the circuit breaker stops paying the timeout, and decisions come back from
//! Redis without a new store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{memory::MemoryBackend, Backend, FailurePolicy, LimitCheck, LimitSpec};
use tollgate::{Name, Quota, StoreErrorKind};

use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{decide, one, prefix};

const TIMEOUT: Duration = Duration::from_millis(25);
/// Scheduling slack on a busy 2-core machine running debug builds.
const MARGIN: Duration = Duration::from_millis(40);

fn limit(policy: FailurePolicy, quota: Quota) -> LimitSpec {
    LimitSpec::new(Name::new("burst"), quota, AlgorithmKind::TokenBucket).on_store_error(policy)
}

fn store(url: &str, policy: FailurePolicy) -> RedisStore {
    store_with(url, policy, Quota::per_second(1).burst(10))
}

fn store_with(url: &str, policy: FailurePolicy, quota: Quota) -> RedisStore {
    RedisBackend::new(url)
        .prefix(prefix("fail"))
        .timeout(TIMEOUT)
        .breaker_threshold(3)
        .probe_interval(Duration::from_millis(50))
        .build(&[limit(policy, quota)])
        .unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Rejected,
    Closed,
}

async fn timed(store: &RedisStore, key: &str) -> (Duration, Outcome) {
    let start = Instant::now();
    let r = one(store, key, 1).await;
    let elapsed = start.elapsed();
    let outcome = match r {
        Ok(d) if d.allowed() => Outcome::Allowed,
        Ok(_) => Outcome::Rejected,
        Err(e) => {
            assert_eq!(e.retry_after(), Some(Duration::from_secs(2)), "{e}");
            Outcome::Closed
        }
    };
    (elapsed, outcome)
}

/// The first call connects and loads the script; on a busy machine that can exceed the tight
/// timeout, so wait until Redis decides.
async fn warm(store: &RedisStore, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while timed(store, key).await.1 != Outcome::Allowed {
        assert!(Instant::now() < deadline, "redis never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = store.stats();
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats.breaker_open() {
        assert!(Instant::now() < deadline, "breaker stayed open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_traffic_then_restarted() {
    let mut server = RedisServer::start();
    let url = server.url();
    // Open and closed limits large enough that Redis never rejects; the local one small enough
    // that its share runs out during the outage.
    let big = Quota::per_second(1000).burst(1000);
    let open = Arc::new(store_with(&url, FailurePolicy::Open, big));
    let closed = Arc::new(store_with(
        &url,
        FailurePolicy::Closed {
            retry_after: Duration::from_secs(2),
        },
        big,
    ));
    let local_clock = ManualClock::new();
    let local = Arc::new(
        RedisBackend::new(&url)
            .prefix(prefix("fail"))
            .timeout(TIMEOUT)
            .breaker_threshold(3)
            .probe_interval(Duration::from_millis(50))
            .local_fallback(MemoryBackend::new().clock(local_clock.clone()))
            .build(&[limit(
                FailurePolicy::Local { share: 0.5 },
                Quota::per_second(1).burst(10),
            )])
            .unwrap(),
    );
    // Healthy: Redis decides.
    for s in [&open, &closed, &local] {
        warm(s, "warm").await;
    }
    assert_eq!(server.cmd::<i64>(&["DBSIZE"]), 3);

    // Traffic on all three stores while Redis is killed.
    let t0 = Instant::now();
    let traffic = |s: Arc<RedisStore>| {
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while t0.elapsed() < Duration::from_millis(600) {
                let at = t0.elapsed();
                let (took, outcome) = timed(&s, "k").await;
                seen.push((at, took, outcome));
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            seen
        })
    };
    let tasks = [
        traffic(open.clone()),
        traffic(closed.clone()),
        traffic(local.clone()),
    ];
    tokio::time::sleep(Duration::from_millis(150)).await;
    server.kill();
    let killed = t0.elapsed();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    for (name, seen) in ["open", "closed", "local"].iter().zip(&results) {
        let worst = seen.iter().map(|(_, took, _)| *took).max().unwrap();
        assert!(
            worst <= TIMEOUT + MARGIN,
            "{name}: a request took {worst:?}"
        );
        assert!(seen.len() > 20, "{name}: only {} requests", seen.len());
    }
    let after_kill = |i: usize| -> Vec<Outcome> {
        results[i]
            .iter()
            .filter(|(at, _, _)| *at > killed)
            .map(|(_, _, o)| *o)
            .collect()
    };
    // Open: everything passed. Closed: refused once Redis was gone. Local: the local share (5 of
    // the burst of 10, refilling at 1/s scaled to at least 1/s), then rejections.
    assert!(results[0].iter().all(|(_, _, o)| *o == Outcome::Allowed));
    assert!(open.stats().fail_open() > 0);
    let closed_after = after_kill(1);
    assert!(
        !closed_after.is_empty() && closed_after.iter().all(|o| *o == Outcome::Closed),
        "{closed_after:?}"
    );
    assert!(closed.stats().fail_closed() > 0);
    // Redis admitted its burst of 10 before the kill; the local limiter then held half of it.
    let local_all: Vec<Outcome> = results[2].iter().map(|(_, _, o)| *o).collect();
    let admitted = local_all.iter().filter(|o| **o == Outcome::Allowed).count();
    assert_eq!(admitted, 10 + 5, "{local_all:?}");
    let local_after = after_kill(2);
    assert!(
        local_after
            .iter()
            .filter(|o| **o == Outcome::Allowed)
            .count()
            <= 5
    );
    assert!(local_after.iter().all(|o| *o != Outcome::Closed));
    assert!(local.stats().local_fallback() >= local_after.len() as u64);
    for s in [&open, &closed, &local] {
        let stats = s.stats();
        assert!(stats.breaker_trips() >= 1, "{stats:?}");
        assert!(
            stats.short_circuited() > 0,
            "the open breaker skipped Redis: {stats:?}"
        );
    }

    // Restarted (empty): the same stores decide with Redis again, no restart of the app.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, o) = timed(&closed, "after-restart").await;
        if o == Outcome::Allowed {
            break;
        }
        assert!(Instant::now() < deadline, "closed store never recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for s in [&open, &local] {
        let deadline = Instant::now() + Duration::from_secs(5);
        while s.stats().breaker_open() {
            assert!(Instant::now() < deadline, "breaker stayed open");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(timed(s, "after-restart").await.1, Outcome::Allowed);
    }
    // Those three decisions were made by Redis: their keys are there.
    assert_eq!(server.cmd::<i64>(&["DBSIZE"]), 3);
    let before = open.stats().fail_open();
    for _ in 0..12 {
        timed(&open, "fresh").await;
    }
    assert_eq!(
        open.stats().fail_open(),
        before,
        "no fallback once recovered"
    );
    assert_eq!(
        server.cmd::<i64>(&["DBSIZE"]),
        4,
        "the new key lives in Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_the_timeout_holds_and_the_breaker_stops_paying_it() {
    let server = RedisServer::start();
    let s = store(
        &server.url(),
        FailurePolicy::Closed {
            retry_after: Duration::from_secs(2),
        },
    );
    warm(&s, "warm").await;
    let base = s.stats();
    let (timeouts, short) = (base.timeouts(), base.short_circuited());
    server.pause();
    let mut seen = Vec::new();
    for _ in 0..10 {
        seen.push(timed(&s, "k").await);
    }
    server.resume();
    for (i, (d, o)) in seen.iter().enumerate() {
        assert_eq!(*o, Outcome::Closed, "request {i}");
        assert!(*d <= TIMEOUT + MARGIN, "request {i} took {d:?}");
    }
    // The first three paid the timeout and opened the breaker; the rest did not wait.
    for (d, _) in &seen[..3] {
        assert!(*d >= TIMEOUT, "{d:?}");
    }
    for (d, _) in &seen[3..] {
        // Well under the timeout the first three paid (typically microseconds).
        assert!(*d < TIMEOUT, "short-circuited request took {d:?}");
    }
    let stats = s.stats();
    assert_eq!(stats.timeouts() - timeouts, 3, "{stats:?}");
    assert_eq!(stats.short_circuited() - short, 7, "{stats:?}");
    // Resumed: the background probe closes the breaker and Redis decides again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats.breaker_open() {
        assert!(
            Instant::now() < deadline,
            "breaker stayed open after SIGCONT"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(timed(&s, "k2").await.1, Outcome::Allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_recovers_with_eval() {
    let server = RedisServer::start();
    let s = RedisBackend::new(server.url())
        .timeout(Duration::from_secs(2))
        .build(&[limit(
            FailurePolicy::Closed {
                retry_after: Duration::from_secs(2),
            },
            Quota::per_second(1).burst(10),
        )])
        .unwrap();
    for round in 0..3 {
        let d = one(&s, "k", 1).await.expect("decided");
        assert!(d.allowed());
        assert_eq!(d.remaining(), 9 - round);
        let flushed: String = server.cmd(&["SCRIPT", "FLUSH"]);
        assert_eq!(flushed, "OK");
    }
    assert_eq!(s.stats().errors(), 0, "NOSCRIPT is handled, not an error");
}

/// With mixed policies, the strictest wins: one fail-closed limit refuses the request, and the
/// open limit beside it is counted as let through only when nothing refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_policies_when_redis_is_unreachable() {
    // Nothing listens on this port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let limits = [
        LimitSpec::new(
            Name::new("a"),
            Quota::per_second(5),
            AlgorithmKind::TokenBucket,
        )
        .on_store_error(FailurePolicy::Open),
        LimitSpec::new(Name::new("b"), Quota::per_second(5), AlgorithmKind::Gcra).on_store_error(
            FailurePolicy::Closed {
                retry_after: Duration::from_secs(7),
            },
        ),
        LimitSpec::new(
            Name::new("c"),
            Quota::per_second(4),
            AlgorithmKind::FixedWindow,
        )
        .on_store_error(FailurePolicy::Local { share: 0.5 }),
    ];
    let s = RedisBackend::new(url)
        .timeout(TIMEOUT)
        .local_fallback(MemoryBackend::new().clock(ManualClock::new()))
        .build(&limits)
        .unwrap();
    let key = Key::string("x");
    let all = [
        LimitCheck::new(0, key.clone(), 1),
        LimitCheck::new(1, key.clone(), 1),
        LimitCheck::new(2, key.clone(), 1),
    ];
    let start = Instant::now();
    let err = decide(&s, &all).await.unwrap_err();
    assert!(start.elapsed() <= TIMEOUT + MARGIN);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    assert!(
        matches!(
            err.kind(),
            StoreErrorKind::Unavailable | StoreErrorKind::Timeout
        ),
        "{err}"
    );
    // Without the closed limit: "a" passes open, "c" is decided locally (2 of 4 per second).
    let open_and_local = [all[0].clone(), all[2].clone()];
    let mut allowed = 0;
    for _ in 0..4 {
        let d = decide(&s, &open_and_local).await.unwrap();
        assert!(d.as_slice()[0].allowed());
        assert_eq!(d.as_slice()[0].policy().as_str(), "a");
        allowed += usize::from(d.allowed());
    }
    assert_eq!(allowed, 2, "the local share of 4 per second is 2");
    assert!(s.stats().fail_open() >= 4);
    assert!(s.stats().local_fallback() >= 4);
}
