//! The state every caller of one layer shares: per upstream, the reserved send slots (GCRA
//! theoretical arrival times, configured and learned), the pause an upstream asked for, the
//! slow start or window that releases callers until the upstream shows room, and the retry
//! budget.
//!
//! A caller *reserves* its slot under a short lock (so concurrent callers are spaced, first
//! come first served), then sleeps until it, without the lock. A pause that arrives while it
//! sleeps sends it back to reserve again after the pause. A caller dropped before it sends
//! gives its slot back (the algorithm's refund), so cancelled calls do not slow the rest.
//!
//! # After a refusal: a slow start
//!
//! A refusal with a pause `r` (its `Retry-After`, pushback or reset) does not let every waiter
//! go when the pause ends: a plain success, with no rate-limit header, shows room for that one
//! call only. So the waiters are released in a *slow start*, like TCP's:
//!
//! - one call per `r` at first; each interval of `r` with no refusal doubles how many go per
//!   `r` (1, 2, 4, ...), evenly spaced (`r / allowance` apart);
//! - a refusal of a call sent during the slow start pauses as before, halves the allowance (at
//!   least 1 per `r`), and the allowance stops doubling: the upstream refused at twice it, so
//!   it keeps to it until the slow start ends;
//! - the slow start ends, and everyone goes, when an answer carries rate-limit headers that
//!   show room (`Remaining` above 0, a limit or a policy: adaptive mode paces from those), or
//!   when the allowance covers every caller still waiting for a slot.
//!
//! Against an upstream that has recovered, `n` waiters are all sent within
//! `(⌈log2(n + 1)⌉ - 1) r` of the pause's end (15 within `3 r`, 100 within `6 r`); against one
//! that serves a call per `r`, the slow start is refused once, when it first tries two per
//! `r`, and then keeps to one per `r`. The cost of the rule: an upstream that refused at `2k`
//! per `r` for a moment is held to `k` per `r` until the callers waiting are all sent.
//!
//! Where no `r` is known (a new upstream in adaptive mode with no quota, a refusal with no wait
//! or `Retry-After: 0`, `Remaining: 0`), callers go through a *window* of calls in flight: one
//! at first, one more for each plain answer (so it doubles each round trip), open when an
//! answer shows room or the window exceeds the number waiting.
//!
//! Every wait the upstream imposes (a pause, a learned limit's slot, a slow start's slot, a
//! full window) ends by the caller's *hold limit* (`hold_until`): the call's start plus
//! `max_pause` for a first attempt, the retry's earliest time plus `max_pause` for a retry.
//! Only a configured quota's slot, the application's own setting, may be later.

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

/// The slow start after a refusal whose pause was `r`: `allowance` calls per `r`.
#[derive(Debug)]
struct Ramp {
    /// The refusal's pause, µs (at least 1).
    r: u64,
    allowance: u32,
    /// Whether a refusal during this slow start stopped the doubling.
    capped: bool,
    /// Start of the current interval of `r` (clock µs).
    since: u64,
    /// The next free slot (clock µs).
    next: u64,
    /// When the allowance exceeded the number waiting: the slot from which everyone goes.
    open_from: Option<u64>,
}

impl Ramp {
    /// One call per `r` from `at`.
    fn new(r: u64, at: u64) -> Self {
        Self {
            r,
            allowance: 1,
            capped: false,
            since: at,
            next: at,
            open_from: None,
        }
    }
}

/// The most calls per `r` a slow start counts to before it opens anyway.
const MAX_ALLOWANCE: u32 = 1 << 20;

