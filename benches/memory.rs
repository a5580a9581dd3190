//! The in-memory store side by side with governor's keyed limiter, on the path the layer takes.
//!
//! `cargo bench --bench memory` (about two minutes) measures one check through
//! [`Store::check`] on a store built by `MemoryBackend::new()` (default clock, default shards)
//! against governor's `DefaultKeyedRateLimiter` (its default clock), for 1, 1,000 and 1,000,000
//! keys, on 1 and 2 threads, then the heap bytes per key at 1,000,000 keys and the memory held
//! when twice the key bound in distinct keys arrive. It prints the tables and writes them to
//! `target/bench-report/memory.json` (section `memory`, plot `memory.svg`).
//!
//! # Method
//!
//! - Keys are IPv4 addresses (the usual key of an HTTP limiter: each side builds its key from the
//!   address bits, as a key extractor would), visited in a pseudo-random order: key
//!   `splitmix64(counter) % N`. With 2 threads each thread has its own half of the N keys
//!   (distinct key sets), and the figure is wall time / checks of both threads; the scaling
//!   figure is the 1-thread time over the 2-thread time (2.0 would be perfect). A reference
//!   that is not a limiter (arithmetic on the key's bits, no memory) is timed the same way: its
//!   2-thread figure is the most this machine gives a second thread.
//! - Both limiters are built and filled with every key before the rounds start; then each round
//!   times every variant once per thread count (its 1- and 2-thread runs back to back), in an
//!   order that rotates from round to round, so that drift on a shared machine hits all of them
//!   alike. A time is the median of [`ROUNDS`] rounds; a ratio (governor over tollgate, 1 thread
//!   over 2) is the median over the rounds of that round's ratio, so that the two figures of a
//!   ratio are always taken within a second of each other.
//! - The quota is 1,000 per hour (burst 1,000) on both sides: a key charged once stays charged
//!   for 3.6 s, longer than a pass over a million keys, so every key stays in memory; the hot key
//!   and the 1,000 keys run out and are mostly refused, the million are allowed.
//! - `MemoryBackend::new()` bounds a limit to 100,000 keys. For 1,000,000 keys the bound is
//!   raised to 1,050,000 (governor's map is unbounded and keeps every key): everything else stays
//!   the default. Without it the table would be full of spenders, and most checks would go to
//!   the overflow bucket.
//!
//! Secondary rows: [`MemoryStore::check_one`] (the direct API) and the other clocks
//! ([`CoarseClock`], [`QuantaClock`], [`SystemClock`]) on the same path.
//!
//! One case alone: `cargo bench --bench memory -- --case KEYS THREADS`.
//!
//! Instruction counts (reproducible on a loaded machine): `memory --spin VARIANT KEYS CHECKS`
//! prefills then runs CHECKS checks on one thread, for `valgrind --tool=callgrind` or
//! `perf stat` (subtract a run with 0 checks).

#[path = "common/report.rs"]
mod report;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use governor::{DefaultKeyedRateLimiter, RateLimiter};
use report::{Plot, Section, Table};
use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::{Clock, CoarseClock, QuantaClock, SystemClock};
use tollgate::key::Key;
use tollgate::store::{
    memory::MemoryBackend, memory::MemoryStore, Backend, Checked, LimitCheck, LimitSpec, Store,
};
use tollgate::{Name, Quota};

// ---------------------------------------------------------------------------------------------
// Counting allocator: live heap bytes and allocation count, for bytes per key and to show that a
// check of an existing key does not allocate.

struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees are ours; the counters are only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as is (see above).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as is (see above).
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as is (see above).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as is (see above).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------------
// The limiters.

const PER_HOUR: u32 = 1_000;
const MILLION: usize = 1_000_000;
/// Rounds per case; the figure is their median. Many short rounds rather than a few long ones:
/// this VM's speed drifts within seconds, and each variant then samples every phase of it.
const ROUNDS: usize = 21;
/// Checks timed per variant and round (both threads together with 2 threads).
const CHECKS: u64 = 500_000;

fn spec() -> LimitSpec {
    LimitSpec::new(
        Name::new("bench"),
        Quota::per_hour(u64::from(PER_HOUR)),
        AlgorithmKind::TokenBucket,
    )
}

