//! The simulator's lab page (`cargo run --example simulate -- --serve`): its JSON API through a
//! real server and client and through `oneshot`, and the page itself in headless Chromium,
//! driven over WebDriver (chromedriver, plain HTTP with reqwest): the page loads with its legend,
//! a caption and the promises explained, changing the scenario or the limit redraws, a pasted
//! log is plotted (a malformed one says which line is wrong), and the table shows exactly the
//! rows the CLI prints for the same inputs. Every HTTP call has a timeout, so a hung server
//! fails the test instead of stalling it. The browser test skips, saying so, when Chromium or
//! chromedriver is missing (`.ci/run` installs them).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::sim::engine::Scenario;
use crate::sim::lab;
use crate::sim::run::{parse_limit, simulate};
use serde_json::{json, Value};
use tower::ServiceExt;

/// The sample log of the guide, as `--scenario replay` reads it.
const REPLAY_EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/docs/simulator/replay-example.log"
);

/// The longest any one HTTP exchange of these tests may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(60);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(HTTP_TIMEOUT)
        .build()
        .unwrap()
}

/// The rows the CLI prints for `scenario` at `limit`.
fn cli_rows(scenario: &str, limit: &str) -> Vec<Vec<String>> {
    let quota = parse_limit(limit).unwrap();
    let file = (scenario == "replay").then_some(REPLAY_EXAMPLE);
    let sim = simulate(&Scenario::parse(scenario, file).unwrap(), &quota).unwrap();
    sim.rows.iter().map(|r| r.to_vec()).collect()
}

fn json_rows(value: &Value) -> Vec<Vec<String>> {
    value
        .as_array()
        .expect("rows are an array")
        .iter()
        .map(|row| {
            row.as_array()
                .expect("a row is an array")
                .iter()
                .map(|c| c.as_str().expect("cells are text").to_owned())
                .collect()
        })
        .collect()
}

async fn serve_lab() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, lab::router()).await.unwrap() });
    addr
}

