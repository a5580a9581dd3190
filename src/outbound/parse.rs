//! Parsers for what an upstream says about its limits: `Retry-After` (delta-seconds or
//! HTTP-date), `X-RateLimit-Limit` / `-Remaining` / `-Reset`, the IETF `RateLimit` and
//! `RateLimit-Policy` fields (draft-10 lists as [`headers`](crate::headers) writes them, the
//! draft-07 dictionary and the draft-06 `RateLimit-Limit` / `-Remaining` / `-Reset` fields), and
//! gRPC `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms` or (feature `tonic`)
//! `google.rpc.RetryInfo` in `grpc-status-details-bin`.
//!
//! Every parser takes untrusted input: a malformed value is ignored (`None`, or left out of a
//! list), never a panic, and every number is bounded so no arithmetic overflows.
//!
//! ```
//! use std::time::Duration;
//! use http::{HeaderMap, StatusCode};
//! use tollgate::outbound::parse::UpstreamSignal;
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("retry-after", "3".parse().unwrap());
//! headers.insert("x-ratelimit-limit", "10".parse().unwrap());
//! headers.insert("x-ratelimit-remaining", "0".parse().unwrap());
//! headers.insert("x-ratelimit-reset", "1".parse().unwrap());
//! headers.insert("ratelimit-policy", r#""default";q=10;w=1"#.parse().unwrap());
//!
//! let signal = UpstreamSignal::from_headers(StatusCode::TOO_MANY_REQUESTS, &headers, 0);
//! assert!(signal.refused());
//! assert_eq!(signal.retry_after(), Some(Duration::from_secs(3)));
//! assert_eq!(signal.limit(), Some(10));
//! assert_eq!(signal.remaining(), Some(0));
//! assert_eq!(signal.reset(), Some(Duration::from_secs(1)));
//! assert_eq!(signal.policies()[0].quota(), 10);
//! assert_eq!(signal.policies()[0].window(), Duration::from_secs(1));
//! ```

use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

pub use super::http_date::http_date;
use crate::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};

/// `RateLimit-Limit` (IETF draft-06 and earlier).
const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
/// `RateLimit-Remaining` (IETF draft-06 and earlier).
const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
/// `RateLimit-Reset` (IETF draft-06 and earlier).
const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
/// `grpc-status`: in the headers of a trailers-only gRPC response.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-retry-pushback-ms` (gRPC A6 retry design): the server's wait in milliseconds.
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The longest wait any header can ask for: a year. Longer values are clamped to it, so time
/// arithmetic on them never overflows (the layer clamps further, to its `max_pause`).
pub const MAX_SIGNALLED: Duration = Duration::from_secs(365 * 86_400);

/// At most this many members are read from a list field; the rest are ignored.
const MAX_ITEMS: usize = 16;

/// A Unix timestamp in seconds rather than a delta: `X-RateLimit-Reset` values from this one on
/// (2001-09-09T01:46:40Z as Unix seconds, 11,574 days as a delta) are read as Unix time,
/// smaller ones as seconds from now.
const UNIX_SECONDS_FROM: u64 = 1_000_000_000;

/// A Unix timestamp in milliseconds rather than seconds: `X-RateLimit-Reset` values from this
/// one on (2001-09-09T01:46:40Z as Unix milliseconds, the year 33658 as Unix seconds) are read
/// as Unix milliseconds.
const UNIX_MILLIS_FROM: u64 = 1_000_000_000_000;

/// What one response says about the upstream's limits. See the [module docs](self).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamSignal {
    refused: bool,
    retry_after: Option<Duration>,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<Duration>,
    policies: Vec<PolicyItem>,
}

