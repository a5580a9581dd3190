//! [`CachedLookup`]: an async key → plan lookup (a database), cached with a TTL and a bound.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::watch;

use super::map::owned_value;
use super::names::PlanNames;
use crate::clock::{duration_to_micros, Clock, SystemClock};
use crate::decision::Name;
use crate::error::ConfigError;
use crate::key::{Key, KeyValue};
use crate::plan::{PlanResolver, Resolution};
use crate::request::RequestView;

type LookupFn =
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Option<String>> + Send>> + Send + Sync;

/// Resolves the plan by an async lookup of the key (API key → plan in a database), cached.
///
/// - **Cached**: an answer is kept for the [TTL](Self::ttl) (default 60 s); "no plan" answers too,
///   for the [negative TTL](Self::negative_ttl) (default: the TTL), so a client sending made-up
///   keys costs one lookup per key per TTL, not one per request.
/// - **Bounded**: at most [`capacity`](Self::capacity) keys (default 10 000); when full, the
///   oldest answer is dropped first.
/// - **One lookup in flight per key**: the first request for a key not in the cache gets
///   [`Resolution::Lookup`] with a future that runs the lookup; concurrent requests for the same
///   key get a future that waits for that one. After awaiting, the layer resolves again and is
///   answered from the cache. If the request running a lookup is dropped before it finishes
///   (client gone), the lookup is abandoned and the waiters' next resolve starts a new one.
///
/// The lookup receives the key's value as text: an API key's bytes (UTF-8, lossily), an address,
/// a number, or `"global"`. It answers `Some(plan name)` or `None` (no such key, or it failed:
/// return `None` and choose a short negative TTL). `None` resolves as [`Resolution::Unknown`], so
/// the limit's `on_unknown_plan` decides.
///
/// ```
/// use std::time::Duration;
/// use tollgate::key::Key;
/// use tollgate::plan::{CachedLookup, PlanResolver, Resolution};
/// use tollgate::RequestView;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let plans = CachedLookup::new(|api_key: String| async move {
///     // A database query in real life.
///     (api_key == "pro-key-1").then(|| "pro".to_owned())
/// })
/// .ttl(Duration::from_secs(300))
/// .unwrap()
/// .capacity(50_000)
/// .unwrap();
///
/// let req = http::Request::get("/").body(()).unwrap();
/// let key = Key::string("pro-key-1");
/// // First request: a lookup to await (the layer does this), then the cached answer.
/// let Resolution::Lookup(lookup) = plans.resolve(&RequestView::new(&req), &key) else { panic!() };
/// lookup.await;
/// let plan = plans.resolve(&RequestView::new(&req), &key);
/// assert!(matches!(plan, Resolution::Plan(p) if p.as_str() == "pro"));
/// # }
/// ```
#[derive(Clone)]
pub struct CachedLookup {
    inner: Arc<Inner>,
}

