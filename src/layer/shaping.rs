//! Shaping: a request that does not fit its limit now waits until it does, up to a
//! `max_wait`, instead of being refused.
//!
//! Shaping needs no second algorithm. The token bucket, GCRA and the leaky bucket keep one
//! schedule per key (GCRA's theoretical arrival time; the buckets' deficit is the same number
//! read from the other end), and a request that does not fit has a
//! [`retry_after`](crate::Decision::retry_after): the moment its units will have been emitted.
//! A shaped limit lets the store *reserve* that future moment: the store decides it at a
//! tolerance widened by the `max_wait` (the quota's burst plus the units the rate emits in
//! `max_wait`), so a request that would wait no longer than `max_wait` is admitted and charged
//! now, and the schedule moves on past it. The layer reads from the decision how far past the
//! limit's own burst the request landed, which is how long it must wait, and the response
//! future sleeps that long (one `tokio::time::Sleep`, no task, no queue structure) before it
//! calls the inner service.
//!
//! Everything else follows from the schedule:
//! - **first come, first served per key**: each reservation lands after the previous one;
//! - **the same on every backend**: the store does what it always does at a larger burst, so a
//!   Redis store shares one schedule between instances with no change to its scripts;
//! - **bounded per key**: at most `max_wait × rate` units (or [`Shape::max_queued`]) wait per
//!   key, enforced by the store itself;
//! - **cancellation-safe**: a waiting request that is dropped frees exactly its own place. The
//!   layer tracks places per schedule as the store keeps them (one per limit and key, whatever
//!   the requests' costs and other limits). The next request of that schedule with the same
//!   cost and no other shaped limit, arriving before the freed place is due, takes it over, and
//!   its own place, the last of the schedule, goes back to the store with [`Store::refund`]; a
//!   freed place that is (or becomes) the last of the schedule goes back to the store at once
//!   (one already due gives back only what has not refilled since its turn). So whatever is
//!   cancelled, no two requests are given the same turn (over any window, at most
//!   `burst + rate × span` units reach the service, with per-request costs too), and dropped
//!   waiters leave no place behind that nobody will use (1,000 waiters dropped in arrival
//!   order: the next request waits one interval). Refunds a networked store answers later
//!   reach it in order per schedule, a stalled call holding up only the schedules of its
//!   shard (one of 16), and at most 1,024 wait per shard: beyond, a place stays spent (the
//!   store refuses more, never admits more; a warning is logged). Places are tracked by the
//!   layer that reserved them, which holds a freed place back while a request of its key is
//!   at the store. With several
//!   instances sharing a Redis schedule, a place freed on one instance is taken over only by
//!   that instance's requests, and given back to Redis when it is that instance's last place,
//!   which may not be the shared schedule's last: then one later request may share its turn
//!   with another instance's waiting request (one admission over the rate per such place).
//!
//! The windows (fixed, sliding, log) have no schedule to reserve a place in: their units come
//! back all at once at a window's edge, so every waiter would be released together. Shaping
//! them is refused when the layer is built.
//!
//! # Examples
//!
//! One request every 100 ms; the others wait their turn, up to 1 s (time is tokio's paused
//! clock here, which the store reads through [`TokioClock`](crate::clock::TokioClock)):
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::clock::TokioClock;
//! use tollgate::key::GlobalKey;
//! use tollgate::layer::ShapedDelay;
//! use tollgate::store::MemoryBackend;
//! use tollgate::{AlgorithmKind, Limit, Quota, RateLimitLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .backend(MemoryBackend::new().clock(TokioClock::new()))
//!     .limit(
//!         Limit::new("smooth", Quota::per_second(10).burst(1))
//!             .algorithm(AlgorithmKind::Gcra)
//!             .key(GlobalKey)
//!             .shape(Duration::from_secs(1)),
//!     )
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(String::new()))
//! }));
//! let waits: Vec<_> = (0..3).map(|_| tokio::spawn(svc.clone().oneshot(Request::new(())))).collect();
//! let mut delays = Vec::new();
//! for w in waits {
//!     let res = w.await??;
//!     assert_eq!(res.status(), StatusCode::OK);
//!     delays.push(res.extensions().get::<ShapedDelay>().map(|d| d.get().as_millis()));
//! }
//! assert_eq!(delays, [None, Some(100), Some(200)]);
//! # Ok(())
//! # }
//! ```
//!
//! A bound per key, and what happens beyond `max_wait`: refused as without shaping.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::key::GlobalKey;
//! use tollgate::layer::Shape;
//! use tollgate::{Limit, Quota, RateLimitLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A slow rate: one a minute, at most one waiting.
//! let layer = RateLimitLayer::new(
//!     Limit::new("slow", Quota::per_minute(1))
//!         .key(GlobalKey)
//!         .shape(Shape::new(Duration::from_secs(600)).max_queued(1)),
//! )?;
//! let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(String::new()))
//! }));
//! assert_eq!(svc.clone().oneshot(Request::new(())).await?.status(), StatusCode::OK);
//! let _waiting = tokio::spawn(svc.clone().oneshot(Request::new(())));
//! tokio::task::yield_now().await;
//! let refused = svc.clone().oneshot(Request::new(())).await?;
//! assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::mem;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{Request, Response};
use tokio::sync::mpsc;

use super::layer::Snapshot;
use super::service::OwnedCheck;
use crate::algorithm::AlgorithmKind;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::key::Key;
use crate::quota::Quota;
use crate::response::{RejectReason, Rejected, RejectionBody};
use crate::store::{Checked, Decisions, LimitCheck, Store};

/// The default bound on requests waiting in one layer, across keys
/// ([`RateLimitLayerBuilder::max_waiting`](crate::RateLimitLayerBuilder::max_waiting)).
pub const DEFAULT_MAX_WAITING: usize = 10_000;

