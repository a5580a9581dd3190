//! Policies from TOML and JSON: the shipped example policy end to end through a layer, and every
//! error naming the file, the limit, the field and the line.
#![cfg(feature = "toml")]

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response, StatusCode};
use tollgate::policy::Policy;
use tollgate::RateLimitLayer;
use tower::util::BoxCloneService;
use tower::{service_fn, ServiceBuilder, ServiceExt};

const EXAMPLE: &str = include_str!("../../examples/plans.toml");

fn request(method: &str, path: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(()).unwrap();
    req.extensions_mut()
        .insert("127.0.0.1:5000".parse::<SocketAddr>().unwrap());
    req
}

/// The service of the example contract: `/login` answers 401 unless `x-password: letmein`.
fn example_service(
) -> BoxCloneService<Request<()>, Response<tollgate::rate_limit::ResponseBody<String>>, Infallible>
{
    let limits = Policy::from_toml_str(EXAMPLE, "examples/plans.toml")
        .unwrap()
        .limits()
        .unwrap();
    let layer = RateLimitLayer::builder().limits(limits).build().unwrap();
    BoxCloneService::new(ServiceBuilder::new().layer(layer).service(service_fn(
        |req: Request<()>| async move {
            let ok = req
                .headers()
                .get("x-password")
                .is_some_and(|p| p == "letmein");
            let status = if req.uri().path() == "/login" && !ok {
                StatusCode::UNAUTHORIZED
            } else {
                StatusCode::OK
            };
            let mut res = Response::new(String::new());
            *res.status_mut() = status;
            Ok::<_, Infallible>(res)
        },
    )))
}

