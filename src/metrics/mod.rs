//! Metrics: what the limiter decides and how its store behaves, through the
//! [`metrics`](https://docs.rs/metrics) facade (feature `metrics`).
//!
//! With the `metrics` feature the layer and the stores record the metrics below into whatever
//! recorder the application installs (`metrics-exporter-prometheus`, `metrics-exporter-statsd`,
//! ...). tollgate never installs an exporter itself. Without the feature nothing is recorded and
//! the recording compiles to nothing. The facade is `metrics` 0.24: a recorder built on another
//! major version (`metrics-exporter-prometheus` before 0.18, say) compiles but receives nothing
//! from tollgate.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `tollgate_decisions_total` | counter | `limit`, `plan`, `outcome` | every decision of every limit; `outcome` is `allowed`, `rejected` or `shadow_rejected` (a limit in shadow mode that would have refused) |
//! | `tollgate_near_limit_total` | counter | `limit`, `plan` | allowed decisions that left less than a share of the limit (default 10%: `remaining < 0.1 × limit`) |
//! | `tollgate_store_seconds` | histogram | `store` (`memory`, `redis`) | store latency: every Redis round trip; one in 64 in-memory checks (sampled: timing every one would cost as much as the check) |
//! | `tollgate_store_errors_total` | counter | `kind` (`timeout`, `unavailable`, `invalid_response`, `other`) | Redis calls that failed, including calls not sent because the node's circuit breaker is open (`unavailable`) |
//! | `tollgate_breaker_open` | gauge | `node` | 1 while the circuit breaker of a Redis node (`host:port`; `default` for a single node) is open, 0 once closed |
//! | `tollgate_keys` | gauge | `limit` | keys held by the in-memory store for the limit (also the Redis store's local fallback); set when a table grows |
//! | `tollgate_shed_limit` | gauge | `shedder` | the [load shedder](crate::load_shed)'s concurrency limit, set as it changes |
//! | `tollgate_shed_in_flight` | gauge | `shedder` | requests holding one of the load shedder's slots |
//! | `tollgate_shed_total` | counter | `shedder`, `priority` (`critical`, `default`, `sheddable`) | requests the load shedder refused |
//! | `tollgate_shed_baseline_seconds` | gauge | `shedder` | the no-load latency the adaptive limit compares the recent latency with |
//!
//! `limit` is the limit's name and `plan` the plan that decided (`""` when the limit has no
//! plans or decided by its own quota: Prometheus treats an empty label as absent). No label ever
//! holds a client key: the label sets are bounded by the configured limits, plans and Redis nodes.
//!
//! A decision is counted once per limit per request, as the store decided it: when one limit
//! refuses a request that another allowed, the other's decision still counts as `allowed` (it was
//! not charged: several limits are all-or-nothing).
//!
//! Recording a decision looks its counters up in a small per-thread cache, so after the first
//! request of each limit and plan it costs a thread-local lookup and the recorder's increment.
//! The cache follows the recorder in use: handles obtained before an exporter is installed (or
//! under a thread-local recorder in a test) are not reused after.
//!
//! # Examples
//!
//! The metric names, for queries and tests:
//!
//! ```
//! use tollgate::metrics;
//!
//! assert_eq!(metrics::DECISIONS_TOTAL, "tollgate_decisions_total");
//! assert_eq!(metrics::STORE_SECONDS, "tollgate_store_seconds");
//! ```
//!
//! Describing the metrics (units and help texts: the Prometheus exporter prints them as `# HELP`
//! lines) in the recorder the application installed:
//!
//! ```
//! # #[cfg(feature = "metrics")] {
//! use metrics_util::debugging::DebuggingRecorder;
//!
//! let recorder = DebuggingRecorder::new();
//! metrics::with_local_recorder(&recorder, || tollgate::metrics::describe());
//! # }
//! ```

use crate::decision::Decision;
use crate::error::ConfigError;

