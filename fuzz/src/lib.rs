//! Fuzz targets for tollgate (`cargo +nightly fuzz run <target>`; see `fuzz/README.md`).
//!
//! Each module holds one target's checks as a plain function, so the same checks also run in
//! the normal test suite (`tests/fuzz_seeds.rs` replays `fuzz/seeds/` and random inputs through
//! them without nightly).

pub mod forwarding;
pub mod input;
pub mod quota_text;
pub mod redis_key;
#[cfg(fuzzing)]
pub mod redis_reply;
pub mod redis_state;
pub mod server;
