//! [`RateLimitLayer`]: the validated configuration, shared by every service it wraps.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use arc_swap::ArcSwap;

use super::audit::AuditFn;
use super::builder::RateLimitLayerBuilder;
use super::limit::{CompiledLimit, Limit};
use super::overrides::OverrideTable;
use super::service::RateLimit;
use crate::error::ConfigError;
use crate::headers::RateLimitHeaders;
use crate::metrics::NearLimit;
use crate::request::RequestView;
use crate::response::Rejection;
use crate::store::memory::{MemoryBackend, MemoryStore};

pub(crate) type SkipFn = dyn Fn(&RequestView<'_>) -> bool + Send + Sync;

/// The limits and the store deciding them: swapped as a whole by a reload.
pub(crate) struct Snapshot<St> {
    pub(crate) limits: Box<[CompiledLimit]>,
    pub(crate) store: St,
    /// `RateLimit-Policy` for a request checked against every limit (rendered once).
    pub(crate) policy_header: Option<http::HeaderValue>,
}

/// Everything a [`RateLimit`] service needs, behind one `Arc`.
pub(crate) struct Shared<St> {
    /// The current limits and store; a reload swaps it (lock-free reads on the request path).
    pub(crate) current: ArcSwap<Snapshot<St>>,
    pub(crate) headers: RateLimitHeaders,
    pub(crate) rejection: Box<dyn Rejection>,
    pub(crate) skip: Option<Box<SkipFn>>,
    /// Per-key overrides, kept across reloads.
    pub(crate) overrides: OverrideTable,
    /// Called with every reload's and override's audit event.
    pub(crate) audit: Option<Box<AuditFn>>,
    /// Which allowed decisions count as near the limit (metrics).
    pub(crate) near_limit: NearLimit,
    /// Serialises reloads (never taken on the request path).
    pub(crate) reloading: std::sync::Mutex<u64>,
    /// Shaping: the bound on requests waiting for their turn, across keys.
    pub(crate) waiting: super::shaping::Waiting,
    /// Whether allowed responses carry the reported decision in their extensions.
    pub(crate) response_extensions: bool,
}

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
