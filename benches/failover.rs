//! What a failover costs the limiter, measured on loopback: each scenario kills the Redis that
//! decides some keys (SIGKILL) while clients check them, several times, and reports how long the
//! keys went undecided, how many decisions the promotion lost and whether keys on the Redis
//! still up ever stopped being decided.
//!
//! - `Cluster`: a 6-node Redis Cluster (3 masters, a replica each, `cluster-node-timeout`
//!   1000 ms), 270 clients (90 keys per master, each checked every 50 ms) through two stores
//!   (two instances of an app), one master killed after 1 s of load, measured for the node
//!   timeout plus 4 s after it (`tests/harness/cluster_failover.rs`, whose bounds
//!   `tests/promises/cluster_dead_master.rs` asserts).
//! - `Sentinel`: a primary, one replica and three Sentinels (`down-after-milliseconds` 1000 ms),
//!   8 tasks deciding continuously through two stores, the primary killed after 1 s of load,
//!   measured until both stores decided again plus 500 ms (`tests/harness/sentinel_failover.rs`,
//!   whose bounds `tests/redis/redis_sentinel.rs` asserts).
//!
//! Each scenario is one entry of [`SCENARIOS`] and one row of each table: another deployment
//! adds a function returning its [`Run`]s and an entry.
//!
//! ```text
//! cargo bench --features redis --bench failover
//! BENCH_FAILOVERS=9 cargo bench --features redis --bench failover   # more runs
//! ```

#[path = "../tests/harness/mod.rs"]
mod harness;
#[path = "common/report.rs"]
mod report;

use std::time::Duration;

use harness::cluster_failover::{kill_a_master_under_load, WINDOW};
use harness::sentinel_failover::kill_the_primary_under_load;

/// The Cluster's `cluster-node-timeout`.
const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Clients per Cluster master.
const CLIENTS_PER_MASTER: usize = 90;

/// What one failover did, every time measured from the kill.
#[derive(Debug, Clone)]
struct Run {
    /// When the deployment promoted a replica.
    promoted: Option<Duration>,
    /// When the killed server's keys were decided by Redis again.
    decided_again: Option<Duration>,
    /// Decisions the clients were told of that the promoted replica did not have.
    lost: u64,
    /// Decisions the clients were told of by the killed server.
    confirmed: u64,
    /// The replica's replication lag just before the kill, in bytes (an upper bound).
    lag_bytes: Option<i64>,
    /// For keys on servers still up (`None`: the deployment has none): the time in 100 ms
    /// windows without a decision, and the longest stretch below 95 % decided.
    healthy: Option<(Duration, Duration)>,
}

impl Run {
    /// How long after the promotion the keys were decided again.
    fn after_promotion(&self) -> Option<Duration> {
        Some(self.decided_again?.saturating_sub(self.promoted?))
    }
}

