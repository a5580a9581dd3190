//! RFC 9457 `application/problem+json` bodies, written without serde.

use std::fmt::Write as _;

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
        let mut json = String::with_capacity(256);
        json.push_str("{\"type\":");
        push_json_string(&mut json, problem_type);
        json.push_str(",\"title\":");
        push_json_string(&mut json, title);
        let _ = write!(json, ",\"status\":{}", status.as_u16());
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
        let _ = write!(self.json, "{value}");
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
        let mut response = Response::new(RejectionBody::from(self.json));
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

/// Appends `s` as a JSON string literal (RFC 8259): quotes, backslashes and control characters
/// escaped, everything else (including non-ASCII) copied as UTF-8.
pub(crate) fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let escaped = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            '\u{08}' => "\\b",
            '\u{0c}' => "\\f",
            c if (c as u32) < 0x20 => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escaped.is_empty() {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push_str(escaped);
        }
        start = i + c.len_utf8();
    }
    out.push_str(&s[start..]);
    out.push('"');
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
