//! One dead Cluster master must not take the healthy masters down (issue 28, item 13).
//!
//! Real Redis Clusters on loopback (`cluster-require-full-coverage no`, a 1 s
//! `cluster-node-timeout`), 270 concurrent clients (90 keys per master, each checked every
//! 50 ms), a 100 ms store timeout, one master SIGKILLed mid-traffic. Decided means decided by
//! Redis (allowed or rejected), not by the failure policy; figures per 100 ms window.
//!
//! - 3 masters: from 2 s after the kill on, at least 95 % of the healthy masters' checks are
//!   decided (100 % measured), and all 60 of a round after 2 s without traffic; each healthy
//!   master accepts at most 10 new connections in the 4 s after the kill (no reconnection to
//!   every node per probe); the dead master's keys get their failure policy (`Closed`), none
//!   later than the store timeout plus scheduling slack;
//! - 3 masters, one burst of 270 concurrent clients while the master is killed, then 2 s
//!   without traffic: all 60 checks of the next round on the healthy masters are decided;
//! - 3 masters and 3 replicas: the promoted replica serves the dead master's keys within the
//!   node timeout plus 2 s (or, when Redis itself promotes it later on a loaded machine, within
//!   700 ms of the promotion), and keeps serving them.
//!
//! `cargo test --all-features --test promises -- cluster_dead_master --nocapture` prints the
//! figures.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, FailurePolicy, LimitSpec};
use tollgate::{Name, Quota};

use crate::harness::redis_cluster::RedisCluster;
use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{one, prefix};

/// The cluster's `cluster-node-timeout`.
const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// The store's per-call timeout (generous: the machine is shared and runs debug builds).
const STORE_TIMEOUT: Duration = Duration::from_millis(100);
/// Scheduling slack on a busy 2-core machine.
const MARGIN: Duration = Duration::from_millis(150);
/// Concurrent clients, spread evenly over the masters.
const CLIENTS: usize = 270;
/// The pause between a client's checks.
const PACE: Duration = Duration::from_millis(50);
/// The measurement window.
const WINDOW: Duration = Duration::from_millis(100);
/// How soon after Redis promotes a replica the store must serve the keys on it.
const SERVE_LAG: Duration = Duration::from_millis(700);
/// What a dead master's key gets from its failure policy.
const RETRY_AFTER: Duration = Duration::from_secs(1);

fn cluster_args() -> Vec<String> {
    vec![
        "--cluster-require-full-coverage".into(),
        "no".into(),
        "--cluster-node-timeout".into(),
        NODE_TIMEOUT.as_millis().to_string(),
    ]
}

fn store(urls: &[String]) -> RedisStore {
    RedisBackend::cluster(urls.iter().cloned())
        .prefix(prefix("dead-master"))
        .timeout(STORE_TIMEOUT)
        .connect_timeout(Duration::from_millis(300))
        .build(&[LimitSpec::new(
            Name::new("per-client"),
            Quota::per_second(100_000),
            AlgorithmKind::TokenBucket,
        )
        .on_store_error(FailurePolicy::Closed {
            retry_after: RETRY_AFTER,
        })])
        .expect("build the cluster store")
}

/// The Cluster hash slot of `key` (CRC16-XMODEM of its hash tag, mod 16384).
fn slot(key: &str) -> u16 {
    let tag = match (key.find('{'), key.find('}')) {
        (Some(a), Some(b)) if b > a + 1 => &key[a + 1..b],
        _ => key,
    };
    let mut crc: u16 = 0;
    for &b in tag.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc & 16383
}

/// The port of the master serving each slot, from `CLUSTER SLOTS`.
fn slot_owners(node: &RedisServer) -> Vec<u16> {
    let value: redis::Value = node.cmd(&["CLUSTER", "SLOTS"]);
    let mut owners = vec![0u16; 16384];
    let redis::Value::Array(ranges) = value else {
        panic!("CLUSTER SLOTS: {value:?}")
    };
    for r in ranges {
        let redis::Value::Array(r) = r else { continue };
        let (Some(redis::Value::Int(a)), Some(redis::Value::Int(b)), Some(redis::Value::Array(m))) =
            (r.first(), r.get(1), r.get(2))
        else {
            continue;
        };
        let Some(redis::Value::Int(port)) = m.get(1) else {
            continue;
        };
        for s in *a..=*b {
            owners[s as usize] = *port as u16;
        }
    }
    owners
}

/// `per_master` client keys for each master port, by the slot of their Redis key.
fn clients_by_master(
    store: &RedisStore,
    owners: &[u16],
    masters: &[u16],
    per_master: usize,
) -> HashMap<u16, Vec<String>> {
    let mut by: HashMap<u16, Vec<String>> = masters.iter().map(|&p| (p, Vec::new())).collect();
    for i in 0.. {
        let client = format!("client-{i}");
        let key = store.redis_key(0, &Key::string(client.clone())).unwrap();
        if let Some(v) = by.get_mut(&owners[slot(&key) as usize])
            && v.len() < per_master
        {
            v.push(client);
        }
        if by.values().all(|v| v.len() >= per_master) {
            break;
        }
    }
    by
}