/// How a [`Limit`](crate::Limit) shapes: how long a request may wait for its turn, and how
/// many units may wait per key. `Duration` converts into it.
///
/// ```
/// use std::time::Duration;
/// use tollgate::key::PeerIp;
/// use tollgate::layer::Shape;
/// use tollgate::{AlgorithmKind, Limit, Quota};
///
/// // Ten per second per client: a request beyond the burst waits up to 2 s for its turn, with
/// // at most 5 waiting per client; beyond either it is refused as usual.
/// let limit = Limit::new("smooth", Quota::per_second(10))
///     .algorithm(AlgorithmKind::Gcra)
///     .key(PeerIp::new())
///     .shape(Shape::new(Duration::from_secs(2)).max_queued(5));
/// # let _ = limit;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    max_wait: Duration,
    max_queued: Option<u64>,
}

impl Shape {
    /// Requests wait up to `max_wait` for their turn.
    pub const fn new(max_wait: Duration) -> Self {
        Self {
            max_wait,
            max_queued: None,
        }
    }

    /// At most `units` (requests, at a cost of 1) wait per key; beyond, a request is refused
    /// even if it would wait less than `max_wait`. By default `max_wait × rate` units wait.
    #[must_use]
    pub const fn max_queued(mut self, units: u64) -> Self {
        self.max_queued = Some(units);
        self
    }

    /// The longest a request waits.
    pub const fn max_wait(&self) -> Duration {
        self.max_wait
    }
}

impl From<Duration> for Shape {
    fn from(max_wait: Duration) -> Self {
        Self::new(max_wait)
    }
}

/// How long a shaped request waited for its turn: in the request's extensions (for the handler)
/// and in the response's (for outer middleware). Absent when the request did not wait.
///
/// ```
/// use std::time::Duration;
/// use tollgate::layer::ShapedDelay;
///
/// let waited = ShapedDelay::new(Duration::from_millis(100));
/// assert_eq!(waited.get(), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShapedDelay(Duration);

impl ShapedDelay {
    /// A delay of `delay`.
    pub const fn new(delay: Duration) -> Self {
        Self(delay)
    }

    /// The delay.
    pub const fn get(&self) -> Duration {
        self.0
    }
}

/// A limit's shaping, compiled against its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompiledShape {
    /// Units the store's tolerance is widened by: the most that wait per key.
    extra: u64,
    /// The limit's own burst.
    burst: u64,
    /// The limit's own burst takes this long to refill, rounded down (µs).
    full_us: u64,
}

/// Builds the shaping of a limit of `quota` with `algorithm`, or says why it cannot shape.
pub(crate) fn compile(
    shape: &Shape,
    quota: &Quota,
    algorithm: AlgorithmKind,
) -> Result<CompiledShape, ConfigError> {
    match algorithm {
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => {}
        other => {
            return Err(ConfigError::new(
                "limit.shape",
                format!(
                    "{other} cannot shape: its units come back all at once at a window's edge, so there is no later slot to reserve and wait for; use gcra, token_bucket or leaky_bucket, or drop .shape(..)"
                ),
            ))
        }
    }
    let period_us = u128::from(quota.period_micros());
    let count = u128::from(quota.count());
    let interval = Duration::from_micros(u64::try_from(period_us / count.max(1)).unwrap_or(0));
    let fits = (shape.max_wait.as_micros().saturating_mul(count) / period_us.max(1)) as u64;
    let extra = match shape.max_queued {
        Some(0) => {
            return Err(ConfigError::new(
                "limit.shape.max_queued",
                "a queue of 0 units lets nobody wait; drop .shape(..) to refuse at once, or allow at least 1",
            ))
        }
        Some(n) => fits.min(n),
        None => fits,
    };
    if extra == 0 {
        return Err(ConfigError::new(
            "limit.shape.max_wait",
            format!(
                "a max_wait of {:?} is shorter than one unit's interval at {quota} ({interval:?}), so no request could wait; raise max_wait to at least {interval:?}, or drop .shape(..)",
                shape.max_wait
            ),
        ));
    }
    let burst = quota.burst_size();
    let widened = widen_quota(quota, extra)?;
    algorithm.validate(&widened).map_err(|e| {
        ConfigError::new(
            "limit.shape.max_wait",
            format!(
                "waiting up to {:?} makes the store's tolerance {widened}, which it cannot hold ({}); lower max_wait or max_queued",
                shape.max_wait,
                e.message()
            ),
        )
    })?;
    let full_us = u64::try_from(u128::from(burst) * period_us / count.max(1)).unwrap_or(u64::MAX);
    Ok(CompiledShape {
        extra,
        burst,
        full_us,
    })
}

fn widen_quota(quota: &Quota, extra: u64) -> Result<Quota, ConfigError> {
    let burst = quota.burst_size().checked_add(extra).ok_or_else(|| {
        ConfigError::new(
            "limit.shape.max_wait",
            "max_wait overflows the quota's burst; lower it",
        )
    })?;
    Ok(quota.burst(burst))
}

impl CompiledShape {
    /// The quota the store decides this limit at: the burst plus what may wait.
    pub(crate) fn widen(&self, quota: &Quota) -> Quota {
        widen_quota(quota, self.extra).unwrap_or(*quota)
    }

    /// How long an allowed request with decision `d` (in the limit's own terms, or at the
    /// widened quota: the reset is the same) waits for its turn in this limit's schedule.
    pub(crate) fn wait(&self, d: &Decision) -> Duration {
        d.reset()
            .saturating_sub(Duration::from_micros(self.full_us))
    }