/// The default backend, with room for every key at a million (see the module docs).
fn backend(keys: usize) -> MemoryBackend {
    let backend = MemoryBackend::new();
    if keys > MemoryBackend::DEFAULT_MAX_KEYS {
        backend.max_keys(keys + keys / 20)
    } else {
        backend
    }
}

fn tollgate_store<C: Clock>(keys: usize, clock: C) -> MemoryStore<C> {
    backend(keys)
        .clock(clock)
        .build(&[spec()])
        .expect("valid bench configuration")
}

fn governor_limiter() -> DefaultKeyedRateLimiter<IpAddr> {
    RateLimiter::keyed(governor::Quota::per_hour(
        NonZeroU32::new(PER_HOUR).expect("non-zero"),
    ))
}

#[inline]
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The address bits of key `k` (10.0.0.0/8 plus `k`).
#[inline]
fn ip(k: u64) -> u32 {
    0x0A00_0000 + k as u32
}

/// One check of the IPv4 address with bits `ip`, each side building its own key.
trait Limiter: Sync {
    fn check(&self, ip: u32) -> bool;
}

/// `Store::check`, the path the layer takes.
struct ViaStore<C>(MemoryStore<C>);

impl<C: Clock> Limiter for ViaStore<C> {
    #[inline]
    fn check(&self, ip: u32) -> bool {
        let checks = [LimitCheck::new(
            0,
            Key::ip(IpAddr::V4(Ipv4Addr::from(ip))),
            1,
        )];
        match self.0.check(&checks) {
            Checked::Ready(Ok(decisions)) => decisions.allowed(),
            Checked::Ready(Err(_)) => false,
            Checked::Pending(never) => match never {},
        }
    }
}

/// `MemoryStore::check_one`, the direct API.
struct Direct<C>(MemoryStore<C>);

impl<C: Clock> Limiter for Direct<C> {
    #[inline]
    fn check(&self, ip: u32) -> bool {
        self.0
            .check_one(0, &Key::ip(IpAddr::V4(Ipv4Addr::from(ip))), 1)
            .is_ok_and(|d| d.allowed())
    }
}

impl Limiter for DefaultKeyedRateLimiter<IpAddr> {
    #[inline]
    fn check(&self, ip: u32) -> bool {
        self.check_key(&IpAddr::V4(Ipv4Addr::from(ip))).is_ok()
    }
}

const GOVERNOR: &str = "governor";
const TOLLGATE: &str = "tollgate";
const CHECK_ONE: &str = "tollgate check_one";
const COARSE: &str = "tollgate CoarseClock";
const QUANTA: &str = "tollgate QuantaClock";
const SYSTEM: &str = "tollgate SystemClock";
const DEFAULT_BOUND: &str = "tollgate bound 100 000";
const REFERENCE: &str = "reference: shares nothing";

/// Every variant: the headline pair first, then the secondary rows, then the reference.
const VARIANTS: [&str; 8] = [
    GOVERNOR,
    TOLLGATE,
    CHECK_ONE,
    COARSE,
    QUANTA,
    SYSTEM,
    DEFAULT_BOUND,
    REFERENCE,
];

/// Not a limiter: a chain of dependent arithmetic on the key's bits, about as long as a check,
/// that reads and writes no memory. Its 2-thread over 1-thread figure is what this machine gives
/// a second thread that shares nothing with the first, the most a limiter could reach on it.
struct SharesNothing;

impl Limiter for SharesNothing {
    #[inline]
    fn check(&self, ip: u32) -> bool {
        let mut x = u64::from(ip);
        for _ in 0..12 {
            x = splitmix64(x);
        }
        x & 1 == 0
    }
}

fn build(variant: &str, keys: usize) -> Box<dyn Limiter> {
    match variant {
        GOVERNOR => Box::new(governor_limiter()),
        TOLLGATE => Box::new(ViaStore(
            backend(keys).build(&[spec()]).expect("valid configuration"),
        )),
        CHECK_ONE => Box::new(Direct(
            backend(keys).build(&[spec()]).expect("valid configuration"),
        )),
        COARSE => Box::new(ViaStore(tollgate_store(keys, CoarseClock::new()))),
        QUANTA => Box::new(ViaStore(tollgate_store(keys, QuantaClock::new()))),
        SYSTEM => Box::new(ViaStore(tollgate_store(keys, SystemClock::new()))),
        // `MemoryBackend::new()` as is: at a million keys, the table holds 100 000 of them and
        // the others are decided by the overflow bucket (one shared state): another workload.
        DEFAULT_BOUND => Box::new(ViaStore(
            MemoryBackend::new()
                .build(&[spec()])
                .expect("valid configuration"),
        )),
        REFERENCE => Box::new(SharesNothing),
        other => panic!("unknown variant {other}"),
    }
}

