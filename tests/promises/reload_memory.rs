//! Memory is bounded by the policy in force, however many reloads: limit and plan names are held
//! inline (nothing interned or leaked), quotas are kept while in force plus a bounded number of
//! recent ones, and plan names read from requests keep nothing.
//!
//! Memory is measured as the process's resident set (`/proc/self/statm`), in a child process
//! that runs only the measuring test on one thread (this binary, re-run with a filter:
//! `harness::isolated`), so that other tests' allocations cannot move it. Allocations are served
//! from memory the allocator already holds once the loop is warm, so a bounded workload's RSS
//! stays flat and a leak shows as growth proportional to the reloads.

use http::Request;
use tollgate::key::GlobalKey;
use tollgate::plan::{Plan, PlanFromHeader};
use tollgate::store::memory::MemoryBackend;
use tollgate::{Limit, Quota, RateLimitLayer};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

use crate::harness::isolated;

/// The resident set of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages in /proc/self/statm");
    pages * 4096
}

/// Prints a figure for the parent to read.
fn figure(name: &str, value: u64) {
    println!("figure {name} {value}");
}

/// In the parent: runs test `name` alone in a child process and returns the figures it printed.
/// In the child: `None` (run the measurement).
fn run_alone(name: &str) -> Option<Vec<(String, u64)>> {
    let stdout = isolated::run_alone(name)?;
    let figures: Vec<(String, u64)> = stdout
        .lines()
        // libtest prints "test <name> ... " before the output, on the same line.
        .filter_map(|l| l.split_once("figure ").map(|(_, f)| f))
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect();
    assert!(
        !figures.is_empty(),
        "the child printed no figures:\n{stdout}"
    );
    Some(figures)
}

fn get(figures: &[(String, u64)], name: &str) -> u64 {
    figures
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no figure {name} in {figures:?}"))
}

const MB: u64 = 1 << 20;

/// `bytes` in MB, to print.
fn mb(bytes: u64) -> f64 {
    bytes as f64 / MB as f64
}

/// Asserts the resident set grew by less than 1 MB from `before` to `after` (`between` names
/// the two points in the message).
fn assert_grew_less_than_1mb(before: u64, after: u64, between: &str) {
    let grew = after.saturating_sub(before);
    assert!(grew < MB, "memory grew {grew} bytes {between}");
}

/// A layer on a small memory store (the store's tables are not what is measured).
fn layer(limit: Limit) -> RateLimitLayer<tollgate::store::memory::MemoryStore> {
    RateLimitLayer::builder()
        .backend(MemoryBackend::new().max_keys(16).shards(1))
        .limit(limit)
        .build()
        .expect("build the layer")
}

/// Reload `i`: a limit and two plans, all with names never used before, and quotas never used
/// before either.
fn fresh_limit(i: u64) -> Limit {
    Limit::new(format!("fresh-limit-{i}"), Quota::per_second(1_000_000 + i))
        .key(GlobalKey)
        .plan(Plan::new(
            format!("free-{i}"),
            Quota::per_second(2_000_000 + i),
        ))
        .plan(Plan::new(
            format!("pro-{i}"),
            Quota::per_second(3_000_000 + i),
        ))
        .resolve_plan(PlanFromHeader::new("x-plan").unwrap())
}

fn fresh_names_child() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let layer = layer(fresh_limit(0));
        let mut svc = ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(|_: Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
            }));
        let mut at = Vec::new();
        for i in 1..=100_000u64 {
            layer.reload(vec![fresh_limit(i)], "test").expect("reload");
            // One request per reload, at the new plan: its decision carries the new names.
            let req = Request::get("/")
                .header("x-plan", format!("pro-{i}"))
                .body(())
                .unwrap();
            let res = svc.ready().await.unwrap().call(req).await.unwrap();
            assert_eq!(res.status(), 200);
            if i == 1_000 || i == 10_000 || i == 100_000 {
                at.push((i, rss()));
            }
        }
        for (i, rss) in at {
            figure(&format!("rss_after_{i}"), rss);
        }
        figure("kept_quotas", tollgate::store::kept_quotas() as u64);
    });
}

