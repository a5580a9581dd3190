//! Rate-limit response headers: `X-RateLimit-*`, the IETF `RateLimit` / `RateLimit-Policy` fields
//! and `Retry-After`, written from [`Decision`]s.
//!
//! [`RateLimitLayer`](crate::rate_limit::RateLimitLayer) writes these on **every** response it
//! decided, allowed or rejected, according to a [`RateLimitHeaders`] configuration:
//!
//! | header | when | value |
//! |---|---|---|
//! | `X-RateLimit-Limit` | on by default | the reported limit's size |
//! | `X-RateLimit-Remaining` | on by default | units left after this request |
//! | `X-RateLimit-Reset` | on by default | when the limit is *fully* restored: Unix seconds (default) or delta seconds ([`ResetFormat`]) |
//! | `RateLimit-Policy` | opt-in ([`RateLimitHeaders::ietf`]) | every limit: `"burst";q=5;w=5, "daily";q=5000;w=86400` |
//! | `RateLimit` | opt-in | every limit: `"burst";r=4;t=1, "daily";r=4999;t=18` |
//! | `Retry-After` | rejections only | whole seconds until this request would succeed, rounded up, never 0 |
//!
//! The reported decision (for `X-RateLimit-*`) is [`Decisions::reported`]: the limit that
//! rejected, else the one closest to exhaustion.
//!
//! In `RateLimit-Policy`, `q` is the limit's capacity and `w` the seconds it takes to refill from
//! empty ([`policy_window_secs`]): for a window algorithm that is the window (`100/min` is
//! `q=100;w=60`); for a bucket of 50 refilling 10 per second it is `q=50;w=5`, which states both the
//! burst and the sustained rate. In `RateLimit`, `r` is the remaining units and `t` the seconds
//! until the limit is fully restored, rounded up.
//!
//! # Examples
//!
//! Writing the default headers for one decision:
//!
//! ```
//! use std::time::Duration;
//! use http::HeaderMap;
//! use tollgate::headers::{RateLimitHeaders, ResetFormat, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
//! use tollgate::Decision;
//!
//! let decision = Decision::allowed_with(5, 4, Duration::from_millis(1500));
//! let mut headers = HeaderMap::new();
//! RateLimitHeaders::new()
//!     .reset_format(ResetFormat::DeltaSeconds)
//!     .write_x_ratelimit(&decision, &mut headers);
//! assert_eq!(headers[X_RATELIMIT_LIMIT], "5");
//! assert_eq!(headers[X_RATELIMIT_REMAINING], "4");
//! assert_eq!(headers[X_RATELIMIT_RESET], "2"); // 1.5 s, rounded up
//! ```
//!
//! The IETF structured fields, listing every limit:
//!
//! ```
//! use std::time::Duration;
//! use http::HeaderMap;
//! use tollgate::headers::{RateLimitHeaders, RATELIMIT, RATELIMIT_POLICY};
//! use tollgate::{Decision, Name, Quota};
//!
//! let burst = Decision::allowed_with(5, 4, Duration::from_secs(1)).with_policy(Name::new("burst"));
//! let daily = Decision::allowed_with(5000, 4999, Duration::from_secs(18)).with_policy(Name::new("daily"));
//! let (qb, qd) = (Quota::per_second(1).burst(5), Quota::per_day(5000));
//! let mut headers = HeaderMap::new();
//! RateLimitHeaders::new().ietf(true).write_ietf([(&burst, &qb), (&daily, &qd)], &mut headers);
//! assert_eq!(headers[RATELIMIT_POLICY], r#""burst";q=5;w=5, "daily";q=5000;w=86400"#);
//! assert_eq!(headers[RATELIMIT], r#""burst";r=4;t=1, "daily";r=4999;t=18"#);
//! ```
//!
//! [`Decisions::reported`]: crate::Decisions::reported

use std::fmt::Write as _;
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::decision::{ceil_secs, Decision};
use crate::quota::Quota;