fn prefill(limiter: &dyn Limiter, keys: usize) {
    for k in 0..keys as u64 {
        limiter.check(ip(k));
    }
}

/// Key `counter` of thread `thread` of `threads`, over `keys` keys split between the threads.
#[inline]
fn key_of(counter: u64, thread: u64, threads: u64, keys: u64) -> u64 {
    let share = (keys / threads).max(1);
    (splitmix64(counter) % share) * threads + thread
}

/// Times `checks` checks on `threads` threads; ns per check (wall time / all checks).
fn run(limiter: &dyn Limiter, keys: usize, threads: usize, checks: u64, seed: u64) -> f64 {
    let per_thread = checks / threads as u64;
    let (keys, threads_u) = (keys as u64, threads as u64);
    let elapsed = if threads == 1 {
        let start = Instant::now();
        for c in seed..seed + per_thread {
            black_box(limiter.check(ip(key_of(c, 0, 1, keys))));
        }
        start.elapsed()
    } else {
        let barrier = Barrier::new(threads + 1);
        std::thread::scope(|s| {
            for t in 0..threads_u {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let from = seed + t * per_thread;
                    for c in from..from + per_thread {
                        black_box(limiter.check(ip(key_of(c, t, threads_u, keys))));
                    }
                });
            }
            barrier.wait();
            let start = Instant::now();
            // Joined at the end of the scope.
            start
        })
        .elapsed()
    };
    elapsed.as_nanos() as f64 / (per_thread * threads_u) as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Every variant built and filled for `keys` keys, then [`ROUNDS`] alternating rounds; in each,
/// every variant runs once per thread count in `threads`, those runs back to back (so that a
/// variant's 1-thread and 2-thread figures of a round are taken within a fraction of a second of
/// each other). Returns, per thread count, per variant ([`VARIANTS`] order), the ns per check of
/// every round.
fn measure_keys(keys: usize, threads: &[usize]) -> Vec<Vec<Vec<f64>>> {
    let limiters: Vec<Box<dyn Limiter>> = VARIANTS
        .iter()
        .map(|v| {
            let limiter = build(v, keys);
            prefill(&*limiter, keys);
            limiter
        })
        .collect();
    // A warm-up pass each (per thread count).
    for limiter in &limiters {
        for &t in threads {
            run(&**limiter, keys, t, CHECKS / 10, 1 << 40);
        }
    }
    let mut times = vec![vec![Vec::new(); VARIANTS.len()]; threads.len()];
    for round in 0..ROUNDS {
        for i in 0..VARIANTS.len() {
            // Rotate the order, and reverse it every other round (the thread counts too).
            let j = (i + round) % VARIANTS.len();
            let j = if round % 2 == 1 {
                VARIANTS.len() - 1 - j
            } else {
                j
            };
            let seed = (round as u64) << 32;
            for k in 0..threads.len() {
                let k = if round % 2 == 1 {
                    threads.len() - 1 - k
                } else {
                    k
                };
                times[k][j].push(run(&*limiters[j], keys, threads[k], CHECKS, seed));
            }
        }
    }
    times
}

/// Every case's per-round figures: `times[case][variant][round]`, cases in [`CASES`] order.
struct Measured {
    times: Vec<Vec<Vec<f64>>>,
}

impl Measured {
    /// The hot key on one thread, then 1 000 and 1 000 000 keys, each on 1 and 2 threads in the
    /// same rounds.
    fn run() -> Self {
        let mut hot = measure_keys(1, &[1]);
        println!("1 (hot) keys, 1 thread(s): done");
        let mut thousand = measure_keys(1_000, &[1, 2]);
        println!("1 000 keys, 1 and 2 thread(s): done");
        let mut million = measure_keys(MILLION, &[1, 2]);
        println!("1 000 000 keys, 1 and 2 thread(s): done");
        let (million_two, thousand_two) = (million.remove(1), thousand.remove(1));
        Self {
            times: vec![
                hot.remove(0),
                thousand.remove(0),
                million.remove(0),
                thousand_two,
                million_two,
            ],
        }
    }