/// Item 3: 100,000 reloads, each with a limit and two plans of names and quotas never used
/// before (and one request decided at the new plan), end within 1 MB of the resident set after
/// 1,000.
#[test]
fn reloads_with_fresh_names_end_within_1mb_of_1000_reloads() {
    let Some(figures) =
        run_alone("reload_memory::reloads_with_fresh_names_end_within_1mb_of_1000_reloads")
    else {
        return fresh_names_child();
    };
    let (at_1k, at_10k, at_100k) = (
        get(&figures, "rss_after_1000"),
        get(&figures, "rss_after_10000"),
        get(&figures, "rss_after_100000"),
    );
    println!(
        "RSS after 1,000 reloads {:.2} MB, 10,000 {:.2} MB, 100,000 {:.2} MB: grew {:.3} MB from 1,000 to 100,000 (bound 1 MB)",
        mb(at_1k),
        mb(at_10k),
        mb(at_100k),
        mb(at_100k.saturating_sub(at_1k))
    );
    assert_grew_less_than_1mb(at_1k, at_100k, "from 1,000 to 100,000 reloads");
    // The registry's own count: the 3 quotas in force and at most KEPT_QUOTAS others, where
    // 300,000 distinct quotas were compiled.
    let kept = get(&figures, "kept_quotas");
    println!(
        "quotas kept after 300,000 distinct ones compiled: {kept} (bound {} + 3 in force)",
        tollgate::store::KEPT_QUOTAS
    );
    assert!(kept <= tollgate::store::KEPT_QUOTAS as u64 + 3);
}

fn forgotten_quota_child() {
    use tollgate::clock::ManualClock;
    use tollgate::key::Key;
    use tollgate::store::{Backend, LimitCheck, LimitSpec, PlanQuota};
    use tollgate::{AlgorithmKind, Name};

    let kind = AlgorithmKind::TokenBucket;
    let spec = LimitSpec::new(Name::new("api"), Quota::per_hour(100), kind);
    let store = MemoryBackend::new()
        .clock(ManualClock::new())
        .build(&[spec])
        .unwrap();
    let free = PlanQuota::new(kind, Quota::per_hour(10)).unwrap();
    let alice = Key::string("alice");
    let check = |quota: &PlanQuota, cost| {
        store
            .check_all(&[LimitCheck::new(0, alice.clone(), cost).with_quota(quota)])
            .unwrap()
            .as_slice()[0]
    };
    // Alice spends her whole free budget.
    assert!(check(&free, 10).allowed());
    assert!(!check(&free, 1).allowed());
    // No layer holds the free quota, and 2 x KEPT_QUOTAS other quotas are compiled after it:
    // the process forgets it.
    for i in 0..2 * tollgate::store::KEPT_QUOTAS as u64 {
        PlanQuota::new(kind, Quota::per_hour(1_000_000 + i)).unwrap();
    }
    // At a larger quota, her state cannot be converted from a forgotten one: she is counted as
    // having spent the whole budget, not given a fresh one.
    let pro = PlanQuota::new(kind, Quota::per_hour(50)).unwrap();
    let d = check(&pro, 0);
    figure("remaining_after_forgotten", d.remaining());
    let admitted = (0..50).filter(|_| check(&pro, 1).allowed()).count();
    figure("admitted_after_forgotten", admitted as u64);
}

/// A key whose state was written under a quota the process no longer keeps is counted as
/// having spent its whole budget under the quota it is next checked at: never a fresh budget.
#[test]
fn a_forgotten_quota_is_never_a_fresh_budget() {
    let Some(figures) = run_alone("reload_memory::a_forgotten_quota_is_never_a_fresh_budget")
    else {
        return forgotten_quota_child();
    };
    let remaining = get(&figures, "remaining_after_forgotten");
    let admitted = get(&figures, "admitted_after_forgotten");
    println!("after its quota was forgotten: remaining {remaining} of 50, then {admitted} of 50 admitted at once");
    assert_eq!((remaining, admitted), (0, 0));
}