struct Inner {
    lookup: Arc<LookupFn>,
    names: PlanNames,
    ttl: u64,
    negative_ttl: Option<u64>,
    capacity: usize,
    clock: Arc<dyn Clock>,
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    answers: HashMap<KeyValue<'static>, Answer, foldhash::fast::RandomState>,
    /// Keys in the order their answers were stored (oldest first), with the answer's generation;
    /// entries whose generation no longer matches were replaced and are skipped.
    order: VecDeque<(KeyValue<'static>, u64)>,
    in_flight: HashMap<KeyValue<'static>, Flight, foldhash::fast::RandomState>,
    next_generation: u64,
}

struct Answer {
    plan: Option<Name>,
    expires_at: u64,
    generation: u64,
}

struct Flight {
    id: u64,
    /// Closed (the sender dropped) when the lookup finishes or is abandoned.
    done: watch::Receiver<()>,
}

const DEFAULT_TTL: Duration = Duration::from_secs(60);
const DEFAULT_CAPACITY: usize = 10_000;

impl CachedLookup {
    /// Looks plans up with `lookup`, caching answers for 60 s, at most 10 000 keys.
    pub fn new<F, Fut>(lookup: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<String>> + Send + 'static,
    {
        Self {
            inner: Arc::new(Inner {
                lookup: Arc::new(move |key| Box::pin(lookup(key))),
                names: PlanNames::open(),
                ttl: duration_to_micros(DEFAULT_TTL),
                negative_ttl: None,
                capacity: DEFAULT_CAPACITY,
                clock: Arc::new(SystemClock::new()),
                state: RwLock::new(State::default()),
            }),
        }
    }

    /// Applies `f` to the configuration. A clone being configured gets its own, empty cache.
    fn configure(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            f(inner);
            return self;
        }
        let shared = &self.inner;
        let mut own = Inner {
            lookup: Arc::clone(&shared.lookup),
            names: PlanNames::open(),
            ttl: shared.ttl,
            negative_ttl: shared.negative_ttl,
            capacity: shared.capacity,
            clock: Arc::clone(&shared.clock),
            state: RwLock::new(State::default()),
        };
        f(&mut own);
        self.inner = Arc::new(own);
        self
    }

    /// How long an answer naming a plan is kept (default 60 s). Zero is an error.
    pub fn ttl(self, ttl: Duration) -> Result<Self, ConfigError> {
        let ttl = positive_micros("plan_lookup.ttl", ttl)?;
        Ok(self.configure(|inner| inner.ttl = ttl))
    }

    /// How long a "no plan" answer is kept (default: the [TTL](Self::ttl)). Zero is an error.
    pub fn negative_ttl(self, ttl: Duration) -> Result<Self, ConfigError> {
        let ttl = positive_micros("plan_lookup.negative_ttl", ttl)?;
        Ok(self.configure(|inner| inner.negative_ttl = Some(ttl)))
    }

    /// The most keys kept (default 10 000). Zero is an error.
    pub fn capacity(self, capacity: usize) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::new(
                "plan_lookup.capacity",
                "a capacity of 0 caches nothing, so every request would look its key up: use at \
                 least the number of active keys you expect",
            ));
        }
        Ok(self.configure(|inner| inner.capacity = capacity))
    }

    /// Reads time from `clock` (default [`SystemClock`]); a
    /// [`ManualClock`](crate::clock::ManualClock) or [`TokioClock`](crate::clock::TokioClock)
    /// in tests.
    #[must_use]
    pub fn clock(self, clock: impl Clock) -> Self {
        self.configure(|inner| inner.clock = Arc::new(clock))
    }

    /// The number of answers held (fresh or expired, not yet dropped).
    pub fn len(&self) -> usize {
        self.inner.state.read().answers.len()
    }

    /// Whether no answer is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets the answer for `key` (its plan changed): the next request looks it up again.
    pub fn invalidate(&self, key: &Key<'_>) {
        self.inner
            .state
            .write()
            .answers
            .remove(&owned_value(key.value()));
    }
}

fn positive_micros(field: &'static str, d: Duration) -> Result<u64, ConfigError> {
    match duration_to_micros(d) {
        0 => Err(ConfigError::new(
            field,
            "a TTL of zero caches nothing: use at least a second, e.g. Duration::from_secs(60)",
        )),
        micros => Ok(micros),
    }
}

/// The text the lookup receives for a key's value.
fn lookup_text(value: &KeyValue<'_>) -> String {
    match value {
        KeyValue::Global => "global".to_owned(),
        KeyValue::Ip(ip) => ip.to_string(),
        KeyValue::Int(n) => n.to_string(),
        KeyValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
    }
}

fn answered(plan: Option<Name>) -> Resolution {
    match plan {
        Some(plan) => Resolution::Plan(plan),
        None => Resolution::Unknown,
    }
}

