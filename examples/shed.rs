//! Load shedding: an axum app whose `GET /job` stands for a backend of `CAPACITY` permits (env,
//! default 4), each held `WORK_MS` milliseconds (env, default 50), behind a load shedder that is
//! never told either number: it learns the concurrency the backend takes from latency.
//! Requests with `x-priority: critical` are critical, every other one sheddable.
//!
//! ```text
//! cargo run --example shed
//! curl -si http://127.0.0.1:3000/job -H 'x-priority: critical'
//! ```
//!
//! Under overload (2.5 to 3 times what the backend can do), critical requests still get `200`
//! and the others get `503 Service Unavailable` with `Retry-After: 1` and an
//! `application/problem+json` body at once, instead of every request queueing for seconds.
//! Once a second it prints what the shedder has learned (`limit=8 in_flight=8 baseline_ms=50`).
//! `PORT` changes the port (default 3000). `tests/examples/shed_example.rs` drives it with
//! open-loop load and checks that contract.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tokio::sync::Semaphore;
use tollgate::load_shed::{LoadShedLayer, Priority, PriorityHeader};

/// An environment variable as a number, or `default`.
fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The backend: the shedder below never sees these two numbers.
    let capacity = env_or("CAPACITY", 4) as usize;
    let work = Duration::from_millis(env_or("WORK_MS", 50));
    let permits = Arc::new(Semaphore::new(capacity));
    let job = move || {
        let permits = Arc::clone(&permits);
        async move {
            // Waiting for a permit is where latency grows when the backend is overloaded.
            let _permit = permits
                .acquire()
                .await
                .expect("the semaphore is never closed");
            tokio::time::sleep(work).await;
            "done\n"
        }
    };

    // The shedder: an adaptive limit (the defaults), critical requests by header, and a short
    // line for them so a critical request waits for the next free slot rather than failing.
    let shed = LoadShedLayer::builder()
        .name("jobs")
        .priority(PriorityHeader::new("x-priority").otherwise(Priority::Sheddable))
        .queue(Priority::Critical, Duration::from_secs(1), 64)
        .build()?;

    let app = Router::new().route("/job", get(job)).layer(shed.clone());

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    // What the shedder has learned, once a second.
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let baseline = shed.baseline().map_or(0, |b| b.as_millis());
            println!(
                "limit={} in_flight={} baseline_ms={baseline}",
                shed.limit(),
                shed.in_flight()
            );
        }
    });
    axum::serve(listener, app).await?;
    Ok(())
}
