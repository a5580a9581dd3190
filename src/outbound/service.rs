//! [`Outbound`]: the client-side service.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::key::{Authority, UpstreamKey};
use super::layer::Retry;
use super::parse::UpstreamSignal;
use super::replay::{Idempotent, Replay};
use super::schedule::{Schedule, UpstreamStatus};

/// What the layer did for one call, in the response's extensions.
///
/// ```
/// # use tollgate::outbound::OutboundInfo;
/// # fn read(res: &http::Response<()>) {
/// if let Some(info) = res.extensions().get::<OutboundInfo>() {
///     println!("{} attempts, waited {:?}", info.attempts(), info.waited());
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboundInfo {
    attempts: u32,
    waited: Duration,
}

impl OutboundInfo {
    /// Requests sent, the last one being this response's (1 when there was no retry).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time spent waiting before sending: for slots, pauses and backoff.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

/// Keeps a client to its upstreams' limits. Made by [`OutboundLayer`](super::OutboundLayer);
/// see the [module docs](super).
///
/// Clones share the layer's state: a pause one caller sees holds back every clone.
#[derive(Debug)]
pub struct Outbound<S, K = Authority, R = Idempotent> {
    pub(crate) inner: S,
    pub(crate) schedule: Arc<Schedule>,
    pub(crate) key: Arc<K>,
    pub(crate) replay: Arc<R>,
    pub(crate) retry: Retry,
}

impl<S: Clone, K, R> Clone for Outbound<S, K, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            schedule: self.schedule.clone(),
            key: self.key.clone(),
            replay: self.replay.clone(),
            retry: self.retry,
        }
    }
}

impl<S, K, R> Outbound<S, K, R> {
    /// The wrapped client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped client, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped client, without the layer.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The state of upstream `key` (as the [`UpstreamKey`] names it), if it was called.
    pub fn status(&self, key: &str) -> Option<UpstreamStatus> {
        self.schedule.status(key)
    }
}

impl<S, K, R, ReqBody, ResBody> Service<Request<ReqBody>> for Outbound<S, K, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    K: UpstreamKey<ReqBody>,
    R: Replay<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The instance polled ready is the one the first attempt calls.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let key = self.key.upstream_key(&req);
        let call = run(
            inner,
            req,
            key,
            self.schedule.clone(),
            self.replay.clone(),
            self.retry,
        );
        ResponseFuture {
            inner: Box::pin(call),
        }
    }
}

async fn run<S, R, ReqBody, ResBody>(
    mut inner: S,
    mut req: Request<ReqBody>,
    key: String,
    schedule: Arc<Schedule>,
    replay: Arc<R>,
    retry: Retry,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    R: Replay<ReqBody>,
{
    let started = schedule.now();
    let max_pause = schedule.max_pause_micros();
    let deadline =
        started.saturating_add(u64::try_from(retry.deadline.as_micros()).unwrap_or(u64::MAX));
    let mut waited = Duration::ZERO;
    let mut attempt = 1u32;
    // The refusal a retry is for, kept until the retry has its slot within the deadline (or
    // returned when it has none), and the earliest the retry may go (its backoff).
    let mut refusal: Option<Response<ResBody>> = None;
    let mut not_before = 0;
    loop {
        let before = schedule.now();
        let mut slot = match refusal.take() {
            // The first attempt: the upstream's pauses, learned limits and gates hold it at
            // most `max_pause` from the call, and it has no deadline to give up at.
            None => {
                let hold_until = started.saturating_add(max_pause);
                match schedule.acquire_within(&key, 0, hold_until, u64::MAX).await {
                    Some(slot) => slot,
                    None => unreachable!("no slot is after the end of time"),
                }
            }
            Some(refused) => match schedule
                .acquire_within(
                    &key,
                    not_before,
                    not_before.max(before).saturating_add(max_pause),
                    deadline,
                )
                .await
            {
                Some(slot) => slot,
                None => {
                    waited += Duration::from_micros(schedule.now().saturating_sub(before));
                    tracing::debug!(upstream = %key, attempt = attempt - 1, "outbound: refused, no time left to retry");
                    return Ok(with_info(refused, attempt - 1, waited));
                }
            },
        };
        waited += Duration::from_micros(schedule.now().saturating_sub(before));
        let next = if attempt < retry.max_attempts {
            replay.replay(&req)
        } else {
            None
        };
        if attempt > 1 {
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
        }
        slot.commit();
        if attempt == 1 {
            schedule.first_attempt(&key);
        }
        let res = inner.call(req).await?;
        let signal = UpstreamSignal::from_headers(res.status(), res.headers(), schedule.unix_now());
        schedule.observe(&slot, &signal);
        drop(slot);
        let retry_with = match next {
            Some(next) if signal.refused() => next,
            _ => return Ok(with_info(res, attempt, waited)),
        };
        if !schedule.take_retry(&key) {
            tracing::debug!(upstream = %key, attempt, "outbound: refused, retry budget spent");
            return Ok(with_info(res, attempt, waited));
        }
        // Full jitter; a pause the upstream asked for, and the quota's next slot, may make the
        // retry later still: `acquire_within` waits for whichever is latest, and gives up at
        // once when that is past the deadline.
        let backoff = schedule.jitter.up_to(retry.backoff.ceiling(attempt));
        not_before = schedule
            .now()
            .saturating_add(u64::try_from(backoff.as_micros()).unwrap_or(u64::MAX));
        tracing::debug!(
            upstream = %key,
            attempt,
            status = res.status().as_u16(),
            backoff_ms = backoff.as_millis() as u64,
            "outbound: refused, retrying"
        );
        refusal = Some(res);
        req = retry_with;
        attempt += 1;
    }
}

/// `res` with what the layer did for it.
fn with_info<B>(mut res: Response<B>, attempts: u32, waited: Duration) -> Response<B> {
    res.extensions_mut()
        .insert(OutboundInfo { attempts, waited });
    res
}