impl Inner {
    /// The fresh answer for `value`, if any.
    fn cached(&self, state: &State, value: &KeyValue<'_>, now: u64) -> Option<Option<Name>> {
        let answers: &HashMap<KeyValue<'_>, Answer, _> = &state.answers;
        answers
            .get(value)
            .filter(|a| now < a.expires_at)
            .map(|a| a.plan)
    }

    /// Stores the answer of flight `id` for `value` and ends the flight.
    fn finish(&self, value: KeyValue<'static>, id: u64, plan: Option<Name>) {
        let now = self.clock.now_micros();
        let ttl = match plan {
            Some(_) => self.ttl,
            None => self.negative_ttl.unwrap_or(self.ttl),
        };
        let mut state = self.state.write();
        if state.in_flight.get(&value).is_some_and(|f| f.id == id) {
            state.in_flight.remove(&value);
        }
        state.next_generation += 1;
        let generation = state.next_generation;
        let answer = Answer {
            plan,
            expires_at: now.saturating_add(ttl),
            generation,
        };
        if state.answers.insert(value.clone(), answer).is_none() {
            while state.answers.len() > self.capacity {
                let Some((oldest, generation)) = state.order.pop_front() else {
                    break;
                };
                if state
                    .answers
                    .get(&oldest)
                    .is_some_and(|a| a.generation == generation)
                {
                    state.answers.remove(&oldest);
                }
            }
        }
        state.order.push_back((value, generation));
        // Replaced answers leave stale entries behind: drop them before they outnumber the live.
        if state.order.len() > 2 * self.capacity + 16 {
            let State { answers, order, .. } = &mut *state;
            order.retain(|(k, g)| answers.get(k).is_some_and(|a| a.generation == *g));
        }
    }

    /// Ends flight `id` for `value` without an answer (the lookup was dropped or panicked).
    fn abandon(&self, value: &KeyValue<'static>, id: u64) {
        let mut state = self.state.write();
        if state.in_flight.get(value).is_some_and(|f| f.id == id) {
            state.in_flight.remove(value);
        }
    }
}

/// Abandons the flight if the lookup future is dropped before it stored an answer.
struct FlightGuard {
    inner: Arc<Inner>,
    value: Option<KeyValue<'static>>,
    id: u64,
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            tracing::debug!("plan lookup abandoned before it answered");
            self.inner.abandon(&value, self.id);
        }
    }
}

impl PlanResolver for CachedLookup {
    fn resolve(&self, _req: &RequestView<'_>, key: &Key<'_>) -> Resolution {
        let inner = &self.inner;
        let value = key.value();
        let now = inner.clock.now_micros();
        if let Some(plan) = inner.cached(&inner.state.read(), value, now) {
            return answered(plan);
        }
        let mut state = inner.state.write();
        if let Some(plan) = inner.cached(&state, value, now) {
            return answered(plan);
        }
        let in_flight: &HashMap<KeyValue<'_>, Flight, _> = &state.in_flight;
        if let Some(flight) = in_flight.get(value) {
            let mut done = flight.done.clone();
            return Resolution::Lookup(Box::pin(async move {
                // Err once the lookup's sender is dropped: finished or abandoned.
                let _ = done.changed().await;
            }));
        }
        state.next_generation += 1;
        let id = state.next_generation;
        let (sender, done) = watch::channel(());
        let owned = owned_value(value);
        state.in_flight.insert(owned.clone(), Flight { id, done });
        drop(state);

        let inner = Arc::clone(inner);
        let text = lookup_text(&owned);
        // Built before the future so that dropping it unpolled abandons the flight too.
        let mut guard = FlightGuard {
            inner: Arc::clone(&inner),
            value: Some(owned),
            id,
        };
        Resolution::Lookup(Box::pin(async move {
            let answer = (inner.lookup)(text).await;
            let plan = answer.and_then(|name| {
                let plan = inner.names.get(&name);
                if plan.is_none() {
                    tracing::warn!(plan = %name, "plan lookup answered a name that cannot be a plan; treating the key as unknown");
                }
                plan
            });
            if let Some(value) = guard.value.take() {
                inner.finish(value, id, plan);
            }
            drop(sender);
        }))
    }
}