/// Counter of decisions, by `limit`, `plan` and `outcome`.
pub const DECISIONS_TOTAL: &str = "tollgate_decisions_total";
/// Counter of allowed decisions that left less than the near-limit share, by `limit` and `plan`.
pub const NEAR_LIMIT_TOTAL: &str = "tollgate_near_limit_total";
/// Histogram of store latency in seconds, by `store`.
pub const STORE_SECONDS: &str = "tollgate_store_seconds";
/// Counter of failed store calls, by `kind`.
pub const STORE_ERRORS_TOTAL: &str = "tollgate_store_errors_total";
/// Gauge, 1 while a Redis node's circuit breaker is open, by `node`.
pub const BREAKER_OPEN: &str = "tollgate_breaker_open";
/// Gauge of the keys the in-memory store holds, by `limit`.
pub const KEYS: &str = "tollgate_keys";
/// Gauge of a load shedder's concurrency limit, by `shedder`.
pub const SHED_LIMIT: &str = "tollgate_shed_limit";
/// Gauge of the requests holding a load shedder's slots, by `shedder`.
pub const SHED_IN_FLIGHT: &str = "tollgate_shed_in_flight";
/// Counter of requests a load shedder refused, by `shedder` and `priority`.
pub const SHED_TOTAL: &str = "tollgate_shed_total";
/// Gauge of a load shedder's no-load latency in seconds, by `shedder`.
pub const SHED_BASELINE_SECONDS: &str = "tollgate_shed_baseline_seconds";

/// Registers units and descriptions of every tollgate metric with the current recorder.
///
/// Optional: exporters print them (Prometheus `# HELP` lines). Call it after installing the
/// recorder.
#[cfg(feature = "metrics")]
#[cfg_attr(all(docsrs, not(tollgate_docs_stable)), doc(cfg(feature = "metrics")))]
pub fn describe() {
    use metrics::Unit;
    metrics::describe_counter!(
        DECISIONS_TOTAL,
        Unit::Count,
        "Rate-limit decisions by limit, plan and outcome (allowed, rejected, shadow_rejected)."
    );
    metrics::describe_counter!(
        NEAR_LIMIT_TOTAL,
        Unit::Count,
        "Allowed decisions that left less than the near-limit share of the limit."
    );
    metrics::describe_histogram!(
        STORE_SECONDS,
        Unit::Seconds,
        "Rate-limit store latency (every Redis round trip; 1 in 64 in-memory checks)."
    );
    metrics::describe_counter!(
        STORE_ERRORS_TOTAL,
        Unit::Count,
        "Failed rate-limit store calls by kind."
    );
    metrics::describe_gauge!(
        BREAKER_OPEN,
        "1 while the circuit breaker of a Redis node is open."
    );
    metrics::describe_gauge!(
        KEYS,
        Unit::Count,
        "Keys held by the in-memory rate-limit store, by limit."
    );
    metrics::describe_gauge!(
        SHED_LIMIT,
        Unit::Count,
        "The load shedder's concurrency limit."
    );
    metrics::describe_gauge!(
        SHED_IN_FLIGHT,
        Unit::Count,
        "Requests holding one of the load shedder's slots."
    );
    metrics::describe_counter!(
        SHED_TOTAL,
        Unit::Count,
        "Requests the load shedder refused, by priority."
    );
    metrics::describe_gauge!(
        SHED_BASELINE_SECONDS,
        Unit::Seconds,
        "The no-load latency the load shedder's adaptive limit compares with."
    );
}

/// The share of a limit under which an allowed decision counts as near the limit, held as parts
/// per million so that the check needs no floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NearLimit {
    ppm: u32,
}

impl Default for NearLimit {
    fn default() -> Self {
        Self::DEFAULT
    }
}
impl NearLimit {
    /// 10%: near the limit when `remaining < 0.1 × limit`.
    pub(crate) const DEFAULT: Self = Self { ppm: 100_000 };

    /// `share` of the limit, between 0 (never near) and 1 (near whenever anything is spent).
    pub(crate) fn new(share: f64) -> Result<Self, ConfigError> {
        if !(0.0..=1.0).contains(&share) {
            return Err(ConfigError::new(
                "near_limit_share",
                format!("{share} is not a share of the limit: use a number from 0.0 to 1.0, e.g. 0.1 for 10%"),
            ));
        }
        // In [0, 1e6], so the cast neither truncates nor saturates.
        Ok(Self {
            ppm: (share * 1e6).round() as u32,
        })
    }

