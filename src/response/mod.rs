//! Rejection responses: `429` problem+json, `413` for a cost that can never fit, `400`/`500` for
//! a missing key, `503` when the store fails closed, and gRPC trailers-only responses.
//!
//! A [`Rejection`] builds the response for a refused request from a [`Rejected`] (the request,
//! the [`RejectReason`], every decision made). [`DefaultRejection`] answers with an RFC 9457
//! `application/problem+json` body (see its docs for the statuses and members), or a gRPC
//! trailers-only response to gRPC requests. Whatever the rejection, the layer then adds the
//! rate-limit headers, `Retry-After` when waiting helps and the response lacks one, and (with
//! [`response_extensions`](crate::rate_limit::RateLimitLayerBuilder::response_extensions)) the
//! decision in the response extensions.
//!
//! # Examples
//!
//! The default body names the limit, its quota and the wait:
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::BodyExt;
//! use tollgate::key::GlobalKey;
//! use tollgate::{Limit, Quota, RateLimitLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::new(Limit::new("hourly", Quota::per_hour(1)).key(GlobalKey))?;
//! let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
//! }));
//! svc.clone().oneshot(Request::get("/").body(())?).await?;
//!
//! let res = svc.clone().oneshot(Request::get("/").body(())?).await?;
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(res.headers()["retry-after"], "3600");
//! assert_eq!(res.headers()["content-type"], "application/problem+json");
//! let body = res.into_body().collect().await?.to_bytes();
//! let body = std::str::from_utf8(&body)?;
//! assert!(body.starts_with(
//!     r#"{"type":"urn:tollgate:problem:rate-limited","title":"Too Many Requests","status":429,"detail":"Rate limit \"hourly\" (1/h) is exhausted; retry in 3600 s.","policy":"hourly","quota":"1/h","limit":1,"window":3600,"remaining":0,"retry_after":3600,"reset":""#
//! ));
//! // `reset` is when the limit is full again, as an RFC 3339 UTC time: `"2026-03-01T13:00:00Z"`.
//! let json: serde_json::Value = serde_json::from_str(body)?;
//! assert_eq!(json["reset"].as_str().map(str::len), Some(20));
//! assert_eq!(json["reset_seconds"], 3600);
//!
//! // A gRPC call gets a trailers-only response instead.
//! let grpc = Request::post("/pkg.Svc/Call").header("content-type", "application/grpc").body(())?;
//! let res = svc.clone().oneshot(grpc).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["grpc-status"], "8");
//! # Ok(())
//! # }
//! ```
//!
//! Plugging in a custom rejection, here a closure answering plain text:
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use tollgate::key::GlobalKey;
//! use tollgate::response::{RejectReason, Rejected, RejectionBody};
//! use tollgate::{Limit, Quota, RateLimitLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .limit(Limit::new("hourly", Quota::per_hour(1)).key(GlobalKey))
//!     .rejection(|rejected: &Rejected<'_>| {
//!         let text = match rejected.reason() {
//!             RejectReason::RateLimited { decision, .. } => {
//!                 format!("over the {} limit\n", decision.policy())
//!             }
//!             _ => String::from("refused\n"),
//!         };
//!         let mut res = Response::new(RejectionBody::from(text));
//!         *res.status_mut() = rejected.status();
//!         res
//!     })
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(String::new()))
//! }));
//! svc.clone().oneshot(Request::get("/").body(())?).await?;
//! let res = svc.clone().oneshot(Request::get("/").body(())?).await?;
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(res.headers()["retry-after"], "3600"); // added by the layer
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
//! # Ok(())
//! # }
//! ```

mod body;
mod grpc;
#[cfg(feature = "tonic")]
mod grpc_details;
mod problem;
mod rejection;
pub(crate) mod rfc3339;

pub(crate) use body::poll_frame_holding;
pub use body::RejectionBody;
pub(crate) use grpc::grpc_retry_refusal;
pub use grpc::{
    grpc_trailers_only, GrpcCode, GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS,
    GRPC_STATUS_DETAILS_BIN,
};
pub use problem::{ProblemDetails, APPLICATION_PROBLEM_JSON};
pub use rejection::{DefaultRejection, RejectReason, Rejected, Rejection};
