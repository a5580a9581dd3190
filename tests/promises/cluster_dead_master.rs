//! One dead Cluster master must not take the healthy masters down (issue 28, item 13), and a
//! promoted replica takes over its keys with their counts (issue 32, item 2b).
//!
//! Real Redis Clusters on loopback (`cluster-require-full-coverage no`, a 1 s
//! `cluster-node-timeout`), 270 concurrent clients (90 keys per master, each checked every
//! 50 ms), a 100 ms store timeout, one master SIGKILLed mid-traffic. Decided means decided by
//! Redis (allowed or rejected), not by the failure policy; figures per 100 ms window.
//!
//! - 3 masters: the healthy masters' keys never stop: every 100 ms window from the kill on has
//!   decisions on them (asserted when no call timed out), and at least 95 % of their checks are
//!   decided in every window but for at most 500 ms of a loaded machine's stalls (100 % in
//!   every window measured in every run without a timed-out call; 400 ms once at a load
//!   average of 5.5, with 277 store timeouts),
//!   and all 60 of a round after 2 s without traffic; each healthy master accepts at most 10
//!   new connections in the 4 s after the kill (no reconnection to every node per probe); the
//!   dead master's keys get their failure policy (`Closed`), none later than the store timeout
//!   plus scheduling slack;
//! - 3 masters, one burst of 270 concurrent clients while the master is killed, then 2 s
//!   without traffic: all 60 checks of the next round on the healthy masters are decided;
//! - 3 masters and 3 replicas, the clients' checks sent to two stores in turn (two instances
//!   of an app), each check one unit of a 1,000,000-unit token bucket that does not refill
//!   during the test (so `remaining` counts the decisions Redis kept for a key): the dead
//!   master's keys are decided by Redis again within 1 s of Redis promoting the replica (the
//!   store follows at its next slot-map refresh, 0.05–0.3 s later measured). Redis promotes it
//!   1.9–2.7 s after the kill with a 1 s node timeout, which puts the store within the node
//!   timeout plus 2 s of the kill (2.1–2.9 s measured); the test prints whether that 3 s held
//!   (it follows from the 1 s bound whenever Redis promoted within 2 s; a later promotion is
//!   Redis's time, not the store's, on a loaded machine), at least
//!   95 % of their checks in the last second; the limit stays shared through the promoted
//!   replica: every key is decided again, none with its count gone, no two checks told the
//!   same `remaining`. What the promotion loses (writes not yet replicated when the master
//!   died): at most the decisions of the last replication lag, asserted as at most the dead
//!   master's decisions in the 500 ms before the kill (0 measured in every run: on loopback
//!   the replica is not measurably behind). The healthy masters' keys never stop: every
//!   window from the kill on has decisions on them (asserted when no call timed out), at least
//!   95 % decided in every window but for at most 500 ms (100 % in every window in every run
//!   without a timed-out call; 300 ms in two runs with store timeouts, at load averages of
//!   4.5-5.5 on 2 cores), and 95 % in the last second.
//!
//! `cargo test --all-features --test promises -- cluster_dead_master --nocapture` prints the
//! figures.

use std::time::Duration;

use tollgate::store::redis::RedisStore;
use tollgate::Quota;

use crate::harness::cluster_failover::{
    self as failover, clients_by_master, decided, longest_gap, per_window, recovery, show, stops,
    warm, Load, Sample, STORE_TIMEOUT,
};
use crate::harness::redis_cluster::RedisCluster;
use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{one, prefix};

