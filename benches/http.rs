//! Requests per second of an axum hello-world over real HTTP on 127.0.0.1, side by side in one
//! run: the plain app, the app behind tollgate's layer (the quickstart's per-client-IP token
//! bucket, X-RateLimit headers on every response), and behind tower_governor's layer (per peer
//! IP, `use_headers()`) for reference.
//!
//! Each server is this bench's own executable started again as a child process (one tokio
//! current-thread runtime, pinned to core 0 with `taskset`); the load comes from `wrk` (one
//! thread, pinned to core 1) over loopback. The servers take turns: every round runs each of them
//! once, and the figures are medians over the rounds. The limits are generous enough never to
//! refuse (the bench checks wrk saw no non-2xx response), so every request takes the allowed
//! path, which is what most requests take in production.
//!
//! ```text
//! cargo bench --bench http
//! BENCH_ROUNDS=7 BENCH_SECS=8 BENCH_CONNECTIONS=64 cargo bench --bench http
//! ```

#[path = "common/report.rs"]
mod report;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tollgate::key::PeerIp;
use tollgate::{Limit, Quota, RateLimitLayer};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

const SERVE_ENV: &str = "TOLLGATE_HTTP_BENCH_SERVE";
const PLAIN: &str = "plain";
const TOLLGATE: &str = "tollgate";
const GOVERNOR: &str = "tower_governor";
const SERVERS: [&str; 3] = [PLAIN, TOLLGATE, GOVERNOR];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn app() -> Router {
    Router::new().route("/", get(|| async { "Hello, world!\n" }))
}

/// The child: serves `which` on `port` until killed.
fn serve(which: &str, port: u16) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let app = match which {
            PLAIN => app(),
            // The quickstart's layer, keyed per client IP, with a quota no load here reaches.
            TOLLGATE => app().layer(
                RateLimitLayer::new(
                    Limit::new("per-ip", Quota::per_second(100_000_000).burst(100_000_000))
                        .key(PeerIp::new()),
                )
                .expect("a valid limit"),
            ),
            GOVERNOR => {
                let config = GovernorConfigBuilder::default()
                    .period(Duration::from_nanos(10))
                    .burst_size(100_000_000)
                    .use_headers()
                    .finish()
                    .expect("valid tower_governor configuration");
                app().layer(GovernorLayer {
                    config: Arc::new(config),
                })
            }
            other => panic!("unknown server {other}"),
        };
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the bench port");
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
}

/// A server child process, killed when dropped.
struct Server {
    name: &'static str,
    port: u16,
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn have(binary: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {binary}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `cmd` pinned to `core` with taskset when there is one to pin to.
fn pinned(program: &str, core: Option<usize>) -> Command {
    match core {
        Some(core) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &core.to_string(), program]);
            c
        }
        None => Command::new(program),
    }
}

fn start(name: &'static str, core: Option<usize>) -> Server {
    let exe = std::env::current_exe().expect("this bench's path");
    let port = free_port();
    let child = pinned(exe.to_str().expect("a UTF-8 path"), core)
        .env(SERVE_ENV, format!("{name}:{port}"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start a server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{name} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server { name, port, child }
}

/// One raw HTTP/1.1 GET; returns the response head (status line and headers), lower-cased.
fn head(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// What one wrk run measured.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    rps: f64,
    /// The server's CPU time per request (user + system, from /proc), µs.
    cpu_us: f64,
    p50_us: f64,
    p99_us: f64,
    non_2xx: u64,
}

/// A wrk duration ("312.00us", "1.20ms", "2.00s") in µs.
fn micros(s: &str) -> Option<f64> {
    let (num, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * scale)
}

fn parse_wrk(text: &str) -> Option<Run> {
    let mut run = Run::default();
    let mut rps = None;
    for line in text.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("Requests/sec:"), Some(v)) => rps = v.parse().ok(),
            (Some("50%"), Some(v)) => run.p50_us = micros(v)?,
            (Some("99%"), Some(v)) => run.p99_us = micros(v)?,
            (Some("Non-2xx"), _) => {
                run.non_2xx = line.rsplit(' ').next()?.parse().ok()?;
            }
            _ => {}
        }
    }
    run.rps = rps?;
    Some(run)
}

