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
///   server was not started with connection info, no matched route because the layer sits outside
///   the router. No client can fix this (a `5xx`), and it shows up on the first request in testing.
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
/// let err = PeerIp::new().extract(&view).unwrap_err();
/// assert!(err.is_misconfiguration(), "{err}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    reason: Cow<'static, str>,
    misconfiguration: bool,
}

impl KeyError {
    /// A key error caused by the request, with a reason a client can read
    /// (`"missing x-api-key header"`).
    pub fn new(reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            reason: reason.into(),
            misconfiguration: false,
        }
    }

    /// A key error caused by the server's setup rather than the request (no peer address, no
    /// matched route), with a reason that says what to fix.
    pub fn misconfigured(reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            reason: reason.into(),
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
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for KeyError {}
