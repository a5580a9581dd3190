//! [`Decision`]: what a limiter answers for one request against one limit.

use std::cmp::Ordering;
use std::fmt;
use std::time::Duration;

use crate::error::ConfigError;

/// The name of a limit or plan (`"burst"`, `"daily"`, `"pro"`), as reported in headers and bodies.
///
/// A `Name` holds its text inline: it is `Copy`, 48 bytes, and making, copying or
/// comparing one allocates nothing, takes no lock and touches no shared memory, so carrying it
/// in every [`Decision`] is free of contention. Nothing is kept once the last copy is gone: a
/// program that configures new names (a policy reload) uses no more memory for them than the
/// names in force.
///
/// A name is at most [`MAX_LEN`](Self::MAX_LEN) (47) bytes. Where names are configured (a
/// [`Limit`](crate::Limit), a [`Plan`](crate::plan::Plan), a policy file) a longer one is
/// refused with a [`ConfigError`] when the layer is built. [`Name::new`] itself never
/// fails: it holds a longer name as *over-long* (see [`is_over_long`](Self::is_over_long)),
/// which no configured name equals, so a plan name read from a request that is too long is an
/// unknown plan. [`Name::try_new`] refuses it instead.
///
/// ```
/// use tollgate::Name;
///
/// let name = Name::new("burst");
/// assert_eq!(name.as_str(), "burst");
/// assert_eq!(name, Name::new(String::from("burst")));
///
/// let long = "x".repeat(Name::MAX_LEN + 1);
/// assert!(Name::try_new(&long).is_err());
/// assert!(Name::new(&long).is_over_long());
/// assert_ne!(Name::new(&long), Name::new(&long[1..]));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Name {
    /// A name held whole: its length (at most `MAX_LEN`). An over-long name: `OVER_LONG` plus
    /// the length of the prefix kept. [`ABSENT`]: no name (a decision without a plan).
    len: u8,
    /// The name's bytes (or its prefix then its `fnv1a` digest), zero after them, so that the
    /// derived `Eq` and `Hash` are the names'.
    bytes: [u8; Name::MAX_LEN],
}

/// `len` of an over-long name, plus its prefix's length.
const OVER_LONG: u8 = 0x80;
/// The bytes of an over-long name's digest, after its prefix.
const DIGEST: usize = 8;
/// `len` of the absent plan in a [`Decision`]: neither a name nor an over-long one.
const ABSENT_LEN: u8 = u8::MAX;
/// The absent plan in a [`Decision`] (so that a decision holds no `Option` tag).
const ABSENT: Name = Name {
    len: ABSENT_LEN,
    bytes: [0; Name::MAX_LEN],
};

impl Name {
    /// The longest name, in bytes, that a `Name` holds (and a limit or plan may have).
    pub const MAX_LEN: usize = 47;

    /// The name used when a limit was given none.
    pub const DEFAULT: Name = Name::inline("default");

    /// `name`, at most `MAX_LEN` bytes (a longer one does not compile in a `const`).
    const fn inline(name: &str) -> Self {
        let src = name.as_bytes();
        assert!(src.len() <= Self::MAX_LEN, "a Name holds at most 47 bytes");
        let mut bytes = [0; Self::MAX_LEN];
        let mut i = 0;
        while i < src.len() {
            bytes[i] = src[i];
            i += 1;
        }
        Self {
            len: src.len() as u8,
            bytes,
        }
    }

