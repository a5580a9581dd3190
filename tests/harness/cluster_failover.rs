//! A Redis Cluster master SIGKILLed under load, measured: clients checking keys spread over the
//! masters ([`Load`]), per-100 ms figures of what was decided by Redis ([`per_window`]), and the
//! whole failover of a 6-node Cluster ([`kill_a_master_under_load`]): when Redis promoted the
//! replica, when its keys were decided again, whether the healthy masters ever stopped, and how
//! many decisions the promotion lost. Used by `tests/promises/cluster_dead_master.rs` (which
//! asserts the bounds) and `benches/failover.rs` (which reports the figures of several runs).
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, FailurePolicy, LimitSpec};
use tollgate::{Name, Quota};

use super::redis_cluster::RedisCluster;
use super::redis_server::RedisServer;
use super::stores::{one, prefix};

/// The measurement window.
pub const WINDOW: Duration = Duration::from_millis(100);
/// What a dead master's key gets from its failure policy.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The pause between a client's checks.
pub const PACE: Duration = Duration::from_millis(50);
/// The store's per-call timeout (generous: the machine is shared and runs debug builds).
pub const STORE_TIMEOUT: Duration = Duration::from_millis(100);
/// The capacity of the failover's ledger limit: a token bucket refilling one unit an hour, so
/// that a key's `remaining` counts exactly the decisions Redis has kept for it.
pub const LEDGER: u64 = 1_000_000;
/// Checks ending this soon after the kill may still come from the dead master; checks starting
/// later can only be decided by the promoted replica (Redis promotes it a node timeout or more
/// after the kill, and the store times a call out after [`STORE_TIMEOUT`]).
const SETTLED: Duration = Duration::from_millis(500);

/// `redis-server` arguments for a Cluster that keeps serving with a master down and detects a
/// dead node after `node_timeout`.
pub fn cluster_args(node_timeout: Duration) -> Vec<String> {
    vec![
        "--cluster-require-full-coverage".into(),
        "no".into(),
        "--cluster-node-timeout".into(),
        node_timeout.as_millis().to_string(),
    ]
}

/// A Cluster store with key prefix `prefix` and a 100 ms timeout whose one limit, `quota`, fails
/// `Closed`.
pub fn store(urls: &[String], prefix: &str, quota: Quota) -> RedisStore {
    RedisBackend::cluster(urls.iter().cloned())
        .prefix(prefix)
        .timeout(STORE_TIMEOUT)
        .connect_timeout(Duration::from_millis(300))
        .build(&[
            LimitSpec::new(Name::new("per-client"), quota, AlgorithmKind::TokenBucket)
                .on_store_error(FailurePolicy::Closed {
                    retry_after: RETRY_AFTER,
                }),
        ])
        .expect("build the cluster store")
}

/// The ledger quota: every check is allowed and counted, nothing refills during a test.
pub fn ledger() -> Quota {
    Quota::per_hour(1).burst(LEDGER)
}

