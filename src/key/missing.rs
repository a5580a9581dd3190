//! [`MissingKey`]: what a limit does with a request that has no key.

use http::StatusCode;

use super::KeyError;

/// What a limit does with a request for which its key extractor finds no key.
///
/// A [`KeyError`] says whose fault the missing key is, and the default answers accordingly:
///
/// | | request lacks what the key needs ([`KeyError::new`]) | server misconfigured ([`KeyError::misconfigured`]) |
/// |---|---|---|
/// | [`Reject`](MissingKey::Reject) (default) | `400 Bad Request`, body names the limit and the reason | `500 Internal Server Error`, reason logged, not sent |
/// | [`RejectWith { status }`](MissingKey::RejectWith) | `status` (e.g. `401` for a missing API key) | `500` |
/// | [`Skip`](MissingKey::Skip) | this limit does not apply; other limits still do | same, logged as a warning |
///
/// Refusing is the default because letting such requests through would silently switch rate
/// limiting off for them (a client could drop its API key header to escape its limit), and a
/// misconfiguration (a server run without connection info, a key read outside the router) must
/// be loud: it fails the first request in testing. Choose [`Skip`](MissingKey::Skip) for limits
/// that only apply to some requests (a per-user limit, with anonymous traffic limited by another
/// limit of the same layer).
///
/// ```
/// use tollgate::MissingKey;
///
/// assert_eq!(MissingKey::default(), MissingKey::Reject);
/// ```
///
/// [`KeyError`]: crate::key::KeyError
/// [`KeyError::new`]: crate::key::KeyError::new
/// [`KeyError::misconfigured`]: crate::key::KeyError::misconfigured
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Refuse: `400` when the request lacks what the key needs, `500` when the server is
    /// misconfigured. The default.
    #[default]
    Reject,
    /// Refuse with `status` (a 4xx or 5xx) when the request lacks what the key needs; `500` when
    /// the server is misconfigured.
    RejectWith {
        /// The status to answer a request without a key with.
        status: StatusCode,
    },
    /// Do not apply this limit to the request; other limits of the layer still apply.
    Skip,
}

impl MissingKey {
    /// `RejectWith { status }`.
    pub const fn reject_with(status: StatusCode) -> Self {
        MissingKey::RejectWith { status }
    }

    /// The status to refuse with for `error`, or `None` to skip the limit.
    pub fn status_for(&self, error: &KeyError) -> Option<StatusCode> {
        if error.is_misconfiguration() {
            return match self {
                MissingKey::Skip => None,
                _ => Some(StatusCode::INTERNAL_SERVER_ERROR),
            };
        }
        match self {
            MissingKey::Reject => Some(StatusCode::BAD_REQUEST),
            MissingKey::RejectWith { status } => Some(*status),
            MissingKey::Skip => None,
        }
    }
}
