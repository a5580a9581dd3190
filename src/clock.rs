//! Time sources. Algorithms take `now` as a parameter; stores read it from a [`Clock`].
//!
//! All limiter arithmetic uses integer **microseconds** (`u64`) on a monotonic clock: exact, cheap,
//! and identical in Rust and in the Redis Lua scripts (Lua numbers are exact up to 2^53 µs, about
//! 285 years).
//!
//! ```
//! use std::time::Duration;
//! use tollgate::clock::{Clock, ManualClock};
//!
//! let clock = ManualClock::new();
//! let t0 = clock.now_micros();
//! clock.advance(Duration::from_millis(1500));
//! assert_eq!(clock.now_micros() - t0, 1_500_000);
//! ```
//!
//! Calendar-aligned windows ([`Quota::aligned`](crate::Quota::aligned),
//! [`Quota::per_month`](crate::Quota::per_month)) need the wall-clock time too:
//! [`Clock::unix_offset_micros`] maps a clock's readings to Unix time, without changing them.
//!
//! ```
//! use tollgate::clock::{Clock, ManualClock, SystemClock};
//!
//! let system = SystemClock::new();
//! let unix_now = system.now_micros() + system.unix_offset_micros();
//! assert!(unix_now > 1_700_000_000_000_000); // after November 2023
//!
//! // A manual clock reads Unix time from 1970 unless told otherwise.
//! let manual = ManualClock::new();
//! assert_eq!(manual.unix_offset_micros(), 0);
//! manual.set_unix_offset_micros(1_709_157_599_000_000); // its zero is 2024-02-28T21:59:59Z
//! assert_eq!(manual.now_micros() + manual.unix_offset_micros(), 1_709_157_599_000_000);
//! ```

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// A monotonic source of time in microseconds.
///
/// Implementations must never go backwards. The origin is arbitrary (process start, a test's
/// zero); only differences matter, except that fixed and sliding windows are cut from the
/// clock's origin.
///
/// Implement it to decide on a time the application already keeps; the store reads it on every
/// check, so it should be cheap:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use tollgate::clock::Clock;
/// use tollgate::store::memory::MemoryBackend;
///
/// /// Time advanced by the application's own event loop, in microseconds.
/// #[derive(Debug, Clone, Default)]
/// struct LoopClock(Arc<AtomicU64>);
///
/// impl Clock for LoopClock {
///     fn now_micros(&self) -> u64 {
///         self.0.load(Ordering::Relaxed)
///     }
/// }
///
/// let clock = LoopClock::default();
/// let _backend = MemoryBackend::new().clock(clock.clone());
/// clock.0.fetch_add(1_500, Ordering::Relaxed);
/// assert_eq!(clock.now_micros(), 1_500);
/// ```
pub trait Clock: Send + Sync + Debug + 'static {
    /// Microseconds since this clock's origin.
    fn now_micros(&self) -> u64;

    /// Unix time of this clock's origin, in microseconds since 1970-01-01T00:00:00Z:
    /// `now_micros() + unix_offset_micros()` is the wall-clock time. Only calendar-aligned
    /// windows ([`Calendar`](crate::quota::Calendar)) read it; everything else runs on
    /// [`now_micros`](Self::now_micros) alone.
    ///
    /// The default asks the system's wall clock on every call (`SystemTime::now()` less
    /// `now_micros()`), which is right for any clock that runs at the speed of real time, at
    /// the price of a system call per calendar-aligned check. The clocks of this module capture
    /// it once, when they are created ([`ManualClock`] lets you set it), so a later step of the
    /// wall clock (a manual change, a leap smear) moves their calendar windows by at most that
    /// step; NTP's gradual slewing moves the monotonic clock too and is followed.
    fn unix_offset_micros(&self) -> u64 {
        unix_now_micros().saturating_sub(self.now_micros())
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_micros(&self) -> u64 {
        (**self).now_micros()
    }

    #[inline]
    fn unix_offset_micros(&self) -> u64 {
        (**self).unix_offset_micros()
    }
}

/// The system's wall clock, in µs since the Unix epoch (0 before it).
fn unix_now_micros() -> u64 {
    duration_to_micros(since_unix_epoch())
}

/// The system's wall clock as the time since the Unix epoch (zero before it).
fn since_unix_epoch() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// How long a thread's reading of the wall clock serves [`wall_now`] (then it reads again).
const WALL_REREAD_NANOS: u64 = 100_000_000;

/// The counter [`wall_now`] advances its readings with.
static COUNTER: std::sync::LazyLock<quanta::Clock> = std::sync::LazyLock::new(quanta::Clock::new);

