//! `--serve`: the lab page. One HTML page (inline JS, no build step) that asks the server to run
//! a scenario, or a pasted request log, against a limit and shows the lanes (SVG), what to look
//! for, the table and what each algorithm promises, computed by the real crate with
//! the same functions the CLI uses.

use axum::body::Body;
use axum::extract::RawQuery;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use super::engine::{decide_memory, Scenario, HEADER};
use super::run::{finish, parse_limit};

/// The scenarios the page offers by name (a log is pasted instead: [`router`]'s `/api/replay`).
pub const PAGE_SCENARIOS: [&str; 4] = ["edge", "burst", "steady", "seam-attack"];

/// The largest pasted log the page takes, in bytes.
pub const MAX_LOG_BYTES: usize = 1 << 20;

/// The most requests a pasted log may hold.
pub const MAX_LOG_REQUESTS: usize = 50_000;

/// The lab's routes: `/` (the page), `/api/simulate?scenario=..&limit=..` and
/// `POST /api/replay?limit=..` with a request log as the body (JSON answers; a bad input is a
/// 400 whose `error` says what is wrong).
pub fn router() -> Router {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/api/simulate", get(api))
        .route("/api/replay", post(replay))
}

/// Serves the lab on `127.0.0.1:port` until the process ends.
pub async fn serve(port: u16) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "lab page on http://{}/ (Ctrl-C to stop)",
        listener.local_addr()?
    );
    axum::serve(listener, router()).await
}

/// The query's `scenario` and `limit` (defaults: edge, 5/10s).
fn query_params(query: Option<String>) -> (String, String) {
    let mut scenario = "edge".to_owned();
    let mut limit = "5/10s".to_owned();
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match &*k {
            "scenario" => scenario = v.into_owned(),
            "limit" => limit = v.into_owned(),
            _ => {}
        }
    }
    (scenario, limit)
}

async fn api(RawQuery(query): RawQuery) -> Response {
    let (scenario, limit) = query_params(query);
    if !PAGE_SCENARIOS.contains(&scenario.as_str()) {
        return answer(Err(format!(
            "unknown scenario {scenario:?}; the page runs {}, or a log pasted below",
            PAGE_SCENARIOS.join(", ")
        )));
    }
    run(Scenario::parse(&scenario, None), limit).await
}

async fn replay(RawQuery(query): RawQuery, body: Body) -> Response {
    let (_, limit) = query_params(query);
    let log = match axum::body::to_bytes(body, MAX_LOG_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return answer(Err(format!(
                "the log is larger than {} KiB; replay it from the command line: \
                 simulate --scenario replay FILE",
                MAX_LOG_BYTES / 1024
            )))
        }
    };
    let log = match String::from_utf8(log.to_vec()) {
        Ok(text) => text,
        Err(_) => return answer(Err("the log is not UTF-8 text".to_owned())),
    };
    run(Ok(Scenario::Pasted(log)), limit).await
}

/// Runs one simulation off the async threads: the table, the picture and the words around them.
async fn run(scenario: Result<Scenario, String>, limit: String) -> Response {
    let work = move || {
        let scenario = scenario?;
        // The CLI's messages name its flag; the page's field is "limit".
        let quota = parse_limit(&limit).map_err(|e| e.replacen("--limit: ", "limit: ", 1))?;
        // Keep one page request to a bounded amount of work.
        if quota.count() > 10_000 {
            return Err("limit: the page runs counts up to 10,000; use the CLI for more".into());
        }
        let stream = scenario.stream(&quota)?;
        if matches!(scenario, Scenario::Pasted(_)) && stream.requests.len() > MAX_LOG_REQUESTS {
            return Err(format!(
                "the pasted log has {} requests; the page plots up to {MAX_LOG_REQUESTS} (the \
                 command line takes any number: simulate --scenario replay FILE)",
                stream.requests.len()
            ));
        }
        let decisions = decide_memory(&stream, &quota)?;
        let sim = finish(&scenario, &quota, stream, decisions);
        let svg = sim.svg(&quota)?;
        Ok(json!({
            "title": sim.title,
            "caption": sim.caption,
            "header": HEADER,
            "rows": sim.rows,
            "note": sim.note,
            "promises": sim.promises,
            "same": sim.same,
            "svg": svg,
        }))
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => answer(result),
        // A bug, not a bad input: say so rather than drop the connection.
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "application/json")],
            json!({ "error": format!("the simulation failed: {e}") }).to_string(),
        )
            .into_response(),
    }
}