#[derive(Debug, Default)]
struct Upstream {
    configured: GcraState,
    learned: Learned,
    /// Clock time (µs) before which nothing is sent.
    paused_until: u64,
    /// Whether callers go through the window of calls in flight: from a refusal with no
    /// known pause or `Remaining: 0` (and, in adaptive mode with no quota, from the start)
    /// until an answer shows room or the window exceeds the number waiting.
    gated: bool,
    /// How many calls may be in flight while gated: 1, then one more per plain answer.
    window: u32,
    /// Calls let through the window and not answered yet.
    in_flight: u32,
    /// The slow start after a refusal with a pause.
    ramp: Option<Ramp>,
    /// Bumped by each refusal (or `Remaining: 0`) that starts or changes the gate or the slow
    /// start: a reservation made before it is made again, and a refusal of a call sent before
    /// it does not halve the allowance a second time.
    epoch: u64,
    /// Callers in [`Schedule::acquire_within`].
    waiting: u32,
    /// Of them, those holding a slot reserved in this epoch: `waiting - held` still need one.
    held: u32,
    /// Woken when an answer comes or a call in the window ends.
    wake: Arc<Notify>,
    last_used: u64,
    /// First attempts and retries over the retry budget's window.
    budget: BudgetWindow,
}

/// A caller's place in an upstream's schedule. Dropped before [`commit`](Self::commit), it
/// gives its slots back; dropped at all, it gives back its place in the window.
#[derive(Debug)]
pub(crate) struct Reservation {
    schedule: Arc<Schedule>,
    key: String,
    /// When the caller may send (clock µs).
    at: u64,
    configured_at: Option<u64>,
    /// (generation, slot) of each learned limit's reservation.
    learned_at: Option<(u64, Vec<u64>)>,
    /// Whether this caller holds a place in the window of calls in flight.
    probe: bool,
    /// The slow start's spacing this slot took, µs, if it was paced.
    paced: Option<u64>,
    /// The slow start's allowance (calls per `r`) this slot was reserved at, if any.
    allowance: Option<u32>,
    /// The upstream's epoch when the slot was reserved.
    epoch: u64,
    /// Whether it is counted in the upstream's `held`.
    held: bool,
    committed: bool,
}

impl Reservation {
    /// The slot was used: nothing is given back.
    pub(crate) fn commit(&mut self) {
        self.committed = true;
        if std::mem::take(&mut self.held) {
            self.schedule.unhold(&self.key, self.epoch);
        }
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
    /// The window of calls in flight is full: wait for an answer.
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

    /// The longest wait an upstream can impose, µs.
    pub(crate) fn max_pause_micros(&self) -> u64 {
        micros(self.config.max_pause)
    }

    /// Waits for `key`'s next slot from clock time `not_before` on (a retry's backoff) and
    /// returns it, reserved; or `None`, with nothing reserved, when the slot would be after
    /// `deadline`. Pauses, learned limits, the slow start and the window hold the caller until
    /// `hold_until` at the latest (a configured quota's slot may be later). Cancellation-safe:
    /// dropped while waiting, the slot is given back.
    pub(crate) async fn acquire_within(
        self: &Arc<Self>,
        key: &str,
        not_before: u64,
        hold_until: u64,
        deadline: u64,
    ) -> Option<Reservation> {
        let _waiting = Waiting::enter(self, key);
        loop {
            match self.admit(key, not_before, hold_until) {
                Admit::Probe(wake) => {
                    let notified = wake.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    if self.window_full(key) {
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
                    // (up to its hold limit); a refusal that gated the upstream or restarted
                    // its slow start meanwhile makes it reserve again.
                    let now = self.now();
                    let limit = hold_until.max(now.max(not_before));
                    let (paused_until, epoch) = self.hold(key);
                    let stale = epoch != reservation.epoch && now < hold_until;
                    if paused_until.min(limit) > reservation.at.max(now) || stale {
                        drop(reservation);
                        continue;
                    }
                    return Some(reservation);
                }
            }
        }
    }

    /// `key`'s entry, made (evicting another if the map is full) if it is new.
    fn entry<'a>(
        &self,
        map: &'a mut HashMap<String, Upstream>,
        key: &str,
        now: u64,
    ) -> &'a mut Upstream {
        if !map.contains_key(key) && map.len() >= self.config.max_upstreams {
            evict(map, now);
        }
        let up = map.entry(key.to_owned()).or_insert_with(|| Upstream {
            gated: self.config.adaptive && self.config.configured.is_none(),
            window: 1,
            ..Upstream::default()
        });
        up.last_used = now;
        up
    }

