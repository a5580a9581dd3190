//! Plans, overrides, shadow mode, charge by outcome and reload, through the layer (memory store,
//! `oneshot`, a manual clock): what a client sees.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::key::{GlobalKey, HeaderKey, Key, KeyValue};
use tollgate::plan::{Plan, Resolution, UnknownPlan};
use tollgate::rate_limit::Charge;
use tollgate::rate_limit::Mode;
use tollgate::rate_limit::Override;
use tollgate::rate_limit::{AuditEvent, Change};
use tollgate::store::memory::MemoryBackend;
use tollgate::{AlgorithmKind, Limit, Name, Quota, RateLimitLayer, RequestView};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

fn get(key: &str) -> Request<String> {
    Request::get("/api/items")
        .header("x-api-key", key)
        .body(String::new())
        .unwrap()
}

fn api_key_plan(_: &RequestView<'_>, key: &Key<'_>) -> Resolution {
    match key.value() {
        KeyValue::Bytes(b) if b.starts_with(b"free-") => Resolution::Plan(Name::new("free")),
        KeyValue::Bytes(b) if b.starts_with(b"pro-") => Resolution::Plan(Name::new("pro")),
        KeyValue::Bytes(b) if b.starts_with(b"gold-") => Resolution::Plan(Name::new("gold")),
        _ => Resolution::Unknown,
    }
}

fn plans_limit(algorithm: AlgorithmKind, free: u64) -> Limit {
    Limit::new("api", Quota::per_minute(free))
        .algorithm(algorithm)
        .key(HeaderKey::new("x-api-key").unwrap())
        .plan(Plan::new("free", Quota::per_minute(free)).link("https://example.com/upgrade"))
        .plan(Plan::new("pro", Quota::per_minute(20)))
        .resolve_plan(api_key_plan)
        .on_unknown_plan(UnknownPlan::reject(StatusCode::UNAUTHORIZED))
}

fn layer_with(
    clock: &ManualClock,
    limits: Vec<Limit>,
) -> RateLimitLayer<tollgate::store::memory::MemoryStore<ManualClock>> {
    RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(clock.clone()))
        .limits(limits)
        .build()
        .unwrap()
}

async fn status<S>(svc: &S, req: Request<String>) -> (StatusCode, Option<String>)
where
    S: Service<
            Request<String>,
            Response = Response<tollgate::rate_limit::ResponseBody<String>>,
            Error = Infallible,
        > + Clone,
{
    let res = svc.clone().oneshot(req).await.unwrap();
    let remaining = res
        .headers()
        .get("x-ratelimit-remaining")
        .map(|v| v.to_str().unwrap().to_owned());
    (res.status(), remaining)
}

#[tokio::test]
async fn each_plan_gets_its_quota_and_unknown_keys_get_401() {
    for algorithm in AlgorithmKind::ALL {
        let clock = ManualClock::new();
        let layer = layer_with(&clock, vec![plans_limit(algorithm, 5)]);
        let svc = app_generic(&layer);
        let admitted = |key: &'static str| {
            let svc = svc.clone();
            async move {
                let mut n = 0;
                for _ in 0..30 {
                    if svc.clone().oneshot(get(key)).await.unwrap().status() == StatusCode::OK {
                        n += 1;
                    }
                }
                n
            }
        };
        assert_eq!(admitted("free-key-1").await, 5, "{algorithm}");
        assert_eq!(admitted("pro-key-1").await, 20, "{algorithm}");
        let res = svc.clone().oneshot(get("stolen")).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{algorithm}");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        // A plan the limit does not have is unknown too.
        let res = svc.clone().oneshot(get("gold-1")).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{algorithm}");
    }
}

/// Generic over the store: the layer's services for any store type.
fn app_generic<St: tollgate::store::Store>(
    layer: &RateLimitLayer<St>,
) -> impl Service<
    Request<String>,
    Response = Response<tollgate::rate_limit::ResponseBody<String>>,
    Error = Infallible,
> + Clone {
    ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|req: Request<String>| async move {
            let status = req
                .headers()
                .get("x-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u16>().ok())
                .unwrap_or(200);
            let mut res = Response::new(String::new());
            *res.status_mut() = StatusCode::from_u16(status).unwrap();
            Ok::<_, Infallible>(res)
        }))
}

