//! [`OutboundLayer`] and its builder.

use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::backoff::Backoff;
use super::budget::RetryBudget;
use super::key::Authority;
use super::replay::Idempotent;
use super::schedule::{Schedule, ScheduleConfig, UpstreamStatus};
use super::service::Outbound;
use crate::algorithm::Gcra;
use crate::clock::{Clock, TokioClock};
use crate::{ConfigError, Quota};

/// The most [`OutboundLayerBuilder::max_attempts`] can be.
pub(crate) const MAX_ATTEMPTS: u32 = 10;
/// The longest [`OutboundLayerBuilder::retry_deadline`] can be: 10 minutes.
pub(crate) const MAX_RETRY_DEADLINE: Duration = Duration::from_secs(600);
/// The longest [`OutboundLayerBuilder::max_pause`] can be: an hour.
pub(crate) const MAX_MAX_PAUSE: Duration = Duration::from_secs(3_600);

/// Retry settings, copied into every service.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retry {
    pub(crate) max_attempts: u32,
    pub(crate) deadline: Duration,
    pub(crate) backoff: Backoff,
}

/// Wraps a client so it keeps to its upstreams' limits. See the [module docs](super).
///
/// Every service this layer makes, and every clone of them, shares one schedule per upstream:
/// build the layer once and apply it to the client all callers use.
#[derive(Debug)]
pub struct OutboundLayer<K = Authority, R = Idempotent> {
    pub(super) schedule: Arc<Schedule>,
    pub(super) key: Arc<K>,
    pub(super) replay: Arc<R>,
    pub(super) retry: Retry,
}

impl<K, R> Clone for OutboundLayer<K, R> {
    fn clone(&self) -> Self {
        Self {
            schedule: self.schedule.clone(),
            key: self.key.clone(),
            replay: self.replay.clone(),
            retry: self.retry,
        }
    }
}

impl OutboundLayer {
    /// An adaptive layer with the defaults: no quota of its own (it learns each upstream's
    /// from its headers), up to 3 attempts within 30 s while the [`RetryBudget`] allows,
    /// waits the upstream imposes cut at 60 s, keyed by authority.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder, starting from [`new`](Self::new)'s defaults.
    pub fn builder() -> OutboundLayerBuilder {
        OutboundLayerBuilder::new()
    }
}

impl Default for OutboundLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, R> OutboundLayer<K, R> {
    /// The state of upstream `key`, if it was called through this layer.
    pub fn status(&self, key: &str) -> Option<UpstreamStatus> {
        self.schedule.status(key)
    }
}

impl<S, K, R> Layer<S> for OutboundLayer<K, R> {
    type Service = Outbound<S, K, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Outbound {
            inner,
            schedule: self.schedule.clone(),
            key: self.key.clone(),
            replay: self.replay.clone(),
            retry: self.retry,
        }
    }
}

/// Builds an [`OutboundLayer`]; [`build`](Self::build) checks the configuration.
///
/// | setting | default |
/// |---|---|
/// | [`quota`](Self::quota) | none: adaptive only |
/// | [`adaptive`](Self::adaptive) | on |
/// | [`upstream_key`](Self::upstream_key) | [`Authority`] |
/// | [`replay`](Self::replay) | [`Idempotent`] |
/// | [`max_attempts`](Self::max_attempts) | 3 (1 to 10) |
/// | [`retry_deadline`](Self::retry_deadline) | 30 s (at most 600 s) |
/// | [`backoff`](Self::backoff) | 100 ms doubling to 10 s, full jitter (1 ms to 600 s) |
/// | [`retry_budget`](Self::retry_budget) | 20% of first attempts + 1/s, over 10 s |
/// | [`max_pause`](Self::max_pause) | 60 s (above 0, at most 3,600 s) |
/// | [`max_upstreams`](Self::max_upstreams) | 1024 |
/// | [`clock`](Self::clock) | [`TokioClock`] |
#[derive(Debug)]
#[must_use]
pub struct OutboundLayerBuilder<K = Authority, R = Idempotent> {
    quota: Option<Quota>,
    adaptive: bool,
    key: K,
    replay: R,
    retry: Retry,
    budget: RetryBudget,
    max_pause: Duration,
    max_upstreams: usize,
    clock: Option<Arc<dyn Clock>>,
}

impl OutboundLayerBuilder {
    fn new() -> Self {
        Self {
            quota: None,
            adaptive: true,
            key: Authority,
            replay: Idempotent::new(),
            retry: Retry {
                max_attempts: 3,
                deadline: Duration::from_secs(30),
                backoff: Backoff::default(),
            },
            budget: RetryBudget::default(),
            max_pause: Duration::from_secs(60),
            max_upstreams: 1024,
            clock: None,
        }
    }
}

