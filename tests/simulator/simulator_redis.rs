//! `simulate --store redis`: the same streams through a real `redis-server` (started by the
//! test on a free loopback port) decide exactly as the memory store does, for all six
//! algorithms, on every scenario.

use crate::sim::engine::{decide_memory, parse_replay, Scenario, SECOND};
use crate::sim::redis_store::{decide_redis, differences};
use tollgate::Quota;

use crate::harness::redis_server::RedisServer;

#[tokio::test]
async fn redis_decides_every_scenario_exactly_as_memory() {
    let server = RedisServer::start();
    let url = server.url();
    let replay = parse_replay(
        "0 a\n0.5 b\n1 a 4\n9.9 a\n10 a\n10.1 b 3\n19.95 a\n20 a\n20 b 25\n",
        10 * SECOND,
    )
    .unwrap();
    for limit in ["5/10s", "10/s burst 20"] {
        let quota: Quota = limit.parse().unwrap();
        let mut streams = vec![("replay".to_owned(), replay.clone())];
        for scenario in [
            Scenario::Edge,
            Scenario::Burst,
            Scenario::SeamAttack,
            Scenario::Steady {
                windows: 4,
                seed: 3,
                rate: None,
            },
        ] {
            streams.push((scenario.name().to_owned(), scenario.stream(&quota).unwrap()));
        }
        for (name, stream) in streams {
            let memory = decide_memory(&stream, &quota).unwrap();
            let redis = decide_redis(&stream, &quota, &url).await.unwrap();
            assert_eq!(redis.len(), 6);
            assert_eq!(
                differences(&memory, &redis),
                vec![0; 6],
                "{name} at {limit}"
            );
            // Not vacuous: the stream is decided both ways.
            assert!(
                memory.iter().any(|d| d.contains(&false)),
                "{name} at {limit}"
            );
        }
    }
}

#[tokio::test]
async fn an_unreachable_redis_is_a_clear_error() {
    let quota = Quota::per_second(5);
    let stream = Scenario::Edge.stream(&quota).unwrap();
    // A port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = decide_redis(&stream, &quota, &format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(err.contains("failed"), "{err}");
    let err = decide_redis(&stream, &quota, "not a url")
        .await
        .unwrap_err();
    assert!(err.contains("REDIS_URL"), "{err}");
}
