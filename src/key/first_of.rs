//! [`FirstOf`]: the first of two extractors that has a key.

use super::{Key, KeyError, KeyExtractor};
use crate::request::RequestView;

/// The key of `first`, or, when `first` has none, the key of `second`.
///
/// Built with [`FirstOf::new`] or [`KeyExtractor::or`]. `second` is tried only when the *request*
/// lacks what `first` needs; when `first` reports a misconfiguration
/// ([`KeyError::is_misconfiguration`], e.g. no peer address at all), that error is returned rather
/// than hidden behind the fallback. When neither has a key, the error is `second`'s. The two kinds of key never collide: an id, an API key and an
/// address are encoded differently (see [`Key::write_canonical`]).
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{HeaderKey, KeyExtractor, PeerIp};
/// use tollgate::RequestView;
///
/// let key = HeaderKey::new("x-api-key").unwrap().or(PeerIp::new());
///
/// let mut req = http::Request::get("/").header("x-api-key", "k1").body(()).unwrap();
/// req.extensions_mut().insert("198.51.100.4:5000".parse::<SocketAddr>().unwrap());
/// assert_eq!(key.extract(&RequestView::new(&req)).unwrap().to_string(), "b:k1");
///
/// req.headers_mut().remove("x-api-key");
/// assert_eq!(key.extract(&RequestView::new(&req)).unwrap().to_string(), "ip:198.51.100.4");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct FirstOf<A, B> {
    first: A,
    second: B,
}

impl<A, B> FirstOf<A, B> {
    /// `first`, else `second`.
    pub const fn new(first: A, second: B) -> Self {
        Self { first, second }
    }

    /// The extractor tried first.
    pub fn first(&self) -> &A {
        &self.first
    }

    /// The extractor tried when the first has no key.
    pub fn second(&self) -> &B {
        &self.second
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for FirstOf<A, B> {
    #[inline]
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        match self.first.extract(req) {
            Ok(key) => Ok(key),
            Err(err) if err.is_misconfiguration() => Err(err),
            Err(_) => self.second.extract(req),
        }
    }
}