/// Creates [`wall_now`]'s counter now: the first one created in a process waits for quanta's
/// calibration (10 to 20 ms), which belongs in building a layer, not in its first response.
pub(crate) fn warm_wall_now() {
    std::sync::LazyLock::force(&COUNTER);
}

/// The wall clock, for `X-RateLimit-Reset` as a Unix time. The system clock is read at most
/// about every 100 ms per thread; in between, the time since that reading comes from the CPU's
/// counter (quanta), a fraction of the cost of a `clock_gettime` call (35 against under 10 ns
/// on the bench machine). A step of the system clock shows within 100 ms; the counter and the
/// wall clock drift apart by well under a millisecond in that time, which whole seconds do not
/// show.
pub(crate) fn wall_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(unix_now_nanos())
}

/// [`wall_now`] as nanoseconds since the Unix epoch (0 before it), without building a
/// `SystemTime`: what a header needs.
pub(crate) fn unix_now_nanos() -> u64 {
    use std::cell::Cell;
    thread_local!(static LAST: Cell<(u64, u64)> = const { Cell::new((0, 0)) });
    let counter = &*COUNTER;
    let raw = counter.raw();
    LAST.try_with(|last| {
        let (at, wall) = last.get();
        // A counter read behind `at` (another core's) counts as no time at all.
        let since = counter.delta_as_nanos(at, raw);
        if at != 0 && since < WALL_REREAD_NANOS {
            return wall.saturating_add(since);
        }
        let wall = system_unix_nanos();
        last.set((raw, wall));
        wall
    })
    .unwrap_or_else(|_| system_unix_nanos())
}

/// The system's wall clock in ns since the Unix epoch (0 before it; saturating in 2554).
fn system_unix_nanos() -> u64 {
    u64::try_from(since_unix_epoch().as_nanos()).unwrap_or(u64::MAX)
}

/// The Unix time (µs) of an origin taken at monotonic instant `origin`, read now.
fn unix_origin_micros(origin_elapsed: Duration) -> u64 {
    unix_now_micros().saturating_sub(duration_to_micros(origin_elapsed))
}

/// The OS monotonic clock: [`std::time::Instant`], microseconds since the clock was created. Its
/// [Unix offset](Clock::unix_offset_micros) is the wall-clock time it was created at.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
    unix_origin: u64,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let origin = Instant::now();
        Self {
            origin,
            unix_origin: unix_origin_micros(origin.elapsed()),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        duration_to_micros(self.origin.elapsed())
    }

    #[inline]
    fn unix_offset_micros(&self) -> u64 {
        self.unix_origin
    }
}

/// A clock on [`tokio::time::Instant`], so `#[tokio::test(start_paused = true)]` and
/// `tokio::time::advance` drive the limiter. Its [Unix offset](Clock::unix_offset_micros) is
/// the wall-clock time it was created at, so paused time moves calendar windows too.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
    unix_origin: u64,
}

impl TokioClock {
    /// A clock whose origin is tokio's now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
            unix_origin: unix_now_micros(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        duration_to_micros(self.origin.elapsed())
    }

    #[inline]
    fn unix_offset_micros(&self) -> u64 {
        self.unix_origin
    }
}

/// A clock that moves only when told to: for tests and simulations.
///
/// Clones share the same time. Its [Unix offset](Clock::unix_offset_micros) is 0 unless
/// [set](Self::set_unix_offset_micros): its readings are then Unix time, and
/// `clock.set_micros(t)` puts it at Unix time `t`.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
    unix_offset: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.micros
            .fetch_add(duration_to_micros(by), Ordering::SeqCst);
    }

    /// Sets the clock to `micros` since its origin. Setting it backwards is ignored, so the clock
    /// stays monotonic.
    pub fn set_micros(&self, micros: u64) {
        self.micros.fetch_max(micros, Ordering::SeqCst);
    }

    /// Sets the Unix time (µs since 1970-01-01T00:00:00Z) of this clock's zero, for every clone.
    /// Set it before checks are made: windows already charged keep their calendar index.
    pub fn set_unix_offset_micros(&self, micros: u64) {
        self.unix_offset.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        self.micros.load(Ordering::SeqCst)
    }

    #[inline]
    fn unix_offset_micros(&self) -> u64 {
        self.unix_offset.load(Ordering::SeqCst)
    }
}

