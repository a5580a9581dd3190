//! Distributed correctness: many independent limiter instances — separate stores with separate
//! connections, and separate processes — firing concurrently at one key admit exactly the
//! capacity, never more. The same harness run against a naive GET-then-SET limiter over-admits,
//! which shows the harness can fail.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate::algorithm::AlgorithmKind;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, FailurePolicy, LimitSpec};
use tollgate::{Name, Quota};

use crate::harness::redis_cluster::RedisCluster;
use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{self, one, prefix};

const INSTANCES: usize = 8;
const PER_INSTANCE: usize = 40;
const CAPACITY: u64 = 100;

/// A quota whose capacity is `CAPACITY` and that refills far slower than the test runs.
fn quota(kind: AlgorithmKind) -> Quota {
    match kind {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => {
            Quota::per_day(1).burst(CAPACITY)
        }
        _ => Quota::per_day(CAPACITY),
    }
}

fn limits(kind: AlgorithmKind) -> [LimitSpec; 1] {
    [
        LimitSpec::new(Name::new("shared"), quota(kind), kind).on_store_error(
            FailurePolicy::Closed {
                retry_after: Duration::from_secs(1),
            },
        ),
    ]
}

/// One limiter instance: a real store, or the naive read-then-write limiter.
enum Limiter {
    Store(RedisStore),
    Naive(redis::aio::MultiplexedConnection, String),
}

impl Limiter {
    async fn allow(&self) -> bool {
        match self {
            Limiter::Store(s) => one(s, "one-hot-key", 1)
                .await
                .expect("no failures in this test")
                .allowed(),
            Limiter::Naive(conn, key) => {
                // GET, compare, SET: the read-modify-write race the seeds warn about.
                let mut c = conn.clone();
                let count: Option<u64> = redis::cmd("GET")
                    .arg(key)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                let count = count.unwrap_or(0);
                if count >= CAPACITY {
                    return false;
                }
                let _: () = redis::cmd("SET")
                    .arg(key)
                    .arg(count + 1)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                true
            }
        }
    }
}

/// Fires `PER_INSTANCE` concurrent requests from each instance, all released together; returns
/// how many were admitted.
async fn hammer(instances: Vec<Limiter>) -> u64 {
    let barrier = Arc::new(tokio::sync::Barrier::new(instances.len() * PER_INSTANCE));
    let mut tasks = Vec::new();
    for limiter in instances.into_iter().map(Arc::new) {
        for _ in 0..PER_INSTANCE {
            let (limiter, barrier) = (limiter.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                limiter.allow().await
            }));
        }
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += u64::from(t.await.unwrap());
    }
    admitted
}

fn node_instances(url: &str, kind: AlgorithmKind, prefix: &str) -> Vec<Limiter> {
    (0..INSTANCES)
        .map(|_| {
            Limiter::Store(
                RedisBackend::new(url)
                    .prefix(prefix)
                    .timeout(Duration::from_secs(5))
                    .build(&limits(kind))
                    .unwrap(),
            )
        })
        .collect()
}

fn supported(kind: AlgorithmKind) -> bool {
    RedisBackend::new("redis://127.0.0.1:1")
        .build(&limits(kind))
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_instances_admit_exactly_the_capacity_on_a_node() {
    let server = RedisServer::start();
    for kind in AlgorithmKind::ALL.into_iter().filter(|k| supported(*k)) {
        let admitted = hammer(node_instances(&server.url(), kind, &prefix("dist"))).await;
        assert_eq!(
            admitted, CAPACITY,
            "{kind}: {INSTANCES} instances x {PER_INSTANCE} requests"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_instances_admit_exactly_the_capacity_on_a_cluster() {
    let cluster = RedisCluster::start();
    for kind in AlgorithmKind::ALL.into_iter().filter(|k| supported(*k)) {
        let p = prefix("dist-cluster");
        let instances = (0..INSTANCES)
            .map(|_| {
                Limiter::Store(
                    RedisBackend::cluster(cluster.urls())
                        .prefix(p.clone())
                        .timeout(Duration::from_secs(5))
                        .build(&limits(kind))
                        .unwrap(),
                )
            })
            .collect();
        assert_eq!(hammer(instances).await, CAPACITY, "{kind}");
    }
}

/// The control: the same harness against GET-then-SET admits more than the capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_naive_get_then_set_limiter_over_admits_under_the_same_harness() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        instances.push(Limiter::Naive(conn, "naive".to_owned()));
    }
    let admitted = hammer(instances).await;
    assert!(
        admitted > CAPACITY,
        "the naive limiter admitted {admitted} of {CAPACITY}"
    );
}

const CHILD_URL: &str = "TOLLGATE_TEST_CHILD_URL";
const CHILD_PREFIX: &str = "TOLLGATE_TEST_CHILD_PREFIX";
const CHILD_START: &str = "TOLLGATE_TEST_CHILD_START_MS";

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Separate processes: this test binary runs itself `INSTANCES` times (the `child_instance` test
/// below, selected by environment variables); each process builds its own store and fires at
/// the same key at the same moment.
#[test]
fn separate_processes_admit_exactly_the_capacity() {
    let server = RedisServer::start();
    let prefix = prefix("procs");
    let start = unix_ms() + 1_500;
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..INSTANCES)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "redis_distributed::child_instance",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_URL, server.url())
                .env(CHILD_PREFIX, &prefix)
                .env(CHILD_START, start.to_string())
                .output_async()
        })
        .collect();
    let mut counts = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let n: u64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("ADMITTED="))
            .unwrap_or_else(|| panic!("no count in child output: {stdout}"))
            .trim()
            .parse()
            .unwrap();
        counts.push(n);
    }
    let admitted: u64 = counts.iter().sum();
    assert_eq!(
        admitted, CAPACITY,
        "{INSTANCES} processes x {PER_INSTANCE} requests: {counts:?}"
    );
    // They really raced: more than one process won some of the capacity.
    assert!(counts.iter().filter(|n| **n > 0).count() > 1, "{counts:?}");
    eprintln!("admitted per process: {counts:?}");
}

