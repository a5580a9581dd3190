//! Client-side rate limiting: keep a client to its upstreams' limits.
//!
//! [`OutboundLayer`] wraps any `tower::Service<http::Request<_>>` client (hyper-util's
//! legacy `Client`, a tonic `Channel`, a `service_fn`), or (feature `reqwest`) a reqwest client
//! as the `reqwest-middleware` middleware
//! [`reqwest::OutboundMiddleware`](reqwest/struct.OutboundMiddleware.html), and, per upstream
//! ([`UpstreamKey`]: the request's authority by default, or a closure):
//!
//! - **shapes** its sending to a configured [`Quota`](crate::Quota): a call that does not fit
//!   *waits* for its slot instead of failing. Slots are reserved on a [GCRA](crate::algorithm::Gcra)
//!   schedule under a short lock, then waited for, so concurrent callers are spaced and served
//!   first come, first served; a call dropped while waiting gives its slot back;
//! - **reads the upstream's answers** ([`parse`]): `429` / `503` with `Retry-After`
//!   (delta-seconds or HTTP-date), `X-RateLimit-Limit` / `-Remaining` / `-Reset`, the IETF
//!   `RateLimit` / `RateLimit-Policy` fields, and gRPC `RESOURCE_EXHAUSTED` with
//!   `grpc-retry-pushback-ms` or (feature `tonic`) `google.rpc.RetryInfo`. A refusal with a
//!   wait, or `Remaining: 0` with a reset, **pauses that upstream for every caller** sharing the
//!   layer until the upstream says it is ready;
//! - when a pause ends, **releases the waiting callers in a slow start**, not all at once: a
//!   plain success with no rate-limit header shows room for that one call only. After a
//!   refusal whose pause was `r`, one call goes per `r` at first, each interval of `r` with no
//!   refusal doubles how many go per `r` (1, 2, 4, ...), and a refusal during the slow start
//!   halves that and stops the doubling. Everyone goes once an answer's rate-limit headers
//!   show room (`Remaining` above 0, a limit, a policy) or the allowance covers every caller
//!   still waiting: 15 callers waiting on an upstream that has recovered are all sent within
//!   `3 r`. Where no `r` is known (a refusal with no wait, `Remaining: 0`, and a new upstream
//!   of an adaptive layer with no quota), calls go through a window of calls in flight: 1, and
//!   one more per plain answer, open on the same signs of room;
//! - **retries** a refused request when it can be replayed ([`Replay`]: by default a cloneable
//!   body and an idempotent method), up to [`max_attempts`](OutboundLayerBuilder::max_attempts)
//!   within a [`retry_deadline`](OutboundLayerBuilder::retry_deadline), with exponential
//!   [`Backoff`] and full jitter, while the upstream's [`RetryBudget`] allows; otherwise the
//!   upstream's response is returned unchanged;
//! - **learns** an upstream's rate from its headers when no quota is set (adaptive mode, on by
//!   default): `RateLimit-Policy` exactly, or `X-RateLimit-Limit` over the longest reset seen,
//!   and keeps to it. A learned rate only ever slows a configured quota down, never speeds it up.
//!
//! # Bounds
//!
//! - **No upstream-imposed wait holds a call longer than
//!   [`max_pause`](OutboundLayerBuilder::max_pause)** (60 s by default, at most 3,600 s): a
//!   pause (`Retry-After`, a reset, gRPC pushback) lasts at most `max_pause` from the answer
//!   that asked for it, and the first attempt of a call is sent at most `max_pause` after the
//!   call however many pauses, learned-limit slots (`RateLimit-Policy: "q";q=1;w=31536000`
//!   included), slow-start slots or full windows stand in the way; a retry, at most `max_pause` after its
//!   backoff ends. Only a configured [`quota`](OutboundLayerBuilder::quota)'s own spacing can
//!   make a call wait longer.
//! - `X-RateLimit-Reset` is read by its size: below 10^9 seconds from now, from 10^9 Unix
//!   seconds, from 10^12 Unix milliseconds ([`parse::XRateLimit`]).
//! - A call sends at most [`max_attempts`](OutboundLayerBuilder::max_attempts) requests (3 by
//!   default, at most 10), retries only within
//!   [`retry_deadline`](OutboundLayerBuilder::retry_deadline) (30 s by default, at most 600 s),
//!   with a backoff base of at least 1 ms; larger settings are a [`ConfigError`](crate::ConfigError)
//!   at build time.
//! - **Retry budget**, per upstream: the retries of the last 10 s (the current second of the
//!   layer's clock and the 9 before it) never exceed 20% of the first attempts of those
//!   seconds plus 10 ([`RetryBudget`], configurable). Against an upstream that refuses
//!   everything, that is at most 1.2 requests per call plus 10 per 10 s.
//!
//! Time is the layer's [`Clock`](crate::clock::Clock) ([`TokioClock`](crate::clock::TokioClock)
//! by default) and sleeping is tokio's timer, so `#[tokio::test(start_paused = true)]` drives it.
//!
//! Only the response *headers* are read: a gRPC status sent in trailers after a streamed body is
//! not seen (a rejection before any message, as tollgate's own gRPC layer sends, is
//! trailers-only and is). Transport errors are returned as they are, not retried.
//!
//! # Examples
//!
//! The default, adaptive layer around a client: the upstream refuses the first call with
//! `Retry-After: 1`; the layer waits a second and sends it again.
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::outbound::{OutboundInfo, OutboundLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let calls = Arc::new(AtomicU32::new(0));
//! let upstream = {
//!     let calls = calls.clone();
//!     service_fn(move |_: Request<String>| {
//!         let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
//!         async move {
//!             let res = if first {
//!                 Response::builder().status(429).header("retry-after", "1").body(String::new())
//!             } else {
//!                 Response::builder().body("hello".to_owned())
//!             };
//!             Ok::<_, Infallible>(res.unwrap())
//!         }
//!     })
//! };
//! let client = ServiceBuilder::new().layer(OutboundLayer::new()).service(upstream);
//!
//! let started = tokio::time::Instant::now();
//! let res = client.oneshot(Request::get("http://api.example.com/").body(String::new())?).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.extensions().get::<OutboundInfo>().unwrap().attempts(), 2);
//! assert!(started.elapsed() >= Duration::from_secs(1));
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! # Ok(())
//! # }
//! ```
//!
//! A configured quota of 10 per second, evenly spaced, that never retries (a body that cannot
//! be cloned, or a `POST` that must not be sent twice, would not be retried either):
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::outbound::{NoReplay, OutboundLayer};
//! use tollgate::Quota;
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = OutboundLayer::builder()
//!     .quota(Quota::per_second(10).burst(1))
//!     .replay(NoReplay)
//!     .build()?;
//! let mut client = ServiceBuilder::new().layer(layer).service(service_fn(|req: Request<()>| async move {
//!     let status = if req.uri().path() == "/busy" { 429 } else { 200 };
//!     Ok::<_, Infallible>(Response::builder().status(status).body(()).unwrap())
//! }));
//!
//! let started = tokio::time::Instant::now();
//! for _ in 0..3 {
//!     let res = client.ready().await?.call(Request::get("http://api/").body(())?).await?;
//!     assert_eq!(res.status(), StatusCode::OK);
//! }
//! // 0 ms, 100 ms, 200 ms.
//! assert!(started.elapsed() >= Duration::from_millis(200));
//!
//! let res = client.ready().await?.call(Request::get("http://api/busy").body(())?).await?;
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS); // returned, not retried
//! # Ok(())
//! # }
//! ```

mod adaptive;
mod attempts;
mod backoff;
mod budget;
mod future;
#[cfg(feature = "tonic")]
mod grpc;
mod http_date;
mod key;
mod layer;
pub mod parse;
mod replay;
#[cfg(feature = "reqwest")]
pub mod reqwest;
mod schedule;
mod service;

pub use attempts::OutboundInfo;
pub use backoff::Backoff;
pub use budget::RetryBudget;
pub use future::ResponseFuture;
pub use key::{Authority, UpstreamKey};
pub use layer::{OutboundLayer, OutboundLayerBuilder};
pub use replay::{clone_request, is_idempotent, Idempotent, NoReplay, Replay};
pub use schedule::UpstreamStatus;
pub use service::Outbound;
