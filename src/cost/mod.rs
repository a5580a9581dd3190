//! Cost functions: how many units a request spends.
//!
//! Every limit charges each request a cost (one unit unless said otherwise) computed by a
//! [`Cost`]: a [`ConstantCost`], a [`CostTable`] by method and route, or a closure. A cost function
//! that can declare its maximum ([`Cost::max_cost`]) lets the layer reject, at build time, a limit
//! whose capacity is smaller than the most expensive request: such a request could never succeed,
//! however long its client waited.
//!
//! # Examples
//!
//! Searches cost five units of a 10-unit budget, everything else one:
//!
//! ```
//! use std::convert::Infallible;
//!
//! use http::{Request, Response, StatusCode};
//! use tollgate::cost::CostTable;
//! use tollgate::key::GlobalKey;
//! use tollgate::{Limit, Quota, RateLimitLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let layer = RateLimitLayer::new(
//!     Limit::new("api", Quota::per_hour(10))
//!         .key(GlobalKey)
//!         .cost(CostTable::new(1).route("/search", 5)),
//! )
//! .unwrap();
//! let app = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) }));
//!
//! let get = |path: &str| Request::get(path).body(()).unwrap();
//! let res = app.clone().oneshot(get("/search?q=a")).await.unwrap();
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "5");
//! let res = app.clone().oneshot(get("/items")).await.unwrap();
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "4");
//! let res = app.clone().oneshot(get("/search?q=b")).await.unwrap();
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS); // 5 > 4 left
//! let res = app.clone().oneshot(get("/items")).await.unwrap();
//! assert_eq!(res.status(), StatusCode::OK); // a cheap request still fits
//! # }
//! ```
//!
//! A constant cost:
//!
//! ```
//! use tollgate::cost::{ConstantCost, Cost};
//! use tollgate::RequestView;
//!
//! let req = http::Request::get("/export").body(()).unwrap();
//! assert_eq!(ConstantCost(10).cost(&RequestView::new(&req)), 10);
//! assert_eq!(ConstantCost(10).max_cost(), Some(10));
//! ```
//!
//! Costs by route and method, and a closure:
//!
//! ```
//! use http::Method;
//! use tollgate::cost::{Cost, CostTable};
//! use tollgate::RequestView;
//!
//! let table = CostTable::new(1).route("/search", 5).method(Method::POST, 3);
//! let batch = |req: &RequestView<'_>| {
//!     // `?n=` items per request, between 1 and 100.
//!     req.uri()
//!         .query()
//!         .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("n=")))
//!         .and_then(|n| n.parse::<u64>().ok())
//!         .unwrap_or(1)
//!         .clamp(1, 100)
//! };
//!
//! let req = http::Request::get("/search?n=20").body(()).unwrap();
//! let view = RequestView::new(&req);
//! assert_eq!(table.cost(&view), 5);
//! assert_eq!(batch.cost(&view), 20);
//! assert_eq!(table.max_cost(), Some(5));
//! ```

mod constant;
mod cost_fn;
mod table;

pub use constant::ConstantCost;
pub use cost_fn::Cost;
pub use table::CostTable;
