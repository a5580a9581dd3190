//! Stored state on Redis: whatever bytes sit at a limiter key (left by an older version, another
//! tool, or an attacker with Redis access), the scripts decode them without failing the request:
//!
//! - the check is decided (never a store error);
//! - a value the algorithm cannot have written is counted as a corrupt reset, exactly then, and
//!   decided as a fresh key;
//! - a value it can decode is decided exactly as the Rust algorithm decides that state (the Lua
//!   scripts mirror it bit for bit); the sliding log, whose Rust state cannot be built from
//!   outside, is checked by the invariants alone;
//! - every decision is coherent: `remaining <= limit`, a cost of 0 is allowed, a cost above the
//!   capacity is impossible, a rejection waits at least 1 µs, and `remaining` is exact (a cost of
//!   `remaining + 1` is refused and then a cost of `remaining` is allowed, at the same instant).
//!
//! The checks need a real `redis-server`: [`Harness::new`] takes its URL.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::algorithm::{
    Algorithm, AlgorithmKind, FixedWindow, FixedWindowState, Gcra, GcraState, LeakyBucket,
    LeakyBucketState, SlidingWindow, SlidingWindowState, TokenBucket, TokenBucketState,
};
use tollgate::clock::Clock;
use tollgate::key::Key;
use tollgate::quota::MAX_EXACT;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, Checked, FailurePolicy, LimitCheck, LimitSpec, Store};
use tollgate::{Decision, Name, Quota};

use crate::input::Input;

/// A clock the harness sets to any time (state from another clock can be ahead or behind).
#[derive(Debug, Clone, Default)]
pub struct SetClock(Arc<AtomicU64>);

impl Clock for SetClock {
    fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Its readings are the times the harness picks, taken as Unix time: the Redis store sends
    /// them unshifted, so memory and Redis see the same times.
    fn unix_offset_micros(&self) -> u64 {
        0
    }
}

/// Quotas from tiny to huge: one per year, one per µs, 2^40 per second, bursts.
fn quotas() -> [Quota; 9] {
    [
        Quota::per_minute(2),
        Quota::per_second(1),
        Quota::per_second(5).burst(10),
        Quota::per(Duration::from_micros(1), 1),
        Quota::per_hour(3),
        Quota::per_day(1_000_000),
        Quota::per_second(1 << 40),
        Quota::per(Duration::from_secs(365 * 86_400), 1),
        Quota::per(Duration::from_millis(1500), 7).burst(3),
    ]
}

/// One store per valid (algorithm, quota) pair, all on one server, with a clock set per check.
pub struct Harness {
    runtime: tokio::runtime::Runtime,
    direct: Direct,
    clock: SetClock,
    stores: Vec<(AlgorithmKind, Quota, RedisStore)>,
    next: u64,
}

impl Harness {
    /// Stores on the Redis at `url` under `prefix`.
    pub fn new(url: &str, prefix: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let conn = redis::Client::open(url)
            .and_then(|c| c.get_connection())
            .expect("connect to redis");
        let clock = SetClock::default();
        let mut stores = Vec::new();
        for kind in AlgorithmKind::ALL {
            for quota in quotas() {
                let spec = LimitSpec::new(Name::new("fuzz"), quota, kind).on_store_error(
                    FailurePolicy::Closed {
                        retry_after: Duration::from_secs(1),
                    },
                );
                let built = RedisBackend::new(url)
                    .prefix(format!("{prefix}-{}", stores.len()))
                    .clock(clock.clone())
                    .timeout(Duration::from_secs(5))
                    .connect_timeout(Duration::from_secs(5))
                    .build(&[spec]);
                if let Ok(store) = built {
                    stores.push((kind, quota, store));
                }
            }
        }
        Self {
            runtime,
            direct: Direct {
                url: url.to_owned(),
                conn,
            },
            clock,
            stores,
            next: 0,
        }
    }

    fn decide(&self, store: &RedisStore, key: &Key<'_>, cost: u64) -> Decision {
        let checks = [LimitCheck::new(0, key.clone(), cost)];
        let result = match store.check(&checks) {
            Checked::Ready(r) => r,
            Checked::Pending(f) => self.runtime.block_on(f),
        };
        match result {
            Ok(d) => d.as_slice()[0],
            Err(e) => panic!("stored state made the check fail: {e}"),
        }
    }

