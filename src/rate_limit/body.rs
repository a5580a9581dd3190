//! [`ResponseBody`]: the inner service's body, or the rate limiter's rejection body.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::response::RejectionBody;

pin_project! {
    /// The body of a response from [`RateLimit`](super::RateLimit): the inner service's body
    /// when the request was allowed, or a [`RejectionBody`] when it was refused.
    ///
    /// It is a [`Body`] whenever `B` is one whose data can be made from [`Bytes`] (every common
    /// body: axum's, hyper's, tonic's), with `B`'s data and error types, so the layer fits axum,
    /// tonic and plain hyper alike.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Rejection { body: RejectionBody },
    }
}

impl<B> ResponseBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// Wraps a rejection body.
    pub fn rejection(body: RejectionBody) -> Self {
        Self {
            kind: Kind::Rejection { body },
        }
    }

    /// Whether this is a rejection produced by the rate limiter.
    pub fn is_rejection(&self) -> bool {
        matches!(self.kind, Kind::Rejection { .. })
    }
}

/// An empty inner body, as `B::default()` makes it.
///
/// Layers that answer on their own without calling through, such as tower-http's `TimeoutLayer`
/// placed outside the limiter, need `Default` on the response body; this makes that work whenever
/// the inner body has it.
impl<B: Default> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::inner(B::default())
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Rejection { body } => match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    Poll::Ready(Some(Ok(frame.map_data(B::Data::from))))
                }
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Rejection { body } => body.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Rejection { body } => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[tokio::test]
    async fn forwards_inner_and_rejection_bodies() {
        let inner = ResponseBody::inner(Full::new(Bytes::from_static(b"hello")));
        assert!(!inner.is_rejection());
        assert_eq!(inner.size_hint().exact(), Some(5));
        assert_eq!(inner.collect().await.unwrap().to_bytes(), "hello");

        let rejected: ResponseBody<Full<Bytes>> =
            ResponseBody::rejection(RejectionBody::from("no"));
        assert!(rejected.is_rejection());
        assert_eq!(rejected.size_hint().exact(), Some(2));
        assert_eq!(rejected.collect().await.unwrap().to_bytes(), "no");
    }

    #[tokio::test]
    async fn default_is_the_inner_bodys_default() {
        let body = ResponseBody::<Full<Bytes>>::default();
        assert!(!body.is_rejection());
        assert_eq!(body.size_hint().exact(), Some(0));
        assert!(body.collect().await.unwrap().to_bytes().is_empty());
    }
}
