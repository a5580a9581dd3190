//! Which upstream a request goes to: the key its shaping, pauses and learned rate are kept
//! under.

use http::header::HOST;
use http::Request;

/// Names the upstream a request is sent to. Requests with the same key share one schedule:
/// one quota, one pause, one learned rate.
///
/// [`Authority`] (the default) keys by the request URI's authority; any
/// `Fn(&Request<B>) -> String` is one too:
///
/// ```
/// use http::Request;
/// use tollgate::outbound::{Authority, UpstreamKey};
///
/// let req = Request::get("http://API.example.com:8080/v1/items").body(()).unwrap();
/// assert_eq!(Authority.upstream_key(&req), "api.example.com:8080");
///
/// // One schedule per API version, whatever the host.
/// let by_version = |req: &Request<()>| req.uri().path().split('/').nth(1).unwrap_or("").to_owned();
/// assert_eq!(by_version.upstream_key(&req), "v1");
/// ```
pub trait UpstreamKey<B>: Send + Sync + 'static {
    /// The key of `request`'s upstream.
    fn upstream_key(&self, request: &Request<B>) -> String;
}

/// The default [`UpstreamKey`]: the request URI's authority (`host[:port]`, lowercased), else
/// its `Host` header, else `""` (one key for every request without either).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Authority;

impl<B> UpstreamKey<B> for Authority {
    fn upstream_key(&self, request: &Request<B>) -> String {
        if let Some(authority) = request.uri().authority() {
            return authority.as_str().to_ascii_lowercase();
        }
        request
            .headers()
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .map(|h| h.trim().to_ascii_lowercase())
            .unwrap_or_default()
    }
}

impl<B, F> UpstreamKey<B> for F
where
    F: Fn(&Request<B>) -> String + Send + Sync + 'static,
{
    fn upstream_key(&self, request: &Request<B>) -> String {
        self(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authority_then_host_then_empty() {
        let req = Request::get("https://Example.COM/x").body(()).unwrap();
        assert_eq!(Authority.upstream_key(&req), "example.com");
        let req = Request::get("/x")
            .header(HOST, "Upstream:81")
            .body(())
            .unwrap();
        assert_eq!(Authority.upstream_key(&req), "upstream:81");
        let req = Request::get("/x").body(()).unwrap();
        assert_eq!(Authority.upstream_key(&req), "");
    }
}