impl<K, R> OutboundLayerBuilder<K, R> {
    /// Sends to each upstream at most at `quota`, waiting for a slot rather than failing:
    /// `Quota::per_second(10).burst(1)` spaces calls 100 ms apart; a larger burst lets that
    /// many go at once after a quiet spell. A rate learned in adaptive mode only ever slows
    /// this down.
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quota = Some(quota);
        self
    }

    /// Whether to learn each upstream's limits from its headers and keep to them (default:
    /// on). With no [`quota`](Self::quota), a new upstream gets one request at a time until
    /// an answer shows it has room.
    pub fn adaptive(mut self, adaptive: bool) -> Self {
        self.adaptive = adaptive;
        self
    }

    /// Keys upstreams by `key` (default: the request's [`Authority`]).
    pub fn upstream_key<K2>(self, key: K2) -> OutboundLayerBuilder<K2, R> {
        OutboundLayerBuilder {
            quota: self.quota,
            adaptive: self.adaptive,
            key,
            replay: self.replay,
            retry: self.retry,
            budget: self.budget,
            max_pause: self.max_pause,
            max_upstreams: self.max_upstreams,
            clock: self.clock,
        }
    }

    /// Decides which refused requests are sent again (default: [`Idempotent`]; [`NoReplay`]
    /// for bodies that cannot be cloned).
    ///
    /// [`NoReplay`]: super::NoReplay
    pub fn replay<R2>(self, replay: R2) -> OutboundLayerBuilder<K, R2> {
        OutboundLayerBuilder {
            quota: self.quota,
            adaptive: self.adaptive,
            key: self.key,
            replay,
            retry: self.retry,
            budget: self.budget,
            max_pause: self.max_pause,
            max_upstreams: self.max_upstreams,
            clock: self.clock,
        }
    }

    /// Sends a request at most `attempts` times (default 3; 1 never retries; at most 10). The
    /// [`retry_budget`](Self::retry_budget) may stop retries sooner.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.retry.max_attempts = attempts;
        self
    }

    /// Retries only while the next attempt can start within `deadline` of the call (default
    /// 30 s, at most 600 s); past it, the last refusal is returned.
    pub fn retry_deadline(mut self, deadline: Duration) -> Self {
        self.retry.deadline = deadline;
        self
    }

    /// The backoff between attempts (default: 100 ms doubling to 10 s, full jitter; the base at
    /// least 1 ms, the max at most 600 s).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.retry.backoff = backoff;
        self
    }

    /// Caps retries to each upstream at a share of its recent first attempts (default: 20% of
    /// the last 10 s's first attempts, plus 10). See [`RetryBudget`].
    pub fn retry_budget(mut self, budget: RetryBudget) -> Self {
        self.budget = budget;
        self
    }

    /// The longest any upstream-imposed wait holds a call (default 60 s, at most 3,600 s): a
    /// longer `Retry-After` or reset pauses this long (and the next refusal pauses again); a
    /// learned limit's slot, a slow start's slot after a pause, or a full window of calls in
    /// flight holds a call at most this long from the call (for a retry, from its backoff's
    /// end), after which it is sent.
    pub fn max_pause(mut self, max_pause: Duration) -> Self {
        self.max_pause = max_pause;
        self
    }

    /// How many upstreams to keep state for (default 1024); beyond it, idle ones are dropped.
    pub fn max_upstreams(mut self, max_upstreams: usize) -> Self {
        self.max_upstreams = max_upstreams;
        self
    }

    /// The clock slots and pauses are decided on (default [`TokioClock`], so
    /// `#[tokio::test(start_paused = true)]` drives the layer). Waiting always sleeps on
    /// tokio's timer for the time this clock says is left.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The layer, or what is misconfigured.
    pub fn build(self) -> Result<OutboundLayer<K, R>, ConfigError> {
        let configured = self.quota.map(Gcra::new).transpose()?;
        if configured.is_none() && !self.adaptive {
            return Err(ConfigError::new(
                "outbound.quota",
                "an outbound layer with neither a quota nor adaptive mode would not shape anything: set .quota(Quota::per_second(10)) or leave .adaptive(true)",
            ));
        }
        if self.retry.max_attempts == 0 || self.retry.max_attempts > MAX_ATTEMPTS {
            return Err(ConfigError::new(
                "outbound.max_attempts",
                format!(
                    "max_attempts is the number of sends, 1 to {MAX_ATTEMPTS}, not {}: use .max_attempts(1) for no retries, .max_attempts(3) for two",
                    self.retry.max_attempts
                ),
            ));
        }
        if self.retry.deadline > MAX_RETRY_DEADLINE {
            return Err(ConfigError::new(
                "outbound.retry_deadline",
                format!(
                    "retry_deadline {:?} is over {MAX_RETRY_DEADLINE:?}: use e.g. .retry_deadline(Duration::from_secs(30))",
                    self.retry.deadline
                ),
            ));
        }
        self.retry.backoff.validate()?;
        self.budget.validate()?;
        if self.max_pause.is_zero() || self.max_pause > MAX_MAX_PAUSE {
            return Err(ConfigError::new(
                "outbound.max_pause",
                format!(
                    "max_pause must be positive (or upstream pauses would be ignored) and at most {MAX_MAX_PAUSE:?}, not {:?}: use e.g. .max_pause(Duration::from_secs(60))",
                    self.max_pause
                ),
            ));
        }
        if self.max_upstreams == 0 {
            return Err(ConfigError::new(
                "outbound.max_upstreams",
                "max_upstreams must be at least 1: use e.g. .max_upstreams(1024)",
            ));
        }
        let clock = self
            .clock
            .unwrap_or_else(|| Arc::new(TokioClock::new()) as Arc<dyn Clock>);
        let schedule = Schedule::new(
            ScheduleConfig {
                configured,
                adaptive: self.adaptive,
                max_pause: self.max_pause,
                max_upstreams: self.max_upstreams,
                budget: self.budget,
            },
            clock,
        );
        Ok(OutboundLayer {
            schedule: Arc::new(schedule),
            key: Arc::new(self.key),
            replay: Arc::new(self.replay),
            retry: self.retry,
        })
    }
}
