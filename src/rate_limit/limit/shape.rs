//! [`Shape`]: how a limit shapes (a request that does not fit now waits for its turn), and a
//! limit's shaping compiled against its quota.

use std::time::Duration;

use crate::algorithm::AlgorithmKind;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::Quota;

/// How a [`Limit`](crate::Limit) shapes: how long a request may wait for its turn, and how
/// many units may wait per key. `Duration` converts into it.
///
/// # Shaping
///
/// A request that does not fit its limit now waits until it does, up to a
/// `max_wait`, instead of being refused.
///
/// Shaping needs no second algorithm. The token bucket, GCRA and the leaky bucket keep one
/// schedule per key (GCRA's theoretical arrival time; the buckets' deficit is the same number
/// read from the other end), and a request that does not fit has a
/// [`retry_after`](crate::Decision::retry_after): the moment its units will have been emitted.
/// A shaped limit lets the store *reserve* that future moment: the store decides it at a
/// tolerance widened by the `max_wait` (the quota's burst plus the units the rate emits in
/// `max_wait`), so a request that would wait no longer than `max_wait` is admitted and charged
/// now, and the schedule moves on past it. The layer reads from the decision how far past the
/// limit's own burst the request landed, which is how long it must wait, and the response
/// future sleeps that long (one `tokio::time::Sleep`, no task, no queue structure) before it
/// calls the inner service.
///
/// Everything else follows from the schedule:
/// - **first come, first served per key**: each reservation lands after the previous one;
/// - **the same on every backend**: the store does what it always does at a larger burst, so a
///   Redis store shares one schedule between instances with no change to its scripts;
/// - **bounded per key**: at most `max_wait × rate` units (or [`Shape::max_queued`]) wait per
///   key, enforced by the store itself;
/// - **cancellation-safe**: a waiting request that is dropped frees exactly its own place. The
///   layer tracks places per schedule as the store keeps them (one per limit and key, whatever
///   the requests' costs and other limits). The next request of that schedule with the same
///   cost and no other shaped limit, arriving before the freed place is due, takes it over, and
///   its own place, the last of the schedule, goes back to the store with [`Store::refund`](crate::store::Store::refund); a
///   freed place that is (or becomes) the last of the schedule goes back to the store at once
///   (one already due gives back only what has not refilled since its turn). So whatever is
///   cancelled, no two requests are given the same turn (over any window, at most
///   `burst + rate × span` units reach the service, with per-request costs too), and dropped
///   waiters leave no place behind that nobody will use (1,000 waiters dropped in arrival
///   order: the next request waits one interval). Refunds a networked store answers later
///   reach it in order per schedule, a stalled call holding up only the schedules of its
///   shard (one of 16), and at most 1,024 wait per shard: beyond, a place stays spent (the
///   store refuses more, never admits more; a warning is logged). Places are tracked by the
///   layer that reserved them, which holds a freed place back while a request of its key is
///   at the store. With several
///   instances sharing a Redis schedule, a place freed on one instance is taken over only by
///   that instance's requests, and given back to Redis when it is that instance's last place,
///   which may not be the shared schedule's last: then one later request may share its turn
///   with another instance's waiting request (one admission over the rate per such place).
///
/// The windows (fixed, sliding, log) have no schedule to reserve a place in: their units come
/// back all at once at a window's edge, so every waiter would be released together. Shaping
/// them is refused when the layer is built.
///
/// # Examples
///
/// One request every 100 ms; the others wait their turn, up to 1 s (time is tokio's paused
/// clock here, which the store reads through [`TokioClock`](crate::clock::TokioClock)):
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tollgate::clock::TokioClock;
/// use tollgate::key::GlobalKey;
/// use tollgate::rate_limit::ShapedDelay;
/// use tollgate::store::memory::MemoryBackend;
/// use tollgate::{AlgorithmKind, Limit, Quota, RateLimitLayer};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder()
///     .backend(MemoryBackend::new().clock(TokioClock::new()))
///     .limit(
///         Limit::new("smooth", Quota::per_second(10).burst(1))
///             .algorithm(AlgorithmKind::Gcra)
///             .key(GlobalKey)
///             .shape(Duration::from_secs(1)),
///     )
///     .build()?;
/// let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
///     Ok::<_, Infallible>(Response::new(String::new()))
/// }));
/// let waits: Vec<_> = (0..3).map(|_| tokio::spawn(svc.clone().oneshot(Request::new(())))).collect();
/// let mut delays = Vec::new();
/// for w in waits {
///     let res = w.await??;
///     assert_eq!(res.status(), StatusCode::OK);
///     delays.push(res.extensions().get::<ShapedDelay>().map(|d| d.get().as_millis()));
/// }
/// assert_eq!(delays, [None, Some(100), Some(200)]);
/// # Ok(())
/// # }
/// ```
///
/// A bound per key, and what happens beyond `max_wait`: refused as without shaping.
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tollgate::key::GlobalKey;
/// use tollgate::rate_limit::Shape;
/// use tollgate::{Limit, Quota, RateLimitLayer};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A slow rate: one a minute, at most one waiting.
/// let layer = RateLimitLayer::new(
///     Limit::new("slow", Quota::per_minute(1))
///         .key(GlobalKey)
///         .shape(Shape::new(Duration::from_secs(600)).max_queued(1)),
/// )?;
/// let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
///     Ok::<_, Infallible>(Response::new(String::new()))
/// }));
/// assert_eq!(svc.clone().oneshot(Request::new(())).await?.status(), StatusCode::OK);
/// let _waiting = tokio::spawn(svc.clone().oneshot(Request::new(())));
/// tokio::task::yield_now().await;
/// let refused = svc.clone().oneshot(Request::new(())).await?;
/// assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
/// # Ok(())
/// # }
/// ```
///
/// # Options
///
/// ```
/// use std::time::Duration;
/// use tollgate::key::PeerIp;
/// use tollgate::rate_limit::Shape;
/// use tollgate::{AlgorithmKind, Limit, Quota};
///
/// // Ten per second per client: a request beyond the burst waits up to 2 s for its turn, with
/// // at most 5 waiting per client; beyond either it is refused as usual.
/// let limit = Limit::new("smooth", Quota::per_second(10))
///     .algorithm(AlgorithmKind::Gcra)
///     .key(PeerIp::new())
///     .shape(Shape::new(Duration::from_secs(2)).max_queued(5));
/// # let _ = limit;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    max_wait: Duration,
    max_queued: Option<u64>,
}