#[tokio::test]
async fn an_upgrade_keeps_what_was_spent_on_every_algorithm() {
    for algorithm in AlgorithmKind::ALL {
        let clock = ManualClock::new();
        let layer = layer_with(&clock, vec![plans_limit(algorithm, 5)]);
        let svc = app_generic(&layer);
        for _ in 0..5 {
            assert_eq!(status(&svc, get("free-key-1")).await.0, StatusCode::OK);
        }
        assert_eq!(
            status(&svc, get("free-key-1")).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        // The operator raises free to 10/min: at most 5 more within the minute, not 10.
        layer
            .reload(vec![plans_limit(algorithm, 10)], "test")
            .unwrap();
        let mut more = 0;
        for _ in 0..20 {
            if status(&svc, get("free-key-1")).await.0 == StatusCode::OK {
                more += 1;
            }
        }
        assert_eq!(more, 5, "{algorithm}: an upgrade is no reset gift");
    }
}

#[tokio::test]
async fn a_downgrade_charges_nothing_twice() {
    for algorithm in AlgorithmKind::ALL {
        let clock = ManualClock::new();
        let layer = layer_with(&clock, vec![plans_limit(algorithm, 5)]);
        let svc = app_generic(&layer);
        // Three of pro's twenty spent, then free has 5: 2 left, not 5 and not 0.
        let key = "pro-then-free";
        let limit = |pro_for: &'static str| {
            Limit::new("api", Quota::per_minute(5))
                .algorithm(algorithm)
                .key(HeaderKey::new("x-api-key").unwrap())
                .plan(Plan::new("free", Quota::per_minute(5)))
                .plan(Plan::new("pro", Quota::per_minute(20)))
                .resolve_plan(move |_: &RequestView<'_>, k: &Key<'_>| {
                    if k.to_string() == format!("b:{pro_for}") {
                        Resolution::Plan(Name::new("pro"))
                    } else {
                        Resolution::Plan(Name::new("free"))
                    }
                })
        };
        layer.reload(vec![limit(key)], "test").unwrap();
        for _ in 0..3 {
            assert_eq!(status(&svc, get(key)).await.0, StatusCode::OK);
        }
        layer.reload(vec![limit("nobody")], "test").unwrap();
        let mut left = 0;
        for _ in 0..10 {
            if status(&svc, get(key)).await.0 == StatusCode::OK {
                left += 1;
            }
        }
        assert_eq!(left, 2, "{algorithm}: a downgrade keeps the 3 spent, once");
    }
}

#[tokio::test]
async fn overrides_block_exempt_and_set_a_custom_quota_and_are_audited() {
    let clock = ManualClock::new();
    let events: Arc<Mutex<Vec<AuditEvent>>> = Arc::default();
    let sink = events.clone();
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(clock.clone()))
        .limit(Limit::new("api", Quota::per_minute(2)).key(HeaderKey::new("x-api-key").unwrap()))
        .on_audit(move |e: &AuditEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let svc = app_generic(&layer);

    layer
        .set_override("api", Key::string("abuser"), Override::Block, "incident")
        .unwrap();
    let res = svc.clone().oneshot(get("abuser")).await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(res.headers()["content-type"], "application/problem+json");

    layer
        .set_override("api", Key::string("ops"), Override::Exempt, "ops")
        .unwrap();
    for _ in 0..10 {
        let res = svc.clone().oneshot(get("ops")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("x-ratelimit-limit").is_none());
    }

    layer
        .set_override(
            "api",
            Key::string("big"),
            Override::Quota(Quota::per_minute(7)),
            "sales",
        )
        .unwrap();
    let mut ok = 0;
    for _ in 0..10 {
        if status(&svc, get("big")).await.0 == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 7);
    // Others keep the limit's quota.
    assert_eq!(
        status(&svc, get("small")).await,
        (StatusCode::OK, Some("1".into()))
    );

    // Overrides outlive a reload.
    layer
        .reload(
            vec![Limit::new("api", Quota::per_minute(3)).key(HeaderKey::new("x-api-key").unwrap())],
            "reload",
        )
        .unwrap();
    assert_eq!(
        svc.clone().oneshot(get("abuser")).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );

    assert!(layer.remove_override("api", Key::string("abuser"), "incident closed"));
    assert!(!layer.remove_override("api", Key::string("abuser"), "again"));
    assert_eq!(
        svc.clone().oneshot(get("abuser")).await.unwrap().status(),
        StatusCode::OK
    );
    assert!(layer
        .set_override("nope", Key::string("x"), Override::Block, "t")
        .is_err());

    let events = events.lock().unwrap();
    assert_eq!(events.len(), 5, "{events:?}");
    let text: Vec<String> = events.iter().map(ToString::to_string).collect();
    assert!(
        text[0].contains("limit=api key#") && text[0].contains("override block"),
        "{}",
        text[0]
    );
    assert!(
        !text.iter().any(|t| t.contains("abuser")),
        "keys are never logged in clear"
    );
    assert!(matches!(
        events[3].changes()[0],
        Change::QuotaChanged { .. }
    ));
}

