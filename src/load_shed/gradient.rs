//! [`Adaptive`]: the concurrency limit learned from latency (a gradient over a no-load
//! baseline), and [`LimitState`], its state as requests finish.

use crate::error::ConfigError;

/// How the shedder learns its concurrency limit from latency; see the
/// [module docs](super#the-limit-learned-from-latency) for the algorithm and why these defaults.
///
/// ```
/// use tollgate::load_shed::{Adaptive, LoadShedLayer};
///
/// let layer = LoadShedLayer::builder()
///     .adaptive(Adaptive::new().min_limit(2).max_limit(200).tolerance(1.5))
///     .build()?;
/// assert_eq!(layer.limit(), 20); // the initial limit, until requests teach it better
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adaptive {
    initial: u32,
    min: u32,
    max: u32,
    tolerance: f64,
    smoothing: f64,
}

impl Default for Adaptive {
    fn default() -> Self {
        Self::new()
    }
}

impl Adaptive {
    /// The defaults: initial limit 20, between 1 and 1000, tolerance 1.5, smoothing 0.2.
    pub const fn new() -> Self {
        Self {
            initial: 20,
            min: 1,
            max: 1000,
            tolerance: 1.5,
            smoothing: 0.2,
        }
    }

    /// The limit before the first request finishes (default 20).
    #[must_use]
    pub const fn initial_limit(mut self, limit: u32) -> Self {
        self.initial = limit;
        self
    }

    /// The lowest the limit goes (default 1, at least 1).
    #[must_use]
    pub const fn min_limit(mut self, limit: u32) -> Self {
        self.min = limit;
        self
    }

    /// The highest the limit goes (default 1000).
    #[must_use]
    pub const fn max_limit(mut self, limit: u32) -> Self {
        self.max = limit;
        self
    }

    /// How many times the no-load latency the recent latency may reach before the limit comes
    /// down (default 1.5, from 1.1 to 10): the queue the backend is allowed to keep.
    #[must_use]
    pub const fn tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// How far one finished request moves the limit towards its new value (default 0.2, more
    /// than 0 and at most 1).
    #[must_use]
    pub const fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = smoothing;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.min == 0 {
            return Err(ConfigError::new(
                "adaptive.min_limit",
                "a minimum limit of 0 could shed every request for good; use at least 1",
            ));
        }
        if self.max < self.min {
            return Err(ConfigError::new(
                "adaptive.max_limit",
                format!(
                    "the maximum limit {} is below the minimum {}; use a maximum of at least the minimum",
                    self.max, self.min
                ),
            ));
        }
        if !(self.min..=self.max).contains(&self.initial) {
            return Err(ConfigError::new(
                "adaptive.initial_limit",
                format!(
                    "the initial limit {} is outside min_limit..=max_limit ({}..={}); use a value in that range",
                    self.initial, self.min, self.max
                ),
            ));
        }
        if !(1.1..=10.0).contains(&self.tolerance) {
            return Err(ConfigError::new(
                "adaptive.tolerance",
                format!(
                    "a tolerance of {} is out of range: use 1.1 to 10 (1.5 lets latency grow by half over its no-load value)",
                    self.tolerance
                ),
            ));
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return Err(ConfigError::new(
                "adaptive.smoothing",
                format!(
                    "a smoothing of {} is out of range: use more than 0 and at most 1 (default 0.2)",
                    self.smoothing
                ),
            ));
        }
        Ok(())
    }
}

/// Weight of one sample in the recent latency (an exponential moving average over about ten
/// requests).
const RECENT_WEIGHT: f64 = 0.1;
/// Weight of one sample in the short average the baseline may fall to (about three requests:
/// one fast outlier cannot drag the baseline down, three in a row can).
const FLOOR_WEIGHT: f64 = 0.5;
/// Weight in the no-load baseline of one sample taken without load (see [`LOW_LOAD`]).
const BASELINE_ALONE_WEIGHT: f64 = 0.125;
/// Requests in flight (the sample's own included) at which a sample counts as taken without
/// load: a backend worth protecting takes two requests at once without queueing either.
const LOW_LOAD: u32 = 2;
/// The largest cut of one step: the gradient never goes below this.
const MIN_GRADIENT: f64 = 0.5;