    /// The median ns per check of every variant of every case.
    fn medians(&self) -> Vec<Vec<f64>> {
        self.times
            .iter()
            .map(|case| case.iter().map(|r| median(r.clone())).collect())
            .collect()
    }

    /// The median over the rounds of case `a`'s variant `va` over case `b`'s variant `vb`,
    /// each round's two figures taken in that round.
    fn paired(&self, (a, va): (usize, usize), (b, vb): (usize, usize)) -> f64 {
        report::median_ratio(&self.times[a][va], &self.times[b][vb])
    }
}

// ---------------------------------------------------------------------------------------------
// Memory.

/// Live heap bytes added by building a limiter with `build` and checking `keys` distinct keys.
fn bytes_for<L: Limiter>(build: impl FnOnce() -> L, keys: usize) -> (usize, L) {
    let before = live_bytes();
    let limiter = build();
    for k in 0..keys as u64 {
        limiter.check(ip(k));
    }
    (live_bytes().saturating_sub(before), limiter)
}

struct MemoryFigures {
    ours_per_key: f64,
    theirs_per_key: f64,
    ours_over: usize,
    theirs_over: usize,
    ours_len: usize,
    theirs_len: usize,
    allocations_per_million_checks: usize,
}

fn measure_memory() -> MemoryFigures {
    let (ours, store) = bytes_for(
        || ViaStore(backend(MILLION).build(&[spec()]).expect("valid")),
        MILLION,
    );
    // A check of an existing key allocates nothing.
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for k in 0..MILLION as u64 {
        store.check(ip(k));
    }
    let allocations_per_million_checks = ALLOCATIONS.load(Ordering::Relaxed) - before;
    drop(store);
    let (theirs, limiter) = bytes_for(governor_limiter, MILLION);
    drop(limiter);

    // Twice the bound in distinct keys: ours stays at the bound, governor's keeps growing.
    let (ours_over, store) = bytes_for(
        || {
            ViaStore(
                MemoryBackend::new()
                    .max_keys(MILLION)
                    .build(&[spec()])
                    .expect("valid"),
            )
        },
        2 * MILLION,
    );
    let ours_len = store.0.len();
    drop(store);
    let (theirs_over, limiter) = bytes_for(governor_limiter, 2 * MILLION);
    let theirs_len = limiter.len();
    drop(limiter);

    MemoryFigures {
        ours_per_key: ours as f64 / MILLION as f64,
        theirs_per_key: theirs as f64 / MILLION as f64,
        ours_over,
        theirs_over,
        ours_len,
        theirs_len,
        allocations_per_million_checks,
    }
}

// ---------------------------------------------------------------------------------------------
// Report.

/// The cases: (label, keys, threads).
const CASES: [(&str, usize, usize); 5] = [
    ("1 (hot)", 1, 1),
    ("1 000", 1_000, 1),
    ("1 000 000", MILLION, 1),
    ("1 000", 1_000, 2),
    ("1 000 000", MILLION, 2),
];