#[tokio::test]
async fn the_example_policy_scopes_keys_and_routes() {
    let svc = example_service();
    let call = |req| svc.clone().oneshot(req);
    // Unknown and missing API keys: 401 problem+json.
    for headers in [&[("x-api-key", "stolen")][..], &[]] {
        let res = call(request("GET", "/api/items", headers)).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
    }
    // A known key is counted by `api`; other routes and methods are not.
    let res = call(request("GET", "/api/items", &[("x-api-key", "free-key-1")]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().contains_key("x-ratelimit-remaining"));
    for (method, path) in [("GET", "/health"), ("POST", "/api/items"), ("GET", "/apix")] {
        let res = call(request(method, path, &[])).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{method} {path}");
        assert!(
            !res.headers().contains_key("x-ratelimit-remaining"),
            "{method} {path}"
        );
    }
    // The shadow limit (10/min on /api/*) never refuses: 30 more API calls by method POST
    // (which `api` does not count) all pass.
    for _ in 0..30 {
        let res = call(request("POST", "/api/items", &[])).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    // Three failed logins, then 429 even with the right password.
    for _ in 0..3 {
        let res = call(request("POST", "/login", &[("x-password", "nope")]))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res = call(request("POST", "/login", &[("x-password", "letmein")]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn the_example_policy_holds_its_contract() {
    let svc = example_service();
    let call = |req| svc.clone().oneshot(req);

    // Free key: 5 then 429 with the upgrade link; pro key: 20 then 429.
    for _ in 0..5 {
        let res = call(request("GET", "/api/items", &[("x-api-key", "free-key-1")]))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    let res = call(request("GET", "/api/items", &[("x-api-key", "free-key-1")]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    for _ in 0..20 {
        let res = call(request("GET", "/api/items", &[("x-api-key", "pro-key-1")]))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    let res = call(request("GET", "/api/items", &[("x-api-key", "pro-key-1")]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // Unknown and missing keys: 401.
    let res = call(request("GET", "/api/items", &[("x-api-key", "stolen")]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = call(request("GET", "/api/items", &[])).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    // The api limit does not apply elsewhere (the global shadow limit never refuses).
    let res = call(request("GET", "/health", &[])).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    // Login: 5 good (free), 3 bad (401), then 429 even with the right password.
    for _ in 0..5 {
        let res = call(request("POST", "/login", &[("x-password", "letmein")]))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    for _ in 0..3 {
        let res = call(request("POST", "/login", &[("x-password", "nope")]))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res = call(request("POST", "/login", &[("x-password", "letmein")]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// The error for `text`, from parsing or compiling.
fn error(text: &str) -> tollgate::policy::PolicyError {
    match Policy::from_toml_str(text, "bad.toml") {
        Err(e) => e,
        Ok(policy) => policy.limits().expect_err("the policy should be refused"),
    }
}

#[test]
fn every_error_names_file_limit_field_and_line() {
    let base = "[[limit]]\nname = \"api\"\nkey = \"peer_ip\"\n";
    // (extra lines after `base`, field, message fragment); the fault is on line 4.
    let cases: &[(&str, &str, &str)] = &[
        ("quota = \"10/mn\"", "quota", "10/mn"),
        ("quota = \"10/s; 20/s\"", "quota", "same period"),
        ("quota = \"10/s burst 50\"\nalgorithm = \"fixed_window\"", "quota", "burst"),
        ("algorithm = \"bucket\"\nquota = \"1/s\"", "algorithm", "bucket"),
        ("quota = \"1/s\"\nroutes = [\"GET /ok\", \"get /x\"]", "routes[1]", "upper case"),
        ("quota = \"1/s\"\nmode = \"dry-run\"", "mode", "shadow"),
        ("quota = \"1/s\"\nshadow_headers = true", "shadow_headers", "shadow"),
        ("quota = \"1/s\"\non_store_error = \"local\"", "on_store_error", "share"),
        ("quota = \"1/s\"\ncharge = { only_status = [200, \"6xx\"] }", "charge.only_status[1]", "6xx"),
        ("quota = \"1/s\"\ncharge = { only_status = [401], refund_status = [500] }", "charge", "either"),
        ("quota = \"1/s\"\non_missing_key = 302", "on_missing_key", "refusal"),
        ("quota = \"1/s\"\ncosts = { \"get /x\" = 2 }", "costs.\"get /x\"", "METHOD"),
        ("quota = \"1/s\"\ncosts = { \"/export\" = 5 }", "costs", "5 units"),
        ("plans.free = \"5/min\"\nplans.pro = \"20/min; 100/h\"\nassign = { k = \"free\" }\non_unknown_plan = 401", "plans.pro", "same windows"),
        ("plans.free = \"5/min\"\nassign = { k = \"gold\" }\non_unknown_plan = 401", "assign.k", "gold"),
        ("plans.free = \"5/min\"\non_unknown_plan = 401", "plans", "nothing chooses"),
        ("plans.free = \"5/min\"\nassign = { k = \"free\" }", "on_unknown_plan", "401"),
        ("plans.free = \"5/min\"\nassign = { k = \"free\" }\non_unknown_plan = \"default\"", "on_unknown_plan", "has none"),
        ("plans.free = \"5/min\"\nplan_header = \"x-plan\"\non_unknown_plan = 401", "quota", "default_plan"),
        ("plans.free = \"5/min\"\nassign = { k = \"free\" }\nplan_header = \"x-plan\"\non_unknown_plan = 401", "plan_header", "one way"),
        ("quota = \"1/s\"\nplans.free = { quota = \"5/min\", link = 3 }", "plans.free", "plan as"),
        ("quota = \"1/s\"\nqouta = \"1/s\"", "qouta", "unknown field"),
    ];
    for (extra, field, fragment) in cases {
        let err = error(&format!("{base}{extra}\n"));
        let text = err.to_string();
        assert_eq!(err.source_name(), "bad.toml", "{text}");
        assert_eq!(err.limit(), Some("api"), "{text}");
        assert_eq!(err.field(), *field, "{text}");
        assert!(err.message().contains(fragment), "{extra:?}: {text}");
        // Line 4 holds the first extra line; a missing field points at its limit (line 2).
        let (line, _) = err
            .line_column()
            .unwrap_or_else(|| panic!("no line: {text}"));
        assert!(line >= 2, "{extra:?}: {text}");
        assert!(text.starts_with(&format!("bad.toml:{line}:")), "{text}");
    }

    // A bad key, a missing one, and a duplicate name.
    let err = error("[[limit]]\nname = \"a\"\nquota = \"1/s\"\nkey = { client_ip = { trusted_proxies = [\"10.0.0.0/33\"] } }\n");
    assert_eq!(err.field(), "key.client_ip.trusted_proxies", "{err}");
    assert_eq!(err.line_column().unwrap().0, 4, "{err}");
    let err = error("[[limit]]\nname = \"a\"\nquota = \"1/s\"\n");
    assert_eq!(err.field(), "key", "{err}");
    let err = error("[[limit]]\nname = \"a\"\nquota = \"1/s\"\nkey = \"ip\"\n");
    assert!(err.message().contains("peer_ip"), "{err}");
    let err = error("[[limit]]\nname = \"a\"\nquota = \"1/s\"\nkey = \"global\"\n[[limit]]\nname = \"a\"\nquota = \"2/s\"\nkey = \"global\"\n");
    assert_eq!((err.limit(), err.field()), (Some("a"), "name"), "{err}");
    assert_eq!(err.line_column().unwrap().0, 6, "{err}");
    // Windows named per period collide with a limit of that name.
    let err = error("[[limit]]\nname = \"a/s\"\nquota = \"1/s\"\nkey = \"global\"\n[[limit]]\nname = \"a\"\nquota = \"2/s; 9/h\"\nkey = \"global\"\n");
    assert!(err.message().contains("\"a/s\""), "{err}");
    // Syntax errors carry the line; no limit or field can be named.
    let err = error("[[limit]]\nname = \"a\nquota = 1\n");
    assert_eq!(err.line_column().unwrap().0, 2, "{err}");
    assert!(err.to_string().starts_with("bad.toml:2:"), "{err}");
    // No limits at all.
    assert_eq!(error("").field(), "limit");
}

#[test]
fn several_windows_make_one_limit_each() {
    let policy = Policy::from_toml_str(
        "[[limit]]\nname = \"api\"\nkey = { header = \"x-api-key\" }\ndefault_plan = \"free\"\nplan_header = \"x-plan\"\nplans.free = \"10/s; 1000/d\"\nplans.pro = \"100/s; 100000/d\"\n",
        "w.toml",
    )
    .unwrap();
    let limits = policy.limits().unwrap();
    let summary: Vec<_> = limits
        .iter()
        .map(|l| {
            let plans: Vec<_> = l
                .plans()
                .iter()
                .map(|p| format!("{}={}", p.name(), p.quota()))
                .collect();
            format!("{} {} [{}]", l.name(), l.quota(), plans.join(" "))
        })
        .collect();
    assert_eq!(
        summary,
        [
            "api/s 10/s [free=10/s pro=100/s]",
            "api/d 1000/d [free=1000/d pro=100000/d]"
        ]
    );
}

#[tokio::test]
async fn json_through_serde_with_routes_costs_and_refunds() {
    let json = r#"{ "limit": [ {
        "name": "export", "quota": "10/min", "key": "global", "algorithm": "sliding_log",
        "routes": ["/export/*"], "cost": 1, "costs": { "POST /export/full": 5 },
        "charge": { "refund_status": ["5xx"] }, "on_store_error": "closed retry 2s"
    } ] }"#;
    let policy: Policy = serde_json::from_str(json).unwrap();
    let policy = policy.with_source_name("policy.json");
    assert_eq!(policy.source_name(), "policy.json");
    let layer = RateLimitLayer::builder()
        .limits(policy.limits().unwrap())
        .build()
        .unwrap();
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|req: Request<()>| async move {
                let mut res = Response::new(String::new());
                if req.uri().path() == "/export/broken" {
                    *res.status_mut() = StatusCode::BAD_GATEWAY;
                }
                Ok::<_, Infallible>(res)
            }));
    let remaining = |res: &Response<_>| {
        res.headers()["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    let res = svc
        .clone()
        .oneshot(request("POST", "/export/full", &[]))
        .await
        .unwrap();
    assert_eq!(remaining(&res), "5");
    // 5xx responses are refunded: the budget is unchanged afterwards.
    let res = svc
        .clone()
        .oneshot(request("GET", "/export/broken", &[]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    let res = svc
        .clone()
        .oneshot(request("GET", "/export/a", &[]))
        .await
        .unwrap();
    assert_eq!(remaining(&res), "4");
    // Outside the routes the limit does not count.
    let res = svc
        .clone()
        .oneshot(request("GET", "/other", &[]))
        .await
        .unwrap();
    assert!(res.headers().get("x-ratelimit-remaining").is_none());

    // JSON errors name the source and limit (no line: serde_json has no spans here).
    let bad: Policy = serde_json::from_str(
        r#"{ "limits": [ { "name": "x", "quota": "1/lightyear", "key": "global" } ] }"#,
    )
    .unwrap();
    let err = bad.with_source_name("policy.json").limits().unwrap_err();
    assert!(
        err.to_string()
            .starts_with("policy.json: limit \"x\": quota: "),
        "{err}"
    );
}

#[tokio::test]
async fn plans_from_the_extension_and_principal_keys() {
    use tollgate::plan::AssignedPlan;
    use tollgate::policy::PrincipalId;
    let policy = Policy::from_toml_str(
        "[[limit]]\nname = \"users\"\nkey = \"principal\"\nquota = \"1/min\"\nplans.pro = \"3/min\"\nplan_extension = true\non_missing_key = \"skip\"\n",
        "ext.toml",
    )
    .unwrap();
    let layer = RateLimitLayer::builder()
        .limits(policy.limits().unwrap())
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let call = |user: &str, plan: Option<&'static str>| {
        let mut req = request("GET", "/", &[]);
        req.extensions_mut().insert(PrincipalId::new(user));
        if let Some(plan) = plan {
            req.extensions_mut().insert(AssignedPlan::new(plan));
        }
        svc.clone().oneshot(req)
    };
    for _ in 0..3 {
        assert_eq!(
            call("ada", Some("pro")).await.unwrap().status(),
            StatusCode::OK
        );
    }
    assert_eq!(
        call("ada", Some("pro")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // No plan: the limit's own quota.
    assert_eq!(call("bob", None).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        call("bob", None).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // No principal: skipped.
    let res = svc.clone().oneshot(request("GET", "/", &[])).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[test]
fn json_errors_name_the_source_and_limit() {
    // serde_json has no spans here: no line, but the source, limit and field.
    let bad: Policy = serde_json::from_str(
        r#"{ "limits": [ { "name": "x", "quota": "1/lightyear", "key": "global" } ] }"#,
    )
    .unwrap();
    let err = bad.with_source_name("policy.json").limits().unwrap_err();
    assert!(
        err.to_string()
            .starts_with("policy.json: limit \"x\": quota: "),
        "{err}"
    );
    assert_eq!(err.line_column(), None);
}
