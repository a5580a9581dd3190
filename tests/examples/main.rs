//! The examples' contracts, as a user tries them: `examples/plans` and `examples/outbound.rs`
//! through their own code, `examples/shed.rs` built and run as a process under open-loop load,
//! and, with the `redis` feature, `examples/hybrid.rs` built and run as four processes sharing
//! one `redis-server`.

#[path = "../harness/mod.rs"]
mod harness;

#[cfg(feature = "redis")]
mod hybrid_example;
mod outbound_example;
mod plans_example;
mod shed_example;
