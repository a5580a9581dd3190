//! [`LoadShedLayer`] and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{Response, StatusCode};
use tower_layer::Layer;

use super::gate::{Full, Gate};
use super::gradient::{Adaptive, Learner, LimitState};
use super::priority::{Classify, Priority};
use super::service::LoadShed;
use crate::clock::{Clock, TokioClock};
use crate::decision::Name;
use crate::error::ConfigError;
use crate::request::RequestView;
use crate::response::{grpc_retry_refusal, GrpcCode, ProblemDetails, RejectionBody};

/// The longest accepted queue `max_wait`: shedding is about seconds, not minutes.
const MAX_QUEUE_WAIT: Duration = Duration::from_secs(60);
/// The longest accepted `Retry-After`.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Why a request is refused.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal {
    /// Its class's share of the limit is in use (and its line, if any, is full).
    Shed(Full),
    /// It waited its class's `max_wait` in line.
    Waited { waited: Duration },
}

/// What the services share: the configuration and the slots.
pub(crate) struct Shared {
    pub(crate) name: Name,
    pub(crate) classify: Box<dyn Classify>,
    pub(crate) gate: Arc<Gate>,
    /// Each class's queue `max_wait` (`None`: no queue).
    pub(crate) max_wait: [Option<Duration>; 3],
    retry_after: Duration,
}

impl Shared {
    /// The response refusing a request of `class`: `503` with `Retry-After` and an RFC 9457
    /// problem+json body, or a gRPC `UNAVAILABLE` with `RetryInfo` to a gRPC call.
    pub(crate) fn refuse(
        &self,
        req: &RequestView<'_>,
        class: Priority,
        why: Refusal,
    ) -> Response<RejectionBody> {
        let name = self.name.as_str();
        let retry = self.retry_after_secs();
        let detail = match why {
            Refusal::Shed(Full { limit, share, .. }) => format!(
                "The service is overloaded: load shedder \"{name}\" lets {class} requests use {share} of its {limit} slots, all in use; retry in {retry} s."
            ),
            Refusal::Waited { waited } => format!(
                "The service is overloaded: no slot of load shedder \"{name}\" came free for this {class} request in {} ms; retry in {retry} s.",
                waited.as_millis()
            ),
        };
        if req.is_grpc() {
            return grpc_retry_refusal(GrpcCode::Unavailable, &detail, self.retry_after);
        }
        let mut problem = ProblemDetails::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "urn:tollgate:problem:overloaded",
            "Service Unavailable",
        )
        .detail(&detail)
        .member_str("policy", name)
        .member_str("priority", class.as_str());
        if let Refusal::Shed(Full {
            limit, in_flight, ..
        }) = why
        {
            problem = problem
                .member_u64("limit", u64::from(limit))
                .member_u64("in_flight", u64::from(in_flight));
        }
        let mut response = problem.member_u64("retry_after", retry).into_response();
        response
            .headers_mut()
            .insert(RETRY_AFTER, crate::headers::number(retry));
        response
    }

    /// `Retry-After` in whole seconds, rounded up.
    fn retry_after_secs(&self) -> u64 {
        crate::decision::ceil_secs(self.retry_after)
    }
}

/// Sheds load beyond a concurrency limit learned from latency, lowest priority first; see the
/// [module docs](super).
///
/// Built with [`LoadShedLayer::builder`]; cheap to clone (every clone and every service it
/// makes share one limit).
#[derive(Clone)]
pub struct LoadShedLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for LoadShedLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShedLayer")
            .field("name", &self.shared.name)
            .field("limit", &self.limit())
            .finish_non_exhaustive()
    }
}

impl LoadShedLayer {
    /// A builder with the defaults: an [`Adaptive`] limit, every request
    /// [`Priority::Default`], no queue, `Retry-After: 1`.
    pub fn builder() -> LoadShedLayerBuilder {
        LoadShedLayerBuilder {
            name: Name::new("shed"),
            limit: LimitConfig::Adaptive(Adaptive::new()),
            classify: Box::new(Priority::Default),
            shares: DEFAULT_SHARES,
            queues: [None; 3],
            retry_after: Duration::from_secs(1),
            clock: Arc::new(TokioClock::new()),
        }
    }