    /// Turns a decision at the widened quota into the limit's own terms, and says how long an
    /// allowed request must wait for its turn (zero when it fits now).
    ///
    /// The wait is how far the key's schedule lies past the limit's own burst once this
    /// request is charged: `reset − burst / rate`. Rounded up to the microsecond, it is never
    /// shorter than the exact wait.
    ///
    /// A decision the store did not count (failure policy `Open`) stays uncounted: the request
    /// goes at once, and shows no numbers.
    pub(crate) fn unwiden(&self, d: Decision) -> (Decision, Duration) {
        if !d.is_counted() {
            return (Decision::uncounted(self.burst), Duration::ZERO);
        }
        let remaining = d.remaining().saturating_sub(self.extra);
        if d.allowed() {
            let shown = Decision::allowed_with(self.burst, remaining, d.reset());
            (shown, self.wait(&shown))
        } else if d.is_impossible() {
            (
                Decision::impossible(self.burst, remaining, d.reset()),
                Duration::ZERO,
            )
        } else {
            // The wait until the request could take a place in the queue.
            let retry = d.retry_after().unwrap_or_default();
            (
                Decision::rejected(self.burst, remaining, d.reset(), retry),
                Duration::ZERO,
            )
        }
    }
}

/// The bound on requests waiting in one layer, across keys, and the places they hold.
#[derive(Debug)]
pub(crate) struct Waiting {
    count: Arc<AtomicUsize>,
    max: usize,
    schedules: Arc<Schedules>,
}

impl Waiting {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            count: Arc::new(AtomicUsize::new(0)),
            max,
            schedules: Arc::new(Schedules::new()),
        }
    }

    /// A place among the waiting requests, if one is free.
    fn enter(&self) -> Option<WaitSlot> {
        let mut n = self.count.load(Ordering::Relaxed);
        loop {
            if n >= self.max {
                return None;
            }
            match self
                .count
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(WaitSlot(Arc::clone(&self.count))),
                Err(now) => n = now,
            }
        }
    }
}

/// One place among a layer's waiting requests; given back on drop.
struct WaitSlot(Arc<AtomicUsize>);

