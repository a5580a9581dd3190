//! gRPC rejections: a trailers-only response with `grpc-status` and a percent-encoded
//! `grpc-message`.

use http::header::CONTENT_TYPE;
use http::{HeaderName, HeaderValue, Response, StatusCode};

use super::RejectionBody;

/// `grpc-status`: the gRPC status code of a trailers-only response.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`: the percent-encoded status message.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-retry-pushback-ms`: how long a client with a retry policy should wait, in milliseconds.
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// `grpc-status-details-bin`: a base64 (unpadded) protobuf `google.rpc.Status` carrying the
/// error details of Google's error model, sent on rejections with the `tonic` feature.
pub const GRPC_STATUS_DETAILS_BIN: HeaderName = HeaderName::from_static("grpc-status-details-bin");

const APPLICATION_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// gRPC status codes used by rejections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GrpcCode {
    /// 2: unknown error.
    Unknown = 2,
    /// 3: the client sent an invalid argument.
    InvalidArgument = 3,
    /// 7: the caller may not do this.
    PermissionDenied = 7,
    /// 8: a quota or rate limit is exhausted (what a rate-limit rejection sends).
    ResourceExhausted = 8,
    /// 13: internal server error.
    Internal = 13,
    /// 14: the service is temporarily unavailable.
    Unavailable = 14,
    /// 16: the request lacks valid credentials.
    Unauthenticated = 16,
}

impl GrpcCode {
    /// The code for an HTTP status a rejection would otherwise send: 429 and 413 are
    /// `RESOURCE_EXHAUSTED`, 503 `UNAVAILABLE`, 400 `INVALID_ARGUMENT`, 401 `UNAUTHENTICATED`,
    /// 403 `PERMISSION_DENIED`, other 5xx `INTERNAL`, anything else `UNKNOWN`.
    pub fn from_http(status: StatusCode) -> Self {
        match status.as_u16() {
            429 | 413 => GrpcCode::ResourceExhausted,
            503 => GrpcCode::Unavailable,
            400 => GrpcCode::InvalidArgument,
            401 => GrpcCode::Unauthenticated,
            403 => GrpcCode::PermissionDenied,
            500..=599 => GrpcCode::Internal,
            _ => GrpcCode::Unknown,
        }
    }

    /// The numeric code.
    pub fn as_u32(self) -> u32 {
        self as u32
    }
}

/// A gRPC trailers-only response: HTTP 200, `content-type: application/grpc`, `grpc-status` and
/// `grpc-message` (percent-encoded as the gRPC spec requires), and an empty body.
///
/// ```
/// use tollgate::response::{grpc_trailers_only, GrpcCode};
///
/// let res = grpc_trailers_only(GrpcCode::ResourceExhausted, "rate limit \"burst\" exceeded: 100%");
/// assert_eq!(res.status(), 200);
/// assert_eq!(res.headers()["grpc-status"], "8");
/// assert_eq!(res.headers()["grpc-message"], "rate limit \"burst\" exceeded: 100%25");
/// ```
pub fn grpc_trailers_only(code: GrpcCode, message: &str) -> Response<RejectionBody> {
    let mut response = Response::new(RejectionBody::empty());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, APPLICATION_GRPC);
    headers.insert(GRPC_STATUS, HeaderValue::from(code.as_u32()));
    if let Ok(v) = HeaderValue::try_from(percent_encode(message)) {
        headers.insert(GRPC_MESSAGE, v);
    }
    response
}

/// A gRPC trailers-only refusal that asks the client to come back after `retry_after`:
/// [`grpc_trailers_only`] with `grpc-retry-pushback-ms` and, with the `tonic` feature,
/// `grpc-status-details-bin` holding `google.rpc.RetryInfo` (whole seconds rounded up, never 0),
/// as [`DefaultRejection`](super::DefaultRejection) sends them.
pub(crate) fn grpc_retry_refusal(
    code: GrpcCode,
    message: &str,
    retry_after: std::time::Duration,
) -> Response<RejectionBody> {
    let mut response = grpc_trailers_only(code, message);
    #[cfg(feature = "tonic")]
    {
        let details = super::grpc_details::StatusDetails {
            retry_after_secs: Some(crate::decision::ceil_secs(retry_after)),
            ..Default::default()
        };
        if let Some(value) = details.header_value(code, message) {
            response
                .headers_mut()
                .insert(super::GRPC_STATUS_DETAILS_BIN, value);
        }
    }
    let millis = u64::try_from(retry_after.as_millis().max(1)).unwrap_or(u64::MAX);
    response
        .headers_mut()
        .insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(millis));
    response
}

/// Percent-encodes every byte outside `0x20..=0x7E`, and `%` itself (gRPC's `Percent-Encoded`).
fn percent_encode(message: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_follows_the_grpc_spec() {
        assert_eq!(percent_encode("plain text ~!"), "plain text ~!");
        assert_eq!(percent_encode("50%"), "50%25");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }

    #[test]
    fn maps_http_statuses() {
        assert_eq!(
            GrpcCode::from_http(StatusCode::TOO_MANY_REQUESTS),
            GrpcCode::ResourceExhausted
        );
        assert_eq!(
            GrpcCode::from_http(StatusCode::SERVICE_UNAVAILABLE),
            GrpcCode::Unavailable
        );
        assert_eq!(
            GrpcCode::from_http(StatusCode::INTERNAL_SERVER_ERROR),
            GrpcCode::Internal
        );
        assert_eq!(
            GrpcCode::from_http(StatusCode::UNAUTHORIZED),
            GrpcCode::Unauthenticated
        );
        assert_eq!(
            GrpcCode::from_http(StatusCode::IM_A_TEAPOT),
            GrpcCode::Unknown
        );
    }
}