/// One instance of `separate_processes_admit_exactly_the_capacity`; does nothing when run by
/// the test harness directly.
#[test]
fn child_instance() {
    let (Ok(url), Ok(prefix), Ok(start)) = (
        std::env::var(CHILD_URL),
        std::env::var(CHILD_PREFIX),
        std::env::var(CHILD_START),
    ) else {
        return;
    };
    let start: u64 = start.parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let admitted = rt.block_on(async move {
        let store = RedisBackend::new(url)
            .prefix(prefix)
            .timeout(Duration::from_secs(5))
            .build(&limits(AlgorithmKind::TokenBucket))
            .unwrap();
        // Connect and load the script before the start, with a different key.
        one(&store, "warm-up", 0).await.unwrap();
        let now = unix_ms();
        if start > now {
            tokio::time::sleep(Duration::from_millis(start - now)).await;
        }
        let store = Arc::new(store);
        let tasks: Vec<_> = (0..PER_INSTANCE)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { one(&*store, "one-hot-key", 1).await.unwrap().allowed() })
            })
            .collect();
        let mut n = 0u64;
        for t in tasks {
            n += u64::from(t.await.unwrap());
        }
        n
    });
    println!("\nADMITTED={admitted}");
}

/// `Command::output` for many children at once: spawn now, collect later.
trait OutputAsync {
    fn output_async(&mut self) -> std::process::Child;
}

impl OutputAsync for Command {
    fn output_async(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// The batcher's compact call carries the limit index and the cost: checks against a store's
/// second limit with a cost of 3, from several instances at once, spend exactly its capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_checks_of_another_limit_and_cost_spend_exactly_the_capacity() {
    let server = RedisServer::start();
    let p = prefix("compact");
    let specs = [
        LimitSpec::new(
            Name::new("first"),
            Quota::per_second(1),
            AlgorithmKind::Gcra,
        )
        .on_store_error(FailurePolicy::Closed {
            retry_after: Duration::from_secs(1),
        }),
        LimitSpec::new(
            Name::new("second"),
            Quota::per_day(1).burst(90),
            AlgorithmKind::TokenBucket,
        )
        .on_store_error(FailurePolicy::Closed {
            retry_after: Duration::from_secs(1),
        }),
    ];
    let stores: Vec<Arc<RedisStore>> = (0..4)
        .map(|_| {
            Arc::new(
                RedisBackend::new(server.url())
                    .prefix(p.clone())
                    .timeout(Duration::from_secs(5))
                    .build(&specs)
                    .unwrap(),
            )
        })
        .collect();
    let mut tasks = Vec::new();
    for store in &stores {
        for _ in 0..25 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let checks = [tollgate::store::LimitCheck::new(
                    1,
                    tollgate::key::Key::string("k"),
                    3,
                )];
                stores::decide(&*store, &checks).await.unwrap().allowed()
            }));
        }
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += u64::from(t.await.unwrap());
    }
    assert_eq!(admitted, 30, "90 units at 3 each");
    let batched: u64 = stores.iter().map(|s| s.stats().batched_calls()).sum();
    let batches: u64 = stores.iter().map(|s| s.stats().batches()).sum();
    assert!(
        batches < batched,
        "some calls were coalesced: {batches} batches for {batched} calls"
    );
}
