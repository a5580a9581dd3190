//! [`RateLimit`]: the service. `call` runs the decision steps ([`decide`](super::decide)) and
//! hands what is left to wait for to the [`ResponseFuture`].

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::ResponseBody;
use super::decide::{begin, Begin};
use super::follow_up::shaping_wait;
use super::future::ResponseFuture;
use super::layer::RateLimitLayer;
use super::shared::Shared;
use crate::store::memory::MemoryStore;
use crate::store::Store;

/// Rate-limits requests to the inner service `S`. Created by [`RateLimitLayer`]; see the
/// [module docs](crate::rate_limit).
///
/// Allowed requests reach `S` with the reported [`Decision`](crate::Decision) in their
/// extensions, and all [`Decisions`](crate::Decisions) too when the layer holds more than
/// one limit or layers are nested (with a single limit, the `Decision` is the only one);
/// responses get rate-limit headers, and the reported `Decision` in their extensions when
/// [`response_extensions`](super::RateLimitLayerBuilder::response_extensions) is on (for logging
/// or metrics middleware further out) or the layer is nested in another. Refused requests never
/// reach `S`: they are answered by the layer's [`Rejection`](crate::response::Rejection).
pub struct RateLimit<S, St = MemoryStore> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl<S, St> RateLimit<S, St> {
    /// Wraps `inner` with the limits of `layer`.
    pub fn new(inner: S, layer: &RateLimitLayer<St>) -> Self {
        Self {
            inner,
            shared: Arc::clone(&layer.shared),
        }
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

impl<S: Clone, St> Clone for RateLimit<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for RateLimit<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limits", &self.shared.current.load().limits)
            .finish_non_exhaustive()
    }
}

impl<S, St, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, St>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, St>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        match begin(&self.shared, &mut req, 0) {
            // A shaped request that must wait for its turn waits in the future.
            Begin::Proceed(outcome, followup) if shaping_wait(&followup).is_some() => {
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                ResponseFuture::shaped(req, inner, Arc::clone(&self.shared), outcome, followup)
            }
            Begin::Proceed(outcome, followup) => {
                ResponseFuture::inner(self.inner.call(req), outcome, followup)
            }
            Begin::Reject(response) => ResponseFuture::rejected(response),
            begin => {
                // The store (or a plan lookup) answers later: keep the instance that was polled
                // ready for then, and leave a fresh clone in its place (it will be polled ready
                // before its own call).
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                ResponseFuture::waiting(begin, req, inner, Arc::clone(&self.shared))
            }
        }
    }
}
