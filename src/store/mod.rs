//! Where limiter state lives: the [`Backend`] / [`Store`] traits and their implementations.
//!
//! A [`Backend`] is configuration (`MemoryBackend::new().max_keys(100_000)`); the layer builder
//! calls [`Backend::build`] once with every limit it holds and gets a [`Store`]. Per request, the
//! service calls [`Store::check`] with one [`LimitCheck`] per applicable limit and gets one
//! [`Decision`](crate::Decision) per check, all-or-nothing: if any limit rejects, none is charged.

mod backend;
#[cfg(feature = "redis")]
pub mod hybrid;
mod limit;
pub mod memory;
mod plan_quota;
#[cfg(feature = "redis")]
pub mod redis;

pub use backend::{Backend, Checked, Store};
pub use limit::{FailurePolicy, LimitCheck, LimitSpec};

pub(crate) use plan_quota::QuotaPin;
#[doc(hidden)]
pub use plan_quota::{kept_quotas, with_quota_registry_locked};
pub use plan_quota::{PlanQuota, KEPT_QUOTAS};

pub(crate) use crate::decision::Decisions;
pub use crate::decision::MAX_LIMITS;