fn junk_plan_names_child() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let limit = |_| {
            Limit::new("api", Quota::per_hour(1_000_000))
                .key(GlobalKey)
                .plan(Plan::new("free", Quota::per_hour(100_000)))
                .plan(Plan::new("pro", Quota::per_hour(1_000_000)))
                .resolve_plan(PlanFromHeader::new("x-plan").unwrap())
        };
        let layer = layer(limit(0));
        let mut svc = ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(|_: Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
            }));
        let mut at = Vec::new();
        for reload in 1..=200u64 {
            // A new resolver per reload, then 300 requests naming plans that do not exist.
            layer.reload(vec![limit(reload)], "test").expect("reload");
            for j in 0..300 {
                let req = Request::get("/")
                    .header(
                        "x-plan",
                        format!("junk-{reload}-{j}-padding-to-forty-bytes"),
                    )
                    .body(())
                    .unwrap();
                let res = svc.ready().await.unwrap().call(req).await.unwrap();
                assert_eq!(
                    res.status(),
                    200,
                    "an unknown plan counts at the limit's own quota"
                );
            }
            if reload == 20 || reload == 200 {
                at.push((reload, rss()));
            }
        }
        for (i, rss) in at {
            figure(&format!("rss_after_{i}"), rss);
        }
    });
}

/// Item 3: 200 reloads, each followed by 300 requests naming junk plans (60,000 distinct
/// names), grow the resident set by less than 1 MB from reload 20 to reload 200.
#[test]
fn junk_plan_names_from_requests_keep_no_memory() {
    let Some(figures) = run_alone("reload_memory::junk_plan_names_from_requests_keep_no_memory")
    else {
        return junk_plan_names_child();
    };
    let (at_20, at_200) = (
        get(&figures, "rss_after_20"),
        get(&figures, "rss_after_200"),
    );
    println!(
        "RSS after 20 reloads x 300 junk plan names {:.2} MB, after 200 {:.2} MB: grew {:.3} MB (bound 1 MB)",
        mb(at_20),
        mb(at_200),
        mb(at_200.saturating_sub(at_20))
    );
    assert_grew_less_than_1mb(at_20, at_200, "from reload 20 to reload 200");
}

/// Item 3: no global lock on the request path. Names are inline (no interner), plan names read
/// from requests keep nothing (no memo), and the process-wide quota registry is not touched by
/// a check at an unchanged quota: with the registry's lock held by this test, 2,000 requests
/// (new keys, known and junk plan names, fresh names made per request) all complete.
#[test]
fn requests_take_no_global_lock() {
    use std::sync::mpsc;
    use std::time::Duration;
    use tollgate::key::HeaderKey;
    use tollgate::Name;

    let layer = RateLimitLayer::builder()
        .limit(
            Limit::new("api", Quota::per_minute(100))
                .key(HeaderKey::new("x-key").unwrap())
                .plan(Plan::new("free", Quota::per_minute(10)))
                .plan(Plan::new("pro", Quota::per_minute(1_000)))
                .resolve_plan(PlanFromHeader::new("x-plan").unwrap()),
        )
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        }));
    let (done, finished) = mpsc::channel();
    let worker = tollgate::store::with_quota_registry_locked(|| {
        let worker = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut admitted = 0;
                for n in 0..2_000 {
                    let plan = match n % 3 {
                        0 => "pro".to_owned(),
                        1 => "free".to_owned(),
                        _ => format!("junk-{n}"),
                    };
                    let made = Name::new(format!("made-per-request-{n}"));
                    assert_eq!(made.as_str(), format!("made-per-request-{n}"));
                    let req = Request::get("/")
                        .header("x-key", format!("key-{n}"))
                        .header("x-plan", plan)
                        .body(())
                        .unwrap();
                    let res = svc.clone().oneshot(req).await.unwrap();
                    admitted += usize::from(res.status() == 200);
                }
                done.send(admitted).unwrap();
            });
        });
        let admitted = finished.recv_timeout(Duration::from_secs(30));
        println!("with the quota registry locked: {admitted:?} of 2,000 requests decided");
        assert_eq!(
            admitted,
            Ok(2_000),
            "requests blocked while the quota registry was locked"
        );
        worker
    });
    worker.join().unwrap();
}