/// The memory store's default clock ([`MemoryBackend::new`](crate::store::memory::MemoryBackend::new)):
/// [`QuantaClock`].
///
/// Reading the time is a large share of an in-memory check, so the default is the cheapest
/// clock that is exact to the microsecond and needs no thread of its own: the CPU's counter
/// (quanta), as governor's default. [`SystemClock`] (`Instant`) costs about twice as much per
/// read on the machines of `benches/memory.rs`; [`CoarseClock`] is cheaper still, at a
/// resolution of 1 ms and the price of a ticking thread.
pub type DefaultClock = QuantaClock;

/// A clock on the CPU's time-stamp counter, via [quanta](https://docs.rs/quanta) (the clock
/// governor uses by default): the memory store's [`DefaultClock`].
///
/// One counter read, scaled: on the 2-core virtual machines this crate is benchmarked on, about
/// half the cost of reading [`SystemClock`] (a `clock_gettime` call; see `benches/memory.rs`).
/// quanta calibrates the counter against the OS monotonic clock once per process (the first
/// clock created waits for it, usually 10 to 20 ms, at most 200 ms), and uses the OS monotonic
/// clock instead when the CPU has no invariant counter, so the clock never goes backwards: a
/// reading a hair behind the origin (another core's counter) counts as the origin. Always
/// available: `quanta` is a regular dependency.
///
/// ```
/// use tollgate::clock::{Clock, QuantaClock};
///
/// let clock = QuantaClock::new();
/// let (a, b) = (clock.now_micros(), clock.now_micros());
/// assert!(b >= a);
/// ```
#[derive(Debug, Clone)]
pub struct QuantaClock {
    clock: quanta::Clock,
    origin: u64,
    unix_origin: u64,
}

impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self {
            clock,
            origin,
            unix_origin: unix_now_micros(),
        }
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        // A counter read a hair behind the origin (another core) counts as the origin.
        self.clock.delta_as_nanos(self.origin, self.clock.raw()) / 1_000
    }

    #[inline]
    fn unix_offset_micros(&self) -> u64 {
        self.unix_origin
    }
}

/// A clock read from memory: a background thread stores the monotonic time every `resolution`
/// (1 ms by default), and reading it is one atomic load.
///
/// Reading the time is otherwise the largest single cost of an in-memory check: on the 2-core
/// virtual machines this crate is benchmarked on, [`SystemClock`] adds about 35 ns of CPU time
/// to the 22 ns of the rest of the check, [`QuantaClock`] (the default) about 25 ns, this
/// clock about 1 ns. The price is resolution: the time seen lags the true time by less than
/// `resolution`.
/// A lagging clock only refills later, so a limiter on it never admits more than on an exact
/// clock, and its retry delays are at most one `resolution` too long.
///
/// Clones share one thread, which ends within one `resolution` after the last clone is dropped.
/// If the thread cannot be started, the clock reads the system time on every call instead.
///
/// ```
/// use std::time::Duration;
/// use tollgate::clock::{Clock, CoarseClock};
///
/// let clock = CoarseClock::with_resolution(Duration::from_millis(5));
/// assert_eq!(clock.resolution(), Duration::from_millis(5));
/// let (a, b) = (clock.now_micros(), clock.now_micros());
/// assert!(b >= a);
/// ```
#[derive(Debug, Clone)]
pub struct CoarseClock {
    shared: Arc<CoarseShared>,
}

#[derive(Debug)]
struct CoarseShared {
    micros: AtomicU64,
    /// Whether the updating thread runs; if not, every read asks the system.
    ticking: AtomicBool,
    origin: Instant,
    /// Unix time (µs) at `origin`.
    unix_origin: u64,
    resolution: Duration,
}

impl CoarseClock {
    /// The finest resolution: a thread waking more often would cost more than it saves.
    pub const MIN_RESOLUTION: Duration = Duration::from_micros(100);

    /// A clock updated every millisecond, whose origin is now.
    pub fn new() -> Self {
        Self::with_resolution(Duration::from_millis(1))
    }

    /// A clock updated every `resolution` (raised to at least
    /// [`MIN_RESOLUTION`](Self::MIN_RESOLUTION)), whose origin is now.
    pub fn with_resolution(resolution: Duration) -> Self {
        let origin = Instant::now();
        let shared = Arc::new(CoarseShared {
            micros: AtomicU64::new(0),
            ticking: AtomicBool::new(true),
            origin,
            unix_origin: unix_origin_micros(origin.elapsed()),
            resolution: resolution.max(Self::MIN_RESOLUTION),
        });
        let weak = Arc::downgrade(&shared);
        let resolution = shared.resolution;
        let spawned = std::thread::Builder::new()
            .name("tollgate-coarse-clock".into())
            .spawn(move || {
                std::thread::sleep(resolution);
                // Holds the clock only while storing, so dropping the last clone ends the loop.
                while let Some(shared) = weak.upgrade() {
                    let now = duration_to_micros(shared.origin.elapsed());
                    shared.micros.store(now, Ordering::Relaxed);
                    drop(shared);
                    std::thread::sleep(resolution);
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "coarse clock thread not started; reading the system clock instead");
            shared.ticking.store(false, Ordering::Relaxed);
        }
        Self { shared }
    }

    /// How often the time is updated.
    pub fn resolution(&self) -> Duration {
        self.shared.resolution
    }
}

impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        if self.shared.ticking.load(Ordering::Relaxed) {
            self.shared.micros.load(Ordering::Relaxed)
        } else {
            duration_to_micros(self.shared.origin.elapsed())
        }
    }

    #[inline]
    fn unix_offset_micros(&self) -> u64 {
        self.shared.unix_origin
    }
}