    /// The name `name`. Never fails and never allocates.
    ///
    /// A name longer than [`MAX_LEN`](Self::MAX_LEN) bytes is held as over-long: its first
    /// 39 bytes (cut at a character boundary), which [`as_str`](Self::as_str) returns, and a
    /// 64-bit digest of the whole name, so two over-long names are equal only if they are the
    /// same name (or their digests collide, a 2^-64 chance), and an over-long name equals no
    /// name held whole. Limits and plans refuse over-long names when the layer is built; use
    /// [`try_new`](Self::try_new) to refuse them here.
    pub fn new(name: impl AsRef<str>) -> Self {
        let name = name.as_ref();
        if name.len() <= Self::MAX_LEN {
            return Self::inline(name);
        }
        let mut cut = Self::MAX_LEN - DIGEST;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut bytes = [0; Self::MAX_LEN];
        bytes[..cut].copy_from_slice(&name.as_bytes()[..cut]);
        bytes[Self::MAX_LEN - DIGEST..].copy_from_slice(&fnv1a(name.as_bytes()).to_le_bytes());
        Self {
            len: OVER_LONG + cut as u8,
            bytes,
        }
    }

    /// The name `name`, or a [`ConfigError`] (field `name`) if it is longer than
    /// [`MAX_LEN`](Self::MAX_LEN) bytes.
    ///
    /// ```
    /// use tollgate::Name;
    ///
    /// assert_eq!(Name::try_new("pro").unwrap().as_str(), "pro");
    /// let err = Name::try_new("p".repeat(48)).unwrap_err();
    /// assert_eq!(err.field(), "name");
    /// assert!(err.to_string().contains("at most 47 bytes"));
    /// ```
    pub fn try_new(name: impl AsRef<str>) -> Result<Self, ConfigError> {
        let name = name.as_ref();
        check_len("name", "name", name)?;
        Ok(Self::inline(name))
    }

    /// Whether the name was longer than [`MAX_LEN`](Self::MAX_LEN) bytes (see
    /// [`new`](Self::new)): [`as_str`](Self::as_str) then returns only its beginning.
    #[inline]
    pub fn is_over_long(&self) -> bool {
        self.len != ABSENT_LEN && self.len >= OVER_LONG
    }

    /// The name as a string (the beginning of an over-long name).
    #[inline]
    pub fn as_str(&self) -> &str {
        let len = if self.len == ABSENT_LEN {
            0
        } else {
            usize::from(self.len & !OVER_LONG)
        };
        // Always valid UTF-8: whole names and prefixes cut at a character boundary.
        std::str::from_utf8(&self.bytes[..len]).unwrap_or_default()
    }
}

/// A [`ConfigError`] about `field` if `name` is longer than [`Name::MAX_LEN`] bytes;
/// `what` says whose name it is (`"limit name"`, `"plan name"`).
pub(crate) fn check_len(field: &'static str, what: &str, name: &str) -> Result<(), ConfigError> {
    if name.len() <= Name::MAX_LEN {
        return Ok(());
    }
    let shown: String = name.chars().take(24).collect();
    Err(ConfigError::new(
        field,
        format!(
            "{what} \"{shown}...\" is {} bytes, but a name has at most {} bytes (names are sent in headers and bodies): use a shorter one",
            name.len(),
            Name::MAX_LEN
        ),
    ))
}

/// A [`ConfigError`] about `field` if `name` is over-long (see [`Name::new`]); `what`
/// says whose name it is (`"limit name"`, `"plan name"`).
pub(crate) fn refuse_over_long(
    field: &'static str,
    what: &str,
    name: Name,
) -> Result<(), ConfigError> {
    if !name.is_over_long() {
        return Ok(());
    }
    Err(ConfigError::new(
        field,
        format!(
            "{what} \"{}...\" is longer than {} bytes, the most a name may have (names are sent in headers and bodies): use a shorter one",
            name.as_str(),
            Name::MAX_LEN
        ),
    ))
}