impl fmt::Debug for CachedLookup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedLookup")
            .field("ttl_micros", &self.inner.ttl)
            .field("negative_ttl_micros", &self.inner.negative_ttl)
            .field("capacity", &self.inner.capacity)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::Semaphore;

    use super::*;
    use crate::clock::ManualClock;

    /// A lookup that counts its calls and knows `pro-*` keys as "pro", `free-*` as "free".
    fn counting() -> (CachedLookup, Arc<AtomicUsize>, ManualClock) {
        let calls = Arc::new(AtomicUsize::new(0));
        let clock = ManualClock::new();
        let counter = Arc::clone(&calls);
        let lookup = CachedLookup::new(move |key: String| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                key.split('-')
                    .next()
                    .filter(|p| *p == "pro" || *p == "free")
                    .map(str::to_owned)
            }
        })
        .clock(clock.clone());
        (lookup, calls, clock)
    }

    /// Resolves like the layer does: awaiting lookups until the cache answers.
    async fn resolve(lookup: &CachedLookup, key: &str) -> Option<Name> {
        let req = http::Request::get("/").body(()).unwrap();
        let key = Key::string(key);
        for _ in 0..3 {
            match lookup.resolve(&RequestView::new(&req), &key) {
                Resolution::Lookup(f) => f.await,
                Resolution::Plan(p) => return Some(p),
                Resolution::Unknown => return None,
                Resolution::Default => panic!("a lookup never answers Default"),
            }
        }
        panic!("not answered from the cache after a lookup")
    }

    fn resolve_now(lookup: &CachedLookup, key: &str) -> Resolution {
        let req = http::Request::get("/").body(()).unwrap();
        lookup.resolve(&RequestView::new(&req), &Key::string(key))
    }

    #[tokio::test]
    async fn answers_and_no_plan_answers_are_cached_for_their_ttl() {
        let (lookup, calls, clock) = counting();
        let lookup = lookup
            .ttl(Duration::from_secs(60))
            .unwrap()
            .negative_ttl(Duration::from_secs(5))
            .unwrap();
        assert_eq!(resolve(&lookup, "pro-1").await, Some(Name::new("pro")));
        assert_eq!(resolve(&lookup, "bogus").await, None);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        for _ in 0..10 {
            assert!(
                matches!(resolve_now(&lookup, "pro-1"), Resolution::Plan(p) if p.as_str() == "pro")
            );
            assert!(matches!(resolve_now(&lookup, "bogus"), Resolution::Unknown));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        // The negative answer expires after 5 s, the positive one after 60 s.
        clock.advance(Duration::from_secs(5));
        assert!(matches!(
            resolve_now(&lookup, "bogus"),
            Resolution::Lookup(_)
        ));
        assert!(matches!(resolve_now(&lookup, "pro-1"), Resolution::Plan(_)));
        clock.advance(Duration::from_secs(54));
        assert!(matches!(resolve_now(&lookup, "pro-1"), Resolution::Plan(_)));
        clock.advance(Duration::from_secs(1));
        assert_eq!(resolve(&lookup, "pro-1").await, Some(Name::new("pro")));
        // The abandoned "bogus" lookup (dropped above) ran nothing; "pro-1" was looked up again.
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        lookup.invalidate(&Key::string("pro-1"));
        assert_eq!(resolve(&lookup, "pro-1").await, Some(Name::new("pro")));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn capacity_bounds_the_cache_and_drops_the_oldest_first() {
        let (lookup, calls, _clock) = counting();
        let lookup = lookup.capacity(3).unwrap();
        for key in ["pro-1", "pro-2", "pro-3", "pro-4", "free-5"] {
            resolve(&lookup, key).await;
            assert!(lookup.len() <= 3);
        }
        assert_eq!(lookup.len(), 3);
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        // The newest three are held; the two oldest were dropped.
        for key in ["pro-3", "pro-4", "free-5"] {
            assert!(
                matches!(resolve_now(&lookup, key), Resolution::Plan(_)),
                "{key}"
            );
        }
        assert!(matches!(
            resolve_now(&lookup, "pro-1"),
            Resolution::Lookup(_)
        ));
        // Many refreshes of one key never grow the bookkeeping past its bound.
        for _ in 0..100 {
            lookup.invalidate(&Key::string("pro-3"));
            resolve(&lookup, "pro-3").await;
        }
        let state = lookup.inner.state.read();
        assert!(state.order.len() <= 2 * 3 + 16, "{}", state.order.len());
        assert_eq!(state.answers.len(), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_lookup_in_flight_per_key_whatever_the_callers() {
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let (counter, open) = (Arc::clone(&calls), Arc::clone(&gate));
        let lookup = CachedLookup::new(move |key: String| {
            counter.fetch_add(1, Ordering::SeqCst);
            let open = Arc::clone(&open);
            async move {
                // Held until every caller has asked.
                let _permit = open.acquire().await.unwrap();
                Some(
                    if key.starts_with("pro") {
                        "pro"
                    } else {
                        "free"
                    }
                    .to_owned(),
                )
            }
        });
        let asked = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..32 {
            let (lookup, asked) = (lookup.clone(), Arc::clone(&asked));
            let key = if i % 2 == 0 { "pro-key" } else { "free-key" };
            tasks.push(tokio::spawn(async move {
                let Resolution::Lookup(wait) = resolve_now(&lookup, key) else {
                    panic!("answered before any lookup finished")
                };
                asked.fetch_add(1, Ordering::SeqCst);
                wait.await;
                resolve(&lookup, key).await
            }));
        }
        // Every caller holds a lookup or a wait before the two lookups may answer.
        while asked.load(Ordering::SeqCst) < 32 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(2);
        for (i, task) in tasks.into_iter().enumerate() {
            let expected = if i % 2 == 0 { "pro" } else { "free" };
            assert_eq!(task.await.unwrap(), Some(Name::new(expected)));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one lookup per key");
        assert!(lookup.inner.state.read().in_flight.is_empty());
    }

    #[tokio::test]
    async fn an_abandoned_lookup_wakes_its_waiters_and_a_new_one_runs() {
        let (lookup, calls, _clock) = counting();
        let Resolution::Lookup(leader) = resolve_now(&lookup, "pro-1") else {
            panic!("expected a lookup")
        };
        let Resolution::Lookup(waiter) = resolve_now(&lookup, "pro-1") else {
            panic!("expected a wait")
        };
        drop(leader); // the client went away before the lookup ran
        waiter.await; // returns instead of hanging
        assert_eq!(resolve(&lookup, "pro-1").await, Some(Name::new("pro")));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn bad_settings_are_config_errors() {
        let lookup = || CachedLookup::new(|_: String| async { None });
        assert_eq!(
            lookup().ttl(Duration::ZERO).unwrap_err().field(),
            "plan_lookup.ttl"
        );
        assert_eq!(
            lookup()
                .negative_ttl(Duration::from_nanos(10))
                .unwrap_err()
                .field(),
            "plan_lookup.negative_ttl"
        );
        assert_eq!(
            lookup().capacity(0).unwrap_err().field(),
            "plan_lookup.capacity"
        );
        // Configuring a clone does not disturb the original's cache.
        let a = lookup();
        let b = a.clone().capacity(5).unwrap();
        assert!(format!("{b:?}").contains("capacity: 5"));
        assert!(format!("{a:?}").contains("capacity: 10000"));
    }
}
