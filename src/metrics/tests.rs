use std::time::Duration;

use super::*;
use crate::decision::Name;

#[test]
fn near_limit_share_is_validated() {
    for bad in [-0.1, 1.01, f64::NAN, f64::INFINITY] {
        let err = NearLimit::new(bad).unwrap_err();
        assert_eq!(err.field(), "near_limit_share", "{bad}");
        assert!(err.message().contains("0.0 to 1.0"), "{err}");
    }
    assert_eq!(NearLimit::new(0.1).unwrap(), NearLimit::DEFAULT);
    assert_eq!(NearLimit::default(), NearLimit::DEFAULT);
}

#[test]
fn near_means_strictly_under_the_share() {
    let d = |remaining| Decision::allowed_with(100, remaining, Duration::from_secs(1));
    let tenth = NearLimit::DEFAULT;
    assert!(tenth.is_near(&d(9)));
    assert!(!tenth.is_near(&d(10)), "10 of 100 is not under 10%");
    assert!(tenth.is_near(&d(0)));
    let never = NearLimit::new(0.0).unwrap();
    assert!(!never.is_near(&d(0)));
    let always = NearLimit::new(1.0).unwrap();
    assert!(always.is_near(&d(99)) && !always.is_near(&d(100)));
    // No overflow at the extremes.
    let huge = Decision::allowed_with(u64::MAX, u64::MAX / 20, Duration::ZERO);
    assert!(tenth.is_near(&huge));
}

#[cfg(feature = "metrics")]
mod recorded {
    use std::collections::BTreeMap;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    use super::*;

