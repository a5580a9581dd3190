#![cfg(feature = "redis")]
mod support;

use std::time::Duration;

use tollgate::algorithm::{Algorithm, AlgorithmKind, TokenBucket};
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::redis::RedisBackend;
use tollgate::store::{Backend, Checked, FailurePolicy, LimitCheck, LimitSpec, Store};
use tollgate::{PolicyName, Quota};

async fn check<S: Store>(store: &S, key: &str, cost: u64) -> tollgate::Decision {
    let checks = [LimitCheck {
        limit: 0,
        key: Key::string(key.to_owned()),
        cost,
    }];
    let r = match store.check(&checks) {
        Checked::Ready(r) => r,
        Checked::Pending(f) => f.await,
    };
    r.expect("decided").as_slice()[0]
}

#[tokio::test]
async fn token_bucket_matches_the_rust_transition() {
    let server = support::RedisServer::start();
    let quota = Quota::per_second(10).burst(20);
    let spec = LimitSpec::new(PolicyName::new("burst"), quota, AlgorithmKind::TokenBucket)
        .on_store_error(FailurePolicy::Closed {
            retry_after: Duration::from_secs(1),
        });
    let clock = ManualClock::new();
    let store = RedisBackend::new(server.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .build(&[spec])
        .unwrap();
    let bucket = TokenBucket::new(quota).unwrap();
    let mut state = Default::default();
    let mut t = 0u64;
    let mut x = 12345u64;
    for i in 0..400 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t += x % 120_000;
        let cost = x % 4;
        clock.set_micros(t);
        let got = check(&store, "alice", cost).await;
        let want = bucket
            .check(&mut state, t, cost)
            .with_policy(PolicyName::new("burst"));
        assert_eq!(got, want, "step {i} at {t}µs cost {cost}");
    }
}
