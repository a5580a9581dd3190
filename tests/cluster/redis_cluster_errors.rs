//! A Cluster that answers `CLUSTERDOWN` or `TRYAGAIN`: the store decides by each limit's failure
//! policy (never panics, never charges a key twice), retries `TRYAGAIN` a bounded number of
//! times, and decides by Redis again once the Cluster serves the keys. Real 3-master Clusters
//! on loopback; the store's timeout is 3 s, so no check falls to its policy because the
//! machine is busy.

use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, FailurePolicy, LimitCheck, LimitSpec};
use tollgate::{Decisions, Name, Quota, StoreError};

use crate::harness::redis_cluster::RedisCluster;
use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{decide, prefix};

const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A Cluster store of three hourly limits of 100 failing `Open`, `Closed` and `Local`.
fn store(cluster: &RedisCluster, test: &str, batching: bool) -> (RedisStore, String) {
    store_with_timeout(cluster, test, batching, Duration::from_secs(3))
}

fn store_with_timeout(
    cluster: &RedisCluster,
    test: &str,
    batching: bool,
    timeout: Duration,
) -> (RedisStore, String) {
    let prefix = prefix(test);
    let limit = |name: &str, policy| {
        LimitSpec::new(
            Name::new(name),
            Quota::per_hour(100),
            AlgorithmKind::TokenBucket,
        )
        .on_store_error(policy)
    };
    let store = RedisBackend::cluster(cluster.urls())
        .prefix(prefix.clone())
        .batching(batching)
        .timeout(timeout)
        .probe_interval(Duration::from_millis(100))
        .build(&[
            limit("open", FailurePolicy::Open),
            limit(
                "closed",
                FailurePolicy::Closed {
                    retry_after: RETRY_AFTER,
                },
            ),
            limit("local", FailurePolicy::Local { share: 1.0 }),
        ])
        .expect("build the cluster store");
    (store, prefix)
}

/// Checks `client` on each of `limits` in one request.
async fn check(
    store: &RedisStore,
    client: &str,
    limits: &[usize],
) -> Result<Decisions, StoreError> {
    let checks: Vec<LimitCheck<'_>> = limits
        .iter()
        .map(|&l| LimitCheck::new(l, Key::string(client.to_owned()), 1))
        .collect();
    decide(store, &checks).await
}

/// The `remaining` of each limit, decided by Redis.
async fn remaining(store: &RedisStore, client: &str, limits: &[usize]) -> Vec<u64> {
    let d = check(store, client, limits)
        .await
        .expect("decided by Redis, not by the failure policy");
    d.as_slice().iter().map(|d| d.remaining()).collect()
}

fn id(n: &RedisServer) -> String {
    n.cmd(&["CLUSTER", "MYID"])
}

