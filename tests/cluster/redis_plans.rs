//! Plans on Redis: a check at a plan's quota (`LimitCheck::with_quota`) is decided at that quota,
//! a key whose plan changes keeps what it spent (`Algorithm::rebase`, mirrored by the Lua scripts), and
//! every backend agrees: a table of plan changes per algorithm, with the decisions the rule
//! predicts, and random plan switches, run on the memory store, a Redis node and a 3-master
//! Cluster. Also `Store::refund` and `Store::reconfigure` through the public API.

use std::sync::OnceLock;

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{Backend, Checked, LimitCheck, LimitSpec, PlanQuota, Store};
use tollgate::Decisions;
use tollgate::{Decision, Quota, StoreError};

use crate::harness::redis_cluster::RedisCluster;
use crate::harness::redis_server::RedisServer;
use crate::harness::rng::Rng;
use crate::harness::stores::{self, cluster_store, decide, memory_store, node_store, spec};

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
/// A realistic epoch time (µs) on an hour boundary, so window arithmetic reads plainly.
const T: u64 = 1_699_999_200 * S;

/// What one step expects.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// Allowed, with this many units remaining.
    Allowed(u64),
    /// Rejected, with this many remaining, retry after this many µs.
    Rejected(u64, u64),
    /// Rejected, with nothing remaining (the retry is compared across backends only).
    Exhausted,
}

/// `cost` at `at` (µs after `T`) at plan `plan` (`None`: the limit's own quota).
#[derive(Debug, Clone, Copy)]
struct Step {
    at: u64,
    plan: Option<usize>,
    cost: u64,
    want: Want,
}

const fn at(at: u64, plan: Option<usize>, cost: u64, want: Want) -> Step {
    Step {
        at,
        plan,
        cost,
        want,
    }
}

struct Scenario {
    name: &'static str,
    algorithm: AlgorithmKind,
    own: Quota,
    plans: Vec<Quota>,
    steps: Vec<Step>,
}

const OWN: Option<usize> = None;
const P0: Option<usize> = Some(0);
const P1: Option<usize> = Some(1);
const P2: Option<usize> = Some(2);

/// The buckets: own 1/s burst 5 (unit 10^6 steps), plan 0 2/s burst 10 (unit 5·10^5).
fn bucket_steps() -> Vec<Step> {
    use Want::*;
    vec![
        at(0, OWN, 5, Allowed(0)),
        // Upgrade: the 5 spent stay spent; 5 of the plan's 10 are left (no reset gift).
        at(0, P0, 0, Allowed(5)),
        at(0, P0, 5, Allowed(0)),
        at(0, P0, 1, Rejected(0, 500 * MS)),
        // 1 s at 2/s refills 2 of the plan's units.
        at(S, P0, 0, Allowed(2)),
        // Downgrade: 8 units spent, 3 more than the own capacity of 5: held as the 1.5 s the
        // plan takes to refill them, then 1 s at 1/s: told 2.5 s. Nothing is written, so the
        // key's state refills at the plan's 2/s meanwhile, and one fits at 3 s.
        at(S, OWN, 1, Rejected(0, 2_500 * MS)),
        at(3 * S - 1, OWN, 1, Rejected(0, S)),
        at(3 * S, OWN, 1, Allowed(0)),
        // Back and forth in the same µs: 5 spent of 10, then 5 of 5 again, never a refill.
        at(3 * S, P0, 0, Allowed(5)),
        at(3 * S, OWN, 0, Allowed(0)),
        at(10 * S, P0, 10, Allowed(0)),
        at(11 * S, OWN, 1, Rejected(0, 2_500 * MS)),
        // Straight back up: the 8 are still spent (no reset gift).
        at(11 * S, P0, 0, Allowed(2)),
        at(20 * S, P0, 10, Allowed(0)),
    ]
}

