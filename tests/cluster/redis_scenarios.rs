//! One semantics, many backends: a table of scenarios (times, costs, expected decisions) runs
//! against the memory store, a Redis node and a 3-master Redis Cluster, which must give identical
//! decisions; randomised request streams compare the three decision by decision; several limits
//! per request stay all-or-nothing on every backend.

use std::sync::OnceLock;
use std::time::Duration;

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{Backend, LimitCheck, LimitSpec, Store};
use tollgate::{Decision, Quota};

use crate::harness::redis_cluster::RedisCluster;
use crate::harness::redis_server::RedisServer;
use crate::harness::rng::Rng;
use crate::harness::stores::{cluster_store, decide, memory_store, node_store, one, spec};

fn node() -> &'static RedisServer {
    static NODE: OnceLock<RedisServer> = OnceLock::new();
    NODE.get_or_init(RedisServer::start)
}

fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

const MS: u64 = 1_000;
const S: u64 = 1_000_000;

/// What one step expects.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// Allowed, with this many units remaining.
    Allowed(u64),
    /// Rejected, with this many remaining, retry after this many µs.
    Rejected(u64, u64),
    /// Rejected for good: the cost exceeds the capacity.
    Impossible,
}

/// `repeat` requests of `cost` at `at` µs; the last one must match `want`, earlier ones are
/// compared across backends only.
#[derive(Debug, Clone, Copy)]
struct Step {
    at: u64,
    cost: u64,
    repeat: u32,
    want: Want,
}

const fn step(at: u64, cost: u64, repeat: u32, want: Want) -> Step {
    Step {
        at,
        cost,
        repeat,
        want,
    }
}

struct Scenario {
    name: &'static str,
    algorithm: AlgorithmKind,
    quota: Quota,
    steps: Vec<Step>,
}

