//! The rate-limiting algorithms on their own and through the stores: properties over random
//! streams, extreme states, plan changes between quotas, calendar-aligned windows (the memory
//! store and, with the `redis` feature, a real `redis-server` deciding alike).

#[path = "../harness/mod.rs"]
mod harness;

mod algorithm_extremes;
mod algorithm_properties;
mod calendar_windows;
mod plan_changes;