impl Drop for WaitSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Which schedule a place is in: one shaped limit and key, as the store keeps one schedule per
/// limit and key (whatever the costs of its requests, and whatever other limits they have).
type ScheduleKey = (usize, Key<'static>);

/// One shard of [`Schedules`]: the schedules whose keys hash to it.
type Shard = HashMap<ScheduleKey, Schedule>;

/// A refund the store answers later: the call to wait for.
type PendingRefund = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Gives a place's charge back to the store; returns the call to wait for when the store
/// answers later.
type Refund = Box<dyn FnOnce() -> Option<PendingRefund> + Send>;

/// Refunds the store answers later that wait, per lane, for the ones before them; beyond, a
/// refund is dropped (its units stay spent: the store refuses more, never admits more).
const LANE_CAPACITY: usize = 1_024;

/// One place in a key's schedule that a request of this layer reserved.
struct Place {
    id: u64,
    /// When it is due (the store's clock, µs).
    turn: u64,
    /// The units it holds: it is taken over only by a request of the same cost, so that the
    /// store's schedule stays exactly as it was.
    cost: u64,
    /// Whether a waiting request holds it; a place whose request was dropped is free, and is
    /// either taken over by the next request of the same key and cost or, once it is the
    /// schedule's last place, given back to the store.
    held: bool,
    /// Gives exactly this place back (its check, refunded at its turn).
    refund: Refund,
}

/// What this layer knows of one key's schedule.
#[derive(Default)]
struct Schedule {
    /// The places its waiting requests hold or freed, in turn order.
    places: Vec<Place>,
    /// Requests of this schedule the store is deciding: each may be given a place after the
    /// last one known here, so no free place is given back to the store meanwhile (it might
    /// not be the store's last).
    deciding: usize,
}

impl Schedule {
    /// Removes the free places at the end, last first, collecting their refunds, unless a
    /// request is being decided: each is then the store's last place when it is given back, so
    /// the store's schedule ends exactly one place earlier each time. A free place already due
    /// goes back the same way: its refund gives back only what has not refilled since its turn.
    fn pop_free_tail(&mut self, refunds: &mut Vec<Refund>) {
        if self.deciding > 0 {
            return;
        }
        while self.places.last().is_some_and(|p| !p.held) {
            if let Some(place) = self.places.pop() {
                refunds.push(place.refund);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.places.is_empty() && self.deciding == 0
    }
}

/// One lane of refunds a networked store answers later (see [`Schedules::send`]).
type Lane = Mutex<Option<mpsc::Sender<PendingRefund>>>;

/// The places this layer's waiting requests reserved, per schedule (limit and key), in turn
/// order.
///
/// The store keeps one schedule per limit and key, whose end (GCRA's theoretical arrival time,
/// the buckets' deficit) is all it knows: giving back a place that is not the last one would
/// move the end back under places still held, so that the next request is given the turn of a
/// request still waiting (two where the rate allows one). So a dropped request's place is
/// given back to the store only once every place after it is free too (and no request of the
/// key is being decided, which could be given a later place); until then it is free here, and
/// the next request of the same key and cost takes it over (and gives the store back its own
/// place, the last one).
pub(crate) struct Schedules {
    shards: Box<[Mutex<Shard>]>,
    next_id: AtomicU64,
    /// Refunds a networked store answers later, one lane per shard: each lane's task waits for
    /// its refunds in the order they were sent, so a schedule's places reach the store last
    /// first (GCRA gives back a place only while it is the schedule's last), while a stalled
    /// call holds up only the schedules of its shard. Each lane holds at most
    /// [`LANE_CAPACITY`] refunds.
    lanes: Box<[Lane]>,
    /// Refunds dropped because their lane was full.
    dropped: AtomicU64,
}

impl fmt::Debug for Schedules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedules").finish_non_exhaustive()
    }
}

/// Shards of [`Schedules`]: requests of different keys rarely contend.
const SCHEDULE_SHARDS: usize = 16;

impl Schedules {
    fn new() -> Self {
        Self {
            shards: (0..SCHEDULE_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            next_id: AtomicU64::new(0),
            lanes: (0..SCHEDULE_SHARDS).map(|_| Mutex::new(None)).collect(),
            dropped: AtomicU64::new(0),
        }
    }

    /// Runs `refunds` (of schedules of shard `shard`) in order: those the store answers at
    /// once now, the others through the shard's lane (after every refund sent to it before).
    fn run(&self, shard: usize, refunds: Vec<Refund>) {
        for refund in refunds {
            if let Some(pending) = refund() {
                self.send(shard, pending);
            }
        }
    }

    /// Sends `pending` to lane `shard`'s task, starting one on the current Tokio runtime when
    /// there is none (or the runtime it ran on is gone). A full lane drops the refund: its
    /// units stay spent.
    fn send(&self, shard: usize, pending: PendingRefund) {
        let mut lane = self.lanes[shard].lock().unwrap_or_else(|e| e.into_inner());
        let pending = match lane.as_ref() {
            Some(tx) => match tx.try_send(pending) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                    if n.is_power_of_two() || n.is_multiple_of(1000) {
                        tracing::warn!(dropped = n, "too many shaped reservations waiting to be given back to the rate-limit store; this one stays spent");
                    }
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(pending)) => pending,
            },
            None => pending,
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            *lane = None;
            tracing::warn!("no Tokio runtime to give a shaped reservation back on; it is spent");
            return;
        };
        let (tx, mut rx) = mpsc::channel::<PendingRefund>(LANE_CAPACITY);
        handle.spawn(async move {
            while let Some(refund) = rx.recv().await {
                refund.await;
            }
        });
        // The receiver was just moved into a live task, and the channel is empty.
        let _ = tx.try_send(pending);
        *lane = Some(tx);
    }

    fn shard_of(&self, key: &ScheduleKey) -> usize {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        (h.finish() as usize) % self.shards.len()
    }

    fn shard(&self, key: &ScheduleKey) -> MutexGuard<'_, Shard> {
        // A panic while holding the lock leaves the places consistent (every change is one
        // push, remove, flag or count); keep going.
        self.shards[self.shard_of(key)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// A request of schedules `keys` goes to the store: until it has its places (or is decided
    /// without them), no free place of these schedules is given back.
    pub(crate) fn deciding(self: &Arc<Self>, keys: Vec<ScheduleKey>) -> Deciding {
        for key in &keys {
            self.shard(key).entry(key.clone()).or_default().deciding += 1;
        }
        Deciding {
            schedules: Arc::clone(self),
            keys,
        }
    }

    /// Changes schedule `key` with `change`, then gives back what it freed at its end (under
    /// the shard's lock, so that a schedule's places reach the store in the order they were
    /// given back).
    fn update<R>(
        &self,
        key: &ScheduleKey,
        create: bool,
        change: impl FnOnce(&mut Schedule) -> R,
    ) -> Option<R> {
        let mut refunds = Vec::new();
        let shard = self.shard_of(key);
        let mut shards = self.shards[shard].lock().unwrap_or_else(|e| e.into_inner());
        let schedule = if create {
            shards.entry(key.clone()).or_default()
        } else {
            shards.get_mut(key)?
        };
        let out = change(schedule);
        schedule.pop_free_tail(&mut refunds);
        if schedule.is_empty() {
            shards.remove(key);
        }
        self.run(shard, refunds);
        Some(out)
    }

    /// Records the places a request was given (one per shaped check: the last of its schedule
    /// when the store decided) and returns its id and the turn it goes at. A request with one
    /// shaped check takes over an earlier free place of its schedule of the same cost due no
    /// sooner than `now`, if there is one (and its own place is given back when it is the
    /// last); otherwise every place is its own.
    fn enter(&self, mut deciding: Deciding, now: u64, entries: Vec<Entry>) -> (u64, u64) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut pending = mem::take(&mut deciding.keys);
        let take_over = entries.len() == 1;
        let mut goes_at = 0;
        for entry in entries {
            let was_deciding = match pending.iter().position(|k| *k == entry.key) {
                Some(i) => {
                    pending.swap_remove(i);
                    true
                }
                None => false,
            };
            let Entry {
                key,
                cost,
                turn,
                refund,
            } = entry;
            let taken = self.update(&key, true, |schedule| {
                if was_deciding {
                    schedule.deciding = schedule.deciding.saturating_sub(1);
                }
                let places = &mut schedule.places;
                let free = places.iter_mut().find(|p| {
                    take_over && !p.held && p.cost == cost && p.turn >= now && p.turn < turn
                });
                let (held, taken) = match free {
                    Some(place) => {
                        place.held = true;
                        place.id = id;
                        // This request's own place is free now: given back when it is the last.
                        (false, place.turn)
                    }
                    None => (true, turn),
                };
                insert(
                    places,
                    Place {
                        id: if held { id } else { u64::MAX },
                        turn,
                        cost,
                        held,
                        refund,
                    },
                );
                taken
            });
            goes_at = goes_at.max(taken.unwrap_or(turn));
        }
        // Schedules the request was decided in without a place of its own.
        deciding.keys = pending;
        drop(deciding);
        (id, goes_at)
    }

    /// The request holding place `id` of schedule `key` was dropped before its turn: its place
    /// is free.
    fn cancel(&self, key: &ScheduleKey, id: u64) {
        self.update(key, false, |schedule| {
            if let Some(place) = schedule.places.iter_mut().find(|p| p.held && p.id == id) {
                place.held = false;
            }
        });
    }

    /// The request holding place `id` of schedule `key` had its turn: the place is spent, and
    /// so are the free places before it (their time has passed: each would give back nothing,
    /// the spent place being at least their cost's interval after them).
    fn spend(&self, key: &ScheduleKey, id: u64) {
        self.update(key, false, |schedule| {
            let places = &mut schedule.places;
            if let Some(i) = places.iter().position(|p| p.held && p.id == id) {
                let turn = places[i].turn;
                places.retain(|p| (p.held && p.id != id) || p.turn > turn);
            }
        });
    }
}