    /// Runs every check on one fuzzer input.
    pub fn check(&mut self, data: &[u8]) {
        let mut input = Input::new(data);
        let (kind, quota, store) = &self.stores[usize::from(input.byte()) % self.stores.len()];
        let (kind, quota) = (*kind, *quota);
        let period = quota.period_micros();
        let now = pick_time(&mut input, period);
        let stored = stored_value(&mut input, kind, now, period);
        let capacity = quota.burst_size();
        let cost = match input.byte() % 6 {
            0 => 0,
            1 => 1,
            2 => capacity,
            3 => capacity + 1,
            4 => input.u64() % (capacity + 2),
            _ => input.u64() >> (input.byte() % 64),
        };

        self.next += 1;
        let key = Key::string(format!("victim-{}", self.next));
        let redis_key = store.redis_key(0, &key).expect("limit 0");
        let _: () = self.direct.run(redis::cmd("DEL").arg(&redis_key));
        match &stored {
            Stored::Missing => {}
            Stored::Bytes(b) => {
                let _: () = self
                    .direct
                    .run(redis::cmd("SET").arg(&redis_key).arg(&b[..]));
            }
            Stored::List => {
                let _: () = self
                    .direct
                    .run(redis::cmd("RPUSH").arg(&redis_key).arg("x"));
            }
        }
        // A missing key first goes through up to 7 random checks at earlier times: the state
        // the final check sees is then one the algorithm itself produced.
        let warm_ups = if matches!(stored, Stored::Missing) {
            input.byte() % 8
        } else {
            0
        };
        let step = input.u64() % (period + 1);
        for i in (1..=u64::from(warm_ups)).rev() {
            let at = now.saturating_sub(i * step);
            self.clock.0.store(at, Ordering::SeqCst);
            let c = input.u64() % (capacity + 1);
            let d = self.decide(store, &key, c);
            check_coherent(
                &d,
                c,
                capacity,
                true,
                &format!("{kind} {quota} warm-up at {at}"),
            );
        }
        self.clock.0.store(now, Ordering::SeqCst);
        let resets = store.stats().corrupt_resets();
        let d = self.decide(store, &key, cost);
        let corrupt = store.stats().corrupt_resets() - resets;
        let words = decodable(kind, &stored);
        assert_eq!(
            corrupt,
            u64::from(words.is_none()),
            "{kind} {quota}: {stored:?} counted as corrupt {corrupt} times"
        );
        // Hand-written state the algorithm could not have produced (counts above the limit,
        // times ahead) is only held to the weaker promises: decided, coherent, as in Rust.
        let reachable = words.as_ref().is_none_or(Vec::is_empty);
        let ctx = format!("{kind} {quota}: stored {stored:?}, now={now}, cost={cost}, first {d:?}");
        check_coherent(&d, cost, capacity, reachable, &ctx);
        let fresh_or_decoded = if warm_ups == 0 {
            words.as_deref().or(Some(&[]))
        } else {
            None
        };
        if let Some(want) = fresh_or_decoded.and_then(|w| rust_decision(kind, quota, w, now, cost))
        {
            assert_eq!(d.allowed(), want.allowed(), "allowed: {ctx}");
            assert_eq!(d.remaining(), want.remaining(), "remaining: {ctx}");
            assert_eq!(clamp(d.reset()), clamp(want.reset()), "reset: {ctx}");
            assert_eq!(
                d.retry_after().map(clamp),
                want.retry_after().map(clamp),
                "retry_after: {ctx}"
            );
        }
        if !reachable {
            return self.forget(&redis_key);
        }

        // Every key the script writes has an expiry (a rejection writes nothing). Redis expires keys in real time while this
        // clock stands still, so exactness is checked only when the key outlives the next calls.
        let ttl: i64 = self.direct.run(redis::cmd("PTTL").arg(&redis_key));
        if d.allowed() && cost > 0 {
            assert_ne!(ttl, -1, "a charged limiter key without expiry: {ctx}");
        }
        if ttl != -1 && ttl < 1000 {
            return self.forget(&redis_key);
        }

        // `remaining` is exact, right after the decision.
        let left = d.remaining();
        let more = self.decide(store, &key, left + 1);
        assert!(
            !more.allowed(),
            "remaining {left}, yet {} was allowed: {ctx}",
            left + 1
        );
        let exact = self.decide(store, &key, left);
        assert!(
            exact.allowed(),
            "remaining {left}, yet it was refused ({exact:?}): {ctx}"
        );
        assert_eq!(
            store.stats().corrupt_resets() - resets,
            corrupt,
            "healed after one reset"
        );
        self.forget(&redis_key);
    }

