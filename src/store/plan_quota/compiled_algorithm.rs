//! [`CompiledAlgorithm`]: one of the six algorithms, built for a quota.

use crate::algorithm::{FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow, TokenBucket};

/// One of the six algorithms, built for a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompiledAlgorithm {
    TokenBucket(TokenBucket),
    Gcra(Gcra),
    FixedWindow(FixedWindow),
    SlidingWindow(SlidingWindow),
    SlidingLog(SlidingLog),
    LeakyBucket(LeakyBucket),
}
