//! The state every caller of one layer shares: per upstream, the reserved send slots (GCRA
//! theoretical arrival times, configured and learned), the pause an upstream asked for, the
//! probe (one caller at a time while the upstream has not shown room), and the retry budget.
//!
//! A caller *reserves* its slot under a short lock (so concurrent callers are spaced, first
//! come first served), then sleeps until it, without the lock. A pause that arrives while it
//! sleeps sends it back to reserve again after the pause. A caller dropped before it sends
//! gives its slot back (the algorithm's refund), so cancelled calls do not slow the rest.
//!
//! Every wait the upstream imposes (a pause, a learned limit's slot, a probe in flight) ends
//! by the caller's *hold limit* (`hold_until`): the call's start plus `max_pause` for a first
//! attempt, the retry's earliest time plus `max_pause` for a retry. Only a configured quota's
//! slot, the application's own setting, may be later.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::algorithm::{Algorithm, Gcra, GcraState};
use crate::clock::Clock;
use crate::Quota;

use super::adaptive::Learned;
use super::backoff::Jitter;
use super::budget::{BudgetWindow, RetryBudget};
use super::parse::UpstreamSignal;

/// Configuration fixed when the layer is built.
#[derive(Debug)]
pub(crate) struct ScheduleConfig {
    pub(crate) configured: Option<Gcra>,
    pub(crate) adaptive: bool,
    pub(crate) max_pause: Duration,
    pub(crate) max_upstreams: usize,
    pub(crate) budget: RetryBudget,
}

/// Shared by a layer and every service it made.
#[derive(Debug)]
pub(crate) struct Schedule {
    config: ScheduleConfig,
    clock: Arc<dyn Clock>,
    upstreams: Mutex<HashMap<String, Upstream>>,
    pub(crate) jitter: Jitter,
}

#[derive(Debug, Default)]
struct Upstream {
    configured: GcraState,
    learned: Learned,
    /// Clock time (µs) before which nothing is sent.
    paused_until: u64,
    /// Whether callers go one at a time (each waiting for the previous one's answer): from a
    /// refusal or `Remaining: 0` (and, in adaptive mode with no quota, from the start) until
    /// an answer shows room.
    gated: bool,
    /// Whether the probe (the one caller let through while gated) is in flight.
    probing: bool,
    /// Woken when the probe ends.
    wake: Arc<Notify>,
    last_used: u64,
    /// First attempts and retries over the retry budget's window.
    budget: BudgetWindow,
}

/// A caller's place in an upstream's schedule. Dropped before [`commit`](Self::commit), it
/// gives its slots back; dropped at all, it ends the probe it was.
#[derive(Debug)]
pub(crate) struct Reservation {
    schedule: Arc<Schedule>,
    key: String,
    /// When the caller may send (clock µs).
    at: u64,
    configured_at: Option<u64>,
    /// (generation, slot) of each learned limit's reservation.
    learned_at: Option<(u64, Vec<u64>)>,
    probe: bool,
    committed: bool,
}

impl Reservation {
    /// The slot was used: nothing is given back.
    pub(crate) fn commit(&mut self) {
        self.committed = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.committed || self.probe {
            self.schedule.release(self);
        }
    }
}

/// What a caller does next.
enum Admit {
    /// Send at the reservation's time.
    Slot(Reservation),
    /// Another caller is probing an upstream not yet heard from: wait for its answer.
    Probe(Arc<Notify>),
}

/// A view of one upstream's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamStatus {
    paused_for: Duration,
    learned: Vec<Quota>,
}

impl UpstreamStatus {
    /// How much longer the upstream is paused (zero when it is not).
    pub fn paused_for(&self) -> Duration {
        self.paused_for
    }

    /// The limits learned from its headers (adaptive mode), tightest first.
    pub fn learned(&self) -> &[Quota] {
        &self.learned
    }
}

