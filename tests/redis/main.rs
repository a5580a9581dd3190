//! The Redis store against real `redis-server` processes: key hygiene, batched reads, TTLs,
//! failures (killed, paused, restarted), many instances sharing one server, the hybrid store and
//! the stores' metrics. Needs the `redis` feature (Cargo.toml).

#[path = "../harness/mod.rs"]
mod harness;

mod hybrid;
mod redis_batched_reads;
mod redis_distributed;
mod redis_expiry;
mod redis_failures;
mod redis_keys;
mod redis_secure;
mod redis_sentinel;
mod store_metrics;
