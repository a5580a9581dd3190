//! The [`KeyExtractor`] trait and its blanket implementations.

use super::{FirstOf, Key, KeyError};
use crate::request::RequestView;

/// Extracts the [`Key`] a request is counted against.
///
/// Implemented by the extractors of this module, by `fn` items and by closures
/// `Fn(&RequestView<'r>) -> Result<Key<'r>, KeyError>` (wrap a closure in [`key_fn`] when it is not
/// passed straight to a function that asks for that signature), so a one-off key needs no new
/// type:
///
/// ```
/// use tollgate::key::{key_fn, Key, KeyError, KeyExtractor};
/// use tollgate::RequestView;
///
/// // Count each tenant separately, read from the host name: "acme.example.com" -> "acme".
/// let by_tenant = key_fn(|req| {
///     let host = req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok());
///     match host.and_then(|h| h.split_once('.')) {
///         Some((tenant, _)) if !tenant.is_empty() => Ok(Key::string(tenant)),
///         _ => Err(KeyError::new("no tenant in the host name")),
///     }
/// });
///
/// let req = http::Request::get("/").header("host", "acme.example.com").body(()).unwrap();
/// let key = by_tenant.extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(key.to_string(), "b:acme");
/// ```
///
/// Implementations must not panic, whatever the request holds: a request that lacks what the key
/// needs is a [`KeyError`].
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key for `req`, or why there is none.
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError>;

    /// This extractor, or `fallback` when this one has no key: see [`FirstOf`].
    ///
    /// ```
    /// # #[derive(Clone)] struct User { id: u64 }
    /// use tollgate::key::{Key, KeyExtractor, PeerIp, Principal};
    ///
    /// // Signed-in users by id, everyone else by IP address.
    /// let key = Principal::new(|user: &User| Key::int(user.id)).or(PeerIp::new());
    /// # let _ = key;
    /// ```
    fn or<E>(self, fallback: E) -> FirstOf<Self, E>
    where
        Self: Sized,
        E: KeyExtractor,
    {
        FirstOf::new(self, fallback)
    }
}

impl<F> KeyExtractor for F
where
    F: for<'r> Fn(&RequestView<'r>) -> Result<Key<'r>, KeyError> + Send + Sync + 'static,
{
    #[inline]
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        self(req)
    }
}

impl KeyExtractor for Box<dyn KeyExtractor> {
    #[inline]
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        (**self).extract(req)
    }
}

/// Returns `f` unchanged, typed as a key extractor.
///
/// A closure's signature is inferred from the call it is passed to. Passed to a generic
/// `K: KeyExtractor` parameter, or bound to a `let`, a closure that returns a key borrowing from
/// the request does not get the signature the blanket implementation needs (its return type
/// cannot name the request's lifetime), and the compiler reports that the closure does not
/// implement [`KeyExtractor`]. Wrapping it in `key_fn` fixes the signature; a `fn` item needs no
/// wrapper.
///
/// ```
/// use tollgate::key::{key_fn, Key, KeyError, KeyExtractor};
/// use tollgate::RequestView;
///
/// // Per Host header.
/// let by_host = key_fn(|req| {
///     req.headers()
///         .get(http::header::HOST)
///         .map(|host| Key::bytes(host.as_bytes()))
///         .ok_or_else(|| KeyError::new("missing host header"))
/// });
///
/// let req = http::Request::get("/").header("host", "api.example.com").body(()).unwrap();
/// assert_eq!(by_host.extract(&RequestView::new(&req)).unwrap().to_string(), "b:api.example.com");
/// ```
pub fn key_fn<F>(f: F) -> F
where
    F: for<'r> Fn(&RequestView<'r>) -> Result<Key<'r>, KeyError> + Send + Sync + 'static,
{
    f
}