/// Waits until every node reports `cluster_state:{state}`.
fn wait_state(cluster: &RedisCluster, state: &str) -> Duration {
    let start = Instant::now();
    let want = format!("cluster_state:{state}");
    while !cluster
        .nodes
        .iter()
        .all(|n| n.cmd::<String>(&["CLUSTER", "INFO"]).contains(&want))
    {
        assert!(start.elapsed() < Duration::from_secs(10), "never {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// The two keys of one client (one hash tag), split by a migration of their slot.
struct Split {
    keys: Vec<String>,
    slot: String,
    /// The node migrating the slot, still holding `keys[1]`.
    from: usize,
    /// The node importing it, holding `keys[0]`.
    to: usize,
}

/// Starts migrating the slot of the store's two keys (under `prefix`) from its master to the
/// next node and moves one of them: a call with both is answered `TRYAGAIN` by the migrating
/// node (and by the importing one after `ASKING`).
fn split_by_migration(cluster: &RedisCluster, prefix: &str) -> Split {
    let mut keys = cluster.keys(&format!("{prefix}*"));
    keys.sort();
    assert_eq!(keys.len(), 2, "{keys:?}");
    let slot = cluster.keyslot(&keys[0]).to_string();
    let from = cluster.index_for(&keys[0]);
    let to = (from + 1) % cluster.nodes.len();
    let (a, b) = (&cluster.nodes[from], &cluster.nodes[to]);
    let _: String = b.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &id(a)]);
    let _: String = a.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &id(b)]);
    let port = b.port().to_string();
    let _: String = a.cmd(&["MIGRATE", "127.0.0.1", &port, &keys[0], "0", "5000"]);
    Split {
        keys,
        slot,
        from,
        to,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterdown_is_decided_by_each_policy_and_redis_decides_again_once_it_is_up() {
    // `cluster-require-full-coverage yes`: one slot without a master takes the whole Cluster down.
    let cluster = RedisCluster::start_with(&["--cluster-require-full-coverage", "yes"]);
    let (store, _) = store(&cluster, "clusterdown", true);
    assert_eq!(remaining(&store, "c", &[0, 1, 2]).await, [99, 99, 99]);

    // A slot no check uses loses its master on every node.
    let mut other = 0;
    while cluster.keyslot(&format!("down-{other}")) == cluster.keyslot("c") {
        other += 1;
    }
    let down = format!("down-{other}");
    let (slot, owner) = (cluster.keyslot(&down).to_string(), cluster.index_for(&down));
    for n in &cluster.nodes {
        let _: String = n.cmd(&["CLUSTER", "DELSLOTS", &slot]);
    }
    let took = wait_state(&cluster, "fail");
    println!("cluster_state:fail on every node {took:?} after DELSLOTS {slot}");

    let stats = store.stats();
    for round in 0..5 {
        let started = Instant::now();
        let open = check(&store, "c", &[0]).await.expect("open: let through");
        assert!(
            open.as_slice()[0].allowed() && !open.as_slice()[0].is_counted(),
            "round {round}: fail open lets the request through uncounted"
        );
        let closed = check(&store, "c", &[1]).await.expect_err("closed: refused");
        assert_eq!(closed.retry_after(), Some(RETRY_AFTER));
        let local = check(&store, "c", &[2]).await.expect("local: decided here");
        assert!(local.as_slice()[0].allowed() && local.as_slice()[0].is_counted());
        // Both limits in one request: the closed one refuses it.
        assert!(check(&store, "c", &[0, 1]).await.is_err());
        println!("round {round}: 4 checks in {:?}", started.elapsed());
    }
    assert!(
        stats.fail_open() >= 5 && stats.fail_closed() >= 10,
        "{stats:?}"
    );
    assert!(stats.local_fallback() >= 5, "{stats:?}");
    assert!(
        stats.breaker_open() && stats.short_circuited() > 0,
        "the master's breaker opened after 5 failures: {stats:?}"
    );
    // Its probe reads a key of the master's slot, which the master refuses while the Cluster
    // is down (it would answer `ECHO`): the breaker stays open through four probe intervals.
    let trips = stats.breaker_trips();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        stats.breaker_open() && stats.breaker_trips() == trips,
        "the breaker stays open while the Cluster is down: {stats:?}"
    );

    // The slot's master is back: Redis decides again, and the failed checks charged nothing.
    let _: String = cluster.nodes[owner].cmd(&["CLUSTER", "ADDSLOTS", &slot]);
    let took = wait_state(&cluster, "ok");
    println!("cluster_state:ok on every node {took:?} after ADDSLOTS");
    let back = Instant::now();
    let counts = loop {
        match check(&store, "c", &[1]).await {
            Ok(d) => break d.as_slice()[0].remaining(),
            Err(_) => {
                assert!(
                    back.elapsed() < Duration::from_secs(5),
                    "Redis decides within 5 s of the cluster being ok"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    println!(
        "decided by Redis again {:?} after cluster_state:ok",
        back.elapsed()
    );
    assert_eq!(counts, 98, "the checks refused by policy charged nothing");
    assert_eq!(remaining(&store, "c", &[0, 1]).await, [98, 97]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_split_by_a_migration_are_tried_again_then_decided_by_policy_never_twice() {
    let cluster = RedisCluster::start();
    for batching in [true, false] {
        let (store, prefix) = store(&cluster, "tryagain", batching);
        let client = if batching { "batched" } else { "alone" };
        // Two limits of one client: two keys of one hash tag, so one slot and one script call.
        assert_eq!(remaining(&store, client, &[1, 2]).await, [99, 99]);
        let Split {
            keys,
            slot,
            from,
            to,
        } = split_by_migration(&cluster, &prefix);
        let (a, b) = (&cluster.nodes[from], &cluster.nodes[to]);
        let (b_id, port) = (id(b), b.port().to_string());

        let errors = store.stats().errors();
        let started = Instant::now();
        let refused = check(&store, client, &[1, 2])
            .await
            .expect_err("the closed limit refuses while the keys are split");
        let took = started.elapsed();
        println!("batching {batching}: TRYAGAIN answered by policy after {took:?}: {refused}");
        assert_eq!(refused.retry_after(), Some(RETRY_AFTER));
        assert!(
            took >= Duration::from_millis(30) && took < Duration::from_secs(1),
            "two more tries, 10 and 20 ms apart, then the policy (not the 3 s timeout): {took:?}"
        );
        assert!(store.stats().errors() > errors);
        let open = check(&store, client, &[0, 2])
            .await
            .expect("open and local");
        assert!(!open.as_slice()[0].is_counted(), "open: uncounted");

        // The migration ends: Redis decides both keys again, each charged once in all.
        let _: String = a.cmd(&["MIGRATE", "127.0.0.1", &port, &keys[1], "0", "5000"]);
        for n in &cluster.nodes {
            let _: String = n.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &b_id]);
        }
        assert_eq!(
            remaining(&store, client, &[1, 2]).await,
            [98, 98],
            "batching {batching}: nothing charged by the refused calls"
        );
        let on = |n: &RedisServer| n.cmd::<i64>(&["CLUSTER", "COUNTKEYSINSLOT", &slot]);
        assert_eq!((on(a), on(b)), (0, 2));
    }
}

/// A `TRYAGAIN` is tried again only while a try fits before the caller's deadline: with a 30 ms
/// timeout, the call is tried at once and after 10 ms, then answered by the failure policy at
/// once (a third try, 20 ms later, would pass the deadline), not by the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tryagain_is_not_tried_again_past_the_callers_deadline() {
    let cluster = RedisCluster::start();
    let (store, prefix) = store_with_timeout(
        &cluster,
        "tryagain-deadline",
        false,
        Duration::from_millis(30),
    );
    // Connected, and the keys written, with time to spare on a busy machine.
    let mut warm = 0;
    while check(&store, "d", &[1, 2]).await.is_err() {
        warm += 1;
        assert!(warm < 100, "the store never decided by Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let Split { from, .. } = split_by_migration(&cluster, &prefix);
    let a = &cluster.nodes[from];
    let rejected = |n: &RedisServer| -> u64 {
        let stats: String = n.cmd(&["INFO", "commandstats"]);
        stats
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .and_then(|l| l.split("rejected_calls=").nth(1))
            .and_then(|v| v.split(',').next())
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    let (timeouts, tries) = (store.stats().timeouts(), rejected(a));
    let refused = check(&store, "d", &[1, 2])
        .await
        .expect_err("the closed limit refuses while the keys are split");
    assert_eq!(refused.retry_after(), Some(RETRY_AFTER));
    let tried = rejected(a) - tries;
    println!("{tried} tries answered TRYAGAIN: {refused}");
    assert_eq!(
        store.stats().timeouts(),
        timeouts,
        "answered by the policy before the timeout"
    );
    assert!(
        (1..=2).contains(&tried),
        "no try is sent that would end past the deadline: {tried}"
    );
}
