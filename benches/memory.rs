//! The in-memory store side by side with governor's keyed limiter.
//!
//! `cargo bench --bench memory` measures, for both, the time of one check on one hot key, on
//! 1,000 keys and on 1,000,000 keys, with 1 and 2 threads, and the heap bytes per key at
//! 1,000,000 keys (with a counting global allocator), then prints a ratio summary. Keys are IPv4
//! addresses (the usual key of an HTTP limiter), visited in a fixed pseudo-random permutation.
//! With 2 threads, the figure is wall time divided by the checks of both threads (throughput).
//!
//! Each limiter is built, filled and measured alone, in pairs on the same kind of clock:
//! tollgate on [`QuantaClock`] against governor's default (quanta), tollgate on [`CoarseClock`]
//! against governor on quanta's upkeep clock (both updated every millisecond), and tollgate on
//! its default [`SystemClock`]. The run takes about three and a half minutes.
//!
//! Wall-clock figures on a shared 2-core machine are noisy. For CPU time instead, run one
//! variant alone under `perf stat -e task-clock` with `--spin VARIANT KEYS CHECKS` (see
//! [`spin`]) and subtract a run with 0 checks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use governor::clock::QuantaUpkeepClock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::{Clock, CoarseClock, ManualClock, QuantaClock, SystemClock};
use tollgate::key::Key;
use tollgate::store::{Backend, LimitSpec, MemoryBackend, MemoryStore};
use tollgate::{PolicyName, Quota};

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
// The two limiters under the same quota: 1,000 per hour (burst 1,000). A key charged once stays
// charged for 3.6 s, longer than a pass over a million keys, so the million keys stay resident
// (with a fast refill, tollgate would recycle keys that are already fresh again, and measure
// something else). The hot key and the 1,000 keys run out and are mostly rejected; the million
// are allowed.

const PER_HOUR: u32 = 1_000;
const MILLION: usize = 1_000_000;
const SIZES: [(&str, usize); 3] = [("hot", 1), ("1k", 1_000), ("1M", MILLION)];

fn tollgate_store<C: Clock>(clock: C, max_keys: usize) -> MemoryStore<C> {
    let spec = LimitSpec::new(
        PolicyName::new("bench"),
        Quota::per_hour(u64::from(PER_HOUR)),
        AlgorithmKind::TokenBucket,
    );
    MemoryBackend::new()
        .max_keys(max_keys)
        .clock(clock)
        .build(&[spec])
        .expect("valid bench configuration")
}

/// The key bound for `keys` active keys: the default (100,000), or 5% headroom over a million
/// (shards fill unevenly, by a few tenths of a percent at that size, and a full shard evicts).
fn headroom(keys: usize) -> usize {
    (keys + keys / 20).max(MemoryBackend::DEFAULT_MAX_KEYS)
}

fn governor_quota() -> governor::Quota {
    governor::Quota::per_hour(NonZeroU32::new(PER_HOUR).expect("non-zero"))
}

/// governor's keyed limiter with its coarse clock (quanta's upkeep thread, every millisecond).
fn governor_upkeep_limiter() -> RateLimiter<IpAddr, DashMapStateStore<IpAddr>, QuantaUpkeepClock> {
    let clock = QuantaUpkeepClock::from_interval(Duration::from_millis(1)).expect("upkeep thread");
    RateLimiter::dashmap_with_clock(governor_quota(), clock)
}

fn governor_limiter() -> DefaultKeyedRateLimiter<IpAddr> {
    RateLimiter::keyed(governor_quota())
}

/// The `i`-th key of a set of `n` (as the bits of an IPv4 address in 10.0.0.0/8), visiting all
/// `n` in a fixed pseudo-random order.
#[inline]
fn ip(i: usize, n: usize) -> u32 {
    // 999_983 is prime and does not divide 10^k, so multiplying by it permutes 0..n.
    let k = (i as u64 * 999_983) % n as u64;
    0x0A00_0000 + k as u32
}

/// One check of the IPv4 address with bits `ip`. Each limiter builds its own key from the bits,
/// as a key extractor would from the peer address.
trait Limiter: Sync {
    fn check(&self, ip: u32) -> bool;
}

impl<C: Clock> Limiter for MemoryStore<C> {
    #[inline]
    fn check(&self, ip: u32) -> bool {
        self.check_one(0, &Key::ip(IpAddr::V4(Ipv4Addr::from(ip))), 1)
            .map(|d| d.allowed())
            .unwrap_or(false)
    }
}

