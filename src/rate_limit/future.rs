//! [`ResponseFuture`]: waits for a plan lookup or the store when they answer asynchronously,
//! then for the inner service, writes rate-limit headers on the way out, and gives back charges
//! the response does not keep.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::applied::Applied;
use super::body::ResponseBody;
use super::decide::{answered, begin, Begin};
use super::follow_up::{shaping_wait, Followup};
use super::outcome::{respond, Outcome};
use super::shared::Shared;
use super::snapshot::Snapshot;
use crate::response::RejectionBody;
use crate::store::Store;

/// What a pending step needs to finish the request.
struct Waiting<S, ReqBody, St: Store> {
    req: Request<ReqBody>,
    inner: S,
    shared: Arc<Shared<St>>,
    step: Step<St>,
}

/// Which step is pending.
enum Step<St: Store> {
    Lookup(u8),
    Check(Applied, Arc<Snapshot<St>>, Option<Followup<St>>),
    Shadow(Option<Outcome>, Followup<St>),
    /// Waits for the shadow check started with the enforcing one (in the followup).
    ShadowStarted(Option<Outcome>, Followup<St>),
    /// Shaping: waits for its turn (the reservation is in the future's followup).
    Shaped,
}

type Lookup = Pin<Box<dyn Future<Output = ()> + Send>>;

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit).
    ///
    /// With a store that decides synchronously (the in-memory store) it is the inner service's
    /// future plus the headers to write; with a networked store it first waits for the check.
    /// No allocation either way, unless a limit decides by outcome or in shadow.
    #[project = FutureProj]
    pub struct ResponseFuture<S, ReqBody, St>
    where
        S: Service<Request<ReqBody>>,
        St: Store,
    {
        #[pin]
        state: State<St::Future, S::Future, Box<Waiting<S, ReqBody, St>>, S::Response>,
        outcome: Option<Outcome>,
        followup: Option<Followup<St>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<C, F, W, R> {
        Resolving {
            lookup: Option<Lookup>,
            waiting: Option<W>,
        },
        Checking {
            #[pin]
            check: C,
            waiting: Option<W>,
        },
        // The shadow limits' check, started with the enforcing one, is still to answer.
        Shadowing {
            waiting: Option<W>,
        },
        Inner {
            #[pin]
            future: F,
        },
        // Shaping: waits for the request's turn, then calls the inner service.
        Shaping {
            #[pin]
            sleep: tokio::time::Sleep,
            waiting: Option<W>,
        },
        Refunding {
            #[pin]
            refund: C,
            response: Option<R>,
            more: Vec<C>,
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
    pub(super) fn inner(
        future: S::Future,
        outcome: Option<Outcome>,
        followup: Option<Followup<St>>,
    ) -> Self {
        Self {
            state: State::Inner { future },
            outcome,
            followup,
        }
    }

    pub(super) fn rejected(response: Response<RejectionBody>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
            outcome: None,
            followup: None,
        }
    }

    /// A request that waits for its turn (shaping) before the inner service is called.
    pub(super) fn shaped(
        req: Request<ReqBody>,
        inner: S,
        shared: Arc<Shared<St>>,
        outcome: Option<Outcome>,
        followup: Option<Followup<St>>,
    ) -> Self {
        Self {
            state: shaping_state(req, inner, shared, &followup),
            outcome,
            followup,
        }
    }

    /// A request waiting for a lookup or the store (`begin` is neither `Proceed` nor `Reject`).
    pub(super) fn waiting(
        begin: Begin<St>,
        req: Request<ReqBody>,
        inner: S,
        shared: Arc<Shared<St>>,
    ) -> Self {
        Self {
            state: waiting_state(begin, req, inner, shared),
            outcome: None,
            followup: None,
        }
    }
}

/// The state of a future whose request waits for its turn (shaping).
#[allow(clippy::type_complexity)]
fn shaping_state<S, ReqBody, St>(
    req: Request<ReqBody>,
    inner: S,
    shared: Arc<Shared<St>>,
    followup: &Option<Followup<St>>,
) -> State<St::Future, S::Future, Box<Waiting<S, ReqBody, St>>, S::Response>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    let delay = shaping_wait(followup).map_or(Duration::ZERO, |r| r.delay());
    State::Shaping {
        sleep: tokio::time::sleep(delay),
        waiting: Some(Box::new(Waiting {
            req,
            inner,
            shared,
            step: Step::Shaped,
        })),
    }
}

/// The state of a future waiting for the lookup or store call `begin` names.
#[allow(clippy::type_complexity)]
fn waiting_state<S, ReqBody, St>(
    begin: Begin<St>,
    req: Request<ReqBody>,
    inner: S,
    shared: Arc<Shared<St>>,
) -> State<St::Future, S::Future, Box<Waiting<S, ReqBody, St>>, S::Response>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    let (step, check) = match begin {
        Begin::Resolve(lookup, lookups) => {
            return State::Resolving {
                lookup: Some(lookup),
                waiting: Some(Box::new(Waiting {
                    req,
                    inner,
                    shared,
                    step: Step::Lookup(lookups),
                })),
            }
        }
        Begin::Pending(check, applied, snapshot, followup) => {
            (Step::Check(applied, snapshot, followup), check)
        }
        Begin::Shadow(check, outcome, followup) => (Step::Shadow(outcome, followup), check),
        Begin::ShadowStarted(outcome, followup) => {
            return State::Shadowing {
                waiting: Some(Box::new(Waiting {
                    req,
                    inner,
                    shared,
                    step: Step::ShadowStarted(outcome, followup),
                })),
            }
        }
        Begin::Proceed(..) | Begin::Reject(..) => {
            unreachable!("a future waits only for a lookup or a store call")
        }
    };
    State::Checking {
        check,
        waiting: Some(Box::new(Waiting {
            req,
            inner,
            shared,
            step,
        })),
    }
}