    /// Every metric as `name{k=v,...}` (labels sorted) → value.
    fn snapshot(s: &Snapshotter) -> BTreeMap<String, DebugValue> {
        s.snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let mut labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                (format!("{}{{{}}}", key.name(), labels.join(",")), value)
            })
            .collect()
    }

    fn counter(m: &BTreeMap<String, DebugValue>, key: &str) -> u64 {
        match m.get(key) {
            Some(DebugValue::Counter(n)) => *n,
            other => panic!("{key}: {other:?} in {m:#?}"),
        }
    }

    fn gauge(m: &BTreeMap<String, DebugValue>, key: &str) -> f64 {
        match m.get(key) {
            Some(DebugValue::Gauge(v)) => v.into_inner(),
            other => panic!("{key}: {other:?} in {m:#?}"),
        }
    }

    fn histogram_len(m: &BTreeMap<String, DebugValue>, key: &str) -> usize {
        match m.get(key) {
            Some(DebugValue::Histogram(v)) => v.len(),
            None => 0,
            other => panic!("{key}: {other:?}"),
        }
    }

    #[test]
    fn decisions_are_counted_by_limit_plan_and_outcome() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let api = Name::new("m-api");
        let free = Name::new("m-free");
        let allowed = |remaining| {
            Decision::allowed_with(10, remaining, Duration::from_secs(60)).with_policy(api)
        };
        let rejected = Decision::rejected(10, 0, Duration::from_secs(60), Duration::from_secs(6))
            .with_policy(api);
        metrics::with_local_recorder(&recorder, || {
            record_decision(&allowed(5), false, NearLimit::DEFAULT);
            record_decision(&allowed(0), false, NearLimit::DEFAULT); // near
            record_decision(&allowed(0).with_plan(free), false, NearLimit::DEFAULT); // near
            record_decision(&rejected.with_plan(free), false, NearLimit::DEFAULT);
            record_decision(&rejected.with_plan(free), false, NearLimit::DEFAULT);
            record_decision(&rejected, true, NearLimit::DEFAULT);
            // A shadow limit that allows counts as allowed.
            record_decision(&allowed(9), true, NearLimit::DEFAULT);
        });
        let m = snapshot(&snapshotter);
        let d = |plan: &str, outcome: &str| {
            counter(
                &m,
                &format!("tollgate_decisions_total{{limit=m-api,outcome={outcome},plan={plan}}}"),
            )
        };
        assert_eq!(d("", "allowed"), 3);
        assert_eq!(d("", "rejected"), 0);
        assert_eq!(d("", "shadow_rejected"), 1);
        assert_eq!(d("m-free", "allowed"), 1);
        assert_eq!(d("m-free", "rejected"), 2);
        assert_eq!(d("m-free", "shadow_rejected"), 0);
        assert_eq!(
            counter(&m, "tollgate_near_limit_total{limit=m-api,plan=}"),
            1
        );
        assert_eq!(
            counter(&m, "tollgate_near_limit_total{limit=m-api,plan=m-free}"),
            1,
            "rejections are not near-limit"
        );
        assert_eq!(m.len(), 8, "{m:#?}");
    }

    #[test]
    fn handles_follow_the_recorder_in_use() {
        let name = Name::new("m-switch");
        let d = Decision::allowed_with(10, 5, Duration::ZERO).with_policy(name);
        let key = "tollgate_decisions_total{limit=m-switch,outcome=allowed,plan=}";
        // Cached under the no-op recorder first (nothing installed on this thread).
        record_decision(&d, false, NearLimit::DEFAULT);
        let first = DebuggingRecorder::new();
        let second = DebuggingRecorder::new();
        metrics::with_local_recorder(&first, || {
            record_decision(&d, false, NearLimit::DEFAULT);
            record_decision(&d, false, NearLimit::DEFAULT);
        });
        metrics::with_local_recorder(&second, || record_decision(&d, false, NearLimit::DEFAULT));
        assert_eq!(counter(&snapshot(&first.snapshotter()), key), 2);
        assert_eq!(counter(&snapshot(&second.snapshotter()), key), 1);
    }

    #[test]
    fn interleaved_limits_each_keep_their_own_counts() {
        // The last counters used are checked first: every switch between limits must find the
        // other limit's counters, and a run of one limit must keep hitting its own.
        let recorder = DebuggingRecorder::new();
        let names = ["m-memo-a", "m-memo-b", "m-memo-c"].map(Name::new);
        let pattern = [0, 1, 0, 0, 2, 1, 1, 1, 0, 2];
        metrics::with_local_recorder(&recorder, || {
            for &i in &pattern {
                let d = Decision::allowed_with(10, 5, Duration::ZERO).with_policy(names[i]);
                record_decision(&d, false, NearLimit::DEFAULT);
            }
        });
        let m = snapshot(&recorder.snapshotter());
        for (i, name) in ["m-memo-a", "m-memo-b", "m-memo-c"].iter().enumerate() {
            let key = format!("tollgate_decisions_total{{limit={name},outcome=allowed,plan=}}");
            let expected = pattern.iter().filter(|&&p| p == i).count() as u64;
            assert_eq!(counter(&m, &key), expected, "{name}");
        }
    }

    #[test]
    fn the_cache_stays_bounded() {
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            for i in 0..1100 {
                let d = Decision::allowed_with(10, 5, Duration::ZERO)
                    .with_policy(Name::new("m-bound"))
                    .with_plan(Name::new(format!("m-plan-{i}")));
                record_decision(&d, false, NearLimit::DEFAULT);
            }
            // Still counted correctly after the cache started over.
            let d = Decision::allowed_with(10, 5, Duration::ZERO)
                .with_policy(Name::new("m-bound"))
                .with_plan(Name::new("m-plan-0"));
            record_decision(&d, false, NearLimit::DEFAULT);
        });
        let m = snapshot(&recorder.snapshotter());
        let key = "tollgate_decisions_total{limit=m-bound,outcome=allowed,plan=m-plan-0}";
        assert_eq!(counter(&m, key), 2);
    }

    #[test]
    fn one_memory_check_in_64_is_timed() {
        // A fresh thread: the sampling counter starts at 0.
        std::thread::spawn(|| {
            let recorder = DebuggingRecorder::new();
            metrics::with_local_recorder(&recorder, || {
                for i in 0..130 {
                    assert_eq!(time_memory_check(|| i), i);
                }
            });
            let m = snapshot(&recorder.snapshotter());
            assert_eq!(histogram_len(&m, "tollgate_store_seconds{store=memory}"), 3);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn keys_gauge_is_set_on_growth() {
        let recorder = DebuggingRecorder::new();
        let keys = KeysGauge::default();
        let name = Name::new("m-keys");
        metrics::with_local_recorder(&recorder, || {
            for _ in 0..3 {
                keys.grew(name);
            }
        });
        assert_eq!(
            gauge(
                &snapshot(&recorder.snapshotter()),
                "tollgate_keys{limit=m-keys}"
            ),
            3.0
        );
    }

    #[cfg(feature = "redis")]
    #[test]
    fn store_errors_latency_and_breaker() {
        use crate::error::StoreErrorKind;
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            record_store_error(StoreErrorKind::Timeout);
            record_store_error(StoreErrorKind::Timeout);
            record_store_error(StoreErrorKind::Unavailable);
            record_store_error(StoreErrorKind::InvalidResponse);
            record_store_error(StoreErrorKind::Other);
            RedisTimer::start().finish();
            record_breaker("", true);
            record_breaker("10.0.0.1:7000", true);
            record_breaker("10.0.0.1:7000", false);
        });
        let m = snapshot(&recorder.snapshotter());
        let errors =
            |kind: &str| counter(&m, &format!("tollgate_store_errors_total{{kind={kind}}}"));
        assert_eq!(errors("timeout"), 2);
        assert_eq!(errors("unavailable"), 1);
        assert_eq!(errors("invalid_response"), 1);
        assert_eq!(errors("other"), 1);
        assert_eq!(histogram_len(&m, "tollgate_store_seconds{store=redis}"), 1);
        assert_eq!(gauge(&m, "tollgate_breaker_open{node=default}"), 1.0);
        assert_eq!(gauge(&m, "tollgate_breaker_open{node=10.0.0.1:7000}"), 0.0);
    }

    #[test]
    fn describe_names_every_metric() {
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            describe();
            // Described metrics show up in a snapshot once registered.
            metrics::counter!(DECISIONS_TOTAL).increment(1);
            metrics::histogram!(STORE_SECONDS).record(0.5);
        });
        let snap = recorder.snapshotter().snapshot().into_vec();
        for (key, unit, description, _) in snap {
            let name = key.key().name().to_owned();
            assert!(description.is_some(), "{name} has no description");
            let expected = if name == STORE_SECONDS {
                metrics::Unit::Seconds
            } else {
                metrics::Unit::Count
            };
            assert_eq!(unit, Some(expected), "{name}");
        }
    }
}