fn report(measured: &Measured, memory: &MemoryFigures, load: &str) {
    let results = &measured.medians();
    let mut section = Section::new(
        "memory",
        "In-memory store against governor",
        "cargo bench --bench memory",
        &format!(
            "One check through `Store::check` on `MemoryBackend::new()` (default clock and shards; \
             for 1 000 000 keys the key bound is raised to 1 050 000 so every key stays held, as in \
             governor's unbounded map) against governor's `DefaultKeyedRateLimiter` (its default \
             clock), 1 000 per hour on both sides. Keys are IPv4 addresses in pseudo-random order \
             (`splitmix64(counter) % N`); with 2 threads each thread has its own half of the keys \
             and the figure is wall time / checks of both threads. Every variant is built and \
             filled first, then each of {ROUNDS} rounds times every variant once ({CHECKS} checks) \
             in a rotating order (a key count's 1- and 2-thread runs of a variant back to back); \
             figures are the medians, and a ratio the median over the rounds of that round's \
             ratio. The benches build with the \
             `metrics` feature (the examples' dev-dependency enables it): tollgate's check then \
             also counts calls on a thread-local, to time one in 64."
        ),
    );
    let mut columns = vec!["keys", "threads"];
    columns.extend(VARIANTS);
    columns.push("governor / tollgate");
    let mut table = Table::new(
        format!("ns per check (median of {ROUNDS} alternating rounds)"),
        &columns,
    );
    let gov = 0;
    let ours = 1;
    for (case, (&(label, _, threads), figures)) in CASES.iter().zip(results).enumerate() {
        let mut row = vec![label.to_string(), threads.to_string()];
        row.extend(figures.iter().map(|ns| format!("{ns:.1}")));
        let ratio = measured.paired((case, gov), (case, ours));
        row.push(format!("{ratio:.2}x"));
        table.row(&row);
        section.ratio(
            "Store::check vs governor keyed (ns per check)",
            &format!("{label} keys, {threads} thread(s)"),
            ratio,
            1.0,
        );
    }
    section.table(table);

    let mut scaling = Table::new(
        "2-thread throughput over 1-thread (1-thread ns / 2-thread ns; 2.0 is perfect)",
        &["keys", "tollgate", "governor", "reference: shares nothing"],
    );
    let reference = VARIANTS.len() - 1;
    for (one, two) in [(1, 3), (2, 4)] {
        let (label, _, _) = CASES[one];
        let up = |v| measured.paired((one, v), (two, v));
        let (ours_up, gov_up, reference_up) = (up(ours), up(gov), up(reference));
        scaling.row(&[
            label.to_string(),
            format!("{ours_up:.2}x"),
            format!("{gov_up:.2}x"),
            format!("{reference_up:.2}x"),
        ]);
        section.ratio(
            "2 threads / 1 thread throughput (tollgate)",
            &format!("{label} keys"),
            ours_up,
            1.5,
        );
    }
    section.table(scaling);

    let mut mem = Table::new("Memory", &["figure", "tollgate", "governor"]);
    mem.row(&[
        "heap bytes per key at 1 000 000 keys".to_string(),
        format!("{:.1}", memory.ours_per_key),
        format!("{:.1}", memory.theirs_per_key),
    ]);
    mem.row(&[
        "2 000 000 distinct keys, tollgate bound 1 000 000: keys held".to_string(),
        memory.ours_len.to_string(),
        memory.theirs_len.to_string(),
    ]);
    mem.row(&[
        "... heap MB".to_string(),
        format!("{:.1}", memory.ours_over as f64 / 1e6),
        format!("{:.1}", memory.theirs_over as f64 / 1e6),
    ]);
    mem.row(&[
        "allocations in 1 000 000 checks of held keys".to_string(),
        memory.allocations_per_million_checks.to_string(),
        "-".to_string(),
    ]);
    section.table(mem);
    section.ratio(
        "heap bytes per key at 1 000 000 keys (governor / tollgate)",
        "1 000 000 keys",
        memory.theirs_per_key / memory.ours_per_key,
        1.0,
    );

    let mut plot = Plot::new(
        "memory.svg",
        "ns per check against key count (Store::check vs governor keyed)",
        "keys",
        "ns per check",
    )
    .log_x();
    for (name, col) in [("tollgate", ours), ("governor", gov)] {
        for threads in [1, 2] {
            let points: Vec<(f64, f64)> = CASES
                .iter()
                .zip(results)
                .filter(|((_, _, t), _)| *t == threads)
                .map(|(&(_, keys, _), r)| (keys as f64, r[col]))
                .collect();
            plot.series(&format!("{name}, {threads} thread(s)"), points);
        }
    }
    section.plot(plot);
    section.note(
        "Secondary columns: `check_one` is the direct API (no `Decisions`); the clock columns \
         run `Store::check` on a store with that clock instead of the default.",
    );
    section.note(
        "2-thread rows: N keys split into two distinct halves, one per thread, so the hot \
         (1 key) case has no 2-thread row.",
    );
    section.note(
        "`reference: shares nothing` is not a limiter: twelve rounds of splitmix64 on the key's \
         bits per call, which touch no memory, timed by the same loop in the same rounds. Its \
         2-thread figure is what this machine gives a second thread that shares nothing with \
         the first: no limiter can scale better here.",
    );
    section.note(
        "`tollgate bound 100 000`: `MemoryBackend::new()` exactly (bound 100 000 keys per limit). \
         At 1 000 000 keys it holds 100 000 and decides the others with the overflow bucket \
         (one state shared by every key that finds its shard full of spenders): a small, \
         cache-resident working set, so fast, but not the same work as holding every key.",
    );
    section.note(format!(
        "Load average when the run started (1, 5, 15 min): {load}. Two threads on 2 cores need \
         both cores free: with other work running, the 2-thread rows measure the contention.",
    ));
    section.write();
}

