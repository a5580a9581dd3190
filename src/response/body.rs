//! [`RejectionBody`]: the body of a response the rate limiter produced itself.

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// The body of a rejection: one chunk of bytes, or nothing (gRPC trailers-only responses).
///
/// Custom [`Rejection`](super::Rejection)s build it from `String`, `&'static str`, `Vec<u8>` or
/// [`Bytes`]:
///
/// ```
/// use tollgate::response::RejectionBody;
///
/// let body = RejectionBody::from("slow down");
/// assert_eq!(body.as_bytes(), b"slow down");
/// assert!(RejectionBody::empty().as_bytes().is_empty());
/// ```
#[derive(Clone, Default)]
pub struct RejectionBody {
    data: Option<Bytes>,
}

impl RejectionBody {
    /// A body holding `data`.
    pub fn new(data: impl Into<Bytes>) -> Self {
        let data = data.into();
        Self {
            data: (!data.is_empty()).then_some(data),
        }
    }

    /// An empty body.
    pub const fn empty() -> Self {
        Self { data: None }
    }

    /// The bytes not yet read.
    pub fn as_bytes(&self) -> &[u8] {
        self.data.as_deref().unwrap_or_default()
    }

    /// [`Body::poll_frame`] as a frame of a middleware's response body: its data type made from
    /// [`Bytes`], any error type (this body has none).
    pub(crate) fn next_frame_as<D: From<Bytes>, E>(&mut self) -> Polled<D, E> {
        Poll::Ready(self.data.take().map(|d| Ok(Frame::data(D::from(d)))))
    }
}

/// What polling a body for a frame gives.
type Polled<D, E> = Poll<Option<Result<Frame<D>, E>>>;

/// Polls `body` for its next frame and drops `guard` (a slot, a permit) once the body is done:
/// its end, or an error that ends it. What the bodies of middlewares that count requests in
/// flight until their response ends share.
pub(crate) fn poll_frame_holding<B: Body, G>(
    mut body: Pin<&mut B>,
    guard: &mut Option<G>,
    cx: &mut Context<'_>,
) -> Polled<B::Data, B::Error> {
    let frame = std::task::ready!(body.as_mut().poll_frame(cx));
    if !matches!(frame, Some(Ok(_))) || body.is_end_stream() {
        *guard = None;
    }
    Poll::Ready(frame)
}

impl fmt::Debug for RejectionBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RejectionBody")
            .field("len", &self.as_bytes().len())
            .finish()
    }
}

impl From<Bytes> for RejectionBody {
    fn from(data: Bytes) -> Self {
        Self::new(data)
    }
}

impl From<String> for RejectionBody {
    fn from(data: String) -> Self {
        Self::new(data)
    }
}

impl From<&'static str> for RejectionBody {
    fn from(data: &'static str) -> Self {
        Self::new(data)
    }
}

impl From<Vec<u8>> for RejectionBody {
    fn from(data: Vec<u8>) -> Self {
        Self::new(data)
    }
}

impl From<()> for RejectionBody {
    fn from((): ()) -> Self {
        Self::empty()
    }
}

impl Body for RejectionBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().data.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.as_bytes().len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn yields_one_chunk_then_ends() {
        let body = RejectionBody::from("abc");
        assert_eq!(body.size_hint().exact(), Some(3));
        assert!(!body.is_end_stream());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abc");
        let empty = RejectionBody::from(String::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
    }
}