/// The port of the master serving each slot, from `CLUSTER SLOTS`.
pub fn slot_owners(node: &RedisServer) -> Vec<u16> {
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

/// `per_master` client keys for each master port, by the slot Redis (`node`) computes for
/// their Redis key.
pub fn clients_by_master(
    store: &RedisStore,
    node: &RedisServer,
    masters: &[u16],
    per_master: usize,
) -> HashMap<u16, Vec<String>> {
    let owners = slot_owners(node);
    let mut conn = node.conn();
    let mut by: HashMap<u16, Vec<String>> = masters.iter().map(|&p| (p, Vec::new())).collect();
    for i in 0.. {
        let client = format!("client-{i}");
        let key = store.redis_key(0, &Key::string(client.clone())).unwrap();
        let slot: usize = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query(&mut conn)
            .expect("CLUSTER KEYSLOT");
        if let Some(v) = by.get_mut(&owners[slot])
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
pub struct Sample {
    /// When it started and ended, from the start of the run.
    pub start: Duration,
    pub end: Duration,
    /// Which client (one key each) made it.
    pub client: usize,
    /// Whether its key lives on the master that gets killed.
    pub on_dead: bool,
    /// Decided by Redis (allowed or rejected), rather than by the failure policy.
    pub decided: bool,
    /// The decision's `remaining` (0 when not decided).
    pub remaining: u64,
}

/// Clients checking their keys in a loop with a short pause, until [`Load::finish`]. Each client
/// sends its checks to the stores in turn, as a load balancer spreads one client's requests
/// over the instances of an app.
pub struct Load {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    t0: Instant,
}

impl Load {
    /// One client per key in `by_master`; those of master `dead` are marked [`Sample::on_dead`].
    pub fn start(stores: &[RedisStore], by_master: &HashMap<u16, Vec<String>>, dead: u16) -> Self {
        let samples = Arc::new(Mutex::new(Vec::with_capacity(200_000)));
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        let mut masters: Vec<_> = by_master.iter().collect();
        masters.sort_by_key(|(port, _)| **port);
        for (&port, clients) in masters {
            for client_key in clients {
                let (stores, samples, stop) = (stores.to_vec(), samples.clone(), stop.clone());
                let (client, client_key) = (tasks.len(), client_key.clone());
                let on_dead = port == dead;
                tasks.push(tokio::spawn(async move {
                    let mut turn = client;
                    while !stop.load(Ordering::Relaxed) {
                        let store = &stores[turn % stores.len()];
                        turn += 1;
                        let start = t0.elapsed();
                        let r = tokio::time::timeout(
                            Duration::from_secs(20),
                            one(store, &client_key, 1),
                        )
                        .await
                        .expect("a check hung for 20 s");
                        let end = t0.elapsed();
                        let (decided, remaining) = match r {
                            Ok(d) => (true, d.remaining()),
                            Err(e) => {
                                assert_eq!(e.retry_after(), Some(RETRY_AFTER), "{e}");
                                (false, 0)
                            }
                        };
                        samples.lock().unwrap().push(Sample {
                            start,
                            end,
                            client,
                            on_dead,
                            decided,
                            remaining,
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

    /// The time since the load started.
    pub fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    /// Stops the clients; every check they made, by end time.
    pub async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        let mut s = self.samples.lock().unwrap().clone();
        s.sort_by_key(|s| s.end);
        s
    }
}

/// One 100 ms window: its start (from the `from` given to [`per_window`]), the fraction of its
/// checks decided by Redis (`None`: no check ended in it) and how many checks ended in it.
pub type Window = (Duration, Option<f64>, usize);

/// The fraction of the checks matching `pick` that ended in each 100 ms window from `from` to
/// `to` and were decided by Redis.
pub fn per_window(
    samples: &[Sample],
    from: Duration,
    to: Duration,
    pick: impl Fn(&Sample) -> bool,
) -> Vec<Window> {
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
pub fn recovery(windows: &[Window]) -> Option<Duration> {
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
pub fn decided(
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

/// The windows as `0ms:100%/42 100ms:-` (start, decided, checks).
pub fn show(windows: &[Window]) -> String {
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
pub async fn warm(store: &RedisStore, clients: impl Iterator<Item = &String>) {
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

/// A number from an `INFO` reply's `field:value` line.
fn info_field(info: &str, field: &str) -> Option<i64> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// What one failover did, every time measured from the kill.
#[derive(Debug, Clone)]
pub struct Failover {
    /// When Redis promoted the replica (`INFO replication` says `role:master`, polled every
    /// 10 ms).
    pub promoted_by_redis: Option<Duration>,
    /// When the dead master's keys were decided by Redis again: from then on at least 90 % of
    /// their checks in every window (or their first decided check, when at least 95 % of those
    /// in the last second were decided).
    pub decided_again: Option<Duration>,
    /// The fraction of the dead master's keys' checks decided in the last second measured.
    pub dead_at_end: f64,
    /// The healthy masters' keys, per window from the kill.
    pub healthy: Vec<Window>,
    /// The fraction of the healthy masters' keys' checks decided after the kill.
    pub healthy_decided: f64,
    /// The fraction of the healthy masters' keys' checks decided in the last second measured.
    pub healthy_at_end: f64,
    /// Decisions the clients saw the dead master make (summed over its keys).
    pub confirmed: u64,
    /// Of those, decisions the promoted replica did not have: the keys' state on it was that
    /// many decisions behind what the clients had been told (summed over the keys).
    pub lost: u64,
    /// The dead master's keys whose state the promoted replica did not have at all.
    pub keys_reset: usize,
    /// The dead master's keys that got a decision from the promoted replica.
    pub keys_decided_again: usize,
    /// The dead master's keys.
    pub keys: usize,
    /// Pairs of checks on one key, decided by the promoted replica through different
    /// instances, that were told the same `remaining` (two counters instead of one).
    pub split_counts: usize,
    /// Decisions the dead master made in the [`lag_window`](Self::lag_window) before the kill.
    pub decisions_before_kill: usize,
    /// The window `decisions_before_kill` counts.
    pub lag_window: Duration,
    /// The replica's replication lag just before the kill, in bytes: `master_repl_offset` of
    /// the master less the replica's `slave_repl_offset`, read just before (an upper bound).
    pub lag_bytes: Option<i64>,
    /// Each store's statistics at the end (`RedisStats`, as `Debug`).
    pub stats: Vec<String>,
    /// Calls that timed out, summed over the stores (the machine did not keep up, or a store
    /// stalled).
    pub timeouts: u64,
    /// Each store's batching tasks at the end (`RedisStats::batchers`), once the dead master's
    /// has ended (waiting up to 2 s for it).
    pub batchers: Vec<u64>,
}

impl Failover {
    /// The healthy masters' windows in which no check ended or none was decided.
    pub fn healthy_stops(&self) -> usize {
        stops(&self.healthy)
    }

    /// The longest run of consecutive windows in which fewer than 95 % of the healthy masters'
    /// checks were decided (a window without checks counts).
    pub fn healthy_longest_gap(&self) -> Duration {
        longest_gap(&self.healthy)
    }

    /// The smallest fraction of the healthy masters' checks decided in one window (0 for a
    /// window without checks).
    pub fn healthy_worst_window(&self) -> f64 {
        worst_window(&self.healthy)
    }
}

/// The smallest fraction of checks decided in one of `windows` (0 for a window without checks).
pub fn worst_window(windows: &[Window]) -> f64 {
    windows
        .iter()
        .map(|(_, f, _)| f.unwrap_or(0.0))
        .fold(1.0, f64::min)
}

/// The windows in which no check ended or none was decided.
pub fn stops(windows: &[Window]) -> usize {
    windows
        .iter()
        .filter(|(_, f, _)| f.is_none_or(|f| f == 0.0))
        .count()
}

/// The longest run of consecutive windows in which fewer than 95 % of the checks were decided
/// (a window without checks counts).
pub fn longest_gap(windows: &[Window]) -> Duration {
    let (mut longest, mut run) = (0u32, 0u32);
    for (_, f, _) in windows {
        run = if f.is_some_and(|f| f >= 0.95) {
            0
        } else {
            run + 1
        };
        longest = longest.max(run);
    }
    WINDOW * longest
}

/// Starts a 6-node Cluster (3 masters, a replica each, `cluster-node-timeout` of
/// `node_timeout`), runs `clients_per_master` clients per master through two stores (two
/// instances of an app) for 1 s, SIGKILLs a master, keeps the load for the node timeout plus
/// 4 s and measures the failover.
pub async fn kill_a_master_under_load(
    node_timeout: Duration,
    clients_per_master: usize,
) -> Failover {
    let args = cluster_args(node_timeout);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = RedisCluster::start_replicated(1, &args);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "3 masters and 3 replicas");
    let prefix = prefix("failover");
    let stores = [0, 1].map(|_| store(&cluster.urls(), &prefix, ledger()));
    let ports: Vec<u16> = masters.iter().map(|&i| cluster.nodes[i].port()).collect();
    let dead = ports[0];
    let by_master = clients_by_master(
        &stores[0],
        &cluster.nodes[masters[0]],
        &ports,
        clients_per_master,
    );
    warm(&stores[0], by_master.values().flatten()).await;
    warm(&stores[1], by_master.values().flatten()).await;
    let replica = cluster.replica_of(dead);

    let load = Load::start(&stores, &by_master, dead);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // The replica's offset first: the lag read is then at least the lag at either reading.
    let replica_offset = info_field(
        &cluster.nodes[replica].cmd::<String>(&["INFO", "replication"]),
        "slave_repl_offset",
    );
    let master_offset = info_field(
        &cluster.nodes[masters[0]].cmd::<String>(&["INFO", "replication"]),
        "master_repl_offset",
    );
    let killed_at = load.now();
    cluster.nodes[masters[0]].kill();
    let kill = |d: Duration| killed_at + d;
    let span = node_timeout + Duration::from_secs(4);
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

    let end = kill(span);
    let on_dead = per_window(&samples, kill(Duration::ZERO), end, |s| s.on_dead);
    let healthy = per_window(&samples, kill(Duration::ZERO), end, |s| !s.on_dead);
    let first = samples
        .iter()
        .find(|s| s.on_dead && s.decided && s.start > kill(WINDOW))
        .map(|s| s.end - killed_at);
    let dead_at_end = decided(&samples, end - Duration::from_secs(1), end, |s| s.on_dead);
    let decided_again = recovery(&on_dead).or(first.filter(|_| dead_at_end >= 0.95));
    let healthy_decided = decided(&samples, kill(Duration::ZERO), end, |s| !s.on_dead);
    let healthy_at_end = decided(&samples, end - Duration::from_secs(1), end, |s| !s.on_dead);

    let ledger = Ledger::of(&samples, kill(SETTLED));
    let lag_window = Duration::from_millis(500);
    let decisions_before_kill = samples
        .iter()
        .filter(|s| s.on_dead && s.decided && s.end + lag_window >= killed_at && s.end < killed_at)
        .count();
    Failover {
        promoted_by_redis,
        decided_again,
        dead_at_end,
        healthy,
        healthy_decided,
        healthy_at_end,
        confirmed: ledger.confirmed,
        lost: ledger.lost,
        keys_reset: ledger.keys_reset,
        keys_decided_again: ledger.keys_decided_again,
        keys: clients_per_master,
        split_counts: ledger.split_counts,
        decisions_before_kill,
        lag_window,
        lag_bytes: master_offset.zip(replica_offset).map(|(m, r)| m - r),
        stats: stores.iter().map(|s| format!("{:?}", s.stats())).collect(),
        timeouts: stores.iter().map(|s| s.stats().timeouts()).sum(),
        batchers: settled_batchers(&stores).await,
    }
}

/// Each store's batching tasks, once at most one per live master runs, or after 2 s.
async fn settled_batchers(stores: &[RedisStore]) -> Vec<u64> {
    let counts = || {
        stores
            .iter()
            .map(|s| s.stats().batchers())
            .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while counts().iter().any(|&b| b > 3) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    counts()
}

/// The dead master's keys, from the `remaining` their checks were told (every check costs one
/// unit of a [`LEDGER`]-sized bucket that does not refill, so `LEDGER - remaining` is how many
/// decisions Redis had kept for the key, this one included).
struct Ledger {
    confirmed: u64,
    lost: u64,
    keys_reset: usize,
    keys_decided_again: usize,
    split_counts: usize,
}

impl Ledger {
    /// Checks ending before `settled` were decided by the old master, those starting after it by
    /// the promoted replica.
    fn of(samples: &[Sample], settled: Duration) -> Self {
        let mut by_client: HashMap<usize, (Vec<u64>, Vec<u64>)> = HashMap::new();
        for s in samples.iter().filter(|s| s.on_dead && s.decided) {
            let (before, after) = by_client.entry(s.client).or_default();
            if s.end < settled {
                before.push(s.remaining);
            } else if s.start > settled {
                after.push(s.remaining);
            }
        }
        let mut ledger = Self {
            confirmed: 0,
            lost: 0,
            keys_reset: 0,
            keys_decided_again: 0,
            split_counts: 0,
        };
        for (before, mut after) in by_client.into_values() {
            let Some(&lowest_before) = before.iter().min() else {
                continue;
            };
            let confirmed = LEDGER - lowest_before;
            ledger.confirmed += confirmed;
            let Some(&highest_after) = after.iter().max() else {
                continue;
            };
            ledger.keys_decided_again += 1;
            // The replica's state before its first decision for the key.
            let kept = LEDGER - highest_after - 1;
            ledger.lost += confirmed.saturating_sub(kept);
            ledger.keys_reset += usize::from(kept == 0);
            after.sort_unstable();
            ledger.split_counts += after.windows(2).filter(|w| w[0] == w[1]).count();
        }
        ledger
    }
}
