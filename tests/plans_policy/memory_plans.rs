//! Plans, refunds and reloads through the in-memory store, on every algorithm: a check at a
//! [`PlanQuota`] is decided at it, a key whose quota changes keeps what it spent, a refund gives
//! back at the check's quota, and `Store::reconfigure` keeps the counters of unchanged limits.

use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::key::Key;
use tollgate::store::{
    memory::MemoryBackend, memory::MemoryStore, Backend, Checked, LimitCheck, LimitSpec, PlanQuota,
    Store,
};
use tollgate::{AlgorithmKind, Decisions, Name, Quota, StoreErrorKind};

const MINUTE: Duration = Duration::from_secs(60);

fn spec(name: &str, quota: Quota, kind: AlgorithmKind) -> LimitSpec {
    LimitSpec::new(Name::new(name), quota, kind)
}

fn store(limits: &[LimitSpec]) -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    // Start well into the clock, away from window 0.
    clock.set_micros(7 * 60_000_000);
    let store = MemoryBackend::new()
        .max_keys(1_000)
        .shards(1)
        .clock(clock.clone())
        .build(limits)
        .unwrap();
    (store, clock)
}

fn ready(checked: Checked<tollgate::store::memory::MemoryFuture>) -> Decisions {
    match checked {
        Checked::Ready(decisions) => decisions.unwrap(),
        Checked::Pending(never) => match never {},
    }
}

/// Checks `cost` for `key` on limit 0 at `plan` (the limit's own quota with `None`); with
/// `wide`, through a check of two limits (limit 1 is a wide global limit), which takes the
/// store's all-or-nothing path. Returns limit 0's decision.
fn check(
    store: &MemoryStore<ManualClock>,
    key: &str,
    cost: u64,
    plan: Option<&PlanQuota>,
    wide: bool,
) -> tollgate::Decision {
    let mut first = LimitCheck::new(0, Key::string(key), cost);
    if let Some(plan) = plan {
        first = first.with_quota(plan);
    }
    let decisions = if wide {
        ready(store.check(&[first, LimitCheck::new(1, Key::global(), cost)]))
    } else {
        ready(store.check(&[first]))
    };
    decisions.as_slice()[0]
}

fn remaining(store: &MemoryStore<ManualClock>, key: &str, plan: Option<&PlanQuota>) -> u64 {
    check(store, key, 0, plan, false).remaining()
}

#[test]
fn a_key_keeps_what_it_spent_across_plans_on_every_algorithm() {
    for kind in AlgorithmKind::ALL {
        for wide in [false, true] {
            let ctx = format!("{kind}, {} limits", 1 + usize::from(wide));
            let (store, clock) = store(&[
                spec("api", Quota::per_minute(10), kind),
                spec("wide", Quota::per_hour(10_000), AlgorithmKind::TokenBucket),
            ]);
            let free = PlanQuota::new(kind, Quota::per_minute(5)).unwrap();
            let pro = PlanQuota::new(kind, Quota::per_minute(20)).unwrap();

            // 3 spent on Free, then the key is upgraded: 17 of Pro's 20 left, not 20.
            assert!(check(&store, "k", 3, Some(&free), wide).allowed(), "{ctx}");
            assert_eq!(remaining(&store, "k", Some(&pro)), 17, "{ctx}: upgrade");
            // Back and forth at one instant: nothing is gained or lost.
            assert_eq!(
                remaining(&store, "k", Some(&free)),
                2,
                "{ctx}: back to free"
            );
            assert_eq!(remaining(&store, "k", Some(&pro)), 17, "{ctx}: pro again");
            assert_eq!(
                remaining(&store, "k", None),
                7,
                "{ctx}: the limit's own quota"
            );

            // 12 more on Pro, then a downgrade: 15 spent is more than Free holds; it reads as
            // exhausted, and all 15 stay spent (a cost-0 check changes nothing).
            let d = check(&store, "k", 12, Some(&pro), wide);
            assert!(d.allowed(), "{ctx}");
            assert_eq!(d.remaining(), 5, "{ctx}");
            let d = check(&store, "k", 1, Some(&free), wide);
            assert!(!d.allowed(), "{ctx}: downgrade keeps the spending");
            assert_eq!(d.remaining(), 0, "{ctx}");
            assert_eq!(remaining(&store, "k", Some(&free)), 0, "{ctx}");
            assert_eq!(
                remaining(&store, "k", Some(&pro)),
                5,
                "{ctx}: no reset gift"
            );
            assert_eq!(
                remaining(&store, "k", Some(&free)),
                0,
                "{ctx}: back on Free"
            );
            // Nothing was charged at Free, so nothing was written there: the key's state is
            // still Pro's. Two of Free's periods later the windows are whole, and so are the
            // buckets (Pro refills the 15 in 45 s). Never charged twice.
            clock.advance(2 * MINUTE);
            let left = remaining(&store, "k", Some(&free));
            assert_eq!(left, 5, "{ctx}: 2 minutes on");
            clock.advance(MINUTE);
            assert_eq!(remaining(&store, "k", Some(&free)), 5, "{ctx}: whole again");
            assert_eq!(store.len_of(0), Some(1), "{ctx}");
            // Another key on Pro is not touched by any of this.
            assert_eq!(remaining(&store, "other", Some(&pro)), 20, "{ctx}");
        }
    }
}