impl UpstreamSignal {
    /// Reads a response's status and headers. `now_unix_micros` is the wall-clock time (µs
    /// since the Unix epoch) that HTTP-dates and Unix-time resets are measured from.
    ///
    /// A response is *refused* when its status is `429` or `503`, or its headers carry
    /// `grpc-status: 8` (`RESOURCE_EXHAUSTED`, a trailers-only gRPC answer). Its wait is, in
    /// this order: `Retry-After`, `grpc-retry-pushback-ms`, and with the `tonic` feature the
    /// `RetryInfo` of `grpc-status-details-bin`.
    pub fn from_headers(status: StatusCode, headers: &HeaderMap, now_unix_micros: u64) -> Self {
        let grpc_exhausted = headers
            .get(GRPC_STATUS)
            .is_some_and(|v| v.as_bytes().trim_ascii() == b"8");
        let refused = status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::SERVICE_UNAVAILABLE
            || grpc_exhausted;
        let mut retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| retry_after(v, now_unix_micros));
        if retry_after.is_none() && grpc_exhausted {
            retry_after = headers
                .get(GRPC_RETRY_PUSHBACK_MS)
                .and_then(grpc_retry_pushback);
            #[cfg(feature = "tonic")]
            if retry_after.is_none() {
                retry_after = super::grpc::retry_info(headers);
            }
        }
        let x = XRateLimit::from_headers(headers, now_unix_micros);
        let items = headers.get(RATELIMIT).map(ratelimit).unwrap_or_default();
        // The IETF `RateLimit` field's first item when `X-RateLimit-*` says nothing.
        let first = items.first();
        let policies = headers
            .get(RATELIMIT_POLICY)
            .map(ratelimit_policy)
            .unwrap_or_default();
        // The tightest of the `RateLimit` items: fewest units left, on a tie the longest reset.
        let tightest = items
            .iter()
            .filter(|i| i.remaining.is_some())
            .min_by(|a, b| a.remaining.cmp(&b.remaining).then(b.reset.cmp(&a.reset)));
        // Remaining and reset come from the same limit: the one with fewest units left.
        let (remaining, reset) = match (x.remaining, tightest) {
            (Some(xr), Some(i)) if i.remaining < Some(xr) => (i.remaining, i.reset.or(x.reset)),
            (Some(xr), Some(i)) if i.remaining == Some(xr) => (Some(xr), x.reset.max(i.reset)),
            (Some(xr), _) => (Some(xr), x.reset.or_else(|| first.and_then(|i| i.reset))),
            (None, Some(i)) => (i.remaining, i.reset),
            (None, None) => (None, x.reset.or_else(|| first.and_then(|i| i.reset))),
        };
        let limit = x
            .limit
            .or_else(|| first.and_then(|i| i.limit))
            .or_else(|| policies.first().map(|p| p.quota));
        Self {
            refused,
            retry_after,
            limit,
            remaining,
            reset,
            policies,
        }
    }

    /// Whether the upstream refused the request (`429`, `503`, gRPC `RESOURCE_EXHAUSTED`).
    pub fn refused(&self) -> bool {
        self.refused
    }

    /// How long the upstream asked to wait, when it said.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The limit's size (`X-RateLimit-Limit`, the draft fields' limit, or the first policy's
    /// quota).
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Units left: the smallest of `X-RateLimit-Remaining` and the `RateLimit` items'.
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }

    /// Time until the limit with the fewest units [`remaining`](Self::remaining) is restored
    /// (`X-RateLimit-Reset` as delta seconds or Unix time, or that `RateLimit` item's `t`; on a
    /// tie, the longest).
    pub fn reset(&self) -> Option<Duration> {
        self.reset
    }

    /// The `RateLimit-Policy` items: each limit's quota and window.
    pub fn policies(&self) -> &[PolicyItem] {
        &self.policies
    }

    /// Whether the response said anything about limits at all.
    pub fn is_empty(&self) -> bool {
        self.retry_after.is_none()
            && self.limit.is_none()
            && self.remaining.is_none()
            && self.reset.is_none()
            && self.policies.is_empty()
    }
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (or the draft-06 `RateLimit-*` names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XRateLimit {
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<Duration>,
}

impl XRateLimit {
    /// Reads the three fields, each independently (a malformed one is `None`). The reset is
    /// read by its size:
    ///
    /// | value `v` | read as |
    /// |---|---|
    /// | below 10^9 | seconds from now (fractions accepted) |
    /// | 10^9 to below 10^12 | Unix time in seconds (2001-09-09 on) |
    /// | 10^12 and above | Unix time in milliseconds (2001-09-09 on) |
    ///
    /// A Unix time is measured from `now_unix_micros`; one in the past is zero. Every reset is
    /// clamped to [`MAX_SIGNALLED`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::HeaderMap;
    /// use tollgate::outbound::parse::XRateLimit;
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.insert("x-ratelimit-limit", "60".parse().unwrap());
    /// headers.insert("x-ratelimit-remaining", "12".parse().unwrap());
    /// headers.insert("x-ratelimit-reset", "1700000030".parse().unwrap());
    /// let x = XRateLimit::from_headers(&headers, 1_700_000_000_000_000);
    /// assert_eq!((x.limit(), x.remaining()), (Some(60), Some(12)));
    /// assert_eq!(x.reset(), Some(Duration::from_secs(30)));
    ///
    /// // The same instant in Unix milliseconds.
    /// headers.insert("x-ratelimit-reset", "1700000030000".parse().unwrap());
    /// let x = XRateLimit::from_headers(&headers, 1_700_000_000_000_000);
    /// assert_eq!(x.reset(), Some(Duration::from_secs(30)));
    /// ```
    pub fn from_headers(headers: &HeaderMap, now_unix_micros: u64) -> Self {
        let get = |a: &HeaderName, b: &HeaderName| headers.get(a).or_else(|| headers.get(b));
        Self {
            limit: get(&X_RATELIMIT_LIMIT, &RATELIMIT_LIMIT).and_then(|v| integer(v.as_bytes())),
            remaining: get(&X_RATELIMIT_REMAINING, &RATELIMIT_REMAINING)
                .and_then(|v| integer(v.as_bytes())),
            reset: get(&X_RATELIMIT_RESET, &RATELIMIT_RESET)
                .and_then(|v| reset(v.as_bytes(), now_unix_micros)),
        }
    }

    /// `X-RateLimit-Limit`.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// `X-RateLimit-Remaining`.
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }

    /// `X-RateLimit-Reset`, as time from now.
    pub fn reset(&self) -> Option<Duration> {
        self.reset
    }
}

