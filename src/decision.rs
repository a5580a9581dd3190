//! [`Decision`]: what a limiter answers for one request against one limit.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The name of a limit (`"burst"`, `"daily"`, `"global"`), as reported in headers and bodies.
///
/// Names are interned once when a limit is configured, so a `PolicyName` is a `Copy` thin pointer
/// (one word) and carrying it in every [`Decision`] costs nothing on the hot path. Memory used by interning is
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
pub struct PolicyName(&'static &'static str);

impl PolicyName {
    /// The name used when a limit was given none.
    pub const DEFAULT: PolicyName = PolicyName(&"default");

    /// Interns `name`.
    pub fn new(name: impl AsRef<str>) -> Self {
        static NAMES: OnceLock<Mutex<HashMap<&'static str, &'static &'static str>>> =
            OnceLock::new();
        let name = name.as_ref();
        let mut names = NAMES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(existing) = names.get(name) {
            return PolicyName(existing);
        }
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        let thin: &'static &'static str = Box::leak(Box::new(leaked));
        names.insert(leaked, thin);
        PolicyName(thin)
    }

    /// The name as a string.
    #[inline]
    pub fn as_str(&self) -> &'static str {
        self.0
    }

    /// An address that is the same for every copy of this name (names are interned): a cheap
    /// map key. [`PolicyName::DEFAULT`] and an interned `"default"` have different ids.
    #[cfg(feature = "metrics")]
    #[inline]
    pub(crate) fn id(self) -> usize {
        std::ptr::from_ref::<&'static str>(self.0) as usize
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
/// - [`policy`](Self::policy): the name of the limit that decided;
/// - [`plan`](Self::plan): the limit's plan that decided, when the limit has plans.
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
// Times are held as whole microseconds (the unit of all limiter arithmetic), `retry_after` with
// `NEVER` for "impossible" and 0 for "allowed" (a rejection's is at least 1 µs, so no flag is
// needed), so that a decision is 48 bytes: it is copied into the store's answer and the
// request's extensions on every request.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    limit: u64,
    remaining: u64,
    reset_us: u64,
    /// 0: allowed; `NEVER`: impossible; otherwise the wait of a rejection (at least 1).
    retry_after_us: u64,
    policy: PolicyName,
    plan: Option<PolicyName>,
}

/// `retry_after_us` of a decision that can never succeed.
const NEVER: u64 = u64::MAX;
/// `reset_us` of an [uncounted](Decision::uncounted) decision (no constructor of a counted one
/// writes it: times saturate below [`NEVER`]).
const UNCOUNTED: u64 = u64::MAX;

/// `d` in whole microseconds, rounded up, saturating just below [`NEVER`].
// u64 arithmetic (no u128): this runs for every decision on the hot path.
#[inline]
fn micros_ceil(d: Duration) -> u64 {
    let nanos = d.subsec_nanos();
    let frac = u64::from(nanos.div_ceil(1_000));
    d.as_secs()
        .checked_mul(1_000_000)
        .and_then(|us| us.checked_add(frac))
        .map_or(NEVER - 1, |us| us.min(NEVER - 1))
}

impl Decision {
    /// The allowed decision `Decisions` are filled with before anything is pushed.
    pub(crate) const EMPTY: Decision = Decision {
        limit: 0,
        remaining: 0,
        reset_us: 0,
        retry_after_us: 0,
        policy: PolicyName::DEFAULT,
        plan: None,
    };

    /// An allowed decision.
    #[inline]
    pub fn allowed_with(limit: u64, remaining: u64, reset: Duration) -> Self {
        Self {
            limit,
            remaining: remaining.min(limit),
            reset_us: micros_ceil(reset),
            retry_after_us: 0,
            policy: PolicyName::DEFAULT,
            plan: None,
        }
    }

    /// An allowed decision the store did not count: it could not decide, and the limit's
    /// failure policy lets the request through uncounted
    /// ([`FailurePolicy::Open`](crate::store::FailurePolicy::Open)). It reports `limit`, a
    /// [`remaining`](Self::remaining) of `limit` and a zero [`reset`](Self::reset), but
    /// [`is_counted`](Self::is_counted) is false: the layer writes no rate-limit headers for it,
    /// since no budget was read.
    ///
    /// ```
    /// use tollgate::Decision;
    ///
    /// let d = Decision::uncounted(10);
    /// assert!(d.allowed() && !d.is_counted());
    /// assert!(Decision::allowed_with(10, 9, std::time::Duration::from_secs(1)).is_counted());
    /// ```
    #[inline]
    pub fn uncounted(limit: u64) -> Self {
        Self {
            limit,
            remaining: limit,
            reset_us: UNCOUNTED,
            retry_after_us: 0,
            policy: PolicyName::DEFAULT,
            plan: None,
        }
    }

    /// Whether the store counted this decision: false for [`uncounted`](Self::uncounted)
    /// ones, whose numbers are not a budget anybody read.
    #[inline]
    pub fn is_counted(&self) -> bool {
        self.reset_us != UNCOUNTED
    }

    /// A rejected decision that would succeed after `retry_after` (clamped to at least 1 µs).
    #[inline]
    pub fn rejected(limit: u64, remaining: u64, reset: Duration, retry_after: Duration) -> Self {
        Self {
            limit,
            remaining: remaining.min(limit),
            reset_us: micros_ceil(reset),
            retry_after_us: micros_ceil(retry_after).max(1),
            policy: PolicyName::DEFAULT,
            plan: None,
        }
    }