    /// Decides `cost` at `now` on a fresh key of the (`kind`, `quota`) store holding the stored
    /// integers `words` (for tests that pin one state).
    pub fn decide_stored(
        &mut self,
        kind: AlgorithmKind,
        quota: Quota,
        words: &[u64],
        now: u64,
        cost: u64,
    ) -> Decision {
        let i = self
            .stores
            .iter()
            .position(|(k, q, _)| *k == kind && *q == quota)
            .unwrap_or_else(|| panic!("no {kind} {quota} store: add the quota to `quotas()`"));
        self.next += 1;
        let key = Key::string(format!("pinned-{}", self.next));
        let redis_key = self.stores[i].2.redis_key(0, &key).expect("limit 0");
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let _: () = self
            .direct
            .run(redis::cmd("SET").arg(&redis_key).arg(bytes));
        self.clock.0.store(now, Ordering::SeqCst);
        let d = self.decide(&self.stores[i].2, &key, cost);
        self.forget(&redis_key);
        d
    }

    fn forget(&mut self, redis_key: &str) {
        let _: () = self.direct.run(redis::cmd("DEL").arg(redis_key));
    }
}

/// A direct connection, for setting up and inspecting keys.
struct Direct {
    url: String,
    conn: redis::Connection,
}

impl Direct {
    /// Runs a direct command, reconnecting and retrying (each is idempotent here) when the
    /// blocking call fails, e.g. interrupted by libFuzzer's timer signal.
    fn run<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> T {
        let mut last = None;
        for _ in 0..5 {
            match cmd.query(&mut self.conn) {
                Ok(v) => return v,
                Err(e) => {
                    last = Some(e);
                    if let Ok(conn) =
                        redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection())
                    {
                        self.conn = conn;
                    }
                }
            }
        }
        panic!("redis command failed 5 times: {last:?}")
    }
}

/// Durations as the scripts report them: at most 2^53 µs.
fn clamp(d: Duration) -> Duration {
    d.min(Duration::from_micros(MAX_EXACT))
}

/// The invariants every decision keeps, whatever the state; with `reachable` (a state the
/// algorithm produced), also that a cost of 0 is allowed.
pub fn check_coherent(d: &Decision, cost: u64, capacity: u64, reachable: bool, ctx: &str) {
    assert!(
        d.remaining() <= d.limit(),
        "remaining above limit: {d:?} {ctx}"
    );
    if cost == 0 && reachable {
        assert!(d.allowed(), "a cost of 0 was refused: {d:?} {ctx}");
    }
    if cost > capacity {
        assert!(
            d.is_impossible(),
            "cost {cost} above capacity {capacity} not impossible: {d:?} {ctx}"
        );
    } else {
        assert!(
            !d.is_impossible(),
            "cost {cost} within capacity called impossible: {d:?} {ctx}"
        );
    }
    match d.retry_after() {
        Some(wait) if d.allowed() => assert_eq!(wait, Duration::ZERO, "{d:?} {ctx}"),
        Some(wait) => assert!(wait >= Duration::from_micros(1), "{d:?} {ctx}"),
        None => assert!(!d.allowed(), "{d:?} {ctx}"),
    }
}

/// What is at the key before the check.
#[derive(Debug, Clone)]
enum Stored {
    Missing,
    Bytes(Vec<u8>),
    /// A value of the wrong type.
    List,
}

fn pick_time(input: &mut Input<'_>, period: u64) -> u64 {
    let t = match input.byte() % 6 {
        0 => 0,
        1 => 1_700_000_000_000_000,
        2 => MAX_EXACT / 2 - 1,
        3 => period.saturating_mul(input.u64() % 1000),
        4 => 1_700_000_000_000_000 + input.u64() % (4 * period.max(1)),
        _ => input.u64(),
    };
    // Times stay below 2^52 µs (142 years after the clock's origin; Redis `TIME` is at 2^50.6):
    // a time within one period of 2^53 makes the stored state itself leave the exact range.
    t % (MAX_EXACT / 2)
}

/// Stored integers: from a list of edge values around `now` and the period, or raw.
fn word(input: &mut Input<'_>, now: u64, period: u64) -> i64 {
    let exact = MAX_EXACT as i64;
    let now = now as i64;
    let period = period as i64;
    match input.byte() % 15 {
        0 => 0,
        1 => 1,
        2 => now,
        3 => now - 1,
        4 => now.saturating_add(1),
        5 => now.saturating_add(period),
        6 => now.saturating_sub(period),
        7 => period,
        8 => now / period.max(1),
        9 => exact - 1,
        10 => exact,
        11 => -1,
        12 => (input.u64() % (1 << 20)) as i64,
        13 => i64::from(input.byte() % 4),
        _ => input.u64() as i64,
    }
}