impl Shape {
    /// Requests wait up to `max_wait` for their turn.
    pub const fn new(max_wait: Duration) -> Self {
        Self {
            max_wait,
            max_queued: None,
        }
    }

    /// At most `units` (requests, at a cost of 1) wait per key; beyond, a request is refused
    /// even if it would wait less than `max_wait`. By default `max_wait × rate` units wait.
    #[must_use]
    pub const fn max_queued(mut self, units: u64) -> Self {
        self.max_queued = Some(units);
        self
    }

    /// The longest a request waits.
    pub const fn max_wait(&self) -> Duration {
        self.max_wait
    }
}

impl From<Duration> for Shape {
    fn from(max_wait: Duration) -> Self {
        Self::new(max_wait)
    }
}

/// A limit's shaping, compiled against its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompiledShape {
    /// Units the store's tolerance is widened by: the most that wait per key.
    extra: u64,
    /// The limit's own burst.
    burst: u64,
    /// The limit's own burst takes this long to refill, rounded down (µs).
    full_us: u64,
}

/// Builds the shaping of a limit of `quota` with `algorithm`, or says why it cannot shape.
pub(crate) fn compile(
    shape: &Shape,
    quota: &Quota,
    algorithm: AlgorithmKind,
) -> Result<CompiledShape, ConfigError> {
    match algorithm {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => {}
        other => {
            return Err(ConfigError::new(
                "limit.shape",
                format!(
                    "{other} cannot shape: its units come back all at once at a window's edge, so there is no later slot to reserve and wait for; use gcra, token_bucket or leaky_bucket, or drop .shape(..)"
                ),
            ))
        }
    }
    let period_us = u128::from(quota.period_micros());
    let count = u128::from(quota.count());
    let interval = Duration::from_micros(u64::try_from(period_us / count.max(1)).unwrap_or(0));
    let fits = (shape.max_wait.as_micros().saturating_mul(count) / period_us.max(1)) as u64;
    let extra = match shape.max_queued {
        Some(0) => {
            return Err(ConfigError::new(
                "limit.shape.max_queued",
                "a queue of 0 units lets nobody wait; drop .shape(..) to refuse at once, or allow at least 1",
            ))
        }
        Some(n) => fits.min(n),
        None => fits,
    };
    if extra == 0 {
        return Err(ConfigError::new(
            "limit.shape.max_wait",
            format!(
                "a max_wait of {:?} is shorter than one unit's interval at {quota} ({interval:?}), so no request could wait; raise max_wait to at least {interval:?}, or drop .shape(..)",
                shape.max_wait
            ),
        ));
    }
    let burst = quota.burst_size();
    let widened = widen_quota(quota, extra)?;
    algorithm.validate(&widened).map_err(|e| {
        ConfigError::new(
            "limit.shape.max_wait",
            format!(
                "waiting up to {:?} makes the store's tolerance {widened}, which it cannot hold ({}); lower max_wait or max_queued",
                shape.max_wait,
                e.message()
            ),
        )
    })?;
    let full_us = u64::try_from(u128::from(burst) * period_us / count.max(1)).unwrap_or(u64::MAX);
    Ok(CompiledShape {
        extra,
        burst,
        full_us,
    })
}

