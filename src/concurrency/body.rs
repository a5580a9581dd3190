//! [`ResponseBody`]: the inner service's body holding the request's slot until it is finished
//! or dropped, or the layer's rejection body.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

#[cfg(feature = "redis")]
use super::redis::RedisLease;
use super::table::MemoryPermit;
use crate::response::{poll_frame_holding, RejectionBody};

/// A concurrency slot held by a request; dropping it gives the slot back.
#[derive(Debug)]
pub(crate) enum Slot {
    Memory(#[allow(dead_code)] MemoryPermit),
    #[cfg(feature = "redis")]
    Redis(#[allow(dead_code)] RedisLease),
}

pin_project! {
    /// The body of a response from [`ConcurrencyLimit`](super::ConcurrencyLimit).
    ///
    /// An allowed request keeps its slot until this body has sent its last frame (or failed),
    /// or is dropped: a response still streaming counts as in flight, and a client that
    /// disconnects mid-body gives the slot back when the server drops the body.
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
        Inner { #[pin] body: B, slot: Option<Slot> },
        Rejection { body: RejectionBody },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, slot: Option<Slot>) -> Self {
        Self {
            kind: Kind::Inner { body, slot },
        }
    }

    pub(crate) fn rejection(body: RejectionBody) -> Self {
        Self {
            kind: Kind::Rejection { body },
        }
    }

    /// Whether this is a rejection produced by the concurrency limit.
    pub fn is_rejection(&self) -> bool {
        matches!(self.kind, Kind::Rejection { .. })
    }

    /// Whether this body still holds its request's slot.
    pub fn holds_slot(&self) -> bool {
        matches!(&self.kind, Kind::Inner { slot: Some(_), .. })
    }
}

impl<B: Default> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::inner(B::default(), None)
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, slot } => poll_frame_holding(body, slot, cx),
            KindProj::Rejection { body } => body.next_frame_as(),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Rejection { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Rejection { body } => body.size_hint(),
        }
    }
}