fn scenarios() -> Vec<Scenario> {
    use AlgorithmKind::*;
    use Want::*;
    vec![
        // The seeds' worked minute: capacity 20 at 10/s takes a batch of 20, rejects a request
        // 50 ms later with a 50 ms retry, and is full again 3 s later.
        Scenario {
            name: "token bucket: batch, retry, refill",
            algorithm: TokenBucket,
            quota: Quota::per_second(10).burst(20),
            steps: vec![
                step(0, 1, 20, Allowed(0)),
                step(50 * MS, 1, 1, Rejected(0, 50 * MS)),
                step(3 * S, 21, 1, Impossible),
                step(3 * S, 20, 1, Allowed(0)),
                step(3 * S + 100 * MS, 1, 1, Allowed(0)),
                step(3 * S + 100 * MS, 2, 1, Rejected(0, 200 * MS)),
            ],
        },
        // Capacity 20 refilling 2/s, idle for a minute, then 30 at once: 20 pass.
        Scenario {
            name: "token bucket: idle minute caps at capacity",
            algorithm: TokenBucket,
            quota: Quota::per_second(2).burst(20),
            steps: vec![
                step(60 * S, 1, 20, Allowed(0)),
                step(60 * S, 1, 10, Rejected(0, 500 * MS)),
            ],
        },
        Scenario {
            name: "gcra: batch, retry, refill",
            algorithm: Gcra,
            quota: Quota::per_second(10).burst(20),
            steps: vec![
                step(0, 1, 20, Allowed(0)),
                step(50 * MS, 1, 1, Rejected(0, 50 * MS)),
                step(100 * MS, 1, 1, Allowed(0)),
                step(3 * S, 21, 1, Impossible),
                step(3 * S, 20, 1, Allowed(0)),
                step(3 * S, 0, 1, Allowed(0)),
            ],
        },
        Scenario {
            name: "gcra: uneven emission interval",
            algorithm: Gcra,
            quota: Quota::per_second(3).burst(2),
            steps: vec![
                step(0, 2, 1, Allowed(0)),
                step(10, 1, 1, Rejected(0, 333_334 - 10)),
                step(333_334, 1, 1, Allowed(0)),
            ],
        },
        // A byte rate (cost = bytes): 10 MiB/s, 10,485.76 bytes per ms, far above 1 unit/µs.
        Scenario {
            name: "token bucket: 10 MiB/s byte rate",
            algorithm: TokenBucket,
            quota: Quota::per_second(10 * 1024 * 1024),
            steps: byte_rate_steps(),
        },
        Scenario {
            name: "gcra: 10 MiB/s byte rate",
            algorithm: Gcra,
            quota: Quota::per_second(10 * 1024 * 1024),
            steps: byte_rate_steps(),
        },
        // 100 just before a seam and 100 just after: the fixed window's known flaw.
        Scenario {
            name: "fixed window: double at the seam",
            algorithm: FixedWindow,
            quota: Quota::per_minute(100),
            steps: vec![
                step(59 * S, 1, 100, Allowed(0)),
                step(59 * S, 1, 1, Rejected(0, S)),
                step(60 * S, 1, 100, Allowed(0)),
                step(61 * S, 1, 1, Rejected(0, 59 * S)),
                step(120 * S, 101, 1, Impossible),
                step(120 * S, 100, 1, Allowed(0)),
            ],
        },
        Scenario {
            name: "fixed window: counts per aligned window",
            algorithm: FixedWindow,
            quota: Quota::per_second(3),
            steps: vec![
                step(2 * S + 400 * MS, 1, 3, Allowed(0)),
                step(2 * S + 400 * MS, 1, 1, Rejected(0, 600 * MS)),
                step(3 * S, 2, 1, Allowed(1)),
            ],
        },
        // The seeds' estimate: 90 in the previous minute, 20 so far, 15 s in: 20 + 90 x 0.75.
        Scenario {
            name: "sliding window: the 87.5 estimate",
            algorithm: SlidingWindow,
            quota: Quota::per_minute(100),
            steps: vec![
                step(30 * S, 1, 90, Allowed(10)),
                step(75 * S, 1, 20, Allowed(13)), // floor(67.5) + 20 = 87 spent
                step(75 * S, 1, 1, Allowed(12)),  // 88
                step(75 * S, 13, 1, Rejected(12, 333_334)), // fits once 90 x (60 - e) / 60 < 67
                step(75 * S, 101, 1, Impossible),
                step(200 * S, 100, 1, Allowed(0)), // stale windows are not carried forward
            ],
        },
        Scenario {
            name: "sliding log: exact in every window",
            algorithm: SlidingLog,
            quota: Quota::per(Duration::from_secs(10), 3),
            steps: vec![
                step(0, 1, 1, Allowed(2)),
                step(4 * S, 1, 1, Allowed(1)),
                step(8 * S, 1, 1, Allowed(0)),
                step(9 * S, 1, 1, Rejected(0, S)),
                step(10 * S, 1, 1, Allowed(0)),
                step(10 * S, 4, 1, Impossible),
                step(11 * S, 2, 1, Rejected(0, 7 * S)),
            ],
        },
        // The seam that doubles a fixed window is closed by the log.
        Scenario {
            name: "sliding log: no double at the seam",
            algorithm: SlidingLog,
            quota: Quota::per_minute(100),
            steps: vec![
                step(59 * S, 1, 100, Allowed(0)),
                step(60 * S, 1, 100, Rejected(0, 59 * S)),
                step(61 * S, 1, 1, Rejected(0, 58 * S)),
                step(119 * S, 50, 1, Allowed(50)),
            ],
        },
        Scenario {
            name: "leaky bucket: a queue of 3 draining 1/s",
            algorithm: LeakyBucket,
            quota: Quota::per_second(1).burst(3),
            steps: vec![
                step(0, 1, 3, Allowed(0)),
                step(0, 1, 1, Rejected(0, S)),
                step(500 * MS, 1, 1, Rejected(0, 500 * MS)),
                step(S, 1, 1, Allowed(0)),
                step(S, 4, 1, Impossible),
                step(10 * S, 3, 1, Allowed(0)),
            ],
        },
    ]
}

