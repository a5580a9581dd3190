//! A local tier in front of Redis (feature `redis`): most decisions never leave the process.
//! (Module docs: see the end of this work; filled in below.)

mod backend;
mod plan;
mod stats;
mod store;
mod table;

pub use backend::{HybridBackend, DEFAULT_MAX_KEYS, DEFAULT_MAX_LEASE, MAX_KEYS};
pub use plan::MAX_LEASE_TTL_MICROS;
pub use stats::HybridStats;
pub use store::{HybridFuture, HybridStore};