/// One item of the IETF `RateLimit` field: `"burst";r=4;t=1` (draft-10), or the draft-07
/// dictionary `limit=10, remaining=9, reset=1` read as one item.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimitItem {
    name: Option<String>,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<Duration>,
}

impl RateLimitItem {
    /// The policy's name (draft-10), `None` in the draft-07 form.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The limit (draft-07 `limit`); draft-10 states it in `RateLimit-Policy` instead.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Units left (`r`, or draft-07 `remaining`).
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }

    /// Time until restored (`t`, or draft-07 `reset`).
    pub fn reset(&self) -> Option<Duration> {
        self.reset
    }
}

/// One item of the IETF `RateLimit-Policy` field: `"burst";q=5;w=5` (draft-10) or `10;w=1`
/// (draft-07: the quota is the item, the window a parameter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyItem {
    name: Option<String>,
    quota: u64,
    window: Duration,
}

impl PolicyItem {
    /// The policy's name (draft-10).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Units allowed per [`window`](Self::window) (`q`).
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// The window (`w`), at least one second.
    pub fn window(&self) -> Duration {
        self.window
    }
}

/// `Retry-After` (RFC 9110 §10.2.3): delta-seconds, or an HTTP-date measured from
/// `now_unix_micros` (a date in the past is zero). Fractional seconds are accepted; values are
/// clamped to [`MAX_SIGNALLED`].
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use tollgate::outbound::parse::retry_after;
///
/// let now = 784_111_777_000_000; // Sun, 06 Nov 1994 08:49:37 GMT
/// assert_eq!(retry_after(&HeaderValue::from_static("120"), now), Some(Duration::from_secs(120)));
/// let date = HeaderValue::from_static("Sun, 06 Nov 1994 08:49:47 GMT");
/// assert_eq!(retry_after(&date, now), Some(Duration::from_secs(10)));
/// assert_eq!(retry_after(&HeaderValue::from_static("soon"), now), None);
/// ```
pub fn retry_after(value: &HeaderValue, now_unix_micros: u64) -> Option<Duration> {
    let bytes = value.as_bytes().trim_ascii();
    if bytes.first().is_some_and(u8::is_ascii_digit) {
        return seconds(bytes);
    }
    let date = http_date(value.to_str().ok()?, now_unix_micros / 1_000_000)?;
    Some(until_unix(date, now_unix_micros))
}

