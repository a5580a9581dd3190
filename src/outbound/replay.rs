//! Whether a refused request may be sent again, and the copy to send.

use http::{Method, Request};

/// Makes the copy of a request to send again when the upstream refuses it, or says it must not
/// be replayed (`None`). Called before each attempt that may be followed by another, so the
/// original is still whole.
///
/// [`Idempotent`] (the default) copies requests with a cloneable body and an idempotent method;
/// [`NoReplay`] never retries; a closure `Fn(&Request<B>) -> Option<Request<B>>` decides itself.
pub trait Replay<B>: Send + Sync + 'static {
    /// A copy of `request` to send if this attempt is refused, or `None` to return the
    /// refusal as it is.
    fn replay(&self, request: &Request<B>) -> Option<Request<B>>;
}

/// The default [`Replay`]: retries requests whose body is `Clone` (`Full<Bytes>`, `String`,
/// `Bytes`, `()`, `Empty`) and whose method is idempotent (RFC 9110 §9.2.2: `GET`, `HEAD`,
/// `OPTIONS`, `PUT`, `DELETE`, `TRACE`), or one opted in with [`also`](Self::also).
///
/// ```
/// use http::{Method, Request};
/// use tollgate::outbound::{Idempotent, Replay};
///
/// let get = Request::get("http://api/items").body(String::new()).unwrap();
/// let post = Request::post("http://api/items").body("{}".to_owned()).unwrap();
/// assert!(Idempotent::new().replay(&get).is_some());
/// assert!(Idempotent::new().replay(&post).is_none());
/// // This API dedupes POSTs by an idempotency key: retrying them is safe.
/// assert!(Idempotent::new().also(Method::POST).replay(&post).is_some());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Idempotent {
    also: Vec<Method>,
}

impl Idempotent {
    /// The idempotent methods only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also retries `method` (say `POST` to an API that dedupes by an idempotency key).
    #[must_use]
    pub fn also(mut self, method: Method) -> Self {
        if !self.also.contains(&method) {
            self.also.push(method);
        }
        self
    }

    /// Whether requests with `method` are retried.
    pub fn allows(&self, method: &Method) -> bool {
        is_idempotent(method) || self.also.contains(method)
    }
}

impl<B: Clone + Send + 'static> Replay<B> for Idempotent {
    fn replay(&self, request: &Request<B>) -> Option<Request<B>> {
        self.allows(request.method())
            .then(|| clone_request(request))
    }
}

/// A [`Replay`] that never retries: every refusal is returned as it is (after pausing the
/// upstream). For bodies that cannot be cloned, such as hyper's `Incoming`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoReplay;

impl<B> Replay<B> for NoReplay {
    fn replay(&self, _: &Request<B>) -> Option<Request<B>> {
        None
    }
}

impl<B, F> Replay<B> for F
where
    F: Fn(&Request<B>) -> Option<Request<B>> + Send + Sync + 'static,
{
    fn replay(&self, request: &Request<B>) -> Option<Request<B>> {
        self(request)
    }
}

/// Whether RFC 9110 §9.2.2 calls `method` idempotent.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

/// A copy of `request`: method, URI, version, headers, extensions and body.
pub fn clone_request<B: Clone>(request: &Request<B>) -> Request<B> {
    let mut copy = Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    copy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotent_methods() {
        for m in [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::PUT,
            Method::DELETE,
            Method::TRACE,
        ] {
            assert!(Idempotent::new().allows(&m), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!Idempotent::new().allows(&m), "{m}");
        }
        assert!(Idempotent::new().also(Method::PATCH).allows(&Method::PATCH));
    }

    #[test]
    fn copies_everything() {
        #[derive(Clone, Debug, PartialEq)]
        struct Tag(u8);
        let mut req = Request::put("http://a/b?c")
            .header("x-id", "7")
            .version(http::Version::HTTP_2)
            .body("body".to_owned())
            .unwrap();
        req.extensions_mut().insert(Tag(3));
        let copy = Idempotent::new().replay(&req).unwrap();
        assert_eq!(copy.method(), Method::PUT);
        assert_eq!(copy.uri(), "http://a/b?c");
        assert_eq!(copy.version(), http::Version::HTTP_2);
        assert_eq!(copy.headers()["x-id"], "7");
        assert_eq!(copy.extensions().get::<Tag>(), Some(&Tag(3)));
        assert_eq!(copy.body(), "body");
        assert!(NoReplay.replay(&req).is_none());
    }
}
