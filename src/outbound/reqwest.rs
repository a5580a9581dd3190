//! The outbound layer for reqwest (feature `reqwest`): [`OutboundMiddleware`], a
//! [`reqwest-middleware`](https://docs.rs/reqwest-middleware) middleware.
//!
//! It is an [`OutboundLayer`] applied to a reqwest client: the same schedule, the same rules
//! (shaping to a quota, pauses on `429`/`503` with `Retry-After` or rate-limit headers shared
//! by every caller, the slow start after a pause, retries within the attempts, deadline and
//! retry budget, adaptive rates, `max_pause`), and the same per-call [`OutboundInfo`](super::OutboundInfo) in the
//! response's extensions. Build the layer with [`OutboundLayer::builder`], wrap it with
//! [`OutboundMiddleware::new`], and add it to a `reqwest_middleware::ClientBuilder`.
//!
//! # What the layer's strategies see
//!
//! The layer's [`UpstreamKey`] and [`Replay`] read a reqwest request's *head* as an
//! `http::Request<()>`: its method, URI, version and headers (no body, and no extensions:
//! reqwest keeps a request's extensions to itself). The default
//! [`Authority`] keys by the URL's `host[:port]`; a closure key takes
//! `&http::Request<()>`.
//!
//! A refused request is sent again when the layer's [`Replay`] gives a copy of the head (by
//! default, [`Idempotent`]: an idempotent method) **and** [`reqwest::Request::try_clone`] a
//! copy of the whole request: a streamed body (`Body::wrap_stream`) cannot be copied, so such
//! a request is sent once and its refusal returned. The retry is that copy with the method,
//! URI, version and headers the [`Replay`] returned (its timeout and extensions are the
//! original's).
//!
//! A request whose URL `http::Uri` cannot parse goes to the next middleware untouched (reqwest
//! then reports the URL).
//!
//! [`reqwest::Request::try_clone`]: ::reqwest::Request::try_clone
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use reqwest_middleware::ClientBuilder;
//! use tollgate::outbound::reqwest::OutboundMiddleware;
//! use tollgate::outbound::{OutboundInfo, OutboundLayer};
//! use tollgate::Quota;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = OutboundLayer::builder()
//!     .quota(Quota::per_second(10).burst(1)) // 100 ms apart per upstream
//!     .max_pause(Duration::from_secs(30))
//!     .build()?;
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(OutboundMiddleware::new(layer))
//!     .build();
//!
//! // A 429 with `Retry-After` pauses api.example.com for every caller of `client`, and this
//! // GET is sent again after the pause.
//! let res = client.get("http://api.example.com/items").send().await?;
//! let info = res.extensions().get::<OutboundInfo>().copied();
//! println!("{} after {:?} attempts", res.status(), info.map(|i| i.attempts()));
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use ::reqwest::{Request, Response};
use http::{Extensions, Uri};
use reqwest_middleware::{Middleware, Next};

use super::attempts::{run, Answer, Exchange};
use super::key::{Authority, UpstreamKey};
use super::layer::OutboundLayer;
use super::replay::{Idempotent, Replay};
use super::schedule::UpstreamStatus;

/// An [`OutboundLayer`] as a `reqwest-middleware` middleware. See the [module docs](self).
///
/// Clones, and the layer it was made from and its clones, share one schedule per upstream: a
/// pause seen through a reqwest client also holds back a Tower client built from the same
/// layer.
///
/// ```
/// use std::time::Duration;
/// use reqwest_middleware::ClientBuilder;
/// use tollgate::outbound::reqwest::OutboundMiddleware;
/// use tollgate::outbound::{NoReplay, OutboundLayer};
/// use tollgate::Quota;
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// // Adaptive, with the defaults: learns each upstream's rate from its headers.
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(OutboundMiddleware::default())
///     .build();
///
/// // 5 calls a second per upstream, one schedule for every API version, never retried.
/// let layer = OutboundLayer::builder()
///     .quota(Quota::per_second(5))
///     .upstream_key(|req: &http::Request<()>| {
///         req.uri().path().split('/').nth(1).unwrap_or("").to_owned()
///     })
///     .replay(NoReplay)
///     .max_pause(Duration::from_secs(10))
///     .build()?;
/// let middleware = OutboundMiddleware::new(layer);
/// assert!(middleware.status("v1").is_none(), "nothing was sent yet");
/// let client = ClientBuilder::new(reqwest::Client::new()).with(middleware).build();
/// # drop(client);
/// # Ok(())
/// # }
/// ```
pub struct OutboundMiddleware<K = Authority, R = Idempotent> {
    layer: OutboundLayer<K, R>,
}