fn answer(result: Result<Value, String>) -> Response {
    let (status, body) = match result {
        Ok(body) => (StatusCode::OK, body),
        Err(error) => (StatusCode::BAD_REQUEST, json!({ "error": error })),
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

const PAGE: &str = r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tollgate lab: one request stream, six limiters</title>
<style>
  body { font-family: sans-serif; margin: 1.5em; max-width: 1150px; }
  table { border-collapse: collapse; margin: 1em 0 0.3em; }
  th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
  td.no { color: #b00; font-weight: bold; }
  #error { color: #b00; font-weight: bold; }
  #caption { background: #f4f7fb; border-left: 4px solid #36c; padding: 0.5em 0.8em; }
  #legend ul { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 0.4em 1.6em; }
  #legend svg { vertical-align: middle; margin-right: 0.3em; }
  #note { color: #555; font-size: 90%; margin-top: 0; }
  label { margin-right: 1em; }
  textarea { width: 100%; max-width: 40em; font-family: monospace; }
</style>
</head>
<body>
<h1>One request stream, six limiters</h1>
<p>Every decision below is made by tollgate's real algorithms (the in-memory store, on a manual
clock) on the server. Pick traffic and a limit such as <code>5/10s</code>,
<code>100/min</code> or <code>10/s burst 20</code> (the burst applies to the buckets), or paste
your own request log.</p>
<form id="form">
  <label>scenario
    <select id="scenario">
      <option value="edge">edge: bursts on both sides of a window seam</option>
      <option value="burst">burst: a burst, then twice the rate</option>
      <option value="steady">steady: random arrivals below, at and above the rate</option>
      <option value="seam-attack">seam-attack: bursts timed at every seam</option>
    </select>
  </label>
  <label>limit <input id="limit" value="5/10s" size="16"></label>
  <button id="go" type="submit">run</button>
</form>
<details id="replay-box">
  <summary>Replay your own request log</summary>
  <p>One request per line: <code>SECONDS [KEY [COST]]</code>, fields split by spaces, tabs or
  commas; <code>#</code> starts a comment. Times are decimal seconds (epoch seconds work); the
  key defaults to one client and the cost to 1. The format is the one
  <code>simulate --scenario replay FILE</code> reads. The limit above applies.</p>
  <textarea id="log" rows="8" placeholder="9.4 script&#10;9.5 script&#10;12.9 person 2"></textarea>
  <p><button id="replay" type="button">plot this log</button></p>
</details>
<p id="error" role="alert"></p>
<h2 id="title"></h2>
<p id="caption"></p>
<section id="legend">
  <h3>How to read the picture</h3>
  <p>One lane per algorithm, all fed the same requests; time runs left to right over the span
  of the traffic.</p>
  <ul>
    <li><svg width="14" height="14"><circle cx="7" cy="7" r="4" fill="#0f0"/></svg>a dot: a
      request the algorithm admitted</li>
    <li><svg width="14" height="14"><path d="M3 3L11 11M11 3L3 11" stroke="#f00"/></svg>a
      cross: a request it refused</li>
    <li><svg width="24" height="14"><path d="M0 7H24" stroke="#00f" stroke-width="2"/></svg>the
      blue line: how much it admitted in the last period (one window of the limit), at every
      moment</li>
    <li><svg width="24" height="14"><path d="M0 7H24" stroke="#000"/></svg>the black line: the
      limit's count</li>
    <li><svg width="24" height="14"><path d="M0 7H24" stroke="#e67800"
      stroke-dasharray="6 4"/></svg>the dashed orange line: the most the algorithm promises to
      admit in any one period (drawn when it is above the limit; see "What each algorithm
      promises")</li>
    <li><svg width="24" height="14"><rect width="24" height="14" fill="#ffdc78"
      fill-opacity="0.35"/></svg>the shaded band: the period in which it admitted the most</li>
  </ul>
  <p>Requests sent at the same instant draw one mark on top of another (a dot under a cross
  when some were admitted and some refused); the blue line's step at that instant says how many
  were admitted. The vertical axis counts admitted requests in the last period.</p>
</section>
<div id="picture"></div>
<table id="table"><thead></thead><tbody></tbody></table>
<p id="note"></p>
<section id="promises-box">
  <h3>What each algorithm promises</h3>
  <ul id="promises"></ul>
</section>
<section id="same-box">
  <h3>Lanes that decided alike</h3>
  <ul id="same"></ul>
</section>
<script>
let generation = 0;
async function show(what, request) {
  const mine = ++generation;
  document.body.dataset.rendered = "";
  let data;
  try {
    const response = await request();
    data = await response.json();
  } catch (e) {
    data = { error: "the server did not answer: " + e };
  }
  if (mine !== generation) return;
  document.getElementById("error").textContent = data.error || "";
  if (!data.error) {
    document.getElementById("title").textContent = data.title;
    document.getElementById("caption").textContent = data.caption;
    const head = document.querySelector("#table thead");
    const body = document.querySelector("#table tbody");
    head.replaceChildren(row("th", data.header));
    body.replaceChildren(...data.rows.map(r => row("td", r)));
    document.getElementById("note").textContent = data.note;
    document.getElementById("promises").replaceChildren(...data.promises.map(item));
    const same = data.same.length ? data.same : ["Every algorithm decided differently here."];
    document.getElementById("same").replaceChildren(...same.map(item));
    document.getElementById("picture").innerHTML = data.svg;
  }
  document.body.dataset.rendered = what + (data.error ? "|error" : "");
}
function limit() { return document.getElementById("limit").value; }
// What a new limit redraws: the scenario, or the pasted log once it has been plotted.
let again = run;
function run() {
  again = run;
  const scenario = document.getElementById("scenario").value;
  return show(scenario + "|" + limit(), () => fetch("/api/simulate?scenario=" +
    encodeURIComponent(scenario) + "&limit=" + encodeURIComponent(limit())));
}
function replay() {
  again = replay;
  const log = document.getElementById("log").value;
  return show("replay|" + limit(), () => fetch("/api/replay?limit=" +
    encodeURIComponent(limit()), { method: "POST", body: log,
    headers: { "content-type": "text/plain; charset=utf-8" } }));
}
function row(tag, cells) {
  const tr = document.createElement("tr");
  for (const text of cells) {
    const cell = document.createElement(tag);
    cell.textContent = text;
    if (text === "NO") cell.className = "no";
    tr.appendChild(cell);
  }
  return tr;
}
function item(text) {
  const li = document.createElement("li");
  li.textContent = text;
  return li;
}
// Handlers are attached here, not inline: inside a form, an inline handler would resolve `run`
// to the form's control of that id before the global function.
document.getElementById("form").addEventListener("submit", e => { e.preventDefault(); run(); });
document.getElementById("scenario").addEventListener("change", run);
document.getElementById("limit").addEventListener("change", () => again());
document.getElementById("replay").addEventListener("click", replay);
run();
</script>
</body>
</html>
"##;