impl<C> Limiter for RateLimiter<IpAddr, DashMapStateStore<IpAddr>, C, NoOpMiddleware<C::Instant>>
where
    C: governor::clock::Clock + Sync,
{
    #[inline]
    fn check(&self, ip: u32) -> bool {
        self.check_key(&IpAddr::V4(Ipv4Addr::from(ip))).is_ok()
    }
}

fn prefill(limiter: &dyn Limiter, n: usize) {
    for i in 0..n {
        limiter.check(ip(i, n));
    }
}

/// Runs `iters` checks over `n` keys split over `threads` threads; returns the wall time.
fn run(limiter: &dyn Limiter, n: usize, threads: usize, iters: u64) -> Duration {
    let per_thread = iters.div_ceil(threads as u64) as usize;
    let start = Instant::now();
    if threads == 1 {
        for i in 0..per_thread {
            black_box(limiter.check(ip(i, n)));
        }
    } else {
        std::thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || {
                    // Threads start at different points of the key order.
                    let offset = t * n / threads + t * 7_919;
                    for i in offset..offset + per_thread {
                        black_box(limiter.check(ip(i, n)));
                    }
                });
            }
        });
    }
    start.elapsed()
}

/// The variants compared, in pairs with the same kind of clock: precise (tollgate on quanta,
/// governor's default on quanta), coarse (tollgate's `CoarseClock`, governor on quanta's upkeep
/// clock, both updated every millisecond), and tollgate's default (`Instant`).
const VARIANTS: [&str; 5] = [
    "tollgate_quanta",
    "governor",
    "tollgate_coarse",
    "governor_upkeep",
    "tollgate_system",
];

/// A limiter of `variant` (one of [`VARIANTS`], or `tollgate_manual`, whose time never moves)
/// sized for `n` keys.
fn build(variant: &str, n: usize) -> Box<dyn Limiter> {
    match variant {
        "tollgate_quanta" => Box::new(tollgate_store(QuantaClock::new(), headroom(n))),
        "tollgate_coarse" => Box::new(tollgate_store(CoarseClock::new(), headroom(n))),
        "tollgate_system" => Box::new(tollgate_store(SystemClock::new(), headroom(n))),
        "tollgate_manual" => Box::new(tollgate_store(ManualClock::new(), headroom(n))),
        "governor" => Box::new(governor_limiter()),
        "governor_upkeep" => Box::new(governor_upkeep_limiter()),
        other => panic!("unknown variant {other}"),
    }
}

fn bench_checks(c: &mut Criterion) {
    for (label, n) in SIZES {
        let mut group = c.benchmark_group(format!("check/{label}"));
        // One limiter at a time, built and filled just before it is measured.
        for variant in VARIANTS {
            let limiter = build(variant, n);
            prefill(&*limiter, n);
            for threads in [1, 2] {
                group.bench_function(BenchmarkId::new(variant, threads), |b| {
                    b.iter_custom(|iters| run(&*limiter, n, threads, iters))
                });
            }
        }
        group.finish();
    }
}

fn bench_clock(c: &mut Criterion) {
    let clock = SystemClock::new();
    c.bench_function("clock/system", |b| b.iter(|| black_box(clock.now_micros())));
    let clock = QuantaClock::new();
    c.bench_function("clock/quanta", |b| b.iter(|| black_box(clock.now_micros())));
    let clock = CoarseClock::new();
    c.bench_function("clock/coarse", |b| b.iter(|| black_box(clock.now_micros())));
}

// ---------------------------------------------------------------------------------------------
// Memory.