/// CPU seconds process `pid` has used (user + system), from /proc/<pid>/stat.
fn cpu_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    // After the command name: state is field 3, utime 14 and stime 15 (1-based, in ticks).
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(14) + ticks(15)) / 100.0
}

fn wrk(server: &Server, secs: u64, connections: usize, core: Option<usize>) -> Run {
    let port = server.port;
    let cpu0 = cpu_of(server.child.id());
    let out = pinned("wrk", core)
        .args(["-t", "1", "-c", &connections.to_string()])
        .args(["-d", &format!("{secs}s"), "--latency"])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .expect("run wrk");
    let cpu = cpu_of(server.child.id()) - cpu0;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut run = parse_wrk(&text).unwrap_or_else(|| panic!("cannot parse wrk's output:\n{text}"));
    run.cpu_us = cpu * 1e6 / (run.rps * secs as f64).max(1.0);
    run
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    if let Ok(spec) = std::env::var(SERVE_ENV) {
        let (which, port) = spec.split_once(':').expect("name:port");
        serve(which, port.parse().expect("a port"));
        return;
    }
    // `cargo test --benches` runs this with no `--bench`: nothing to measure then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    assert!(
        have("wrk"),
        "`wrk` is not on PATH: install it (sudo apt-get install -y wrk)"
    );
    // Many short rounds: whatever else loads the machine changes slowly next to a round, so
    // servers measured back to back see the same conditions, and each round's ratio pairs them.
    let rounds: usize = env_or::<usize>("BENCH_ROUNDS", 15).max(1);
    let secs: u64 = env_or::<u64>("BENCH_SECS", 2).max(1);
    let connections: usize = env_or("BENCH_CONNECTIONS", 50);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = have("taskset") && cores >= 2;
    let (server_core, load_core) = if pin {
        (Some(0), Some(1))
    } else {
        (None, None)
    };

    let servers: Vec<Server> = SERVERS.iter().map(|s| start(s, server_core)).collect();
    // Every response carries the limiter's headers (tollgate's default; governor's use_headers).
    for s in &servers {
        let h = head(s.port);
        assert!(h.starts_with("http/1.1 200"), "{}: {h}", s.name);
        let has = match s.name {
            TOLLGATE => h.contains("x-ratelimit-limit:") && h.contains("x-ratelimit-remaining:"),
            GOVERNOR => h.contains("x-ratelimit-limit:") || h.contains("x-ratelimit-remaining:"),
            _ => !h.contains("x-ratelimit"),
        };
        assert!(has, "{}: unexpected headers:\n{h}", s.name);
    }
    println!(
        "http bench: {rounds} rounds x {} servers x {secs} s, wrk -t1 -c{connections}{}",
        servers.len(),
        if pin {
            ", servers on core 0, wrk on core 1"
        } else {
            " (not pinned: taskset or a second core missing)"
        }
    );
    // Warm-up: each server once, briefly.
    for s in &servers {
        wrk(s, 1, connections, load_core);
    }
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); servers.len()];
    for round in 0..rounds {
        // Alternate the order so no server always runs first or last in a round.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..servers.len()).collect()
        } else {
            (0..servers.len()).rev().collect()
        };
        for i in order {
            let r = wrk(&servers[i], secs, connections, load_core);
            assert_eq!(
                r.non_2xx, 0,
                "{} refused or failed requests",
                servers[i].name
            );
            println!(
                "  round {} {:>15}: {:>9.0} req/s  {:>5.1} µs CPU/req  p50 {:>7.0} µs  p99 {:>7.0} µs",
                round + 1,
                servers[i].name,
                r.rps,
                r.cpu_us,
                r.p50_us,
                r.p99_us
            );
            runs[i].push(r);
        }
    }
    let med = |i: usize, f: fn(&Run) -> f64| median(runs[i].iter().map(f).collect());
    let rps: Vec<f64> = (0..servers.len()).map(|i| med(i, |r| r.rps)).collect();
    let (plain, tollgate, governor) = (rps[0], rps[1], rps[2]);
    // Each round's ratio pairs two servers measured back to back; the headline is their median.
    let paired = |a: usize, b: usize, f: fn(&Run) -> f64| {
        let column = |i: usize| runs[i].iter().map(f).collect::<Vec<_>>();
        report::median_ratio(&column(a), &column(b))
    };
    let rps_ratio = paired(1, 0, |r| r.rps);
    let rps_vs_governor = paired(1, 2, |r| r.rps);
    // Cost ratios: the peer's CPU per request over tollgate's (above 1: tollgate is cheaper).
    let cpu_ratio = paired(0, 1, |r| r.cpu_us);
    let cpu_vs_governor = paired(2, 1, |r| r.cpu_us);

    let command = "cargo bench --bench http";
    let method = format!(
        "An axum hello-world (`GET /` answering `Hello, world!`) served over real HTTP/1.1 on \
         127.0.0.1 three ways: plain; behind tollgate's `RateLimitLayer` as in the quickstart (a \
         token bucket per client IP, `PeerIp`, in-memory store, default headers: \
         `X-RateLimit-Limit`, `-Remaining` and `-Reset` on every response); and behind \
         tower_governor's `GovernorLayer` (per peer IP, `use_headers()`), for reference. The \
         quotas are far above what the load reaches, so every request is allowed (the bench checks \
         wrk saw no non-2xx response) and takes the path most production requests take. Each \
         server is the bench's own executable started as a child process with one tokio \
         current-thread runtime{}; the load is `wrk -t1 -c{connections} -d{secs}s --latency`{} \
         over loopback. The servers take turns, {rounds} short rounds (the order reversed every \
         other round) after a 1 s warm-up each, so servers measured back to back see the same \
         machine; figures are medians over the rounds, and each ratio is the median over rounds \
         of that round's tollgate req/s over the plain app's (target 0.97). The server's CPU \
         time per request (user + system from /proc, over the run) is the figure least moved by \
         other load on the machine; its ratio is the plain app's over tollgate's.",
        if pin {
            ", pinned to core 0 with `taskset`"
        } else {
            ""
        },
        if pin { " pinned to core 1" } else { "" },
    );
    let mut section = report::Section::new(
        "http",
        "HTTP: axum hello-world with and without the layer",
        command,
        &method,
    );
    let mut table = report::Table::new(
        format!("Median of {rounds} rounds, {connections} connections"),
        &[
            "server",
            "req/s",
            "req/s vs plain (median of rounds)",
            "server CPU per request",
            "p50 latency",
            "p99 latency",
        ],
    );
    for (i, s) in servers.iter().enumerate() {
        table.row(&[
            s.name.to_string(),
            format!("{:.0}", rps[i]),
            format!("{:.3}", paired(i, 0, |r| r.rps)),
            format!("{:.2} µs", med(i, |r| r.cpu_us)),
            format!("{:.0} µs", med(i, |r| r.p50_us)),
            format!("{:.0} µs", med(i, |r| r.p99_us)),
        ]);
    }
    section.table(table);
    let mut plot = report::Plot::new(
        "http.svg",
        "axum hello-world over loopback: req/s per round",
        "round",
        "requests per second",
    );
    for (i, s) in servers.iter().enumerate() {
        let points = runs[i]
            .iter()
            .enumerate()
            .map(|(r, run)| ((r + 1) as f64, run.rps))
            .collect();
        plot.series(s.name, points);
    }
    section.plot(plot);
    let case = format!("median of {rounds} rounds, {connections} connections");
    section.ratio("tollgate / plain axum, req/s", &case, rps_ratio, 0.97);
    section.ratio(
        "plain axum / tollgate, server CPU per request",
        &case,
        cpu_ratio,
        0.97,
    );
    section.ratio(
        "tollgate / tower_governor, req/s",
        &case,
        rps_vs_governor,
        1.0,
    );
    section.ratio(
        "tower_governor / tollgate, server CPU per request",
        &case,
        cpu_vs_governor,
        1.0,
    );
    section.note(
        "The server and wrk share the machine with whatever else runs on it: compare the servers \
         within one run (they alternate), not figures across runs.",
    );
    section.write();
    println!(
        "median req/s: plain {plain:.0}, tollgate {tollgate:.0}, tower_governor {governor:.0}; \
         per-round medians: tollgate/plain {rps_ratio:.3} req/s, {cpu_ratio:.3} CPU; \
         tollgate/tower_governor {rps_vs_governor:.3} req/s, {cpu_vs_governor:.3} CPU"
    );
}