fn scenarios() -> Vec<Scenario> {
    use AlgorithmKind::*;
    use Want::*;
    let buckets = |algorithm| Scenario {
        name: "upgrade keeps spent, downgrade keeps the excess",
        algorithm,
        own: Quota::per_second(1).burst(5),
        plans: vec![Quota::per_second(2).burst(10)],
        steps: bucket_steps(),
    };
    vec![
        buckets(TokenBucket),
        buckets(Gcra),
        buckets(LeakyBucket),
        Scenario {
            name: "fixed window: the window's count carries over, unclamped",
            algorithm: FixedWindow,
            own: Quota::per_minute(5),
            plans: vec![
                Quota::per_minute(10),
                Quota::per_minute(3),
                Quota::per_hour(12),
            ],
            steps: vec![
                at(0, OWN, 5, Allowed(0)),
                at(S, OWN, 1, Rejected(0, 59 * S)),
                at(2 * S, P0, 1, Allowed(4)),
                at(2 * S, P0, 4, Allowed(0)),
                at(2 * S, P0, 1, Rejected(0, 58 * S)),
                // 10 spent against a limit of 3: exhausted until the window ends.
                at(3 * S, P1, 1, Rejected(0, 57 * S)),
                at(60 * S, P1, 1, Allowed(2)),
                at(61 * S, OWN, 1, Allowed(3)),
                at(62 * S, P0, 0, Allowed(8)),
                // Another period: this minute's 2 are carried into the hour.
                at(63 * S, P2, 1, Allowed(9)),
                // And the hour's 3 into the current minute.
                at(120 * S, OWN, 1, Allowed(1)),
                at(121 * S, P2, 0, Allowed(8)),
            ],
        },
        Scenario {
            name: "sliding window: same period keeps counts, another period carries the estimate",
            algorithm: SlidingWindow,
            own: Quota::per_minute(10),
            plans: vec![Quota::per_minute(20), Quota::per_hour(100)],
            steps: vec![
                at(0, OWN, 10, Allowed(0)),
                at(30 * S, OWN, 1, Exhausted),
                at(30 * S, P0, 0, Allowed(10)),
                at(30 * S, P0, 10, Allowed(0)),
                // 20 in the current minute become 20 in the current hour.
                at(30 * S, P1, 0, Allowed(80)),
                at(31 * S, P1, 5, Allowed(75)),
                // 25 spent this hour, carried into the current minute of a limit of 10. The
                // checks charge nothing, so nothing is written: the key keeps the hour's state,
                // and the hour's 25 stay counted while the hourly estimate holds them.
                at(90 * S, OWN, 1, Exhausted),
                at(90 * S, OWN, 0, Allowed(0)),
                at(200 * S, OWN, 10, Exhausted),
                at(7_300 * S, OWN, 10, Allowed(0)),
            ],
        },
        Scenario {
            name: "sliding log: entries are read as they are",
            algorithm: SlidingLog,
            own: Quota::per_minute(5),
            plans: vec![Quota::per_minute(10), Quota::per_hour(7)],
            steps: vec![
                at(0, OWN, 5, Allowed(0)),
                at(S, P0, 1, Allowed(4)),
                at(2 * S, OWN, 1, Rejected(0, 58 * S)),
                // The entry at 0 left the minute (and was dropped); 1 + 1 are live.
                at(60_500 * MS, OWN, 1, Allowed(3)),
                // The hour reads the entries kept: 1 + 1 + 1 of 7.
                at(62 * S, P1, 1, Allowed(4)),
                // 8 of 7: the entry at 1 s frees what is needed when it leaves the hour.
                at(62 * S, P1, 5, Rejected(4, 3_539 * S)),
            ],
        },
    ]
}

fn check_at<'a>(
    key: &Key<'a>,
    plans: &'a [PlanQuota],
    plan: Option<usize>,
    cost: u64,
) -> [LimitCheck<'a>; 1] {
    let c = LimitCheck::new(0, key.clone(), cost);
    [match plan {
        Some(i) => c.with_quota(&plans[i]),
        None => c,
    }]
}

