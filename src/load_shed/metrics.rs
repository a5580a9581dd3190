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
