//! The response future of [`Outbound`](super::Outbound).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

/// The boxed call: waiting for a slot, the attempts, the backoffs between them.
pub(crate) type BoxCall<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

/// Response future of [`Outbound`](super::Outbound): waits for the upstream's slot, sends,
/// reads the answer, and retries a refusal when it may.
///
/// One allocation per call, not per attempt: an outbound call waits on timers and a network
/// round trip, next to which the box is noise, and a boxed `async` block keeps the
/// wait → send → back off loop readable. (The server-side layer's futures, on the in-memory
/// hot path, are hand-written state machines with no box.)
pub struct ResponseFuture<B, E> {
    pub(crate) inner: BoxCall<B, E>,
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<B>, E>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