    /// A rejected decision for a request whose cost exceeds the limit's capacity: waiting never
    /// helps, so there is no retry delay.
    #[inline]
    pub fn impossible(limit: u64, remaining: u64, reset: Duration) -> Self {
        Self {
            limit,
            remaining: remaining.min(limit),
            reset_us: micros_ceil(reset),
            retry_after_us: NEVER,
            policy: PolicyName::DEFAULT,
            plan: None,
        }
    }

    /// The same decision, attributed to the limit `policy`.
    #[must_use]
    #[inline]
    pub fn with_policy(mut self, policy: PolicyName) -> Self {
        self.policy = policy;
        self
    }

    /// The same decision, made by the limit's plan `plan` (set by the layer when the limit
    /// has plans).
    #[must_use]
    #[inline]
    pub(crate) fn with_plan(mut self, plan: PolicyName) -> Self {
        self.plan = Some(plan);
        self
    }

    /// Whether the request may proceed.
    #[inline]
    pub fn allowed(&self) -> bool {
        self.retry_after_us == 0
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
        Duration::from_micros(self.reset_micros())
    }

    /// `reset` in microseconds (0 for an uncounted decision).
    #[inline]
    fn reset_micros(&self) -> u64 {
        if self.reset_us == UNCOUNTED {
            0
        } else {
            self.reset_us
        }
    }

    /// `Some(ZERO)` when allowed; `Some(positive)` when rejected, the wait after which this
    /// request would be allowed; `None` when it can never be allowed (cost exceeds capacity).
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        (self.retry_after_us != NEVER).then(|| Duration::from_micros(self.retry_after_us))
    }

    /// Whether this rejection can never succeed by waiting (cost larger than capacity).
    #[inline]
    pub fn is_impossible(&self) -> bool {
        self.retry_after_us == NEVER
    }

    /// The retry delay in whole seconds, rounded **up** and never 0 for a rejection, as
    /// `Retry-After` must be. `Some(0)` when allowed, `None` when impossible.
    pub fn retry_after_secs_ceil(&self) -> Option<u64> {
        let d = self.retry_after()?;
        if self.allowed() {
            return Some(0);
        }
        Some(ceil_secs(d).max(1))
    }

    /// The name of the limit that decided.
    #[inline]
    pub fn policy(&self) -> PolicyName {
        self.policy
    }

    /// The plan of the limit that decided (`"free"`, `"pro"`), or `None` when the limit has no
    /// plans or the request was decided by the limit's own quota.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Decision;
    ///
    /// let d = Decision::allowed_with(5, 4, Duration::from_secs(1));
    /// assert_eq!(d.plan(), None);
    /// ```
    #[inline]
    pub fn plan(&self) -> Option<PolicyName> {
        self.plan
    }

    /// How close to exhaustion this limit is, as `remaining / limit` compared without floats.
    /// Used to pick the decision reported in headers when several limits apply.
    pub(crate) fn is_tighter_than(&self, other: &Decision) -> bool {
        // remaining_a / limit_a < remaining_b / limit_b, cross-multiplied in u128.
        let a = u128::from(self.remaining) * u128::from(other.limit.max(1));
        let b = u128::from(other.remaining) * u128::from(self.limit.max(1));
        a < b || (a == b && self.reset_micros() > other.reset_micros())
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
            .field("plan", &self.plan)
            .field("allowed", &self.allowed())
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("reset", &self.reset())
            .field("retry_after", &self.retry_after())
            .field("counted", &self.is_counted())
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
    fn times_round_up_to_whole_microseconds() {
        let d = Decision::rejected(
            5,
            0,
            Duration::from_nanos(1_500),
            Duration::from_nanos(2_001),
        );
        assert_eq!(d.reset(), Duration::from_micros(2));
        assert_eq!(d.retry_after(), Some(Duration::from_micros(3)));
        let d = Decision::allowed_with(5, 4, Duration::MAX);
        assert_eq!(d.reset(), Duration::from_micros(u64::MAX - 1));
        assert_eq!(d.retry_after(), Some(Duration::ZERO));
        assert!(!d.is_impossible());
        let d = Decision::rejected(5, 0, Duration::ZERO, Duration::MAX);
        assert!(!d.is_impossible(), "a very long wait is still a wait");
    }

    #[test]
    fn decisions_stay_small() {
        assert_eq!(std::mem::size_of::<PolicyName>(), 8);
        assert_eq!(std::mem::size_of::<Option<PolicyName>>(), 8);
        assert!(std::mem::size_of::<Decision>() <= 48);
    }

    #[test]
    fn allowed_is_told_by_the_retry_delay() {
        let allowed = Decision::allowed_with(5, 4, Duration::from_secs(1));
        assert!(allowed.allowed() && !allowed.is_impossible());
        let rejected = Decision::rejected(5, 0, Duration::ZERO, Duration::ZERO);
        assert!(!rejected.allowed(), "a zero wait is still a rejection");
        let impossible = Decision::impossible(5, 5, Duration::ZERO);
        assert!(!impossible.allowed() && impossible.is_impossible());
    }

    #[test]
    fn a_plan_travels_with_the_decision() {
        let free = PolicyName::new("free");
        let d = Decision::rejected(5, 0, Duration::from_secs(60), Duration::from_secs(12))
            .with_policy(PolicyName::new("api"))
            .with_plan(free);
        assert_eq!(d.plan(), Some(free));
        assert_eq!(d.policy().as_str(), "api");
        assert!(!d.allowed());
        assert_ne!(d, d.with_plan(PolicyName::new("pro")));
        assert!(format!("{d:?}").contains("\"free\""));
    }

    #[test]
    fn names_are_interned() {
        let a = PolicyName::new("x-interned");
        let b = PolicyName::new(String::from("x-interned"));
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
    }
}