/// 64-bit FNV-1a of `bytes`: the digest that tells over-long names apart.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Default for Name {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// By the names' text; an over-long name after the name its beginning spells.
impl Ord for Name {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_str()
            .cmp(other.as_str())
            .then_with(|| (self.len, self.bytes).cmp(&(other.len, other.bytes)))
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)?;
        if self.is_over_long() {
            f.write_str("(over-long)")?;
        }
        Ok(())
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())?;
        if self.is_over_long() {
            f.write_str("...")?;
        }
        Ok(())
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
// needed), and the absent plan as `ABSENT` rather than an `Option`, so that a decision is 128
// bytes (its two names inline, no pointer to chase): it is copied into the store's answer and
// the request's extensions on every request.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    limit: u64,
    remaining: u64,
    reset_us: u64,
    /// 0: allowed; `NEVER`: impossible; otherwise the wait of a rejection (at least 1).
    retry_after_us: u64,
    policy: Name,
    /// `ABSENT` when no plan decided.
    plan: Name,
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
        policy: Name::DEFAULT,
        plan: ABSENT,
    };

    /// An allowed decision.
    #[inline]
    pub fn allowed_with(limit: u64, remaining: u64, reset: Duration) -> Self {
        Self {
            limit,
            remaining: remaining.min(limit),
            reset_us: micros_ceil(reset),
            retry_after_us: 0,
            policy: Name::DEFAULT,
            plan: ABSENT,
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
            policy: Name::DEFAULT,
            plan: ABSENT,
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
            policy: Name::DEFAULT,
            plan: ABSENT,
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
            policy: Name::DEFAULT,
            plan: ABSENT,
        }
    }

    /// The same decision, attributed to the limit `policy`.
    #[must_use]
    #[inline]
    pub fn with_policy(mut self, policy: Name) -> Self {
        self.policy = policy;
        self
    }

    /// The same decision, made by the limit's plan `plan` (set by the layer when the limit
    /// has plans).
    #[must_use]
    #[inline]
    pub(crate) fn with_plan(mut self, plan: Name) -> Self {
        self.plan = plan;
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
    pub fn policy(&self) -> Name {
        self.policy
    }

    /// The name of the limit that decided, borrowed from the decision.
    #[inline]
    pub(crate) fn policy_str(&self) -> &str {
        self.policy.as_str()
    }

    /// The name of the plan that decided, if any, borrowed from the decision.
    #[cfg(feature = "tonic")]
    #[inline]
    pub(crate) fn plan_str(&self) -> Option<&str> {
        (self.plan.len != ABSENT_LEN).then(|| self.plan.as_str())
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
    pub fn plan(&self) -> Option<Name> {
        (self.plan.len != ABSENT_LEN).then_some(self.plan)
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
            .field("plan", &self.plan())
            .field("allowed", &self.allowed())
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("reset", &self.reset())
            .field("retry_after", &self.retry_after())
            .field("counted", &self.is_counted())
            .finish()
    }
}

/// The most limits one layer may hold. Stack layers for more.
pub const MAX_LIMITS: usize = 8;

/// Up to [`MAX_LIMITS`] decisions, one per [`LimitCheck`](crate::store::LimitCheck), in the same order.
///
/// Up to [`INLINE`](Self::INLINE) decisions are held inline (no allocation: the common one- and
/// two-limit layers), more on the heap. It is moved on every request from the store to the
/// layer: two decisions and 24 bytes (a [`Decision`] holds its limit's and plan's names
/// inline, 128 bytes), a copy with no pointer to follow and no count to update.
#[derive(Clone)]
pub struct Decisions {
    items: Items,
    len: u8,
    /// The store's clock reading the checks were decided at, or [`NOT_DECIDED`].
    at: u64,
}

/// Where a [`Decisions`]' items live.
// The inline variant is the one nearly every request uses; boxing it would allocate per request.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Items {
    Inline([Decision; Decisions::INLINE]),
    Heap(Box<[Decision; MAX_LIMITS]>),
}

/// `Decisions::at` when the store reported no time.
const NOT_DECIDED: u64 = u64::MAX;

impl std::fmt::Debug for Decisions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decisions")
            .field("decisions", &self.as_slice())
            .field("decided_at", &self.decided_at())
            .finish()
    }
}