/// Reserves one unit at the earliest time from `not_before` on.
fn reserve(gcra: &Gcra, state: &mut GcraState, not_before: u64) -> u64 {
    let mut t = not_before;
    for _ in 0..8 {
        let d = gcra.decide(state, t, 1);
        if d.allowed() {
            gcra.apply(state, t, 1);
            return t;
        }
        let wait = d.retry_after().unwrap_or(Duration::from_micros(1));
        t = t.saturating_add(u64::try_from(wait.as_micros()).unwrap_or(u64::MAX).max(1));
    }
    // Unreachable for cost 1 (a GCRA's capacity is at least 1): charge at the last time.
    gcra.apply(state, t, 1);
    t
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Schedule {
    pub(crate) fn new(config: ScheduleConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            config,
            clock,
            upstreams: Mutex::new(HashMap::new()),
            jitter: Jitter::new(),
        }
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now_micros()
    }

    /// Wall-clock time, µs since the Unix epoch, on this schedule's clock.
    pub(crate) fn unix_now(&self) -> u64 {
        self.clock
            .now_micros()
            .saturating_add(self.clock.unix_offset_micros())
    }

    /// Waits for `key`'s next slot and returns it, reserved. Cancellation-safe: dropped while
    /// waiting, the slot is given back.
    /// The longest wait an upstream can impose, µs.
    pub(crate) fn max_pause_micros(&self) -> u64 {
        micros(self.config.max_pause)
    }

    /// Waits for `key`'s next slot from clock time `not_before` on (a retry's backoff) and
    /// returns it, reserved; or `None`, with nothing reserved, when the slot would be after
    /// `deadline`. Pauses, learned limits and a probe in flight hold the caller until
    /// `hold_until` at the latest (a configured quota's slot may be later). Cancellation-safe:
    /// dropped while waiting, the slot is given back.
    pub(crate) async fn acquire_within(
        self: &Arc<Self>,
        key: &str,
        not_before: u64,
        hold_until: u64,
        deadline: u64,
    ) -> Option<Reservation> {
        loop {
            match self.admit(key, not_before, hold_until) {
                Admit::Probe(wake) => {
                    let notified = wake.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    if self.probing(key) {
                        let left = hold_until.saturating_sub(self.now());
                        tokio::select! {
                            () = notified.as_mut() => {}
                            () = tokio::time::sleep(Duration::from_micros(left)) => {}
                        }
                    }
                }
                Admit::Slot(reservation) => {
                    if reservation.at > deadline {
                        return None;
                    }
                    let wait = reservation.at.saturating_sub(self.now());
                    if wait > 0 {
                        tokio::time::sleep(Duration::from_micros(wait)).await;
                    }
                    // A pause that came in while this caller slept moves it behind the pause
                    // (up to its hold limit); a refusal that gated the upstream meanwhile
                    // makes it wait for the probe.
                    let now = self.now();
                    let limit = hold_until.max(now.max(not_before));
                    let (paused_until, probe_in_flight) = self.hold(key);
                    let gated = !reservation.probe && probe_in_flight && now < hold_until;
                    if paused_until.min(limit) > reservation.at.max(now) || gated {
                        drop(reservation);
                        continue;
                    }
                    return Some(reservation);
                }
            }
        }
    }

    fn admit(self: &Arc<Self>, key: &str, not_before: u64, hold_until: u64) -> Admit {
        let now = self.now();
        let mut map = self.upstreams.lock();
        if !map.contains_key(key) && map.len() >= self.config.max_upstreams {
            evict(&mut map, now);
        }
        let up = map.entry(key.to_owned()).or_insert_with(|| Upstream {
            gated: self.config.adaptive && self.config.configured.is_none(),
            ..Upstream::default()
        });
        up.last_used = now;
        let mut probe = false;
        if up.gated {
            if !up.probing {
                up.probing = true;
                probe = true;
            } else if now < hold_until {
                return Admit::Probe(up.wake.clone());
            }
        }
        let base = now.max(not_before);
        // The latest a pause or a learned limit may hold this caller.
        let limit = hold_until.max(base);
        let mut t = base.max(up.paused_until.min(limit));
        let configured_at = self.config.configured.as_ref().map(|gcra| {
            t = reserve(gcra, &mut up.configured, t);
            t
        });
        let learned_at = (!up.learned.limits.is_empty()).then(|| {
            let mut slots = Vec::with_capacity(up.learned.limits.len());
            // Reserve on each at the latest time any of them allows: a second pass moves the
            // earlier ones there too, so none is charged at a time the others refuse.
            let mut at = t;
            for l in &up.learned.limits {
                let mut probe_state = l.state;
                at = at.max(reserve(&l.gcra, &mut probe_state, at));
            }
            for l in &mut up.learned.limits {
                slots.push(reserve(&l.gcra, &mut l.state, at));
            }
            let learned = at.max(slots.iter().copied().max().unwrap_or(at));
            t = t.max(learned.min(limit));
            (up.learned.generation, slots)
        });
        Admit::Slot(Reservation {
            schedule: self.clone(),
            key: key.to_owned(),
            at: t,
            configured_at,
            learned_at,
            probe,
            committed: false,
        })
    }

    fn probing(&self, key: &str) -> bool {
        self.upstreams.lock().get(key).is_some_and(|u| u.probing)
    }

    /// When `key`'s pause ends, and whether it is gated with a probe in flight.
    fn hold(&self, key: &str) -> (u64, bool) {
        self.upstreams
            .lock()
            .get(key)
            .map_or((0, false), |u| (u.paused_until, u.gated && u.probing))
    }

    /// How much longer `key` is paused.
    #[cfg(test)]
    pub(crate) fn pause_left(&self, key: &str) -> Duration {
        Duration::from_micros(self.hold(key).0.saturating_sub(self.now()))
    }

    /// Counts a first attempt to `key` in its retry budget.
    pub(crate) fn first_attempt(&self, key: &str) {
        let now = self.now();
        if let Some(up) = self.upstreams.lock().get_mut(key) {
            up.budget.first(&self.config.budget, now);
        }
    }

    /// Whether `key`'s retry budget covers one more retry now (and counts it if so).
    pub(crate) fn take_retry(&self, key: &str) -> bool {
        let now = self.now();
        self.upstreams
            .lock()
            .get_mut(key)
            .is_some_and(|up| up.budget.retry(&self.config.budget, now))
    }

    /// Gives back an unsent reservation's slots, and ends its probe.
    fn release(&self, r: &Reservation) {
        let now = self.now();
        let mut map = self.upstreams.lock();
        let Some(up) = map.get_mut(&r.key) else {
            return;
        };
        if !r.committed {
            if let (Some(gcra), Some(at)) = (&self.config.configured, r.configured_at) {
                gcra.refund(&mut up.configured, at, now, 1);
            }
            if let Some((generation, slots)) = &r.learned_at {
                if *generation == up.learned.generation {
                    for (l, &at) in up.learned.limits.iter_mut().zip(slots) {
                        l.gcra.refund(&mut l.state, at, now, 1);
                    }
                }
            }
        }
        if r.probe {
            up.probing = false;
            up.wake.notify_waiters();
        }
    }

    /// Records what the upstream said: pauses the key when it asked to wait (or has nothing
    /// left until its reset), gates it (one caller at a time) after a refusal or
    /// `Remaining: 0` until an answer shows room, and learns its limits in adaptive mode.
    pub(crate) fn observe(&self, key: &str, signal: &UpstreamSignal) {
        let now = self.now();
        let mut map = self.upstreams.lock();
        let Some(up) = map.get_mut(key) else {
            return;
        };
        let exhausted = signal.remaining() == Some(0);
        up.gated = signal.refused() || exhausted;
        let pause = if signal.refused() {
            signal
                .retry_after()
                .or(exhausted.then(|| signal.reset()).flatten())
        } else if exhausted {
            signal.reset()
        } else {
            None
        };
        if let Some(pause) = pause {
            let until = now.saturating_add(micros(pause.min(self.config.max_pause)));
            if until > up.paused_until {
                up.paused_until = until;
                tracing::debug!(
                    upstream = %key,
                    pause_ms = pause.as_millis() as u64,
                    refused = signal.refused(),
                    "outbound: upstream paused"
                );
            }
        }
        if self.config.adaptive {
            up.learned.observe(signal, now);
        }
        up.wake.notify_waiters();
    }

    pub(crate) fn status(&self, key: &str) -> Option<UpstreamStatus> {
        let now = self.now();
        let map = self.upstreams.lock();
        let up = map.get(key)?;
        Some(UpstreamStatus {
            paused_for: Duration::from_micros(up.paused_until.saturating_sub(now)),
            learned: up.learned.quotas(),
        })
    }
}