fn matches(d: &Decision, want: Want) -> bool {
    match want {
        Want::Allowed(r) => d.allowed() && d.remaining() == r,
        Want::Rejected(r, retry) => {
            !d.allowed()
                && d.remaining() == r
                && d.retry_after().map(|x| x.as_micros() as u64) == Some(retry)
        }
        Want::Exhausted => !d.allowed() && d.remaining() == 0,
    }
}

/// Every scenario on the memory store, a Redis node and a Cluster: the decisions the rule
/// predicts, and the same decision from each backend at every step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_changes_decide_identically_on_every_backend() {
    let urls = cluster().urls();
    for s in scenarios() {
        let limits = [spec("plan", s.own, s.algorithm)];
        let plans: Vec<PlanQuota> = s
            .plans
            .iter()
            .map(|q| PlanQuota::new(s.algorithm, *q).unwrap())
            .collect();
        let clocks = [ManualClock::new(), ManualClock::new(), ManualClock::new()];
        let memory = memory_store(&clocks[0], &limits);
        let node = node_store(&node().url(), "plans", &clocks[1], &limits);
        let clustered = cluster_store(&urls, "plans", &clocks[2], &limits);
        let key = Key::string("alice");
        for (i, step) in s.steps.iter().enumerate() {
            for c in &clocks {
                c.set_micros(T + step.at);
            }
            let checks = check_at(&key, &plans, step.plan, step.cost);
            let m = decide(&memory, &checks).await.unwrap();
            let n = decide(&node, &checks).await.unwrap();
            let k = decide(&clustered, &checks).await.unwrap();
            let what = format!("{} ({}), step {i} {step:?}", s.algorithm, s.name);
            assert!(
                matches(&n.as_slice()[0], step.want),
                "{what}: node {:?}",
                n.as_slice()[0]
            );
            assert_eq!(m.as_slice(), n.as_slice(), "{what}: memory vs node");
            assert_eq!(k.as_slice(), n.as_slice(), "{what}: cluster vs node");
            let limit = step.plan.map_or(s.own, |p| s.plans[p]);
            let capacity = PlanQuota::new(s.algorithm, limit).unwrap().capacity();
            assert_eq!(
                n.as_slice()[0].limit(),
                capacity,
                "{what}: the plan's limit is reported"
            );
        }
    }
}

/// Random costs, times and plan switches (own quota, a larger plan, a smaller one with another
/// period) for every algorithm: the three backends agree decision by decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_plan_switches_decide_identically_on_every_backend() {
    let urls = cluster().urls();
    for kind in AlgorithmKind::ALL {
        let windowed = matches!(
            kind,
            AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow | AlgorithmKind::SlidingLog
        );
        let (own, plans) = if windowed {
            (
                Quota::per_second(4),
                [
                    Quota::per_second(9),
                    Quota::per(std::time::Duration::from_millis(2_500), 6),
                ],
            )
        } else {
            (
                Quota::per_second(3).burst(4),
                [
                    Quota::per_second(7).burst(12),
                    Quota::per_second(1).burst(2),
                ],
            )
        };
        let limits = [spec("switch", own, kind)];
        let plans: Vec<PlanQuota> = plans
            .iter()
            .map(|q| PlanQuota::new(kind, *q).unwrap())
            .collect();
        let clocks = [ManualClock::new(), ManualClock::new(), ManualClock::new()];
        let memory = memory_store(&clocks[0], &limits);
        let node = node_store(&node().url(), "switch", &clocks[1], &limits);
        let clustered = cluster_store(&urls, "switch", &clocks[2], &limits);
        let mut rng = Rng(0xC0FFEE ^ kind as u64);
        let mut t = T;
        for i in 0..250 {
            t += rng.below(300 * MS);
            for c in &clocks {
                c.set_micros(t);
            }
            let plan = match rng.below(3) {
                0 => None,
                p => Some(p as usize - 1),
            };
            let key = Key::string(format!("c{}", rng.below(2)));
            let checks = check_at(&key, &plans, plan, rng.below(5));
            let m = decide(&memory, &checks).await.unwrap();
            let n = decide(&node, &checks).await.unwrap();
            let k = decide(&clustered, &checks).await.unwrap();
            assert_eq!(
                m.as_slice(),
                n.as_slice(),
                "{kind} step {i} plan {plan:?}: memory vs node"
            );
            assert_eq!(
                k.as_slice(),
                n.as_slice(),
                "{kind} step {i} plan {plan:?}: cluster vs node"
            );
        }
    }
}