/// `X-RateLimit-Limit`: the reported limit's size.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: units left after this request.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: when the limit is fully restored (see [`ResetFormat`]).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit` (IETF draft-ietf-httpapi-ratelimit-headers-10): remaining and reset per limit.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy` (IETF draft-10): quota and window per limit.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// How `X-RateLimit-Reset` is expressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ResetFormat {
    /// Unix time in seconds at which the limit is fully restored, rounded up (the convention
    /// GitHub-style clients read). The default.
    #[default]
    UnixSeconds,
    /// Seconds from now until the limit is fully restored, rounded up.
    DeltaSeconds,
}

/// Which rate-limit headers to write, and how. See the [module docs](self).
///
/// The default writes `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (Unix
/// seconds), and not the IETF fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimitHeaders {
    x_ratelimit: bool,
    ietf: bool,
    reset: ResetFormat,
}

impl Default for RateLimitHeaders {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimitHeaders {
    /// `X-RateLimit-*` with a Unix-seconds reset; no IETF fields.
    pub const fn new() -> Self {
        Self {
            x_ratelimit: true,
            ietf: false,
            reset: ResetFormat::UnixSeconds,
        }
    }

    /// No rate-limit headers at all (a rejection still carries `Retry-After`).
    pub const fn none() -> Self {
        Self {
            x_ratelimit: false,
            ietf: false,
            reset: ResetFormat::UnixSeconds,
        }
    }

    /// Whether to write `X-RateLimit-Limit`, `-Remaining` and `-Reset` (default: yes).
    #[must_use]
    pub const fn x_ratelimit(mut self, enabled: bool) -> Self {
        self.x_ratelimit = enabled;
        self
    }

    /// Whether to write the IETF draft-10 `RateLimit-Policy` and `RateLimit` fields listing every
    /// limit (default: no).
    #[must_use]
    pub const fn ietf(mut self, enabled: bool) -> Self {
        self.ietf = enabled;
        self
    }

    /// How `X-RateLimit-Reset` is expressed (default: [`ResetFormat::UnixSeconds`]).
    #[must_use]
    pub const fn reset_format(mut self, format: ResetFormat) -> Self {
        self.reset = format;
        self
    }

    /// Whether `X-RateLimit-*` headers are written.
    pub const fn writes_x_ratelimit(&self) -> bool {
        self.x_ratelimit
    }

    /// Whether the IETF fields are written.
    pub const fn writes_ietf(&self) -> bool {
        self.ietf
    }

    /// The `X-RateLimit-Reset` format.
    pub const fn reset(&self) -> ResetFormat {
        self.reset
    }

    /// Writes (replacing) `X-RateLimit-Limit`, `-Remaining` and `-Reset` for `decision`, if enabled.
    /// Nothing for a decision the store did not count ([`Decision::is_counted`]): its numbers
    /// are no budget anybody read.
    pub fn write_x_ratelimit(&self, decision: &Decision, headers: &mut HeaderMap) {
        if !self.x_ratelimit || !decision.is_counted() {
            return;
        }
        let reset = match self.reset {
            ResetFormat::DeltaSeconds => ceil_secs(decision.reset()),
            ResetFormat::UnixSeconds => {
                unix_reset_secs(crate::clock::unix_now_nanos(), decision.reset())
            }
        };
        let values = [
            number_value(decision.limit()),
            number_value(decision.remaining()),
            number_value(reset),
        ];
        if headers.is_empty() {
            // A response without headers (yet): start from a map that already holds the three
            // names, hashed once per process, and set their values in place. The same map as
            // inserting them one by one (same entries, order and capacity), without hashing
            // each name again (HeaderMap hashes custom names byte by byte).
            *headers = X_RATELIMIT_TEMPLATE.clone();
            for (slot, value) in headers.values_mut().zip(values) {
                // The template's placeholders are static: there is nothing to free.
                std::mem::forget(std::mem::replace(slot, value));
            }
            return;
        }
        insert_x_ratelimit(headers, values);
    }

