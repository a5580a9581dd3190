//! Attacks on the in-memory store through a real axum server on 127.0.0.1 and a real HTTP
//! client: a flood of distinct keys must not hand an exhausted victim its budget back (eviction
//! can never reset a budget), and memory stays within the key bound. Also the sliding log's
//! per-key memory, measured as the process's resident set (in a child process running that test
//! alone). Bounded in count; time is a manual clock, so nothing depends on the machine's speed.

use axum::routing::get;
use axum::Router;
use reqwest::StatusCode;
use tollgate::algorithm::{AlgorithmKind, SlidingLog};
use tollgate::clock::ManualClock;
use tollgate::key::{HeaderKey, Key};
use tollgate::store::{memory::MemoryBackend, Backend, LimitSpec};
use tollgate::{Limit, Name, Quota, RateLimitLayer};

use crate::harness::http_server::serve_url as serve;
use crate::harness::isolated::run_alone;

async fn status(http: &reqwest::Client, base: &str, api_key: &str) -> StatusCode {
    http.get(base)
        .header("x-api-key", api_key)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_key_flood_does_not_reset_an_exhausted_victim() {
    const MAX_KEYS: usize = 64;
    const FLOOD: usize = 10 * MAX_KEYS;
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .backend(MemoryBackend::new().max_keys(MAX_KEYS).clock(clock.clone()))
        .limit(Limit::new("per-key", Quota::per_day(3)).key(HeaderKey::new("x-api-key").unwrap()))
        .build()
        .unwrap();
    let store = layer.clone();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let base = serve(app).await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    for _ in 0..3 {
        assert_eq!(status(&http, &base, "victim").await, StatusCode::OK);
    }
    assert_eq!(
        status(&http, &base, "victim").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let before = store.store().memory_usage();

    // The flood: 10 x max_keys distinct keys, 16 requests in flight at a time.
    let mut admitted = 0;
    let keys: Vec<usize> = (0..FLOOD).collect();
    for chunk in keys.chunks(16) {
        let replies = chunk.iter().map(|&i| {
            let (http, base) = (http.clone(), base.clone());
            async move { status(&http, &base, &format!("flood-{i}")).await }
        });
        for code in futures_join(replies).await {
            admitted += usize::from(code == StatusCode::OK);
        }
    }

    // Budget regained by the victim: 0.
    for _ in 0..5 {
        assert_eq!(
            status(&http, &base, "victim").await,
            StatusCode::TOO_MANY_REQUESTS,
            "the flood evicted the victim's spent budget"
        );
    }
    let store = store.store();
    assert!(store.len() <= MAX_KEYS, "{} keys held", store.len());
    // The keys that fit, then one overflow bucket of the quota (3) for everyone else.
    assert_eq!(admitted, store.len() - 1 + 3);
    assert_eq!(store.overflowed() as usize, FLOOD - (store.len() - 1));
    // Memory: the table had grown to its bound before the flood ended, and no further.
    let after = store.memory_usage();
    assert!(
        after <= before.max(MAX_KEYS * 64 + 4096),
        "{before} -> {after} bytes"
    );
    eprintln!(
        "flood of {FLOOD} keys (max_keys {MAX_KEYS}): admitted {admitted}, victim regained 0, \
         overflowed {}, memory {before} -> {after} bytes",
        store.overflowed()
    );

    // A day later every key has recovered: new keys are stored again, the victim is whole.
    clock.advance(std::time::Duration::from_secs(86_400));
    assert_eq!(status(&http, &base, "victim").await, StatusCode::OK);
    assert_eq!(status(&http, &base, "newcomer").await, StatusCode::OK);
}

/// `join_all` without a futures dependency: polls the requests concurrently on the runtime.
async fn futures_join<F>(futures: impl Iterator<Item = F>) -> Vec<StatusCode>
where
    F: std::future::Future<Output = StatusCode> + Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

/// Resident set size of this process, in bytes (Linux), or `None` elsewhere.
fn rss_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
fn sliding_log_memory_is_counted_and_bounded() {
    // The resident set is the process's: measured alone, in a child process.
    if run_alone("attack_memory::sliding_log_memory_is_counted_and_bounded").is_some() {
        return;
    }
    // The report: 100 keys x 50,000 admissions grew RSS by 80 MB while memory_usage() said
    // 6.5 KB. Now the count is at most SlidingLog::MAX_COUNT and memory_usage counts entries.
    assert!(MemoryBackend::new()
        .build(&[LimitSpec::new(
            Name::new("big"),
            Quota::per_hour(50_000),
            AlgorithmKind::SlidingLog,
        )])
        .is_err());
    let clock = ManualClock::new();
    let spec = LimitSpec::new(
        Name::new("log"),
        Quota::per_hour(SlidingLog::MAX_COUNT),
        AlgorithmKind::SlidingLog,
    );
    let store = MemoryBackend::new()
        .max_keys(100)
        .clock(clock.clone())
        .build(&[spec])
        .unwrap();
    let rss_before = rss_bytes();
    let usage_before = store.memory_usage();
    for t in 0..3_000u64 {
        clock.set_micros(t);
        for k in 0..100 {
            store.check_one(0, &Key::int(k), 1).unwrap();
        }
    }
    let usage = store.memory_usage() - usage_before;
    let entries = 100 * SlidingLog::MAX_COUNT as usize * 16;
    assert!(
        (entries..entries + 64 * 1024).contains(&usage),
        "memory_usage grew by {usage} bytes for {entries} bytes of entries"
    );
    if let (Some(before), Some(after)) = (rss_before, rss_bytes()) {
        let grown = after.saturating_sub(before);
        eprintln!(
            "sliding log, 100 keys x 3,000 admissions: RSS +{grown} bytes, memory_usage +{usage}"
        );
        // Generous: 1.6 MB of entries.
        assert!(grown < 16 << 20, "RSS grew by {grown} bytes");
    }
}