fn stored_value(input: &mut Input<'_>, kind: AlgorithmKind, now: u64, period: u64) -> Stored {
    let width = match kind {
        AlgorithmKind::SlidingWindow => 3,
        // The header (total, magic, start), then 1 to 4 entries.
        AlgorithmKind::SlidingLog => 3 + 2 * (1 + usize::from(input.byte() % 4)),
        _ => 2,
    };
    let magic = kind == AlgorithmKind::SlidingLog && !input.byte().is_multiple_of(8);
    match input.byte() % 8 {
        0 => Stored::Missing,
        1 => Stored::List,
        2 => Stored::Bytes(input.until(0xff).iter().copied().take(256).collect()),
        3 => {
            // One word too many or too few.
            let n = if input.byte() & 1 == 0 {
                width + 1
            } else {
                width - 1
            };
            Stored::Bytes(
                (0..n)
                    .flat_map(|_| word(input, now, period).to_le_bytes())
                    .collect(),
            )
        }
        _ => Stored::Bytes(
            (0..width)
                .flat_map(|i| {
                    let w = if magic && i == 1 {
                        SL_MAGIC
                    } else {
                        word(input, now, period)
                    };
                    w.to_le_bytes()
                })
                .collect(),
        ),
    }
}

/// The integers the scripts accept at a key of `kind` (the layout each script documents), or
/// `None` for a value they must reset. A missing key decodes as no integers: a fresh key.
fn decodable(kind: AlgorithmKind, stored: &Stored) -> Option<Vec<u64>> {
    let bytes = match stored {
        Stored::Missing => return Some(Vec::new()),
        Stored::List => return None,
        Stored::Bytes(b) => b,
    };
    if kind == AlgorithmKind::SlidingLog {
        return decodable_log(bytes);
    }
    let ok_len = match kind {
        AlgorithmKind::SlidingWindow => bytes.len() == 24,
        _ => bytes.len() == 16,
    };
    let words = ints(bytes);
    (ok_len && words.iter().all(|&w| in_range(w)))
        .then(|| words.into_iter().map(|w| w as u64).collect())
}

/// The sliding log's layout (`sliding_log.lua`): an empty string is a fresh key; otherwise a
/// 24-byte header (total, magic, start) and 16-byte entries (at, units), read lazily, so the
/// loader checks the header and the first live and the newest entries only.
fn decodable_log(bytes: &[u8]) -> Option<Vec<u64>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    if bytes.len() < 40 || !(bytes.len() - 24).is_multiple_of(16) {
        return None;
    }
    let w = ints(bytes);
    let (total, magic, start) = (w[0], w[1], w[2]);
    let n = ((bytes.len() - 24) / 16) as i64;
    if magic != SL_MAGIC || start < 0 || start >= n || !in_range(total) || total < n - start {
        return None;
    }
    let entry = |i: i64| (w[3 + 2 * i as usize], w[4 + 2 * i as usize]);
    let ((first, units), (last, last_units)) = (entry(start), entry(n - 1));
    let ok = in_range(first) && in_range(last) && first <= last && units >= 1 && last_units >= 1;
    ok.then(|| w.into_iter().map(|x| x as u64).collect())
}

/// `sliding_log.lua`'s SL_MAGIC, the header's second integer.
const SL_MAGIC: i64 = 1_936_483_175;

fn ints(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

fn in_range(w: i64) -> bool {
    (0..MAX_EXACT as i64).contains(&w)
}

/// The Rust algorithm's decide-and-charge on the decoded state (`words` empty: a fresh key), or
/// `None` for the sliding log.
fn rust_decision(
    kind: AlgorithmKind,
    quota: Quota,
    words: &[u64],
    now: u64,
    cost: u64,
) -> Option<Decision> {
    let w = |i: usize| words.get(i).copied().unwrap_or(0);
    Some(match kind {
        AlgorithmKind::TokenBucket => TokenBucket::new(quota).ok()?.check(
            &mut TokenBucketState {
                deficit: w(0),
                last: w(1),
            },
            now,
            cost,
        ),
        AlgorithmKind::LeakyBucket => LeakyBucket::new(quota).ok()?.check(
            &mut LeakyBucketState {
                level: w(0),
                last: w(1),
            },
            now,
            cost,
        ),
        AlgorithmKind::Gcra => Gcra::new(quota).ok()?.check(
            &mut GcraState {
                tat: w(0),
                sub: w(1),
            },
            now,
            cost,
        ),
        AlgorithmKind::FixedWindow => FixedWindow::new(quota).ok()?.check(
            &mut FixedWindowState {
                window: w(0),
                count: w(1),
            },
            now,
            cost,
        ),
        AlgorithmKind::SlidingWindow => SlidingWindow::new(quota).ok()?.check(
            &mut SlidingWindowState {
                last: w(0),
                prev: w(1),
                cur: w(2),
            },
            now,
            cost,
        ),
        _ => return None,
    })
}
