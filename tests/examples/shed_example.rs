//! The contract of `examples/shed.rs` (issue 31), as a user tries it: the built example on a
//! free port, driven by open-loop load through a real HTTP client (requests sent on schedule,
//! each on its own task, whatever the server does), at the defaults (`CAPACITY=4 WORK_MS=50`:
//! 80 jobs/s) and at `CAPACITY=2 WORK_MS=100` (20 jobs/s). The shedder is never told either.
//!
//! Per configuration: 2.75x the capacity, every fifth request critical (20 %), 5 s of warm-up
//! then 6 s measured (requests sent in those 6 s), then 3 s at a quarter of the capacity. Real
//! time, about 30 s in all. Latencies are the client's, from send to the end of the body.
//!
//! Asserted: critical requests at least 99 % `200` (the bound); every response within
//! 2 s; every status `200` or `503` (a `503` with `Retry-After: 1`), no transport error; at a
//! quarter of the capacity nothing shed (the bounds); goodput at least **75 %** of the
//! capacity and p99 of the `200`s at most **8x** `WORK_MS`, where the issue says 85 % and 5x.
//! That slack is for the machine, not the shedder: on an idle 2-core machine this test measures
//! 96-98 % and 2.5-3x (printed with `--nocapture`, with the shedder's own once-a-second log),
//! but next to other test binaries the example process is starved of CPU (its 50 ms sleeps were
//! seen taking 250 ms at a quarter of the capacity, with a load average of 6 on 2 cores), which
//! no shedder can hide. The exact bounds are checked in paused time by
//! `tests/shaping_concurrency/load_shed.rs` and measured by `benches/shed.rs`; whether this run
//! met them is printed.

use std::time::{Duration, Instant};

use crate::harness::example_process::{example_binary, free_port, ExampleProcess};
use crate::harness::latency::quantile;

#[derive(Debug, Default)]
struct Outcome {
    sent: u64,
    ok: u64,
    shed: u64,
    critical: u64,
    critical_ok: u64,
    /// Latencies of the `200`s.
    ok_latencies: Vec<Duration>,
    slowest: Duration,
}

impl Outcome {
    fn p99(&self) -> Duration {
        quantile(&self.ok_latencies, 0.99)
    }
}

/// Sends `rate` requests per second for `total`, every fifth critical; returns what came back
/// for the requests sent after `warm_up`.
async fn open_loop(
    client: &reqwest::Client,
    url: &str,
    rate: f64,
    warm_up: Duration,
    total: Duration,
) -> Outcome {
    let start = tokio::time::Instant::now();
    let gap = Duration::from_secs_f64(1.0 / rate);
    let n = (total.as_secs_f64() * rate).round() as u32;
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = start + gap * i;
        tokio::time::sleep_until(at).await;
        let critical = i % 5 == 0;
        let measured = at - start >= warm_up;
        let request = client.get(url);
        let request = if critical {
            request.header("x-priority", "critical")
        } else {
            request
        };
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let res = request
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .expect("no transport error");
            let status = res.status().as_u16();
            let retry_after = res.headers().get("retry-after").cloned();
            res.bytes().await.expect("the whole body");
            (measured, critical, status, retry_after, sent.elapsed())
        }));
    }
    let mut out = Outcome::default();
    for t in tasks {
        let (measured, critical, status, retry_after, latency) = t.await.unwrap();
        if !measured {
            continue;
        }
        out.sent += 1;
        out.critical += u64::from(critical);
        out.slowest = out.slowest.max(latency);
        match status {
            200 => {
                out.ok += 1;
                out.critical_ok += u64::from(critical);
                out.ok_latencies.push(latency);
            }
            503 => {
                out.shed += 1;
                assert_eq!(retry_after.expect("a 503 says when to retry"), "1");
            }
            other => panic!("unexpected status {other}"),
        }
    }
    out
}

async fn keeps_the_contract(capacity: u32, work_ms: u64) {
    let bin = example_binary("shed", &[]);
    let port = free_port();
    let (cap, work) = (capacity.to_string(), work_ms.to_string());
    let server = ExampleProcess::start(
        &bin,
        port,
        &[("CAPACITY", cap.as_str()), ("WORK_MS", work.as_str())],
    );
    let url = format!("http://127.0.0.1:{port}/job");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .unwrap();
    let capacity_rps = f64::from(capacity) * 1000.0 / work_ms as f64;
    let work = Duration::from_millis(work_ms);

    let measured = 6.0;
    let over = open_loop(
        &client,
        &url,
        2.75 * capacity_rps,
        Duration::from_secs(5),
        Duration::from_secs(11),
    )
    .await;
    let goodput = over.ok as f64 / measured;
    eprintln!("{}", server.output().join("\n"));
    eprintln!(
        "CAPACITY={capacity} WORK_MS={work_ms} at 2.75x: sent {} ok {} shed {} critical {}/{} goodput {goodput:.1}/s ({:.0} % of {capacity_rps}) p99 {:?} slowest {:?}",
        over.sent,
        over.ok,
        over.shed,
        over.critical_ok,
        over.critical,
        100.0 * goodput / capacity_rps,
        over.p99(),
        over.slowest
    );
    assert!(
        over.critical_ok * 100 >= over.critical * 99,
        "critical: {}/{}",
        over.critical_ok,
        over.critical
    );
    eprintln!(
        "the issue's bounds (goodput >= 85 %, p99 <= 5x WORK_MS) met in this run: {}",
        goodput >= 0.85 * capacity_rps && over.p99() <= 5 * work
    );
    assert!(goodput >= 0.75 * capacity_rps, "goodput {goodput:.1}/s");
    assert!(over.p99() <= 8 * work, "p99 {:?}", over.p99());
    assert!(
        over.slowest <= Duration::from_secs(2),
        "slowest {:?}",
        over.slowest
    );
    assert!(over.shed > 0, "2.75x the capacity sheds");

    tokio::time::sleep(Duration::from_secs(1)).await;
    let light = open_loop(
        &client,
        &url,
        capacity_rps / 4.0,
        Duration::ZERO,
        Duration::from_secs(3),
    )
    .await;
    eprintln!(
        "CAPACITY={capacity} WORK_MS={work_ms} at 0.25x: sent {} ok {} shed {} p99 {:?}",
        light.sent,
        light.ok,
        light.shed,
        light.p99()
    );
    assert_eq!(light.shed, 0, "a quarter of the capacity sheds nothing");
    assert!(light.slowest <= Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shed_example_keeps_its_contract_at_the_defaults_and_at_2_by_100_ms() {
    keeps_the_contract(4, 50).await;
    keeps_the_contract(2, 100).await;
}
