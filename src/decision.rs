//! [`Decision`]: what a limiter answers for one request against one limit.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The name of a limit (`"burst"`, `"daily"`, `"global"`), as reported in headers and bodies.
///
/// Names are interned once when a limit is configured, so a `PolicyName` is a `Copy` pointer and
/// carrying it in every [`Decision`] costs nothing on the hot path. Memory used by interning is
/// bounded by the number of *distinct* names a program configures.
///
/// ```
/// use tollgate::PolicyName;
///
/// let name = PolicyName::new("burst");
/// assert_eq!(name.as_str(), "burst");
/// assert_eq!(name, PolicyName::new(String::from("burst")));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyName(&'static str);

impl PolicyName {
    /// The name used when a limit was given none.
    pub const DEFAULT: PolicyName = PolicyName("default");

    /// Interns `name`.
    pub fn new(name: impl AsRef<str>) -> Self {
        static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
        let name = name.as_ref();
        let mut names = NAMES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(existing) = names.get(name) {
            return PolicyName(existing);
        }
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        names.insert(leaked);
        PolicyName(leaked)
    }

    /// The name as a string.
    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

impl Default for PolicyName {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Debug for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The answer to one request against one limit: not a bool, but everything a client needs.
///
/// - [`allowed`](Self::allowed): whether the request may proceed (and was charged);
/// - [`limit`](Self::limit): the limit's size (the bucket capacity or the window's count);
/// - [`remaining`](Self::remaining): units left right after this decision;
/// - [`reset`](Self::reset): how long until the limit is *fully* restored;
/// - [`retry_after`](Self::retry_after): zero when allowed; when rejected, how long until this
///   same request would be allowed (always positive), or `None` if it never can be (its cost is
///   larger than the limit);
/// - [`policy`](Self::policy): the name of the limit that decided.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Decision;
///
/// let d = Decision::rejected(5, 0, Duration::from_secs(5), Duration::from_millis(200));
/// assert!(!d.allowed());
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(200)));
/// assert_eq!(d.retry_after_secs_ceil(), Some(1));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset: Duration,
    retry_after: Option<Duration>,
    policy: PolicyName,
}

impl Decision {
    /// An allowed decision.
    pub fn allowed_with(limit: u64, remaining: u64, reset: Duration) -> Self {
        Self {
            allowed: true,
            limit,
            remaining: remaining.min(limit),
            reset,
            retry_after: Some(Duration::ZERO),
            policy: PolicyName::DEFAULT,
        }
    }

    /// A rejected decision that would succeed after `retry_after` (clamped to at least 1 µs).
    pub fn rejected(limit: u64, remaining: u64, reset: Duration, retry_after: Duration) -> Self {
        Self {
            allowed: false,
            limit,
            remaining: remaining.min(limit),
            reset,
            retry_after: Some(retry_after.max(Duration::from_micros(1))),
            policy: PolicyName::DEFAULT,
        }
    }

    /// A rejected decision for a request whose cost exceeds the limit's capacity: waiting never
    /// helps, so there is no retry delay.
    pub fn impossible(limit: u64, remaining: u64, reset: Duration) -> Self {
        Self {
            allowed: false,
            limit,
            remaining: remaining.min(limit),
            reset,
            retry_after: None,
            policy: PolicyName::DEFAULT,
        }
    }

    /// The same decision, attributed to the limit `policy`.
    #[must_use]
    #[inline]
    pub fn with_policy(mut self, policy: PolicyName) -> Self {
        self.policy = policy;
        self
    }

    /// Whether the request may proceed.
    #[inline]
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// The limit's size: bucket capacity, or the count allowed per window.
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Units left after this decision (never more than [`limit`](Self::limit)).
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Time until the limit is fully restored (`remaining == limit`); zero when already full.
    #[inline]
    pub fn reset(&self) -> Duration {
        self.reset
    }

    /// `Some(ZERO)` when allowed; `Some(positive)` when rejected, the wait after which this
    /// request would be allowed; `None` when it can never be allowed (cost exceeds capacity).
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether this rejection can never succeed by waiting (cost larger than capacity).
    #[inline]
    pub fn is_impossible(&self) -> bool {
        self.retry_after.is_none()
    }

    /// The retry delay in whole seconds, rounded **up** and never 0 for a rejection, as
    /// `Retry-After` must be. `Some(0)` when allowed, `None` when impossible.
    pub fn retry_after_secs_ceil(&self) -> Option<u64> {
        let d = self.retry_after?;
        if self.allowed {
            return Some(0);
        }
        Some(ceil_secs(d).max(1))
    }

    /// The name of the limit that decided.
    #[inline]
    pub fn policy(&self) -> PolicyName {
        self.policy
    }

    /// How close to exhaustion this limit is, as `remaining / limit` compared without floats.
    /// Used to pick the decision reported in headers when several limits apply.
    pub(crate) fn is_tighter_than(&self, other: &Decision) -> bool {
        // remaining_a / limit_a < remaining_b / limit_b, cross-multiplied in u128.
        let a = u128::from(self.remaining) * u128::from(other.limit.max(1));
        let b = u128::from(other.remaining) * u128::from(self.limit.max(1));
        a < b || (a == b && self.reset > other.reset)
    }
}

/// Whole seconds in `d`, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("policy", &self.policy)
            .field("allowed", &self.allowed)
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("reset", &self.reset)
            .field("retry_after", &self.retry_after)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        let d = Decision::rejected(5, 0, Duration::from_secs(1), Duration::from_millis(50));
        assert_eq!(d.retry_after_secs_ceil(), Some(1));
        let d = Decision::rejected(5, 0, Duration::from_secs(1), Duration::from_millis(1001));
        assert_eq!(d.retry_after_secs_ceil(), Some(2));
        let d = Decision::rejected(5, 0, Duration::from_secs(1), Duration::ZERO);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        assert_eq!(d.retry_after_secs_ceil(), Some(1));
        assert_eq!(
            Decision::impossible(5, 5, Duration::ZERO).retry_after_secs_ceil(),
            None
        );
    }

    #[test]
    fn tighter_compares_fractions() {
        let a = Decision::allowed_with(10, 1, Duration::from_secs(1)); // 10%
        let b = Decision::allowed_with(1000, 500, Duration::from_secs(1)); // 50%
        assert!(a.is_tighter_than(&b));
        assert!(!b.is_tighter_than(&a));
    }

    #[test]
    fn names_are_interned() {
        let a = PolicyName::new("x-interned");
        let b = PolicyName::new(String::from("x-interned"));
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
    }
}