#[tokio::test]
async fn shadow_limits_never_refuse_but_count_and_can_show_headers() {
    for headers in [false, true] {
        let clock = ManualClock::new();
        let layer = layer_with(
            &clock,
            vec![
                Limit::new("per-key", Quota::per_minute(100))
                    .key(HeaderKey::new("x-api-key").unwrap()),
                Limit::new("global-shadow", Quota::per_minute(3))
                    .algorithm(AlgorithmKind::FixedWindow)
                    .key(GlobalKey)
                    .mode(Mode::Shadow { headers }),
            ],
        );
        let svc = app_generic(&layer);
        for i in 0..6u64 {
            let (s, remaining) = status(&svc, get("a")).await;
            assert_eq!(s, StatusCode::OK);
            let expected = if headers {
                2u64.saturating_sub(i)
            } else {
                99 - i
            };
            assert_eq!(
                remaining,
                Some(expected.to_string()),
                "headers={headers} request {i}"
            );
        }
        // Moved to enforce by a reload, it keeps its count: the next request is refused.
        layer
            .reload(
                vec![
                    Limit::new("per-key", Quota::per_minute(100))
                        .key(HeaderKey::new("x-api-key").unwrap()),
                    Limit::new("global-shadow", Quota::per_minute(3))
                        .algorithm(AlgorithmKind::FixedWindow)
                        .key(GlobalKey),
                ],
                "enforce",
            )
            .unwrap();
        assert_eq!(
            status(&svc, get("a")).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

#[tokio::test]
async fn only_failed_logins_count() {
    let clock = ManualClock::new();
    let layer = layer_with(
        &clock,
        vec![Limit::new("login", Quota::per_minute(3))
            .algorithm(AlgorithmKind::FixedWindow)
            .key(GlobalKey)
            .charge(Charge::only_when(|s| s == StatusCode::UNAUTHORIZED))],
    );
    let svc = app_generic(&layer);
    let login = |status: u16| {
        Request::post("/login")
            .header("x-status", status.to_string())
            .body(String::new())
            .unwrap()
    };
    for _ in 0..5 {
        assert_eq!(status(&svc, login(200)).await.0, StatusCode::OK);
    }
    for _ in 0..3 {
        assert_eq!(status(&svc, login(401)).await.0, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        status(&svc, login(200)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_secs(60));
    assert_eq!(status(&svc, login(200)).await.0, StatusCode::OK);
}

#[tokio::test]
async fn late_responses_never_let_more_than_the_quota_through() {
    // 20 concurrent requests whose responses all arrive after every one was admitted: the
    // reservations hold the quota, so exactly 3 are admitted even though none is counted yet.
    let clock = ManualClock::new();
    let layer = layer_with(
        &clock,
        vec![Limit::new("login", Quota::per_minute(3))
            .algorithm(AlgorithmKind::SlidingLog)
            .key(GlobalKey)
            .charge(Charge::only_when(|s| s == StatusCode::UNAUTHORIZED))],
    );
    let gate = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(AtomicUsize::new(0));
    let (g, e) = (gate.clone(), entered.clone());
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(move |_: Request<String>| {
            let (g, e) = (g.clone(), e.clone());
            async move {
                e.fetch_add(1, Ordering::SeqCst);
                g.notified().await;
                let mut res = Response::new(String::new());
                *res.status_mut() = StatusCode::OK; // a successful login: given back
                Ok::<_, Infallible>(res)
            }
        }));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            svc.oneshot(Request::new(String::new()))
                .await
                .unwrap()
                .status()
        }));
    }
    while entered.load(Ordering::SeqCst) < 3 {
        tokio::task::yield_now().await;
    }
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        entered.load(Ordering::SeqCst),
        3,
        "in flight hold their units"
    );
    gate.notify_waiters();
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap() == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 3);
    // Given back: the next three pass.
    let svc2 = app_generic(&layer);
    for _ in 0..3 {
        assert_eq!(
            status(&svc2, Request::new(String::new())).await.0,
            StatusCode::OK
        );
    }
}

