//! `--store redis`: the same stream through `RedisBackend`, at the same (injected) times, so
//! the decisions can be compared with the memory store's one by one.

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{redis::RedisBackend, Backend, Checked, FailurePolicy, LimitCheck, Store};
use tollgate::Quota;

use super::engine::{specs, Stream};

/// Every algorithm's decisions on `stream` through Redis at `url`, in `AlgorithmKind::ALL`
/// order. Keys live under a fresh prefix, so earlier runs never interfere.
pub async fn decide_redis(
    stream: &Stream,
    quota: &Quota,
    url: &str,
) -> Result<Vec<Vec<bool>>, String> {
    let clock = ManualClock::new();
    let specs: Vec<_> = specs(quota)
        .into_iter()
        .map(|s| {
            s.on_store_error(FailurePolicy::Closed {
                retry_after: Duration::from_secs(1),
            })
        })
        .collect();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let store = RedisBackend::new(url)
        .prefix(format!("tollgate-simulate-{}-{nanos}", std::process::id()))
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .build(&specs)
        .map_err(|e| format!("REDIS_URL {url:?}: {e}"))?;
    let keys: Vec<Key<'_>> = stream
        .keys
        .iter()
        .map(|k| Key::string(k.as_str()))
        .collect();
    let mut out = vec![Vec::with_capacity(stream.requests.len()); specs.len()];
    for r in &stream.requests {
        clock.set_micros(r.at);
        for (limit, decisions) in out.iter_mut().enumerate() {
            let checks = [LimitCheck::new(limit, keys[r.key].clone(), r.cost)];
            let result = match store.check(&checks) {
                Checked::Ready(r) => r,
                Checked::Pending(f) => f.await,
            };
            let d = result.map_err(|e| format!("Redis at {url:?} failed: {e}"))?;
            decisions.push(d.allowed());
        }
    }
    Ok(out)
}

/// How many decisions of `redis` differ from `memory`, per algorithm.
pub fn differences(memory: &[Vec<bool>], redis: &[Vec<bool>]) -> Vec<usize> {
    memory
        .iter()
        .zip(redis)
        .map(|(m, r)| m.iter().zip(r).filter(|(a, b)| a != b).count() + m.len().abs_diff(r.len()))
        .collect()
}