/// The items of an IETF `RateLimit` field; malformed items are left out.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use tollgate::outbound::parse::ratelimit;
///
/// let items = ratelimit(&HeaderValue::from_static(r#""burst";r=4;t=1, "daily";r=4999;t=18"#));
/// assert_eq!(items.len(), 2);
/// assert_eq!(items[1].name(), Some("daily"));
/// assert_eq!(items[1].remaining(), Some(4999));
/// assert_eq!(items[1].reset(), Some(Duration::from_secs(18)));
///
/// let draft07 = ratelimit(&HeaderValue::from_static("limit=10, remaining=9, reset=1"));
/// assert_eq!((draft07[0].limit(), draft07[0].remaining()), (Some(10), Some(9)));
/// ```
pub fn ratelimit(value: &HeaderValue) -> Vec<RateLimitItem> {
    let Ok(text) = value.to_str() else {
        return Vec::new();
    };
    let members = split_outside_quotes(text, b',');
    let is_dictionary = members.iter().any(|m| {
        let head = split_outside_quotes(m, b';')[0].trim();
        !head.starts_with('"') && head.contains('=')
    });
    if is_dictionary {
        // draft-07: `limit=10, remaining=9, reset=1`, one item.
        let mut item = RateLimitItem::default();
        for member in members.iter().take(MAX_ITEMS) {
            let head = split_outside_quotes(member, b';')[0];
            if let Some((key, value)) = head.split_once('=') {
                let value = value.trim().as_bytes();
                match key.trim() {
                    "limit" => item.limit = integer(value),
                    "remaining" => item.remaining = integer(value),
                    "reset" => item.reset = seconds(value),
                    _ => {}
                }
            }
        }
        return vec![item];
    }
    members
        .iter()
        .take(MAX_ITEMS)
        .filter_map(|member| {
            let (name, params) = item(member)?;
            let mut out = RateLimitItem {
                name,
                ..RateLimitItem::default()
            };
            for (key, value) in params {
                match key {
                    "r" => out.remaining = integer(value.as_bytes()),
                    "t" => out.reset = seconds(value.as_bytes()),
                    _ => {}
                }
            }
            (out.remaining.is_some() || out.reset.is_some()).then_some(out)
        })
        .collect()
}

/// The items of an IETF `RateLimit-Policy` field; items without a positive quota are left
/// out, and a missing or zero window is one second.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use tollgate::outbound::parse::ratelimit_policy;
///
/// let items = ratelimit_policy(&HeaderValue::from_static(r#""burst";q=5;w=5, "daily";q=5000;w=86400"#));
/// assert_eq!((items[0].quota(), items[0].window()), (5, Duration::from_secs(5)));
/// assert_eq!(items[1].name(), Some("daily"));
///
/// let draft07 = ratelimit_policy(&HeaderValue::from_static("10;w=1, 1000;w=3600"));
/// assert_eq!((draft07[1].quota(), draft07[1].window()), (1000, Duration::from_secs(3600)));
/// ```
pub fn ratelimit_policy(value: &HeaderValue) -> Vec<PolicyItem> {
    let Ok(text) = value.to_str() else {
        return Vec::new();
    };
    split_outside_quotes(text, b',')
        .iter()
        .take(MAX_ITEMS)
        .filter_map(|member| {
            let head = split_outside_quotes(member, b';')[0].trim();
            let (name, params) = item(member)?;
            // draft-07: the item itself is the quota.
            let mut quota = if name.is_none() {
                integer(head.as_bytes())
            } else {
                None
            };
            let mut window = None;
            for (key, value) in params {
                match key {
                    "q" => quota = integer(value.as_bytes()),
                    "w" => window = seconds(value.as_bytes()),
                    _ => {}
                }
            }
            let quota = quota.filter(|&q| q > 0)?;
            let window = window
                .filter(|w| !w.is_zero())
                .unwrap_or(Duration::from_secs(1))
                .max(Duration::from_secs(1));
            Some(PolicyItem {
                name,
                quota,
                window,
            })
        })
        .collect()
}

/// `grpc-retry-pushback-ms`: milliseconds; negative or malformed is `None`.
fn grpc_retry_pushback(value: &HeaderValue) -> Option<Duration> {
    let ms = integer(value.as_bytes())?;
    Some(Duration::from_millis(ms).min(MAX_SIGNALLED))
}

/// `X-RateLimit-Reset`: delta seconds below [`UNIX_SECONDS_FROM`], Unix seconds from it, Unix
/// milliseconds from [`UNIX_MILLIS_FROM`]; clamped to [`MAX_SIGNALLED`].
fn reset(bytes: &[u8], now_unix_micros: u64) -> Option<Duration> {
    let micros = seconds_micros(bytes)?;
    let whole = micros / 1_000_000;
    if whole >= UNIX_MILLIS_FROM {
        // The value is milliseconds: `micros` holds it × 10^6, so µs is `micros / 1000`.
        Some(until_unix_micros(micros / 1_000, now_unix_micros))
    } else if whole >= UNIX_SECONDS_FROM {
        Some(until_unix_micros(micros, now_unix_micros))
    } else {
        Some(Duration::from_micros(micros).min(MAX_SIGNALLED))
    }
}

