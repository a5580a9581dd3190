//! `FAIL_MODE` for the Redis examples (`redis`, `hybrid`): what a limit does when Redis is
//! unreachable.

use std::time::Duration;

use tollgate::store::FailurePolicy;

/// `FAIL_MODE`: `open`, `closed` (the default) or `local`.
pub fn failure_policy() -> Result<(String, FailurePolicy), String> {
    let mode = std::env::var("FAIL_MODE").unwrap_or_else(|_| "closed".into());
    let policy = match mode.to_ascii_lowercase().as_str() {
        "open" => FailurePolicy::Open,
        "closed" => FailurePolicy::Closed {
            retry_after: Duration::from_secs(1),
        },
        "local" => FailurePolicy::Local { share: 0.5 },
        other => return Err(format!("FAIL_MODE={other:?}: use open, closed or local")),
    };
    Ok((mode, policy))
}
