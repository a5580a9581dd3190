//! Regression tests for the promises an attack pass broke: each module holds the tests of one
//! feature's promises, each test drives the feature from outside (real `redis-server` processes
//! on free loopback ports, real HTTP servers on 127.0.0.1, tokio's paused clock) and asserts the
//! bound the docs state, in numbers.
//!
//! `cargo test --all-features --test promises -- --nocapture` prints the figures.

#[path = "../harness/mod.rs"]
mod harness;

mod budget_across_changes;
mod cluster_dead_master;
mod concurrency_limits;
mod hybrid_data_loss;
mod outbound_waits;
mod reload_memory;
mod shadow_and_fallback;
mod shaping_cancellation;
