//! Adaptive mode: the rate an upstream announces, learned from its headers and kept to.
//!
//! - `RateLimit-Policy` items say it exactly: `q` units per `w` seconds, each one a limit.
//! - Otherwise `X-RateLimit-Limit` (or the draft `RateLimit` fields) gives the size `L`, and
//!   the window is estimated as the longest time to full restoration (`X-RateLimit-Reset`)
//!   seen so far, in whole seconds rounded down, at least one second: a bucket of 50 refilling 10/s reports resets up to 5 s,
//!   a `100/min` window up to 60 s. An estimate that is still short is too fast for a while;
//!   the pauses on `Remaining: 0` and on `429` cover that time.
//!
//! Each learned limit becomes a [`Gcra`] of `L` per window with a burst of half of `L`
//! (at least 1): the client never spends the upstream's whole burst, so the jitter between when
//! it sends and when the upstream counts cannot tip it over the edge.

use std::time::Duration;

use crate::algorithm::{Algorithm, Gcra, GcraState};
use crate::Quota;

use super::parse::UpstreamSignal;

/// At most this many learned limits per upstream (the tightest policies first).
const MAX_LEARNED: usize = 4;

/// One learned limit and its schedule.
#[derive(Debug, Clone)]
pub(crate) struct LearnedLimit {
    pub(crate) gcra: Gcra,
    pub(crate) state: GcraState,
}

/// The limits learned for one upstream.
#[derive(Debug, Default)]
pub(crate) struct Learned {
    pub(crate) limits: Vec<LearnedLimit>,
    /// Bumped whenever `limits` is rebuilt, so a reservation made under older limits is not
    /// refunded into newer ones.
    pub(crate) generation: u64,
    /// The longest reset seen, µs: the window estimate for `X-RateLimit-*`.
    window_estimate: u64,
}

impl Learned {
    /// The quotas learned so far.
    pub(crate) fn quotas(&self) -> Vec<Quota> {
        self.limits.iter().map(|l| *l.gcra.quota()).collect()
    }

    /// Learns from one response at clock time `now` (µs).
    pub(crate) fn observe(&mut self, signal: &UpstreamSignal, now: u64) {
        let mut quotas: Vec<Quota> = if signal.policies().is_empty() {
            let (Some(limit), Some(reset)) = (signal.limit(), signal.reset()) else {
                return;
            };
            if limit == 0 {
                return;
            }
            // Whole seconds, rounded down: a reset sent as Unix seconds is rounded up by the
            // sender, so a 1 s window reads as up to 2 s; rounding down keeps it at 1 s.
            self.window_estimate = self
                .window_estimate
                .max(reset.as_secs().saturating_mul(1_000_000));
            let window = Duration::from_micros(self.window_estimate.max(1_000_000));
            vec![learned_quota(limit, window)]
        } else {
            signal
                .policies()
                .iter()
                .map(|p| learned_quota(p.quota(), p.window()))
                .collect()
        };
        // Tightest sustained rate first: fewest units per second.
        quotas.sort_by(|a, b| {
            let ra = u128::from(a.count()) * b.period().as_micros();
            let rb = u128::from(b.count()) * a.period().as_micros();
            ra.cmp(&rb)
        });
        quotas.truncate(MAX_LEARNED);
        let same = quotas.len() == self.limits.len()
            && quotas
                .iter()
                .zip(&self.limits)
                .all(|(q, l)| q == l.gcra.quota());
        if same {
            return;
        }
        let old = std::mem::take(&mut self.limits);
        for quota in quotas {
            let Ok(gcra) = Gcra::new(quota) else { continue };
            // Keep what the previous estimate of the same limit had spent.
            let mut state = GcraState::default();
            if let Some(prev) = old.get(self.limits.len()) {
                state = prev.state;
                gcra.rebase(&prev.gcra, &mut state, now);
            }
            self.limits.push(LearnedLimit { gcra, state });
        }
        self.generation += 1;
        tracing::debug!(limits = ?self.quotas(), "outbound: learned upstream limits");
    }
}

/// `count` per `window`, with a burst of half of `count` (at least 1).
fn learned_quota(count: u64, window: Duration) -> Quota {
    Quota::per(window, count).burst((count / 2).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, StatusCode};

    fn signal(pairs: &[(&'static str, &str)]) -> UpstreamSignal {
        let mut headers = HeaderMap::new();
        for (k, v) in pairs {
            headers.insert(*k, v.parse().unwrap());
        }
        UpstreamSignal::from_headers(StatusCode::OK, &headers, 0)
    }

    #[test]
    fn policy_is_exact() {
        let mut l = Learned::default();
        l.observe(
            &signal(&[(
                "ratelimit-policy",
                r#""day";q=5000;w=86400, "burst";q=10;w=1"#,
            )]),
            0,
        );
        let quotas = l.quotas();
        assert_eq!(quotas.len(), 2);
        assert_eq!(
            (quotas[0].count(), quotas[0].period()),
            (5000, Duration::from_secs(86_400))
        );
        assert_eq!(
            (quotas[1].count(), quotas[1].period()),
            (10, Duration::from_secs(1))
        );
        assert_eq!(quotas[1].burst_size(), 5);
        let generation = l.generation;
        l.observe(
            &signal(&[(
                "ratelimit-policy",
                r#""burst";q=10;w=1, "day";q=5000;w=86400"#,
            )]),
            5,
        );
        assert_eq!(l.generation, generation, "the same limits are not rebuilt");
    }

    #[test]
    fn x_ratelimit_window_is_the_longest_reset() {
        let mut l = Learned::default();
        l.observe(
            &signal(&[("x-ratelimit-limit", "100"), ("x-ratelimit-reset", "20")]),
            0,
        );
        assert_eq!(l.quotas()[0].period(), Duration::from_secs(20));
        l.observe(
            &signal(&[("x-ratelimit-limit", "100"), ("x-ratelimit-reset", "60")]),
            0,
        );
        l.observe(
            &signal(&[("x-ratelimit-limit", "100"), ("x-ratelimit-reset", "5")]),
            0,
        );
        assert_eq!(l.quotas()[0].period(), Duration::from_secs(60));
        assert_eq!(l.quotas()[0].count(), 100);
        // A reset of zero (full) is a window of at least a second.
        let mut l = Learned::default();
        l.observe(
            &signal(&[("x-ratelimit-limit", "10"), ("x-ratelimit-reset", "0")]),
            0,
        );
        assert_eq!(l.quotas()[0].period(), Duration::from_secs(1));
        // A Unix-seconds reset 1.8 s away (a 1 s window rounded up by the sender) is 1 s.
        let mut l = Learned::default();
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-limit", "10".parse().unwrap());
        headers.insert("x-ratelimit-reset", "1700000002".parse().unwrap());
        let s = UpstreamSignal::from_headers(StatusCode::OK, &headers, 1_700_000_000_200_000);
        l.observe(&s, 0);
        assert_eq!(l.quotas()[0].period(), Duration::from_secs(1));
        // Nothing to learn from.
        let mut l = Learned::default();
        l.observe(
            &signal(&[("x-ratelimit-limit", "0"), ("x-ratelimit-reset", "1")]),
            0,
        );
        l.observe(&signal(&[("x-ratelimit-remaining", "3")]), 0);
        assert!(l.quotas().is_empty());
    }
}
