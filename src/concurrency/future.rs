//! [`ResponseFuture`]: waits for a slot when it is not free at once, then for the inner
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

use super::body::{ResponseBody, Slot};
use super::layer::{Refusal, Shared};
use super::table::MemoryPermit;
use crate::error::StoreError;
use crate::request::RequestView;
use crate::response::RejectionBody;

/// A slot taken over the network: the slot, or the count in flight when all are taken.
pub(crate) type Leasing =
    Pin<Box<dyn Future<Output = Result<Result<Slot, u32>, StoreError>> + Send>>;

/// The request and the service to call once a slot is held.
struct Held<S, ReqBody> {
    req: Request<ReqBody>,
    inner: S,
    shared: Arc<Shared>,
}

pin_project! {
    /// Response future of [`ConcurrencyLimit`](super::ConcurrencyLimit).
    ///
    /// When a slot is free at once (the common case) it is the inner service's future; a
    /// queued request first waits for a slot (one channel and one timer), a Redis slot for
    /// its lease.
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
            rx: oneshot::Receiver<MemoryPermit>,
            #[pin]
            sleep: Sleep,
            since: Instant,
            held: Option<H>,
        },
        Leasing {
            lease: Leasing,
            held: Option<H>,
        },
        Inner {
            #[pin]
            future: F,
            slot: Option<Slot>,
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
    pub(crate) fn inner(future: S::Future, slot: Option<Slot>) -> Self {
        Self {
            state: State::Inner { future, slot },
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
        rx: oneshot::Receiver<MemoryPermit>,
        max_wait: Duration,
        req: Request<ReqBody>,
        inner: S,
        shared: Arc<Shared>,
    ) -> Self {
        let since = Instant::now();
        // The builder bounds `max_wait`; past the clock's range the wait is tokio's longest.
        let sleep = match since.checked_add(max_wait) {
            Some(deadline) => tokio::time::sleep_until(deadline),
            None => tokio::time::sleep(max_wait),
        };
        Self {
            state: State::Queued {
                rx,
                sleep,
                since,
                held: Some(Held { req, inner, shared }),
            },
        }
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn leasing(
        lease: Leasing,
        req: Request<ReqBody>,
        inner: S,
        shared: Arc<Shared>,
    ) -> Self {
        Self {
            state: State::Leasing {
                lease,
                held: Some(Held { req, inner, shared }),
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
            State::Leasing { .. } => "leasing",
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
            let (slot, held) = match this.state.as_mut().project() {
                StateProj::Inner { future, slot } => {
                    let response = ready!(future.poll(cx))?;
                    let slot = slot.take();
                    return Poll::Ready(Ok(response.map(|b| ResponseBody::inner(b, slot))));
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
                } => match Pin::new(rx).poll(cx) {
                    Poll::Ready(Ok(permit)) => (Slot::Memory(permit), held.take().expect(POLLED)),
                    Poll::Ready(Err(_)) => {
                        // The table never drops a waiter it has not served; refuse if it does.
                        let held = held.take().expect(POLLED);
                        let response = refuse(
                            &held,
                            Refusal::Full {
                                in_flight: held.shared.max_in_flight,
                            },
                        );
                        this.state.set(State::Rejected {
                            response: Some(response),
                        });
                        continue;
                    }
                    Poll::Pending => {
                        ready!(sleep.poll(cx));
                        let held = held.take().expect(POLLED);
                        let waited = since.elapsed();
                        tracing::debug!(policy = %held.shared.name, waited_ms = waited.as_millis() as u64, "no concurrency slot within max_wait; request refused");
                        // Dropping the receiver (with the state) leaves the queue; a slot sent
                        // meanwhile goes back to the table.
                        let response = refuse(&held, Refusal::Waited { waited });
                        this.state.set(State::Rejected {
                            response: Some(response),
                        });
                        continue;
                    }
                },
                StateProj::Leasing { lease, held } => {
                    let result = ready!(lease.as_mut().poll(cx));
                    let held = held.take().expect(POLLED);
                    match result {
                        Ok(Ok(slot)) => (slot, held),
                        Ok(Err(in_flight)) => {
                            tracing::debug!(policy = %held.shared.name, in_flight, "concurrency limit reached; request refused");
                            let response = refuse(&held, Refusal::Full { in_flight });
                            this.state.set(State::Rejected {
                                response: Some(response),
                            });
                            continue;
                        }
                        Err(error) if held.shared.fail_open => {
                            tracing::warn!(error = %error, policy = %held.shared.name, "concurrency slot store failed; request let through");
                            let Held { req, mut inner, .. } = held;
                            let future = inner.call(req);
                            this.state.set(State::Inner { future, slot: None });
                            continue;
                        }
                        Err(error) => {
                            tracing::warn!(error = %error, policy = %held.shared.name, "concurrency slot store failed; request refused");
                            let response = refuse(&held, Refusal::Unavailable);
                            this.state.set(State::Rejected {
                                response: Some(response),
                            });
                            continue;
                        }
                    }
                }
            };
            let Held { req, mut inner, .. } = held;
            let future = inner.call(req);
            this.state.set(State::Inner {
                future,
                slot: Some(slot),
            });
        }
    }
}

fn refuse<S, ReqBody>(held: &Held<S, ReqBody>, why: Refusal) -> Response<RejectionBody> {
    held.shared.refuse(&RequestView::new(&held.req), why)
}
