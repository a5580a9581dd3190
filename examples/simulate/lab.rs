//! `--serve`: the lab page. One HTML page (inline JS, no build step) that asks the server to run
//! a scenario against a limit and shows the lanes (SVG) and the table, computed by the real
//! crate by [`simulate`] exactly as the CLI computes them.

use axum::extract::RawQuery;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;

use super::engine::{Scenario, HEADER};
use super::run::{parse_limit, simulate};

/// The scenarios the page offers (replay reads a file, so it stays on the command line).
pub const PAGE_SCENARIOS: [&str; 4] = ["edge", "burst", "steady", "seam-attack"];

/// The lab's routes: `/` (the page) and `/api/simulate?scenario=..&limit=..` (JSON).
pub fn router() -> Router {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/api/simulate", get(api))
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

async fn api(RawQuery(query): RawQuery) -> Response {
    let mut scenario = "edge".to_owned();
    let mut limit = "5/10s".to_owned();
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match &*k {
            "scenario" => scenario = v.into_owned(),
            "limit" => limit = v.into_owned(),
            _ => {}
        }
    }
    let result = (|| {
        if !PAGE_SCENARIOS.contains(&scenario.as_str()) {
            return Err(format!(
                "unknown scenario {scenario:?}; the page runs {}",
                PAGE_SCENARIOS.join(", ")
            ));
        }
        let scenario = Scenario::parse(&scenario, None)?;
        let quota = parse_limit(&limit)?;
        // Keep one page request to a bounded amount of work.
        if quota.count() > 10_000 {
            return Err("--limit: the page runs counts up to 10,000; use the CLI for more".into());
        }
        let sim = simulate(&scenario, &quota)?;
        let svg = sim.svg(&quota)?;
        Ok(json!({
            "title": sim.title,
            "header": HEADER,
            "rows": sim.rows,
            "svg": svg,
        }))
    })();
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
  table { border-collapse: collapse; margin: 1em 0; }
  th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
  td.no { color: #b00; font-weight: bold; }
  #error { color: #b00; }
  label { margin-right: 1em; }
</style>
</head>
<body>
<h1>One request stream, six limiters</h1>
<p>Every decision below is made by tollgate's real algorithms (the in-memory store, on a manual
clock) on the server. Pick traffic and a limit such as <code>5/10s</code>,
<code>100/min</code> or <code>10/s burst 20</code> (the burst applies to the buckets).</p>
<form id="form">
  <label>scenario
    <select id="scenario">
      <option value="edge">edge</option>
      <option value="burst">burst</option>
      <option value="steady">steady</option>
      <option value="seam-attack">seam-attack</option>
    </select>
  </label>
  <label>limit <input id="limit" value="5/10s" size="16"></label>
  <button id="go" type="submit">run</button>
</form>
<p id="error"></p>
<h2 id="title"></h2>
<table id="table"><thead></thead><tbody></tbody></table>
<div id="picture"></div>
<script>
let generation = 0;
async function run() {
  const scenario = document.getElementById("scenario").value;
  const limit = document.getElementById("limit").value;
  const mine = ++generation;
  document.body.dataset.rendered = "";
  const url = "/api/simulate?scenario=" + encodeURIComponent(scenario) +
    "&limit=" + encodeURIComponent(limit);
  let data;
  try {
    const response = await fetch(url);
    data = await response.json();
  } catch (e) {
    data = { error: String(e) };
  }
  if (mine !== generation) return;
  const error = document.getElementById("error");
  error.textContent = data.error || "";
  if (!data.error) {
    document.getElementById("title").textContent = data.title;
    const head = document.querySelector("#table thead");
    const body = document.querySelector("#table tbody");
    head.replaceChildren(row("th", data.header));
    body.replaceChildren(...data.rows.map(r => row("td", r)));
    document.getElementById("picture").innerHTML = data.svg;
  }
  document.body.dataset.rendered = scenario + "|" + limit + (data.error ? "|error" : "");
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
// Handlers are attached here, not inline: inside a form, an inline handler would resolve `run`
// to the form's control of that id before the global function.
document.getElementById("form").addEventListener("submit", e => { e.preventDefault(); run(); });
document.getElementById("scenario").addEventListener("change", run);
document.getElementById("limit").addEventListener("change", run);
run();
</script>
</body>
</html>
"##;