    /// Whether `decision` leaves less than this share of its limit.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn is_near(self, decision: &Decision) -> bool {
        u128::from(decision.remaining()) * 1_000_000
            < u128::from(self.ppm) * u128::from(decision.limit())
    }
}

/// Counts `decision` in `tollgate_decisions_total` (a refusal of a limit in shadow mode as
/// `shadow_rejected`), and in `tollgate_near_limit_total` if it is allowed and `near` says so.
#[cfg(feature = "metrics")]
#[inline]
pub(crate) fn record_decision(decision: &Decision, shadow: bool, near: NearLimit) {
    let outcome = match (decision.allowed(), shadow) {
        (true, _) => Outcome::Allowed,
        (false, false) => Outcome::Rejected,
        (false, true) => Outcome::ShadowRejected,
    };
    let near = outcome == Outcome::Allowed && near.is_near(decision);
    cache::with_decision_counters(decision, |c| {
        c.outcome[outcome as usize].increment(1);
        if near {
            c.near.increment(1);
        }
    });
}

#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn record_decision(_decision: &Decision, _shadow: bool, _near: NearLimit) {}

/// Which store a latency is of.
#[cfg(feature = "metrics")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreKind {
    Memory,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Redis,
}

/// Records one store call's latency in `tollgate_store_seconds`.
#[cfg(feature = "metrics")]
fn record_store_latency(store: StoreKind, elapsed: std::time::Duration) {
    let histogram = match store {
        StoreKind::Memory => metrics::histogram!(STORE_SECONDS, "store" => "memory"),
        StoreKind::Redis => metrics::histogram!(STORE_SECONDS, "store" => "redis"),
    };
    histogram.record(elapsed.as_secs_f64());
}

/// Runs `check` (one in-memory store check), timing one call in [`MEMORY_SAMPLE`] per thread
/// into `tollgate_store_seconds{store="memory"}`. The others cost a thread-local increment.
#[cfg(feature = "metrics")]
#[cfg_attr(not(test), allow(dead_code))]
#[inline]
pub(crate) fn time_memory_check<T>(check: impl FnOnce() -> T) -> T {
    use std::cell::Cell;
    thread_local!(static CALLS: Cell<u32> = const { Cell::new(0) });
    let n = CALLS.with(|c| {
        let n = c.get();
        c.set(n.wrapping_add(1));
        n
    });
    if !n.is_multiple_of(MEMORY_SAMPLE) {
        return check();
    }
    let start = std::time::Instant::now();
    let out = check();
    record_store_latency(StoreKind::Memory, start.elapsed());
    out
}

/// The start of one in-memory store check: `Some` (the time now) for the one call in
/// [`MEMORY_SAMPLE`] per thread that is timed, `None` for the others (a thread-local
/// increment). Give it back to [`memory_check_done`]. Unlike [`time_memory_check`], the check
/// itself runs once, inline, in the caller (its large answer is built in place).
#[cfg(feature = "metrics")]
#[inline]
pub(crate) fn memory_check_start() -> Option<std::time::Instant> {
    use std::cell::Cell;
    thread_local!(static CALLS: Cell<u32> = const { Cell::new(0) });
    let n = CALLS.with(|c| {
        let n = c.get();
        c.set(n.wrapping_add(1));
        n
    });
    if n.is_multiple_of(MEMORY_SAMPLE) {
        memory_sample_start()
    } else {
        None
    }
}

#[cfg(feature = "metrics")]
#[cold]
fn memory_sample_start() -> Option<std::time::Instant> {
    Some(std::time::Instant::now())
}

/// Records the check begun with [`memory_check_start`], if it is timed.
#[cfg(feature = "metrics")]
#[inline]
pub(crate) fn memory_check_done(start: Option<std::time::Instant>) {
    if let Some(start) = start {
        record_store_latency(StoreKind::Memory, start.elapsed());
    }
}