/// Live heap bytes added by building a limiter with `build` and checking `keys` distinct keys.
fn bytes_for<L: Limiter>(build: impl FnOnce() -> L, keys: usize) -> (usize, L) {
    let before = live_bytes();
    let limiter = build();
    for i in 0..keys {
        limiter.check(ip(i, keys));
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
        || tollgate_store(SystemClock::new(), headroom(MILLION)),
        MILLION,
    );
    // A check of an existing key allocates nothing.
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for i in 0..MILLION {
        store.check(ip(i, MILLION));
    }
    let allocations_per_million_checks = ALLOCATIONS.load(Ordering::Relaxed) - before;
    drop(store);
    let (theirs, limiter) = bytes_for(governor_limiter, MILLION);
    drop(limiter);

    // Twice the bound in distinct keys: ours stays at the bound, governor's keeps growing.
    let (ours_over, store) = bytes_for(|| tollgate_store(SystemClock::new(), MILLION), 2 * MILLION);
    let ours_len = store.len();
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
// Summary.

/// Criterion's median estimate for a benchmark, in ns per iteration (the median, because on a
/// shared machine preempted samples inflate the mean). `dir` is its directory under
/// `target/criterion` (criterion turns the `/` of a group name into `_`).
fn mean_ns(dir: &str) -> Option<f64> {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("../criterion")
        .join(dir)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["median"]["point_estimate"].as_f64()
}

fn print_summary(memory: &MemoryFigures) {
    println!("\n=== ns per check (criterion median; 2 threads: wall time / checks of both) ===");
    println!(
        "{:<5} {:>3} | {:>8} {:>8} {:>6} | {:>8} {:>8} {:>6} | {:>8}",
        "keys", "thr", "t_quanta", "governor", "ratio", "t_coarse", "gov_upk", "ratio", "t_system"
    );
    for (label, _) in SIZES {
        for threads in [1, 2] {
            let [q, g, c, u, s] = VARIANTS
                .map(|v| mean_ns(&format!("check_{label}/{v}/{threads}")).unwrap_or(f64::NAN));
            println!(
                "{label:<5} {threads:>3} | {q:>8.1} {g:>8.1} {:>5.2}x | {c:>8.1} {u:>8.1} {:>5.2}x | {s:>8.1}",
                g / q,
                u / c
            );
        }
    }
    println!(
        "(ratio: governor ns / tollgate ns on the same kind of clock; above 1, tollgate is faster)"
    );
    println!("\n2-thread speed-up (1-thread ns / 2-thread ns; above 1, 2 threads are faster):");
    for (label, _) in SIZES {
        let line: Vec<String> = VARIANTS
            .map(|v| {
                let one = mean_ns(&format!("check_{label}/{v}/1"));
                let two = mean_ns(&format!("check_{label}/{v}/2"));
                let up = one.zip(two).map_or(f64::NAN, |(one, two)| one / two);
                format!("{v} {up:.2}x")
            })
            .into();
        println!("{label:<5} {}", line.join("  "));
    }
    let clocks =
        ["system", "quanta", "coarse"].map(|c| mean_ns(&format!("clock_{c}")).unwrap_or(f64::NAN));
    println!(
        "\nclock read: SystemClock {:.1} ns, QuantaClock {:.1} ns, CoarseClock {:.1} ns",
        clocks[0], clocks[1], clocks[2]
    );
    println!("\n=== heap bytes per key at 1,000,000 keys ===");
    println!(
        "tollgate {:.1}   governor {:.1}   governor/ours {:.2}x",
        memory.ours_per_key,
        memory.theirs_per_key,
        memory.theirs_per_key / memory.ours_per_key
    );
    println!(
        "allocations in 1,000,000 checks of existing keys (tollgate): {}",
        memory.allocations_per_million_checks
    );
    println!("\n=== 2,000,000 distinct keys, tollgate bound 1,000,000 ===");
    println!(
        "tollgate: {} keys, {:.1} MB   governor: {} keys, {:.1} MB (unbounded)",
        memory.ours_len,
        memory.ours_over as f64 / 1e6,
        memory.theirs_len,
        memory.theirs_over as f64 / 1e6
    );
}

/// `memory --spin VARIANT KEYS CHECKS`: prefills, then runs CHECKS checks on one thread and
/// exits, for `perf stat -e task-clock` on a machine too busy for wall-clock figures (subtract a
/// run with CHECKS = 0). VARIANT: one of [`VARIANTS`] or tollgate_manual (time never moves).
fn spin(args: &[String]) {
    let variant = args[0].as_str();
    let n: usize = args[1].parse().expect("KEYS");
    let checks: u64 = args[2].parse().expect("CHECKS");
    let limiter = build(variant, n);
    prefill(&*limiter, n);
    let per_thread = checks as usize;
    for i in 0..per_thread {
        black_box(limiter.check(ip(i, n)));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--spin") {
        return spin(&args[at + 1..]);
    }
    // Profiling one benchmark (`--profile-time`) skips the memory figures.
    let profiling = std::env::args().any(|a| a == "--profile-time");
    let memory = (!profiling).then(measure_memory);
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .configure_from_args();
    bench_clock(&mut c);
    bench_checks(&mut c);
    c.final_summary();
    if let Some(memory) = memory {
        print_summary(&memory);
    }
}