impl<K, R> OutboundMiddleware<K, R> {
    /// The middleware applying `layer`: its configuration, and its state shared with every
    /// clone of the layer.
    pub fn new(layer: OutboundLayer<K, R>) -> Self {
        Self { layer }
    }

    /// The state of upstream `key` (as the [`UpstreamKey`] names it), if it was called.
    pub fn status(&self, key: &str) -> Option<UpstreamStatus> {
        self.layer.status(key)
    }
}

impl Default for OutboundMiddleware {
    /// [`OutboundLayer::new`]'s adaptive defaults.
    fn default() -> Self {
        Self::new(OutboundLayer::new())
    }
}

impl<K, R> From<OutboundLayer<K, R>> for OutboundMiddleware<K, R> {
    fn from(layer: OutboundLayer<K, R>) -> Self {
        Self::new(layer)
    }
}

impl<K, R> Clone for OutboundMiddleware<K, R> {
    fn clone(&self) -> Self {
        Self {
            layer: self.layer.clone(),
        }
    }
}

impl<K: fmt::Debug, R: fmt::Debug> fmt::Debug for OutboundMiddleware<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboundMiddleware")
            .field("layer", &self.layer)
            .finish()
    }
}

impl<K, R> OutboundMiddleware<K, R>
where
    K: UpstreamKey<()>,
    R: Replay<()>,
{
    async fn call(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let Some(key) = with_head(&mut req, |head| self.layer.key.upstream_key(head)) else {
            return next.run(req, extensions).await;
        };
        let exchange = ReqwestExchange {
            next,
            extensions,
            replay: &*self.layer.replay,
        };
        run(
            exchange,
            req,
            key,
            self.layer.schedule.clone(),
            self.layer.retry,
        )
        .await
    }
}

// `#[async_trait]`'s form of `Middleware::handle`, written out.
impl<K, R> Middleware for OutboundMiddleware<K, R>
where
    K: UpstreamKey<()>,
    R: Replay<()>,
{
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        req: Request,
        extensions: &'life1 mut Extensions,
        next: Next<'life2>,
    ) -> Pin<Box<dyn Future<Output = reqwest_middleware::Result<Response>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(self.call(req, extensions, next))
    }
}

/// The attempts of one call through the rest of a `reqwest-middleware` chain.
struct ReqwestExchange<'a, R> {
    next: Next<'a>,
    extensions: &'a mut Extensions,
    replay: &'a R,
}

impl<R: Replay<()>> Exchange for ReqwestExchange<'_, R> {
    type Request = Request;
    type Response = Response;
    type Error = reqwest_middleware::Error;

    fn ready(&mut self) -> impl Future<Output = reqwest_middleware::Result<()>> + Send {
        std::future::ready(Ok(()))
    }

    fn send(
        &mut self,
        request: Request,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send {
        self.next.clone().run(request, self.extensions)
    }

    fn replay(&self, request: &mut Request) -> Option<Request> {
        replay_request(self.replay, request)
    }
}

impl Answer for Response {
    fn status(&self) -> http::StatusCode {
        Response::status(self)
    }

    fn headers(&self) -> &http::HeaderMap {
        Response::headers(self)
    }

    fn extensions_mut(&mut self) -> &mut Extensions {
        Response::extensions_mut(self)
    }
}