/// Without the `metrics` feature: nothing to time.
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn memory_check_start() {}

/// Without the `metrics` feature: nothing to record.
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn memory_check_done(_: ()) {}

/// Without the `metrics` feature: just the check.
#[cfg(not(feature = "metrics"))]
#[cfg_attr(not(test), allow(dead_code))]
#[inline(always)]
pub(crate) fn time_memory_check<T>(check: impl FnOnce() -> T) -> T {
    check()
}

/// One in-memory check in this many is timed.
#[cfg(feature = "metrics")]
const MEMORY_SAMPLE: u32 = 64;

/// Times one Redis round trip into `tollgate_store_seconds{store="redis"}`; empty without the
/// `metrics` feature.
#[cfg(feature = "redis")]
#[derive(Debug)]
pub(crate) struct RedisTimer {
    #[cfg(feature = "metrics")]
    start: std::time::Instant,
}

#[cfg(feature = "redis")]
impl RedisTimer {
    #[inline]
    pub(crate) fn start() -> Self {
        Self {
            #[cfg(feature = "metrics")]
            start: std::time::Instant::now(),
        }
    }

    /// The round trip is over (answered or failed).
    #[inline]
    pub(crate) fn finish(self) {
        #[cfg(feature = "metrics")]
        record_store_latency(StoreKind::Redis, self.start.elapsed());
    }
}

/// Counts one failed Redis call in `tollgate_store_errors_total{kind}`.
#[cfg(feature = "redis")]
#[inline]
pub(crate) fn record_store_error(kind: crate::error::StoreErrorKind) {
    #[cfg(feature = "metrics")]
    {
        use crate::error::StoreErrorKind;
        let counter = match kind {
            StoreErrorKind::Timeout => metrics::counter!(STORE_ERRORS_TOTAL, "kind" => "timeout"),
            StoreErrorKind::Unavailable => {
                metrics::counter!(STORE_ERRORS_TOTAL, "kind" => "unavailable")
            }
            StoreErrorKind::InvalidResponse => {
                metrics::counter!(STORE_ERRORS_TOTAL, "kind" => "invalid_response")
            }
            StoreErrorKind::Other => metrics::counter!(STORE_ERRORS_TOTAL, "kind" => "other"),
        };
        counter.increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// Sets `tollgate_breaker_open{node}` to 1 (open) or 0: `node` is the node's `host:port`, or
/// `""` for a single node (shown as `default`).
#[cfg(feature = "redis")]
#[inline]
pub(crate) fn record_breaker(node: &str, open: bool) {
    #[cfg(feature = "metrics")]
    {
        let node = if node.is_empty() { "default" } else { node };
        metrics::gauge!(BREAKER_OPEN, "node" => node.to_owned()).set(if open { 1.0 } else { 0.0 });
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (node, open);
}

/// The key count of one in-memory table, published to `tollgate_keys{limit}` when it grows.
///
/// A table only grows (a recycled slot holds a new key in place of an old one), at most its
/// `max_keys` times, so the atomic increment and the gauge update happen on insertions of new
/// keys only, never on a check of a key already held. Without the feature it is empty.
#[derive(Debug, Default)]
pub(crate) struct KeysGauge {
    #[cfg(feature = "metrics")]
    held: std::sync::atomic::AtomicU64,
}

impl KeysGauge {
    /// The table of `limit` holds one more key.
    #[inline]
    pub(crate) fn grew(&self, limit: crate::decision::Name) {
        #[cfg(feature = "metrics")]
        {
            let held = self
                .held
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .saturating_add(1);
            cache::with_keys_gauge(limit, |g| g.set(held as f64));
        }
        #[cfg(not(feature = "metrics"))]
        let _ = limit;
    }
}

/// The outcome label of a decision; the index of its counter.
#[cfg(feature = "metrics")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allowed = 0,
    Rejected = 1,
    ShadowRejected = 2,
}

#[cfg(feature = "metrics")]
const OUTCOMES: [&str; 3] = ["allowed", "rejected", "shadow_rejected"];

#[cfg(feature = "metrics")]
mod cache;
#[cfg(test)]
mod tests;