fn widen_quota(quota: &Quota, extra: u64) -> Result<Quota, ConfigError> {
    let burst = quota.burst_size().checked_add(extra).ok_or_else(|| {
        ConfigError::new(
            "limit.shape.max_wait",
            "max_wait overflows the quota's burst; lower it",
        )
    })?;
    Ok(quota.burst(burst))
}

impl CompiledShape {
    /// The quota the store decides this limit at: the burst plus what may wait.
    pub(crate) fn widen(&self, quota: &Quota) -> Quota {
        widen_quota(quota, self.extra).unwrap_or(*quota)
    }

    /// How long an allowed request with decision `d` (in the limit's own terms, or at the
    /// widened quota: the reset is the same) waits for its turn in this limit's schedule.
    pub(crate) fn wait(&self, d: &Decision) -> Duration {
        d.reset()
            .saturating_sub(Duration::from_micros(self.full_us))
    }

    /// Turns a decision at the widened quota into the limit's own terms, and says how long an
    /// allowed request must wait for its turn (zero when it fits now).
    ///
    /// The wait is how far the key's schedule lies past the limit's own burst once this
    /// request is charged: `reset − burst / rate`. Rounded up to the microsecond, it is never
    /// shorter than the exact wait.
    ///
    /// A decision the store did not count (failure policy `Open`) stays uncounted: the request
    /// goes at once, and shows no numbers.
    pub(crate) fn unwiden(&self, d: Decision) -> (Decision, Duration) {
        if !d.is_counted() {
            return (Decision::uncounted(self.burst), Duration::ZERO);
        }
        let remaining = d.remaining().saturating_sub(self.extra);
        if d.allowed() {
            let shown = Decision::allowed_with(self.burst, remaining, d.reset());
            (shown, self.wait(&shown))
        } else if d.is_impossible() {
            (
                Decision::impossible(self.burst, remaining, d.reset()),
                Duration::ZERO,
            )
        } else {
            // The wait until the request could take a place in the queue.
            let retry = d.retry_after().unwrap_or_default();
            (
                Decision::rejected(self.burst, remaining, d.reset(), retry),
                Duration::ZERO,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(q: Quota, wait_ms: u64) -> Result<CompiledShape, ConfigError> {
        compile(
            &Shape::new(Duration::from_millis(wait_ms)),
            &q,
            AlgorithmKind::Gcra,
        )
    }

    #[test]
    fn widens_by_what_the_rate_emits_in_max_wait() {
        let s = shape(Quota::per_second(10).burst(2), 1_000).unwrap();
        assert_eq!(s.extra, 10);
        assert_eq!(s.widen(&Quota::per_second(10).burst(2)).burst_size(), 12);
        // Rounded down to whole intervals: 250 ms at 10/s is 2 units.
        assert_eq!(shape(Quota::per_second(10), 250).unwrap().extra, 2);
        let capped = compile(
            &Shape::new(Duration::from_secs(1)).max_queued(3),
            &Quota::per_second(10),
            AlgorithmKind::TokenBucket,
        )
        .unwrap();
        assert_eq!(capped.extra, 3);
    }

    #[test]
    fn refuses_what_cannot_shape() {
        let e = shape(Quota::per_minute(10), 5_000).unwrap_err();
        assert_eq!(e.field(), "limit.shape.max_wait");
        assert!(e.message().contains("6s"), "{}", e.message());
        for kind in [
            AlgorithmKind::FixedWindow,
            AlgorithmKind::SlidingWindow,
            AlgorithmKind::SlidingLog,
        ] {
            let e =
                compile(&Duration::from_secs(1).into(), &Quota::per_second(10), kind).unwrap_err();
            assert_eq!(e.field(), "limit.shape", "{kind}");
        }
        let e = compile(
            &Shape::new(Duration::from_secs(1)).max_queued(0),
            &Quota::per_second(10),
            AlgorithmKind::Gcra,
        )
        .unwrap_err();
        assert_eq!(e.field(), "limit.shape.max_queued");
    }

    #[test]
    fn reads_the_wait_from_the_widened_decision() {
        use crate::algorithm::{Algorithm, Gcra};
        let own = Quota::per_second(10).burst(2);
        let s = shape(own, 1_000).unwrap();
        let gcra = Gcra::new(s.widen(&own)).unwrap();
        let mut state = Default::default();
        let mut waits = Vec::new();
        for _ in 0..12 {
            let (d, wait) = s.unwiden(gcra.check(&mut state, 0, 1));
            assert!(d.allowed());
            assert_eq!(d.limit(), 2);
            waits.push(wait.as_millis());
        }
        assert_eq!(
            waits,
            [0, 0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]
        );
        let (d, wait) = s.unwiden(gcra.check(&mut state, 0, 1));
        assert!(!d.allowed());
        assert_eq!(wait, Duration::ZERO);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
        // 150 ms later the schedule has moved on: the next place is 950 ms away.
        let (d, wait) = s.unwiden(gcra.check(&mut state, 150_000, 1));
        assert!(d.allowed());
        assert_eq!(wait, Duration::from_millis(950));
    }

    #[test]
    fn the_wait_is_never_shorter_than_the_exact_one() {
        use crate::algorithm::{Algorithm, TokenBucket};
        // 3 per second: intervals of 333 333.3 µs.
        let own = Quota::per_second(3).burst(1);
        let s = shape(own, 2_000).unwrap();
        let tb = TokenBucket::new(s.widen(&own)).unwrap();
        let mut state = Default::default();
        for k in 0..=s.extra {
            let (d, wait) = s.unwiden(tb.check(&mut state, 0, 1));
            assert!(d.allowed());
            let exact_ns = k as u128 * 1_000_000_000 / 3;
            assert!(wait.as_nanos() >= exact_ns, "{k}: {wait:?}");
            assert!(wait.as_nanos() <= exact_ns + 2_000, "{k}: {wait:?}");
        }
    }
}
