//! [`Schedules`]: the places this layer's waiting requests hold in each key's schedule, and how
//! a place freed by a dropped request is taken over or given back to the store.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::mem;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;

use crate::key::Key;

/// Which schedule a place is in: one shaped limit and key, as the store keeps one schedule per
/// limit and key (whatever the costs of its requests, and whatever other limits they have).
pub(super) type ScheduleKey = (usize, Key<'static>);

/// One shard of [`Schedules`]: the schedules whose keys hash to it.
type Shard = HashMap<ScheduleKey, Schedule>;

/// A refund the store answers later: the call to wait for.
pub(super) type PendingRefund = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Gives a place's charge back to the store; returns the call to wait for when the store
/// answers later.
pub(super) type Refund = Box<dyn FnOnce() -> Option<PendingRefund> + Send>;

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
    pub(super) fn new() -> Self {
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
    pub(super) fn enter(
        &self,
        mut deciding: Deciding,
        now: u64,
        entries: Vec<Entry>,
    ) -> (u64, u64) {
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
pub(super) struct Entry {
    pub(super) key: ScheduleKey,
    pub(super) cost: u64,
    pub(super) turn: u64,
    pub(super) refund: Refund,
}

/// A request of some schedules being decided by the store (see [`Schedules::deciding`]); ends
/// when dropped, or when the request takes its places.
pub(crate) struct Deciding {
    pub(super) schedules: Arc<Schedules>,
    pub(super) keys: Vec<ScheduleKey>,
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
pub(super) struct Held {
    pub(super) schedules: Arc<Schedules>,
    pub(super) keys: Vec<ScheduleKey>,
    pub(super) id: u64,
}

impl Held {
    pub(super) fn cancel(&self) {
        for key in &self.keys {
            self.schedules.cancel(key, self.id);
        }
    }

    pub(super) fn spend(&self) {
        for key in &self.keys {
            self.schedules.spend(key, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

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
}
