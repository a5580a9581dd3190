//! Redis Cluster and one semantics across backends: batching on a real 3-master cluster,
//! refunds, plans and a table of scenarios decided alike by the memory store, a Redis node and a
//! Cluster. Needs the `redis` feature (Cargo.toml).

#[path = "../harness/mod.rs"]
mod harness;

mod redis_cluster_batching;
mod redis_cluster_errors;
mod redis_cluster_redirects;
mod redis_plans;
mod redis_refunds;
mod redis_scenarios;
