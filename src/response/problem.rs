//! RFC 9457 `application/problem+json` bodies, written without serde.

use std::fmt::{self, Write as _};

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};

use super::RejectionBody;

/// The media type of RFC 9457 problem details.
pub const APPLICATION_PROBLEM_JSON: HeaderValue =
    HeaderValue::from_static("application/problem+json");

/// An RFC 9457 problem-details document, built member by member.
///
/// `type`, `title` and `status` are always present; `detail` and extension members are added in
/// the order given. Strings are JSON-escaped, so any text is safe.
///
/// ```
/// use http::StatusCode;
/// use tollgate::response::ProblemDetails;
///
/// let problem = ProblemDetails::new(StatusCode::TOO_MANY_REQUESTS, "about:blank", "Too Many Requests")
///     .detail("Slow \"down\"")
///     .member_u64("retry_after", 3);
/// assert_eq!(
///     problem.to_json(),
///     r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"Slow \"down\"","retry_after":3}"#
/// );
/// let response = problem.into_response();
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
#[derive(Debug, Clone)]
pub struct ProblemDetails {
    status: StatusCode,
    json: String,
}

impl ProblemDetails {
    /// A problem of `problem_type` (a URI reference) with a short human-readable `title`.
    pub fn new(status: StatusCode, problem_type: &str, title: &str) -> Self {
        Self::typed(status, format_args!("{problem_type}"), title)
    }

    /// [`new`](Self::new) with the type written from `problem_type` (no intermediate string).
    pub(crate) fn typed(status: StatusCode, problem_type: fmt::Arguments<'_>, title: &str) -> Self {
        // Room for the default rate-limited document without growing.
        let mut json = String::with_capacity(512);
        json.push_str("{\"type\":");
        push_json_fmt(&mut json, problem_type);
        Self::after_type(status, json, title)
    }

    /// [`typed`](Self::typed) with the type made of `parts`.
    pub(crate) fn typed_parts(status: StatusCode, problem_type: &[Part<'_>], title: &str) -> Self {
        let mut json = String::with_capacity(512);
        json.push_str("{\"type\":\"");
        push_parts(&mut json, problem_type);
        json.push('"');
        Self::after_type(status, json, title)
    }

    /// Completes a document whose `json` ends with its type: the title and the status.
    fn after_type(status: StatusCode, mut json: String, title: &str) -> Self {
        json.push_str(",\"title\":");
        push_json_string(&mut json, title);
        json.push_str(",\"status\":");
        push_u64(&mut json, u64::from(status.as_u16()));
        Self { status, json }
    }

    /// Adds `detail`: an explanation specific to this occurrence.
    #[must_use]
    pub fn detail(self, detail: &str) -> Self {
        self.member_str("detail", detail)
    }

    /// Adds a string member.
    #[must_use]
    pub fn member_str(mut self, name: &str, value: &str) -> Self {
        self.push_name(name);
        push_json_string(&mut self.json, value);
        self
    }

    /// Adds an integer member.
    #[must_use]
    pub fn member_u64(mut self, name: &str, value: u64) -> Self {
        self.push_name(name);
        push_u64(&mut self.json, value);
        self
    }

    /// Appends a member whose separator, name and colon are `lead` (`,"name":`), written as
    /// is: for the default rejection's own member names, which need no escaping.
    #[must_use]
    pub(crate) fn lead_u64(mut self, lead: &'static str, value: u64) -> Self {
        self.json.push_str(lead);
        push_u64(&mut self.json, value);
        self
    }

    /// [`lead_u64`](Self::lead_u64) for a string value (escaped).
    #[must_use]
    pub(crate) fn lead_str(mut self, lead: &'static str, value: &str) -> Self {
        self.json.push_str(lead);
        push_json_string(&mut self.json, value);
        self
    }

    /// [`lead_u64`](Self::lead_u64) for a value in parts, quoted.
    #[must_use]
    pub(crate) fn lead_parts(mut self, lead: &'static str, parts: &[Part<'_>]) -> Self {
        self.json.push_str(lead);
        self.json.push('"');
        push_parts(&mut self.json, parts);
        self.json.push('"');
        self
    }

    /// The status this problem is sent with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The JSON document.
    pub fn to_json(&self) -> String {
        let mut json = self.json.clone();
        json.push('}');
        json
    }

    /// A response with this problem's status, `Content-Type: application/problem+json` and the
    /// document as its body.
    pub fn into_response(mut self) -> Response<RejectionBody> {
        self.json.push('}');
        // A boxed slice (shrunk in place) becomes `Bytes` as is; a `String` with spare capacity
        // would take one more allocation for a reference count.
        let body = bytes::Bytes::from(self.json.into_bytes().into_boxed_slice());
        let mut response = Response::new(RejectionBody::from(body));
        *response.status_mut() = self.status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, APPLICATION_PROBLEM_JSON);
        response
    }

    fn push_name(&mut self, name: &str) {
        self.json.push(',');
        push_json_string(&mut self.json, name);
        self.json.push(':');
    }
}

/// Appends `n` in decimal.
fn push_u64(out: &mut String, n: u64) {
    if let Some(digits) = crate::headers::small_number_str(n) {
        out.push_str(digits);
        return;
    }
    let mut buf = [0u8; 20];
    // Only ASCII digits were written.
    out.push_str(std::str::from_utf8(crate::headers::decimal(n, &mut buf)).unwrap_or("0"));
}