/// The cluster's `cluster-node-timeout`.
const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Scheduling slack on a busy 2-core machine.
const MARGIN: Duration = Duration::from_millis(150);
/// Concurrent clients, spread evenly over the masters.
const CLIENTS: usize = 270;
/// How soon after Redis promotes a replica the store must serve the keys on it: a slot-map
/// refresh, at most one probe interval after the last one, plus scheduling slack.
const SERVE_LAG: Duration = Duration::from_millis(1000);
/// How soon after the kill the dead master's keys must be decided again (issue 32, item 2b):
/// the node timeout plus 2 s, plus scheduling slack.
const DECIDED_AGAIN: Duration = Duration::from_millis(1000 + 2000 + 150);
/// The longest the healthy masters' keys may stay below 95 % decided after a kill: no stall of
/// the store (0 ms measured in every run without a timed-out call), only a loaded 2-core
/// machine's (store timeouts that open a healthy master's breaker until its probe closes it:
/// 300-400 ms measured at load averages of 4.5-5.5).
const HEALTHY_GAP: Duration = Duration::from_millis(500);

/// The tests of this module each run hundreds of clients against a Cluster they kill a master
/// of: one at a time, so that none measures while another loads the machine.
static ONE_KILL_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cluster_args() -> Vec<String> {
    failover::cluster_args(NODE_TIMEOUT)
}

fn store(urls: &[String]) -> RedisStore {
    failover::store(urls, &prefix("dead-master"), Quota::per_second(100_000))
}

