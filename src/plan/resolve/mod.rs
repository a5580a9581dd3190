//! The resolvers of this folder: which of a limit's plans a request is counted at. Their docs
//! are [`crate::plan`]'s.

mod cached;
mod extension;
mod header;
mod map;
mod names;

pub use cached::CachedLookup;
pub use extension::{AssignedPlan, PlanFromExtension};
pub use header::PlanFromHeader;
pub use map::PlanMap;