impl Default for Decisions {
    #[inline]
    fn default() -> Self {
        Self::new()
    }
}

impl Decisions {
    /// How many decisions are held without allocating.
    pub const INLINE: usize = 2;

    /// No decisions yet.
    #[inline]
    pub const fn new() -> Self {
        Self {
            items: Items::Inline([Decision::EMPTY; Self::INLINE]),
            len: 0,
            at: NOT_DECIDED,
        }
    }

    /// One decision, decided at `at` (the single-limit hot path builds its answer at once).
    #[inline]
    pub(crate) const fn one(decision: Decision, at: u64) -> Self {
        Self {
            items: Items::Inline([decision, Decision::EMPTY]),
            len: 1,
            at,
        }
    }

    /// Appends a decision.
    ///
    /// # Panics
    /// If more than [`MAX_LIMITS`] are pushed; builders never configure more.
    #[inline]
    pub fn push(&mut self, d: Decision) {
        let len = usize::from(self.len);
        assert!(len < MAX_LIMITS, "more than {MAX_LIMITS} decisions");
        match &mut self.items {
            Items::Inline(items) if len < Self::INLINE => items[len] = d,
            Items::Inline(items) => {
                let mut heap = Box::new([Decision::EMPTY; MAX_LIMITS]);
                heap[..Self::INLINE].copy_from_slice(items);
                heap[len] = d;
                self.items = Items::Heap(heap);
            }
            Items::Heap(items) => items[len] = d,
        }
        self.len += 1;
    }

    /// The time (µs on the store's clock: the memory store's [`Clock`](crate::clock::Clock),
    /// Redis `TIME`) at which the checks were decided and charged, when the store reports it.
    /// [`Store::refund`](crate::store::Store::refund) takes it back to give a reservation back exactly.
    #[inline]
    pub fn decided_at(&self) -> Option<u64> {
        (self.at != NOT_DECIDED).then_some(self.at)
    }

    /// Records the time the checks were decided at (see [`decided_at`](Self::decided_at)).
    /// `u64::MAX` (585,000 years) reads as not reported.
    #[inline]
    pub fn set_decided_at(&mut self, at: u64) {
        self.at = at;
    }

    /// The decisions, in check order.
    #[inline]
    pub fn as_slice(&self) -> &[Decision] {
        let len = usize::from(self.len);
        match &self.items {
            Items::Inline(items) => &items[..len],
            Items::Heap(items) => &items[..len],
        }
    }