/// Converts a duration to whole microseconds, saturating at `u64::MAX`.
#[inline]
pub(crate) fn duration_to_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod quanta_tests {
    use super::*;

    #[test]
    fn quanta_clock_follows_real_time() {
        let clock = QuantaClock::new();
        let start = Instant::now();
        let t0 = clock.now_micros();
        let mut last = t0;
        // Busy-wait 2 ms of real time (no sleep), checking monotonicity on the way.
        while start.elapsed() < Duration::from_millis(2) {
            let now = clock.now_micros();
            assert!(now >= last);
            last = now;
        }
        let elapsed = clock.now_micros() - t0;
        assert!((1_500..200_000).contains(&elapsed), "{elapsed} µs for 2 ms");
    }
}

#[cfg(test)]
mod unix_tests {
    use super::*;

    #[test]
    fn wall_now_follows_the_system_clock() {
        // Between rereads the counter adds the time since the last one: the reading is never
        // staler than the drift of the two clocks (far below this), whether or not it reread.
        let slack = Duration::from_millis(10);
        let start = Instant::now();
        let mut reads = 0;
        // Across several reread intervals, by busy calls and by sleeps.
        while start.elapsed() < Duration::from_millis(350) {
            let before = SystemTime::now();
            let wall = wall_now();
            let after = SystemTime::now();
            assert!(wall + slack >= before, "{wall:?} lags {before:?}");
            assert!(
                wall <= after + Duration::from_millis(5),
                "{wall:?} ahead of {after:?}"
            );
            reads += 1;
            if reads % 1000 == 0 {
                std::thread::sleep(Duration::from_millis(30));
            }
        }
        assert!(reads > 1000);
    }

    /// A clock that keeps the trait's default offset.
    #[derive(Debug)]
    struct Frozen(u64);

    impl Clock for Frozen {
        fn now_micros(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn every_clock_maps_to_unix_time() {
        let before = unix_now_micros();
        let clocks: Vec<Box<dyn Clock>> = vec![
            Box::new(SystemClock::new()),
            Box::new(QuantaClock::new()),
            Box::new(Arc::new(SystemClock::new())),
            Box::new(CoarseClock::new()),
            Box::new(Frozen(5_000_000)),
        ];
        for clock in &clocks {
            let unix = clock.now_micros() + clock.unix_offset_micros();
            // Within a minute of the wall clock: the reads are microseconds apart, and the
            // coarse clock lags by at most its resolution.
            assert!(
                unix.abs_diff(before) < 60_000_000,
                "{clock:?}: {unix} vs {before}"
            );
        }
        let manual = ManualClock::new();
        let copy = manual.clone();
        manual.set_unix_offset_micros(42);
        assert_eq!(copy.unix_offset_micros(), 42);
        assert_eq!(Arc::new(copy).unix_offset_micros(), 42);
    }
}

#[cfg(test)]
mod coarse_tests {
    use super::*;

    #[test]
    fn coarse_clock_ticks_monotonically_and_stops_with_its_last_clone() {
        let start = Instant::now();
        let clock = CoarseClock::with_resolution(Duration::from_micros(1));
        assert_eq!(clock.resolution(), CoarseClock::MIN_RESOLUTION);
        let copy = clock.clone();
        let mut last = clock.now_micros();
        // Busy-wait (no sleep) until the thread has ticked past 1 ms.
        while clock.now_micros() < 1_000 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the clock never ticked"
            );
            let now = copy.now_micros();
            assert!(now >= last);
            last = now;
        }
        assert!(clock.now_micros() <= duration_to_micros(start.elapsed()) + 1);
        let weak = Arc::downgrade(&clock.shared);
        drop((clock, copy));
        assert!(
            weak.upgrade().is_none(),
            "the thread holds no strong reference"
        );
    }
}