#[test]
fn an_upgrade_is_no_reset_gift_once_the_key_is_spent() {
    // Token bucket, GCRA and leaky bucket refill: the upgrade keeps what has not refilled.
    for kind in [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::LeakyBucket,
    ] {
        let (store, clock) = store(&[spec("api", Quota::per_minute(6), kind)]);
        let pro = PlanQuota::new(kind, Quota::per_minute(60)).unwrap();
        assert!(check(&store, "k", 6, None, false).allowed(), "{kind}");
        clock.advance(Duration::from_secs(25)); // 2.5 units came back: 3.5 spent, rounded up
        assert_eq!(remaining(&store, "k", Some(&pro)), 56, "{kind}");
        // A charge at Pro stores the key at Pro: Pro's rate from then on, 1 per second.
        assert!(check(&store, "k", 1, Some(&pro), false).allowed(), "{kind}");
        clock.advance(Duration::from_secs(2));
        assert_eq!(remaining(&store, "k", Some(&pro)), 57, "{kind}");
    }
}

#[test]
fn a_plan_of_another_algorithm_is_an_error_and_charges_nothing() {
    let (store, _) = store(&[
        spec("api", Quota::per_minute(10), AlgorithmKind::FixedWindow),
        spec("wide", Quota::per_hour(100), AlgorithmKind::TokenBucket),
    ]);
    let bucket = PlanQuota::new(AlgorithmKind::TokenBucket, Quota::per_minute(5)).unwrap();
    let key = Key::string("k");
    let bad = LimitCheck::new(0, key.clone(), 1).with_quota(&bucket);
    for checks in [
        vec![bad.clone()],
        vec![LimitCheck::new(1, key.clone(), 1), bad.clone()],
    ] {
        let err = match store.check(&checks) {
            Checked::Ready(result) => result.unwrap_err(),
            Checked::Pending(never) => match never {},
        };
        assert_eq!(err.kind(), StoreErrorKind::Other);
        let message = err.to_string();
        assert!(
            message.contains("api") && message.contains("fixed_window"),
            "{message}"
        );
        assert!(message.contains("token_bucket"), "{message}");
        assert!(store.refund_all(&checks, 0).is_err());
    }
    assert!(store.is_empty(), "nothing was charged");
}