/// One place a request was given in one schedule (see [`Schedules::enter`]).
struct Entry {
    key: ScheduleKey,
    cost: u64,
    turn: u64,
    refund: Refund,
}

/// A request of some schedules being decided by the store (see [`Schedules::deciding`]); ends
/// when dropped, or when the request takes its places.
pub(crate) struct Deciding {
    schedules: Arc<Schedules>,
    keys: Vec<ScheduleKey>,
}

impl fmt::Debug for Deciding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deciding").finish_non_exhaustive()
    }
}

impl Drop for Deciding {
    fn drop(&mut self) {
        for key in mem::take(&mut self.keys) {
            self.schedules.update(&key, false, |schedule| {
                schedule.deciding = schedule.deciding.saturating_sub(1);
            });
        }
    }
}

/// Inserts `place` in turn order (after places of the same turn).
fn insert(places: &mut Vec<Place>, place: Place) {
    let i = places.partition_point(|p| p.turn <= place.turn);
    places.insert(i, place);
}

/// The places a request holds in its schedules: given back (freed) on drop unless spent.
struct Held {
    schedules: Arc<Schedules>,
    keys: Vec<ScheduleKey>,
    id: u64,
}

impl Held {
    fn cancel(&self) {
        for key in &self.keys {
            self.schedules.cancel(key, self.id);
        }
    }

    fn spend(&self) {
        for key in &self.keys {
            self.schedules.spend(key, self.id);
        }
    }
}

