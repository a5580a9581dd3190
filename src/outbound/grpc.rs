//! `google.rpc.RetryInfo` in `grpc-status-details-bin` (feature `tonic`): the wait a gRPC
//! server attached to its `RESOURCE_EXHAUSTED`, as tollgate's own gRPC rejections write it.

use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine as _;
use http::{HeaderMap, HeaderName};
use tonic_types::StatusExt;

use super::parse::MAX_SIGNALLED;

const GRPC_STATUS_DETAILS_BIN: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// The `RetryInfo.retry_delay` of a `grpc-status-details-bin` header (base64 with or without
/// padding, as gRPC allows), `None` when absent or malformed. Decoded here rather than with
/// `tonic::Status::from_header_map`, which panics on invalid base64.
pub(super) fn retry_info(headers: &HeaderMap) -> Option<Duration> {
    let value = headers
        .get(GRPC_STATUS_DETAILS_BIN)?
        .as_bytes()
        .trim_ascii();
    let bytes = STANDARD_NO_PAD
        .decode(value)
        .or_else(|_| STANDARD.decode(value))
        .ok()?;
    let status = tonic::Status::with_details(tonic::Code::ResourceExhausted, "", bytes.into());
    let delay = status.get_details_retry_info()?.retry_delay?;
    Some(delay.min(MAX_SIGNALLED))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use tonic_types::ErrorDetails;

    fn details(delay: Duration) -> HeaderValue {
        let mut d = ErrorDetails::new();
        d.set_retry_info(Some(delay));
        let status =
            tonic::Status::with_error_details(tonic::Code::ResourceExhausted, "slow down", d);
        HeaderValue::try_from(STANDARD_NO_PAD.encode(status.details())).unwrap()
    }

    #[test]
    fn reads_retry_info() {
        let mut headers = HeaderMap::new();
        headers.insert(
            GRPC_STATUS_DETAILS_BIN,
            details(Duration::from_millis(2500)),
        );
        assert_eq!(retry_info(&headers), Some(Duration::from_millis(2500)));
        // Padded base64 too.
        let mut d = ErrorDetails::new();
        d.set_retry_info(Some(Duration::from_secs(3)));
        let status = tonic::Status::with_error_details(tonic::Code::ResourceExhausted, "", d);
        headers.insert(
            GRPC_STATUS_DETAILS_BIN,
            HeaderValue::try_from(STANDARD.encode(status.details())).unwrap(),
        );
        assert_eq!(retry_info(&headers), Some(Duration::from_secs(3)));
    }

    #[test]
    fn garbage_is_none() {
        for bad in ["", "!!!!", "AAAA", "CAgSB2V4aGF1c3Q", "////////", "=="] {
            let mut headers = HeaderMap::new();
            headers.insert(GRPC_STATUS_DETAILS_BIN, HeaderValue::from_static(bad));
            assert_eq!(retry_info(&headers), None, "{bad:?}");
        }
    }
}
