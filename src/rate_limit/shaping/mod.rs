//! Shaping: a request that does not fit a shaped limit now waits for its turn, up to a
//! `max_wait`, instead of being refused (user-facing docs on [`Shape`](super::Shape)).
//!
//! The option itself, [`Shape`](super::Shape), and its compiled form are the limit's (`limit/shape.rs`); this
//! module is the request side:
//! - [`schedules`]: the places waiting requests hold per schedule (limit and key);
//! - [`waiting`]: the layer's bound on waiting requests, and a waiting request's reservation.

mod schedules;
mod waiting;

use std::time::Duration;

pub(crate) use schedules::Deciding;
pub(crate) use waiting::{reserve, Reservation, Waiting};

/// The default bound on requests waiting in one layer, across keys
/// ([`RateLimitLayerBuilder::max_waiting`](crate::RateLimitLayerBuilder::max_waiting)).
pub const DEFAULT_MAX_WAITING: usize = 10_000;

/// How long a shaped request waited for its turn: in the request's extensions (for the handler)
/// and in the response's (for outer middleware). Absent when the request did not wait.
///
/// ```
/// use std::time::Duration;
/// use tollgate::rate_limit::ShapedDelay;
///
/// let waited = ShapedDelay::new(Duration::from_millis(100));
/// assert_eq!(waited.get(), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShapedDelay(Duration);

impl ShapedDelay {
    /// A delay of `delay`.
    pub const fn new(delay: Duration) -> Self {
        Self(delay)
    }

    /// The delay.
    pub const fn get(&self) -> Duration {
        self.0
    }
}
