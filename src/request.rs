//! [`RequestView`]: the parts of a request that key extractors and cost functions may read.

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

/// A borrowed view of a request's head, whatever its body type.
///
/// Key extractors and cost functions take this instead of `&Request<B>`, so they are plain
/// (object-safe) traits that work for axum, tonic and hyper bodies alike. Building one is free:
/// it only copies references.
///
/// ```
/// use tollgate::RequestView;
///
/// let req = http::Request::get("/items?page=2").header("x-api-key", "k1").body(()).unwrap();
/// let view = RequestView::new(&req);
/// assert_eq!(view.uri().path(), "/items");
/// assert_eq!(view.headers()["x-api-key"], "k1");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestView<'a> {
    /// Views `req`.
    #[inline]
    pub fn new<B>(req: &'a Request<B>) -> Self {
        Self {
            method: req.method(),
            uri: req.uri(),
            version: req.version(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }

    /// Views a request head.
    #[inline]
    pub fn from_parts(parts: &'a http::request::Parts) -> Self {
        Self {
            method: &parts.method,
            uri: &parts.uri,
            version: parts.version,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }

    /// The request method.
    #[inline]
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request URI.
    #[inline]
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The HTTP version.
    #[inline]
    pub fn version(&self) -> Version {
        self.version
    }

    /// The request headers.
    #[inline]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request extensions (connection info, authenticated principal, matched route).
    #[inline]
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// Whether this is a gRPC call (`content-type: application/grpc` or `application/grpc+...`,
    /// not gRPC-Web).
    ///
    /// ```
    /// use tollgate::RequestView;
    ///
    /// let req = http::Request::post("/pkg.Svc/Call").header("content-type", "application/grpc+proto").body(()).unwrap();
    /// assert!(RequestView::new(&req).is_grpc());
    /// let req = http::Request::post("/").header("content-type", "application/grpc-web").body(()).unwrap();
    /// assert!(!RequestView::new(&req).is_grpc());
    /// ```
    pub fn is_grpc(&self) -> bool {
        let Some(ct) = self.headers().get(http::header::CONTENT_TYPE) else {
            return false;
        };
        let ct = ct.as_bytes();
        let prefix = b"application/grpc";
        ct.len() >= prefix.len()
            && ct[..prefix.len()].eq_ignore_ascii_case(prefix)
            && matches!(ct.get(prefix.len()), None | Some(b'+') | Some(b';'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_grpc_content_types() {
        for (ct, want) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC;charset=x", true),
            ("application/grpc-web+proto", false),
            ("application/grpcx", false),
            ("application/json", false),
        ] {
            let req = http::Request::post("/")
                .header(http::header::CONTENT_TYPE, ct)
                .body(())
                .unwrap();
            assert_eq!(RequestView::new(&req).is_grpc(), want, "{ct}");
        }
        let req = http::Request::post("/").body(()).unwrap();
        assert!(!RequestView::new(&req).is_grpc());
    }
}
