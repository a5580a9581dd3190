//! Error types: [`ConfigError`] at build time, [`StoreError`] at run time.

use std::fmt;
use std::time::Duration;

/// An invalid configuration, reported when a quota is parsed or a layer is built.
///
/// The message names the field at fault and says how to fix it, so a bad limit fails at start-up
/// instead of surfacing later as a wrong limit in production.
///
/// ```
/// use tollgate::Quota;
///
/// let err = "0/min".parse::<Quota>().unwrap_err();
/// assert!(err.to_string().contains("count"), "{err}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    message: String,
}

impl ConfigError {
    /// Creates an error about `field`, with a message that says what to fix.
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }

    /// The configuration field at fault, e.g. `"quota.burst"`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// What is wrong and how to fix it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid rate-limit configuration: {}: {}",
            self.field, self.message
        )
    }
}

impl std::error::Error for ConfigError {}

/// A backend could not decide (Redis unreachable, timed out, answered garbage).
///
/// The limit's failure policy turns this into a response: fail open, fail closed with `503`, or a
/// local fallback limiter. It is never surfaced as the inner service's error.
#[derive(Debug, Clone)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    retry_after: Option<Duration>,
}

/// What kind of failure a [`StoreError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend did not answer within the configured timeout.
    Timeout,
    /// The backend could not be reached, or the circuit breaker is open.
    Unavailable,
    /// The backend answered something that is not a valid decision (corrupted state, wrong type).
    InvalidResponse,
    /// Any other backend error.
    Other,
}

impl StoreError {
    /// Creates an error of `kind` with a human-readable message.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// Suggests how long a client should wait (sent as `Retry-After` on a fail-closed `503`).
    #[must_use]
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The suggested wait, if the backend gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for StoreError {
    /// `rate-limit store <kind>: <message>`, each said once:
    /// `rate-limit store unavailable: redis: Connection refused (os error 111)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate-limit store {}: {}", self.kind, self.message)
    }
}

impl fmt::Display for StoreErrorKind {
    /// What happened, in words: `timed out`, `unavailable`, `answered an invalid response`,
    /// `failed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreErrorKind::Timeout => "timed out",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::InvalidResponse => "answered an invalid response",
            StoreErrorKind::Other => "failed",
        })
    }
}

impl std::error::Error for StoreError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_error_says_each_thing_once() {
        let err = StoreError::new(StoreErrorKind::Unavailable, "redis: Connection refused");
        assert_eq!(
            err.to_string(),
            "rate-limit store unavailable: redis: Connection refused"
        );
        let err = StoreError::new(StoreErrorKind::Timeout, "redis did not answer within 5ms");
        assert_eq!(
            err.to_string(),
            "rate-limit store timed out: redis did not answer within 5ms"
        );
        // A suggested wait changes what clients are told, not the text.
        let later = err.clone().with_retry_after(Duration::from_secs(1));
        assert_eq!(later.to_string(), err.to_string());
    }
}