/// From now until Unix second `secs`, zero when it has passed.
fn until_unix(secs: u64, now_unix_micros: u64) -> Duration {
    until_unix_micros(secs.saturating_mul(1_000_000), now_unix_micros)
}

fn until_unix_micros(at: u64, now_unix_micros: u64) -> Duration {
    Duration::from_micros(at.saturating_sub(now_unix_micros)).min(MAX_SIGNALLED)
}

/// A non-negative integer of at most 15 digits (an sf-integer), surrounding spaces allowed.
fn integer(bytes: &[u8]) -> Option<u64> {
    let bytes = bytes.trim_ascii();
    if bytes.is_empty() || bytes.len() > 15 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// Seconds: an integer, or a decimal with up to 6 fractional digits (microseconds; more are
/// cut off); clamped to [`MAX_SIGNALLED`].
fn seconds(bytes: &[u8]) -> Option<Duration> {
    let micros = seconds_micros(bytes)?;
    Some(Duration::from_micros(micros).min(MAX_SIGNALLED))
}

/// [`seconds`] in microseconds, unclamped (saturating at `u64::MAX`).
fn seconds_micros(bytes: &[u8]) -> Option<u64> {
    let bytes = bytes.trim_ascii();
    let (whole, frac) = match bytes.iter().position(|&b| b == b'.') {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (bytes, &b""[..]),
    };
    if whole.is_empty() || !whole.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if bytes.len() > whole.len() && (frac.is_empty() || !frac.iter().all(u8::is_ascii_digit)) {
        return None;
    }
    let mut secs: u64 = 0;
    for &b in whole {
        secs = secs.saturating_mul(10).saturating_add(u64::from(b - b'0'));
    }
    let mut micros = 0u64;
    for (i, &b) in frac.iter().take(6).enumerate() {
        micros += u64::from(b - b'0') * 10u64.pow(5 - i as u32);
    }
    Some(secs.saturating_mul(1_000_000).saturating_add(micros))
}

/// A member's `;key=value` parameters, in order.
type Params<'a> = Vec<(&'a str, &'a str)>;

/// One structured-field list member: its bare item as a name (an sf-string or token; `None`
/// for an integer) and its `;key=value` parameters. `None` when the member is empty.
fn item(member: &str) -> Option<(Option<String>, Params<'_>)> {
    let parts = split_outside_quotes(member, b';');
    let head = parts[0].trim();
    if head.is_empty() {
        return None;
    }
    let name = if let Some(quoted) = head.strip_prefix('"') {
        Some(
            quoted
                .strip_suffix('"')?
                .replace("\\\"", "\"")
                .replace("\\\\", "\\"),
        )
    } else if head.bytes().all(|b| b.is_ascii_digit()) {
        None
    } else {
        Some(head.to_owned())
    };
    let params = parts[1..]
        .iter()
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((k.trim(), v.trim()))
        })
        .collect();
    Some((name, params))
}

