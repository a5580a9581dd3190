//! [`RateLimitLayer`]: the validated configuration, shared by every service it wraps.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::builder::RateLimitLayerBuilder;
use super::limit::Limit;
use super::service::RateLimit;
use super::shared::Shared;
use super::snapshot::Snapshot;
use crate::error::ConfigError;
use crate::headers::RateLimitHeaders;
use crate::store::memory::{MemoryBackend, MemoryStore};

/// The store of a [`RateLimitLayer`], as of the call: it derefs to the store. After a
/// [`reload`](RateLimitLayer::reload) the layer decides with a store that shares this one's
/// state; hold this only briefly.
pub struct StoreRef<St> {
    snapshot: Arc<Snapshot<St>>,
}

impl<St> std::ops::Deref for StoreRef<St> {
    type Target = St;

    fn deref(&self) -> &St {
        &self.snapshot.store
    }
}

impl<St: fmt::Debug> fmt::Debug for StoreRef<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.snapshot.store.fmt(f)
    }
}

/// Applies rate limits to every request of the services it wraps. See the
/// [module docs](crate::rate_limit) for examples.
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
    /// The store deciding this layer's requests (to inspect it); it derefs to `St`.
    pub fn store(&self) -> StoreRef<St> {
        StoreRef {
            snapshot: self.shared.current.load_full(),
        }
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
            .field("limits", &self.shared.current.load().limits)
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