#[tokio::test]
async fn api_answers_the_cli_table_and_picture_over_http() {
    let addr = serve_lab().await;
    let client = client();
    let page = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page
        .text()
        .await
        .unwrap()
        .contains(r#"<select id="scenario""#));

    for (scenario, limit) in [("edge", "5/10s"), ("seam-attack", "10/s burst 20")] {
        let body: Value = client
            .get(format!("http://{addr}/api/simulate"))
            .query(&[("scenario", scenario), ("limit", limit)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(json_rows(&body["rows"]), cli_rows(scenario, limit));
        let svg = body["svg"].as_str().unwrap();
        assert!(svg.starts_with("<svg"), "{svg:.80}");
        assert!(svg.contains("fixed_window: admitted"));
        assert!(svg.contains("admitted request") && svg.contains("refused request"));
        assert!(body["caption"].as_str().unwrap().contains("Look for:"));
        assert_eq!(body["promises"].as_array().unwrap().len(), 6, "{body}");
    }

    // Every scenario the page offers has its own caption saying what to look for.
    let mut captions = Vec::new();
    for scenario in lab::PAGE_SCENARIOS {
        let body: Value = client
            .get(format!("http://{addr}/api/simulate"))
            .query(&[("scenario", scenario), ("limit", "5/10s")])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let caption = body["caption"].as_str().unwrap().to_owned();
        assert!(
            caption.starts_with("Traffic: ") && caption.contains("Look for: "),
            "{scenario}: {caption}"
        );
        assert!(!captions.contains(&caption), "{scenario}: {caption}");
        captions.push(caption);
    }

    for (query, says) in [
        ("scenario=edge&limit=ten%20per%20second", "cannot parse"),
        ("scenario=replay&limit=5/10s", "the page runs edge"),
        ("scenario=edge&limit=100000/s", "up to 10,000"),
    ] {
        let response = client
            .get(format!("http://{addr}/api/simulate?{query}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{query}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].as_str().unwrap().contains(says), "{body}");
    }
}

/// A pasted log is decided exactly as `--scenario replay FILE` decides the file; a bad one gets
/// a 400 that says what is wrong, whatever the bytes.
#[tokio::test]
async fn api_replays_a_pasted_log() {
    let addr = serve_lab().await;
    let client = client();
    let replay = |body: Vec<u8>, limit: &str| {
        client
            .post(format!("http://{addr}/api/replay"))
            .query(&[("limit", limit)])
            .body(body)
            .send()
    };
    let log = std::fs::read(REPLAY_EXAMPLE).unwrap();
    for limit in ["5/10s", "3/s burst 6"] {
        let response = replay(log.clone(), limit).await.unwrap();
        assert_eq!(response.status(), 200, "{limit}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(json_rows(&body["rows"]), cli_rows("replay", limit));
        assert!(body["title"]
            .as_str()
            .unwrap()
            .starts_with("scenario replay"));
        let caption = body["caption"].as_str().unwrap();
        assert!(caption.contains("44 requests from 2 keys"), "{caption}");
    }

    let many = "1 a\n".repeat(lab::MAX_LOG_REQUESTS + 1);
    let huge = "1 a\n".repeat(lab::MAX_LOG_BYTES / 4 + 1);
    for (body, says) in [
        (
            b"9.4 script\nnine script\n".to_vec(),
            "line 2: the first field",
        ),
        (b"1 a\n2 a -3\n".to_vec(), "line 2: the cost"),
        (b"1 a 99999999999\n".to_vec(), "up to 1000000000"),
        (b"99999999999999 a\n".to_vec(), "at most 10^11"),
        (b"18446744073709.551615\n".to_vec(), "at most 10^11"),
        (b"# only a comment\n\n".to_vec(), "no requests"),
        (b"".to_vec(), "no requests"),
        (vec![b'1', b' ', 0xff, 0xfe], "not UTF-8"),
        (many.into_bytes(), "plots up to 50000"),
        (huge.into_bytes(), "larger than 1024 KiB"),
    ] {
        let shown = String::from_utf8_lossy(&body[..body.len().min(40)]).into_owned();
        let response = replay(body, "5/10s").await.unwrap();
        assert_eq!(response.status(), 400, "{shown:?}");
        let answer: Value = response.json().await.unwrap();
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains(says), "{shown:?}: {error}");
    }
    let response = replay(log, "ten per second").await.unwrap();
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn api_through_oneshot() {
    let request = http::Request::get("/api/simulate?scenario=burst&limit=5%2F10s")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = lab::router().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "the page reads JSON"
    );
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(json_rows(&body["rows"]), cli_rows("burst", "5/10s"));
}

/// An executable on PATH.
fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// chromedriver, killed (with the browser session it holds) when dropped.
struct Driver {
    child: Child,
    base: String,
    session: Option<String>,
    client: reqwest::Client,
    profile: PathBuf,
}

impl Driver {
    async fn start(driver: PathBuf) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = std::env::temp_dir().join(format!(
            "tollgate-lab-chromium-{}-{port}",
            std::process::id()
        ));
        let driver = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            session: None,
            client: client(),
            profile,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = driver
                .client
                .get(format!("{}/status", driver.base))
                .send()
                .await
                && let Ok(v) = r.json::<Value>().await
                && v["value"]["ready"] == json!(true)
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        driver
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let mut request = self.client.request(method, url);
        if !body.is_null() {
            request = request.json(&body);
        }
        let response: Value = request.send().await.unwrap().json().await.unwrap();
        assert!(
            response["value"]["error"].is_null(),
            "WebDriver {path}: {response}"
        );
        response["value"].clone()
    }

    async fn open(&mut self, browser: &std::path::Path) {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": browser,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage",
                    format!("--user-data-dir={}", self.profile.display()),
                ],
            },
        }}});
        let value = self.call(reqwest::Method::POST, "/session", caps).await;
        self.session = Some(value["sessionId"].as_str().unwrap().to_owned());
    }

    fn path(&self, tail: &str) -> String {
        format!("/session/{}{tail}", self.session.as_ref().unwrap())
    }

    async fn go(&self, url: &str) {
        self.call(
            reqwest::Method::POST,
            &self.path("/url"),
            json!({ "url": url }),
        )
        .await;
    }

    async fn script(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            &self.path("/execute/sync"),
            json!({ "script": script, "args": [] }),
        )
        .await
    }

    async fn element(&self, css: &str) -> String {
        let v = self
            .call(
                reqwest::Method::POST,
                &self.path("/element"),
                json!({ "using": "css selector", "value": css }),
            )
            .await;
        v["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css:?}: {v}"))
            .to_owned()
    }

    async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.call(
            reqwest::Method::POST,
            &self.path(&format!("/element/{id}/click")),
            json!({}),
        )
        .await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.call(
            reqwest::Method::POST,
            &self.path(&format!("/element/{id}/clear")),
            json!({}),
        )
        .await;
        self.call(
            reqwest::Method::POST,
            &self.path(&format!("/element/{id}/value")),
            json!({ "text": text }),
        )
        .await;
    }

    /// Waits until the page says it rendered `what` (a hang guard, not a timing assertion).
    async fn rendered(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = self
                .script("return document.body.dataset.rendered || ''")
                .await;
            if now == json!(what) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the page never rendered {what:?} (last: {now})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of the first element matching `css`, its runs of white space made one space.
    async fn text(&self, css: &str) -> String {
        let v = self
            .script(&format!(
                "return document.querySelector({}).textContent.replace(/\\s+/g, ' ').trim()",
                json!(css)
            ))
            .await;
        v.as_str()
            .unwrap_or_else(|| panic!("no text in {css:?}: {v}"))
            .to_owned()
    }

    async fn table(&self) -> Vec<Vec<String>> {
        json_rows(
            &self
                .script(
                    "return [...document.querySelectorAll('#table tbody tr')]\
                     .map(tr => [...tr.children].map(td => td.textContent))",
                )
                .await,
        )
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(session) = &self.session {
            // Closes the browser; chromedriver is killed below either way.
            let url = format!("{}/session/{session}", self.base);
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), client().delete(url).send())
                            .await;
                });
            })
            .join();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_page_in_headless_chromium() {
    let browser = find(&["chromium", "chromium-browser", "google-chrome"]);
    let driver = find(&["chromedriver"]);
    let (Some(browser), Some(driver)) = (browser, driver) else {
        eprintln!(
            "SKIPPED lab_page_in_headless_chromium: chromium and chromedriver are not both on \
             PATH; install them with `apt-get install -y chromium chromium-driver` (.ci/run does)"
        );
        return;
    };
    let addr = serve_lab().await;
    let mut wd = Driver::start(driver).await;
    wd.open(&browser).await;

    // The page loads and draws the default: edge traffic at 5 per 10 s.
    wd.go(&format!("http://{addr}/")).await;
    wd.rendered("edge|5/10s").await;
    assert_eq!(wd.table().await, cli_rows("edge", "5/10s"));
    let picture = wd
        .script("return document.querySelector('#picture svg') ? document.querySelector('#picture').textContent : null")
        .await;
    let picture = picture.as_str().expect("an SVG is drawn");
    assert!(
        picture.contains("fixed_window: admitted 15 of 20") && picture.contains("10 within 1.8 s"),
        "{picture}"
    );
    assert!(
        picture.contains("gcra, the same decisions as token_bucket"),
        "{picture}"
    );

    // The legend names every mark, the caption says what to look for, and every algorithm's
    // promise is explained with the limit's numbers.
    let legend = wd.text("#legend").await;
    for mark in [
        "a dot",
        "a cross",
        "the blue line",
        "the black line",
        "dashed",
        "shaded",
    ] {
        assert!(
            legend.contains(mark),
            "the legend explains {mark:?}: {legend}"
        );
    }
    let caption = wd.text("#caption").await;
    assert!(
        caption.starts_with("Traffic: 5 requests") && caption.contains("Look for:"),
        "{caption}"
    );
    let promises = wd.text("#promises").await;
    assert!(
        promises.contains("token_bucket: at most burst + rate × t")
            && promises.contains("5 + 0.5/s × 10 s = 10 in 10 s")
            && promises.contains("sliding_log: at most 5 in any 10 s"),
        "{promises}"
    );
    let same = wd.text("#same").await;
    assert!(
        same.contains("gcra decided all 20 requests exactly as token_bucket did")
            && same.contains("the same limit expressed two ways"),
        "{same}"
    );

    // Changing the scenario redraws.
    wd.click("#scenario option[value='burst']").await;
    wd.rendered("burst|5/10s").await;
    assert_eq!(wd.table().await, cli_rows("burst", "5/10s"));
    let title = wd
        .script("return document.getElementById('title').textContent")
        .await;
    assert!(
        title.as_str().unwrap().starts_with("scenario burst"),
        "{title}"
    );
    let caption = wd.text("#caption").await;
    assert!(
        caption.starts_with("Traffic: 10 requests at once"),
        "{caption}"
    );

    // So does a new limit (Enter submits the form).
    wd.type_into("#limit", "100/min\u{E007}").await;
    wd.rendered("burst|100/min").await;
    assert_eq!(wd.table().await, cli_rows("burst", "100/min"));

    // A bad limit says what is wrong.
    wd.type_into("#limit", "ten per second\u{E007}").await;
    wd.rendered("burst|ten per second|error").await;
    let error = wd
        .script("return document.getElementById('error').textContent")
        .await;
    assert!(error.as_str().unwrap().contains("cannot parse"), "{error}");

    // A pasted log is plotted at the limit in the field, as the CLI replays the file.
    wd.type_into("#limit", "5/10s").await;
    wd.click("#replay-box summary").await;
    let log = std::fs::read_to_string(REPLAY_EXAMPLE).unwrap();
    wd.type_into("#log", &log).await;
    wd.click("#replay").await;
    wd.rendered("replay|5/10s").await;
    assert_eq!(wd.table().await, cli_rows("replay", "5/10s"));
    assert_eq!(wd.text("#error").await, "");
    let caption = wd.text("#caption").await;
    assert!(
        caption.contains("your log, 44 requests from 2 keys"),
        "{caption}"
    );

    // A malformed one says which line is wrong.
    wd.type_into("#log", "9.4 script\nnine script\n").await;
    wd.click("#replay").await;
    wd.rendered("replay|5/10s|error").await;
    let error = wd.text("#error").await;
    assert!(
        error.contains("line 2: the first field must be a time"),
        "{error}"
    );
}