/// One finished check.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// When it started and ended, from the start of the run.
    start: Duration,
    end: Duration,
    /// Whether its key lives on the master that gets killed.
    on_dead: bool,
    /// Decided by Redis (allowed or rejected), rather than by the failure policy.
    decided: bool,
}

/// `CLIENTS` clients, each checking its key in a loop with a short pause, until `stop`.
struct Load {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    t0: Instant,
}

impl Load {
    fn start(store: &RedisStore, by_master: &HashMap<u16, Vec<String>>, dead: u16) -> Self {
        let samples = Arc::new(Mutex::new(Vec::with_capacity(200_000)));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for (&port, clients) in by_master {
            for client in clients {
                let (store, samples, stop) = (store.clone(), samples.clone(), stop.clone());
                let client = client.clone();
                let on_dead = port == dead;
                tasks.push(tokio::spawn(async move {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let start = t0.elapsed();
                        let r =
                            tokio::time::timeout(Duration::from_secs(20), one(&store, &client, 1))
                                .await
                                .expect("a check hung for 20 s");
                        let end = t0.elapsed();
                        let decided = match r {
                            Ok(_) => true,
                            Err(e) => {
                                assert_eq!(e.retry_after(), Some(RETRY_AFTER), "{e}");
                                false
                            }
                        };
                        samples.lock().unwrap().push(Sample {
                            start,
                            end,
                            on_dead,
                            decided,
                        });
                        tokio::time::sleep(PACE).await;
                    }
                }));
            }
        }
        Self {
            samples,
            stop,
            tasks,
            t0,
        }
    }

    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        let mut s = self.samples.lock().unwrap().clone();
        s.sort_by_key(|s| s.end);
        s
    }
}

/// The fraction of the checks matching `pick` that ended in each 100 ms window from `from` to
/// `to` and were decided by Redis (`None`: no such check ended in the window).
fn per_window(
    samples: &[Sample],
    from: Duration,
    to: Duration,
    pick: impl Fn(&Sample) -> bool,
) -> Vec<(Duration, Option<f64>, usize)> {
    let mut out = Vec::new();
    let mut at = from;
    while at < to {
        let next = at + WINDOW;
        let (mut n, mut decided) = (0usize, 0usize);
        for s in samples
            .iter()
            .filter(|s| s.end >= at && s.end < next && pick(s))
        {
            n += 1;
            decided += usize::from(s.decided);
        }
        out.push((at - from, (n > 0).then(|| decided as f64 / n as f64), n));
        at = next;
    }
    out
}

/// The start of the first window from which on every window with checks had at least 90 % of
/// them decided (`None`: the last one had not).
fn recovery(windows: &[(Duration, Option<f64>, usize)]) -> Option<Duration> {
    let last_bad = windows
        .iter()
        .rposition(|(_, f, _)| f.is_some_and(|f| f < 0.9));
    match last_bad {
        None => Some(Duration::ZERO),
        Some(i) if i + 1 < windows.len() => Some(windows[i + 1].0),
        Some(_) => None,
    }
}

/// The fraction of the checks matching `pick` that ended in `from..to` and were decided.
fn decided(
    samples: &[Sample],
    from: Duration,
    to: Duration,
    pick: impl Fn(&Sample) -> bool,
) -> f64 {
    let (n, d) = samples
        .iter()
        .filter(|s| s.end >= from && s.end < to && pick(s))
        .fold((0usize, 0usize), |(n, d), s| {
            (n + 1, d + usize::from(s.decided))
        });
    d as f64 / n.max(1) as f64
}