/// The machine's load average (`/proc/loadavg`, first three fields).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_else(|_| "unknown".to_string())
}

fn print(measured: &Measured, memory: &MemoryFigures) {
    let results = &measured.medians();
    println!("\n=== ns per check (median of {ROUNDS} alternating rounds) ===");
    print!("{:<10} {:>3}", "keys", "thr");
    for v in VARIANTS {
        print!(" | {v:>20}");
    }
    println!(" | gov/tollgate");
    for (case, (&(label, _, threads), r)) in CASES.iter().zip(results).enumerate() {
        print!("{label:<10} {threads:>3}");
        for ns in r {
            print!(" | {ns:>20.1}");
        }
        println!(" | {:>11.2}x", measured.paired((case, 0), (case, 1)));
    }
    println!("\n2-thread speed-up (1-thread ns / 2-thread ns, median of the rounds' ratios):");
    let reference = VARIANTS.len() - 1;
    for (one, two) in [(1, 3), (2, 4)] {
        let up = |v| measured.paired((one, v), (two, v));
        println!(
            "{:<10} tollgate {:.2}x  governor {:.2}x  reference (shares nothing) {:.2}x",
            CASES[one].0,
            up(1),
            up(0),
            up(reference)
        );
    }
    println!(
        "\nheap bytes per key at 1,000,000 keys: tollgate {:.1}, governor {:.1}",
        memory.ours_per_key, memory.theirs_per_key
    );
    println!(
        "allocations in 1,000,000 checks of held keys (tollgate): {}",
        memory.allocations_per_million_checks
    );
    println!(
        "2,000,000 distinct keys, tollgate bound 1,000,000: tollgate {} keys, {:.1} MB; governor {} keys, {:.1} MB",
        memory.ours_len,
        memory.ours_over as f64 / 1e6,
        memory.theirs_len,
        memory.theirs_over as f64 / 1e6
    );
}

/// `memory --spin VARIANT KEYS CHECKS`: prefills, then runs CHECKS checks on one thread in the
/// bench's key order and exits (for callgrind or `perf stat`; subtract a run with 0 checks).
fn spin(args: &[String]) {
    let variant = args[0].as_str();
    let keys: usize = args[1].parse().expect("KEYS");
    let checks: u64 = args[2].parse().expect("CHECKS");
    let limiter = build(variant, keys);
    prefill(&*limiter, keys);
    for c in 0..checks {
        black_box(limiter.check(ip(key_of(c, 0, 1, keys as u64))));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--spin") {
        return spin(&args[at + 1..]);
    }
    // `--case KEYS THREADS`: that case alone, printed (for an A/B of one change).
    if let Some(at) = args.iter().position(|a| a == "--case") {
        let arg = |i: usize| -> usize {
            args.get(at + i)
                .and_then(|a| a.parse().ok())
                .expect("usage: memory --case KEYS THREADS")
        };
        let (keys, threads) = (arg(1), arg(2));
        let r = measure_keys(keys, &[threads]).remove(0);
        for (variant, ns) in VARIANTS.iter().zip(r) {
            println!(
                "{keys} keys, {threads} thread(s), {variant}: {:.1} ns",
                median(ns)
            );
        }
        return;
    }
    // `cargo test --benches` runs benches once in test mode: a tiny smoke run.
    if args.iter().any(|a| a == "--test") || cfg!(debug_assertions) {
        let r = measure_small();
        println!("smoke: {r:?}");
        return;
    }
    let load = load_average();
    let memory = measure_memory();
    let measured = Measured::run();
    print(&measured, &memory);
    report(&measured, &memory, &load);
}

/// A quick pass of every variant (test mode).
fn measure_small() -> Vec<f64> {
    VARIANTS
        .iter()
        .map(|v| {
            let limiter = build(v, 100);
            prefill(&*limiter, 100);
            run(&*limiter, 100, 2, 1_000, 0)
        })
        .collect()
}