/// Cost of recording one allowed decision, against the no-op recorder and against a recorder
/// whose counters are plain atomics (what exporters do on increment). Prints ns per call:
/// `cargo test --release --features metrics --lib metrics::tests::cost -- --ignored --nocapture`
/// (and without `--features metrics` for the baseline, where recording compiles to nothing).
#[test]
#[ignore = "a measurement, not a test"]
fn cost() {
    use std::hint::black_box;
    use std::time::Instant;

    const N: u32 = 5_000_000;
    let d = Decision::allowed_with(1000, 500, Duration::from_secs(1))
        .with_policy(Name::new("bench"))
        .with_plan(Name::new("pro"));
    let run = |label: &str| {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            for _ in 0..N {
                record_decision(black_box(&d), false, NearLimit::DEFAULT);
            }
            best = best.min(start.elapsed().as_nanos() as f64 / f64::from(N));
        }
        println!("record_decision ({label}): {best:.1} ns");
    };
    run(if cfg!(feature = "metrics") {
        "feature on, no recorder"
    } else {
        "feature off"
    });
    #[cfg(feature = "metrics")]
    {
        let recorder = atomic_recorder::AtomicRecorder::default();
        metrics::with_local_recorder(&recorder, || run("feature on, atomic counters"));
        // The same counter through the macro on every call (no cache), for comparison.
        metrics::with_local_recorder(&recorder, || {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let start = Instant::now();
                for _ in 0..N {
                    let d = black_box(&d);
                    metrics::counter!(DECISIONS_TOTAL, "limit" => d.policy().as_str().to_owned(),
                        "plan" => d.plan().map_or(String::new(), |p| p.as_str().to_owned()), "outcome" => "allowed")
                    .increment(1);
                }
                best = best.min(start.elapsed().as_nanos() as f64 / f64::from(N));
            }
            println!("counter! per call, uncached (atomic counters): {best:.1} ns");
        });
    }
}

#[cfg(feature = "metrics")]
mod atomic_recorder {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    struct Atomic(AtomicU64);

    impl CounterFn for Atomic {
        fn increment(&self, value: u64) {
            self.0.fetch_add(value, Ordering::Relaxed);
        }
        fn absolute(&self, value: u64) {
            self.0.fetch_max(value, Ordering::Relaxed);
        }
    }

    /// Counters as atomics in a locked map: roughly what an exporter's registry does.
    #[derive(Default)]
    pub(super) struct AtomicRecorder {
        counters: Mutex<HashMap<Key, Arc<Atomic>>>,
    }

    impl Recorder for AtomicRecorder {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            let mut counters = self.counters.lock().unwrap();
            let c = counters
                .entry(key.clone())
                .or_insert_with(|| Arc::new(Atomic(AtomicU64::new(0))));
            Counter::from_arc(c.clone())
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }
}
