//! [`RateLimitLayerBuilder`]: configures and validates a [`RateLimitLayer`].

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::audit::{AuditEvent, AuditFn};
use super::layer::RateLimitLayer;
use super::limit::overrides::OverrideTable;
use super::limit::{CompiledLimit, Limit};
use super::shared::Shared;
use super::snapshot::Snapshot;
use crate::error::ConfigError;
use crate::headers::{policy_field, RateLimitHeaders, ResetFormat};
use crate::metrics::NearLimit;
use crate::request::RequestView;
use crate::response::{DefaultRejection, Rejection};
use crate::store::memory::MemoryBackend;
use crate::store::{Backend, LimitSpec, MAX_LIMITS};

/// Configures a [`RateLimitLayer`]; created by [`RateLimitLayer::builder`].
///
/// [`build`](Self::build) validates everything and says what to fix: no limit, more than
/// [`MAX_LIMITS`], duplicate or unprintable names, a missing key extractor, a quota the algorithm
/// cannot enforce, a cost function that can charge more than a limit holds, a missing-key status
/// that is not an error, and whatever the backend rejects.
///
/// ```
/// use tollgate::{Limit, Quota, RateLimitLayer};
///
/// let err = RateLimitLayer::builder().build().unwrap_err();
/// assert_eq!(err.field(), "limits");
///
/// let err = RateLimitLayer::builder()
///     .limit(Limit::new("burst", Quota::per_second(5)))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "limit.key");
/// assert!(err.message().contains("\"burst\""), "{err}");
/// ```
#[must_use = "call .build() to get a layer"]
pub struct RateLimitLayerBuilder<B = MemoryBackend> {
    limits: Vec<Limit>,
    backend: B,
    headers: RateLimitHeaders,
    rejection: Option<Box<dyn Rejection>>,
    skip: Option<Box<super::shared::SkipFn>>,
    audit: Option<Box<AuditFn>>,
    near_limit: Result<NearLimit, ConfigError>,
    max_waiting: usize,
    response_extensions: bool,
}

impl RateLimitLayerBuilder<MemoryBackend> {
    /// A builder with no limits, the in-memory backend, default headers and rejection.
    pub fn new() -> Self {
        Self {
            limits: Vec::new(),
            backend: MemoryBackend::new(),
            headers: RateLimitHeaders::new(),
            rejection: None,
            skip: None,
            audit: None,
            near_limit: Ok(NearLimit::DEFAULT),
            max_waiting: super::shaping::DEFAULT_MAX_WAITING,
            response_extensions: false,
        }
    }
}

impl Default for RateLimitLayerBuilder<MemoryBackend> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: fmt::Debug> fmt::Debug for RateLimitLayerBuilder<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("limits", &self.limits)
            .field("backend", &self.backend)
            .field("headers", &self.headers)
            .field("rejection", &self.rejection.as_ref().map(|_| ".."))
            .field("skip", &self.skip.is_some())
            .field("audit", &self.audit.is_some())
            .finish()
    }
}

impl<B> RateLimitLayerBuilder<B> {
    /// Adds a limit. Every limit is checked for every request (all-or-nothing: if one rejects,
    /// none is charged). At most [`MAX_LIMITS`] per layer.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// Where limiter state lives (default: [`MemoryBackend::new`]).
    pub fn backend<B2: Backend>(self, backend: B2) -> RateLimitLayerBuilder<B2> {
        RateLimitLayerBuilder {
            limits: self.limits,
            backend,
            headers: self.headers,
            rejection: self.rejection,
            skip: self.skip,
            audit: self.audit,
            near_limit: self.near_limit,
            max_waiting: self.max_waiting,
            response_extensions: self.response_extensions,
        }
    }

    /// The most requests that may wait for their turn in this layer at once, across keys and
    /// shaped limits (default [`DEFAULT_MAX_WAITING`](super::DEFAULT_MAX_WAITING)); a shaped
    /// request beyond it is refused as if it did not fit. 0 fails [`build`](Self::build). See
    /// [`Limit::shape`].
    pub fn max_waiting(mut self, max: usize) -> Self {
        self.max_waiting = max;
        self
    }

    /// The share of a limit under which an allowed request counts as near the limit, in the
    /// `tollgate_near_limit_total` metric (feature `metrics`; default 0.1: fewer than 10% left).
    /// A share outside 0..=1 fails [`build`](Self::build).
    pub fn near_limit_share(mut self, share: f64) -> Self {
        self.near_limit = NearLimit::new(share);
        self
    }

    /// Adds limits (e.g. a policy file's). See [`limit`](Self::limit).
    pub fn limits(mut self, limits: impl IntoIterator<Item = Limit>) -> Self {
        self.limits.extend(limits);
        self
    }

    /// Called with the audit event of every [reload](RateLimitLayer::reload) and
    /// [override](RateLimitLayer::set_override), besides the `tracing` event on target
    /// `tollgate::audit`.
    pub fn on_audit(mut self, sink: impl Fn(&AuditEvent) + Send + Sync + 'static) -> Self {
        self.audit = Some(Box::new(sink));
        self
    }

    /// Which rate-limit headers to write (default: [`RateLimitHeaders::new`]).
    pub fn headers(mut self, headers: RateLimitHeaders) -> Self {
        self.headers = headers;
        self
    }

    /// Whether to write `X-RateLimit-Limit`, `-Remaining`, `-Reset` (default: yes).
    pub fn x_ratelimit_headers(mut self, enabled: bool) -> Self {
        self.headers = self.headers.x_ratelimit(enabled);
        self
    }

