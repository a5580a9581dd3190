//! [`KeyError`]: why no key could be extracted.

use std::borrow::Cow;
use std::fmt;

/// Why no key could be extracted.
///
/// Two kinds exist, so the layer can answer each deliberately:
///
/// - **the request lacks what the key needs** ([`KeyError::new`]): no `x-api-key` header, an
///   over-long one, no authenticated principal. The client can fix this (a `4xx`).
/// - **the server is misconfigured** ([`KeyError::misconfigured`]): no peer address because the
///   server was not started with connection info (or tollgate's `axum` feature is off), no
///   matched route because the layer sits outside the router. No client can fix this: the
///   layer answers `500 Internal Server Error` (see [`MissingKey`](super::MissingKey)) **with
///   the reason in the body**, so the fix shows on the first request in testing, without a
///   `tracing` subscriber.
///
/// ```
/// use tollgate::key::{HeaderKey, KeyExtractor, PeerIp};
/// use tollgate::RequestView;
///
/// let req = http::Request::get("/").body(()).unwrap();
/// let view = RequestView::new(&req);
///
/// let err = HeaderKey::new("x-api-key").unwrap().extract(&view).unwrap_err();
/// assert_eq!(err.reason(), "missing x-api-key header");
/// assert!(!err.is_misconfiguration());
///
/// // No peer address: the reason names the fix (which feature, which serving call).
/// let err = PeerIp::new().extract(&view).unwrap_err();
/// assert!(err.is_misconfiguration(), "{err}");
/// assert!(err.reason().contains("into_make_service_with_connect_info"), "{err}");
/// ```
///
/// A custom extractor gives its own fix:
///
/// ```
/// use tollgate::key::{Key, KeyError, KeyExtractor};
/// use tollgate::RequestView;
///
/// #[derive(Clone)]
/// struct Tenant(u64);
///
/// fn by_tenant<'r>(req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
///     match req.extensions().get::<Tenant>() {
///         Some(tenant) => Ok(Key::int(tenant.0)),
///         None => Err(KeyError::misconfigured(
///             "no Tenant in the request extensions: put the tenant layer before the rate limiter",
///         )),
///     }
/// }
///
/// let req = http::Request::get("/").body(()).unwrap();
/// let err = by_tenant.extract(&RequestView::new(&req)).unwrap_err();
/// assert!(err.is_misconfiguration());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    reason: Cow<'static, str>,
    misconfiguration: bool,
}

impl KeyError {
    /// A key error caused by the request, with a reason a client can read
    /// (`"missing x-api-key header"`).
    ///
    /// The default rejection sends the reason in a `4xx` body (not in a `5xx` one): name what
    /// is missing, never echo a header's value.
    pub fn new(reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            reason: reason.into(),
            misconfiguration: false,
        }
    }

    /// A key error caused by the server's setup rather than the request (no peer address, no
    /// matched route), with a reason that says what is missing and how to fix it.
    ///
    /// The default rejection sends the reason in the body of its `500` (problem+json `detail`,
    /// gRPC status message) and, when no `tracing` subscriber is installed, prints it once to
    /// stderr: a developer who serves the app wrongly reads the fix in the first response. It is
    /// a `&'static str` because it describes the setup, which no request changes, and so that
    /// it cannot carry a header value, a key or anything else from a request.
    pub fn misconfigured(reason: &'static str) -> Self {
        Self {
            reason: Cow::Borrowed(reason),
            misconfiguration: true,
        }
    }

    /// The reason.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether the server's setup, not the request, is at fault (see [`KeyError::misconfigured`]).
    pub fn is_misconfiguration(&self) -> bool {
        self.misconfiguration
    }

    /// The reason of a misconfiguration (what to fix), which responses carry; `None` for an
    /// error caused by the request.
    pub(crate) fn fix(&self) -> Option<&'static str> {
        match (&self.reason, self.misconfiguration) {
            (Cow::Borrowed(reason), true) => Some(reason),
            _ => None,
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for KeyError {}