/// A name is held inline, at most `Name::MAX_LEN` (47) bytes: a longer limit, plan,
/// policy or concurrency-limit name is refused when built, with an error naming the field and
/// the maximum (and a reload with one is refused, the old limits serving on).
#[test]
fn over_long_names_are_refused_at_build() {
    use tollgate::concurrency::ConcurrencyLimitLayer;
    use tollgate::policy::Policy;
    use tollgate::Name;

    let long = "n".repeat(Name::MAX_LEN + 1);
    let longest = "n".repeat(Name::MAX_LEN);

    let err =
        RateLimitLayer::new(Limit::new(&long, Quota::per_minute(5)).key(GlobalKey)).unwrap_err();
    assert_eq!(err.field(), "limit.name");
    assert!(err.to_string().contains("47 bytes"), "{err}");
    assert!(RateLimitLayer::new(Limit::new(&longest, Quota::per_minute(5)).key(GlobalKey)).is_ok());

    let with_plan = |name: &str| {
        RateLimitLayer::new(
            Limit::new("api", Quota::per_minute(5))
                .key(GlobalKey)
                .plan(Plan::new(name, Quota::per_minute(10)))
                .resolve_plan(PlanFromHeader::new("x-plan").unwrap()),
        )
    };
    let err = with_plan(&long).unwrap_err();
    assert_eq!(err.field(), "limit.plans.name");
    assert!(err.to_string().contains("47 bytes"), "{err}");
    assert!(with_plan(&longest).is_ok());

    let layer =
        RateLimitLayer::new(Limit::new("api", Quota::per_minute(5)).key(GlobalKey)).unwrap();
    let err = layer
        .reload(
            vec![Limit::new(&long, Quota::per_minute(5)).key(GlobalKey)],
            "test",
        )
        .unwrap_err();
    assert_eq!(err.field(), "limit.name");

    let toml = format!("[[limit]]\nname = \"{long}\"\nquota = \"10/s\"\nkey = \"peer_ip\"\n");
    let err = Policy::from_toml_str(&toml, "inline")
        .and_then(|p| p.limits())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("name") && err.contains("at most 47 bytes"),
        "{err}"
    );
    // A window suffix counts: "<name>/s" must fit too.
    let toml = format!(
        "[[limit]]\nname = \"{}\"\nquota = \"10/s; 100/h\"\nkey = \"peer_ip\"\n",
        &longest[1..]
    );
    let err = Policy::from_toml_str(&toml, "inline")
        .and_then(|p| p.limits())
        .unwrap_err()
        .to_string();
    assert!(err.contains("at most 47 bytes"), "{err}");

    let err = ConcurrencyLimitLayer::builder(2)
        .name(&long)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "name");
    println!(
        "over-long names refused: limit.name, limit.plans.name, policy name, concurrency name"
    );
}

/// A layer with one limit of 100/h keyed by `x-key`, on a memory store whose clock is frozen.
fn override_layer(
    clock: &tollgate::clock::ManualClock,
) -> RateLimitLayer<tollgate::store::memory::MemoryStore<tollgate::clock::ManualClock>> {
    RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(clock.clone()))
        .limit(override_limit())
        .build()
        .expect("build the layer")
}

fn override_limit() -> Limit {
    Limit::new("api", Quota::per_hour(100)).key(tollgate::key::HeaderKey::new("x-key").unwrap())
}

