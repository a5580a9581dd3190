//! Rate limiting as Tower middleware.
#![cfg_attr(docsrs, feature(doc_auto_cfg))]
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

pub mod algorithm;
pub mod clock;
pub mod cost;
mod decision;
mod error;
pub mod headers;
pub mod key;
pub mod layer;
pub mod quota;
mod request;
pub mod response;
pub mod store;

pub use decision::{Decision, PolicyName};
pub use error::{ConfigError, StoreError, StoreErrorKind};
pub use layer::{Limit, MissingKey, RateLimit, RateLimitLayer};
pub use quota::Quota;
pub use request::RequestView;
