//! [`ShedMetrics`]: the shedder's metric handles (feature `metrics`), registered once when the
//! layer is built.

use metrics::{Counter, Gauge};

use super::priority::Priority;
use crate::decision::Name;
use crate::metrics::{SHED_BASELINE_SECONDS, SHED_IN_FLIGHT, SHED_LIMIT, SHED_TOTAL};

/// The handles of one layer, labelled with its name.
#[derive(Debug, Clone)]
pub(crate) struct ShedMetrics {
    limit: Gauge,
    in_flight: Gauge,
    baseline: Gauge,
    /// Shed requests, by class ([`Priority::index`]).
    shed: [Counter; 3],
}

impl ShedMetrics {
    pub(crate) fn new(name: Name) -> Self {
        let label = || name.as_str().to_owned();
        let shed = Priority::ALL.map(|class| {
            metrics::counter!(SHED_TOTAL, "shedder" => label(), "priority" => class.as_str())
        });
        Self {
            limit: metrics::gauge!(SHED_LIMIT, "shedder" => label()),
            in_flight: metrics::gauge!(SHED_IN_FLIGHT, "shedder" => label()),
            baseline: metrics::gauge!(SHED_BASELINE_SECONDS, "shedder" => label()),
            shed,
        }
    }

    pub(crate) fn limit(&self, limit: u32) {
        self.limit.set(f64::from(limit));
    }

    pub(crate) fn in_flight(&self, in_flight: u32) {
        self.in_flight.set(f64::from(in_flight));
    }

    pub(crate) fn baseline(&self, micros: f64) {
        self.baseline.set(micros / 1e6);
    }

    pub(crate) fn shed(&self, class: Priority) {
        self.shed[class.index()].increment(1);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::super::gate::{Acquire, Gate};
    use super::super::gradient::{Adaptive, Learner, LimitState};
    use super::*;
    use crate::clock::{Clock, ManualClock};

    #[test]
    fn records_limit_in_flight_baseline_and_shed_by_priority() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let clock = ManualClock::new();
        let gate = metrics::with_local_recorder(&recorder, || {
            Gate::new(
                LimitState::Adaptive(Learner::new(Adaptive::new().initial_limit(2))),
                [1_000_000, 1_000_000, 500_000],
                [0; 3],
                Arc::new(clock.clone()) as Arc<dyn Clock>,
                ShedMetrics::new(Name::new("api")),
            )
        });
        let Acquire::Got(mut permit) = gate.acquire(Priority::Sheddable) else {
            panic!("a slot")
        };
        assert!(matches!(
            gate.acquire(Priority::Sheddable),
            Acquire::Shed(_)
        ));
        clock.advance(std::time::Duration::from_millis(40));
        permit.answered();
        let values: Vec<(String, String, DebugValue)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let labels: Vec<String> = key.labels().map(|l| l.value().to_owned()).collect();
                (key.name().to_owned(), labels.join(","), value)
            })
            .collect();
        let find = |name: &str, labels: &str| {
            values
                .iter()
                .find(|(n, l, _)| n == name && l == labels)
                .map(|(_, _, v)| format!("{v:?}"))
                .unwrap_or_else(|| panic!("{name}{{{labels}}} in {values:?}"))
        };
        assert_eq!(
            find(SHED_TOTAL, "api,sheddable"),
            format!("{:?}", DebugValue::Counter(1))
        );
        assert_eq!(
            find(SHED_TOTAL, "api,critical"),
            format!("{:?}", DebugValue::Counter(0))
        );
        assert_eq!(
            find(SHED_IN_FLIGHT, "api"),
            format!("{:?}", DebugValue::Gauge(1.0.into()))
        );
        assert_eq!(
            find(SHED_LIMIT, "api"),
            format!("{:?}", DebugValue::Gauge(2.0.into()))
        );
        assert_eq!(
            find(SHED_BASELINE_SECONDS, "api"),
            format!("{:?}", DebugValue::Gauge(0.04.into()))
        );
        drop(permit);
        let in_flight = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find(|(k, ..)| k.key().name() == SHED_IN_FLIGHT)
            .map(|(.., v)| format!("{v:?}"));
        assert_eq!(
            in_flight,
            Some(format!("{:?}", DebugValue::Gauge(0.0.into())))
        );
    }
}
