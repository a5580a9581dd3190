//! [`Gate`]: the requests in flight against the limit, each class's share of it, the short
//! queues, and the [`Permit`] a running request holds.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::gradient::LimitState;
use super::priority::Priority;
use crate::clock::Clock;

/// What [`Gate::acquire`] answers.
#[derive(Debug)]
pub(crate) enum Acquire {
    /// A slot is held.
    Got(Permit),
    /// The class's share is in use; the request waits on this receiver for a slot.
    Queued(oneshot::Receiver<Permit>),
    /// The class's share is in use and it cannot wait: shed.
    Shed(Full),
}

/// The state a request was shed in, for its refusal.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Full {
    pub(crate) limit: u32,
    pub(crate) share: u32,
    pub(crate) in_flight: u32,
}

/// One class's waiting line.
#[derive(Debug, Default)]
struct Line {
    waiters: VecDeque<oneshot::Sender<Permit>>,
}

#[derive(Debug)]
struct State {
    in_flight: u32,
    /// Whether a request was refused or queued since the last sample: the limit is in use,
    /// even when a class's share keeps the requests in flight under it.
    pressed: bool,
    limit: LimitState,
    lines: [Line; 3],
}

/// The slots of one layer.
#[derive(Debug)]
pub(crate) struct Gate {
    state: Mutex<State>,
    /// Each class's share of the limit, in parts per million (critical: all of it).
    shares_ppm: [u32; 3],
    /// Each class's queue length (0: no queue).
    queue_len: [usize; 3],
    clock: Arc<dyn Clock>,
    #[cfg(feature = "metrics")]
    metrics: super::metrics::ShedMetrics,
}

impl Gate {
    pub(crate) fn new(
        limit: LimitState,
        shares_ppm: [u32; 3],
        queue_len: [usize; 3],
        clock: Arc<dyn Clock>,
        #[cfg(feature = "metrics")] metrics: super::metrics::ShedMetrics,
    ) -> Arc<Self> {
        #[cfg(feature = "metrics")]
        metrics.limit(limit.limit());
        Arc::new(Self {
            state: Mutex::new(State {
                in_flight: 0,
                pressed: false,
                limit,
                lines: Default::default(),
            }),
            shares_ppm,
            queue_len,
            clock,
            #[cfg(feature = "metrics")]
            metrics,
        })
    }

    /// How many slots `class` may have in use (at least 1).
    fn share(&self, class: Priority, limit: u32) -> u32 {
        let ppm = u64::from(self.shares_ppm[class.index()]);
        // At most `limit`, so the cast keeps every bit.
        ((u64::from(limit) * ppm / 1_000_000) as u32).max(1)
    }

    /// A slot for a request of `class`, a place in its line, or a refusal.
    pub(crate) fn acquire(self: &Arc<Self>, class: Priority) -> Acquire {
        let mut state = self.state.lock();
        let limit = state.limit.limit();
        let share = self.share(class, limit);
        if state.in_flight < share {
            state.in_flight += 1;
            let in_flight = state.in_flight;
            self.gauge_in_flight(in_flight);
            drop(state);
            return Acquire::Got(self.permit(in_flight));
        }
        state.pressed = true;
        let line = &mut state.lines[class.index()];
        let room = self.queue_len[class.index()];
        if line.waiters.len() >= room {
            // Waiters whose request gave up leave their sender behind: a full line drops
            // those before it refuses (one scan per time the line fills, not per request).
            line.waiters.retain(|w| !w.is_closed());
        }
        if line.waiters.len() < room {
            let (tx, rx) = oneshot::channel();
            line.waiters.push_back(tx);
            return Acquire::Queued(rx);
        }
        let in_flight = state.in_flight;
        drop(state);
        self.record_shed(class);
        Acquire::Shed(Full {
            limit,
            share,
            in_flight,
        })
    }

    /// Counts a request of `class` refused (metrics only).
    #[inline]
    pub(crate) fn record_shed(&self, class: Priority) {
        #[cfg(feature = "metrics")]
        self.metrics.shed(class);
        let _ = class;
    }

    /// Sets the in-flight gauge; called with the state locked, so that gauge writes follow the
    /// order of the changes they report.
    #[inline]
    fn gauge_in_flight(&self, in_flight: u32) {
        #[cfg(feature = "metrics")]
        self.metrics.in_flight(in_flight);
        let _ = in_flight;
    }

    fn permit(self: &Arc<Self>, in_flight: u32) -> Permit {
        Permit {
            gate: Arc::clone(self),
            started: self.clock.now_micros(),
            in_flight,
            sampled: false,
        }
    }

    /// Gives a slot back and hands free slots to waiters.
    fn release(self: &Arc<Self>) {
        let mut state = self.state.lock();
        state.in_flight -= 1;
        let handed = self.dispense(&mut state);
        drop(state);
        self.hand_out(handed);
    }

    /// Takes the slots free under the current limit for waiters, most important class first,
    /// and sets the in-flight gauge; the permits are sent by [`hand_out`](Self::hand_out),
    /// outside the lock. Called when a slot is given back and when the limit moves (a raised
    /// limit serves the waiting requests before new arrivals take its slots).
    fn dispense(&self, state: &mut State) -> Vec<(oneshot::Sender<Permit>, u32)> {
        let mut handed = Vec::new();
        let limit = state.limit.limit();
        for class in Priority::ALL {
            let share = self.share(class, limit);
            while state.in_flight < share {
                let Some(tx) = state.lines[class.index()].waiters.pop_front() else {
                    break;
                };
                if tx.is_closed() {
                    continue;
                }
                state.in_flight += 1;
                handed.push((tx, state.in_flight));
            }
        }
        self.gauge_in_flight(state.in_flight);
        handed
    }