/// Splits at `sep` outside double quotes (backslash escapes inside them); always at least one
/// part.
fn split_outside_quotes(text: &str, sep: u8) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, b) in text.bytes().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if b == sep && !quoted {
            parts.push(&text[start..i]);
            start = i + 1;
        }
    }
    parts.push(&text[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::{RateLimitHeaders, ResetFormat};
    use crate::{Decision, Name, Quota};

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    const NOW: u64 = 1_764_633_600_000_000;

    #[test]
    fn retry_after_seconds_and_dates() {
        assert_eq!(retry_after(&hv("0"), NOW), Some(Duration::ZERO));
        assert_eq!(retry_after(&hv(" 7 "), NOW), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after(&hv("1.5"), NOW),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(&hv("99999999999999999999"), NOW),
            Some(MAX_SIGNALLED)
        );
        let later = super::super::http_date::format_imf_fixdate(NOW / 1_000_000 + 42);
        assert_eq!(retry_after(&hv(&later), NOW), Some(Duration::from_secs(42)));
        let past = super::super::http_date::format_imf_fixdate(NOW / 1_000_000 - 42);
        assert_eq!(retry_after(&hv(&past), NOW), Some(Duration::ZERO));
        for bad in [
            "",
            "-1",
            "1e3",
            "1.",
            ".5",
            "abc",
            "1 2",
            "Sun, 06 Nov 1994",
            "+3",
        ] {
            assert_eq!(retry_after(&hv(bad), NOW), None, "{bad:?}");
        }
    }

    #[test]
    fn reset_by_size_delta_unix_seconds_unix_millis() {
        let x = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(X_RATELIMIT_RESET, hv(v));
            XRateLimit::from_headers(&h, NOW).reset()
        };
        let now_s = NOW / 1_000_000;
        assert_eq!(x("30"), Some(Duration::from_secs(30)));
        assert_eq!(x("999999999"), Some(MAX_SIGNALLED));
        assert_eq!(x(&(now_s + 30).to_string()), Some(Duration::from_secs(30)));
        assert_eq!(
            x(&(now_s * 1_000 + 1_500).to_string()),
            Some(Duration::from_millis(1_500))
        );
        assert_eq!(
            x(&(now_s * 1_000 - 1_500).to_string()),
            Some(Duration::ZERO)
        );
        assert_eq!(x("99999999999999999999"), Some(MAX_SIGNALLED));
    }

    #[test]
    fn reads_what_the_crate_writes() {
        // X-RateLimit-* in both reset formats, the IETF fields, from the crate's own writer.
        let decision = Decision::rejected(
            5,
            0,
            Duration::from_millis(4200),
            Duration::from_millis(800),
        )
        .with_policy(Name::new("burst"));
        let quota = Quota::per_second(1).burst(5);
        for format in [ResetFormat::DeltaSeconds, ResetFormat::UnixSeconds] {
            let mut headers = HeaderMap::new();
            let writer = RateLimitHeaders::new().ietf(true).reset_format(format);
            writer.write_x_ratelimit(&decision, &mut headers);
            writer.write_ietf([(&decision, &quota)], &mut headers);
            headers.insert(RETRY_AFTER, crate::headers::retry_after(&decision).unwrap());
            let now = crate::clock::Clock::unix_offset_micros(&crate::clock::SystemClock::new());
            let s = UpstreamSignal::from_headers(StatusCode::TOO_MANY_REQUESTS, &headers, now);
            assert!(s.refused());
            assert_eq!(s.retry_after(), Some(Duration::from_secs(1)));
            assert_eq!((s.limit(), s.remaining()), (Some(5), Some(0)));
            // 4.2 s rounded up: exactly 5 s as delta seconds; as Unix seconds, the next whole
            // second after 4.2 s from when it was written (up to 5.2 s from now).
            let reset = s.reset().unwrap();
            match format {
                ResetFormat::DeltaSeconds => assert_eq!(reset, Duration::from_secs(5)),
                _ => assert!(
                    reset >= Duration::from_secs(4) && reset <= Duration::from_millis(5_300),
                    "{reset:?}"
                ),
            }
            assert_eq!(s.policies().len(), 1);
            assert_eq!(s.policies()[0].name(), Some("burst"));
            assert_eq!(s.policies()[0].quota(), 5);
            assert_eq!(s.policies()[0].window(), Duration::from_secs(5));
        }
    }

    #[test]
    fn draft_forms() {
        let items = ratelimit(&hv(r#""a,b";r=1;t=2, "x\"y";r=3"#));
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].name(), Some("a,b"));
        assert_eq!(items[1].name(), Some("x\"y"));
        assert_eq!(items[1].reset(), None);
        let policy = ratelimit_policy(&hv(r#"default;q=100;w=60;comment="hi""#));
        assert_eq!(policy[0].name(), Some("default"));
        assert_eq!(policy[0].window(), Duration::from_secs(60));
        // draft-06 names.
        let mut headers = HeaderMap::new();
        headers.insert(RATELIMIT_LIMIT, hv("100"));
        headers.insert(RATELIMIT_REMAINING, hv("50"));
        headers.insert(RATELIMIT_RESET, hv("30"));
        let x = XRateLimit::from_headers(&headers, NOW);
        assert_eq!((x.limit(), x.remaining()), (Some(100), Some(50)));
        assert_eq!(x.reset(), Some(Duration::from_secs(30)));
        // The reset goes with the exhausted limit, not the first one listed.
        let mut headers = HeaderMap::new();
        headers.insert(X_RATELIMIT_REMAINING, hv("4"));
        headers.insert(X_RATELIMIT_RESET, hv("1"));
        headers.insert(RATELIMIT, hv(r#""burst";r=4;t=1, "daily";r=0;t=18000"#));
        let s = UpstreamSignal::from_headers(StatusCode::OK, &headers, NOW);
        assert_eq!(s.remaining(), Some(0));
        assert_eq!(s.reset(), Some(Duration::from_secs(18_000)));
        headers.insert(X_RATELIMIT_REMAINING, hv("0"));
        headers.insert(RATELIMIT, hv(r#""burst";r=4;t=1, "daily";r=0;t=60"#));
        let s = UpstreamSignal::from_headers(StatusCode::OK, &headers, NOW);
        assert_eq!(
            s.reset(),
            Some(Duration::from_secs(60)),
            "a tie: the longest"
        );
        // draft-07 dictionary through the signal.
        let mut headers = HeaderMap::new();
        headers.insert(RATELIMIT, hv("limit=10, remaining=0, reset=2"));
        let s = UpstreamSignal::from_headers(StatusCode::OK, &headers, NOW);
        assert!(!s.refused());
        assert_eq!((s.limit(), s.remaining()), (Some(10), Some(0)));
        assert_eq!(s.reset(), Some(Duration::from_secs(2)));
    }

    #[test]
    fn grpc_pushback() {
        let mut headers = HeaderMap::new();
        headers.insert(GRPC_STATUS, hv("8"));
        headers.insert(GRPC_RETRY_PUSHBACK_MS, hv("1500"));
        let s = UpstreamSignal::from_headers(StatusCode::OK, &headers, NOW);
        assert!(s.refused());
        assert_eq!(s.retry_after(), Some(Duration::from_millis(1500)));
        headers.insert(GRPC_RETRY_PUSHBACK_MS, hv("-1"));
        let s = UpstreamSignal::from_headers(StatusCode::OK, &headers, NOW);
        assert!(s.refused());
        assert_eq!(s.retry_after(), None);
        headers.insert(GRPC_STATUS, hv("0"));
        assert!(!UpstreamSignal::from_headers(StatusCode::OK, &headers, NOW).refused());
    }

    #[test]
    fn garbage_never_panics() {
        let names = [
            RETRY_AFTER,
            X_RATELIMIT_LIMIT,
            X_RATELIMIT_REMAINING,
            X_RATELIMIT_RESET,
            RATELIMIT,
            RATELIMIT_POLICY,
            GRPC_STATUS,
            GRPC_RETRY_PUSHBACK_MS,
            HeaderName::from_static("grpc-status-details-bin"),
        ];
        let seeds: &[&[u8]] = &[
            b"",
            b"\"",
            b"\"\\",
            b";;;,,,",
            b"=",
            b"q=",
            b"\"a\";q=;w=",
            b"\"a\";q=99999999999999999999;w=99999999999999999999",
            b"limit=, remaining=x, reset=-1",
            b"18446744073709551616",
            b"0.0000000000001",
            b"1.9999999",
            b"8",
            b"\xff\xfe",
            b"Sun, 06 Nov 1994 08:49:37 GMT",
            b"AAAA",
            b"CAgSB2V4aGF1c3Q",
        ];
        // A deterministic stream of bytes mixing the seeds' alphabet.
        let alphabet = b"0123456789;,=\"\\ .-qwrtlimitSunNovGMT:\xff";
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut values: Vec<Vec<u8>> = seeds.iter().map(|s| s.to_vec()).collect();
        for _ in 0..2000 {
            let len = (x % 40) as usize;
            let mut v = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push(alphabet[(x % alphabet.len() as u64) as usize]);
            }
            values.push(v);
        }
        for value in &values {
            let Ok(value) = HeaderValue::from_bytes(value) else {
                continue;
            };
            let mut all = HeaderMap::new();
            for name in &names {
                let mut one = HeaderMap::new();
                one.insert(name.clone(), value.clone());
                all.insert(name.clone(), value.clone());
                for now in [0, NOW, u64::MAX] {
                    let _ = UpstreamSignal::from_headers(StatusCode::TOO_MANY_REQUESTS, &one, now);
                }
            }
            for now in [0, NOW, u64::MAX] {
                let _ = UpstreamSignal::from_headers(StatusCode::SERVICE_UNAVAILABLE, &all, now);
            }
        }
    }
}
