//! Requests that wait rather than fail: shaping (a request waits for its turn) and the
//! concurrency limit (slots held until the response body ends), in memory and, with the `redis`
//! feature, shared through a real `redis-server`.

#[path = "../harness/mod.rs"]
mod harness;

mod concurrency;
#[cfg(feature = "redis")]
mod concurrency_redis;
mod load_shed;
mod shaping;
#[cfg(feature = "redis")]
mod shaping_redis;
