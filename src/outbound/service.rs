//! [`Outbound`]: the client-side service.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::attempts::{run, Exchange};
use super::future::ResponseFuture;
use super::key::{Authority, UpstreamKey};
use super::layer::Retry;
use super::replay::{Idempotent, Replay};
use super::schedule::{Schedule, UpstreamStatus};

/// Keeps a client to its upstreams' limits. Made by [`OutboundLayer`](super::OutboundLayer);
/// see the [module docs](super).
///
/// Clones share the layer's state: a pause one caller sees holds back every clone.
#[derive(Debug)]
pub struct Outbound<S, K = Authority, R = Idempotent> {
    pub(crate) inner: S,
    pub(crate) schedule: Arc<Schedule>,
    pub(crate) key: Arc<K>,
    pub(crate) replay: Arc<R>,
    pub(crate) retry: Retry,
}

impl<S: Clone, K, R> Clone for Outbound<S, K, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            schedule: self.schedule.clone(),
            key: self.key.clone(),
            replay: self.replay.clone(),
            retry: self.retry,
        }
    }
}

impl<S, K, R> Outbound<S, K, R> {
    /// The wrapped client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped client, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped client, without the layer.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The state of upstream `key` (as the [`UpstreamKey`] names it), if it was called.
    pub fn status(&self, key: &str) -> Option<UpstreamStatus> {
        self.schedule.status(key)
    }
}

impl<S, K, R, ReqBody, ResBody> Service<Request<ReqBody>> for Outbound<S, K, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    K: UpstreamKey<ReqBody>,
    R: Replay<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The instance polled ready is the one the first attempt calls.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let key = self.key.upstream_key(&req);
        let exchange = TowerExchange {
            inner,
            replay: self.replay.clone(),
            _body: PhantomData,
        };
        let call = run(exchange, req, key, self.schedule.clone(), self.retry);
        ResponseFuture {
            inner: Box::pin(call),
        }
    }
}

/// The attempts of one call through a Tower client: retries wait for `poll_ready`, and the
/// layer's [`Replay`] copies the request.
struct TowerExchange<S, R, ReqBody> {
    inner: S,
    replay: Arc<R>,
    _body: PhantomData<fn(ReqBody)>,
}

impl<S, R, ReqBody, ResBody> Exchange for TowerExchange<S, R, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send,
    S::Future: Send,
    R: Replay<ReqBody>,
    ReqBody: Send,
    ResBody: Send,
{
    type Request = Request<ReqBody>;
    type Response = Response<ResBody>;
    type Error = S::Error;

    fn ready(&mut self) -> impl Future<Output = Result<(), S::Error>> + Send {
        std::future::poll_fn(|cx| self.inner.poll_ready(cx))
    }

    fn send(
        &mut self,
        request: Request<ReqBody>,
    ) -> impl Future<Output = Result<Response<ResBody>, S::Error>> + Send {
        self.inner.call(request)
    }

    fn replay(&self, request: &mut Request<ReqBody>) -> Option<Request<ReqBody>> {
        self.replay.replay(request)
    }
}