    /// Appends `RateLimit-Policy` and `RateLimit` items for every `(decision, quota)` pair, if
    /// enabled. Appending (not replacing) lets stacked layers each add their limits to the list.
    /// A decision the store did not count ([`Decision::is_counted`]) has a policy item but no
    /// `RateLimit` item.
    pub fn write_ietf<'a, I>(&self, limits: I, headers: &mut HeaderMap)
    where
        I: IntoIterator<Item = (&'a Decision, &'a Quota)>,
        I::IntoIter: Clone,
    {
        if !self.ietf {
            return;
        }
        let limits = limits.into_iter();
        if let Some(v) = policy_field(limits.clone().map(|(d, q)| (d.policy_str(), q))) {
            headers.append(RATELIMIT_POLICY, v);
        }
        if let Some(v) = ratelimit_field(limits.map(|(d, _)| d)) {
            headers.append(RATELIMIT, v);
        }
    }
}

/// The `Retry-After` value for a rejected decision: whole seconds, rounded up, never 0.
///
/// `None` for an allowed decision and for one that can never succeed
/// ([`Decision::is_impossible`]).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{headers::retry_after, Decision};
///
/// let d = Decision::rejected(5, 0, Duration::from_secs(5), Duration::from_millis(10));
/// assert_eq!(retry_after(&d).unwrap(), "1");
/// assert!(retry_after(&Decision::allowed_with(5, 4, Duration::ZERO)).is_none());
/// ```
pub fn retry_after(decision: &Decision) -> Option<HeaderValue> {
    if decision.allowed() {
        return None;
    }
    decision.retry_after_secs_ceil().map(HeaderValue::from)
}

/// Sets `Retry-After` to `secs` (at least 1) unless the map already has one.
pub(crate) fn set_retry_after_if_absent(headers: &mut HeaderMap, secs: u64) {
    if !headers.contains_key(RETRY_AFTER) {
        headers.insert(RETRY_AFTER, number(secs.max(1)));
    }
}

/// The `w` of a limit in `RateLimit-Policy`: seconds to refill its whole capacity from empty,
/// rounded up (`burst × period / count`). For window algorithms, whose capacity is the count,
/// this is the window.
///
/// ```
/// use tollgate::{headers::policy_window_secs, Quota};
///
/// assert_eq!(policy_window_secs(&Quota::per_minute(100)), 60);
/// assert_eq!(policy_window_secs(&Quota::per_second(10).burst(50)), 5);
/// assert_eq!(policy_window_secs(&Quota::per_day(5000)), 86_400);
/// ```
pub fn policy_window_secs(quota: &Quota) -> u64 {
    let micros = u128::from(quota.burst_size()) * u128::from(quota.period_micros())
        / u128::from(quota.count().max(1));
    let micros = u64::try_from(micros).unwrap_or(u64::MAX);
    ceil_secs(Duration::from_micros(micros)).max(1)
}

/// Numbers below this are written from a static table, without allocating.
const SMALL: usize = 10_000;
/// Bytes of the decimal digits of 0..SMALL, concatenated.
const SMALL_DIGITS_LEN: usize = 10 + 90 * 2 + 900 * 3 + 9000 * 4;

/// "0123456789101112...9999": every number below [`SMALL`], so a header value for one is a
/// static slice (no allocation, no reference count).
static SMALL_DIGITS: &str = match std::str::from_utf8(&small_digits()) {
    Ok(digits) => digits,
    Err(_) => panic!("decimal digits are ASCII"),
};

const fn small_digits() -> [u8; SMALL_DIGITS_LEN] {
    let mut out = [0u8; SMALL_DIGITS_LEN];
    let mut n = 0;
    let mut at = 0;
    while n < SMALL {
        let width = digits_width(n);
        let mut i = 0;
        let mut rest = n;
        while i < width {
            out[at + width - 1 - i] = b'0' + (rest % 10) as u8;
            rest /= 10;
            i += 1;
        }
        at += width;
        n += 1;
    }
    out
}

const fn digits_width(n: usize) -> usize {
    if n < 10 {
        1
    } else if n < 100 {
        2
    } else if n < 1_000 {
        3
    } else {
        4
    }
}

/// The offset of `n` (< [`SMALL`]) in [`SMALL_DIGITS`].
const fn small_offset(n: usize) -> usize {
    match digits_width(n) {
        1 => n,
        2 => 10 + (n - 10) * 2,
        3 => 190 + (n - 100) * 3,
        _ => 2_890 + (n - 1_000) * 4,
    }
}

/// `n` in decimal from the static table, if below 10,000.
#[inline]
pub(crate) fn small_number_str(n: u64) -> Option<&'static str> {
    let small = usize::try_from(n).ok().filter(|&n| n < SMALL)?;
    let at = small_offset(small);
    SMALL_DIGITS.get(at..at + digits_width(small))
}

