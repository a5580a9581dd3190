//! [`LoadShed`]: the service.

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::ResponseBody;
use super::future::ResponseFuture;
use super::gate::Acquire;
use super::layer::{LoadShedLayer, Refusal, Shared};
use crate::request::RequestView;

/// Sheds load in front of `S`; see the [module docs](super).
///
/// Made by [`LoadShedLayer`]; every clone shares the layer's limit.
pub struct LoadShed<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> LoadShed<S> {
    /// Wraps `inner` with `layer`'s shedder (the same limit as the layer's other services).
    pub fn new(inner: S, layer: &LoadShedLayer) -> Self {
        tower_layer::Layer::layer(layer, inner)
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone> Clone for LoadShed<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for LoadShed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShed")
            .field("inner", &self.inner)
            .field("name", &self.shared.name)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for LoadShed<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let view = RequestView::new(&req);
        let class = shared.classify.classify(&view);
        match shared.gate.acquire(class) {
            Acquire::Got(permit) => ResponseFuture::inner(self.inner.call(req), permit),
            Acquire::Queued(rx) => {
                // The line is bounded only where a queue is configured.
                let max_wait = shared.max_wait[class.index()].unwrap_or_default();
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                ResponseFuture::queued(rx, max_wait, class, req, inner, Arc::clone(shared))
            }
            Acquire::Shed(full) => {
                tracing::debug!(shedder = %shared.name, priority = %class, limit = full.limit, in_flight = full.in_flight, "overloaded; request shed");
                ResponseFuture::rejected(shared.refuse(&view, class, Refusal::Shed(full)))
            }
        }
    }
}
