//! Concurrency limits: at most N requests in flight per key, counted until the response body
//! is finished or dropped.
//!
//! A rate limit caps how often requests start; a concurrency limit caps how many run at once,
//! which is what protects a slow backend (uploads, reports, a database pool) from a client that
//! opens many connections. [`ConcurrencyLimitLayer`] counts per key with the crate's
//! [key extractors](crate::key) (one global key by default). A request takes a slot when it
//! arrives and gives it back when its response body has sent its last frame or is dropped, not
//! when the headers go out: a response still streaming is still in flight, and a client that
//! disconnects mid-body frees its slot as soon as the server drops the body.
//!
//! A request that finds every slot of its key taken is refused with `429 Too Many Requests`
//! and an RFC 9457 problem+json body (type `urn:tollgate:problem:concurrency-limited`, members
//! `policy`, `limit` and `in_flight`; a gRPC call gets `RESOURCE_EXHAUSTED`), or, with
//! [`queue`](ConcurrencyLimitLayerBuilder::queue), waits for a slot, first come first served
//! per key, up to a `max_wait` and a queue length. There is no `Retry-After`: nobody knows when
//! a request in flight will finish.
//!
//! For a per-key and a global cap, stack two layers (the outer one is taken first):
//! `ServiceBuilder::new().layer(global).layer(per_ip)`.
//!
//! # Headers
//!
//! None. No convention exists for concurrency (the `RateLimit` fields of the IETF draft and
//! `X-RateLimit-*` count requests per window, and a client reading them as such would
//! misjudge its quota), and a count of requests in flight is stale by the time the client reads
//! it. The refusal body says what the limit is and how many were in flight.
//!
//! # Slots in memory and in Redis
//!
//! The in-memory table holds one small entry per key with a request in flight or waiting, up
//! to [`max_keys`](ConcurrencyLimitLayerBuilder::max_keys) keys (a request for a new key
//! beyond that is refused with `503`); a key with nothing in flight takes no memory. With the
//! `redis` feature, [`RedisSlots`](struct.RedisSlots.html) shares the slots between instances
//! as leases that expire: an instance that dies holding slots frees them when their leases run
//! out, while live requests are renewed by one background task per layer and tokio runtime (a
//! layer used from a new runtime connects there; one that shut down takes only its own
//! connection with it). Slot
//! key names hold client keys only as a keyed hash, at most 58 bytes plus the prefix and the
//! limit name.
//!
//! Every duration is bounded when the layer is built: the queue's `max_wait` from 1 ns to 1 hour,
//! the Redis lease from 30 ms to 1 hour; outside that, [`build`](ConcurrencyLimitLayerBuilder::build)
//! returns a [`ConfigError`](crate::ConfigError) naming the field.
//!
//! # Examples
//!
//! Two uploads in flight per client IP; a third is refused until one finishes:
//!
//! ```
//! use std::convert::Infallible;
//! use std::net::SocketAddr;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use tollgate::concurrency::ConcurrencyLimitLayer;
//! use tollgate::key::PeerIp;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = ConcurrencyLimitLayer::builder(2)
//!     .name("uploads")
//!     .key(PeerIp::new())
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("stored"))))
//! }));
//! let request = || {
//!     let mut req = Request::post("/upload").body(()).unwrap();
//!     req.extensions_mut().insert("203.0.113.9:5000".parse::<SocketAddr>().unwrap());
//!     req
//! };
//!
//! // Two responses whose bodies are not read yet: both still in flight.
//! let first = svc.clone().oneshot(request()).await?;
//! let _second = svc.clone().oneshot(request()).await?;
//! let refused = svc.clone().oneshot(request()).await?;
//! assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(refused.headers()["content-type"], "application/problem+json");
//! let body = refused.into_body().collect().await?.to_bytes();
//! let json: serde_json::Value = serde_json::from_slice(&body)?;
//! assert_eq!(json["type"], "urn:tollgate:problem:concurrency-limited");
//! assert_eq!((json["limit"].as_u64(), json["in_flight"].as_u64()), (Some(2), Some(2)));
//!
//! // Reading the first body to its end gives its slot back.
//! assert_eq!(first.into_body().collect().await?.to_bytes(), "stored");
//! assert_eq!(svc.clone().oneshot(request()).await?.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```
//!
//! One report at a time for everyone, the others waiting their turn for up to 30 s (at most 8
//! waiting), then refused:
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::concurrency::ConcurrencyLimitLayer;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = ConcurrencyLimitLayer::builder(1)
//!     .name("reports")
//!     .queue(Duration::from_secs(30), 8)
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(String::from("report")))
//! }));
//!
//! let running = svc.clone().oneshot(Request::new(())).await?; // holds the slot
//! let waiting = tokio::spawn(svc.clone().oneshot(Request::new(())));
//! tokio::time::sleep(Duration::from_secs(5)).await; // still waiting
//! assert!(!waiting.is_finished());
//! drop(running); // its body is dropped: the slot goes to the waiting request
//! assert_eq!(waiting.await??.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```
//!
//! An invalid configuration fails when the layer is built:
//!
//! ```
//! use tollgate::concurrency::ConcurrencyLimitLayer;
//!
//! let err = ConcurrencyLimitLayer::builder(0).build().unwrap_err();
//! assert_eq!(err.field(), "max_in_flight");
//! ```

mod body;
mod future;
mod layer;
#[cfg(feature = "redis")]
mod redis;
mod service;
mod table;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use layer::{ConcurrencyLimitLayer, ConcurrencyLimitLayerBuilder, DEFAULT_MAX_KEYS};
#[cfg(feature = "redis")]
pub use redis::RedisSlots;
pub use service::ConcurrencyLimit;
