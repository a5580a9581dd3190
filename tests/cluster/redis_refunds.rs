//! Cluster refunds never over-admit: a reservation given back after its window moved on must not
//! give back units of the new window (issue 7, item 3).
//!
//! A per-user limit of 1 per 10 s and a per-tenant limit whose key lives on another master. The
//! tenant's master is made slow (`DEBUG SLEEP`), so the user's reservation at 9.999 s is charged
//! and waits for the tenant's answer; meanwhile the clock reaches 19.999 s and the user is
//! admitted once in the new window. The tenant then rejects, the reservation is refunded, and a
//! second request at 19.999 s must still be rejected: one admission per window, not two.
//!
//! Every algorithm's final decision is also compared with the Rust `Algorithm` driven through
//! the same transitions (the specification the Lua mirrors): reserve at 9.999 s, admit at
//! 19.999 s, refund as of 9.999 s applied at 19.999 s, decide at 19.999 s. The buckets refilled
//! the reserved unit in those 10 s while a bucket without the reservation was full and lost
//! it, so their refund gives back nothing. With a burst of 2 and the admission 4 s after the
//! reservation, 0.4 of the unit refilled: the refund gives back 0.6, and the key is exactly
//! where it would be without the reservation, on Redis exactly as in Rust.

use std::sync::OnceLock;
use std::time::Duration;

use tollgate::algorithm::{
    Algorithm, AlgorithmKind, FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow,
    TokenBucket,
};
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{Backend, LimitCheck};
use tollgate::{Decision, Quota};

use crate::harness::redis_cluster::RedisCluster;
use crate::harness::stores::{self, cluster_store, decide, spec};

fn cluster() -> &'static RedisCluster {
    static C: OnceLock<RedisCluster> = OnceLock::new();
    C.get_or_init(RedisCluster::start)
}

const T0: u64 = 9_999_000;
const T1: u64 = 19_999_000;
/// 4 s after the reservation: 0.4 of a unit refilled.
const T_PARTIAL: u64 = T0 + 4_000_000;

fn user_quota() -> Quota {
    Quota::per(Duration::from_secs(10), 1)
}

/// The scenario through the Rust transitions: reserve at T0, admit at `t1`, refund as of T0
/// applied at `t1`, decide at `t1`.
fn rust_late_refund<A: Algorithm>(alg: A, t1: u64) -> Decision {
    let mut state = A::State::default();
    assert!(alg.check(&mut state, T0, 1).allowed());
    assert!(alg.check(&mut state, t1, 1).allowed());
    alg.refund(&mut state, T0, t1, 1);
    alg.decide(&state, t1, 1)
}

fn rust_model(kind: AlgorithmKind, q: Quota, t1: u64) -> Decision {
    match kind {
        AlgorithmKind::FixedWindow => rust_late_refund(FixedWindow::new(q).unwrap(), t1),
        AlgorithmKind::SlidingWindow => rust_late_refund(SlidingWindow::new(q).unwrap(), t1),
        AlgorithmKind::SlidingLog => rust_late_refund(SlidingLog::new(q).unwrap(), t1),
        AlgorithmKind::TokenBucket => rust_late_refund(TokenBucket::new(q).unwrap(), t1),
        AlgorithmKind::Gcra => rust_late_refund(Gcra::new(q).unwrap(), t1),
        AlgorithmKind::LeakyBucket => rust_late_refund(LeakyBucket::new(q).unwrap(), t1),
        other => panic!("no model for {other}"),
    }
}

/// The decision at `t1` of a key that saw only what was admitted: alice's one request at `t1`
/// (the reservation refunded, as if it had never been made).
fn without_the_reservation(kind: AlgorithmKind, q: Quota, t1: u64) -> Decision {
    fn admit_once<A: Algorithm>(alg: A, t1: u64) -> Decision {
        let mut state = A::State::default();
        assert!(alg.check(&mut state, t1, 1).allowed());
        alg.decide(&state, t1, 1)
    }
    match kind {
        AlgorithmKind::TokenBucket => admit_once(TokenBucket::new(q).unwrap(), t1),
        AlgorithmKind::Gcra => admit_once(Gcra::new(q).unwrap(), t1),
        AlgorithmKind::LeakyBucket => admit_once(LeakyBucket::new(q).unwrap(), t1),
        other => panic!("no model for {other}"),
    }
}

