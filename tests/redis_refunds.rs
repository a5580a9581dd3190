//! Cluster refunds never over-admit: a reservation given back after its window moved on must not
//! give back units of the new window (issue 7, item 3).
//!
//! A per-user limit of 1 per 10 s and a per-tenant limit whose key lives on another master. The
//! tenant's master is made slow (`DEBUG SLEEP`), so the user's reservation at 9.999 s is charged
//! and waits for the tenant's answer; meanwhile the clock reaches 19.999 s and the user is
//! admitted once in the new window. The tenant then rejects, the reservation is refunded, and a
//! second request at 19.999 s must still be rejected: one admission per window, not two.
#![cfg(feature = "redis")]

mod common;
mod support;

use std::sync::OnceLock;
use std::time::Duration;

use common::{cluster_store, decide, spec};
use support::RedisCluster;
use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::LimitCheck;
use tollgate::Quota;

fn cluster() -> &'static RedisCluster {
    static C: OnceLock<RedisCluster> = OnceLock::new();
    C.get_or_init(RedisCluster::start)
}

const T0: u64 = 9_999_000;
const T1: u64 = 19_999_000;

async fn late_refund_never_frees_the_new_window(kind: AlgorithmKind) {
    let cluster = cluster();
    let clock = ManualClock::new();
    let limits = [
        spec("user", Quota::per(Duration::from_secs(10), 1), kind),
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
            LimitCheck {
                limit: 0,
                key: Key::string(user.to_owned()),
                cost: 1,
            },
            LimitCheck {
                limit: 1,
                key: Key::string(tenant.clone()),
                cost: 1,
            },
        ]
    };
    let alice_alone = [LimitCheck {
        limit: 0,
        key: Key::string("alice"),
        cost: 1,
    }];

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
    clock.set_micros(T1);
    let d = decide(&store, &alice_alone).await.unwrap();
    assert!(d.allowed(), "{kind:?}: first request of the new window");

    let d = pending.await.unwrap().unwrap();
    assert!(!d.allowed(), "{kind:?}: the tenant is exhausted");
    sleeper.join().unwrap();

    let d = decide(&store, &alice_alone).await.unwrap();
    assert!(
        !d.allowed(),
        "{kind:?}: the late refund gave back a unit of the new window: 2 admitted in one window"
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