/// 10 MiB/s drained at 0: after 1 ms 10,485.76 bytes are back, so 10,485 remain, 10,486 waits
/// 1 µs and then leaves 10.
fn byte_rate_steps() -> Vec<Step> {
    use Want::*;
    const MIB10: u64 = 10 * 1024 * 1024;
    vec![
        step(0, MIB10, 1, Allowed(0)),
        step(MS, 10_486, 1, Rejected(10_485, 1)),
        step(MS + 1, 10_486, 1, Allowed(10)),
        step(2 * S, MIB10 + 1, 1, Impossible),
        step(2 * S, MIB10, 1, Allowed(0)),
    ]
}

fn check_want(name: &str, i: usize, d: &Decision, want: Want) {
    let ok = match want {
        Want::Allowed(r) => d.allowed() && d.remaining() == r,
        Want::Rejected(r, retry) => {
            !d.allowed()
                && d.remaining() == r
                && d.retry_after() == Some(Duration::from_micros(retry))
        }
        Want::Impossible => d.is_impossible(),
    };
    assert!(ok, "{name}, step {i}: expected {want:?}, got {d:?}");
}

async fn run_scenario<S: Store>(store: &S, clock: &ManualClock, sc: &Scenario) -> Vec<Decision> {
    let mut out = Vec::new();
    for (i, st) in sc.steps.iter().enumerate() {
        clock.set_micros(st.at);
        for _ in 0..st.repeat {
            out.push(one(store, "client-1", st.cost).await.expect("decided"));
        }
        check_want(sc.name, i, out.last().unwrap(), st.want);
    }
    out
}

/// Implemented algorithms: the table and the fuzzing cover every one the Redis backend builds.
fn supported(kind: AlgorithmKind) -> bool {
    tollgate::store::redis::RedisBackend::new("redis://127.0.0.1:1")
        .build(&[spec("probe", default_quota(kind), kind)])
        .is_ok()
}

fn default_quota(kind: AlgorithmKind) -> Quota {
    match kind {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => {
            Quota::per_second(7).burst(11)
        }
        _ => Quota::per(Duration::from_millis(700), 9),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_table_is_identical_on_memory_node_and_cluster() {
    let urls = cluster().urls();
    let mut covered = Vec::new();
    for sc in scenarios() {
        if !supported(sc.algorithm) {
            continue;
        }
        covered.push(sc.algorithm);
        let limits = [spec("limit", sc.quota, sc.algorithm)];
        let (c1, c2, c3) = (ManualClock::new(), ManualClock::new(), ManualClock::new());
        let memory = run_scenario(&memory_store(&c1, &limits), &c1, &sc).await;
        let node = run_scenario(&node_store(&node().url(), "table", &c2, &limits), &c2, &sc).await;
        let clustered = run_scenario(&cluster_store(&urls, "table", &c3, &limits), &c3, &sc).await;
        assert_eq!(memory, node, "{}: memory vs node", sc.name);
        assert_eq!(memory, clustered, "{}: memory vs cluster", sc.name);
    }
    for kind in AlgorithmKind::ALL {
        if supported(kind) {
            assert!(covered.contains(&kind), "no scenario for {kind}");
        }
    }
}

/// Random streams (times, costs, several clients) decided by all three backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_streams_decide_identically_on_every_backend() {
    let urls = cluster().urls();
    for kind in AlgorithmKind::ALL.into_iter().filter(|k| supported(*k)) {
        for (seed, quota) in [(7u64, default_quota(kind)), (99, Quota::per_second(1))] {
            let limits = [spec("fuzz", quota, kind)];
            let (c1, c2, c3) = (ManualClock::new(), ManualClock::new(), ManualClock::new());
            let memory = memory_store(&c1, &limits);
            let node = node_store(&node().url(), "fuzz", &c2, &limits);
            let clustered = cluster_store(&urls, "fuzz", &c3, &limits);
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut t = 1_700_000_000_000_000u64; // a realistic epoch time in µs
            for i in 0..300 {
                t += rng.below(250 * MS);
                if rng.below(10) == 0 {
                    t += rng.below(5 * S);
                }
                let cost = rng.below(5);
                let client = format!("c{}", rng.below(3));
                for c in [&c1, &c2, &c3] {
                    c.set_micros(t);
                }
                let m = one(&memory, &client, cost).await.unwrap();
                let n = one(&node, &client, cost).await.unwrap();
                let k = one(&clustered, &client, cost).await.unwrap();
                assert_eq!(m, n, "{kind} seed {seed} step {i}: memory vs node");
                assert_eq!(m, k, "{kind} seed {seed} step {i}: memory vs cluster");
            }
        }
    }
}

/// Two limits per request for one client (one slot: the general, all-or-nothing path of the
/// script, and every algorithm's separate decide and apply), random streams, three backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_multi_limit_streams_decide_identically_on_every_backend() {
    let urls = cluster().urls();
    let kinds: Vec<AlgorithmKind> = AlgorithmKind::ALL
        .into_iter()
        .filter(|k| supported(*k))
        .collect();
    for (i, &kind) in kinds.iter().enumerate() {
        let other = kinds[(i + 1) % kinds.len()];
        let limits = [
            spec("first", default_quota(kind), kind),
            spec("second", Quota::per_second(3), other),
        ];
        let (c1, c2, c3) = (ManualClock::new(), ManualClock::new(), ManualClock::new());
        let memory = memory_store(&c1, &limits);
        let node = node_store(&node().url(), "multi", &c2, &limits);
        let clustered = cluster_store(&urls, "multi", &c3, &limits);
        let mut rng = Rng(1234 + i as u64);
        let mut t = 1_700_000_000_000_000u64;
        for step in 0..200 {
            t += rng.below(200 * MS);
            for c in [&c1, &c2, &c3] {
                c.set_micros(t);
            }
            let client = format!("c{}", rng.below(2));
            let checks = [
                LimitCheck::new(0, Key::string(client.clone()), rng.below(4)),
                LimitCheck::new(1, Key::string(client).scoped("GET", "/x"), rng.below(2)),
            ];
            let m = decide(&memory, &checks).await.unwrap();
            let n = decide(&node, &checks).await.unwrap();
            let k = decide(&clustered, &checks).await.unwrap();
            assert_eq!(
                m.as_slice(),
                n.as_slice(),
                "{kind}+{other} step {step}: memory vs node"
            );
            assert_eq!(
                m.as_slice(),
                k.as_slice(),
                "{kind}+{other} step {step}: memory vs cluster"
            );
        }
    }
}