/// The limit as requests finish: a fixed one, or one learned from latency.
#[derive(Debug, Clone)]
pub(crate) enum LimitState {
    Fixed(u32),
    Adaptive(Learner),
}

impl LimitState {
    /// The limit in force, in requests.
    pub(crate) fn limit(&self) -> u32 {
        match self {
            LimitState::Fixed(n) => *n,
            LimitState::Adaptive(l) => l.limit(),
        }
    }

    /// A request finished in `rtt_micros` after it started with `in_flight` requests in flight
    /// (itself included); `busy` says whether the limit is in use (all of it in flight, or a
    /// request refused or queued since the last sample): only then may it move.
    pub(crate) fn sample(&mut self, rtt_micros: u64, in_flight: u32, busy: bool) {
        if let LimitState::Adaptive(l) = self {
            l.sample(rtt_micros, in_flight, busy);
        }
    }

    /// The no-load latency in microseconds (None before the first sample, or with a fixed limit).
    pub(crate) fn baseline_micros(&self) -> Option<f64> {
        match self {
            LimitState::Fixed(_) => None,
            LimitState::Adaptive(l) => l.baseline,
        }
    }
}

/// The adaptive limit's state.
#[derive(Debug, Clone)]
pub(crate) struct Learner {
    config: Adaptive,
    limit: f64,
    /// The no-load latency (µs).
    baseline: Option<f64>,
    /// The recent latency (µs): a moving average of the last few samples.
    recent: Option<f64>,
    /// The latency of the last three or so samples (µs): what the baseline may fall to.
    floor: Option<f64>,
}

impl Learner {
    pub(crate) fn new(config: Adaptive) -> Self {
        Self {
            config,
            limit: f64::from(config.initial),
            baseline: None,
            recent: None,
            floor: None,
        }
    }

    pub(crate) fn limit(&self) -> u32 {
        // In [min, max] by construction; the cast only drops the fraction.
        (self.limit as u32).clamp(self.config.min, self.config.max)
    }