#[test]
fn refunds_give_back_at_the_checks_quota() {
    for kind in AlgorithmKind::ALL {
        let (store, clock) = store(&[
            spec("api", Quota::per_minute(10), kind),
            spec("wide", Quota::per_hour(10_000), AlgorithmKind::TokenBucket),
        ]);
        let pro = PlanQuota::new(kind, Quota::per_minute(40)).unwrap();
        let key = Key::string("k");
        let checks = [
            LimitCheck::new(0, key.clone(), 4).with_quota(&pro),
            LimitCheck::new(1, Key::global(), 4),
        ];
        assert!(check(&store, "k", 6, Some(&pro), false).allowed(), "{kind}");
        let reserved = ready(store.check(&checks));
        assert!(reserved.allowed(), "{kind}");
        assert_eq!(reserved.as_slice()[0].remaining(), 30, "{kind}");
        let at = reserved
            .decided_at()
            .expect("the memory store reports when");
        assert_eq!(at, clock.now_micros(), "{kind}");

        let refunded = ready(store.refund(&checks, at));
        assert_eq!(refunded.decided_at(), Some(at), "{kind}");
        let [api, wide] = refunded.as_slice() else {
            panic!("{kind}: two decisions")
        };
        assert_eq!(api.remaining(), 34, "{kind}: Pro's 4 given back");
        assert_eq!(api.policy().as_str(), "api");
        assert_eq!(wide.remaining(), 10_000, "{kind}");
        assert_eq!(remaining(&store, "k", Some(&pro)), 34, "{kind}");
        // A key the store never held has nothing to give back.
        let never = [LimitCheck::new(0, Key::string("never"), 4).with_quota(&pro)];
        assert_eq!(
            ready(store.refund(&never, at)).as_slice()[0].remaining(),
            40
        );
        assert_eq!(
            store.len_of(0),
            Some(1),
            "{kind}: the refund stored nothing"
        );
    }
}

#[test]
fn reconfigure_keeps_unchanged_limits_and_starts_new_ones_fresh() {
    let (old, clock) = store(&[
        spec("per-ip", Quota::per_minute(10), AlgorithmKind::FixedWindow),
        spec("login", Quota::per_minute(5), AlgorithmKind::SlidingLog),
        spec("burst", Quota::per_second(10), AlgorithmKind::TokenBucket),
        spec("daily", Quota::per_day(100), AlgorithmKind::Gcra),
    ]);
    let key = Key::string("203.0.113.7");
    let all = |n: usize, cost: u64| -> Vec<LimitCheck<'_>> {
        (0..n)
            .map(|i| LimitCheck::new(i, key.clone(), cost))
            .collect()
    };
    assert!(ready(old.check(&all(4, 3))).allowed());

    let new = old
        .reconfigure(&[
            // Unchanged: its counters survive.
            spec("per-ip", Quota::per_minute(10), AlgorithmKind::FixedWindow),
            // Same name and algorithm, new quota: the key keeps what it spent.
            spec("daily", Quota::per_day(50), AlgorithmKind::Gcra),
            // Same name, another algorithm: a new limit, fresh.
            spec("burst", Quota::per_second(10), AlgorithmKind::Gcra),
            // New.
            spec(
                "search",
                Quota::per_minute(30),
                AlgorithmKind::SlidingWindow,
            ),
        ])
        .unwrap();
    assert_eq!(new.limits(), 4);
    assert_eq!(
        (new.max_keys(), new.shards()),
        (old.max_keys(), old.shards())
    );
    let left: Vec<u64> = ready(new.check(&all(4, 0)))
        .as_slice()
        .iter()
        .map(|d| d.remaining())
        .collect();
    assert_eq!(left, [7, 47, 10, 30]);
    // The tables are shared: a charge through either store is seen by both.
    assert!(new.check_one(0, &key, 2).unwrap().allowed());
    assert_eq!(old.check_one(0, &key, 0).unwrap().remaining(), 5);
    assert_eq!(old.check_one(3, &key, 0).unwrap().remaining(), 97);
    // The same clock.
    clock.advance(MINUTE);
    assert_eq!(new.check_one(0, &key, 0).unwrap().remaining(), 10);

    // Reloading back to the original quota reads the states at their own quota again.
    let back = new
        .reconfigure(&[spec("daily", Quota::per_day(100), AlgorithmKind::Gcra)])
        .unwrap();
    assert_eq!(back.check_one(0, &key, 0).unwrap().remaining(), 97);

    // Invalid limits are refused, and the old store keeps serving.
    let err = new
        .reconfigure(&[spec(
            "w",
            Quota::per_minute(10).burst(20),
            AlgorithmKind::FixedWindow,
        )])
        .unwrap_err();
    assert_eq!(err.field(), "quota.burst");
    let nine = vec![spec("x", Quota::per_minute(1), AlgorithmKind::TokenBucket); 9];
    assert_eq!(new.reconfigure(&nine).unwrap_err().field(), "limits");
    assert!(new.check_one(0, &key, 1).unwrap().allowed());
}