    /// The concurrency limit in force now.
    pub fn limit(&self) -> u32 {
        self.shared.gate.limit()
    }

    /// Requests holding a slot now.
    pub fn in_flight(&self) -> u32 {
        self.shared.gate.in_flight()
    }

    /// The no-load latency the adaptive limit compares with (`None` with a fixed limit or
    /// before the first request finished).
    pub fn baseline(&self) -> Option<Duration> {
        self.shared
            .gate
            .baseline_micros()
            .map(|us| Duration::from_micros(us as u64))
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LoadShed::from_shared(inner, Arc::clone(&self.shared))
    }
}

/// Each class's default share of the limit: critical all of it, default 90 %, sheddable 50 %.
const DEFAULT_SHARES: [f64; 3] = [1.0, 0.9, 0.5];

#[derive(Debug, Clone, Copy)]
enum LimitConfig {
    Fixed(u32),
    Adaptive(Adaptive),
}

#[derive(Debug, Clone, Copy)]
struct Queue {
    max_wait: Duration,
    max_waiting: usize,
}

/// Configures a [`LoadShedLayer`]; see the [module docs](super).
#[must_use]
pub struct LoadShedLayerBuilder {
    name: Name,
    limit: LimitConfig,
    classify: Box<dyn Classify>,
    shares: [f64; 3],
    queues: [Option<Queue>; 3],
    retry_after: Duration,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for LoadShedLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShedLayerBuilder")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .field("shares", &self.shares)
            .field("queues", &self.queues)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}

impl LoadShedLayerBuilder {
    /// The shedder's name, in refusal bodies and metric labels (default `"shed"`); at most
    /// [`Name::MAX_LEN`] (47) bytes, or [`build`](Self::build) refuses it.
    pub fn name(mut self, name: impl AsRef<str>) -> Self {
        self.name = Name::new(name);
        self
    }

    /// Learns the limit from latency with these settings (the default: [`Adaptive::new`]).
    pub fn adaptive(mut self, adaptive: Adaptive) -> Self {
        self.limit = LimitConfig::Adaptive(adaptive);
        self
    }

    /// A fixed limit of `limit` requests in flight, for a backend whose capacity you know.
    pub fn fixed_limit(mut self, limit: u32) -> Self {
        self.limit = LimitConfig::Fixed(limit);
        self
    }

    /// How a request's [`Priority`] is decided: a [`PriorityHeader`](super::PriorityHeader), a
    /// [`KeyPriority`](super::KeyPriority) or a closure (default: every request
    /// [`Priority::Default`]).
    pub fn priority(mut self, classify: impl Classify) -> Self {
        self.classify = Box::new(classify);
        self
    }

    /// The share of the limit requests of `class` may use, counting every class's requests
    /// in flight: from more than 0 to 1. Defaults: default 0.9, sheddable 0.5; critical
    /// requests always may use the whole limit.
    pub fn share(mut self, class: Priority, share: f64) -> Self {
        self.shares[class.index()] = share;
        self
    }

    /// Lets up to `max_waiting` requests of `class` wait for a slot, at most `max_wait` each
    /// (at most 60 s), instead of being refused at once. Freed slots go to the waiting
    /// requests of the most important class first, first come first served within a class.
    pub fn queue(mut self, class: Priority, max_wait: Duration, max_waiting: usize) -> Self {
        self.queues[class.index()] = Some(Queue {
            max_wait,
            max_waiting,
        });
        self
    }

