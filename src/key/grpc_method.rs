//! [`GrpcMethod`]: another extractor's key, counted separately per gRPC method.

use super::{Key, KeyError, KeyExtractor};
use crate::request::RequestView;

/// The longest method path accepted, in bytes: longer paths are no gRPC method a server declares,
/// and would only make the limiter store large keys.
const MAX_PATH_LEN: usize = 256;

/// Keys a gRPC call by its full method, `/package.Service/Method`, **and** another extractor's
/// key, so each method has its own budget per client: `Check` and `Watch` are counted apart.
///
/// `GrpcMethod::new(GlobalKey)` gives one budget per method for all clients;
/// `GrpcMethod::new(PeerIp::new())` one per method and client address. It works wherever the
/// layer sits in a tonic server (`Server::builder().layer(..)` included), since the method is
/// the request path, which tonic's router has not yet looked at.
///
/// A path that is not a gRPC method (not exactly `/service/method`, an empty part, or longer than
/// 256 bytes) has no key: the [`KeyError`] is the request's fault, so the limit's
/// [`MissingKey`](crate::key::MissingKey) policy decides. Clients still choose the path, so a
/// client can invent method names, each with a fresh budget (tonic then answers them
/// `UNIMPLEMENTED`). Pair a per-method limit with a per-client limit that covers every method
/// (several limits on one layer are all-or-nothing) so that inventing methods gains nothing.
///
/// To make some methods cost more, rather than giving them separate budgets, use a
/// [`CostTable`](crate::cost::CostTable) keyed by the method path.
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{GlobalKey, GrpcMethod, KeyExtractor, PeerIp};
/// use tollgate::RequestView;
///
/// let call = |path: &str| {
///     let mut req = http::Request::post(path)
///         .header("content-type", "application/grpc")
///         .body(())
///         .unwrap();
///     req.extensions_mut().insert("192.0.2.7:50000".parse::<SocketAddr>().unwrap());
///     req
/// };
///
/// let per_method = GrpcMethod::new(GlobalKey);
/// let req = call("/grpc.health.v1.Health/Check");
/// let key = per_method.extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(key.to_string(), "grpc /grpc.health.v1.Health/Check|global");
///
/// let per_client_and_method = GrpcMethod::new(PeerIp::new());
/// let req = call("/grpc.health.v1.Health/Watch");
/// let key = per_client_and_method.extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(key.to_string(), "grpc /grpc.health.v1.Health/Watch|ip:192.0.2.7");
///
/// // Not a gRPC method: no key.
/// let req = call("/index.html");
/// let err = per_method.extract(&RequestView::new(&req)).unwrap_err();
/// assert!(err.reason().contains("not a gRPC method"), "{err}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GrpcMethod<E> {
    inner: E,
}

impl<E> GrpcMethod<E> {
    /// `inner`'s key, scoped to the gRPC method.
    pub const fn new(inner: E) -> Self {
        Self { inner }
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

/// `path` if it is a gRPC method path: `/service/method`, both parts non-empty, short enough.
fn method_path(path: &str) -> Option<&str> {
    if path.len() > MAX_PATH_LEN {
        return None;
    }
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    let valid = !service.is_empty() && !method.is_empty() && !method.contains('/');
    valid.then_some(path)
}

impl<E: KeyExtractor> KeyExtractor for GrpcMethod<E> {
    #[inline]
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        let Some(path) = method_path(req.uri().path()) else {
            return Err(KeyError::new(
                "the request path is not a gRPC method (`/package.Service/Method`, at most \
                 256 bytes)",
            ));
        };
        let key = self.inner.extract(req)?;
        Ok(key.scoped("grpc", path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::GlobalKey;

    fn key(path: &str) -> Result<String, KeyError> {
        let req = http::Request::post(path).body(()).unwrap();
        GrpcMethod::new(GlobalKey)
            .extract(&RequestView::new(&req))
            .map(|k| k.to_string())
    }

    #[test]
    fn methods_are_counted_apart() {
        assert_eq!(key("/p.S/A").unwrap(), "grpc /p.S/A|global");
        assert_ne!(key("/p.S/A").unwrap(), key("/p.S/B").unwrap());
        assert_ne!(key("/p.S/A").unwrap(), key("/p.T/A").unwrap());
        // The query is not part of the method.
        assert_eq!(key("/p.S/A?x=1").unwrap(), key("/p.S/A").unwrap());
    }

    #[test]
    fn non_method_paths_have_no_key() {
        let long = format!("/p.S/{}", "m".repeat(MAX_PATH_LEN));
        for bad in ["/", "/p.S", "/p.S/", "//M", "/p.S/M/extra", "/a/b/c", &long] {
            let err = key(bad).unwrap_err();
            assert!(!err.is_misconfiguration(), "{bad}");
            assert!(err.reason().contains("not a gRPC method"), "{bad}: {err}");
        }
        let at_max = format!("/p.S/{}", "m".repeat(MAX_PATH_LEN - 5));
        assert!(key(&at_max).is_ok());
    }

    #[test]
    fn inner_errors_pass_through() {
        fn inner<'r>(_: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
            Err(KeyError::new("inner"))
        }
        let req = http::Request::post("/p.S/M").body(()).unwrap();
        let err = GrpcMethod::new(inner)
            .extract(&RequestView::new(&req))
            .unwrap_err();
        assert_eq!(err.reason(), "inner");
    }
}