#[test]
fn a_key_on_a_slower_plan_is_not_recycled_by_the_limits_faster_quota() {
    // The limit refills in a second; alice's plan in a day. Eviction judges each key by the
    // quota its state was written under, so alice is kept (and her day's spending with her).
    let clock = ManualClock::new();
    let store = MemoryBackend::new()
        .max_keys(1)
        .shards(1)
        .clock(clock.clone())
        .build(&[spec(
            "api",
            Quota::per_second(5),
            AlgorithmKind::TokenBucket,
        )])
        .unwrap();
    let daily = PlanQuota::new(AlgorithmKind::TokenBucket, Quota::per_day(5)).unwrap();
    let alice = [LimitCheck::new(0, Key::string("alice"), 5).with_quota(&daily)];
    assert!(ready(store.check(&alice)).allowed());
    clock.advance(Duration::from_secs(2));
    assert!(store
        .check_one(0, &Key::string("bob"), 1)
        .unwrap()
        .allowed());
    assert_eq!(store.overflowed(), 1, "bob went to the overflow bucket");
    let again = [LimitCheck::new(0, Key::string("alice"), 1).with_quota(&daily)];
    assert!(
        !ready(store.check(&again)).allowed(),
        "alice kept her spending"
    );
    // Once alice's day has refilled her, her slot is recycled.
    clock.advance(Duration::from_secs(86_400));
    assert!(store
        .check_one(0, &Key::string("carol"), 1)
        .unwrap()
        .allowed());
    assert_eq!(store.overflowed(), 1);
}

#[test]
fn tables_checked_only_at_their_own_quota_keep_their_bytes_per_key() {
    let kind = AlgorithmKind::TokenBucket;
    let limits = [spec("api", Quota::per_hour(100), kind)];
    let (plain, _) = store(&limits);
    let (planned, _) = store(&limits);
    // A plan equal to the limit's own quota is the limit's own: no tags either.
    let same = PlanQuota::new(kind, Quota::per_hour(100)).unwrap();
    let pro = PlanQuota::new(kind, Quota::per_hour(1_000)).unwrap();
    for i in 0..1_000u64 {
        plain.check_one(0, &Key::int(i), 1).unwrap();
        let checks = [LimitCheck::new(0, Key::int(i), 1).with_quota(&same)];
        assert!(ready(planned.check(&checks)).allowed());
    }
    assert_eq!(plain.memory_usage(), planned.memory_usage());
    // A key at another quota: its tag lives in its slot, so no table grows for it.
    let checks = [LimitCheck::new(0, Key::int(0), 1).with_quota(&pro)];
    assert!(ready(planned.check(&checks)).allowed());
    assert_eq!(plain.memory_usage(), planned.memory_usage());
    assert_eq!(
        ready(planned.check(&checks)).as_slice()[0].remaining(),
        997,
        "the key is held at the pro quota: 3 spent (1 at its own, then 2 at pro) of 1 000"
    );
}
