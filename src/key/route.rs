//! [`RouteKey`]: another extractor's key, counted separately per method and matched route.

use super::{Key, KeyError, KeyExtractor};
use crate::request::RequestView;

/// The route template the router matched (`/users/{id}`), if one is known: axum's `MatchedPath`
/// with the `axum` feature, else `None`.
#[inline]
pub(crate) fn matched_route<'r>(req: &RequestView<'r>) -> Option<&'r str> {
    #[cfg(feature = "axum")]
    if let Some(path) = req.extensions().get::<axum::extract::MatchedPath>() {
        return Some(path.as_str());
    }
    let _ = req;
    None
}

/// Keys a request by another extractor's key **and** its method and matched route, so each
/// endpoint has its own budget per client: `GET /search` and `POST /upload` are counted apart.
///
/// The route is the template the router matched (`/users/{id}`, read from axum's `MatchedPath`
/// with the `axum` feature), never the raw path: `/users/1` and `/users/2` share a budget. With no
/// matched route (the feature is off, the request matched no route, or the layer runs outside the
/// router) extraction fails with a [misconfiguration](KeyError::is_misconfiguration), unless a
/// fallback is configured:
///
/// - [`RouteKey::unmatched_as`] counts such requests under one fixed route name (`"<unmatched>"`);
/// - [`RouteKey::or_uri_path`] uses the raw URI path. **Dangerous for most servers**: the path is
///   chosen by the client, so `/users/1`, `/users/2`, … (or random junk) each make a new key,
///   which both splits one client's budget into unlimited fresh ones and fills the key store
///   (evicting honest clients' state). Use it only when every path is a fixed route (a gRPC
///   server, whose paths are `/package.Service/Method`) and nothing else reaches the layer.
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{KeyExtractor, PeerIp, RouteKey};
/// use tollgate::RequestView;
///
/// // No router here, so name unmatched requests explicitly.
/// let per_route = RouteKey::new(PeerIp::new()).unmatched_as("<unmatched>");
/// let mut req = http::Request::post("/upload").body(()).unwrap();
/// req.extensions_mut().insert("192.0.2.1:1000".parse::<SocketAddr>().unwrap());
/// let key = per_route.extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(key.to_string(), "POST <unmatched>|ip:192.0.2.1");
/// ```
///
/// For a gRPC service, where every path is a method:
///
/// ```
/// use tollgate::key::{GlobalKey, KeyExtractor, RouteKey};
/// use tollgate::RequestView;
///
/// let per_method = RouteKey::new(GlobalKey).or_uri_path();
/// let req = http::Request::post("/shop.Cart/Add").body(()).unwrap();
/// let key = per_method.extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(key.to_string(), "POST /shop.Cart/Add|global");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteKey<E> {
    inner: E,
    unmatched: Unmatched,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unmatched {
    Error,
    UriPath,
    Named(&'static str),
}

impl<E> RouteKey<E> {
    /// `inner`'s key, scoped to the method and matched route.
    pub const fn new(inner: E) -> Self {
        Self {
            inner,
            unmatched: Unmatched::Error,
        }
    }

    /// Requests without a matched route are counted under the route name `route`, instead of
    /// failing. They share one budget per `inner` key and method.
    #[must_use]
    pub const fn unmatched_as(mut self, route: &'static str) -> Self {
        self.unmatched = Unmatched::Named(route);
        self
    }

    /// Requests without a matched route are counted under their raw URI path, instead of failing.
    /// See the [type docs](RouteKey) for why this is dangerous outside a fixed set of paths.
    #[must_use]
    pub const fn or_uri_path(mut self) -> Self {
        self.unmatched = Unmatched::UriPath;
        self
    }

    /// The extractor whose key is scoped.
    pub fn get_ref(&self) -> &E {
        &self.inner
    }

    /// The extractor whose key is scoped.
    pub fn into_inner(self) -> E {
        self.inner
    }
}

impl<E: KeyExtractor> KeyExtractor for RouteKey<E> {
    #[inline]
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        let route = match (matched_route(req), self.unmatched) {
            (Some(route), _) => route,
            (None, Unmatched::Named(route)) => route,
            (None, Unmatched::UriPath) => req.uri().path(),
            (None, Unmatched::Error) => return Err(KeyError::misconfigured(NO_ROUTE)),
        };
        let key = self.inner.extract(req)?;
        Ok(key.scoped(req.method().as_str(), route))
    }
}

#[cfg(feature = "axum")]
const NO_ROUTE: &str = "no matched route for a per-route key: apply the layer to an axum Router \
    (Router::layer or Router::route_layer) so it sees MatchedPath, or name unmatched requests \
    with RouteKey::unmatched_as";
#[cfg(not(feature = "axum"))]
const NO_ROUTE: &str = "no matched route for a per-route key: enable tollgate's `axum` feature \
    to read axum's MatchedPath, or name unmatched requests with RouteKey::unmatched_as";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::GlobalKey;

    fn extract<E: KeyExtractor>(
        e: &RouteKey<E>,
        method: http::Method,
        path: &str,
    ) -> Result<String, KeyError> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap();
        e.extract(&RequestView::new(&req)).map(|k| k.to_string())
    }

    #[test]
    fn no_route_is_a_misconfiguration_by_default() {
        let err = extract(&RouteKey::new(GlobalKey), http::Method::GET, "/a").unwrap_err();
        assert!(err.is_misconfiguration());
        assert!(err.reason().contains("unmatched_as"), "{err}");
    }

    #[test]
    fn fallbacks_scope_by_method_and_route() {
        let named = RouteKey::new(GlobalKey).unmatched_as("?");
        let a = extract(&named, http::Method::GET, "/a").unwrap();
        let b = extract(&named, http::Method::GET, "/b").unwrap();
        let post = extract(&named, http::Method::POST, "/a").unwrap();
        assert_eq!(a, b);
        assert_ne!(a, post);
        assert_eq!(a, "GET ?|global");

        let raw = RouteKey::new(GlobalKey).or_uri_path();
        let a = extract(&raw, http::Method::GET, "/a?x=1").unwrap();
        let b = extract(&raw, http::Method::GET, "/b").unwrap();
        assert_ne!(a, b);
        assert_eq!(a, "GET /a|global");
    }

    #[test]
    fn inner_errors_pass_through() {
        fn inner<'r>(_: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
            Err(KeyError::new("inner"))
        }
        let e = RouteKey::new(inner).unmatched_as("?");
        assert_eq!(
            extract(&e, http::Method::GET, "/").unwrap_err().reason(),
            "inner"
        );
    }

    #[cfg(feature = "axum")]
    #[tokio::test]
    async fn reads_axum_matched_path() {
        use axum::{body::Body, extract::Request, routing::get, Router};
        use tower::ServiceExt;

        let app = Router::new().route(
            "/users/{id}",
            get(|req: Request| async move {
                RouteKey::new(GlobalKey)
                    .extract(&RequestView::new(&req))
                    .map(|k| k.to_string())
                    .unwrap_or_else(|e| e.to_string())
            }),
        );
        let res = app
            .oneshot(http::Request::get("/users/42").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], b"GET /users/{id}|global");
    }
}
