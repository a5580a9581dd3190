//! `grpc-status-details-bin`: Google's error model (`google.rpc.Status` with `RetryInfo` and
//! `QuotaFailure` details) on gRPC rejections, with the `tonic` feature.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine as _;
use http::HeaderValue;
use tonic_types::{ErrorDetails, StatusExt};

use super::grpc::GrpcCode;
use crate::quota::Quota;

/// What a rejection tells a gRPC client beyond its status code and message.
#[derive(Debug, Default)]
pub(crate) struct StatusDetails<'a> {
    /// `google.rpc.RetryInfo.retry_delay` in whole seconds: the rejection's `Retry-After`
    /// (rounded up, never 0; see [`Rejected::retry_after_secs`](super::Rejected::retry_after_secs)).
    pub(crate) retry_after_secs: Option<u64>,
    /// `google.rpc.QuotaFailure`: the limit's name and its quota (never the client's key).
    pub(crate) quota: Option<(&'a str, &'a Quota)>,
    /// The limit's plan that refused, when known: named in the violation's description.
    pub(crate) plan: Option<&'a str>,
}

impl StatusDetails<'_> {
    /// The `grpc-status-details-bin` value: a `google.rpc.Status` with `code`, `message` and
    /// these details, protobuf-encoded by `tonic-types`, then base64 without padding as gRPC
    /// requires for `-bin` metadata. `None` when there is no detail to send.
    pub(crate) fn header_value(&self, code: GrpcCode, message: &str) -> Option<HeaderValue> {
        let mut details = ErrorDetails::new();
        if let Some(secs) = self.retry_after_secs {
            details.set_retry_info(Some(Duration::from_secs(secs.max(1))));
        }
        if let Some((name, quota)) = self.quota {
            let mut description = describe(quota);
            if let Some(plan) = self.plan {
                description.push_str(&format!(" (plan {plan})"));
            }
            details.add_quota_failure_violation(name, description);
        }
        if details.retry_info().is_none() && details.quota_failure().is_none() {
            return None;
        }
        let status =
            tonic::Status::with_error_details(tonic::Code::from(code as i32), message, details);
        HeaderValue::try_from(STANDARD_NO_PAD.encode(status.details())).ok()
    }
}

/// A quota in words, for `QuotaViolation.description`: `"1 per second, bursts of up to 5"`.
fn describe(quota: &Quota) -> String {
    let mut text = format!("{} per {}", quota.count(), period_words(quota.period()));
    if quota.has_explicit_burst() {
        text.push_str(&format!(", bursts of up to {}", quota.burst_size()));
    }
    text
}

/// `"second"`, `"15 minutes"`, `"250 milliseconds"`: the largest unit that divides `period`.
fn period_words(period: Duration) -> String {
    const UNITS: [(u128, &str); 6] = [
        (86_400_000_000_000, "day"),
        (3_600_000_000_000, "hour"),
        (60_000_000_000, "minute"),
        (1_000_000_000, "second"),
        (1_000_000, "millisecond"),
        (1_000, "microsecond"),
    ];
    let nanos = period.as_nanos();
    let (n, unit) = UNITS
        .iter()
        .find(|(u, _)| nanos.is_multiple_of(*u))
        .map_or((nanos, "nanosecond"), |&(u, name)| (nanos / u, name));
    match n {
        1 => unit.to_owned(),
        n => format!("{n} {unit}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(value: &HeaderValue) -> tonic::Status {
        let text = value.to_str().unwrap();
        assert!(
            !text.ends_with('='),
            "gRPC -bin values are unpadded: {text}"
        );
        let bytes = STANDARD_NO_PAD.decode(text).unwrap();
        // The bytes are a whole google.rpc.Status: tonic reads them back from the details.
        tonic::Status::with_details(tonic::Code::Unknown, "", bytes.into())
    }

    #[test]
    fn rate_limit_details_carry_retry_info_and_quota_failure() {
        let quota = Quota::per_second(1).burst(5);
        let details = StatusDetails {
            retry_after_secs: Some(1),
            quota: Some(("per-ip", &quota)),
            plan: None,
        };
        let value = details
            .header_value(GrpcCode::ResourceExhausted, "rate limit exhausted")
            .unwrap();
        let status = decode(&value);
        let parsed = status.get_error_details();
        let retry = parsed.retry_info().unwrap();
        assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)));
        let failure = parsed.quota_failure().unwrap();
        assert_eq!(failure.violations.len(), 1);
        assert_eq!(failure.violations[0].subject, "per-ip");
        assert_eq!(
            failure.violations[0].description,
            "1 per second, bursts of up to 5"
        );
    }

    #[test]
    fn a_known_plan_is_named_in_the_violation() {
        let quota = Quota::per_minute(5);
        let details = StatusDetails {
            retry_after_secs: Some(12),
            quota: Some(("api", &quota)),
            plan: Some("free"),
        };
        let value = details
            .header_value(GrpcCode::ResourceExhausted, "rate limit exhausted")
            .unwrap();
        let failure = decode(&value).get_details_quota_failure().unwrap();
        assert_eq!(failure.violations[0].subject, "api");
        assert_eq!(
            failure.violations[0].description,
            "5 per minute (plan free)"
        );
    }

    #[test]
    fn the_encoded_status_repeats_code_and_message() {
        use prost::Message as _;
        let details = StatusDetails {
            retry_after_secs: Some(3),
            quota: None,
            plan: None,
        };
        let value = details.header_value(GrpcCode::Unavailable, "down").unwrap();
        let bytes = STANDARD_NO_PAD.decode(value.as_bytes()).unwrap();
        let status = tonic_types::Status::decode(&bytes[..]).unwrap();
        assert_eq!(status.code, 14);
        assert_eq!(status.message, "down");
        assert_eq!(status.details.len(), 1);
        assert_eq!(
            status.details[0].type_url,
            "type.googleapis.com/google.rpc.RetryInfo"
        );
        let retry = decode(&value).get_details_retry_info().unwrap();
        assert_eq!(retry.retry_delay, Some(Duration::from_secs(3)));
    }

    #[test]
    fn retry_delay_is_never_zero() {
        let details = StatusDetails {
            retry_after_secs: Some(0),
            quota: None,
            plan: None,
        };
        let value = details.header_value(GrpcCode::Unavailable, "down").unwrap();
        let retry = decode(&value).get_details_retry_info().unwrap();
        assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)));
    }

    #[test]
    fn huge_delays_are_clamped_not_a_panic() {
        let details = StatusDetails {
            retry_after_secs: Some(u64::MAX),
            quota: None,
            plan: None,
        };
        let value = details.header_value(GrpcCode::Unavailable, "down").unwrap();
        let retry = decode(&value).get_details_retry_info().unwrap();
        assert!(retry.retry_delay.unwrap() >= Duration::from_secs(10_000 * 365 * 86_400));
    }

    #[test]
    fn no_details_no_header() {
        let none = StatusDetails::default();
        assert!(none.header_value(GrpcCode::Internal, "x").is_none());
    }

    #[test]
    fn quotas_in_words() {
        assert_eq!(describe(&Quota::per_second(10)), "10 per second");
        assert_eq!(describe(&Quota::per_hour(1)), "1 per hour");
        assert_eq!(
            describe(&Quota::per(Duration::from_secs(900), 5).burst(10)),
            "5 per 15 minutes, bursts of up to 10"
        );
        assert_eq!(
            describe(&Quota::per(Duration::from_millis(250), 2)),
            "2 per 250 milliseconds"
        );
        assert_eq!(describe(&Quota::per_day(7)), "7 per day");
    }
}
