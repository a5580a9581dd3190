//! [`ConcurrencyLimit`]: the service.

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::{ResponseBody, Slot};
use super::future::ResponseFuture;
use super::layer::{ConcurrencyLimitLayer, Refusal, Shared, Slots};
use super::table::Acquire;
use crate::key::{report_misconfiguration, Consequence};
use crate::request::RequestView;

/// Caps the requests in flight per key around `S`; see the [module docs](super).
///
/// Made by [`ConcurrencyLimitLayer`]; every clone shares the layer's slot table.
pub struct ConcurrencyLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> ConcurrencyLimit<S> {
    /// Wraps `inner` with `layer`'s limit (the same slot table as the layer's other services).
    pub fn new(inner: S, layer: &ConcurrencyLimitLayer) -> Self {
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

impl<S: Clone> Clone for ConcurrencyLimit<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for ConcurrencyLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .field("name", &self.shared.name)
            .field("max_in_flight", &self.shared.max_in_flight)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimit<S>
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
        let key = match shared.key.extract(&view) {
            Ok(key) => key,
            Err(error) => match shared.on_missing_key.status_for(&error) {
                None => {
                    if error.is_misconfiguration() {
                        report_misconfiguration(
                            "concurrency limit",
                            shared.name.as_str(),
                            &error,
                            Consequence::Skipped,
                        );
                    } else {
                        tracing::trace!(policy = %shared.name, reason = %error, "no concurrency key; limit skipped");
                    }
                    return ResponseFuture::inner(self.inner.call(req), None);
                }
                Some(status) => {
                    if error.is_misconfiguration() {
                        report_misconfiguration(
                            "concurrency limit",
                            shared.name.as_str(),
                            &error,
                            Consequence::Refused,
                        );
                    } else {
                        tracing::debug!(policy = %shared.name, reason = %error, %status, "no concurrency key; request refused");
                    }
                    let fix = error.fix();
                    return ResponseFuture::rejected(
                        shared.refuse(&view, Refusal::MissingKey { status, fix }),
                    );
                }
            },
        };
        match &shared.slots {
            Slots::Memory(table) => {
                let queue = shared.queue.map_or(0, |q| q.per_key);
                match table.acquire(&key, queue) {
                    Acquire::Got(permit) => {
                        drop(key);
                        ResponseFuture::inner(self.inner.call(req), Some(Slot::Memory(permit)))
                    }
                    Acquire::Queued(rx) => {
                        tracing::trace!(policy = %shared.name, "every concurrency slot taken; request queued");
                        drop(key);
                        let max_wait = shared.queue.map_or_else(Default::default, |q| q.max_wait);
                        ResponseFuture::queued(
                            rx,
                            max_wait,
                            req,
                            take_inner(&mut self.inner),
                            Arc::clone(shared),
                        )
                    }
                    Acquire::Full { in_flight } => {
                        tracing::debug!(policy = %shared.name, in_flight, "concurrency limit reached; request refused");
                        ResponseFuture::rejected(shared.refuse(&view, Refusal::Full { in_flight }))
                    }
                    Acquire::TooManyKeys => {
                        tracing::warn!(policy = %shared.name, "concurrency table full of keys in flight; request refused");
                        ResponseFuture::rejected(shared.refuse(&view, Refusal::TooManyKeys))
                    }
                }
            }
            #[cfg(feature = "redis")]
            Slots::Redis(table) => {
                let lease = table.acquire(&key);
                drop(key);
                ResponseFuture::leasing(lease, req, take_inner(&mut self.inner), Arc::clone(shared))
            }
        }
    }
}

/// The instance polled ready, for a call made later; a fresh clone stays in its place.
fn take_inner<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    mem::replace(inner, clone)
}