    fn admit(self: &Arc<Self>, key: &str, not_before: u64, hold_until: u64) -> Admit {
        let now = self.now();
        let mut map = self.upstreams.lock();
        let up = self.entry(&mut map, key, now);
        let mut probe = false;
        if up.gated {
            if up.window > up.waiting {
                up.gated = false;
            } else if up.in_flight < up.window {
                up.in_flight += 1;
                probe = true;
            } else if now < hold_until {
                return Admit::Probe(up.wake.clone());
            }
        }
        let base = now.max(not_before);
        // The latest a pause, a slow start or a learned limit may hold this caller.
        let limit = hold_until.max(base);
        let mut t = base.max(up.paused_until.min(limit));
        let mut paced = None;
        let mut allowance = None;
        if up
            .ramp
            .as_ref()
            .is_some_and(|r| r.open_from.is_some_and(|o| o <= now))
        {
            up.ramp = None;
        }
        if let Some(ramp) = &mut up.ramp {
            t = t.max(ramp.next.min(limit));
            if let Some(open) = ramp.open_from {
                // Open from then on: everyone after the last paced slot.
                t = t.max(open.min(limit));
                allowance = Some(ramp.allowance);
            } else {
                if t >= ramp.since.saturating_add(ramp.r) {
                    let intervals = (t - ramp.since) / ramp.r;
                    ramp.since += intervals * ramp.r;
                    if !ramp.capped {
                        let doublings = u32::try_from(intervals.min(21)).unwrap_or(21);
                        ramp.allowance = ramp
                            .allowance
                            .saturating_mul(1 << doublings)
                            .min(MAX_ALLOWANCE);
                    }
                }
                allowance = Some(ramp.allowance);
                // This caller included: those still without a slot.
                let unslotted = up.waiting.saturating_sub(up.held);
                if ramp.allowance >= unslotted || ramp.allowance >= MAX_ALLOWANCE {
                    ramp.open_from = Some(t);
                } else {
                    let step = (ramp.r / u64::from(ramp.allowance)).max(1);
                    ramp.next = ramp.next.max(t.saturating_add(step));
                    paced = Some(step);
                }
            }
        }
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
        up.held = up.held.saturating_add(1);
        Admit::Slot(Reservation {
            schedule: self.clone(),
            key: key.to_owned(),
            at: t,
            configured_at,
            learned_at,
            probe,
            paced,
            allowance,
            epoch: up.epoch,
            held: true,
            committed: false,
        })
    }

    /// Whether `key` is gated with its window of calls in flight full.
    fn window_full(&self, key: &str) -> bool {
        self.upstreams
            .lock()
            .get(key)
            .is_some_and(|u| u.gated && u.in_flight >= u.window && u.window <= u.waiting)
    }

    /// A slot reserved in `epoch` was used or given up.
    fn unhold(&self, key: &str, epoch: u64) {
        if let Some(up) = self.upstreams.lock().get_mut(key)
            && up.epoch == epoch
        {
            up.held = up.held.saturating_sub(1);
        }
    }