/// Connections `node` has accepted since it started (`INFO stats`).
fn connections_received(node: &RedisServer) -> u64 {
    let info: String = node.cmd(&["INFO", "stats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_connections_received in INFO stats")
}

fn show(windows: &[(Duration, Option<f64>, usize)]) -> String {
    windows
        .iter()
        .map(|(at, f, n)| match f {
            Some(f) => format!("{}ms:{:.0}%/{n}", at.as_millis(), f * 100.0),
            None => format!("{}ms:-", at.as_millis()),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Waits (polling, up to 10 s) until Redis decides every key in `clients`.
async fn warm(store: &RedisStore, clients: impl Iterator<Item = &String>) {
    for c in clients {
        let deadline = Instant::now() + Duration::from_secs(10);
        while one(store, c, 1).await.is_err() {
            assert!(Instant::now() < deadline, "the cluster never decided {c}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let stats = store.stats();
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.open_breakers() > 0 {
        assert!(
            Instant::now() < deadline,
            "a breaker stayed open: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_masters_keep_deciding_when_one_master_is_killed() {
    let args = cluster_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = RedisCluster::start_with(&args);
    let store = store(&cluster.urls());
    let owners = slot_owners(&cluster.nodes[0]);
    let ports: Vec<u16> = cluster.nodes.iter().map(RedisServer::port).collect();
    let dead = ports[0];
    let by_master = clients_by_master(&store, &owners, &ports, CLIENTS / 3);
    warm(&store, by_master.values().flatten()).await;

    let load = Load::start(&store, &by_master, dead);
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

    assert!(
        recovered.is_some_and(|d| d <= Duration::from_secs(2)) || after_2s >= 0.95,
        "healthy-master keys decided from 2 s to 4 s after the kill: {:.1} %",
        after_2s * 100.0
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
async fn a_promoted_replica_serves_the_dead_masters_keys() {
    let args = cluster_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = RedisCluster::start_replicated(1, &args);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "3 masters and 3 replicas");
    let store = store(&cluster.urls());
    let owners = slot_owners(&cluster.nodes[masters[0]]);
    let ports: Vec<u16> = masters.iter().map(|&i| cluster.nodes[i].port()).collect();
    let dead = ports[0];
    let by_master = clients_by_master(&store, &owners, &ports, CLIENTS / 3);
    warm(&store, by_master.values().flatten()).await;

    let replica = cluster.replica_of(dead);

    let load = Load::start(&store, &by_master, dead);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let killed_at = load.now();
    cluster.nodes[masters[0]].kill();
    let kill = |d: u64| killed_at + Duration::from_millis(d);
    let span = NODE_TIMEOUT + Duration::from_secs(4);
    // When Redis promotes the replica (polled every 10 ms).
    let replica_url = cluster.nodes[replica].url();
    let t0 = Instant::now() - (load.now() - killed_at);
    let watch = std::thread::spawn(move || {
        let mut conn = redis::Client::open(replica_url)
            .unwrap()
            .get_connection()
            .unwrap();
        while t0.elapsed() < span {
            let repl: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut conn)
                .unwrap();
            if repl.contains("role:master") {
                return Some(t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    });
    tokio::time::sleep(span).await;
    let promoted_by_redis = watch.join().unwrap();
    let samples = load.finish().await;
    let stats = store.stats();

    let on_dead = per_window(&samples, kill(0), killed_at + span, |s| s.on_dead);
    let healthy = per_window(&samples, kill(0), killed_at + span, |s| !s.on_dead);
    let promoted = recovery(&on_dead);
    let first = samples
        .iter()
        .find(|s| s.on_dead && s.decided && s.start > kill(100))
        .map(|s| s.end - killed_at);
    let healthy_after_2s = decided(&samples, kill(2000), killed_at + span, |s| !s.on_dead);
    let dead_at_end = decided(
        &samples,
        killed_at + span - Duration::from_secs(1),
        killed_at + span,
        |s| s.on_dead,
    );
    println!(
        "dead master's keys decided per 100 ms after the kill: {}",
        show(&on_dead)
    );
    println!(
        "healthy-master keys decided per 100 ms after the kill: {}",
        show(&healthy)
    );
    println!(
        "the dead master's keys: Redis promoted the replica {} after the kill; first decided by it {} after the kill, in every window from {} ({:.1} % in the last second); healthy masters: {:.1} % decided from 2 s on; {stats:?}",
        promoted_by_redis.map_or("never".into(), |d| format!("{} ms", d.as_millis())),
        first.map_or("never".into(), |d| format!("{} ms", d.as_millis())),
        promoted.map_or("never".into(), |d| format!("{} ms", d.as_millis())),
        dead_at_end * 100.0,
        healthy_after_2s * 100.0,
    );
    // The store cannot serve the keys before Redis promotes the replica (about 2 s after the
    // kill with a 1 s node timeout; later on a loaded machine): it must follow within a probe
    // interval or so, and within the node timeout plus 2 s unless Redis itself was later.
    let redis_promoted = promoted_by_redis.expect("Redis promoted the replica");
    let served = promoted.or(first.filter(|_| dead_at_end >= 0.95));
    let bound = (NODE_TIMEOUT + Duration::from_secs(2)).max(redis_promoted + SERVE_LAG);
    assert!(
        served.is_some_and(|d| d <= bound),
        "the promoted replica did not serve the dead master's keys within {bound:?} ({} after Redis promoted it at {redis_promoted:?})",
        served.map_or("never".into(), |d| format!("{d:?}"))
    );
    assert!(dead_at_end >= 0.95, "the promoted replica keeps serving");
    assert!(
        healthy_after_2s >= 0.95,
        "healthy-master keys decided from 2 s after the kill: {:.1} %",
        healthy_after_2s * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_masters_decide_after_a_burst_at_the_kill_and_a_pause() {
    let args = cluster_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = RedisCluster::start_with(&args);
    let store = store(&cluster.urls());
    let owners = slot_owners(&cluster.nodes[0]);
    let ports: Vec<u16> = cluster.nodes.iter().map(RedisServer::port).collect();
    let dead = ports[0];
    let by_master = clients_by_master(&store, &owners, &ports, CLIENTS / 3);
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