/// `n` as a header value; numbers below 10,000 come from a static table without allocating,
/// larger ones from a small per-thread cache of recent values (a limit's size, this second's
/// Unix reset time: a clone is a reference count, not an allocation), else are formatted.
#[inline]
pub(crate) fn number(n: u64) -> HeaderValue {
    match small_number_str(n) {
        Some(digits) => HeaderValue::from_static(digits),
        None => large_number(n),
    }
}

/// [`number`], out of line: the three values of a response share one copy of the code.
#[inline(never)]
fn number_value(n: u64) -> HeaderValue {
    number(n)
}

/// Sets `X-RateLimit-Limit`, `-Remaining` and `-Reset` to `values` in a map that has other
/// headers already.
#[inline(never)]
fn insert_x_ratelimit(headers: &mut HeaderMap, [limit, remaining, reset]: [HeaderValue; 3]) {
    headers.reserve(3);
    headers.insert(X_RATELIMIT_LIMIT, limit);
    headers.insert(X_RATELIMIT_REMAINING, remaining);
    headers.insert(X_RATELIMIT_RESET, reset);
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (in that order) with placeholder values, as
/// `reserve(3)` then three inserts build them: what [`RateLimitHeaders::write_x_ratelimit`]
/// clones into a response that has no headers yet.
static X_RATELIMIT_TEMPLATE: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(|| {
    let mut headers = HeaderMap::new();
    headers.reserve(3);
    for name in [X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET] {
        headers.insert(name, HeaderValue::from_static("0"));
    }
    headers
});

/// Slots of the per-thread cache of large numbers (a power of two).
const LARGE_SLOTS: usize = 8;

/// One slot of the per-thread cache of large numbers.
struct LargeSlot {
    /// The cached value and its number.
    value: Option<(u64, HeaderValue)>,
    /// The number this slot last missed: a value is cached when it misses twice in a row, so a
    /// number asked for once (a per-client reset time) costs one allocation, not the three of
    /// caching it (a shared `Bytes` plus its reference count, and freeing the value it evicts).
    missed: u64,
}

/// [`number`] of `n >= SMALL`.
fn large_number(n: u64) -> HeaderValue {
    use std::cell::RefCell;
    thread_local!(static RECENT: RefCell<[LargeSlot; LARGE_SLOTS]> =
        const { RefCell::new([const { LargeSlot { value: None, missed: 0 } }; LARGE_SLOTS]) });
    let slot = ((n ^ (n >> 7) ^ (n >> 17)) as usize) & (LARGE_SLOTS - 1);
    let cached = RECENT.try_with(|recent| {
        let mut recent = recent.try_borrow_mut().ok()?;
        let slot = &mut recent[slot];
        match &slot.value {
            Some((at, value)) if *at == n => Some(value.clone()),
            _ if slot.missed == n => {
                // Asked for again: worth keeping (a clone is then a reference count).
                let value = format_number(n);
                slot.value = Some((n, value.clone()));
                Some(value)
            }
            _ => {
                slot.missed = n;
                None
            }
        }
    });
    cached.ok().flatten().unwrap_or_else(|| format_number(n))
}

/// Bytes of the per-thread buffer large numbers are written to (about 40 Unix times).
const DIGITS_CHUNK: usize = 512;

/// `n` as a header value, its digits written to a per-thread buffer that many values share:
/// a value is a slice of it (a reference count to raise, and to lower when the response is
/// dropped), not an allocation of its own. `HeaderValue::from(u64)` takes two allocations. A
/// buffer is freed with the last value cut from it, so a response kept alive holds at most
/// [`DIGITS_CHUNK`] bytes more than its digits.
fn format_number(n: u64) -> HeaderValue {
    use std::cell::RefCell;
    thread_local!(static DIGITS: RefCell<bytes::BytesMut> = RefCell::new(bytes::BytesMut::new()));
    let mut buf = [0u8; 20];
    let digits = decimal(n, &mut buf);
    let shared = DIGITS.try_with(|chunk| {
        let mut chunk = chunk.try_borrow_mut().ok()?;
        if chunk.capacity() < digits.len() {
            *chunk = bytes::BytesMut::with_capacity(DIGITS_CHUNK);
        }
        chunk.extend_from_slice(digits);
        Some(chunk.split().freeze())
    });
    let bytes = match shared {
        Ok(Some(bytes)) => bytes,
        _ => bytes::Bytes::copy_from_slice(digits),
    };
    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| HeaderValue::from(n))
}

