//! PLACEHOLDER: to be implemented.
use super::Algorithm;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::quota::Quota;

/// PLACEHOLDER.
#[derive(Debug, Clone, Copy)]
pub struct SlidingWindow {
    quota: Quota,
}
/// PLACEHOLDER.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlidingWindowState;
impl SlidingWindow {
    /// PLACEHOLDER.
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        quota.validate()?;
        Ok(Self { quota })
    }
}
impl Algorithm for SlidingWindow {
    type State = SlidingWindowState;
    fn quota(&self) -> &Quota {
        &self.quota
    }
    fn capacity(&self) -> u64 {
        todo!()
    }
    fn decide(&self, _: &Self::State, _: u64, _: u64) -> Decision {
        todo!()
    }
    fn apply(&self, _: &mut Self::State, _: u64, _: u64) {
        todo!()
    }
    fn refund(&self, _: &mut Self::State, _: u64, _: u64) {
        todo!()
    }
    fn idle_timeout_micros(&self) -> u64 {
        todo!()
    }
}
