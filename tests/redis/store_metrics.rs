//! The stores' metrics through real stores: keys held by the in-memory store, and the Redis
//! store's latency, errors by kind and circuit-breaker state against a real `redis-server` that is
//! killed and restarted. Recorded into a recorder that logs every event, installed for the test's
//! thread (current-thread runtime: the store's tasks run on it too).
#![cfg(all(feature = "metrics", feature = "redis"))]

use std::sync::{Arc, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::Quota;

use crate::harness::redis_server::RedisServer;
use crate::harness::stores;

/// What happened to one metric.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Increment(u64),
    Set(f64),
    Record(f64),
}

/// A recorder that logs every event as `name{k=v,...}` (labels sorted), so tests read totals,
/// a gauge's history and every histogram sample, without a snapshot resetting anything.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(String, Event)>>>);

struct Handle {
    key: String,
    log: Log,
}

impl Handle {
    fn push(&self, event: Event) {
        self.log.0.lock().unwrap().push((self.key.clone(), event));
    }
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.push(Event::Increment(value));
    }
    fn absolute(&self, _: u64) {
        unreachable!("tollgate never sets a counter");
    }
}

impl GaugeFn for Handle {
    fn increment(&self, _: f64) {
        unreachable!("tollgate sets gauges");
    }
    fn decrement(&self, _: f64) {
        unreachable!("tollgate sets gauges");
    }
    fn set(&self, value: f64) {
        self.push(Event::Set(value));
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.push(Event::Record(value));
    }
}

impl Log {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        Arc::new(Handle {
            key: format!("{}{{{}}}", key.name(), labels.join(",")),
            log: self.clone(),
        })
    }

    fn events(&self, key: &str) -> Vec<Event> {
        let log = self.0.lock().unwrap();
        log.iter()
            .filter(|(k, _)| k == key)
            .map(|(_, e)| e.clone())
            .collect()
    }

    fn counter(&self, key: &str) -> u64 {
        self.events(key)
            .iter()
            .map(|e| match e {
                Event::Increment(n) => *n,
                other => panic!("{key}: {other:?}"),
            })
            .sum()
    }

    /// Every value the gauge was set to, in order.
    fn gauge(&self, key: &str) -> Vec<f64> {
        self.events(key)
            .iter()
            .map(|e| match e {
                Event::Set(v) => *v,
                other => panic!("{key}: {other:?}"),
            })
            .collect()
    }

    fn samples(&self, key: &str) -> Vec<f64> {
        self.events(key)
            .iter()
            .map(|e| match e {
                Event::Record(v) => *v,
                other => panic!("{key}: {other:?}"),
            })
            .collect()
    }
}

impl Recorder for Log {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn memory_store_reports_keys_held_per_limit() {
    let log = Log::default();
    let _local = metrics::set_default_local_recorder(&log);
    let clock = ManualClock::new();
    let store = stores::memory_store(
        &clock,
        &[stores::spec(
            "metrics-keys",
            Quota::per_minute(10),
            AlgorithmKind::TokenBucket,
        )],
    );
    let key = "tollgate_keys{limit=metrics-keys}";
    for i in 0..25 {
        let d = stores::one(&store, &format!("client-{i}"), 1)
            .await
            .unwrap();
        assert!(d.allowed());
    }
    let grown: Vec<f64> = (1..=25).map(f64::from).collect();
    assert_eq!(log.gauge(key), grown, "set once per new key");
    // Keys already held do not grow the table.
    for i in 0..25 {
        stores::one(&store, &format!("client-{i}"), 1)
            .await
            .unwrap();
    }
    // A check that charges nothing stores nothing.
    stores::one(&store, "free-rider", 0).await.unwrap();
    assert_eq!(log.gauge(key), grown);
    // One in-memory check in 64 on this thread was timed: 51 checks, 1 sample (the thread's
    // first check is sampled).
    let timed = log.samples("tollgate_store_seconds{store=memory}");
    assert_eq!(timed.len(), 1, "{timed:?}");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "current_thread")]
async fn redis_store_reports_latency_errors_and_breaker_state() {
    use std::time::{Duration, Instant};

    use tollgate::store::redis::RedisBackend;
    use tollgate::store::{Backend, FailurePolicy, LimitSpec};
    use tollgate::Name;

    let log = Log::default();
    let _local = metrics::set_default_local_recorder(&log);
    let mut server = RedisServer::start();
    let spec = LimitSpec::new(
        Name::new("metrics-redis"),
        Quota::per_second(100),
        AlgorithmKind::TokenBucket,
    )
    .on_store_error(FailurePolicy::Open);
    let store = RedisBackend::new(server.url())
        .prefix(stores::prefix("metrics"))
        .timeout(Duration::from_millis(200))
        .breaker_threshold(3)
        .probe_interval(Duration::from_millis(20))
        .build(&[spec])
        .unwrap();

    for _ in 0..5 {
        assert!(stores::one(&store, "k", 1).await.unwrap().allowed());
    }
    let latency = log.samples("tollgate_store_seconds{store=redis}");
    assert_eq!(latency.len(), 5, "one sample per round trip");
    assert!(latency.iter().all(|&s| s > 0.0 && s < 5.0), "{latency:?}");
    let breaker = "tollgate_breaker_open{node=default}";
    assert!(log.gauge(breaker).is_empty());

    // Redis dies: calls fail (counted by kind), and the third opens the breaker.
    server.kill();
    for _ in 0..3 {
        // Failing open: still allowed.
        assert!(stores::one(&store, "k", 1).await.unwrap().allowed());
    }
    let errors = |kind: &str| log.counter(&format!("tollgate_store_errors_total{{kind={kind}}}"));
    let failed: u64 = ["timeout", "unavailable", "other", "invalid_response"]
        .iter()
        .map(|k| errors(k))
        .sum();
    assert_eq!(failed, 3);
    assert_eq!(log.gauge(breaker), [1.0]);
    assert_eq!(
        log.samples("tollgate_store_seconds{store=redis}").len(),
        8,
        "failed round trips are timed too"
    );
    // While open, calls are not sent: they count as unavailable, and no round trip is timed.
    let before = errors("unavailable");
    stores::one(&store, "k", 1).await.unwrap();
    assert_eq!(errors("unavailable"), before + 1);
    assert_eq!(log.samples("tollgate_store_seconds{store=redis}").len(), 8);

    // Redis is back: the probe closes the breaker.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while log.gauge(breaker) != [1.0, 0.0] {
        assert!(Instant::now() < deadline, "{:?}", log.gauge(breaker));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(stores::one(&store, "k", 1).await.unwrap().allowed());
    assert_eq!(log.samples("tollgate_store_seconds{store=redis}").len(), 9);
}