    /// When `key`'s pause ends, and its epoch.
    fn hold(&self, key: &str) -> (u64, u64) {
        self.upstreams
            .lock()
            .get(key)
            .map_or((0, 0), |u| (u.paused_until, u.epoch))
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

    /// Gives back an unsent reservation's slots, and its place in the window.
    fn release(&self, r: &Reservation) {
        let now = self.now();
        let mut map = self.upstreams.lock();
        let Some(up) = map.get_mut(&r.key) else {
            return;
        };
        if r.held && r.epoch == up.epoch {
            up.held = up.held.saturating_sub(1);
        }
        if !r.committed {
            if let (Some(gcra), Some(at)) = (&self.config.configured, r.configured_at) {
                gcra.refund(&mut up.configured, at, now, 1);
            }
            if let Some((generation, slots)) = &r.learned_at
                && *generation == up.learned.generation
            {
                for (l, &at) in up.learned.limits.iter_mut().zip(slots) {
                    l.gcra.refund(&mut l.state, at, now, 1);
                }
            }
            // The slow start's last slot, unused, is the next one again.
            if let (Some(step), Some(ramp)) = (r.paced, &mut up.ramp)
                && r.epoch == up.epoch
                && ramp.next == r.at.saturating_add(step)
            {
                ramp.next = r.at;
            }
        }
        if r.probe {
            up.in_flight = up.in_flight.saturating_sub(1);
            up.wake.notify_waiters();
        }
    }

    /// Records what the upstream said about the call `sent`: pauses the key when it asked to
    /// wait (or has nothing left until its reset); after a refusal with a pause, releases the
    /// waiters in a slow start, and after one with no pause or `Remaining: 0` through the
    /// window (see the [module docs](self)); opens both when the answer shows room; learns the
    /// upstream's limits in adaptive mode.
    pub(crate) fn observe(&self, sent: &Reservation, signal: &UpstreamSignal) {
        let now = self.now();
        let mut map = self.upstreams.lock();
        let Some(up) = map.get_mut(&sent.key) else {
            return;
        };
        let key = &sent.key;
        let exhausted = signal.remaining() == Some(0);
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
        let room = signal.limit().is_some()
            || signal.remaining().is_some()
            || !signal.policies().is_empty();
        if signal.refused() || exhausted {
            // A call sent before the last refusal changed the schedule says nothing new about
            // it: its pause counts, the allowance is not halved again (nor, below, does its
            // room open the schedule the refusal set).
            if sent.epoch == up.epoch {
                up.epoch += 1;
                up.held = 0;
                let r = pause.map_or(0, |p| micros(p.min(self.config.max_pause)));
                if signal.refused() && r > 0 {
                    let at = up.paused_until;
                    match (&mut up.ramp, sent.allowance) {
                        // Refused at 2 or more per r (the slow start had doubled): half that,
                        // and no more doubling.
                        (Some(ramp), Some(sent_at)) if sent_at > 1 => {
                            ramp.allowance = sent_at / 2;
                            ramp.capped = true;
                            ramp.open_from = None;
                            ramp.r = r;
                            ramp.since = at;
                            ramp.next = at;
                        }
                        // A first refusal, or one at 1 per r (the upstream is still closed):
                        // start again at 1 per r.
                        _ => up.ramp = Some(Ramp::new(r, at)),
                    }
                    up.gated = false;
                } else {
                    up.ramp = None;
                    up.gated = true;
                    up.window = 1;
                }
            }
        } else if room && sent.epoch == up.epoch {
            up.gated = false;
            up.ramp = None;
        } else if up.gated {
            up.window = up.window.saturating_add(1);
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

/// Counts a caller as waiting for `key` while it lives.
struct Waiting<'a> {
    schedule: &'a Schedule,
    key: &'a str,
}

impl<'a> Waiting<'a> {
    fn enter(schedule: &'a Schedule, key: &'a str) -> Self {
        let now = schedule.now();
        let mut map = schedule.upstreams.lock();
        let up = schedule.entry(&mut map, key, now);
        up.waiting = up.waiting.saturating_add(1);
        Self { schedule, key }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(up) = self.schedule.upstreams.lock().get_mut(self.key) {
            up.waiting = up.waiting.saturating_sub(1);
        }
    }
}

/// Makes room for one more upstream: drops those idle for a minute, not paused and with no
/// caller waiting or in flight, or if none, the least recently used one with none.
fn evict(map: &mut HashMap<String, Upstream>, now: u64) {
    const IDLE: u64 = 60_000_000;
    let busy = |u: &Upstream| u.in_flight > 0 || u.waiting > 0;
    let before = map.len();
    map.retain(|_, u| busy(u) || u.paused_until > now || u.last_used.saturating_add(IDLE) > now);
    if map.len() < before {
        return;
    }
    if let Some(oldest) = map
        .iter()
        .filter(|(_, u)| !busy(u))
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

    /// `r` sent and answered with `signal`.
    fn answered(s: &Arc<Schedule>, mut r: Reservation, signal: &UpstreamSignal) {
        r.commit();
        s.observe(&r, signal);
    }

    /// `n` callers counted as waiting for `key`.
    fn waiting<'a>(s: &'a Schedule, key: &'a str, n: usize) -> Vec<Waiting<'a>> {
        (0..n).map(|_| Waiting::enter(s, key)).collect()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> UpstreamSignal {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        UpstreamSignal::from_headers(StatusCode::OK, &h, 0)
    }

    #[test]
    fn a_pause_moves_new_slots_behind_it() {
        let clock = ManualClock::new();
        let s = schedule(Some(Quota::per_second(10).burst(1)), &clock);
        answered(&s, slot(&s, "a"), &refused("2"));
        assert_eq!(s.pause_left("a"), Duration::from_secs(2));
        assert!(slot(&s, "a").at >= 2_000_000);
        clock.advance(Duration::from_millis(500));
        assert_eq!(s.pause_left("a"), Duration::from_millis(1_500));
        // Longer than max_pause is cut to it.
        answered(&s, slot(&s, "a"), &refused("3600"));
        assert_eq!(s.pause_left("a"), Duration::from_secs(60));
    }

    #[test]
    fn a_new_upstream_goes_through_a_window_that_grows_with_each_plain_answer() {
        let clock = ManualClock::new();
        let s = schedule(None, &clock);
        let _w = waiting(&s, "a", 10);
        let probe = slot(&s, "a");
        assert!(probe.probe);
        assert!(matches!(s.admit("a", 0, u64::MAX), Admit::Probe(_)));
        // A plain answer shows room for one more call in flight.
        answered(&s, probe, &UpstreamSignal::default());
        let (a, b) = (slot(&s, "a"), slot(&s, "a"));
        assert!(a.probe && b.probe);
        assert!(matches!(s.admit("a", 0, u64::MAX), Admit::Probe(_)));
        // Past its hold limit, a caller goes without waiting for the window.
        assert!(matches!(s.admit("a", 0, 0), Admit::Slot(r) if !r.probe));
        // An answer with rate-limit headers that show room opens it.
        answered(&s, a, &headers(&[("x-ratelimit-remaining", "5")]));
        drop(b);
        assert!(!slot(&s, "a").probe);
        // A probe dropped unanswered lets the next caller in.
        let _w = waiting(&s, "b", 10);
        let probe = slot(&s, "b");
        drop(probe);
        assert!(slot(&s, "b").probe);
    }

    #[test]
    fn a_window_wider_than_the_callers_waiting_opens() {
        let clock = ManualClock::new();
        let s = schedule(None, &clock);
        let w = waiting(&s, "a", 1);
        answered(&s, slot(&s, "a"), &UpstreamSignal::default());
        // Window 2, one caller waiting: open.
        assert!(!slot(&s, "a").probe);
        drop(w);
    }

    #[test]
    fn after_a_refusal_the_waiters_go_in_a_slow_start() {
        let clock = ManualClock::new();
        let s = schedule(Some(Quota::per_second(1000)), &clock);
        let _w = waiting(&s, "a", 20);
        answered(&s, slot(&s, "a"), &refused("1"));
        // 1 per second, then 2, 4, 8: r / allowance apart.
        let slots: Vec<_> = (0..8).map(|_| slot(&s, "a")).collect();
        let at: Vec<u64> = slots.iter().map(|r| r.at).collect();
        assert_eq!(
            at,
            [
                1_000_000, 2_000_000, 2_500_000, 3_000_000, 3_250_000, 3_500_000, 3_750_000,
                4_000_000
            ]
        );
    }

    #[test]
    fn a_refusal_during_the_slow_start_halves_it_and_stops_the_doubling() {
        let clock = ManualClock::new();
        let s = schedule(None, &clock);
        let _w = waiting(&s, "a", 20);
        answered(&s, slot(&s, "a"), &refused("1"));
        let first = slot(&s, "a");
        let second = slot(&s, "a");
        let third = slot(&s, "a");
        assert_eq!(
            (first.at, second.at, third.at),
            (1_000_000, 2_000_000, 2_500_000)
        );
        drop(first);
        clock.advance(Duration::from_millis(2_500));
        // The call at 2 per second is refused: 1 per second from the pause's end on, for good.
        answered(&s, third, &refused("1"));
        drop(second);
        let slots: Vec<_> = (0..4).map(|_| slot(&s, "a")).collect();
        let at: Vec<u64> = slots.iter().map(|r| r.at).collect();
        assert_eq!(at, [3_500_000, 4_500_000, 5_500_000, 6_500_000]);
    }

    #[test]
    fn a_refusal_at_one_per_pause_starts_again_and_room_opens_the_slow_start() {
        let clock = ManualClock::new();
        let s = schedule(None, &clock);
        let _w = waiting(&s, "a", 20);
        answered(&s, slot(&s, "a"), &refused("1"));
        let first = slot(&s, "a");
        clock.advance(Duration::from_secs(1));
        // Still closed: it starts again at 1 per second, still doubling.
        answered(&s, first, &refused("1"));
        let slots: Vec<_> = (0..3).map(|_| slot(&s, "a")).collect();
        let at: Vec<u64> = slots.iter().map(|r| r.at).collect();
        assert_eq!(at, [2_000_000, 3_000_000, 3_500_000]);
        // Headers that show room: everyone goes at once when the pause ends.
        answered(
            &s,
            slot(&s, "a"),
            &headers(&[("x-ratelimit-remaining", "9")]),
        );
        let (a, b) = (slot(&s, "a"), slot(&s, "a"));
        assert_eq!((a.at, b.at), (2_000_000, 2_000_000));
    }

    #[test]
    fn a_slow_start_that_covers_everyone_waiting_opens() {
        let clock = ManualClock::new();
        let s = schedule(None, &clock);
        let w = waiting(&s, "a", 3);
        answered(&s, slot(&s, "a"), &refused("1"));
        let slots: Vec<_> = (0..3).map(|_| slot(&s, "a")).collect();
        let at: Vec<u64> = slots.iter().map(|r| r.at).collect();
        // 1 at 1 s; at 2 s, 2 per second covers the 2 left: both go then.
        assert_eq!(at, [1_000_000, 2_000_000, 2_000_000]);
        drop((w, slots));
        // 100 waiting: all sent within 6 r of the pause's end (1, 2, 4, ..., 32, then the 37
        // left at 64 per r).
        let _w = waiting(&s, "b", 101);
        answered(&s, slot(&s, "b"), &refused("1"));
        let slots: Vec<_> = (0..100).map(|_| slot(&s, "b")).collect();
        assert_eq!(slots.iter().map(|r| r.at).max(), Some(7_000_000));
        assert_eq!(slots.iter().filter(|r| r.at == 7_000_000).count(), 37);
    }

    #[test]
    fn a_learned_slot_and_a_pause_hold_a_caller_until_its_hold_limit_at_most() {
        let clock = ManualClock::new();
        let s = schedule(None, &clock);
        let yearly = headers(&[("ratelimit-policy", r#""q";q=1;w=31536000"#)]);
        answered(&s, slot(&s, "a"), &yearly);
        slot(&s, "a").commit();
        let r = match s.admit("a", 0, 60_000_000) {
            Admit::Slot(r) => r,
            Admit::Probe(_) => panic!("probe"),
        };
        assert_eq!(r.at, 60_000_000, "a year's slot, cut to the hold limit");
        answered(&s, r, &refused("3600"));
        match s.admit("a", 0, 5_000_000) {
            Admit::Slot(r) => assert_eq!(r.at, 5_000_000),
            Admit::Probe(_) => panic!("the window has room for this caller"),
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