/// The decimal digits of `n`, written at the end of `buf` (20 bytes hold `u64::MAX`).
pub(crate) fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// Unix seconds at `now + reset`, rounded up.
fn unix_reset_secs(now_nanos: u64, reset: Duration) -> u64 {
    ceil_secs(Duration::from_nanos(now_nanos).saturating_add(reset))
}

/// Appends `name` as a structured-field string: quoted, with `"` and `\` escaped. Limit names are
/// validated to printable ASCII when a layer is built; any other byte is replaced by `?` so the
/// field stays valid whatever the caller passes.
fn push_sf_string(out: &mut String, name: &str) {
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

/// `"name";q=Q;w=W, ...`, or `None` for no limits.
pub(crate) fn policy_field<'a>(
    limits: impl Iterator<Item = (&'a str, &'a Quota)>,
) -> Option<HeaderValue> {
    let mut out = String::new();
    for (name, quota) in limits {
        if !out.is_empty() {
            out.push_str(", ");
        }
        push_sf_string(&mut out, name);
        let _ = write!(
            out,
            ";q={};w={}",
            quota.burst_size(),
            policy_window_secs(quota)
        );
    }
    to_header_value(out)
}

/// `"name";r=R;t=T, ...` for the decisions the store counted, or `None` for none.
pub(crate) fn ratelimit_field<'a>(
    decisions: impl Iterator<Item = &'a Decision>,
) -> Option<HeaderValue> {
    let mut out = String::new();
    for d in decisions.filter(|d| d.is_counted()) {
        if !out.is_empty() {
            out.push_str(", ");
        }
        push_sf_string(&mut out, d.policy().as_str());
        let _ = write!(out, ";r={};t={}", d.remaining(), ceil_secs(d.reset()));
    }
    to_header_value(out)
}

