//! The contract of `examples/plans` (issue 8), through its app served on 127.0.0.1 and a real
//! HTTP client: plans per API key, unknown keys refused, failed logins counted, a shadow limit,
//! `/metrics` in Prometheus text (parsed line by line), a reload that keeps what a key spent, and
//! a broken policy file refused while the old policy keeps serving.

#[path = "../../examples/plans/app.rs"]
#[allow(dead_code)]
mod app;

use std::collections::HashMap;
use std::path::PathBuf;

use metrics_exporter_prometheus::PrometheusBuilder;
use reqwest::StatusCode;

struct TempPolicy(PathBuf);

impl TempPolicy {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!(
            "tollgate-plans-{}-{}.toml",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plans.toml");
        std::fs::copy(shipped, &path).unwrap();
        Self(path)
    }

    fn edit(&self, f: impl FnOnce(String) -> String) {
        let text = std::fs::read_to_string(&self.0).unwrap();
        std::fs::write(&self.0, f(text)).unwrap();
    }
}

impl Drop for TempPolicy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `name{labels} value` lines of a Prometheus text page, by `name{labels}`.
fn parse_prometheus(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample line has a value");
        out.insert(series.to_owned(), value.parse::<f64>().expect("a number"));
    }
    out
}

/// The sample of `name` whose labels include every one of `labels`.
fn sample(samples: &HashMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(series, _)| {
            series.starts_with(&format!("{name}{{"))
                && labels
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| *v)
}

#[tokio::test]
async fn the_plans_example_contract_holds_through_a_real_server() {
    let policy = TempPolicy::new();
    let metrics = PrometheusBuilder::new().install_recorder().unwrap();
    let layer = app::layer(&policy.0).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(app::serve(listener, app::router(layer.clone(), metrics)));
    let client = reqwest::Client::new();
    let items = |key: Option<&str>| {
        let req = client.get(format!("{base}/api/items"));
        match key {
            Some(k) => req.header("x-api-key", k),
            None => req,
        }
    };
    let login = |password: &str| {
        client
            .post(format!("{base}/login"))
            .header("x-password", password)
    };
    let statuses = |n: usize, key: &'static str| {
        let items = &items;
        async move {
            let mut out = Vec::new();
            for _ in 0..n {
                out.push(items(Some(key)).send().await.unwrap().status().as_u16());
            }
            out
        }
    };

    // free: 5 per minute, then 429 with the reset time and the upgrade link.
    assert_eq!(statuses(5, "free-key-1").await, [200; 5]);
    let res = items(Some("free-key-1")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let retry_after: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["plan"], "free");
    assert_eq!(body["link"], "https://example.com/upgrade");
    assert_eq!(body["limit"], 5);
    let reset = body["reset"].as_str().unwrap();
    assert!(
        reset.len() == 20 && reset.ends_with('Z') && reset.as_bytes()[10] == b'T',
        "{reset}"
    );
    let reset_seconds = body["reset_seconds"].as_u64().unwrap();
    assert!((1..=60).contains(&reset_seconds), "{body}");
    assert!((1..=60).contains(&retry_after));

    // pro: 20 per minute.
    assert_eq!(statuses(20, "pro-key-1").await, [200; 20]);
    assert_eq!(statuses(1, "pro-key-1").await, [429]);

    // Unknown or missing key: 401 problem+json.
    for key in [Some("stolen-key"), None] {
        let res = items(key).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{key:?}");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
    }

    // Login: 5 correct (free), 3 wrong (counted), then 429 even for the right password.
    for _ in 0..5 {
        assert_eq!(
            login("letmein").send().await.unwrap().status(),
            StatusCode::OK
        );
    }
    for _ in 0..3 {
        assert_eq!(
            login("nope").send().await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        login("letmein").send().await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // 29 API requests so far: the 10-per-minute shadow limit would have refused 19, refused
    // none, and /metrics says so, next to the free plan's rejection.
    let page = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let samples = parse_prometheus(&page);
    let shadow = sample(
        &samples,
        "tollgate_decisions_total",
        &[("limit", "global-shadow"), ("outcome", "shadow_rejected")],
    );
    assert!(shadow.unwrap_or(0.0) > 0.0, "{page}");
    let free_rejected = sample(
        &samples,
        "tollgate_decisions_total",
        &[("limit", "api"), ("plan", "free"), ("outcome", "rejected")],
    );
    assert_eq!(free_rejected, Some(1.0), "{page}");
    assert_eq!(
        sample(
            &samples,
            "tollgate_decisions_total",
            &[("limit", "api"), ("plan", "pro"), ("outcome", "allowed")]
        ),
        Some(20.0)
    );

    // Raise free to 10 per minute: the exhausted free key keeps what it spent (5 more, not 10).
    policy.edit(|t| t.replace("quota = \"5/min\"", "quota = \"10/min\""));
    assert!(app::reload(&layer, &policy.0, "test"));
    assert_eq!(statuses(5, "free-key-1").await, [200; 5]);
    assert_eq!(statuses(3, "free-key-1").await, [429; 3]);

    // A broken file is refused; the old policy keeps serving (pro still exhausted, logins still
    // counted, unknown keys still refused).
    policy.edit(|t| t + "\nthis is [[ broken\n");
    assert!(!app::reload(&layer, &policy.0, "test"));
    assert_eq!(statuses(1, "pro-key-1").await, [429]);
    assert_eq!(
        items(Some("stolen-key")).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        login("letmein").send().await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}