/// Two limits of one client at different plans in one script call (the all-or-nothing path):
/// a rejection by one charges neither, and the other is reported at its plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_at_plans_stay_all_or_nothing() {
    let limits = [
        spec(
            "burst",
            Quota::per_second(1).burst(3),
            AlgorithmKind::TokenBucket,
        ),
        spec("hourly", Quota::per_hour(4), AlgorithmKind::FixedWindow),
    ];
    let burst = PlanQuota::new(AlgorithmKind::TokenBucket, Quota::per_second(1).burst(10)).unwrap();
    let hourly = PlanQuota::new(AlgorithmKind::FixedWindow, Quota::per_hour(6)).unwrap();
    let clocks = [ManualClock::new(), ManualClock::new(), ManualClock::new()];
    for c in &clocks {
        c.set_micros(T);
    }
    let memory = memory_store(&clocks[0], &limits);
    let node = node_store(&node().url(), "aonplan", &clocks[1], &limits);
    let clustered = cluster_store(&cluster().urls(), "aonplan", &clocks[2], &limits);
    let user = Key::int(7);
    let checks = [
        LimitCheck::new(0, user.clone(), 1).with_quota(&burst),
        LimitCheck::new(1, user.clone(), 1).with_quota(&hourly),
    ];
    let mut seqs = Vec::new();
    for store in [&node, &clustered] {
        let mut seq = Vec::new();
        for _ in 0..7 {
            seq.push(decide(store, &checks).await.unwrap());
        }
        seqs.push(seq);
    }
    let mut seq = Vec::new();
    for _ in 0..7 {
        seq.push(decide(&memory, &checks).await.unwrap());
    }
    let last = seq[6].clone();
    assert!(!last.allowed());
    assert_eq!(last.rejected().unwrap().policy().as_str(), "hourly");
    assert_eq!(last.as_slice()[0].limit(), 10, "the burst plan's capacity");
    assert_eq!(last.as_slice()[0].remaining(), 4, "6 charged, not 7");
    for other in &seqs {
        for (a, b) in seq.iter().zip(other) {
            assert_eq!(a.as_slice(), b.as_slice());
        }
    }
}

/// A plan's quota must be for its limit's algorithm: a clear error, not a guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_for_another_algorithm_is_an_error_that_says_so() {
    let limits = [spec(
        "api",
        Quota::per_minute(5),
        AlgorithmKind::FixedWindow,
    )];
    let clock = ManualClock::new();
    let store = node_store(&node().url(), "mismatch", &clock, &limits);
    let wrong = PlanQuota::new(AlgorithmKind::TokenBucket, Quota::per_minute(10)).unwrap();
    let checks = [LimitCheck::new(0, Key::string("k"), 1).with_quota(&wrong)];
    let err = decide(&store, &checks).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("\"api\""), "{msg}");
    assert!(
        msg.contains("fixed_window") && msg.contains("token_bucket"),
        "{msg}"
    );
    assert!(
        msg.contains("PlanQuota::new(AlgorithmKind::FixedWindow"),
        "{msg}"
    );
    let err = refund(&store, &checks, T).await.unwrap_err();
    assert!(err.to_string().contains("token_bucket"), "{err}");
}

