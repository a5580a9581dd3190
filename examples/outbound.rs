//! Outbound: a client keeping to an upstream's limits (`tollgate::outbound`).
//!
//! ```text
//! cargo run --example outbound
//! ```
//!
//! Starts its own upstream on 127.0.0.1 (a free port) that allows 10 requests per second: an
//! axum app behind tollgate's own server layer, a token bucket of 10 refilling 10 per second,
//! answering beyond it `429` with `Retry-After`, `X-RateLimit-Limit` / `-Remaining` / `-Reset`
//! and the IETF `RateLimit` / `RateLimit-Policy` fields. Then it makes 50 concurrent calls
//! through hyper-util's client wrapped in the outbound layer, twice, and prints one line per run:
//!
//! ```text
//! mode=configured calls=50 ok=50 upstream_429=0 elapsed=4.91s
//! mode=adaptive calls=50 ok=50 upstream_429=0 elapsed=4.41s
//! ```
//!
//! - `configured`: the client's own quota, 10 per second with a burst of 1 (calls 100 ms
//!   apart, so the upstream's bucket never empties): all 50 succeed with no `429`, in about
//!   4.9 s.
//! - `adaptive`: no quota set. The first call goes alone; its answer's `RateLimit-Policy`
//!   (`q=10;w=1`) teaches the layer the rate, which it keeps to with a burst of half the
//!   limit: about 4.4 s, typically no `429`.
//!
//! `upstream_429` is counted **in the upstream**, outside its rate limiter: every `429` it
//! sent, including any the outbound layer absorbed by waiting and retrying, so a retried
//! refusal is never hidden. `ok` counts the calls whose final answer was `200`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::headers::ResetFormat;
use tollgate::key::GlobalKey;
use tollgate::outbound::OutboundLayer;
use tollgate::{AlgorithmKind, Limit, Quota, RateLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

/// Calls per run.
pub const CALLS: u32 = 50;

/// How the client is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The client's own quota: 10 per second, evenly spaced.
    Configured,
    /// No quota: learned from the upstream's headers.
    Adaptive,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Configured => "configured",
            Mode::Adaptive => "adaptive",
        }
    }
}

/// One run's result: formats as the contract's output line.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    pub mode: Mode,
    pub calls: u32,
    pub ok: u32,
    pub upstream_429: u64,
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "mode={} calls={} ok={} upstream_429={} elapsed={:.2}s",
            self.mode.name(),
            self.calls,
            self.ok,
            self.upstream_429,
            self.elapsed.as_secs_f64()
        )
    }
}

/// The upstream: 10 requests per second for everyone, on a free port of 127.0.0.1. Returns
/// its address and the count of `429`s it has sent.
pub async fn start_upstream() -> Result<(SocketAddr, Arc<AtomicU64>), Box<dyn std::error::Error>> {
    let refused = Arc::new(AtomicU64::new(0));
    let rate_limit = RateLimitLayer::builder()
        .limit(
            Limit::new("default", Quota::per_second(10))
                .algorithm(AlgorithmKind::TokenBucket)
                .key(GlobalKey),
        )
        .reset_format(ResetFormat::DeltaSeconds)
        .ietf_headers(true)
        .build()?;
    let counter = refused.clone();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(rate_limit)
        // Outside the limiter: sees every answer, refusals included.
        .layer(axum::middleware::map_response(
            move |res: axum::response::Response| {
                let counter = counter.clone();
                async move {
                    if res.status() == StatusCode::TOO_MANY_REQUESTS {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    res
                }
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, refused))
}

/// Makes [`CALLS`] concurrent calls to the upstream at `addr` through a fresh outbound layer.
pub async fn run(
    mode: Mode,
    addr: SocketAddr,
    refused: &AtomicU64,
) -> Result<Report, Box<dyn std::error::Error>> {
    let layer = match mode {
        Mode::Configured => OutboundLayer::builder()
            .quota(Quota::per_second(10).burst(1))
            .build()?,
        Mode::Adaptive => OutboundLayer::builder().build()?,
    };
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let client = ServiceBuilder::new().layer(layer).service(http);

    let refused_before = refused.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..CALLS {
        let mut client = client.clone();
        let uri = format!("http://{addr}/");
        calls.spawn(async move {
            let req = Request::get(uri).body(Full::new(Bytes::new()))?;
            let res = client.ready().await?.call(req).await?;
            let status = res.status();
            res.into_body().collect().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(status)
        });
    }
    let mut ok = 0;
    while let Some(done) = calls.join_next().await {
        if done?.map_err(|e| e.to_string())? == StatusCode::OK {
            ok += 1;
        }
    }
    Ok(Report {
        mode,
        calls: CALLS,
        ok,
        upstream_429: refused.load(Ordering::Relaxed) - refused_before,
        elapsed: started.elapsed(),
    })
}

/// Both runs against one upstream, a second apart so its bucket is full again for the second.
pub async fn both() -> Result<[Report; 2], Box<dyn std::error::Error>> {
    let (addr, refused) = start_upstream().await?;
    let configured = run(Mode::Configured, addr, &refused).await?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let adaptive = run(Mode::Adaptive, addr, &refused).await?;
    Ok([configured, adaptive])
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for report in both().await? {
        println!("{report}");
    }
    Ok(())
}