fn to_header_value(s: String) -> Option<HeaderValue> {
    if s.is_empty() {
        return None;
    }
    // Only printable ASCII is ever pushed, so this cannot fail; stay panic-free regardless.
    HeaderValue::try_from(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Name;
    use std::time::{SystemTime, UNIX_EPOCH};

    fn named(d: Decision, name: &str) -> Decision {
        d.with_policy(Name::new(name))
    }

    #[test]
    fn an_uncounted_decision_writes_no_numbers() {
        let cfg = RateLimitHeaders::default().ietf(true);
        let mut h = HeaderMap::new();
        let open = named(Decision::uncounted(10), "open");
        cfg.write_x_ratelimit(&open, &mut h);
        assert!(h.is_empty(), "{h:?}");
        let counted = named(
            Decision::allowed_with(5, 4, Duration::from_secs(1)),
            "local",
        );
        let q = Quota::per_second(5);
        cfg.write_ietf([(&open, &q), (&counted, &q)], &mut h);
        assert_eq!(h[RATELIMIT], r#""local";r=4;t=1"#);
        assert!(h.get("x-ratelimit-remaining").is_none());
    }

    #[test]
    fn x_ratelimit_delta_rounds_up() {
        let mut h = HeaderMap::new();
        let cfg = RateLimitHeaders::new().reset_format(ResetFormat::DeltaSeconds);
        cfg.write_x_ratelimit(
            &Decision::allowed_with(10, 3, Duration::from_micros(1)),
            &mut h,
        );
        assert_eq!(h[X_RATELIMIT_LIMIT], "10");
        assert_eq!(h[X_RATELIMIT_REMAINING], "3");
        assert_eq!(h[X_RATELIMIT_RESET], "1");
        cfg.write_x_ratelimit(&Decision::allowed_with(10, 10, Duration::ZERO), &mut h);
        assert_eq!(h[X_RATELIMIT_REMAINING], "10");
        assert_eq!(h[X_RATELIMIT_RESET], "0");
        assert_eq!(
            h.get_all(X_RATELIMIT_LIMIT).iter().count(),
            1,
            "replaced, not appended"
        );
    }

    #[test]
    fn unix_reset_is_now_plus_reset_rounded_up() {
        let now = 1_700_000_000_250_000_000;
        assert_eq!(unix_reset_secs(now, Duration::ZERO), 1_700_000_001);
        assert_eq!(
            unix_reset_secs(now, Duration::from_millis(750)),
            1_700_000_001
        );
        assert_eq!(
            unix_reset_secs(now, Duration::from_millis(751)),
            1_700_000_002
        );
        let exact = 100_000_000_000;
        assert_eq!(unix_reset_secs(exact, Duration::from_secs(5)), 105);

        let mut h = HeaderMap::new();
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        RateLimitHeaders::new().write_x_ratelimit(
            &Decision::allowed_with(5, 0, Duration::from_secs(5)),
            &mut h,
        );
        let after = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let reset: u64 = h[X_RATELIMIT_RESET].to_str().unwrap().parse().unwrap();
        assert!(
            reset >= before + 5 && reset <= after + 6,
            "{before} {reset} {after}"
        );
    }

    #[test]
    fn disabled_headers_write_nothing() {
        let mut h = HeaderMap::new();
        let d = Decision::allowed_with(5, 4, Duration::from_secs(1));
        RateLimitHeaders::none().write_x_ratelimit(&d, &mut h);
        RateLimitHeaders::none().write_ietf([(&d, &Quota::per_second(5))], &mut h);
        assert!(h.is_empty());
        // IETF is opt-in.
        RateLimitHeaders::new().write_ietf([(&d, &Quota::per_second(5))], &mut h);
        assert!(h.is_empty());
    }

    #[test]
    fn ietf_fields_escape_names_and_append() {
        let d = named(
            Decision::rejected(3, 0, Duration::from_millis(2001), Duration::from_millis(10)),
            r#"we"ird\name"#,
        );
        let q = Quota::per_minute(3);
        let mut h = HeaderMap::new();
        let cfg = RateLimitHeaders::new().ietf(true);
        cfg.write_ietf([(&d, &q)], &mut h);
        assert_eq!(h[RATELIMIT_POLICY], r#""we\"ird\\name";q=3;w=60"#);
        assert_eq!(h[RATELIMIT], r#""we\"ird\\name";r=0;t=3"#);
        // A second layer appends its own field line.
        let g = named(
            Decision::allowed_with(100, 99, Duration::from_secs(1)),
            "global",
        );
        cfg.write_ietf([(&g, &Quota::per_second(100))], &mut h);
        let all: Vec<_> = h.get_all(RATELIMIT).iter().collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1], r#""global";r=99;t=1"#);
    }

    #[test]
    fn x_ratelimit_on_an_empty_map_matches_inserting_them() {
        let cfg = RateLimitHeaders::default().reset_format(ResetFormat::DeltaSeconds);
        let d = Decision::allowed_with(100, 42, Duration::from_secs(12_345));
        let mut fresh = HeaderMap::new();
        cfg.write_x_ratelimit(&d, &mut fresh);
        let mut inserted = HeaderMap::new();
        inserted.reserve(3);
        inserted.insert(X_RATELIMIT_LIMIT, HeaderValue::from_static("100"));
        inserted.insert(X_RATELIMIT_REMAINING, HeaderValue::from_static("42"));
        inserted.insert(X_RATELIMIT_RESET, HeaderValue::from_static("12345"));
        let pairs = |h: &HeaderMap| {
            h.iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(pairs(&fresh), pairs(&inserted));
        assert_eq!(fresh.capacity(), inserted.capacity());
        // Lookups and later writes work on it as on any map; a second write replaces.
        assert_eq!(fresh[X_RATELIMIT_REMAINING], "42");
        fresh.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        );
        let d = Decision::allowed_with(100, 41, Duration::from_secs(1));
        cfg.write_x_ratelimit(&d, &mut fresh);
        assert_eq!(fresh.len(), 4);
        assert_eq!(fresh[X_RATELIMIT_REMAINING], "41");
        assert_eq!(fresh[X_RATELIMIT_RESET], "1");
        // A map that has headers keeps them.
        let mut full = HeaderMap::new();
        full.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("a/b"));
        cfg.write_x_ratelimit(&d, &mut full);
        assert_eq!(full.len(), 4);
        assert_eq!(full[http::header::CONTENT_TYPE], "a/b");
        assert_eq!(full[X_RATELIMIT_LIMIT], "100");
    }

    #[test]
    fn sf_string_replaces_non_ascii() {
        let mut s = String::new();
        push_sf_string(&mut s, "é\tx");
        assert_eq!(s, "\"??x\"");
    }

    #[test]
    fn numbers_match_their_decimal_form() {
        for n in (0..10_500).chain([u64::MAX, 1_700_000_000]) {
            assert_eq!(number(n), n.to_string().as_str(), "{n}");
        }
    }

    #[test]
    fn large_numbers_come_back_right_from_the_cache_whatever_collides() {
        // Many values per cache slot, each asked for several times in a row and interleaved:
        // a cached value is only ever returned for its own number.
        let values: Vec<u64> = (0..200u64).map(|i| 10_000 + i * 7_919).collect();
        for _ in 0..3 {
            for &n in &values {
                assert_eq!(number(n), n.to_string().as_str(), "{n}");
                assert_eq!(number(n), n.to_string().as_str(), "{n}");
            }
        }
        let other = std::thread::spawn(|| number(1_700_000_001)).join().unwrap();
        assert_eq!(other, "1700000001");
    }

    #[test]
    fn formatted_numbers_keep_their_digits_across_shared_buffers() {
        // Far more digits than one buffer holds, every value kept alive while later ones are
        // written (and buffers replaced): each keeps its own digits.
        let kept: Vec<(u64, HeaderValue)> = (0..2_000u64)
            .map(|i| {
                let n = 1_700_000_000 + i * 104_729;
                (n, format_number(n))
            })
            .collect();
        for (n, value) in &kept {
            assert_eq!(value, n.to_string().as_str());
        }
        drop(kept);
        assert_eq!(format_number(u64::MAX), u64::MAX.to_string().as_str());
        assert_eq!(format_number(10_000), "10000");
    }

    #[test]
    fn window_secs_round_up_and_never_zero() {
        assert_eq!(
            policy_window_secs(&Quota::per(Duration::from_millis(500), 2)),
            1
        );
        assert_eq!(policy_window_secs(&Quota::per_second(3).burst(4)), 2); // 1.33 s
        assert_eq!(policy_window_secs(&Quota::per_second(1).burst(5)), 5);
    }

    #[test]
    fn retry_after_never_zero() {
        let d = Decision::rejected(1, 0, Duration::ZERO, Duration::from_nanos(1));
        assert_eq!(retry_after(&d).unwrap(), "1");
        assert!(retry_after(&Decision::impossible(1, 1, Duration::ZERO)).is_none());
        let mut h = HeaderMap::new();
        set_retry_after_if_absent(&mut h, 0);
        assert_eq!(h[RETRY_AFTER], "1");
        set_retry_after_if_absent(&mut h, 9);
        assert_eq!(h[RETRY_AFTER], "1");
    }
}
