//! The rate-limiting middleware: [`RateLimitLayer`], [`RateLimit`] and their parts.
//!
//! TODO(layer): module examples.

mod body;
mod builder;
mod future;
#[allow(clippy::module_inception)]
mod layer;
mod limit;
mod service;

pub use body::ResponseBody;
pub use builder::RateLimitLayerBuilder;
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use limit::{Limit, MissingKey};
pub use service::RateLimit;

#[cfg(test)]
mod test_store;
#[cfg(test)]
mod tests;