/// A key written at a plan carries a mark (its parameters); the same key checked at the
/// limit's own quota again goes back to the unmarked 16 bytes of the common path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_keys_are_marked_and_own_quota_keys_are_not() {
    let limits = [spec(
        "api",
        Quota::per_minute(5),
        AlgorithmKind::FixedWindow,
    )];
    let clock = ManualClock::new();
    clock.set_micros(T);
    let store = node_store(&node().url(), "mark", &clock, &limits);
    let pro = PlanQuota::new(AlgorithmKind::FixedWindow, Quota::per_minute(50)).unwrap();
    let key = Key::string("bob");
    let redis_key = store.redis_key(0, &key).unwrap();
    let len = || node().cmd::<i64>(&["STRLEN", &redis_key]);
    decide(&store, &[LimitCheck::new(0, key.clone(), 2)])
        .await
        .unwrap();
    assert_eq!(len(), 16);
    let d = decide(
        &store,
        &[LimitCheck::new(0, key.clone(), 1).with_quota(&pro)],
    )
    .await
    .unwrap();
    assert_eq!(
        (d.as_slice()[0].remaining(), d.as_slice()[0].limit()),
        (47, 50)
    );
    assert_eq!(len(), 16 + 24, "marked with the plan's parameters");
    let d = decide(&store, &[LimitCheck::new(0, key.clone(), 1)])
        .await
        .unwrap();
    assert_eq!(d.as_slice()[0].remaining(), 1, "3 + 1 of 5");
    assert_eq!(len(), 16, "back at the limit's own quota: unmarked");
    // A mark that is not a quota's (written by something else) is unreadable: reset, counted.
    let mut bad = vec![0u8; 16];
    bad.extend_from_slice(&[0u8; 24]);
    redis::cmd("SET")
        .arg(&redis_key)
        .arg(bad)
        .query::<()>(&mut node().conn())
        .unwrap();
    let d = decide(&store, &[LimitCheck::new(0, key.clone(), 0)])
        .await
        .unwrap();
    assert_eq!(d.as_slice()[0].remaining(), 5);
    assert_eq!(store.stats().corrupt_resets(), 1);
}

async fn refund<S: Store>(
    store: &S,
    checks: &[LimitCheck<'_>],
    reserved_at: u64,
) -> Result<Decisions, StoreError> {
    match store.refund(checks, reserved_at) {
        Checked::Ready(r) => r,
        Checked::Pending(f) => f.await,
    }
}

/// `Store::refund` on a node: each check reports when Redis decided it, and a refund as of that
/// time gives the reservation back, at a plan too, as the memory store does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_through_the_public_api_match_the_memory_store() {
    for kind in AlgorithmKind::ALL {
        let windowed = matches!(
            kind,
            AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow | AlgorithmKind::SlidingLog
        );
        let (own, plan) = if windowed {
            (Quota::per_minute(5), Quota::per_minute(8))
        } else {
            (Quota::per_second(1).burst(5), Quota::per_second(2).burst(8))
        };
        let limits = [spec("r", own, kind)];
        let plan = PlanQuota::new(kind, plan).unwrap();
        let (c1, c2) = (ManualClock::new(), ManualClock::new());
        let memory = memory_store(&c1, &limits);
        let node = node_store(&node().url(), "pubrefund", &c2, &limits);
        let mut rng = Rng(77 + kind as u64);
        let mut t = T + 10 * S;
        for i in 0..60 {
            t += rng.below(400 * MS);
            c1.set_micros(t);
            c2.set_micros(t);
            let key = Key::string("alice");
            let c = LimitCheck::new(0, key, 1 + rng.below(3));
            let checks = [if rng.below(2) == 0 {
                c.with_quota(&plan)
            } else {
                c
            }];
            let m = decide(&memory, &checks).await.unwrap();
            let n = decide(&node, &checks).await.unwrap();
            assert_eq!(m.as_slice(), n.as_slice(), "{kind} step {i}: check");
            assert_eq!(
                n.decided_at(),
                Some(t),
                "{kind}: Redis reports the time it charged at"
            );
            if n.allowed() && rng.below(2) == 0 {
                // Refunded a little later, as a response arrives.
                let later = t + rng.below(200 * MS);
                c1.set_micros(later);
                c2.set_micros(later);
                let m = refund(&memory, &checks, m.decided_at().unwrap())
                    .await
                    .unwrap();
                let n = refund(&node, &checks, n.decided_at().unwrap())
                    .await
                    .unwrap();
                assert_eq!(m.as_slice(), n.as_slice(), "{kind} step {i}: refund");
                t = later;
            }
        }
    }
}