/// What a waiting request reserved: given back unless [`release`](Self::release)d, so a
/// request dropped while it waits frees its place in the schedule for the next one.
pub(crate) struct Reservation {
    /// Its place in its key's schedule (none when the store reports no decision time).
    place: Option<Held>,
    /// Gives back what the request's other checks were charged (and, without a place, the
    /// shaped checks' charge too).
    give_back: Option<Box<dyn FnOnce() + Send>>,
    delay: Duration,
    _slot: WaitSlot,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl Reservation {
    /// How long the request waits.
    pub(crate) fn delay(&self) -> Duration {
        self.delay
    }

    /// The request's turn has come: the reservation is spent, not given back.
    pub(crate) fn release(mut self) {
        self.give_back = None;
        if let Some(place) = self.place.take() {
            place.spend();
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let place = self.place.take();
        let give_back = self.give_back.take();
        if place.is_none() && give_back.is_none() {
            return;
        }
        tracing::debug!(
            delay_ms = self.delay.as_millis() as u64,
            "shaped request dropped while waiting; its reservation is given back"
        );
        if let Some(place) = place {
            place.cancel();
        }
        if let Some(give_back) = give_back {
            give_back();
        }
    }
}

/// Gives back the charge of `checks` made at `at`; returns the store call to wait for when the
/// store answers later.
fn refund_call<St: Store>(
    snapshot: &Snapshot<St>,
    checks: &[OwnedCheck],
    at: Option<u64>,
) -> Option<PendingRefund> {
    let Some(at) = at else {
        tracing::warn!("the rate-limit store reports no decision time; a shaped request's reservation cannot be given back");
        return None;
    };
    if checks.is_empty() {
        return None;
    }
    let checks: Vec<LimitCheck<'_>> = checks.iter().map(OwnedCheck::as_check).collect();
    match snapshot.store.refund(&checks, at) {
        Checked::Ready(Ok(_)) => None,
        Checked::Ready(Err(error)) => {
            tracing::warn!(error = %error, "rate-limit store could not give a shaped reservation back");
            None
        }
        Checked::Pending(future) => Some(Box::pin(async move {
            if let Err(error) = future.await {
                tracing::warn!(error = %error, "rate-limit store could not give a shaped reservation back");
            }
        })),
    }
}

/// Gives back the charge of `checks` made at `at`, without waiting for the store.
fn give_back<St: Store>(snapshot: &Snapshot<St>, checks: &[OwnedCheck], at: Option<u64>) {
    let Some(pending) = refund_call(snapshot, checks, at) else {
        return;
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(pending);
        }
        Err(_) => {
            tracing::warn!("no Tokio runtime to give a shaped reservation back on; it is spent");
        }
    }
}

/// The schedules of a request's shaped checks.
fn schedule_keys(checks: &[OwnedCheck]) -> Vec<ScheduleKey> {
    checks.iter().map(|c| (c.limit, c.key.clone())).collect()
}

impl Waiting {
    /// Marks a request with the shaped checks `checks` as being decided by the store (see
    /// [`Schedules::deciding`]); `None` without shaped checks.
    pub(crate) fn deciding(&self, checks: &[OwnedCheck]) -> Option<Deciding> {
        if checks.is_empty() {
            return None;
        }
        Some(self.schedules.deciding(schedule_keys(checks)))
    }
}

/// Makes an allowed request that must wait `delay` wait: records its place in each shaped
/// limit's schedule, `waits` after the decision in the schedule of the limit it names (and
/// `delay` after it in the others), taking over an earlier place a dropped request freed if
/// there is one; records
/// the delay on the request and takes a place among the layer's waiting requests. When the
/// layer's bound on waiting requests is reached, frees the place, gives the other charges back
/// and answers the refusal instead. `deciding` is the request's mark from before the store
/// decided it.
// The refusal is rare (the layer bound is reached) and built once; boxing it buys nothing.
#[allow(clippy::too_many_arguments, clippy::result_large_err)]
pub(crate) fn reserve<St: Store, ReqBody>(
    waiting: &Waiting,
    rejection: &dyn crate::response::Rejection,
    snapshot: &Arc<Snapshot<St>>,
    req: &mut Request<ReqBody>,
    checks: (Vec<OwnedCheck>, Vec<OwnedCheck>),
    (at, deciding): (Option<u64>, Option<Deciding>),
    (delay, waits): (Duration, &[(usize, Duration)]),
    shaped: (&Decision, &Quota),
    decisions: &Decisions,
) -> Result<Reservation, Response<RejectionBody>> {
    let (decision, quota) = shaped;
    // The reservation's place in a shaped limit's schedule is its turn there, the wait that
    // limit gave it after the decision: a request dropped before that turn gives back its whole
    // place, however long it waited (refunded at the decision time, a wait longer than one
    // interval would read as refilled). The other limits were charged at the decision: given
    // back from then. `turn` is when the request goes (its longest wait).
    let turn = at.map(|at| at.saturating_add(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX)));
    let (shaped_checks, others) = checks;
    let snapshot = Arc::clone(snapshot);
    let (place, wait, shaped_checks) = match (at, turn) {
        (Some(at), Some(_)) if !shaped_checks.is_empty() => {
            let keys = schedule_keys(&shaped_checks);
            let deciding = match deciding {
                Some(d) if d.keys == keys => d,
                _ => waiting.schedules.deciding(keys.clone()),
            };
            // One place per shaped check, in its own limit and key's schedule, each given back
            // on its own (a check of cost 0 holds no place).
            let entries: Vec<Entry> = shaped_checks
                .into_iter()
                .filter(|c| c.cost > 0)
                .map(|check| {
                    let refund_snapshot = Arc::clone(&snapshot);
                    // Its own place in this limit's schedule: the wait this limit gave it.
                    let own = waits
                        .iter()
                        .find(|(limit, _)| *limit == check.limit)
                        .map_or(delay, |(_, w)| *w);
                    let turn =
                        at.saturating_add(u64::try_from(own.as_micros()).unwrap_or(u64::MAX));
                    Entry {
                        key: (check.limit, check.key.clone()),
                        cost: check.cost,
                        turn,
                        refund: Box::new(move || {
                            refund_call(&refund_snapshot, std::slice::from_ref(&check), Some(turn))
                        }),
                    }
                })
                .collect();
            let keys = entries.iter().map(|e| e.key.clone()).collect();
            let schedules = Arc::clone(&waiting.schedules);
            let (id, taken) = schedules.enter(deciding, at, entries);
            let wait = Duration::from_micros(taken.saturating_sub(at));
            (
                Some(Held {
                    schedules,
                    keys,
                    id,
                }),
                wait,
                Vec::new(),
            )
        }
        // No decision time: no place to keep (and nothing the store could refund).
        _ => (None, delay, shaped_checks),
    };
    let Some(slot) = waiting.enter() else {
        if let Some(place) = place {
            place.cancel();
        }
        give_back(&snapshot, &shaped_checks, turn);
        give_back(&snapshot, &others, at);
        tracing::debug!(policy = %decision.policy(), delay_ms = delay.as_millis() as u64, "too many requests waiting in this layer; shaped request refused");
        let refused = Decision::rejected(decision.limit(), 0, decision.reset(), delay)
            .with_policy(decision.policy());
        let reason = RejectReason::RateLimited {
            decision: &refused,
            quota,
        };
        let view = crate::request::RequestView::new(req);
        let rejected = Rejected::new(view, reason, decisions);
        let mut response = rejection.reject(&rejected);
        if let Some(secs) = rejected.retry_after_secs() {
            if !response.headers().contains_key(http::header::RETRY_AFTER) {
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
            }
        }
        return Err(response);
    };
    tracing::debug!(policy = %decision.policy(), delay_ms = wait.as_millis() as u64, delay_us = wait.as_micros() as u64, "request shaped: it waits for its turn");
    req.extensions_mut().insert(ShapedDelay(wait));
    Ok(Reservation {
        place,
        give_back: Some(Box::new(move || {
            give_back(&snapshot, &shaped_checks, turn);
            give_back(&snapshot, &others, at);
        })),
        delay: wait,
        _slot: slot,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A schedule, and a refund for place `turn` that records it in `given`.
    fn recorder() -> (ScheduleKey, Arc<Mutex<Vec<u64>>>) {
        ((0, Key::global()), Arc::default())
    }

    fn refund(given: &Arc<Mutex<Vec<u64>>>, turn: u64) -> Refund {
        let given = Arc::clone(given);
        Box::new(move || {
            given.lock().unwrap().push(turn);
            None
        })
    }

    fn enter(
        s: &Arc<Schedules>,
        key: &ScheduleKey,
        given: &Arc<Mutex<Vec<u64>>>,
        now: u64,
        turn: u64,
    ) -> (u64, u64) {
        enter_cost(s, key, given, now, turn, 1)
    }

    fn enter_cost(
        s: &Arc<Schedules>,
        key: &ScheduleKey,
        given: &Arc<Mutex<Vec<u64>>>,
        now: u64,
        turn: u64,
        cost: u64,
    ) -> (u64, u64) {
        let deciding = s.deciding(vec![key.clone()]);
        s.enter(deciding, now, vec![entry(key, given, turn, cost)])
    }

    fn entry(key: &ScheduleKey, given: &Arc<Mutex<Vec<u64>>>, turn: u64, cost: u64) -> Entry {
        Entry {
            key: key.clone(),
            cost,
            turn,
            refund: refund(given, turn),
        }
    }

    #[test]
    fn free_places_go_back_to_the_store_last_first_once_they_end_the_schedule() {
        let s = Arc::new(Schedules::new());
        let (key, given) = recorder();
        let (a, _) = enter(&s, &key, &given, 0, 100);
        let (b, _) = enter(&s, &key, &given, 0, 200);
        let (c, _) = enter(&s, &key, &given, 0, 300);
        s.cancel(&key, a);
        s.cancel(&key, b);
        assert!(
            given.lock().unwrap().is_empty(),
            "c still waits behind them"
        );
        s.cancel(&key, c);
        assert_eq!(*given.lock().unwrap(), [300, 200, 100]);
        assert!(
            s.shard(&key).get(&key).is_none(),
            "nothing kept for the key"
        );
    }

    #[test]
    fn the_next_request_takes_over_a_freed_place_and_gives_its_own_back() {
        let s = Arc::new(Schedules::new());
        let (key, given) = recorder();
        let (_a, _) = enter(&s, &key, &given, 0, 100);
        let (b, _) = enter(&s, &key, &given, 0, 200);
        let (_c, _) = enter(&s, &key, &given, 0, 300);
        s.cancel(&key, b);
        // Given 400 (the end of the store's schedule), it goes at 200, and 400 goes back.
        let (_d, taken) = enter(&s, &key, &given, 50, 400);
        assert_eq!(taken, 200);
        assert_eq!(*given.lock().unwrap(), [400]);
        // A freed place already due is never taken over.
        let (_e, taken) = enter(&s, &key, &given, 350, 400);
        assert_eq!(taken, 400);
    }

    #[test]
    fn nothing_goes_back_while_a_request_of_the_key_is_being_decided() {
        let s = Arc::new(Schedules::new());
        let (key, given) = recorder();
        let (a, _) = enter(&s, &key, &given, 0, 100);
        // Another request is at the store: it may be given 200, after a.
        let deciding = s.deciding(vec![key.clone()]);
        s.cancel(&key, a);
        assert!(given.lock().unwrap().is_empty());
        // It is given 200 and takes over 100 instead; 200 goes back.
        let (_b, taken) = s.enter(deciding, 0, vec![entry(&key, &given, 200, 1)]);
        assert_eq!(taken, 100);
        assert_eq!(*given.lock().unwrap(), [200]);
        // Decided without a place: what was held back goes back then.
        let (c, _) = enter(&s, &key, &given, 0, 200);
        let deciding = s.deciding(vec![key.clone()]);
        s.cancel(&key, c);
        assert_eq!(*given.lock().unwrap(), [200]);
        drop(deciding);
        assert_eq!(*given.lock().unwrap(), [200, 200]);
    }

    /// Two schedules in different shards.
    fn two_shards(s: &Schedules) -> (usize, usize) {
        let a = s.shard_of(&(0, Key::global()));
        let b = (1..)
            .map(|i| s.shard_of(&(i, Key::global())))
            .find(|&b| b != a)
            .unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn a_stalled_refund_holds_up_only_its_own_lane() {
        let s = Schedules::new();
        let (a, b) = two_shards(&s);
        // Schedule a's store never answers (a stalled Redis).
        s.send(a, Box::pin(std::future::pending()));
        let done = Arc::new(AtomicUsize::new(0));
        let d = Arc::clone(&done);
        s.send(
            b,
            Box::pin(async move {
                d.fetch_add(1, Ordering::Relaxed);
            }),
        );
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            done.load(Ordering::Relaxed),
            1,
            "b's refund waited behind a's"
        );
    }

    #[tokio::test]
    async fn refunds_waiting_for_a_stalled_store_are_bounded() {
        let s = Schedules::new();
        let (a, _) = two_shards(&s);
        let alive = Arc::new(());
        for _ in 0..100_000 {
            let token = Arc::clone(&alive);
            s.send(
                a,
                Box::pin(async move {
                    std::future::pending::<()>().await;
                    drop(token);
                }),
            );
        }
        tokio::task::yield_now().await;
        let queued = Arc::strong_count(&alive) - 1;
        println!(
            "100,000 refunds sent to a stalled store: {queued} kept waiting, {} dropped (spent)",
            s.dropped.load(Ordering::Relaxed)
        );
        assert!(queued <= LANE_CAPACITY + 1, "{queued} refunds wait");
        assert_eq!(s.dropped.load(Ordering::Relaxed) as usize, 100_000 - queued);
    }

    #[test]
    fn a_place_is_taken_over_only_by_a_request_of_its_cost() {
        let s = Arc::new(Schedules::new());
        let (key, given) = recorder();
        let (a, _) = enter_cost(&s, &key, &given, 0, 100, 2);
        let (_b, _) = enter_cost(&s, &key, &given, 0, 300, 1);
        s.cancel(&key, a);
        assert!(given.lock().unwrap().is_empty(), "b holds a later place");
        // A cost-1 request given 400 keeps it: the freed place holds 2 units.
        let (_c, taken) = enter_cost(&s, &key, &given, 0, 400, 1);
        assert_eq!(taken, 400);
        // A cost-2 request takes it over, and its own place (the last) goes back.
        let (_d, taken) = enter_cost(&s, &key, &given, 0, 500, 2);
        assert_eq!(taken, 100);
        assert_eq!(*given.lock().unwrap(), [500]);
    }

    #[test]
    fn places_are_kept_per_limit_and_key_whatever_other_limits_a_request_has() {
        let s = Arc::new(Schedules::new());
        let (a_key, given) = recorder();
        let b_key: ScheduleKey = (1, Key::global());
        // A request shaped by limits 0 and 1 holds a place in each schedule.
        let deciding = s.deciding(vec![a_key.clone(), b_key.clone()]);
        let (both, _) = s.enter(
            deciding,
            0,
            vec![entry(&a_key, &given, 100, 1), entry(&b_key, &given, 100, 1)],
        );
        // A request of limit 0 only waits behind it in limit 0's schedule.
        let (_a, _) = enter(&s, &a_key, &given, 0, 200);
        s.cancel(&a_key, both);
        s.cancel(&b_key, both);
        // Limit 1's place was its schedule's last: back at once. Limit 0's is not.
        assert_eq!(*given.lock().unwrap(), [100]);
        // The next request of limit 0 takes limit 0's freed place over.
        let (_c, taken) = enter(&s, &a_key, &given, 0, 300);
        assert_eq!(taken, 100);
        assert_eq!(*given.lock().unwrap(), [100, 300]);
    }

    #[test]
    fn a_free_place_already_due_goes_back_with_the_places_after_it() {
        let s = Arc::new(Schedules::new());
        let (key, given) = recorder();
        let (a, _) = enter(&s, &key, &given, 0, 100);
        let (b, _) = enter(&s, &key, &given, 0, 200);
        s.cancel(&key, a);
        // At 150 a is due and free; c is given 300 and cannot take it over.
        let (c, taken) = enter(&s, &key, &given, 150, 300);
        assert_eq!(taken, 300);
        s.cancel(&key, b);
        s.cancel(&key, c);
        // Every place went back, a's too (its refund counts what refilled since 100).
        assert_eq!(*given.lock().unwrap(), [300, 200, 100]);
    }

    fn shape(q: Quota, wait_ms: u64) -> Result<CompiledShape, ConfigError> {
        compile(
            &Shape::new(Duration::from_millis(wait_ms)),
            &q,
            AlgorithmKind::Gcra,
        )
    }

    #[test]
    fn widens_by_what_the_rate_emits_in_max_wait() {
        let s = shape(Quota::per_second(10).burst(2), 1_000).unwrap();
        assert_eq!(s.extra, 10);
        assert_eq!(s.widen(&Quota::per_second(10).burst(2)).burst_size(), 12);
        // Rounded down to whole intervals: 250 ms at 10/s is 2 units.
        assert_eq!(shape(Quota::per_second(10), 250).unwrap().extra, 2);
        let capped = compile(
            &Shape::new(Duration::from_secs(1)).max_queued(3),
            &Quota::per_second(10),
            AlgorithmKind::TokenBucket,
        )
        .unwrap();
        assert_eq!(capped.extra, 3);
    }

    #[test]
    fn refuses_what_cannot_shape() {
        let e = shape(Quota::per_minute(10), 5_000).unwrap_err();
        assert_eq!(e.field(), "limit.shape.max_wait");
        assert!(e.message().contains("6s"), "{}", e.message());
        for kind in [
            AlgorithmKind::FixedWindow,
            AlgorithmKind::SlidingWindow,
            AlgorithmKind::SlidingLog,
        ] {
            let e =
                compile(&Duration::from_secs(1).into(), &Quota::per_second(10), kind).unwrap_err();
            assert_eq!(e.field(), "limit.shape", "{kind}");
        }
        let e = compile(
            &Shape::new(Duration::from_secs(1)).max_queued(0),
            &Quota::per_second(10),
            AlgorithmKind::Gcra,
        )
        .unwrap_err();
        assert_eq!(e.field(), "limit.shape.max_queued");
    }

    #[test]
    fn reads_the_wait_from_the_widened_decision() {
        use crate::algorithm::{Algorithm, Gcra};
        let own = Quota::per_second(10).burst(2);
        let s = shape(own, 1_000).unwrap();
        let gcra = Gcra::new(s.widen(&own)).unwrap();
        let mut state = Default::default();
        let mut waits = Vec::new();
        for _ in 0..12 {
            let (d, wait) = s.unwiden(gcra.check(&mut state, 0, 1));
            assert!(d.allowed());
            assert_eq!(d.limit(), 2);
            waits.push(wait.as_millis());
        }
        assert_eq!(
            waits,
            [0, 0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]
        );
        let (d, wait) = s.unwiden(gcra.check(&mut state, 0, 1));
        assert!(!d.allowed());
        assert_eq!(wait, Duration::ZERO);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
        // 150 ms later the schedule has moved on: the next place is 950 ms away.
        let (d, wait) = s.unwiden(gcra.check(&mut state, 150_000, 1));
        assert!(d.allowed());
        assert_eq!(wait, Duration::from_millis(950));
    }

    #[test]
    fn the_wait_is_never_shorter_than_the_exact_one() {
        use crate::algorithm::{Algorithm, TokenBucket};
        // 3 per second: intervals of 333 333.3 µs.
        let own = Quota::per_second(3).burst(1);
        let s = shape(own, 2_000).unwrap();
        let tb = TokenBucket::new(s.widen(&own)).unwrap();
        let mut state = Default::default();
        for k in 0..=s.extra {
            let (d, wait) = s.unwiden(tb.check(&mut state, 0, 1));
            assert!(d.allowed());
            let exact_ns = k as u128 * 1_000_000_000 / 3;
            assert!(wait.as_nanos() >= exact_ns, "{k}: {wait:?}");
            assert!(wait.as_nanos() <= exact_ns + 2_000, "{k}: {wait:?}");
        }
    }
}