/// Makes room for one more upstream: drops those idle for a minute and not paused, or if
/// none, the least recently used one that is not probing.
fn evict(map: &mut HashMap<String, Upstream>, now: u64) {
    const IDLE: u64 = 60_000_000;
    let before = map.len();
    map.retain(|_, u| u.probing || u.paused_until > now || u.last_used.saturating_add(IDLE) > now);
    if map.len() < before {
        return;
    }
    if let Some(oldest) = map
        .iter()
        .filter(|(_, u)| !u.probing)
        .min_by_key(|(_, u)| u.last_used)
        .map(|(k, _)| k.clone())
    {
        map.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use http::{HeaderMap, StatusCode};

    fn schedule(quota: Option<Quota>, clock: &ManualClock) -> Arc<Schedule> {
        Arc::new(Schedule::new(
            ScheduleConfig {
                configured: quota.map(|q| Gcra::new(q).unwrap()),
                adaptive: true,
                max_pause: Duration::from_secs(60),
                max_upstreams: 2,
                budget: RetryBudget::default(),
            },
            Arc::new(clock.clone()),
        ))
    }

    fn slot(s: &Arc<Schedule>, key: &str) -> Reservation {
        match s.admit(key, 0, u64::MAX) {
            Admit::Slot(r) => r,
            Admit::Probe(_) => panic!("probe"),
        }
    }

    fn refused(retry_after: &str) -> UpstreamSignal {
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, retry_after.parse().unwrap());
        UpstreamSignal::from_headers(StatusCode::TOO_MANY_REQUESTS, &h, 0)
    }

    #[test]
    fn concurrent_callers_are_spaced_in_arrival_order() {
        let clock = ManualClock::new();
        let s = schedule(Some(Quota::per_second(10).burst(1)), &clock);
        let slots: Vec<_> = (0..4).map(|_| slot(&s, "a")).collect();
        let at: Vec<_> = slots.iter().map(|r| r.at).collect();
        assert_eq!(at, [0, 100_000, 200_000, 300_000]);
        // Another upstream has its own schedule.
        assert_eq!(slot(&s, "b").at, 0);
    }

    #[test]
    fn an_unsent_reservation_is_given_back() {
        let clock = ManualClock::new();
        let s = schedule(Some(Quota::per_second(10).burst(1)), &clock);
        let mut first = slot(&s, "a");
        first.commit();
        let second = slot(&s, "a");
        assert_eq!(second.at, 100_000);
        drop(second);
        assert_eq!(slot(&s, "a").at, 100_000, "the slot was given back");
        drop(first);
    }

    #[test]
    fn a_pause_moves_new_slots_behind_it() {
        let clock = ManualClock::new();
        let s = schedule(Some(Quota::per_second(10).burst(1)), &clock);
        slot(&s, "a").commit();
        s.observe("a", &refused("2"));
        assert_eq!(s.pause_left("a"), Duration::from_secs(2));
        assert!(slot(&s, "a").at >= 2_000_000);
        clock.advance(Duration::from_millis(500));
        assert_eq!(s.pause_left("a"), Duration::from_millis(1_500));
        // Longer than max_pause is cut to it.
        s.observe("a", &refused("3600"));
        assert_eq!(s.pause_left("a"), Duration::from_secs(60));
    }

    #[test]
    fn adaptive_probes_one_call_at_a_time_until_an_answer() {
        let clock = ManualClock::new();
        let s = schedule(None, &clock);
        let mut probe = slot(&s, "a");
        assert!(probe.probe);
        assert!(matches!(s.admit("a", 0, u64::MAX), Admit::Probe(_)));
        probe.commit();
        s.observe("a", &UpstreamSignal::default());
        drop(probe);
        // Answered without limits: no shaping from then on.
        assert!(!slot(&s, "a").probe);
        assert_eq!(slot(&s, "a").at, 0);
        // A probe dropped unanswered lets the next caller probe.
        let probe = slot(&s, "b");
        drop(probe);
        assert!(slot(&s, "b").probe);
    }

    #[test]
    fn a_refusal_gates_the_upstream_until_an_answer_shows_room() {
        let clock = ManualClock::new();
        let s = schedule(Some(Quota::per_second(1000)), &clock);
        slot(&s, "a").commit();
        s.observe("a", &refused("1"));
        // One caller goes when the pause ends; the next waits for its answer.
        let mut probe = slot(&s, "a");
        assert!(probe.probe);
        assert_eq!(probe.at, 1_000_000);
        assert!(matches!(s.admit("a", 0, u64::MAX), Admit::Probe(_)));
        // Past its hold limit, a caller goes without waiting for the probe.
        assert!(matches!(s.admit("a", 0, 0), Admit::Slot(_)));
        // Refused again: still one at a time.
        clock.advance(Duration::from_secs(1));
        probe.commit();
        s.observe("a", &refused("1"));
        drop(probe);
        let mut probe = slot(&s, "a");
        assert!(probe.probe);
        assert!(matches!(s.admit("a", 0, u64::MAX), Admit::Probe(_)));
        // Served: everyone goes.
        clock.advance(Duration::from_secs(1));
        probe.commit();
        s.observe("a", &UpstreamSignal::default());
        drop(probe);
        assert!(!slot(&s, "a").probe);
        assert!(!slot(&s, "a").probe);
    }

    #[test]
    fn a_learned_slot_and_a_pause_hold_a_caller_until_its_hold_limit_at_most() {
        let clock = ManualClock::new();
        let s = schedule(None, &clock);
        let mut h = HeaderMap::new();
        h.insert("ratelimit-policy", r#""q";q=1;w=31536000"#.parse().unwrap());
        let yearly = UpstreamSignal::from_headers(StatusCode::OK, &h, 0);
        slot(&s, "a").commit();
        s.observe("a", &yearly);
        slot(&s, "a").commit();
        let r = match s.admit("a", 0, 60_000_000) {
            Admit::Slot(r) => r,
            Admit::Probe(_) => panic!("probe"),
        };
        assert_eq!(r.at, 60_000_000, "a year's slot, cut to the hold limit");
        s.observe("a", &refused("3600"));
        match s.admit("a", 0, 5_000_000) {
            Admit::Slot(r) => assert_eq!(r.at, 5_000_000),
            Admit::Probe(_) => panic!("the refusal's probe is this caller"),
        }
    }

    #[test]
    fn upstreams_beyond_the_bound_evict_the_least_recently_used() {
        let clock = ManualClock::new();
        let s = schedule(Some(Quota::per_second(1)), &clock);
        slot(&s, "a").commit();
        clock.advance(Duration::from_millis(1));
        slot(&s, "b").commit();
        clock.advance(Duration::from_millis(1));
        slot(&s, "c").commit();
        assert!(s.status("a").is_none());
        assert!(s.status("b").is_some() && s.status("c").is_some());
    }
}
