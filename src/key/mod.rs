//! Key extractors: who a request is counted against.
//!
//! A [`KeyExtractor`] turns a [`RequestView`](crate::RequestView) into a [`Key`]. Keys borrow
//! from the request where they can, so extracting a header or a route costs no allocation.
//!
//! | extractor | key | use it when |
//! |---|---|---|
//! | [`PeerIp`] | the TCP peer's address (IPv6 grouped by `/64`) | clients connect directly |
//! | [`ClientIp`] | the client's address reported by **trusted** proxies | behind a load balancer |
//! | [`HeaderKey`] | a header's value (`x-api-key`) | API keys checked before the limiter |
//! | [`Principal`] | a typed value an auth layer put in the extensions | per user / tenant |
//! | [`RouteKey`] | another key, per method and matched route | per-endpoint budgets |
//! | [`GlobalKey`] | one key for all | a ceiling protecting a backend |
//! | [`FirstOf`], [`KeyExtractor::or`] | the first extractor that has a key | users, else IPs |
//! | a `fn`, or a closure in [`key_fn`] | anything | see [`KeyExtractor`] |
//!
//! When no key can be extracted the extractor returns a [`KeyError`] (never panics): either the
//! request lacks what the key needs, or, for [misconfigurations](KeyError::is_misconfiguration),
//! the server was set up so that no request can have one. The layer decides what such a request
//! gets.
//!
//! # Examples
//!
//! Per client address, behind a proxy at `10.0.0.0/8`:
//!
//! ```
//! use std::net::SocketAddr;
//! use tollgate::key::{ClientIp, KeyExtractor};
//! use tollgate::RequestView;
//!
//! let key = ClientIp::trusting(["10.0.0.0/8"]).unwrap();
//!
//! let mut req = http::Request::get("/")
//!     .header("x-forwarded-for", "198.51.100.1, 203.0.113.9")
//!     .body(())
//!     .unwrap();
//! req.extensions_mut().insert("10.0.0.2:443".parse::<SocketAddr>().unwrap());
//! assert_eq!(key.extract(&RequestView::new(&req)).unwrap().to_string(), "ip:203.0.113.9");
//! ```
//!
//! Per signed-in user and endpoint, anonymous callers per address:
//!
//! ```
//! use std::net::SocketAddr;
//! use tollgate::key::{Key, KeyExtractor, PeerIp, Principal, RouteKey};
//! use tollgate::RequestView;
//!
//! #[derive(Clone)]
//! struct User {
//!     id: u64,
//! }
//!
//! let key = RouteKey::new(Principal::new(|u: &User| Key::int(u.id)).or(PeerIp::new()))
//!     .unmatched_as("other");
//!
//! let mut req = http::Request::get("/search").body(()).unwrap();
//! req.extensions_mut().insert("192.0.2.7:5000".parse::<SocketAddr>().unwrap());
//! assert_eq!(key.extract(&RequestView::new(&req)).unwrap().to_string(), "GET other|ip:192.0.2.7");
//!
//! req.extensions_mut().insert(User { id: 42 });
//! assert_eq!(key.extract(&RequestView::new(&req)).unwrap().to_string(), "GET other|int:42");
//! ```
//!
//! A function of your own:
//!
//! ```
//! use tollgate::key::{Key, KeyError, KeyExtractor};
//! use tollgate::RequestView;
//!
//! /// Per `?tenant=` query parameter (only sensible if an earlier layer validated it).
//! fn by_tenant<'r>(req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
//!     req.uri()
//!         .query()
//!         .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("tenant=")))
//!         .map(Key::string)
//!         .ok_or_else(|| KeyError::new("missing tenant query parameter"))
//! }
//!
//! let req = http::Request::get("/items?tenant=acme&page=2").body(()).unwrap();
//! assert_eq!(by_tenant.extract(&RequestView::new(&req)).unwrap().to_string(), "b:acme");
//! ```

mod client_ip;
mod error;
mod extractor;
mod first_of;
mod forwarded;
mod global;
mod header;
mod ip;
mod peer;
mod principal;
mod route;
mod value;

pub use client_ip::{ClientIp, ForwardedHeader, X_FORWARDED_FOR, X_REAL_IP};
pub use error::KeyError;
pub use extractor::{key_fn, KeyExtractor};
pub use first_of::FirstOf;
pub use global::GlobalKey;
pub use header::HeaderKey;
pub use ip::Cidr;
pub use peer::PeerIp;
pub use principal::Principal;
pub use route::RouteKey;
pub use value::{Key, KeyValue};

pub(crate) use route::matched_route;
