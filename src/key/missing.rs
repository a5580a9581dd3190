//! [`MissingKey`]: what a limit does with a request that has no key.

use http::StatusCode;

use super::KeyError;

/// What a limit does with a request for which its key extractor finds no key.
///
/// A [`KeyError`] says whose fault the missing key is, and the default answers accordingly:
///
/// | | request lacks what the key needs ([`KeyError::new`]) | server misconfigured ([`KeyError::misconfigured`]) |
/// |---|---|---|
/// | [`Reject`](MissingKey::Reject) (default) | `400 Bad Request`, body names the limit and the reason | `500 Internal Server Error`, body names the limit and the fix |
/// | [`RejectWith { status }`](MissingKey::RejectWith) | `status` (e.g. `401` for a missing API key) | `500`, as above |
/// | [`Skip`](MissingKey::Skip) | this limit does not apply; other limits still do | same, with a warning |
///
/// Refusing is the default because letting such requests through would silently switch rate
/// limiting off for them (a client could drop its API key header to escape its limit), and a
/// misconfiguration must be loud: it fails the first request in testing.
///
/// **A misconfiguration is never silent.** Forgetting tollgate's `axum` feature (so
/// [`PeerIp`](super::PeerIp) cannot read axum's `ConnectInfo`), serving with
/// `axum::serve(listener, app)` instead of
/// `app.into_make_service_with_connect_info::<SocketAddr>()`, or keying by route outside the
/// router: the `500`'s problem+json `detail` (a gRPC call's status message) says which limit
/// failed and how to fix it, in the words of the extractor's [`KeyError::misconfigured`]; a
/// `tracing` warning is logged on every such request, and when no `tracing` subscriber is
/// installed, the same is printed once to stderr (once per process for each limit and reason,
/// up to 16 of them). The body carries only that fixed reason, never a header value or a key.
/// This is axum's choice for a missing extension (a `500` whose body says "Perhaps you forgot
/// to add it?"), where tower_governor answers a bare "Unable To Extract Key!".
///
/// Choose [`Skip`](MissingKey::Skip) for limits that only apply to some requests (a per-user
/// limit, with anonymous traffic limited by another limit of the same layer).
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
