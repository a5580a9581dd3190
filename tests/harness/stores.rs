//! Helpers shared by the Redis tests: building stores and deciding through the `Store` trait.
#![allow(dead_code)]

use std::time::Duration;

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{
    memory::MemoryBackend, memory::MemoryStore, Backend, Checked, FailurePolicy, LimitCheck,
    LimitSpec, Store,
};
use tollgate::{Decision, Decisions, Name, Quota, StoreError};

/// Awaits a check, ready or pending.
pub async fn decide<S: Store>(
    store: &S,
    checks: &[LimitCheck<'_>],
) -> Result<Decisions, StoreError> {
    match store.check(checks) {
        Checked::Ready(r) => r,
        Checked::Pending(f) => f.await,
    }
}

/// One limit, one key.
pub async fn one<S: Store>(store: &S, key: &str, cost: u64) -> Result<Decision, StoreError> {
    let checks = [LimitCheck::new(0, Key::string(key.to_owned()), cost)];
    decide(store, &checks).await.map(|d| d.as_slice()[0])
}

pub fn spec(name: &str, quota: Quota, algorithm: AlgorithmKind) -> LimitSpec {
    LimitSpec::new(Name::new(name), quota, algorithm).on_store_error(FailurePolicy::Closed {
        retry_after: Duration::from_secs(1),
    })
}

/// A unique prefix per call, so tests sharing a server never share keys.
pub fn prefix(test: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t-{test}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// A node store on `url` with an explicit clock and a generous timeout (correctness tests must
/// not fall back to a failure policy because the machine is busy).
pub fn node_store(url: &str, test: &str, clock: &ManualClock, limits: &[LimitSpec]) -> RedisStore {
    RedisBackend::new(url)
        .prefix(prefix(test))
        .clock(clock.clone())
        .timeout(Duration::from_secs(3))
        .build(limits)
        .expect("build the redis store")
}

pub fn cluster_store(
    urls: &[String],
    test: &str,
    clock: &ManualClock,
    limits: &[LimitSpec],
) -> RedisStore {
    RedisBackend::cluster(urls.iter().cloned())
        .prefix(prefix(test))
        .clock(clock.clone())
        .timeout(Duration::from_secs(3))
        .build(limits)
        .expect("build the cluster store")
}

pub fn memory_store(clock: &ManualClock, limits: &[LimitSpec]) -> MemoryStore<ManualClock> {
    MemoryBackend::new()
        .clock(clock.clone())
        .build(limits)
        .expect("build the memory store")
}