fn two_limits(second: Quota) -> [LimitSpec; 2] {
    [
        spec(
            "burst",
            Quota::per_second(10).burst(5),
            AlgorithmKind::TokenBucket,
        ),
        spec("daily", second, AlgorithmKind::FixedWindow),
    ]
}

/// Burst + daily quota for one client: one slot, one script call, all-or-nothing. When the
/// daily quota rejects, the burst limit is not charged, on every backend, with identical
/// decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_limits_are_all_or_nothing_on_every_backend() {
    let limits = two_limits(Quota::per_day(3));
    let (c1, c2, c3) = (ManualClock::new(), ManualClock::new(), ManualClock::new());
    let memory = memory_store(&c1, &limits);
    let node = node_store(&node().url(), "aon", &c2, &limits);
    let clustered = cluster_store(&cluster().urls(), "aon", &c3, &limits);
    let user = Key::int(42);
    let checks = [
        LimitCheck::new(0, user.clone(), 1),
        LimitCheck::new(1, user.clone(), 1),
    ];
    let mut answers = Vec::new();
    for store in [&node, &clustered] {
        let mut seq = Vec::new();
        for _ in 0..4 {
            seq.push(decide(store, &checks).await.unwrap());
        }
        answers.push(seq);
    }
    let mut seq = Vec::new();
    for _ in 0..4 {
        seq.push(decide(&memory, &checks).await.unwrap());
    }
    let fourth = seq[3].clone();
    assert!(!fourth.allowed());
    assert_eq!(fourth.rejected().unwrap().policy().as_str(), "daily");
    // The burst limit reports 2 left (3 charged), not 1: the rejected request charged nothing.
    assert_eq!(fourth.as_slice()[0].remaining(), 2);
    for other in &answers {
        for (a, b) in seq.iter().zip(other) {
            assert_eq!(a.as_slice(), b.as_slice());
        }
    }
    // And the state agrees: the next burst-only check sees 2 remaining before it is charged.
    let burst_only = [LimitCheck::new(0, user.clone(), 0)];
    for store in [&node, &clustered] {
        assert_eq!(
            decide(store, &burst_only).await.unwrap().as_slice()[0].remaining(),
            2
        );
    }
}