fn fields(d: &Decision) -> (bool, u64, Duration, Option<Duration>) {
    (d.allowed(), d.remaining(), d.reset(), d.retry_after())
}

/// Runs the scenario on the Cluster for `kind`, alice's user limit `user` and her admission
/// at `t1`; asserts the final decision is the Rust model's and returns it.
async fn late_refund(kind: AlgorithmKind, user: Quota, t1: u64) -> Decision {
    let cluster = cluster();
    let clock = ManualClock::new();
    let limits = [
        spec("user", user, kind),
        spec("tenant", Quota::per_hour(1), AlgorithmKind::FixedWindow),
    ];
    let store = cluster_store(&cluster.urls(), "refund", &clock, &limits);
    let user_key = store.redis_key(0, &Key::string("alice")).unwrap();
    let user_node = cluster.node_for(&user_key).port();
    // A tenant whose key lives on another master than alice's.
    let tenant = (0..)
        .map(|i| format!("tenant-{i}"))
        .find(|t| {
            let k = store.redis_key(1, &Key::string(t.clone())).unwrap();
            cluster.node_for(&k).port() != user_node
        })
        .unwrap();
    let tenant_key = store.redis_key(1, &Key::string(tenant.clone())).unwrap();
    let tenant_node = cluster.node_for(&tenant_key);
    let both = |user: &str| {
        vec![
            LimitCheck::new(0, Key::string(user.to_owned()), 1),
            LimitCheck::new(1, Key::string(tenant.clone()), 1),
        ]
    };
    let alice_alone = [LimitCheck::new(0, Key::string("alice"), 1)];

    // Bob spends the tenant's one request of the hour.
    clock.set_micros(T0);
    let d = decide(&store, &both("bob")).await.unwrap();
    assert!(d.allowed());

    // The tenant's master sleeps; alice's request reserves her unit at T0 and waits for it.
    let sleeper = {
        let mut conn = tenant_node.conn();
        std::thread::spawn(move || {
            let _: () = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("0.6")
                .query(&mut conn)
                .unwrap();
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pending = {
        let store = store.clone();
        let checks = both("alice");
        tokio::spawn(async move { decide(&store, &checks).await })
    };
    // Wait until the reservation is charged on alice's master.
    let mut user_conn = cluster
        .nodes
        .iter()
        .find(|n| n.port() == user_node)
        .unwrap()
        .conn();
    for _ in 0..200 {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&user_key)
            .query(&mut user_conn)
            .unwrap();
        if exists {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The window moves on: alice's one request of the new window.
    clock.set_micros(t1);
    let d = decide(&store, &alice_alone).await.unwrap();
    assert!(d.allowed(), "{kind:?}: first request of the new window");

    let d = pending.await.unwrap().unwrap();
    assert!(!d.allowed(), "{kind:?}: the tenant is exhausted");
    sleeper.join().unwrap();

    let d = decide(&store, &alice_alone).await.unwrap().as_slice()[0];
    let want = rust_model(kind, user, t1);
    assert_eq!(
        fields(&d),
        fields(&want),
        "{kind:?}: Lua and Rust refunds differ"
    );
    d
}

async fn late_refund_never_frees_the_new_window(kind: AlgorithmKind) {
    let d = late_refund(kind, user_quota(), T1).await;
    assert!(
        !d.allowed(),
        "{kind:?}: the late refund gave back budget that refilled: 2 admitted in one period"
    );
}

/// A bucket's refund gives back only the part of the unit that has not refilled since the
/// reservation (0.6 of it): the key is then exactly where it would be without the reservation
/// (the same `remaining` and `reset`), on Redis exactly as in Rust.
async fn partial_refill_refund_is_exact(kind: AlgorithmKind) {
    let user = user_quota().burst(2);
    let d = late_refund(kind, user, T_PARTIAL).await;
    assert_eq!(
        fields(&d),
        fields(&without_the_reservation(kind, user, T_PARTIAL)),
        "{kind:?}: the refunded key differs from one that never saw the reservation"
    );
}

#[tokio::test]
async fn fixed_window_refund_after_the_window_moved_on() {
    late_refund_never_frees_the_new_window(AlgorithmKind::FixedWindow).await;
}

#[tokio::test]
async fn sliding_window_refund_after_the_window_moved_on() {
    late_refund_never_frees_the_new_window(AlgorithmKind::SlidingWindow).await;
}

#[tokio::test]
async fn sliding_log_refund_after_the_window_moved_on() {
    late_refund_never_frees_the_new_window(AlgorithmKind::SlidingLog).await;
}

#[tokio::test]
async fn token_bucket_late_refund_never_over_admits() {
    late_refund_never_frees_the_new_window(AlgorithmKind::TokenBucket).await;
}

#[tokio::test]
async fn gcra_late_refund_never_over_admits() {
    late_refund_never_frees_the_new_window(AlgorithmKind::Gcra).await;
}

#[tokio::test]
async fn leaky_bucket_late_refund_never_over_admits() {
    late_refund_never_frees_the_new_window(AlgorithmKind::LeakyBucket).await;
}

#[tokio::test]
async fn token_bucket_partial_refill_refund_matches_rust() {
    partial_refill_refund_is_exact(AlgorithmKind::TokenBucket).await;
}

#[tokio::test]
async fn gcra_partial_refill_refund_matches_rust() {
    partial_refill_refund_is_exact(AlgorithmKind::Gcra).await;
}

#[tokio::test]
async fn leaky_bucket_partial_refill_refund_matches_rust() {
    partial_refill_refund_is_exact(AlgorithmKind::LeakyBucket).await;
}

/// At the server's time (no store clock) the refund is applied at the server's `TIME`, as of
/// the reservation's (the `nrA` header): a full token bucket of 2 per hour, reserved whole and
/// refunded a round trip later, is full again, exactly as a key that never saw the
/// reservation (what refilled into the hole meanwhile plus what is given back is the whole
/// reservation). Without the refund it would be 2 units (an hour) short.
#[tokio::test]
async fn refund_at_the_server_time_restores_a_bucket_nobody_else_used() {
    let cluster = cluster();
    let limits = [
        spec("user", Quota::per_hour(2), AlgorithmKind::TokenBucket),
        spec("tenant", Quota::per_hour(1), AlgorithmKind::FixedWindow),
    ];
    let store = tollgate::store::redis::RedisBackend::cluster(cluster.urls())
        .prefix(stores::prefix("refund-server-time"))
        .timeout(Duration::from_secs(3))
        .build(&limits)
        .unwrap();
    let user_key = store.redis_key(0, &Key::string("carol")).unwrap();
    let user_node = cluster.node_for(&user_key).port();
    let tenant = (0..)
        .map(|i| format!("tenant-{i}"))
        .find(|t| {
            let k = store.redis_key(1, &Key::string(t.clone())).unwrap();
            cluster.node_for(&k).port() != user_node
        })
        .unwrap();
    let both = |user: &str, cost| {
        vec![
            LimitCheck::new(0, Key::string(user.to_owned()), cost),
            LimitCheck::new(1, Key::string(tenant.clone()), 1),
        ]
    };
    assert!(decide(&store, &both("dave", 1)).await.unwrap().allowed());
    let refunds = store.stats().refunds();
    let d = decide(&store, &both("carol", 2)).await.unwrap();
    assert!(!d.allowed(), "the tenant is exhausted");
    assert_eq!(
        store.stats().refunds(),
        refunds + 1,
        "carol's 2 units were refunded"
    );
    let user = d.as_slice()[0];
    // Reported after the refund: full, as without the reservation.
    assert_eq!(
        (user.remaining(), user.reset()),
        (2, Duration::ZERO),
        "{user:?}"
    );
    let alone = [LimitCheck::new(0, Key::string("carol"), 2)];
    assert!(decide(&store, &alone).await.unwrap().allowed());
    assert_eq!(store.stats().refund_failures(), 0);
}
