//! [`ResponseFuture`]: waits for the store when it answers asynchronously, then for the inner
//! service, and writes rate-limit headers on the way out.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ResponseBody;
use super::layer::Shared;
use super::service::{finish, Finish, Outcome, Plan};
use crate::response::RejectionBody;
use crate::store::Store;

/// What a pending store check needs to finish the request.
struct Waiting<S, ReqBody, St> {
    req: Request<ReqBody>,
    inner: S,
    plan: Plan,
    shared: Arc<Shared<St>>,
}

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit).
    ///
    /// With a store that decides synchronously (the in-memory store) it is the inner service's
    /// future plus the headers to write; with a networked store it first waits for the check.
    /// No allocation either way.
    pub struct ResponseFuture<S, ReqBody, St>
    where
        S: Service<Request<ReqBody>>,
        St: Store,
    {
        #[pin]
        state: State<St::Future, S::Future, Waiting<S, ReqBody, St>>,
        outcome: Option<Outcome>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<C, F, W> {
        Checking {
            #[pin]
            check: C,
            waiting: Option<W>,
        },
        Inner {
            #[pin]
            future: F,
        },
        Rejected {
            response: Option<Response<RejectionBody>>,
        },
    }
}

impl<S, ReqBody, St> ResponseFuture<S, ReqBody, St>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    pub(crate) fn inner(future: S::Future, outcome: Option<Outcome>) -> Self {
        Self {
            state: State::Inner { future },
            outcome,
        }
    }

    pub(crate) fn rejected(response: Response<RejectionBody>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
            outcome: None,
        }
    }

    pub(crate) fn checking(
        check: St::Future,
        req: Request<ReqBody>,
        inner: S,
        plan: Plan,
        shared: Arc<Shared<St>>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                waiting: Some(Waiting {
                    req,
                    inner,
                    plan,
                    shared,
                }),
            },
            outcome: None,
        }
    }
}

impl<S, ReqBody, St> fmt::Debug for ResponseFuture<S, ReqBody, St>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Inner { .. } => "inner",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody, St> Future for ResponseFuture<S, ReqBody, St>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    St: Store,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, waiting } => {
                    let result = ready!(check.poll(cx));
                    let Waiting {
                        req,
                        mut inner,
                        plan,
                        shared,
                    } = waiting
                        .take()
                        .expect("ResponseFuture polled after completion");
                    match finish(&shared, req, &plan, result) {
                        Finish::Proceed(req, outcome) => {
                            let future = inner.call(req);
                            *this.outcome = Some(outcome);
                            this.state.set(State::Inner { future });
                        }
                        Finish::Reject(response) => {
                            this.state.set(State::Rejected { response: None });
                            return Poll::Ready(Ok(response.map(ResponseBody::rejection)));
                        }
                    }
                }
                StateProj::Inner { future } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(outcome) = this.outcome.take() {
                        outcome.apply(&mut response);
                    }
                    return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                }
                StateProj::Rejected { response } => {
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(response.map(ResponseBody::rejection)));
                }
            }
        }
    }
}
