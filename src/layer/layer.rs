//! [`RateLimitLayer`]: the validated configuration, shared by every service it wraps.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::builder::RateLimitLayerBuilder;
use super::limit::{CompiledLimit, Limit};
use super::service::RateLimit;
use crate::error::ConfigError;
use crate::headers::RateLimitHeaders;
use crate::request::RequestView;
use crate::response::Rejection;
use crate::store::memory::{MemoryBackend, MemoryStore};

pub(crate) type SkipFn = dyn Fn(&RequestView<'_>) -> bool + Send + Sync;

/// Everything a [`RateLimit`] service needs, behind one `Arc`.
pub(crate) struct Shared<St> {
    pub(crate) limits: Box<[CompiledLimit]>,
    pub(crate) store: St,
    pub(crate) headers: RateLimitHeaders,
    pub(crate) rejection: Box<dyn Rejection>,
    pub(crate) skip: Option<Box<SkipFn>>,
    /// `RateLimit-Policy` for a request checked against every limit (rendered once).
    pub(crate) policy_header: Option<http::HeaderValue>,
}

/// Applies rate limits to every request of the services it wraps. See the
/// [module docs](crate::layer) for examples.
///
/// Built by [`RateLimitLayer::builder`], which validates every limit. Cloning is cheap (an
/// `Arc`), and every clone shares the same store: one layer applied to several routes counts
/// their requests together; build one layer per route for separate budgets.
///
/// `St` is the store: [`MemoryStore`] unless another backend was chosen with
/// [`RateLimitLayerBuilder::backend`].
pub struct RateLimitLayer<St = MemoryStore> {
    pub(crate) shared: Arc<Shared<St>>,
}

impl RateLimitLayer {
    /// Starts configuring a layer (in-memory store, default headers and rejection).
    pub fn builder() -> RateLimitLayerBuilder<MemoryBackend> {
        RateLimitLayerBuilder::new()
    }

    /// A layer with one limit and every default: shorthand for
    /// `RateLimitLayer::builder().limit(limit).build()`.
    pub fn new(limit: Limit) -> Result<Self, ConfigError> {
        Self::builder().limit(limit).build()
    }
}

impl<St> RateLimitLayer<St> {
    /// The store deciding this layer's requests (to inspect or share it).
    pub fn store(&self) -> &St {
        &self.shared.store
    }

    /// The header configuration.
    pub fn headers(&self) -> RateLimitHeaders {
        self.shared.headers
    }
}

impl<St> Clone for RateLimitLayer<St> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St> fmt::Debug for RateLimitLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limits", &self.shared.limits)
            .field("headers", &self.shared.headers)
            .field("skip", &self.shared.skip.is_some())
            .finish_non_exhaustive()
    }
}

impl<S, St> Layer<S> for RateLimitLayer<St> {
    type Service = RateLimit<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self)
    }
}