/// Connections `node` has accepted since it started (`INFO stats`).
fn connections_received(node: &RedisServer) -> u64 {
    let info: String = node.cmd(&["INFO", "stats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_connections_received in INFO stats")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_masters_keep_deciding_when_one_master_is_killed() {
    let _alone = ONE_KILL_AT_A_TIME.lock().await;
    let args = cluster_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = RedisCluster::start_with(&args);
    let store = store(&cluster.urls());
    let ports: Vec<u16> = cluster.nodes.iter().map(RedisServer::port).collect();
    let dead = ports[0];
    let by_master = clients_by_master(&store, &cluster.nodes[0], &ports, CLIENTS / 3);
    warm(&store, by_master.values().flatten()).await;

    let load = Load::start(std::slice::from_ref(&store), &by_master, dead);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let conns_before: Vec<u64> = cluster.nodes[1..]
        .iter()
        .map(connections_received)
        .collect();
    let killed_at = load.now();
    cluster.nodes[0].kill();
    let kill = |d: u64| killed_at + Duration::from_millis(d);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let samples = load.finish().await;
    let conns: Vec<u64> = cluster.nodes[1..]
        .iter()
        .zip(&conns_before)
        .map(|(n, before)| connections_received(n) - before)
        .collect();
    let stats = store.stats();

    let before = per_window(
        &samples,
        kill(0) - Duration::from_millis(500),
        kill(0),
        |_| true,
    );
    let healthy = per_window(&samples, kill(0), kill(4000), |s| !s.on_dead);
    let recovered = recovery(&healthy);
    let after_2s = decided(&samples, kill(2000), kill(4000), |s| !s.on_dead);
    println!(
        "all keys decided per 100 ms before the kill: {}",
        show(&before)
    );
    println!(
        "healthy-master keys decided per 100 ms after the kill: {}",
        show(&healthy)
    );
    println!(
        "healthy masters: decided in every window from {} after the kill; {:.1} % decided from 2 s to 4 s; {conns:?} connections accepted by the healthy masters in the 4 s; {stats:?}",
        recovered.map_or("never".into(), |d| format!("{} ms", d.as_millis())),
        after_2s * 100.0
    );
    // The dead master's keys: decided by the failure policy, never later than the timeout.
    let dead_checks: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.on_dead && s.start > kill(100))
        .collect();
    let slowest = dead_checks
        .iter()
        .map(|s| s.end - s.start)
        .max()
        .unwrap_or_default();
    let dead_decided = dead_checks.iter().filter(|s| s.decided).count();
    println!(
        "dead-master keys after the kill: {} checks, {dead_decided} decided by Redis, slowest {} ms",
        dead_checks.len(),
        slowest.as_millis()
    );

    // Idle, then one round: the healthy masters still decide.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let round: Vec<_> = by_master
        .iter()
        .filter(|(p, _)| **p != dead)
        .flat_map(|(_, c)| c)
        .take(60)
        .map(|c| {
            let (store, c) = (store.clone(), c.clone());
            tokio::spawn(async move { one(&store, &c, 1).await.is_ok() })
        })
        .collect();
    let mut idle_decided = 0;
    for t in round {
        idle_decided += usize::from(t.await.unwrap());
    }
    println!("after 2 s without traffic: {idle_decided} of 60 healthy-master keys decided");

    // The healthy masters never stop: every window from the kill on has decisions on them
    // (unless calls timed out: a machine too loaded to answer within the store timeout), and
    // at least 95 % of their checks are decided in each but for a machine's scheduling stall.
    if stats.timeouts() == 0 {
        assert_eq!(
            stops(&healthy),
            0,
            "windows without a healthy-master decision: {}",
            show(&healthy)
        );
    }
    assert!(
        longest_gap(&healthy) <= HEALTHY_GAP,
        "the healthy masters' keys were below 95 % decided for {:?}: {}",
        longest_gap(&healthy),
        show(&healthy)
    );
    // A dead master never makes the store reconnect to every node (each reconnection holds
    // every call until it is done).
    assert!(
        conns.iter().all(|&c| c <= 10),
        "the healthy masters accepted {conns:?} connections in 4 s"
    );
    assert_eq!(idle_decided, 60, "after a pause in traffic");
    assert!(!dead_checks.is_empty());
    assert_eq!(dead_decided, 0, "nothing can decide on the dead master");
    assert!(
        slowest <= STORE_TIMEOUT + MARGIN,
        "a dead master's key waited {slowest:?}, beyond the store timeout {STORE_TIMEOUT:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_takes_over_the_dead_masters_keys_and_their_counts() {
    let _alone = ONE_KILL_AT_A_TIME.lock().await;
    let f = failover::kill_a_master_under_load(NODE_TIMEOUT, CLIENTS / 3).await;
    let ms = |d: Option<Duration>| d.map_or("never".into(), |d| format!("{} ms", d.as_millis()));
    println!(
        "healthy-master keys decided per 100 ms after the kill: {}",
        show(&f.healthy)
    );
    println!(
        "Redis promoted the replica {} after the kill; its keys decided again {} after the kill \
         ({:.1} % in the last second); healthy masters: {:.1} % decided after the kill, worst \
         window {:.0} %, {} windows without a decision, longest stretch below 95 % {} ms; {:?}",
        ms(f.promoted_by_redis),
        ms(f.decided_again),
        f.dead_at_end * 100.0,
        f.healthy_decided * 100.0,
        f.healthy_worst_window() * 100.0,
        f.healthy_stops(),
        f.healthy_longest_gap().as_millis(),
        f.stats,
    );
    println!(
        "the dead master's {} keys: {} decisions confirmed to the clients, {} lost by the \
         promotion ({} decisions in the {} ms before the kill, replication lag {:?} bytes); {} of \
         them decided by the replica, {} with their state gone, {} remaining counts told twice",
        f.keys,
        f.confirmed,
        f.lost,
        f.decisions_before_kill,
        f.lag_window.as_millis(),
        f.lag_bytes,
        f.keys_decided_again,
        f.keys_reset,
        f.split_counts,
    );
    // One batching task per live master and store: the dead master's ended once the store
    // sent to the promoted replica, so failovers do not add tasks up.
    println!("batching tasks per store at the end: {:?}", f.batchers);
    assert!(
        f.decided_again.is_none() || f.batchers.iter().all(|&b| b <= 3),
        "one batcher per live master: {:?}",
        f.batchers
    );
    // The store cannot serve the keys before Redis promotes the replica (about 2.1-2.7 s
    // after the kill with a 1 s node timeout): it follows at its next slot-map refresh.
    let redis_promoted = f.promoted_by_redis.expect("Redis promoted the replica");
    // Within 1 s of the promotion, so within the node timeout plus 2 s of the kill whenever
    // Redis promoted within 2 s.
    let bound = redis_promoted + SERVE_LAG;
    println!(
        "decided again within the node timeout plus 2 s of the kill: {}",
        f.decided_again.is_some_and(|d| d <= DECIDED_AGAIN)
    );
    assert!(
        f.decided_again.is_some_and(|d| d <= bound),
        "the promoted replica did not decide the dead master's keys within {bound:?} of the \
         kill ({} after the kill; Redis promoted it at {redis_promoted:?})",
        ms(f.decided_again)
    );
    assert!(f.dead_at_end >= 0.95, "the promoted replica keeps deciding");
    // The healthy masters never stop: each goes over its own connection, which neither the
    // dead master nor the slot-map refreshes hold. A machine too loaded to answer within the
    // store timeout opens breakers of healthy masters for a probe interval or two: then only
    // the bound on the stretch below 95 % holds.
    if f.timeouts == 0 {
        assert_eq!(
            f.healthy_stops(),
            0,
            "windows without a healthy-master decision: {}",
            show(&f.healthy)
        );
    }
    assert!(
        f.healthy_longest_gap() <= HEALTHY_GAP,
        "the healthy masters' keys were below 95 % decided for {:?}: {}",
        f.healthy_longest_gap(),
        show(&f.healthy)
    );
    assert!(
        f.healthy_at_end >= 0.95,
        "healthy-master keys decided in the last second: {:.1} %",
        f.healthy_at_end * 100.0
    );
    // The limit stays shared: the replica has every key's count, less at most the decisions
    // of the last half second, and both instances decide on one count per key.
    assert_eq!(f.keys_decided_again, f.keys, "every key decided again");
    assert_eq!(f.keys_reset, 0, "a key's count was gone on the replica");
    assert_eq!(
        f.split_counts, 0,
        "two instances were told the same remaining"
    );
    assert!(f.confirmed > 0);
    assert!(
        f.lost <= f.decisions_before_kill as u64,
        "{} decisions lost, more than the {} the dead master made in the {} ms before the kill",
        f.lost,
        f.decisions_before_kill,
        f.lag_window.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_masters_decide_after_a_burst_at_the_kill_and_a_pause() {
    let _alone = ONE_KILL_AT_A_TIME.lock().await;
    let args = cluster_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = RedisCluster::start_with(&args);
    let store = store(&cluster.urls());
    let ports: Vec<u16> = cluster.nodes.iter().map(RedisServer::port).collect();
    let dead = ports[0];
    let by_master = clients_by_master(&store, &cluster.nodes[0], &ports, CLIENTS / 3);
    warm(&store, by_master.values().flatten()).await;

    // One burst of 270 concurrent checks, the master killed while it is in flight, then nothing.
    let burst: Vec<_> = by_master
        .values()
        .flatten()
        .map(|c| {
            let (store, c) = (store.clone(), c.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let _ = one(&store, &c, 1).await;
                }
            })
        })
        .collect();
    cluster.nodes[0].kill();
    for t in burst {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let healthy: Vec<&String> = by_master
        .iter()
        .filter(|(p, _)| **p != dead)
        .flat_map(|(_, c)| c)
        .take(60)
        .collect();
    let round: Vec<_> = healthy
        .iter()
        .map(|c| {
            let (store, c) = (store.clone(), (*c).clone());
            tokio::spawn(async move { one(&store, &c, 1).await.is_ok() })
        })
        .collect();
    let mut decided = 0;
    for t in round {
        decided += usize::from(t.await.unwrap());
    }
    let stats = store.stats();
    println!("burst at the kill, then 2 s without traffic: {decided} of 60 healthy-master keys decided; {stats:?}");
    assert_eq!(decided, 60, "{stats:?}");
}