/// A per-key override's quota is kept (pinned) while the override exists: however many other
/// quotas are compiled or released meanwhile, a reload finds it under the same tag and the
/// key keeps what it spent. Reproduction: a 5000/h override, 1 spent, 6,000 unrelated quotas
/// compiled, a reload with the same limits: the key has 4,999 left (its next request is
/// admitted with 4,998 remaining), not 0 and refused.
#[tokio::test]
async fn an_override_keeps_its_budget_across_quota_churn_and_reloads() {
    use tollgate::key::Key;
    use tollgate::rate_limit::Override;
    use tollgate::store::PlanQuota;
    use tollgate::AlgorithmKind;

    let clock = tollgate::clock::ManualClock::new();
    let layer = override_layer(&clock);
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        }));
    let call = |key: &str| Request::get("/").header("x-key", key).body(()).unwrap();
    let remaining = |res: &http::Response<_>| -> u64 {
        res.headers()["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    layer
        .set_override(
            "api",
            Key::string("big-co"),
            Override::Quota(Quota::per_hour(5_000)),
            "sales",
        )
        .unwrap();
    let res = svc.clone().oneshot(call("big-co")).await.unwrap();
    assert_eq!((res.status().as_u16(), remaining(&res)), (200, 4_999));

    // Many quotas compiled by others (direct PlanQuota users, reloads of other layers): more
    // than the process keeps unpinned.
    for i in 0..3_000u64 {
        for kind in [AlgorithmKind::TokenBucket, AlgorithmKind::Gcra] {
            PlanQuota::new(kind, Quota::per_second(70_000_000 + i)).unwrap();
        }
    }
    layer.reload(vec![override_limit()], "test").unwrap();
    let res = svc.clone().oneshot(call("big-co")).await.unwrap();
    let (status, left) = (res.status().as_u16(), remaining(&res));
    println!(
        "override 5000/h, 1 spent, 6,000 other quotas compiled, reload: next request {status}, remaining {left} (4,998 expected)"
    );
    assert_eq!((status, left), (200, 4_998), "the key lost its budget");

    // Replaced by another quota, then by the first again: the first was released (not pinned)
    // in between, and is still among the most recent, so the key keeps what it spent.
    layer
        .set_override(
            "api",
            Key::string("big-co"),
            Override::Quota(Quota::per_hour(6_000)),
            "sales",
        )
        .unwrap();
    layer
        .set_override(
            "api",
            Key::string("big-co"),
            Override::Quota(Quota::per_hour(5_000)),
            "sales",
        )
        .unwrap();
    let res = svc.clone().oneshot(call("big-co")).await.unwrap();
    assert_eq!((res.status().as_u16(), remaining(&res)), (200, 4_997));
}

fn override_pins_child() {
    use tollgate::key::Key;
    use tollgate::rate_limit::Override;
    use tollgate::store::{kept_quotas, PlanQuota, KEPT_QUOTAS};
    use tollgate::AlgorithmKind;

    let clock = tollgate::clock::ManualClock::new();
    let layer = override_layer(&clock);
    let set = |key: String, per_second: u64| {
        layer
            .set_override(
                "api",
                Key::string(key),
                Override::Quota(Quota::per_second(per_second)),
                "test",
            )
            .unwrap();
    };
    let churn = |from: u64| {
        for i in 0..2 * KEPT_QUOTAS as u64 {
            PlanQuota::new(AlgorithmKind::Gcra, Quota::per_second(from + i)).unwrap();
        }
    };
    // 1,500 overrides of distinct quotas: all kept while they exist.
    for i in 0..1_500u64 {
        set(format!("key-{i}"), 1_000 + i);
    }
    churn(10_000_000);
    figure("kept_with_1500_overrides", kept_quotas() as u64);
    // Each replaced twice: only the quotas in force stay pinned.
    for round in 1..=2u64 {
        for i in 0..1_500u64 {
            set(format!("key-{i}"), 1_000_000 * round + i);
        }
    }
    churn(20_000_000);
    figure("kept_after_replacing", kept_quotas() as u64);
    // Reloads keep them, and pin nothing more.
    for _ in 0..3 {
        layer.reload(vec![override_limit()], "test").unwrap();
    }
    churn(30_000_000);
    figure("kept_after_reloads", kept_quotas() as u64);
    // Removed: released, then forgotten once others are used.
    for i in 0..1_500u64 {
        assert!(layer.remove_override("api", Key::string(format!("key-{i}")), "test"));
    }
    churn(40_000_000);
    figure("kept_after_removing", kept_quotas() as u64);
}

/// Overrides' quotas are kept while the overrides exist, and released when an override is
/// replaced or removed: the registry holds the quotas in force plus at most `KEPT_QUOTAS`.
#[test]
fn override_quotas_are_kept_while_in_force_and_released_after() {
    let Some(figures) =
        run_alone("reload_memory::override_quotas_are_kept_while_in_force_and_released_after")
    else {
        return override_pins_child();
    };
    let keep = tollgate::store::KEPT_QUOTAS as u64;
    let with = get(&figures, "kept_with_1500_overrides");
    let replaced = get(&figures, "kept_after_replacing");
    let reloaded = get(&figures, "kept_after_reloads");
    let removed = get(&figures, "kept_after_removing");
    println!(
        "quotas kept: 1,500 overrides {with}, after 3,000 replacements {replaced}, after 3 reloads {reloaded}, after removing all {removed} (KEPT_QUOTAS {keep})"
    );
    // The limit's own quota is pinned too.
    assert!((1_501..=1_501 + keep).contains(&with), "{with}");
    assert!((1_501..=1_501 + keep).contains(&replaced), "{replaced}");
    assert!((1_501..=1_501 + keep).contains(&reloaded), "{reloaded}");
    assert!(removed <= 1 + keep, "{removed}");
}