    /// Whether to write the IETF draft-10 `RateLimit-Policy` and `RateLimit` fields (default: no).
    pub fn ietf_headers(mut self, enabled: bool) -> Self {
        self.headers = self.headers.ietf(enabled);
        self
    }

    /// How `X-RateLimit-Reset` is expressed (default: Unix seconds).
    pub fn reset_format(mut self, format: ResetFormat) -> Self {
        self.headers = self.headers.reset_format(format);
        self
    }

    /// Whether the responses this layer decides (allowed or refused) carry the reported
    /// [`Decision`](crate::Decision) in their extensions, for logging or metrics middleware
    /// further out (default: no).
    ///
    /// The request always carries it (handlers read it there). A response carries it anyway
    /// when this layer is nested in another rate-limit layer, which then merges the two
    /// decisions; otherwise it is off by default because a response's first extension costs
    /// three allocations, the largest single cost of an allowed request.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use tollgate::key::GlobalKey;
    /// use tollgate::{Decision, Limit, Quota, RateLimitLayer};
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .limit(Limit::new("burst", Quota::per_second(5)).key(GlobalKey))
    ///     .response_extensions(true)
    ///     .build()?;
    /// let svc = layer.layer(service_fn(|_req: Request<()>| async {
    ///     Ok::<_, Infallible>(Response::new(()))
    /// }));
    /// let res = svc.oneshot(Request::new(())).await?;
    /// assert_eq!(res.extensions().get::<Decision>().map(Decision::remaining), Some(4));
    /// # Ok(())
    /// # }
    /// ```
    pub fn response_extensions(mut self, enabled: bool) -> Self {
        self.response_extensions = enabled;
        self
    }

    /// The response for refused requests (default: [`DefaultRejection`]). Takes any
    /// [`Rejection`], including a closure `Fn(&Rejected<'_>) -> Response<RejectionBody>`.
    ///
    /// [`Rejected`]: crate::response::Rejected
    /// [`RejectionBody`]: crate::response::RejectionBody
    pub fn rejection(mut self, rejection: impl Rejection) -> Self {
        self.rejection = Some(Box::new(rejection));
        self
    }

    /// Exempts requests for which `predicate` returns `true` (health checks, internal callers):
    /// no limit is checked or charged and no rate-limit header is written.
    ///
    /// ```
    /// use tollgate::{RateLimitLayer, RequestView};
    ///
    /// let builder = RateLimitLayer::builder().skip(|req: &RequestView<'_>| req.uri().path() == "/health");
    /// # drop(builder);
    /// ```
    pub fn skip<F>(mut self, predicate: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> bool + Send + Sync + 'static,
    {
        self.skip = Some(Box::new(predicate));
        self
    }
}

impl<B: Backend> RateLimitLayerBuilder<B> {
    /// Validates the configuration and builds the layer and its store.
    pub fn build(self) -> Result<RateLimitLayer<B::Store>, ConfigError> {
        let near_limit = self.near_limit?;
        if self.max_waiting == 0 {
            return Err(ConfigError::new(
                "max_waiting",
                "a layer where no request may wait cannot shape; allow at least 1 (the default is 10000), or drop .shape(..) from its limits",
            ));
        }
        let (limits, specs) = compile_limits(&self.limits)?;
        let store = self.backend.build(&specs)?;
        if self.headers.reset() == ResetFormat::UnixSeconds {
            crate::clock::warm_wall_now();
        }
        let policy_header = policy_field(limits.iter().map(|l| (l.name.as_str(), &l.quota)));
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                current: ArcSwap::from_pointee(Snapshot {
                    limits,
                    store,
                    policy_header,
                }),
                headers: self.headers,
                rejection: self
                    .rejection
                    .unwrap_or_else(|| Box::new(DefaultRejection::new())),
                skip: self.skip,
                overrides: OverrideTable::default(),
                audit: self.audit,
                near_limit,
                reloading: std::sync::Mutex::new(0),
                waiting: super::shaping::Waiting::new(self.max_waiting),
                response_extensions: self.response_extensions,
            }),
        })
    }
}

/// Validates `limits` as a layer's set: at least one, at most [`MAX_LIMITS`], unique names.
pub(crate) fn compile_limits(
    limits: &[Limit],
) -> Result<(Box<[CompiledLimit]>, Vec<LimitSpec>), ConfigError> {
    if limits.is_empty() {
        return Err(ConfigError::new(
            "limits",
            "no limit configured; add one, e.g. .limit(Limit::new(\"per-ip\", Quota::per_second(10)).key(PeerIp::new()))",
        ));
    }
    if limits.len() > MAX_LIMITS {
        return Err(ConfigError::new(
            "limits",
            format!(
                "{} limits configured but a layer holds at most {MAX_LIMITS}; stack a second RateLimitLayer for the rest",
                limits.len()
            ),
        ));
    }
    for (i, limit) in limits.iter().enumerate() {
        if limits[..i].iter().any(|l| l.name() == limit.name()) {
            return Err(ConfigError::new(
                "limit.name",
                format!(
                    "two limits are named \"{}\"; names identify limits in headers and stores, give each a distinct one",
                    limit.name()
                ),
            ));
        }
    }
    let compiled = limits
        .iter()
        .map(Limit::compile)
        .collect::<Result<Box<[_]>, _>>()?;
    let specs: Vec<LimitSpec> = limits.iter().map(Limit::spec).collect();
    Ok((compiled, specs))
}
