//! [`ResponseFuture`]: waits in line for a slot when its class has a queue, then for the inner
//! service, and hands the slot to the response body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::body::ResponseBody;
use super::gate::Permit;
use super::layer::{Refusal, Shared};
use super::priority::Priority;
use crate::request::RequestView;
use crate::response::RejectionBody;

/// The request and the service to call once a slot is held.
struct Held<S, ReqBody> {
    req: Request<ReqBody>,
    inner: S,
    class: Priority,
    shared: Arc<Shared>,
}

pin_project! {
    /// Response future of [`LoadShed`](super::LoadShed).
    ///
    /// With a free slot (or a refusal) it is the inner service's future (or the refusal); a
    /// request waiting in its class's line first waits for a slot (one channel and one timer).
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S::Future, Held<S, ReqBody>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, H> {
        Queued {
            rx: oneshot::Receiver<Permit>,
            #[pin]
            sleep: Sleep,
            since: Instant,
            held: Option<H>,
        },
        Inner {
            #[pin]
            future: F,
            permit: Option<Permit>,
        },
        Rejected {
            response: Option<Response<RejectionBody>>,
        },
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn inner(future: S::Future, permit: Permit) -> Self {
        Self {
            state: State::Inner {
                future,
                permit: Some(permit),
            },
        }
    }

    pub(crate) fn rejected(response: Response<RejectionBody>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }

    pub(crate) fn queued(
        rx: oneshot::Receiver<Permit>,
        max_wait: Duration,
        class: Priority,
        req: Request<ReqBody>,
        inner: S,
        shared: Arc<Shared>,
    ) -> Self {
        let since = Instant::now();
        // The builder bounds `max_wait` to 60 s: the deadline is within the clock's range.
        let sleep = tokio::time::sleep_until(since + max_wait);
        Self {
            state: State::Queued {
                rx,
                sleep,
                since,
                held: Some(Held {
                    req,
                    inner,
                    class,
                    shared,
                }),
            },
        }
    }
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Queued { .. } => "queued",
            State::Inner { .. } => "inner",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

const POLLED: &str = "ResponseFuture polled after completion";

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Inner { future, permit } => {
                    let response = ready!(future.poll(cx))?;
                    let mut permit = permit.take().expect(POLLED);
                    permit.answered();
                    return Poll::Ready(Ok(response.map(|b| ResponseBody::inner(b, permit))));
                }
                StateProj::Rejected { response } => {
                    let response = response.take().expect(POLLED);
                    return Poll::Ready(Ok(response.map(ResponseBody::rejection)));
                }
                StateProj::Queued {
                    rx,
                    sleep,
                    since,
                    held,
                } => {
                    let refusal = match Pin::new(rx).poll(cx) {
                        Poll::Ready(Ok(permit)) => {
                            let Held { req, mut inner, .. } = held.take().expect(POLLED);
                            let future = inner.call(req);
                            this.state.set(State::Inner {
                                future,
                                permit: Some(permit),
                            });
                            continue;
                        }
                        // The gate never drops a waiter it has not served; refuse if it does.
                        Poll::Ready(Err(_)) => Refusal::Waited {
                            waited: since.elapsed(),
                        },
                        Poll::Pending => {
                            ready!(sleep.poll(cx));
                            Refusal::Waited {
                                waited: since.elapsed(),
                            }
                        }
                    };
                    let held = held.take().expect(POLLED);
                    tracing::debug!(shedder = %held.shared.name, priority = %held.class, "no slot within max_wait; request shed");
                    held.shared.gate.record_shed(held.class);
                    // Dropping the receiver (with the state) leaves the line; a slot sent
                    // meanwhile goes back to the gate.
                    let response =
                        held.shared
                            .refuse(&RequestView::new(&held.req), held.class, refusal);
                    this.state.set(State::Rejected {
                        response: Some(response),
                    });
                }
            }
        }
    }
}