/// Right after a check, a refund at its time gives everything back: the key reads as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_refund_restores_the_key_at_server_time() {
    let limits = [spec("api", Quota::per_minute(5), AlgorithmKind::SlidingLog)];
    let store = tollgate::store::redis::RedisBackend::new(node().url())
        .prefix(stores::prefix("servertime"))
        .timeout(std::time::Duration::from_secs(3))
        .build(&limits)
        .unwrap();
    let pro = PlanQuota::new(AlgorithmKind::SlidingLog, Quota::per_minute(9)).unwrap();
    let checks = [LimitCheck::new(0, Key::string("k"), 4).with_quota(&pro)];
    let d = decide(&store, &checks).await.unwrap();
    assert_eq!(d.as_slice()[0].remaining(), 5);
    let at = d.decided_at().expect("Redis TIME is reported");
    let r = refund(&store, &checks, at).await.unwrap();
    assert_eq!(
        r.as_slice()[0].remaining(),
        9,
        "the log entry at exactly `at` is given back"
    );
    assert!(r.decided_at().unwrap() >= at);
    assert_eq!(store.stats().refunds(), 1);
}

/// Cluster: a per-client limit at a plan and a global ceiling live in different slots; both are
/// charged, then refunded through `Store::refund`, slot by slot, and end as the memory store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_refunds_with_a_plan_across_slots() {
    let limits = [
        spec(
            "per-client",
            Quota::per_second(1).burst(5),
            AlgorithmKind::TokenBucket,
        ),
        spec("global", Quota::per_minute(100), AlgorithmKind::FixedWindow),
    ];
    let pro = PlanQuota::new(AlgorithmKind::TokenBucket, Quota::per_second(4).burst(20)).unwrap();
    let (c1, c2) = (ManualClock::new(), ManualClock::new());
    c1.set_micros(T);
    c2.set_micros(T);
    let memory = memory_store(&c1, &limits);
    let clustered = cluster_store(&cluster().urls(), "xrefund", &c2, &limits);
    let a = clustered.redis_key(0, &Key::string("alice")).unwrap();
    let g = clustered.redis_key(1, &Key::global()).unwrap();
    assert_ne!(cluster().keyslot(&a), cluster().keyslot(&g));
    let checks = [
        LimitCheck::new(0, Key::string("alice"), 12).with_quota(&pro),
        LimitCheck::new(1, Key::global(), 12),
    ];
    let m = decide(&memory, &checks).await.unwrap();
    let k = decide(&clustered, &checks).await.unwrap();
    assert!(k.allowed());
    assert_eq!(m.as_slice(), k.as_slice());
    assert_eq!(k.decided_at(), Some(T));
    assert_eq!(k.as_slice()[0].remaining(), 8);
    c1.set_micros(T + 250 * MS);
    c2.set_micros(T + 250 * MS);
    let m = refund(&memory, &checks, T).await.unwrap();
    let k = refund(&clustered, &checks, T).await.unwrap();
    assert_eq!(m.as_slice(), k.as_slice());
    // 12 back less the 1 unit that refilled in 250 ms at 4/s: full again; the window gets 12.
    assert_eq!(k.as_slice()[0].remaining(), 20);
    assert_eq!(k.as_slice()[1].remaining(), 100);
    assert_eq!(clustered.stats().refunds(), 2, "one refund call per slot");
}