    /// Mutable access, in check order.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [Decision] {
        let len = usize::from(self.len);
        match &mut self.items {
            Items::Inline(items) => &mut items[..len],
            Items::Heap(items) => &mut items[..len],
        }
    }

    /// Number of decisions.
    #[inline]
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether every limit allowed.
    #[inline]
    pub fn allowed(&self) -> bool {
        self.as_slice().iter().all(Decision::allowed)
    }

    /// The first rejecting decision, which names the limit that rejected.
    pub fn rejected(&self) -> Option<&Decision> {
        self.as_slice().iter().find(|d| !d.allowed())
    }

    /// The decision to report in headers: the rejecting one if any, else the limit closest to
    /// exhaustion (smallest `remaining / limit`).
    pub fn reported(&self) -> Option<&Decision> {
        if let Some(r) = self.rejected() {
            return Some(r);
        }
        self.as_slice()
            .iter()
            .reduce(|best, d| if d.is_tighter_than(best) { d } else { best })
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
        assert_eq!(std::mem::size_of::<Name>(), 48);
        assert_eq!(std::mem::size_of::<Decision>(), 128);
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
        let free = Name::new("free");
        let d = Decision::rejected(5, 0, Duration::from_secs(60), Duration::from_secs(12))
            .with_policy(Name::new("api"))
            .with_plan(free);
        assert_eq!(d.plan(), Some(free));
        assert_eq!(d.policy().as_str(), "api");
        assert!(!d.allowed());
        assert_ne!(d, d.with_plan(Name::new("pro")));
        assert!(format!("{d:?}").contains("\"free\""));
    }

    #[test]
    fn names_are_held_inline_and_compare_by_text() {
        let a = Name::new("x-inline");
        let b = Name::new(String::from("x-inline"));
        assert_eq!(a, b);
        assert!(
            !std::ptr::eq(a.as_str(), b.as_str()),
            "each copy holds its own text"
        );
        assert_eq!(Name::new("default"), Name::DEFAULT);
        assert_eq!(Name::new(""), Name::new(""));
        assert_ne!(Name::new("a"), Name::new("a\0"));
        let max = "m".repeat(Name::MAX_LEN);
        assert_eq!(Name::new(&max).as_str(), max);
        assert!(!Name::new(&max).is_over_long());
        let mut names = [Name::new("b"), Name::new("a"), Name::new("ab")];
        names.sort();
        assert_eq!(names.map(|n| n.as_str().to_owned()), ["a", "ab", "b"]);
    }

    #[test]
    fn over_long_names_are_kept_apart_and_never_panic() {
        let base = "\u{e9}".repeat(30); // 60 bytes of two-byte characters
        let a = Name::new(format!("{base}-a"));
        let b = Name::new(format!("{base}-b"));
        assert!(a.is_over_long() && b.is_over_long());
        assert_ne!(a, b, "same prefix, different names");
        assert_eq!(a, Name::new(format!("{base}-a")));
        assert_eq!(
            a.as_str(),
            "\u{e9}".repeat(19),
            "cut at a character boundary"
        );
        // An over-long name never equals the name its prefix spells.
        assert_ne!(Name::new(a.as_str()), a);
        assert!(format!("{a:?}").ends_with("(over-long)"));
        assert!(a.to_string().ends_with("..."));
        let err = Name::try_new(format!("{base}-a")).unwrap_err();
        assert_eq!(err.field(), "name");
        assert!(err.to_string().contains("at most 47 bytes"), "{err}");
        // The absent plan of a decision is not a name.
        assert!(!ABSENT.is_over_long());
        assert_eq!(ABSENT.as_str(), "");
        assert_eq!(Decision::EMPTY.plan(), None);
    }
}

#[cfg(test)]
mod decisions_tests {
    use super::*;

    fn d(remaining: u64) -> Decision {
        Decision::allowed_with(10, remaining, Duration::from_secs(1))
    }

    #[test]
    fn decisions_spill_to_the_heap_in_order_and_stay_small() {
        // Moved on every request: two inline decisions and the length and time.
        assert!(std::mem::size_of::<Decisions>() <= 2 * std::mem::size_of::<Decision>() + 24);
        let mut all = Decisions::new();
        assert!(all.is_empty() && all.decided_at().is_none());
        for i in 0..MAX_LIMITS as u64 {
            all.push(d(i));
            assert_eq!(all.len(), i as usize + 1);
            let remaining: Vec<u64> = all.as_slice().iter().map(Decision::remaining).collect();
            assert_eq!(remaining, (0..=i).collect::<Vec<_>>());
        }
        all.as_mut_slice()[7] = d(9);
        all.set_decided_at(42);
        let copy = all.clone();
        assert_eq!(copy.as_slice(), all.as_slice());
        assert_eq!(copy.as_slice()[7].remaining(), 9);
        assert_eq!(copy.decided_at(), Some(42));
        assert_eq!(copy.reported().unwrap().remaining(), 0);
        let one = Decisions::one(d(3), 7);
        assert_eq!((one.len(), one.decided_at()), (1, Some(7)));
        assert_eq!(one.as_slice(), &[d(3)]);
    }

    #[test]
    #[should_panic(expected = "more than 8 decisions")]
    fn a_ninth_decision_panics() {
        let mut all = Decisions::new();
        for _ in 0..=MAX_LIMITS {
            all.push(d(1));
        }
    }
}