    /// Sends the permits [`dispense`](Self::dispense) took: a permit whose waiter is gone
    /// comes back through its drop.
    fn hand_out(self: &Arc<Self>, handed: Vec<(oneshot::Sender<Permit>, u32)>) {
        for (tx, in_flight) in handed {
            let _ = tx.send(self.permit(in_flight));
        }
    }

    /// The limit in force.
    pub(crate) fn limit(&self) -> u32 {
        self.state.lock().limit.limit()
    }

    /// Requests holding a slot.
    pub(crate) fn in_flight(&self) -> u32 {
        self.state.lock().in_flight
    }

    /// The no-load latency learned so far, in microseconds.
    pub(crate) fn baseline_micros(&self) -> Option<f64> {
        self.state.lock().limit.baseline_micros()
    }
}

/// A slot held by a request: dropping it gives the slot back.
#[derive(Debug)]
pub(crate) struct Permit {
    gate: Arc<Gate>,
    started: u64,
    in_flight: u32,
    sampled: bool,
}

impl Permit {
    /// The inner service answered: its latency is a sample of the limit (once).
    pub(crate) fn answered(&mut self) {
        if self.sampled {
            return;
        }
        self.sampled = true;
        let rtt = self.gate.clock.now_micros().saturating_sub(self.started);
        let mut state = self.gate.state.lock();
        let busy = state.pressed || state.in_flight >= state.limit.limit();
        state.pressed = false;
        let before = state.limit.limit();
        state.limit.sample(rtt, self.in_flight, busy);
        #[cfg(feature = "metrics")]
        {
            self.gate.metrics.limit(state.limit.limit());
            if let Some(b) = state.limit.baseline_micros() {
                self.gate.metrics.baseline(b);
            }
        }
        if state.limit.limit() > before {
            let handed = self.gate.dispense(&mut state);
            drop(state);
            self.gate.hand_out(handed);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn gate(limit: u32, sheddable_share: f64, queue: usize) -> Arc<Gate> {
        Gate::new(
            LimitState::Fixed(limit),
            [1_000_000, 1_000_000, (sheddable_share * 1e6) as u32],
            [queue, 0, 0],
            Arc::new(ManualClock::new()),
            #[cfg(feature = "metrics")]
            super::super::metrics::ShedMetrics::new(crate::decision::Name::new("t")),
        )
    }

    #[test]
    fn sheddable_uses_only_its_share_and_critical_the_rest() {
        let gate = gate(4, 0.5, 0);
        let a = gate.acquire(Priority::Sheddable);
        let b = gate.acquire(Priority::Sheddable);
        assert!(matches!(a, Acquire::Got(_)) && matches!(b, Acquire::Got(_)));
        assert!(matches!(
            gate.acquire(Priority::Sheddable),
            Acquire::Shed(Full {
                limit: 4,
                share: 2,
                in_flight: 2
            })
        ));
        let c = gate.acquire(Priority::Critical);
        let d = gate.acquire(Priority::Critical);
        assert!(matches!(c, Acquire::Got(_)) && matches!(d, Acquire::Got(_)));
        assert!(matches!(gate.acquire(Priority::Critical), Acquire::Shed(_)));
        drop((a, b, c, d));
        assert_eq!(gate.in_flight(), 0);
    }

    #[test]
    fn a_freed_slot_goes_to_a_waiting_critical_request() {
        let gate = gate(1, 1.0, 1);
        let running = gate.acquire(Priority::Critical);
        let Acquire::Queued(mut rx) = gate.acquire(Priority::Critical) else {
            panic!("queued")
        };
        assert!(matches!(gate.acquire(Priority::Critical), Acquire::Shed(_))); // line full
        assert!(rx.try_recv().is_err());
        drop(running);
        let permit = rx.try_recv().expect("the freed slot");
        assert_eq!(gate.in_flight(), 1);
        drop(permit);
        assert_eq!(gate.in_flight(), 0);
    }

    #[test]
    fn a_slot_handed_to_a_waiter_that_left_comes_back() {
        let gate = gate(1, 1.0, 2);
        let running = gate.acquire(Priority::Critical);
        let Acquire::Queued(rx) = gate.acquire(Priority::Critical) else {
            panic!("queued")
        };
        // The freed slot is handed to the waiter: still one in flight.
        drop(running);
        assert_eq!(gate.in_flight(), 1);
        // The waiter leaves without taking it: the permit in its channel gives it back.
        drop(rx);
        assert_eq!(gate.in_flight(), 0);
    }

    #[test]
    fn a_raised_limit_serves_a_waiting_request_before_any_slot_is_freed() {
        let gate = Gate::new(
            LimitState::Adaptive(super::super::gradient::Learner::new(
                super::super::gradient::Adaptive::new()
                    .initial_limit(1)
                    .smoothing(1.0),
            )),
            [1_000_000; 3],
            [1, 0, 0],
            Arc::new(ManualClock::new()),
            #[cfg(feature = "metrics")]
            super::super::metrics::ShedMetrics::new(crate::decision::Name::new("t")),
        );
        let Acquire::Got(mut running) = gate.acquire(Priority::Critical) else {
            panic!("the one slot")
        };
        let Acquire::Queued(mut rx) = gate.acquire(Priority::Critical) else {
            panic!("queued")
        };
        // The running request answers as fast as the baseline while another waited: the limit
        // grows to 2, and the new slot goes to the waiter at once, the first still held.
        running.answered();
        assert_eq!(gate.limit(), 2);
        let second = rx.try_recv().expect("the raised limit's slot");
        assert_eq!(gate.in_flight(), 2);
        drop((running, second));
        assert_eq!(gate.in_flight(), 0);
    }
}