#[tokio::test]
async fn an_invalid_reload_is_refused_and_the_old_policy_keeps_serving() {
    let clock = ManualClock::new();
    let layer = layer_with(&clock, vec![plans_limit(AlgorithmKind::FixedWindow, 5)]);
    let svc = app_generic(&layer);
    assert_eq!(
        status(&svc, get("free-1")).await,
        (StatusCode::OK, Some("4".into()))
    );
    let bad = Limit::new("api", Quota::per_minute(5))
        .algorithm(AlgorithmKind::FixedWindow)
        .key(HeaderKey::new("x-api-key").unwrap())
        .plan(Plan::new("free", Quota::per_minute(5).burst(9)));
    let err = layer.reload(vec![bad], "bad file").unwrap_err();
    assert!(err.to_string().contains("plan \"free\""), "{err}");
    assert_eq!(
        status(&svc, get("free-1")).await,
        (StatusCode::OK, Some("3".into()))
    );
}

#[tokio::test]
async fn a_lookup_in_flight_is_awaited_then_resolved_from_its_cache() {
    let cache: Arc<Mutex<Option<&'static str>>> = Arc::default();
    let lookups = Arc::new(AtomicUsize::new(0));
    let (c, l) = (cache.clone(), lookups.clone());
    let resolver = move |_: &RequestView<'_>, _: &Key<'_>| match *c.lock().unwrap() {
        Some(plan) => Resolution::Plan(Name::new(plan)),
        None => {
            l.fetch_add(1, Ordering::SeqCst);
            let c = c.clone();
            Resolution::Lookup(Box::pin(async move {
                tokio::task::yield_now().await;
                *c.lock().unwrap() = Some("pro");
            }))
        }
    };
    let clock = ManualClock::new();
    let layer = layer_with(
        &clock,
        vec![Limit::new("api", Quota::per_minute(5))
            .key(HeaderKey::new("x-api-key").unwrap())
            .plan(Plan::new("pro", Quota::per_minute(20)))
            .resolve_plan(resolver)],
    );
    let svc = app_generic(&layer);
    let res = svc.clone().oneshot(get("k")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-limit"], "20");
    let res = svc.clone().oneshot(get("k")).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-remaining"], "18");
    assert_eq!(lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_shadow_limit_never_refuses_even_without_a_key_or_plan_or_when_blocked() {
    let clock = ManualClock::new();
    let layer = layer_with(
        &clock,
        vec![
            Limit::new("open", Quota::per_minute(100)).key(GlobalKey),
            Limit::new("tried", Quota::per_minute(5))
                .key(HeaderKey::new("x-api-key").unwrap())
                .plan(Plan::new("pro", Quota::per_minute(20)))
                .resolve_plan(api_key_plan)
                .on_unknown_plan(UnknownPlan::reject(StatusCode::UNAUTHORIZED))
                .mode(Mode::shadow()),
        ],
    );
    let svc = app_generic(&layer);
    // No key, an unknown plan, a blocked key: all pass (the enforcing limit decides).
    let no_key = Request::get("/").body(String::new()).unwrap();
    assert_eq!(status(&svc, no_key).await.0, StatusCode::OK);
    assert_eq!(status(&svc, get("stolen")).await.0, StatusCode::OK);
    layer
        .set_override("tried", Key::string("abuser"), Override::Block, "t")
        .unwrap();
    assert_eq!(status(&svc, get("abuser")).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_shadow_limit_counting_by_outcome_gives_back_what_does_not_count() {
    // Only failed logins count, tried in shadow: successful logins must not use it up, so that
    // moving it to enforce behaves as the trial said.
    let clock = ManualClock::new();
    let login = |mode: Mode| {
        Limit::new("login", Quota::per_minute(3))
            .algorithm(AlgorithmKind::FixedWindow)
            .key(GlobalKey)
            .charge(Charge::only_when(|s| s == StatusCode::UNAUTHORIZED))
            .mode(mode)
    };
    let layer = layer_with(&clock, vec![login(Mode::Shadow { headers: true })]);
    let svc = app_generic(&layer);
    let post = |status: u16| {
        Request::post("/login")
            .header("x-status", status.to_string())
            .body(String::new())
            .unwrap()
    };
    for _ in 0..5 {
        // Shown in the headers (no enforcing limit applies), and given back each time.
        assert_eq!(
            status(&svc, post(200)).await,
            (StatusCode::OK, Some("2".into()))
        );
    }
    assert_eq!(
        status(&svc, post(401)).await,
        (StatusCode::UNAUTHORIZED, Some("2".into()))
    );
    layer.reload(vec![login(Mode::Enforce)], "enforce").unwrap();
    // One failure counted in shadow: two more failures, then refused.
    assert_eq!(status(&svc, post(401)).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(status(&svc, post(401)).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        status(&svc, post(200)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}