    /// The `Retry-After` of a refusal (default 1 s, rounded up to whole seconds; from 1 ms to
    /// 1 hour).
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// The clock latencies are measured with (default [`TokioClock`], which follows
    /// `tokio::time::pause`).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Builds the layer, or says what is misconfigured.
    pub fn build(self) -> Result<LoadShedLayer, ConfigError> {
        crate::decision::refuse_over_long("name", "load shedder name", self.name)?;
        let limit = match self.limit {
            LimitConfig::Fixed(0) => {
                return Err(ConfigError::new(
                    "fixed_limit",
                    "a limit of 0 sheds every request; use at least 1",
                ));
            }
            LimitConfig::Fixed(n) => LimitState::Fixed(n),
            LimitConfig::Adaptive(a) => {
                a.validate()?;
                LimitState::Adaptive(Learner::new(a))
            }
        };
        if self.shares[Priority::Critical.index()] != 1.0 {
            return Err(ConfigError::new(
                "share",
                "critical requests always may use the whole limit; give default and sheddable requests a smaller share instead",
            ));
        }
        for class in [Priority::Default, Priority::Sheddable] {
            let share = self.shares[class.index()];
            if !(share > 0.0 && share <= 1.0) {
                return Err(ConfigError::new(
                    "share",
                    format!(
                        "a share of {share} for {class} requests is out of range: use more than 0 and at most 1 (0.5 lets them use half the limit)"
                    ),
                ));
            }
        }
        for queue in self.queues.iter().flatten() {
            if queue.max_wait.is_zero() || queue.max_wait > MAX_QUEUE_WAIT {
                return Err(ConfigError::new(
                    "queue.max_wait",
                    format!(
                        "a queue's max_wait of {:?} is out of range: use more than zero and at most 60 s; drop .queue(..) to refuse at once",
                        queue.max_wait
                    ),
                ));
            }
            if queue.max_waiting == 0 {
                return Err(ConfigError::new(
                    "queue.max_waiting",
                    "a queue needs room for at least one request; drop .queue(..) to refuse at once",
                ));
            }
        }
        if self.retry_after < Duration::from_millis(1) || self.retry_after > MAX_RETRY_AFTER {
            return Err(ConfigError::new(
                "retry_after",
                format!(
                    "a Retry-After of {:?} is out of range: use 1 ms to 1 hour (default 1 s)",
                    self.retry_after
                ),
            ));
        }
        // In (0, 1], so the cast neither truncates nor saturates.
        let shares_ppm = self.shares.map(|s| (s * 1e6).round() as u32);
        let queue_len = self.queues.map(|q| q.map_or(0, |q| q.max_waiting));
        let gate = Gate::new(
            limit,
            [1_000_000, shares_ppm[1], shares_ppm[2]],
            queue_len,
            self.clock,
            #[cfg(feature = "metrics")]
            super::metrics::ShedMetrics::new(self.name),
        );
        Ok(LoadShedLayer {
            shared: Arc::new(Shared {
                name: self.name,
                classify: self.classify,
                gate,
                max_wait: self.queues.map(|q| q.map(|q| q.max_wait)),
                retry_after: self.retry_after,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_configurations_name_their_field() {
        let field = |b: LoadShedLayerBuilder| b.build().unwrap_err().field();
        let b = LoadShedLayer::builder;
        assert_eq!(field(b().fixed_limit(0)), "fixed_limit");
        assert_eq!(field(b().share(Priority::Sheddable, 0.0)), "share");
        assert_eq!(field(b().share(Priority::Default, 1.5)), "share");
        assert_eq!(field(b().share(Priority::Critical, 0.5)), "share");
        assert_eq!(
            field(b().queue(Priority::Critical, Duration::ZERO, 4)),
            "queue.max_wait"
        );
        assert_eq!(
            field(b().queue(Priority::Critical, Duration::from_secs(61), 4)),
            "queue.max_wait"
        );
        assert_eq!(
            field(b().queue(Priority::Critical, Duration::from_secs(1), 0)),
            "queue.max_waiting"
        );
        assert_eq!(field(b().retry_after(Duration::ZERO)), "retry_after");
        assert_eq!(field(b().name("n".repeat(48))), "name");
        assert_eq!(
            field(b().adaptive(Adaptive::new().min_limit(0))),
            "adaptive.min_limit"
        );
        assert!(b().build().is_ok());
    }
}