impl<S, ReqBody, St> fmt::Debug for ResponseFuture<S, ReqBody, St>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Resolving { .. } => "resolving",
            State::Checking { .. } => "checking",
            State::Shadowing { .. } => "shadowing",
            State::Inner { .. } => "inner",
            State::Shaping { .. } => "shaping",
            State::Refunding { .. } => "refunding",
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
            // What the pending step produced: the next `Begin`, to be turned into a state.
            let next: Begin<St>;
            let waiting: Box<Waiting<S, ReqBody, St>>;
            match this.state.as_mut().project() {
                StateProj::Resolving { lookup, waiting: w } => {
                    if let Some(f) = lookup.as_mut() {
                        ready!(f.as_mut().poll(cx));
                    }
                    *lookup = None;
                    waiting = w.take().expect("ResponseFuture polled after completion");
                    let Waiting {
                        mut req,
                        inner,
                        shared,
                        step,
                    } = *waiting;
                    let Step::Lookup(lookups) = step else {
                        unreachable!("only a plan lookup is waited for here")
                    };
                    next = begin(&shared, &mut req, lookups);
                    advance(&mut this, next, req, inner, shared);
                    continue;
                }
                StateProj::Checking { check, waiting: w } => {
                    // A shadow check started with this one runs at the same time.
                    if let Some(Waiting {
                        step: Step::Check(_, _, Some(f)),
                        ..
                    }) = w.as_deref_mut()
                    {
                        let _ = f.poll_shadow(cx);
                    }
                    let result = ready!(check.poll(cx));
                    waiting = w.take().expect("ResponseFuture polled after completion");
                    let Waiting {
                        mut req,
                        inner,
                        shared,
                        step,
                    } = *waiting;
                    next = match step {
                        Step::Check(applied, snapshot, followup) => {
                            answered(&shared, &snapshot, &mut req, &applied, result, followup)
                        }
                        Step::Shadow(mut outcome, mut followup) => {
                            followup.record_shadow(result, &mut outcome);
                            Begin::Proceed(outcome, Some(followup))
                        }
                        Step::Lookup(_) | Step::Shaped | Step::ShadowStarted(..) => {
                            unreachable!("a lookup or a wait is not a store check")
                        }
                    };
                    advance(&mut this, next, req, inner, shared);
                    continue;
                }
                StateProj::Shadowing { waiting: w } => {
                    if let Some(Waiting {
                        step: Step::ShadowStarted(_, f),
                        ..
                    }) = w.as_deref_mut()
                    {
                        ready!(f.poll_shadow(cx));
                    }
                    let Waiting {
                        req,
                        inner,
                        shared,
                        step,
                    } = *w.take().expect("ResponseFuture polled after completion");
                    let next = match step {
                        Step::ShadowStarted(mut outcome, mut followup) => {
                            followup.finish_started_shadow(&mut outcome);
                            Begin::Proceed(outcome, Some(followup))
                        }
                        _ => unreachable!("only a started shadow check is waited for here"),
                    };
                    advance(&mut this, next, req, inner, shared);
                    continue;
                }
                StateProj::Inner { future } => {
                    let response = ready!(future.poll(cx))?;
                    let mut pending = match this.followup.as_ref() {
                        Some(f) => f.start_refunds(response.status()),
                        None => Vec::new(),
                    };
                    if let Some(refund) = pending.pop() {
                        this.state.set(State::Refunding {
                            refund,
                            response: Some(response),
                            more: pending,
                        });
                        continue;
                    }
                    return Poll::Ready(Ok(respond(this.outcome, response)));
                }
                StateProj::Shaping { sleep, waiting: w } => {
                    ready!(sleep.poll(cx));
                    let Waiting { req, mut inner, .. } =
                        *w.take().expect("ResponseFuture polled after completion");
                    // The request's turn: its reservation is spent, not given back.
                    if let Some(r) = this.followup.as_mut().and_then(|f| f.reservation.take()) {
                        r.release();
                    }
                    let future = inner.call(req);
                    this.state.set(State::Inner { future });
                    continue;
                }
                StateProj::Refunding {
                    refund,
                    response,
                    more,
                } => {
                    if let Err(error) = ready!(refund.poll(cx)) {
                        tracing::warn!(error = %error, "rate-limit store could not give a charge back");
                    }
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    if let Some(next) = more.pop() {
                        let more = std::mem::take(more);
                        this.state.set(State::Refunding {
                            refund: next,
                            response: Some(response),
                            more,
                        });
                        continue;
                    }
                    return Poll::Ready(Ok(respond(this.outcome, response)));
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

/// Moves the future to the state for `next`.
fn advance<S, ReqBody, St>(
    this: &mut FutureProj<'_, S, ReqBody, St>,
    next: Begin<St>,
    req: Request<ReqBody>,
    mut inner: S,
    shared: Arc<Shared<St>>,
) where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    match next {
        // A shaped request that must wait for its turn waits here.
        Begin::Proceed(outcome, followup) if shaping_wait(&followup).is_some() => {
            let state = shaping_state(req, inner, shared, &followup);
            *this.outcome = outcome;
            *this.followup = followup;
            this.state.set(state);
        }
        Begin::Proceed(outcome, followup) => {
            let future = inner.call(req);
            *this.outcome = outcome;
            *this.followup = followup;
            this.state.set(State::Inner { future });
        }
        Begin::Reject(response) => {
            this.state.set(State::Rejected {
                response: Some(response),
            });
        }
        waiting => this.state.set(waiting_state(waiting, req, inner, shared)),
    }
}
