//! The attempts of one outbound call: wait for the upstream's slot, send, read the answer, and
//! back off and send again while a refusal may be retried.
//!
//! One loop for every client the layer fits. The Tower service ([`Outbound`](super::Outbound))
//! and (feature `reqwest`) the `reqwest-middleware` middleware differ only in how they send an
//! attempt, copy a request and read an answer: an [`Exchange`] and its [`Answer`]s.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Extensions, HeaderMap, Response, StatusCode};

use super::layer::Retry;
use super::parse::UpstreamSignal;
use super::schedule::Schedule;

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

/// How one kind of client sends an attempt and copies a request for the next.
pub(crate) trait Exchange {
    type Request: Send;
    type Response: Answer + Send;
    type Error;

    /// Waits until the client can take a retry. The first attempt's readiness is the caller's
    /// (a Tower service is polled ready before it is called).
    fn ready(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Sends one attempt.
    fn send(
        &mut self,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, Self::Error>> + Send;

    /// The copy of `request` to send if this attempt is refused, or `None` when it must not be
    /// sent again. Called before the attempt, while the request is whole.
    fn replay(&self, request: &mut Self::Request) -> Option<Self::Request>;
}

/// What the loop reads of a response, and where it records [`OutboundInfo`].
pub(crate) trait Answer {
    fn status(&self) -> StatusCode;
    fn headers(&self) -> &HeaderMap;
    fn extensions_mut(&mut self) -> &mut Extensions;
}

impl<B> Answer for Response<B> {
    fn status(&self) -> StatusCode {
        Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        Response::headers(self)
    }

    fn extensions_mut(&mut self) -> &mut Extensions {
        Response::extensions_mut(self)
    }
}

/// Sends `req` to upstream `key` through `exchange`: each attempt waits for its slot on the
/// shared `schedule` (pauses, quota, slow start, window, `max_pause`), the answer is recorded
/// on the schedule, and a refusal is retried while `retry`, the request's replay and the
/// upstream's retry budget allow. Cancellation-safe: dropped at any await, a reserved slot is
/// given back (see [`Schedule::acquire_within`]).
pub(crate) async fn run<X>(
    mut exchange: X,
    mut req: X::Request,
    key: String,
    schedule: Arc<Schedule>,
    retry: Retry,
) -> Result<X::Response, X::Error>
where
    X: Exchange,
{
    let started = schedule.now();
    let max_pause = schedule.max_pause_micros();
    let deadline =
        started.saturating_add(u64::try_from(retry.deadline.as_micros()).unwrap_or(u64::MAX));
    let mut waited = Duration::ZERO;
    let mut attempt = 1u32;
    // The refusal a retry is for, kept until the retry has its slot within the deadline (or
    // returned when it has none), and the earliest the retry may go (its backoff).
    let mut refusal: Option<X::Response> = None;
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
            exchange.replay(&mut req)
        } else {
            None
        };
        if attempt > 1 {
            exchange.ready().await?;
        }
        slot.commit();
        if attempt == 1 {
            schedule.first_attempt(&key);
        }
        let res = exchange.send(req).await?;
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
fn with_info<A: Answer>(mut res: A, attempts: u32, waited: Duration) -> A {
    res.extensions_mut()
        .insert(OutboundInfo { attempts, waited });
    res
}
