//! Redis Cluster batching on a real 3-master cluster: concurrent checks for keys of one master
//! are coalesced into one script call to it whatever their slots, each still decided exactly;
//! a slot moved under traffic (a stale slot map, `MOVED` and `ASK`) loses and double-charges
//! nothing; a killed master is decided by the failure policy while the others keep batching.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, LimitSpec};
use tollgate::Quota;

use crate::harness::redis_cluster::RedisCluster;
use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{one, prefix, spec};

const CAPACITY: u64 = 40;

fn limit() -> [LimitSpec; 1] {
    [spec(
        "burst",
        Quota::per_day(1).burst(CAPACITY),
        AlgorithmKind::TokenBucket,
    )]
}

fn backend(cluster: &RedisCluster, test: &str) -> RedisBackend {
    RedisBackend::cluster(cluster.urls())
        .prefix(prefix(test))
        .timeout(Duration::from_secs(3))
}

/// The first of `c0`, `c1`, ... whose Redis key is on each master, in master order.
fn key_per_master(cluster: &RedisCluster, store: &RedisStore) -> Vec<String> {
    let mut found: Vec<Option<String>> = vec![None; cluster.nodes.len()];
    for i in 0.. {
        let key = format!("c{i}");
        let node = cluster.index_for(&store.redis_key(0, &Key::string(key.clone())).unwrap());
        found[node].get_or_insert(key);
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    found.into_iter().map(Option::unwrap).collect()
}

/// Script calls each of `nodes` has run so far (INFO commandstats, EVALSHA and EVAL).
fn script_calls(nodes: &[RedisServer]) -> Vec<u64> {
    nodes
        .iter()
        .map(|n| calls_of(&n.cmd::<String>(&["INFO", "commandstats"])))
        .collect()
}

/// Until the store has read the slot map (in the background), checks go unbatched.
async fn warm_up(store: &RedisStore) {
    for i in 0..3 {
        one(store, &format!("warm{i}"), 1).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// `n` checks of cost 1 on each `(key, n)`, all at once from their own tasks: the number allowed
/// per key, and the checks Redis could not decide (refused by the failure policy, `Closed`).
async fn try_burst(store: &RedisStore, work: &[(String, usize)]) -> (HashMap<String, u64>, u64) {
    let store = Arc::new(store.clone());
    let mut handles = Vec::new();
    for (key, n) in work {
        for _ in 0..*n {
            let (store, key) = (store.clone(), key.clone());
            handles.push(tokio::spawn(async move {
                let d = one(&*store, &key, 1).await;
                (key, d.map(|d| d.allowed()))
            }));
        }
    }
    let (mut allowed, mut failed) = (HashMap::new(), 0);
    for h in handles {
        let (key, d) = h.await.unwrap();
        *allowed.entry(key).or_insert(0) += d.as_ref().map_or(0, |&a| u64::from(a));
        failed += u64::from(d.is_err());
    }
    (allowed, failed)
}

/// [`try_burst`], where Redis decides every check.
async fn burst(store: &RedisStore, work: &[(String, usize)]) -> HashMap<String, u64> {
    let (allowed, failed) = try_burst(store, work).await;
    assert_eq!(failed, 0, "redis decided every check");
    allowed
}

/// What a key has left, read with a check of cost 0.
async fn remaining(store: &RedisStore, key: &str) -> u64 {
    one(store, key, 0).await.unwrap().remaining()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_are_coalesced_per_master_and_decided_exactly() {
    let cluster = RedisCluster::start();
    // At the server's time (the compact batch) and at an explicit clock (groups with a time).
    for clock in [None, Some(ManualClock::new())] {
        let mut b = backend(&cluster, "coalesce");
        if let Some(c) = &clock {
            b = b.clock(c.clone());
        }
        let stats = b.stats();
        let store = b.build(&limit()).unwrap();
        warm_up(&store).await;
        let hot = key_per_master(&cluster, &store);
        // Three hot keys (one per master) asked 3x their capacity, and 150 keys asked once each:
        // a master's batches mix many slots.
        let mut work: Vec<(String, usize)> = hot
            .iter()
            .map(|k| (k.clone(), 3 * CAPACITY as usize))
            .collect();
        work.extend((0..150).map(|i| (format!("cold{i}"), 1)));
        let checks: usize = work.iter().map(|w| w.1).sum();
        let (calls0, batches0, batched0) = (
            script_calls(&cluster.nodes),
            stats.batches(),
            stats.batched_calls(),
        );
        let allowed = burst(&store, &work).await;
        let calls: Vec<u64> = script_calls(&cluster.nodes)
            .iter()
            .zip(&calls0)
            .map(|(a, b)| a - b)
            .collect();
        let batched = stats.batched_calls() - batched0;
        let batches = stats.batches() - batches0;
        for k in &hot {
            assert_eq!(
                allowed[k], CAPACITY,
                "{k}: exactly the capacity ({clock:?})"
            );
            assert_eq!(remaining(&store, k).await, 0);
        }
        for i in 0..150 {
            assert_eq!(allowed[&format!("cold{i}")], 1);
        }
        assert_eq!(batched, checks as u64, "every check went through a batcher");
        assert!(
            batches * 3 < batched,
            "{batched} checks in {batches} script calls: coalesced"
        );
        assert!(
            calls.iter().all(|&c| c > 0) && calls.iter().sum::<u64>() < checks as u64 / 3,
            "every master ran batches, far fewer calls than checks: {calls:?} for {checks}"
        );
        assert_eq!(stats.errors(), 0, "{stats:?}");
        assert_eq!(stats.split_batches(), 0);
    }
}

/// A node's id (CLUSTER MYID).
fn id(node: &RedisServer) -> String {
    node.cmd(&["CLUSTER", "MYID"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_under_traffic_loses_and_double_charges_nothing() {
    let cluster = RedisCluster::start();
    // A long probe interval keeps the store's slot map stale; a high threshold keeps the
    // breaker shut through the ASK errors below.
    let b = backend(&cluster, "reshard")
        .probe_interval(Duration::from_secs(30))
        .breaker_threshold(1000);
    let stats = b.stats();
    let store = b.build(&limit()).unwrap();
    warm_up(&store).await;
    let hot = key_per_master(&cluster, &store);
    let moving = &hot[0];
    let redis_key = store.redis_key(0, &Key::string(moving.clone())).unwrap();
    let slot = cluster.keyslot(&redis_key).to_string();
    let (from, to) = (&cluster.nodes[0], &cluster.nodes[1]);
    // Neighbours on the source master that stay put, checked in the same batches.
    let stay: Vec<String> = (0..)
        .map(|i| format!("s{i}"))
        .filter(|k| {
            let rk = store.redis_key(0, &Key::string(k.clone())).unwrap();
            cluster.index_for(&rk) == 0 && cluster.keyslot(&rk).to_string() != slot
        })
        .take(20)
        .collect();
    let mut spent: HashMap<String, u64> = HashMap::new();
    let mut round = |allowed: HashMap<String, u64>| {
        for (k, a) in allowed {
            *spent.entry(k).or_insert(0) += a;
        }
    };
    let work = |n: usize| -> Vec<(String, usize)> {
        let mut w = vec![(moving.clone(), n)];
        w.extend(stay.iter().map(|k| (k.clone(), 1)));
        w
    };
    round(burst(&store, &work(10)).await);

    // Migrating: the key is moved, the slot is not yet reassigned (the source answers ASK).
    to.cmd::<String>(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &id(from)]);
    from.cmd::<String>(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &id(to)]);
    let port = to.port().to_string();
    from.cmd::<String>(&["MIGRATE", "127.0.0.1", &port, &redis_key, "0", "5000"]);
    // redis-rs 1.8 sometimes returns an ASK to concurrent single-slot calls instead of
    // following it (with batching off too): those checks are refused by the failure policy,
    // never charged (Redis answered ASK without running the script).
    let (allowed, refused) = try_burst(&store, &work(10)).await;
    round(allowed);
    let asked = stats.split_batches();
    assert!(asked > 0, "the source refused the batch holding the key");

    // Reassigned: the source answers MOVED, and the store's slot map is stale.
    for n in [to, from, &cluster.nodes[2]] {
        n.cmd::<String>(&["CLUSTER", "SETSLOT", &slot, "NODE", &id(to)]);
    }
    round(burst(&store, &work(10)).await);
    assert!(stats.split_batches() > asked, "refused again once moved");
    let count = |n: &RedisServer| n.cmd::<i64>(&["CLUSTER", "COUNTKEYSINSLOT", &slot]);
    assert_eq!((count(from), count(to)), (0, 1), "the key moved");

    // Every admission was charged exactly once: what each key has left is its capacity less
    // what it admitted.
    let mut admitted = 0;
    for k in std::iter::once(moving).chain(&stay) {
        assert_eq!(remaining(&store, k).await, CAPACITY - spent[k], "{k}");
        admitted += spent[k];
    }
    let checks = 30 + 3 * stay.len() as u64;
    assert_eq!(admitted + refused, checks, "each check admitted or refused");
    assert_eq!(stats.errors(), refused, "{stats:?}");
    // Past the exhausted capacity, exactly the rest is admitted.
    let rest = burst(&store, &[(moving.clone(), 2 * CAPACITY as usize)]).await;
    assert_eq!(rest[moving], CAPACITY - spent[moving]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_decided_by_its_policy_while_the_others_keep_batching() {
    // Without full coverage the live masters keep serving their slots once the dead one is
    // marked failed.
    let mut cluster = RedisCluster::start_with(&["--cluster-require-full-coverage", "no"]);
    let b = backend(&cluster, "kill")
        .timeout(Duration::from_millis(300))
        .probe_interval(Duration::from_millis(100));
    let stats = b.stats();
    let store = b.build(&limit()).unwrap();
    warm_up(&store).await;
    let hot = key_per_master(&cluster, &store);
    cluster.nodes[2].kill();
    let (batches0, batched0) = (stats.batches(), stats.batched_calls());
    let calls0 = script_calls(&cluster.nodes[..2]);
    for round in 0..3 {
        // The dead master's key: the limit fails closed (an error with retry_after).
        let store2 = store.clone();
        let dead = hot[2].clone();
        let dead_checks = tokio::spawn(async move {
            let mut errors = 0;
            for _ in 0..10 {
                let e = one(&store2, &dead, 1).await.expect_err("fails closed");
                assert_eq!(e.retry_after(), Some(Duration::from_secs(1)));
                errors += 1;
            }
            errors
        });
        let work: Vec<(String, usize)> = hot[..2]
            .iter()
            .map(|k| (k.clone(), 10))
            .chain((0..40).map(|i| (format!("live{round}-{i}"), 1)))
            .filter(|(k, _)| {
                let rk = store.redis_key(0, &Key::string(k.clone())).unwrap();
                cluster_index(&cluster, &rk) != Some(2)
            })
            .collect();
        let allowed = burst(&store, &work).await;
        for k in &hot[..2] {
            assert_eq!(allowed[k], 10, "{k}: decided by Redis");
        }
        assert_eq!(dead_checks.await.unwrap(), 10);
    }
    for k in &hot[..2] {
        assert_eq!(
            remaining(&store, k).await,
            CAPACITY - 30,
            "charged once each"
        );
    }
    assert!(stats.fail_closed() >= 30, "{stats:?}");
    assert!(stats.breaker_trips() >= 1, "{stats:?}");
    let batched = stats.batched_calls() - batched0;
    let batches = stats.batches() - batches0;
    assert!(
        batches * 2 < batched,
        "the live masters kept batching: {batched} checks in {batches} calls"
    );
    let calls = script_calls(&cluster.nodes[..2]);
    assert!(
        calls.iter().zip(&calls0).all(|(a, b)| a > b),
        "both live masters ran script calls"
    );
}

fn calls_of(info: &str) -> u64 {
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split_once("calls=")
                .and_then(|(_, v)| v.split(',').next()?.parse::<u64>().ok())
        })
        .sum()
}

/// The live master serving `key` (by asking the live masters only).
fn cluster_index(cluster: &RedisCluster, key: &str) -> Option<usize> {
    let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]);
    let slots: Vec<redis::Value> = cluster.nodes[0].cmd(&["CLUSTER", "SLOTS"]);
    for range in slots {
        let redis::Value::Array(r) = range else {
            continue;
        };
        let (Some(redis::Value::Int(a)), Some(redis::Value::Int(b)), Some(redis::Value::Array(m))) =
            (r.first(), r.get(1), r.get(2))
        else {
            continue;
        };
        if *a <= slot && slot <= *b {
            let Some(redis::Value::Int(port)) = m.get(1) else {
                return None;
            };
            return cluster
                .nodes
                .iter()
                .position(|n| i64::from(n.port()) == *port);
        }
    }
    None
}
