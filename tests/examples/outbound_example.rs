//! The contract of `examples/outbound.rs` (issue 11), through the example's own code: its
//! upstream on 127.0.0.1 (tollgate's server layer at 10/s), 50 calls through hyper-util's client
//! in the outbound layer, configured then adaptive, each run's line parsed as printed.
//!
//! Real time (the example is about seconds of real traffic); the bounds are the issue's.

#[path = "../../examples/outbound.rs"]
#[allow(dead_code)]
mod example;

use std::collections::HashMap;

/// `key=value` fields of one output line.
fn fields(line: &str) -> HashMap<&str, &str> {
    line.split(' ')
        .map(|f| f.split_once('=').expect("key=value"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_runs_keep_the_contract() {
    let reports = example::both().await.unwrap();
    let lines: Vec<String> = reports.iter().map(ToString::to_string).collect();
    eprintln!("{}", lines.join("\n"));
    assert_eq!(lines.len(), 2);

    let configured = fields(&lines[0]);
    assert_eq!(configured["mode"], "configured", "{}", lines[0]);
    assert_eq!(configured["calls"], "50");
    assert_eq!(configured["ok"], "50", "{}", lines[0]);
    assert_eq!(configured["upstream_429"], "0", "{}", lines[0]);
    let elapsed = configured["elapsed"].strip_suffix('s').unwrap();
    assert_eq!(
        elapsed.split_once('.').unwrap().1.len(),
        2,
        "two decimals: {elapsed}"
    );
    let elapsed: f64 = elapsed.parse().unwrap();
    assert!((4.0..=6.0).contains(&elapsed), "{}", lines[0]);

    let adaptive = fields(&lines[1]);
    assert_eq!(adaptive["mode"], "adaptive", "{}", lines[1]);
    assert_eq!(adaptive["calls"], "50");
    assert_eq!(adaptive["ok"], "50", "{}", lines[1]);
    let refused: u32 = adaptive["upstream_429"].parse().unwrap();
    assert!(refused <= 5, "{}", lines[1]);
    let elapsed: f64 = adaptive["elapsed"]
        .strip_suffix('s')
        .unwrap()
        .parse()
        .unwrap();
    assert!(elapsed <= 8.0, "{}", lines[1]);
}