/// `Store::reconfigure`: limits of the same name and algorithm keep their counters (a changed
/// quota keeps what each key spent), new limits start fresh, and the new store shares the old
/// one's connection (batcher included) and statistics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconfigure_keeps_counters_and_shares_the_connection() {
    let clock = ManualClock::new();
    clock.set_micros(T);
    let first: [LimitSpec; 2] = [
        spec("api", Quota::per_minute(5), AlgorithmKind::FixedWindow),
        spec(
            "burst",
            Quota::per_second(1).burst(4),
            AlgorithmKind::TokenBucket,
        ),
    ];
    let store = node_store(&node().url(), "reconf", &clock, &first);
    let key = Key::string("carol");
    let both = |a, b| {
        [
            LimitCheck::new(0, key.clone(), a),
            LimitCheck::new(1, key.clone(), b),
        ]
    };
    let d = decide(&store, &both(5, 3)).await.unwrap();
    assert!(d.allowed());

    // Same limits: every counter is where it was.
    let same = store.reconfigure(&first).unwrap();
    let d = decide(&same, &both(0, 0)).await.unwrap();
    assert_eq!(
        (d.as_slice()[0].remaining(), d.as_slice()[1].remaining()),
        (0, 1)
    );

    // api raised to 10 per minute, burst gone, a new sliding log.
    let second: [LimitSpec; 2] = [
        spec("api", Quota::per_minute(10), AlgorithmKind::FixedWindow),
        spec("new", Quota::per_minute(3), AlgorithmKind::SlidingLog),
    ];
    let raised = store.reconfigure(&second).unwrap();
    let d = decide(&raised, &both(1, 1)).await.unwrap();
    assert!(d.allowed());
    assert_eq!(
        d.as_slice()[0].remaining(),
        4,
        "5 spent of 10, then 1: no reset gift"
    );
    assert_eq!(d.as_slice()[0].limit(), 10);
    assert_eq!(d.as_slice()[1].remaining(), 2, "a new limit starts fresh");
    // The old store still decides (same keys, its own quota), on the same connection.
    let d = decide(&store, &both(1, 0)).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.as_slice()[0].remaining(), 0, "6 spent of 5");
    // The raised store reads the key the old one left: still 4 left.
    let d = decide(&raised, &both(0, 0)).await.unwrap();
    assert_eq!(d.as_slice()[0].remaining(), 4);

    // Lowered to 3: 6 spent, exhausted until the window ends; then the new quota applies.
    let third = [spec(
        "api",
        Quota::per_minute(3),
        AlgorithmKind::FixedWindow,
    )];
    let lowered = raised.reconfigure(&third).unwrap();
    let one = [LimitCheck::new(0, key.clone(), 1)];
    let d = decide(&lowered, &one).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.as_slice()[0].retry_after().unwrap().as_secs(), 60);
    clock.set_micros(T + 60 * S);
    let d = decide(&lowered, &one).await.unwrap();
    assert_eq!(
        (d.as_slice()[0].remaining(), d.as_slice()[0].limit()),
        (2, 3)
    );

    // Concurrent checks from stores with different scripts share the batcher: each batch runs
    // its own store's script.
    let fresh = Key::string("dave");
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let (a, b) = (store.clone(), lowered.clone());
        let fresh = fresh.clone().into_owned();
        tasks.push(tokio::spawn(async move {
            let checks = [LimitCheck::new(0, fresh, 0)];
            if i % 2 == 0 {
                decide(&a, &checks).await.unwrap().as_slice()[0].limit()
            } else {
                decide(&b, &checks).await.unwrap().as_slice()[0].limit()
            }
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), if i % 2 == 0 { 5 } else { 3 });
    }
    // One set of statistics.
    assert_eq!(store.stats().refunds(), lowered.stats().refunds());
    assert!(lowered.stats().batches() > 0);
    assert_eq!(store.stats().batches(), lowered.stats().batches());
}