/// A per-client limit and a global ceiling live in different slots of a Cluster: reserve, then
/// refund when the other slot rejects. After the refund the per-client limit holds exactly what
/// it held before, and the decisions match the memory store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_slot_limits_reserve_then_refund_in_a_cluster() {
    let limits = [
        spec(
            "per-client",
            Quota::per_second(1).burst(5),
            AlgorithmKind::TokenBucket,
        ),
        spec("global", Quota::per_second(1).burst(3), AlgorithmKind::Gcra),
    ];
    let (c1, c2) = (ManualClock::new(), ManualClock::new());
    let memory = memory_store(&c1, &limits);
    let clustered = cluster_store(&cluster().urls(), "xslot", &c2, &limits);
    let stats = clustered.stats();
    // The two keys really are in different slots.
    let a = clustered.redis_key(0, &Key::string("alice")).unwrap();
    let g = clustered.redis_key(1, &Key::global()).unwrap();
    assert_ne!(cluster().keyslot(&a), cluster().keyslot(&g));
    let mut decisions = Vec::new();
    for store_is_memory in [true, false] {
        let mut seq = Vec::new();
        for (who, cost) in [
            ("alice", 1),
            ("bob", 1),
            ("alice", 1),
            ("alice", 1),
            ("bob", 1),
        ] {
            let checks = [
                LimitCheck::new(0, Key::string(who), cost),
                LimitCheck::new(1, Key::global(), cost),
            ];
            let d = if store_is_memory {
                decide(&memory, &checks).await.unwrap()
            } else {
                decide(&clustered, &checks).await.unwrap()
            };
            seq.push(d);
        }
        decisions.push(seq);
    }
    for (i, (m, c)) in decisions[0].iter().zip(&decisions[1]).enumerate() {
        assert_eq!(m.as_slice(), c.as_slice(), "request {i}");
    }
    // The global ceiling of 3 rejected the last two; alice's limit was refunded for the 4th.
    assert!(!decisions[1][3].allowed());
    assert_eq!(
        decisions[1][3].rejected().unwrap().policy().as_str(),
        "global"
    );
    assert_eq!(stats.refunds(), 2);
    let alice = [LimitCheck::new(0, Key::string("alice"), 0)];
    assert_eq!(
        decide(&clustered, &alice).await.unwrap().as_slice()[0].remaining(),
        3
    );
}

/// Refunds mirror the Rust `refund` for every algorithm: a reservation refunded in a Cluster
/// leaves the same state as the memory store, which never charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_restore_exactly_for_every_algorithm() {
    for kind in AlgorithmKind::ALL.into_iter().filter(|k| supported(*k)) {
        let limits = [
            spec("per-client", default_quota(kind), kind),
            spec(
                "ceiling",
                Quota::per_second(1).burst(1),
                AlgorithmKind::TokenBucket,
            ),
        ];
        let (c1, c2) = (ManualClock::new(), ManualClock::new());
        let memory = memory_store(&c1, &limits);
        let clustered = cluster_store(&cluster().urls(), "refund", &c2, &limits);
        let mut rng = Rng(31);
        let mut t = 10 * S;
        for i in 0..60 {
            t += rng.below(300 * MS);
            c1.set_micros(t);
            c2.set_micros(t);
            let cost = rng.below(3);
            // Half the requests pass the ceiling (a fresh key each time), half hit a drained one.
            let ceiling = if rng.below(2) == 0 {
                format!("fresh{i}")
            } else {
                "drained".to_owned()
            };
            let checks = [
                LimitCheck::new(0, Key::string("alice"), cost),
                LimitCheck::new(1, Key::string(ceiling), 1),
            ];
            let m = decide(&memory, &checks).await.unwrap();
            let c = decide(&clustered, &checks).await.unwrap();
            assert_eq!(m.as_slice(), c.as_slice(), "{kind} step {i}");
        }
    }
}