/// Appends what `args` writes as one JSON string literal, escaped as [`push_json_string`] does.
fn push_json_fmt(out: &mut String, args: fmt::Arguments<'_>) {
    out.push('"');
    match args.as_str() {
        Some(s) => push_json_chars(out, s),
        None => push_json_display(out, &args),
    }
    out.push('"');
}

/// Appends what `value` displays as, escaped (without quotes). Written as is, then escaped in
/// place only if it needs it (numbers and quotas never do): one formatting pass, one scan.
fn push_json_display(out: &mut String, value: &dyn fmt::Display) {
    let start = out.len();
    let _ = write!(out, "{value}");
    if any_needs_escape(&out.as_bytes()[start..]) {
        let raw = out.split_off(start);
        push_json_chars(out, &raw);
    }
}

/// A piece of a JSON string member written by [`ProblemDetails::lead_parts`] (or of a type).
#[derive(Clone, Copy)]
pub(crate) enum Part<'a> {
    /// Text already escaped for JSON (a literal of the caller's), copied as is.
    Escaped(&'static str),
    /// Any text, escaped.
    Text(&'a str),
    /// A number in decimal.
    U64(u64),
}

/// Appends `parts` (without quotes).
fn push_parts(out: &mut String, parts: &[Part<'_>]) {
    for part in parts {
        match *part {
            Part::Escaped(s) => out.push_str(s),
            Part::Text(s) => push_json_chars(out, s),
            Part::U64(n) => push_u64(out, n),
        }
    }
}

/// Whether any byte of `s` must be escaped in a JSON string: eight bytes at a time (every member
/// name and string value of a document is scanned, most of them a dozen bytes or more).
fn any_needs_escape(s: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    // Whether a byte of `x` is zero (exact as a yes/no answer), or below 0x20.
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH != 0;
    let below_space = |x: u64| x.wrapping_sub(ONES * 0x20) & !x & HIGH != 0;
    let mut chunks = s.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_ne_bytes(word);
        if below_space(x)
            || zero(x ^ (ONES * u64::from(b'"')))
            || zero(x ^ (ONES * u64::from(b'\\')))
        {
            return true;
        }
    }
    chunks.remainder().iter().any(|&b| needs_escape(b))
}

/// Whether `b` must be escaped in a JSON string.
#[inline]
fn needs_escape(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// Appends `s` as a JSON string literal (RFC 8259): quotes, backslashes and control characters
/// escaped, everything else (including non-ASCII) copied as UTF-8.
pub(crate) fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    push_json_chars(out, s);
    out.push('"');
}

/// The inside of [`push_json_string`]: `s` escaped, without the quotes.
fn push_json_chars(out: &mut String, s: &str) {
    // The common case, nothing to escape: one copy.
    if !any_needs_escape(s.as_bytes()) {
        out.push_str(s);
        return;
    }
    // Every byte to escape is ASCII, so splitting at them keeps UTF-8 sequences whole: copy the
    // runs between them, one `push_str` each.
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escaped = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            b if b < 0x20 => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escaped.is_empty() {
            let _ = write!(out, "\\u{:04x}", b);
        } else {
            out.push_str(escaped);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> String {
        let mut out = String::new();
        push_json_string(&mut out, s);
        out
    }

    #[test]
    fn escapes_per_rfc_8259() {
        assert_eq!(json("plain"), r#""plain""#);
        assert_eq!(json(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(json("l1\nl2\r\t\u{8}\u{c}"), r#""l1\nl2\r\t\b\f""#);
        assert_eq!(json("\u{0}\u{1f}"), r#""\u0000\u001f""#);
        assert_eq!(json("café ✓"), "\"café ✓\"");
    }

    #[test]
    fn escape_scan_finds_every_byte_to_escape_at_every_position() {
        for len in 0..20 {
            assert!(!any_needs_escape(&vec![b'a'; len]));
            assert!(!any_needs_escape(&vec![0x7f; len]));
            assert!(!any_needs_escape(&vec![0xff; len]));
            assert!(!any_needs_escape(&vec![b' '; len]));
            for at in 0..len {
                for b in (0u8..=255).filter(|&b| needs_escape(b)) {
                    let mut s = vec![b'x'; len];
                    s[at] = b;
                    assert!(any_needs_escape(&s), "{b:#x} at {at} of {len}");
                }
                for b in (0u8..=255).filter(|&b| !needs_escape(b)) {
                    let mut s = vec![b'#'; len];
                    s[at] = b;
                    assert!(!any_needs_escape(&s), "{b:#x} at {at} of {len}");
                }
            }
        }
    }

    #[test]
    fn numbers_are_their_decimal_form() {
        for n in (0..10_100).chain([u64::MAX, 1_700_000_000]) {
            let mut s = String::new();
            push_u64(&mut s, n);
            assert_eq!(s, n.to_string());
        }
    }

    #[test]
    fn round_trips_through_a_real_parser() {
        let nasty = "\"quoted\" \\ back \u{1} ctrl \u{7f} del é \u{2028}";
        let problem = ProblemDetails::new(StatusCode::TOO_MANY_REQUESTS, "urn:x", "T")
            .detail(nasty)
            .member_str("policy", "we\"ird")
            .member_u64("limit", u64::MAX);
        let v: serde_json::Value = serde_json::from_str(&problem.to_json()).unwrap();
        assert_eq!(v["detail"], nasty);
        assert_eq!(v["policy"], "we\"ird");
        assert_eq!(v["limit"], u64::MAX);
        assert_eq!(v["status"], 429);
        assert_eq!(v["type"], "urn:x");
    }
}