/// Reloads that change a limit's quota (and back) between random checks, for every algorithm:
/// the node and the memory store, reconfigured alike, agree decision by decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconfigured_quotas_decide_as_the_memory_store() {
    for kind in AlgorithmKind::ALL {
        let windowed = matches!(
            kind,
            AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow | AlgorithmKind::SlidingLog
        );
        let quotas = if windowed {
            [
                Quota::per_second(4),
                Quota::per_second(9),
                Quota::per_minute(20),
            ]
        } else {
            [
                Quota::per_second(3).burst(4),
                Quota::per_second(7).burst(12),
                Quota::per_minute(20),
            ]
        };
        let specs = |q| [spec("reload", q, kind)];
        let (c1, c2) = (ManualClock::new(), ManualClock::new());
        let mut memory = memory_store(&c1, &specs(quotas[0]));
        let mut node = node_store(&node().url(), "reload", &c2, &specs(quotas[0]));
        let mut rng = Rng(0xBEEF ^ kind as u64);
        let mut t = T;
        for i in 0..200 {
            t += rng.below(300 * MS);
            c1.set_micros(t);
            c2.set_micros(t);
            if rng.below(15) == 0 {
                let q = quotas[rng.below(3) as usize];
                memory = memory.reconfigure(&specs(q)).unwrap();
                node = node.reconfigure(&specs(q)).unwrap();
            }
            let checks = [LimitCheck::new(
                0,
                Key::string(format!("c{}", rng.below(2))),
                rng.below(5),
            )];
            let m = decide(&memory, &checks).await.unwrap();
            let n = decide(&node, &checks).await.unwrap();
            assert_eq!(m.as_slice(), n.as_slice(), "{kind} step {i}");
        }
    }
}

/// With Redis unreachable, a `Local` limit checked at a plan falls back to its share of the
/// plan's quota (not of the limit's own), and reports no `decided_at`: nothing was charged in
/// Redis, so nothing may be refunded there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_fallback_takes_its_share_of_the_plans_quota() {
    use std::time::Duration;
    use tollgate::store::redis::RedisBackend;
    use tollgate::store::{memory::MemoryBackend, FailurePolicy};
    // Nothing listens on port 1.
    let limits = [LimitSpec::new(
        tollgate::Name::new("api"),
        Quota::per_minute(4),
        AlgorithmKind::FixedWindow,
    )
    .on_store_error(FailurePolicy::Local { share: 0.5 })];
    let clock = ManualClock::new();
    let store = RedisBackend::new("redis://127.0.0.1:1")
        .timeout(Duration::from_millis(50))
        .connect_timeout(Duration::from_millis(50))
        .local_fallback(MemoryBackend::new().clock(clock.clone()))
        .build(&limits)
        .unwrap();
    let pro = PlanQuota::new(AlgorithmKind::FixedWindow, Quota::per_minute(20)).unwrap();
    let checks = [LimitCheck::new(0, Key::string("k"), 1).with_quota(&pro)];
    let mut allowed = 0;
    for _ in 0..12 {
        let d = decide(&store, &checks).await.unwrap();
        assert_eq!(d.as_slice()[0].limit(), 10, "half of the plan's 20");
        assert_eq!(d.decided_at(), None);
        allowed += usize::from(d.allowed());
    }
    assert_eq!(allowed, 10);
    assert!(store.stats().local_fallback() >= 12);
}

/// A fixed window whose plan follows the calendar (a local day in UTC+2) and back to epoch
/// hours, across local midnight: the node decides as the memory store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_plans_decide_as_the_memory_store() {
    use tollgate::quota::UtcOffset;
    let kind = AlgorithmKind::FixedWindow;
    let limits = [spec("cal", Quota::per_hour(6), kind)];
    let daily = PlanQuota::new(kind, Quota::per_day(10).aligned(UtcOffset::hours(2))).unwrap();
    let plans = [daily];
    let (c1, c2) = (ManualClock::new(), ManualClock::new());
    let memory = memory_store(&c1, &limits);
    let node = node_store(&node().url(), "calendar", &c2, &limits);
    // 2024-02-28T21:00:00Z: 23:00 in UTC+2, an hour before local midnight.
    let mut t = 1_709_154_000 * S;
    let mut rng = Rng(2024);
    let key = Key::string("cal");
    for i in 0..120 {
        t += rng.below(90 * S);
        c1.set_micros(t);
        c2.set_micros(t);
        let plan = (rng.below(2) == 0).then_some(0);
        let checks = check_at(&key, &plans, plan, rng.below(3));
        let m = decide(&memory, &checks).await.unwrap();
        let n = decide(&node, &checks).await.unwrap();
        assert_eq!(m.as_slice(), n.as_slice(), "step {i} plan {plan:?}");
    }
}
