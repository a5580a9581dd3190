//! Load shedding: a concurrency limit learned from latency, shared out by priority, that
//! refuses what the service cannot take with `503` before it queues up.
//!
//! A rate limit protects the service from one client; a shedder protects it from all of them at
//! once. [`LoadShedLayer`] counts the requests in flight (from the call until the response body
//! ends or is dropped) against a limit, and refuses a request that finds its class's share of
//! the limit in use. It is never told the backend's capacity: it measures each request's
//! latency and learns the concurrency at which latency starts to grow (or takes a
//! [fixed limit](LoadShedLayerBuilder::fixed_limit) from a user who knows it).
//!
//! # Priorities
//!
//! Each request gets a [`Priority`] from a [`Classify`]: [`PriorityHeader`], [`KeyPriority`]
//! over any [key extractor](crate::key) (route, principal, API key, plan), or a closure.
//! [`Critical`](Priority::Critical) requests may use the whole limit; [`Default`](Priority::Default)
//! ones 90 % of it and [`Sheddable`](Priority::Sheddable) ones 50 %, counting every class's
//! requests in flight ([`share`](LoadShedLayerBuilder::share) changes it). Under overload the
//! sheddable ones are refused first, and what they leave is room for critical traffic. A
//! class may have a short bounded [`queue`](LoadShedLayerBuilder::queue): its requests then
//! wait up to a `max_wait` for a slot, and a freed slot goes to the most important class
//! waiting.
//!
//! # Refusals
//!
//! `503 Service Unavailable` (the server is overloaded: this is not the client's quota, so not
//! `429`) with `Retry-After` (1 s by default) and an RFC 9457 problem+json body of type
//! `urn:tollgate:problem:overloaded` (members `policy`, `priority`, `limit`, `in_flight`,
//! `retry_after`). A gRPC call gets `UNAVAILABLE` with `grpc-retry-pushback-ms` and, with the
//! `tonic` feature, `google.rpc.RetryInfo` in `grpc-status-details-bin`, built by the same code
//! as the rate limiter's refusals ([`response`](crate::response)). A refusal takes one lock and
//! writes one small document: no more than a rate-limit refusal.
//!
//! # The limit learned from latency
//!
//! The algorithm is a gradient in the manner of Netflix's
//! [concurrency-limits](https://github.com/Netflix/concurrency-limits) `Gradient2Limit`
//! (itself after TCP Vegas' idea, Brakmo and Peterson 1994: a growing round-trip time means a
//! growing queue): each finished request is a sample of its latency, and
//!
//! - `recent` is a moving average of the last ten or so samples;
//! - `baseline` is the no-load latency: it falls at once to a lower average of the last three
//!   or so samples (the backend got faster; one fast outlier is not enough), and moves an
//!   eighth of the way to the latency of each request that ran without load (at most one other
//!   request in flight: a backend worth protecting takes two at once without queueing either),
//!   so a backend that got slower is learned as soon as the limit has come down to 2;
//! - `gradient = clamp(tolerance × baseline / recent, 0.5, 1)`. While the limit is in use (all
//!   of it in flight, or a request refused or queued since the last sample), below 1 the limit
//!   moves towards `limit × gradient`, and at 1 it grows by about `√limit` per limit's worth of
//!   finished requests (an additive increase per round trip, as TCP's). Under light load it
//!   stays where it is, however slow the requests: latency that grows while the limit is not in
//!   use is not caused by our concurrency;
//! - each step moves the limit by `smoothing` (0.2) of the way, within `min_limit..=max_limit`.
//!
//! Why this and not Gradient2 or Vegas as published: Gradient2 keeps its long-term latency as
//! a moving average of all samples, and Vegas resets its minimum on a timer to the latency of
//! the moment; under overload that lasts, both let the loaded latency become the baseline, and
//! the limit (and with it the queue and the latency) creeps up. The baseline here only rises
//! from requests that ran without load, so sustained overload cannot move it. The defaults: a
//! `tolerance` of 1.5 lets the backend keep a queue of about half its capacity (latency about
//! 1.5 times the no-load latency on average), enough for full goodput without the queue that
//! makes a service slow for everyone (2 measured the same goodput with a p99 half as high
//! again, in `tests/shaping_concurrency/load_shed.rs`); the additive increase and the cut of
//! up to `smoothing × √limit` halves per round trip make the limit come down in a few round
//! trips and climb back in a few dozen; the initial limit of 20 and range 1..=1000 bound what it can do before it has learned
//! anything. The clock is injectable ([`clock`](LoadShedLayerBuilder::clock); by default
//! [`TokioClock`](crate::clock::TokioClock), which follows `tokio::time::pause`).
//!
//! What it cannot see: latency that does not grow with our own concurrency (a backend loaded by
//! other clients, a downstream call timing out) lowers the limit as if it were ours, and a
//! backend whose fast answers are errors looks healthy; a limit learned in one process knows
//! nothing of other instances.
//!
//! # Stacking
//!
//! Put rate limits first and the shedder after them: clients over their quota are refused with
//! `429` before they take a slot, and the shedder protects the capacity left for everyone
//! else. `ServiceBuilder::new().layer(rate_limit).layer(shed)`. An outbound client with a
//! retry budget ([`outbound`](crate::outbound)) reads the `503`'s `Retry-After` as it reads a
//! `429`'s. See the [load shedding guide](crate::guide::load_shedding).
//!
//! # Metrics
//!
//! With the `metrics` feature: `tollgate_shed_limit`, `tollgate_shed_in_flight`,
//! `tollgate_shed_total` (by `priority`) and `tollgate_shed_baseline_seconds`, labelled
//! `shedder` (see [`metrics`](mod@crate::metrics)). Their handles are registered when the layer
//! is built: install the recorder first.
//!
//! # Examples
//!
//! A fixed limit of 2, critical requests marked by a header, others sheddable at half the
//! limit:
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::BodyExt;
//! use tollgate::load_shed::{LoadShedLayer, Priority, PriorityHeader};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = LoadShedLayer::builder()
//!     .fixed_limit(2)
//!     .priority(PriorityHeader::new("x-priority").otherwise(Priority::Sheddable))
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(layer.clone()).service(service_fn(|_req: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(String::from("done")))
//! }));
//! let critical = || Request::get("/").header("x-priority", "critical").body(()).unwrap();
//!
//! // A sheddable response whose body is not read yet holds one slot: half the limit.
//! let running = svc.clone().oneshot(Request::new(())).await?;
//! let shed = svc.clone().oneshot(Request::new(())).await?;
//! assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
//! assert_eq!(shed.headers()["retry-after"], "1");
//! assert_eq!(shed.headers()["content-type"], "application/problem+json");
//! let body = shed.into_body().collect().await?.to_bytes();
//! let json: serde_json::Value = serde_json::from_slice(&body)?;
//! assert_eq!(json["type"], "urn:tollgate:problem:overloaded");
//! assert_eq!(json["priority"], "sheddable");
//!
//! // Critical requests may use the rest.
//! let kept = svc.clone().oneshot(critical()).await?;
//! assert_eq!(kept.status(), StatusCode::OK);
//! assert_eq!(layer.in_flight(), 2);
//! drop((running, kept)); // bodies dropped: both slots come back
//! assert_eq!(layer.in_flight(), 0);
//! # Ok(())
//! # }
//! ```
//!
//! The adaptive limit with its settings, a critical queue, and a gRPC call shed:
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response};
//! use tollgate::load_shed::{Adaptive, LoadShedLayer, Priority};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = LoadShedLayer::builder()
//!     .name("api")
//!     .adaptive(Adaptive::new().initial_limit(1).min_limit(1).max_limit(64))
//!     .queue(Priority::Critical, Duration::from_millis(500), 16)
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(String::new()))
//! }));
//! let _running = svc.clone().oneshot(Request::new(())).await?; // the one slot
//! let grpc = Request::post("/pkg.Svc/Call").header("content-type", "application/grpc").body(())?;
//! let res = svc.clone().oneshot(grpc).await?;
//! assert_eq!(res.headers()["grpc-status"], "14"); // UNAVAILABLE
//! assert_eq!(res.headers()["grpc-retry-pushback-ms"], "1000");
//! assert!(res.headers().contains_key("grpc-status-details-bin")); // RetryInfo
//! # Ok(())
//! # }
//! ```
//!
//! An invalid configuration fails when the layer is built:
//!
//! ```
//! use tollgate::load_shed::{LoadShedLayer, Priority};
//!
//! let err = LoadShedLayer::builder().share(Priority::Sheddable, 0.0).build().unwrap_err();
//! assert_eq!(err.field(), "share");
//! ```

mod body;
mod future;
mod gate;
mod gradient;
mod layer;
#[cfg(feature = "metrics")]
mod metrics;
mod priority;
mod service;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use gradient::Adaptive;
pub use layer::{LoadShedLayer, LoadShedLayerBuilder};
pub use priority::{Classify, KeyPriority, Priority, PriorityHeader, UnknownPriority};
pub use service::LoadShed;
