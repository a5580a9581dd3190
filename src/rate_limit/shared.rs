//! [`Shared`]: everything a [`RateLimit`](super::RateLimit) service needs, behind one `Arc`.

use arc_swap::ArcSwap;

use super::audit::AuditFn;
use super::limit::overrides::OverrideTable;
use super::shaping::Waiting;
use super::snapshot::Snapshot;
use crate::headers::RateLimitHeaders;
use crate::metrics::NearLimit;
use crate::request::RequestView;
use crate::response::Rejection;

pub(crate) type SkipFn = dyn Fn(&RequestView<'_>) -> bool + Send + Sync;

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
    pub(crate) waiting: Waiting,
    /// Whether allowed responses carry the reported decision in their extensions.
    pub(crate) response_extensions: bool,
}
