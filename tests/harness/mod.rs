//! Helpers shared by the integration-test binaries, one file per thing they provide. Each
//! binary's `main.rs` includes this folder as its `harness` module.
//!
//! - `redis_server`: real `redis-server` processes on free loopback ports (`RedisServer`), to
//!   kill, pause and restart.
//! - `redis_cluster`: a 3-master Redis Cluster of them (`RedisCluster`).
//! - `cluster_failover`: a Cluster master SIGKILLed under load, measured (`Load`, `per_window`,
//!   `kill_a_master_under_load`).
//! - `redis_sentinel`: a primary, replicas and three Sentinels of them (`RedisSentinel`).
//! - `sentinel_failover`: a Sentinel-monitored primary SIGKILLed under load, measured
//!   (`kill_the_primary_under_load`).
//! - `stores`: building memory, node and cluster stores for a test, and deciding through the
//!   `Store` trait (`decide`, `one`, `spec`, `prefix`).
//! - `rng`: a deterministic pseudo-random stream (`Rng`).
//! - `example_process`: an example built and run as a process on a free port (`ExampleProcess`).
//! - `http_server`: serving an axum app on a free loopback port (`serve`, `serve_url`).
//! - `latency`: quantiles of the latencies a load test measured (`quantile`).
//! - `isolated`: running one test alone in a child process of its binary, for measurements
//!   (resident memory, process-wide counters) that other tests running alongside would move.
#![allow(dead_code)]

#[cfg(feature = "redis")]
pub mod cluster_failover;
pub mod example_process;
pub mod http_server;
pub mod isolated;
pub mod latency;
#[cfg(feature = "redis")]
pub mod redis_cluster;
#[cfg(feature = "redis")]
pub mod redis_sentinel;
#[cfg(feature = "redis")]
pub mod redis_server;
pub mod rng;
#[cfg(feature = "redis")]
pub mod sentinel_failover;
#[cfg(feature = "redis")]
pub mod stores;