/// A scenario: its name in the tables, and a function running one failover.
type Scenario = (&'static str, fn(&tokio::runtime::Runtime) -> Run);

const SCENARIOS: [Scenario; 2] = [
    ("Cluster, 3 masters + 3 replicas", cluster),
    (SENTINEL, sentinel),
];

const SENTINEL: &str = "Sentinel, primary + 1 replica";

fn cluster(rt: &tokio::runtime::Runtime) -> Run {
    let f = rt.block_on(kill_a_master_under_load(NODE_TIMEOUT, CLIENTS_PER_MASTER));
    println!(
        "  promoted {:?}, decided again {:?}, lost {} of {}, lag {:?} bytes, healthy: {:.1} % \
         decided, {} windows without a decision, longest stretch below 95 % {:?}",
        f.promoted_by_redis,
        f.decided_again,
        f.lost,
        f.confirmed,
        f.lag_bytes,
        f.healthy_decided * 100.0,
        f.healthy_stops(),
        f.healthy_longest_gap(),
    );
    Run {
        promoted: f.promoted_by_redis,
        decided_again: f.decided_again,
        lost: f.lost,
        confirmed: f.confirmed,
        lag_bytes: f.lag_bytes,
        healthy: Some((WINDOW * f.healthy_stops() as u32, f.healthy_longest_gap())),
    }
}

fn sentinel(rt: &tokio::runtime::Runtime) -> Run {
    // On a worker thread: the failover blocks in place while it polls the Sentinels.
    let run = rt.spawn(async {
        let f = kill_the_primary_under_load(&[]).await;
        println!(
            "  promoted {:?}, sentinels switched {:?}, decided again {:?}, lost {} of {} \
             admitted before the kill ({} in all), {} unanswered, lag {} bytes",
            f.replica_promoted,
            f.sentinels_switched,
            f.decided_again,
            f.lost,
            f.admitted_before_kill,
            f.admitted,
            f.unanswered,
            f.lag_bytes,
        );
        (
            Run {
                promoted: f.replica_promoted,
                decided_again: f.both_decided_again(),
                lost: f.lost,
                confirmed: f.admitted_before_kill,
                lag_bytes: Some(f.lag_bytes),
                healthy: None,
            },
            f.sentinels_switched,
        )
    });
    let (run, switched) = rt.block_on(run).expect("the Sentinel failover");
    SENTINELS_SWITCHED.lock().unwrap().push(switched);
    run
}

/// When every Sentinel named the promoted replica, for each Sentinel run (a note reports them).
static SENTINELS_SWITCHED: std::sync::Mutex<Vec<Duration>> = std::sync::Mutex::new(Vec::new());

fn runs() -> usize {
    std::env::var("BENCH_FAILOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5)
}

/// The median and the largest of some figures (`None` for any figure that is missing: never).
fn median_max<T: Ord + Copy>(mut xs: Vec<Option<T>>) -> Option<(T, T)> {
    if xs.iter().any(Option::is_none) || xs.is_empty() {
        return None;
    }
    xs.sort();
    Some((xs[(xs.len() - 1) / 2]?, xs[xs.len() - 1]?))
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// "median / max", or "never" when a run never got there.
fn times(xs: Vec<Option<Duration>>) -> String {
    median_max(xs).map_or("never (in a run)".into(), |(m, x)| {
        format!("{} / {}", ms(m), ms(x))
    })
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with nothing to measure.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let n = runs();
    let mut summary = report::Table::new(
        format!("Median / max of {n} failovers per scenario, times from the kill"),
        &[
            "scenario",
            "replica promoted",
            "keys decided again",
            "decided again after the promotion",
            "decisions lost",
            "healthy keys: time without a decision",
            "healthy keys: longest stretch below 95 % decided",
        ],
    );
    let mut each = report::Table::new(
        "Each failover",
        &[
            "scenario",
            "run",
            "replica promoted",
            "keys decided again",
            "decided again after the promotion",
            "decisions lost / told to the clients",
            "replication lag just before the kill",
            "healthy keys: time without a decision",
            "healthy keys: longest stretch below 95 % decided",
        ],
    );
    for (name, scenario) in SCENARIOS {
        let mut done = Vec::new();
        for i in 1..=n {
            println!("failover bench: {name}, run {i} of {n}");
            let r = scenario(&rt);
            let healthy = r
                .healthy
                .map_or(["none up".to_owned(), "-".to_owned()], |(s, g)| {
                    [ms(s), ms(g)]
                });
            each.row(&[
                name.to_owned(),
                i.to_string(),
                r.promoted.map_or("never".into(), ms),
                r.decided_again.map_or("never".into(), ms),
                r.after_promotion().map_or("never".into(), ms),
                format!("{} / {}", r.lost, r.confirmed),
                r.lag_bytes
                    .map_or("not read".into(), |b| format!("{b} bytes")),
                healthy[0].clone(),
                healthy[1].clone(),
            ]);
            done.push(r);
        }
        let lost = median_max(done.iter().map(|r| Some(r.lost)).collect())
            .map_or("-".into(), |(m, x)| format!("{m} / {x}"));
        let healthy = |pick: fn(&(Duration, Duration)) -> Duration| {
            median_max(done.iter().map(|r| r.healthy.as_ref().map(pick)).collect())
                .map_or("none up".into(), |(m, x)| format!("{} / {}", ms(m), ms(x)))
        };
        summary.row(&[
            name.to_owned(),
            times(done.iter().map(|r| r.promoted).collect()),
            times(done.iter().map(|r| r.decided_again).collect()),
            times(done.iter().map(Run::after_promotion).collect()),
            lost,
            healthy(|h| h.0),
            healthy(|h| h.1),
        ]);
    }
    let method = format!(
        "Each scenario kills (SIGKILL) the Redis that decides some keys while clients check \
         them, {n} times, each time on new `redis-server` processes on loopback, and reports the \
         median and the largest figure. **Cluster**: 6 nodes (3 masters, a replica each, \
         `cluster-node-timeout` {} ms, `cluster-require-full-coverage no`), 270 clients (90 keys \
         per master, each checked every 50 ms, a 100 ms store timeout, failure policy \
         `Closed`), each client's checks sent in turn to two stores (two instances of an app); \
         one master killed after 1 s of load, measured for the node timeout plus 4 s after it. \
         Every check costs one unit of a 1,000,000-unit token bucket that does not refill \
         during a run, so a decision's `remaining` counts the decisions Redis kept for the key. \
         *Replica promoted*: when the replica's `INFO replication` first says `role:master` \
         (polled every 10 ms). *Keys decided again*: when the dead master's keys were decided \
         by Redis (not by the failure policy) again, at least 90 % of their checks in every \
         100 ms window from then on. *Decisions lost*: summed over the dead master's keys, how \
         many decisions the clients had been told of that the promoted replica's state did not \
         hold (writes not yet replicated when the master died; a failover loses at most the \
         decisions of the last replication lag), out of those the clients had been told of. \
         *Healthy keys*: the keys on the masters still up, per 100 ms window after the kill.",
        NODE_TIMEOUT.as_millis()
    );
    let method = format!(
        "{method} **Sentinel**: a primary, one replica and three Sentinels \
         (`down-after-milliseconds` 1000 ms, quorum 2), 8 tasks (4 per store, two stores, one \
         key each) deciding on the same ledger limit without a pause (a 250 ms store timeout, \
         failure policy `Closed`), the primary killed after 1 s of load, measured until both \
         stores decided again plus 500 ms. *Replica promoted*: when the replica first answers \
         `ROLE` as a master (polled every 10 ms). *Keys decided again*: when both stores had \
         admitted a check through the promoted replica. *Decisions lost*: out of the decisions \
         admitted before the kill; *replication lag*: the largest of 10 samples taken during \
         the second of load before the kill. No other Redis serves keys, so there are no \
         healthy keys."
    );
    let mut section = report::Section::new(
        "failover",
        "Failover",
        "cargo bench --features redis --bench failover",
        &method,
    );
    section.parent("redis");
    section.table(summary).table(each);
    section.note(
        "The store cannot decide a dead master's keys before Redis promotes its replica: the \
         node timeout after the kill plus the replica's election delay (0.5–1 s). A shorter \
         `cluster-node-timeout` shortens that gap, at the cost of failovers on shorter stalls.",
    );
    section.note(
        "Each store sends a master's calls on a connection of its own, to the master its slot \
         map names: the dead master's calls fail alone and refresh the map in the background, \
         so the healthy masters' keys go on being decided through the kill and the promotion, \
         and the dead master's keys follow the promoted replica at the next slot-map refresh.",
    );
    let switched = std::mem::take(&mut *SENTINELS_SWITCHED.lock().unwrap());
    if let Some((m, x)) = median_max(switched.into_iter().map(Some).collect()) {
        section.note(format!(
            "Sentinel: the stores decide again only once a Sentinel names the promoted replica: \
             the one leading the failover does once the replica's `INFO` (polled every second \
             during a failover) shows the promotion, the others when they hear of it; a store asks the Sentinels in turn (retrying at most every \
             200 ms) and takes the first node named that answers `ROLE` as a master. Every \
             Sentinel named the promoted replica {} / {} (median / max) after the kill (polled \
             every 50 ms).",
            ms(m),
            ms(x)
        ));
    }
    section.write();
}
