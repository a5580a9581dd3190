//! [`ResponseBody`]: the inner service's body holding the request's slot until it is finished
//! or dropped, or the shedder's refusal body.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::gate::Permit;
use crate::response::{poll_frame_holding, RejectionBody};

pin_project! {
    /// The body of a response from [`LoadShed`](super::LoadShed).
    ///
    /// An admitted request keeps its slot until this body has sent its last frame (or failed),
    /// or is dropped: a response still streaming still loads the service.
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
        Inner { #[pin] body: B, permit: Option<Permit> },
        Rejection { body: RejectionBody },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, permit: Permit) -> Self {
        Self {
            kind: Kind::Inner {
                body,
                permit: Some(permit),
            },
        }
    }

    pub(crate) fn rejection(body: RejectionBody) -> Self {
        Self {
            kind: Kind::Rejection { body },
        }
    }

    /// Whether this is the shedder's refusal.
    pub fn is_rejection(&self) -> bool {
        matches!(self.kind, Kind::Rejection { .. })
    }

    /// Whether this body still holds its request's slot.
    pub fn holds_slot(&self) -> bool {
        matches!(
            &self.kind,
            Kind::Inner {
                permit: Some(_),
                ..
            }
        )
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
            KindProj::Inner { body, permit } => poll_frame_holding(body, permit, cx),
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
