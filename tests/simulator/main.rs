//! The simulator (`examples/simulate`): the algorithms' documented bounds measured by its core,
//! its lab page in a browser, and, with the `redis` feature, a real `redis-server` deciding every
//! scenario as the memory store does.

#[path = "../harness/mod.rs"]
mod harness;

// The simulator's modules, from the example (each test file uses some of them).
#[allow(dead_code)]
#[path = "../../examples/simulate"]
mod sim {
    pub mod engine;
    pub mod lab;
    #[cfg(feature = "redis")]
    pub mod redis_store;
    pub mod run;
    pub mod svg;
}

mod simulator_bounds;
mod simulator_lab;
#[cfg(feature = "redis")]
mod simulator_redis;
