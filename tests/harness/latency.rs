//! Latency figures of load tests.

use std::time::Duration;

/// The `q`-quantile (0 to 1) of `latencies`, nearest rank below; zero when there are none.
pub fn quantile(latencies: &[Duration], q: f64) -> Duration {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    let at = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(at).copied().unwrap_or_default()
}