/// The copy of `request` to send again: `None` unless `replay` gives a copy of its head and
/// [`Request::try_clone`] a copy of the request (not of a streamed body); then that copy with
/// the head `replay` gave.
fn replay_request<R: Replay<()>>(replay: &R, request: &mut Request) -> Option<Request> {
    let (head, same_uri) = with_head(request, |head| {
        let copy = replay.replay(head)?;
        let same_uri = copy.uri() == head.uri();
        Some((copy, same_uri))
    })??;
    let mut copy = request.try_clone()?;
    let (parts, ()) = head.into_parts();
    if !same_uri {
        match ::reqwest::Url::parse(&parts.uri.to_string()) {
            Ok(url) => *copy.url_mut() = url,
            Err(error) => {
                tracing::debug!(uri = %parts.uri, %error, "outbound: the replay's URI is not a URL, not retrying");
                return None;
            }
        }
    }
    *copy.method_mut() = parts.method;
    *copy.version_mut() = parts.version;
    *copy.headers_mut() = parts.headers;
    Some(copy)
}

/// Lends `req`'s head to `f` as an `http::Request<()>`: its method, URI and version, and its
/// headers, moved out and back (reqwest keeps a request's extensions to itself). `None`, without calling `f`, when the URL is
/// not an `http::Uri`.
fn with_head<T>(req: &mut Request, f: impl FnOnce(&http::Request<()>) -> T) -> Option<T> {
    let uri = Uri::try_from(req.url().as_str()).ok()?;
    let mut head = http::Request::new(());
    *head.method_mut() = req.method().clone();
    *head.uri_mut() = uri;
    *head.version_mut() = req.version();
    *head.headers_mut() = std::mem::take(req.headers_mut());
    let out = f(&head);
    *req.headers_mut() = head.into_parts().0.headers;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn request(method: Method, url: &str) -> Request {
        let mut req = Request::new(method, url.parse().unwrap());
        req.headers_mut().insert("x-id", "7".parse().unwrap());
        req
    }

    #[test]
    fn the_head_is_lent_and_given_back() {
        let mut req = request(Method::GET, "http://API.example.com:8080/v1/items?q=1");
        let key = with_head(&mut req, |head| {
            assert_eq!(head.uri(), "http://api.example.com:8080/v1/items?q=1");
            assert_eq!(head.headers()["x-id"], "7");
            Authority.upstream_key(head)
        });
        assert_eq!(key.as_deref(), Some("api.example.com:8080"));
        assert_eq!(req.headers()["x-id"], "7");
    }

    #[test]
    fn a_request_is_replayed_when_the_replay_and_try_clone_both_allow() {
        let mut get = request(Method::GET, "http://a/x");
        *get.body_mut() = Some("body".into());
        let copy = replay_request(&Idempotent::new(), &mut get).unwrap();
        assert_eq!(copy.method(), Method::GET);
        assert_eq!(copy.url().as_str(), "http://a/x");
        assert_eq!(copy.headers()["x-id"], "7");
        assert_eq!(copy.body().and_then(|b| b.as_bytes()), Some(&b"body"[..]));
        assert_eq!(get.headers()["x-id"], "7", "the original keeps its head");

        let mut post = request(Method::POST, "http://a/x");
        assert!(replay_request(&Idempotent::new(), &mut post).is_none());
        assert!(replay_request(&Idempotent::new().also(Method::POST), &mut post).is_some());

        // A streamed body cannot be copied.
        let mut streamed = request(Method::GET, "http://a/x");
        let body = http_body_util::Full::new(bytes::Bytes::from_static(b"a"));
        *streamed.body_mut() = Some(::reqwest::Body::wrap(body));
        assert!(replay_request(&Idempotent::new(), &mut streamed).is_none());
    }

    #[test]
    fn the_replay_s_head_is_what_is_sent_again() {
        let mut get = request(Method::GET, "http://a/x");
        let marked = |head: &http::Request<()>| {
            let mut copy = crate::outbound::clone_request(head);
            copy.headers_mut().insert("x-retry", "1".parse().unwrap());
            *copy.uri_mut() = "http://b/y".parse().unwrap();
            Some(copy)
        };
        let copy = replay_request(&marked, &mut get).unwrap();
        assert_eq!(copy.headers()["x-retry"], "1");
        assert_eq!(copy.url().as_str(), "http://b/y");
        assert!(get.headers().get("x-retry").is_none());
    }
}