    fn sample(&mut self, rtt_micros: u64, in_flight: u32, busy: bool) {
        let rtt = (rtt_micros as f64).max(1.0);
        let recent = match self.recent {
            None => rtt,
            Some(r) => r + (rtt - r) * RECENT_WEIGHT,
        };
        self.recent = Some(recent);
        let floor = match self.floor {
            None => rtt,
            Some(f) => f + (rtt - f) * FLOOR_WEIGHT,
        };
        self.floor = Some(floor);
        // The baseline falls at once to a faster recent latency (the backend got faster), and
        // follows the requests that ran with at most one other in flight (nothing of ours queued
        // in front of them).
        let baseline = match self.baseline {
            None => rtt,
            Some(b) if floor < b => floor,
            Some(b) if in_flight <= LOW_LOAD => b + (rtt - b) * BASELINE_ALONE_WEIGHT,
            Some(b) => b,
        };
        self.baseline = Some(baseline);
        let Adaptive {
            min,
            max,
            tolerance,
            smoothing,
            ..
        } = self.config;
        let gradient = (tolerance * baseline / recent).clamp(MIN_GRADIENT, 1.0);
        let target = if !busy {
            // Under light load nothing is learned about the limit: it stays. Latency that grows
            // while the limit is not in use is not ours to cut.
            self.limit
        } else if gradient < 1.0 {
            self.limit * gradient
        } else {
            // Room to grow, and the limit is in use: about √limit more per limit's worth of
            // requests (a round trip of every slot).
            self.limit + self.limit.sqrt()
        };
        // Per limit's worth of finished requests (a round trip of every slot): a cut of up to
        // `smoothing × √limit` halves, a growth of `smoothing × √limit`.
        let step = if gradient < 1.0 {
            smoothing / self.limit.sqrt()
        } else {
            smoothing / self.limit
        };
        self.limit =
            (self.limit + (target - self.limit) * step).clamp(f64::from(min), f64::from(max));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a learner against a backend of `capacity` slots of `work` µs each, kept busy: a
    /// request's latency is `work × in_flight / capacity` once the backend is full.
    fn run(learner: &mut Learner, capacity: u32, work: u64, samples: usize) {
        for _ in 0..samples {
            let in_flight = learner.limit();
            let rtt = work * u64::from(in_flight.max(capacity)) / u64::from(capacity);
            learner.sample(rtt, in_flight, true);
        }
    }

    #[test]
    fn converges_near_tolerance_times_capacity_from_above_and_below() {
        for initial in [1, 200] {
            let mut l = Learner::new(Adaptive::new().initial_limit(initial).max_limit(1000));
            l.sample(50_000, 1, false); // one request alone: the baseline
            run(&mut l, 4, 50_000, 2_000);
            let limit = l.limit();
            assert!((4..=10).contains(&limit), "from {initial}: {limit}");
        }
    }

    #[test]
    fn baseline_follows_a_faster_backend_at_once_and_a_slower_one_alone() {
        let mut l = Learner::new(Adaptive::new());
        for _ in 0..50 {
            l.sample(50_000, 1, false);
        }
        assert_eq!(l.baseline.map(|b| b.round()), Some(50_000.0));
        for _ in 0..50 {
            l.sample(20_000, 1, false);
        }
        assert!(l.baseline.unwrap() < 21_000.0, "{:?}", l.baseline);
        // Slower again, with requests alone in flight: the baseline rises to it.
        for _ in 0..100 {
            l.sample(50_000, 1, false);
        }
        assert!(l.baseline.unwrap() > 49_000.0, "{:?}", l.baseline);
        // Slow requests that queued behind others never raise it.
        let before = l.baseline;
        for _ in 0..100 {
            l.sample(500_000, 8, true);
        }
        assert_eq!(l.baseline, before);
    }

    #[test]
    fn light_load_keeps_the_limit_even_when_slow() {
        let mut l = Learner::new(Adaptive::new());
        for _ in 0..1000 {
            l.sample(50_000, 1, false);
        }
        assert_eq!(l.limit(), 20);
        // Ten times slower with the limit not in use (other clients, a starved CPU): kept.
        for _ in 0..1000 {
            l.sample(500_000, 3, false);
        }
        assert_eq!(l.limit(), 20);
    }

    #[test]
    fn bounds_hold() {
        let mut l = Learner::new(Adaptive::new().min_limit(3).initial_limit(3).max_limit(5));
        l.sample(1_000, 1, false);
        for _ in 0..1000 {
            l.sample(1_000_000, 5, true);
        }
        assert_eq!(l.limit(), 3);
        for _ in 0..1000 {
            l.sample(1_000, 5, true);
        }
        assert_eq!(l.limit(), 5);
    }

    #[test]
    fn invalid_settings_name_their_field() {
        let field = |a: Adaptive| a.validate().unwrap_err().field();
        assert_eq!(field(Adaptive::new().min_limit(0)), "adaptive.min_limit");
        assert_eq!(
            field(Adaptive::new().min_limit(5).max_limit(4)),
            "adaptive.max_limit"
        );
        assert_eq!(
            field(Adaptive::new().initial_limit(2000)),
            "adaptive.initial_limit"
        );
        assert_eq!(field(Adaptive::new().tolerance(1.0)), "adaptive.tolerance");
        assert_eq!(
            field(Adaptive::new().tolerance(f64::NAN)),
            "adaptive.tolerance"
        );
        assert_eq!(field(Adaptive::new().smoothing(0.0)), "adaptive.smoothing");
        assert!(Adaptive::new().validate().is_ok());
    }
}
