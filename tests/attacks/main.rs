//! The attack suites (HTTP, in-memory store, Redis store) and the fuzz targets' checks on their
//! seeds and random inputs.

#[path = "../harness/mod.rs"]
mod harness;

// The fuzz targets' shared input reader, at the crate root where the targets' modules
// (`fuzz/src/`, included by `fuzz_seeds`) find it, as in the fuzz crate.
#[allow(dead_code)]
#[path = "../../fuzz/src/input.rs"]
mod input;

mod attack_http;
mod attack_memory;
#[cfg(feature = "redis")]
mod attack_redis;
mod fuzz_seeds;
