//! Calendar-aligned fixed windows: daily windows that reset at local midnight in a UTC offset,
//! monthly windows of 28 to 31 days (Feb 28/29, Dec -> Jan), `reset` / `retry_after` exact to
//! the microsecond, on the memory store and a real `redis-server` deciding identically.

use std::time::Duration;

use tollgate::algorithm::{Algorithm, AlgorithmKind, FixedWindow};
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::quota::UtcOffset;
use tollgate::store::{memory::MemoryBackend, Backend, FailurePolicy, LimitCheck, LimitSpec};
use tollgate::{Decision, Name, Quota};

const S: u64 = 1_000_000;
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
const HOUR: u64 = 3_600 * S;
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
const DAY: u64 = 24 * HOUR;

/// Unix µs of a UTC date and time, counted day by day (independent of the crate's arithmetic).
fn unix(y: u64, mo: u64, d: u64, h: u64, mi: u64, s: u64) -> u64 {
    let leap = |y: u64| (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
    let mut days: u64 = (1970..y).map(|y| if leap(y) { 366 } else { 365 }).sum();
    let feb = if leap(y) { 29 } else { 28 };
    let len = [31, feb, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    days += len[..(mo - 1) as usize].iter().sum::<u64>() + d - 1;
    (((days * 24 + h) * 60 + mi) * 60 + s) * S
}

fn spec(name: &str, quota: Quota) -> LimitSpec {
    LimitSpec::new(Name::new(name), quota, AlgorithmKind::FixedWindow).on_store_error(
        FailurePolicy::Closed {
            retry_after: Duration::from_secs(1),
        },
    )
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap()
}

#[test]
fn a_window_at_23_59_59_in_utc_plus_2_resets_at_local_midnight() {
    // 2024-02-28T23:59:59+02:00: the clock reads 0, its zero is that Unix time.
    let clock = ManualClock::new();
    clock.set_unix_offset_micros(unix(2024, 2, 28, 21, 59, 59));
    let limits = [
        spec("daily", Quota::per_day(3).aligned(UtcOffset::hours(2))),
        // The same quota without a calendar: windows from the clock's zero, as before.
        spec("plain", Quota::per_day(3)),
    ];
    let store = MemoryBackend::new()
        .clock(clock.clone())
        .build(&limits)
        .unwrap();
    let alice = Key::string("alice");

    for remaining in [2, 1, 0] {
        let d = store.check_one(0, &alice, 1).unwrap();
        assert!(d.allowed());
        assert_eq!(d.remaining(), remaining);
        assert_eq!(
            d.reset(),
            Duration::from_secs(1),
            "local midnight is 1 s away"
        );
    }
    let d = store.check_one(0, &alice, 1).unwrap();
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    // The plain daily window is unaffected by the Unix offset: it ends a day after the zero.
    assert_eq!(
        store.check_one(1, &alice, 3).unwrap().reset(),
        Duration::from_secs(86_400)
    );

    clock.advance(Duration::from_micros(999_999));
    let d = store.check_one(0, &alice, 1).unwrap();
    assert_eq!(
        d.retry_after(),
        Some(Duration::from_micros(1)),
        "exact to the µs"
    );
    clock.advance(Duration::from_micros(1));
    let d = store.check_one(0, &alice, 1).unwrap();
    assert!(d.allowed(), "00:00:00 local: a new day");
    assert_eq!((d.remaining(), d.reset()), (2, Duration::from_secs(86_400)));
    assert!(
        !store.check_one(1, &alice, 1).unwrap().allowed(),
        "plain: same window"
    );
}

/// `(at, offset, end)`: a monthly window entered at `at` in `offset` ends at `end` (Unix µs).
fn month_cases() -> Vec<(u64, UtcOffset, u64)> {
    let utc = UtcOffset::UTC;
    let plus2 = UtcOffset::hours(2);
    let minus5 = UtcOffset::hours(-5);
    vec![
        // February of a common year: Feb 28 is its last day.
        (unix(2023, 2, 28, 12, 0, 0), utc, unix(2023, 3, 1, 0, 0, 0)),
        // A leap year: Feb 28 is not the end; Feb 29 is.
        (
            unix(2024, 2, 28, 23, 59, 59),
            utc,
            unix(2024, 3, 1, 0, 0, 0),
        ),
        (
            unix(2024, 2, 29, 23, 59, 59) + 999_999,
            utc,
            unix(2024, 3, 1, 0, 0, 0),
        ),
        // 2024-02-29T22:30Z is already March 1 in UTC+2: March ends at local midnight Apr 1.
        (
            unix(2024, 2, 29, 22, 30, 0),
            plus2,
            unix(2024, 3, 31, 22, 0, 0),
        ),
        // 2024-02-29T21:59:59Z is still Feb 29 in UTC+2.
        (
            unix(2024, 2, 29, 21, 59, 59),
            plus2,
            unix(2024, 2, 29, 22, 0, 0),
        ),
        // Dec -> Jan.
        (
            unix(2024, 12, 31, 23, 59, 59),
            utc,
            unix(2025, 1, 1, 0, 0, 0),
        ),
        (
            unix(2024, 12, 31, 23, 0, 0),
            plus2,
            unix(2025, 1, 31, 22, 0, 0),
        ),
        (unix(2025, 1, 1, 3, 0, 0), minus5, unix(2025, 1, 1, 5, 0, 0)),
        // Century years: 2100 is not a leap year, 2000 was.
        (unix(2100, 2, 10, 0, 0, 0), utc, unix(2100, 3, 1, 0, 0, 0)),
        (
            unix(2000, 2, 10, 0, 0, 0),
            minus5,
            unix(2000, 3, 1, 5, 0, 0),
        ),
        // A 30-day month and a 31-day one.
        (unix(2025, 4, 1, 0, 0, 0), utc, unix(2025, 5, 1, 0, 0, 0)),
        (unix(2025, 7, 31, 12, 0, 0), utc, unix(2025, 8, 1, 0, 0, 0)),
    ]
}

#[test]
fn monthly_windows_end_on_the_real_end_of_the_month() {
    for (at, offset, end) in month_cases() {
        let quota = Quota::per_month(2).aligned(offset);
        let fw = FixedWindow::new(quota).unwrap();
        let mut state = Default::default();
        let d = fw.check(&mut state, at, 2);
        assert!(d.allowed());
        assert_eq!(micros(d.reset()), end - at, "{quota} at {at}");
        let d = fw.check(&mut state, at, 1);
        assert_eq!(
            d.retry_after().map(micros),
            Some(end - at),
            "{quota} at {at}"
        );
        let d = fw.check(&mut state, end - 1, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)), "{quota}");
        let d = fw.check(&mut state, end, 2);
        assert!(d.allowed(), "{quota}: a new month at {end}");

        // The memory store, on a manual clock reading Unix time, agrees.
        let clock = ManualClock::new();
        clock.set_micros(at);
        let store = MemoryBackend::new()
            .clock(clock.clone())
            .build(&[spec("monthly", quota)])
            .unwrap();
        let key = Key::string("k");
        assert!(store.check_one(0, &key, 2).unwrap().allowed());
        let d = store.check_one(0, &key, 1).unwrap();
        assert_eq!(
            d.retry_after().map(micros),
            Some(end - at),
            "{quota} at {at}"
        );
        clock.set_micros(end);
        assert!(store.check_one(0, &key, 2).unwrap().allowed(), "{quota}");
    }
}

#[test]
fn a_refund_gives_back_only_to_the_month_it_charged() {
    let fw = FixedWindow::new(Quota::per_month(1).aligned(UtcOffset::hours(2))).unwrap();
    let mut state = Default::default();
    let reserved = unix(2024, 1, 31, 21, 59, 0); // 23:59 on Jan 31 in UTC+2
    assert!(fw.check(&mut state, reserved, 1).allowed());
    let mut same = state;
    fw.refund(&mut same, reserved, reserved + S, 1);
    assert!(
        fw.decide(&same, reserved + S, 1).allowed(),
        "given back in January"
    );
    let february = unix(2024, 1, 31, 22, 0, 0);
    assert!(fw.check(&mut state, february, 1).allowed());
    let before = state;
    fw.refund(&mut state, reserved, february, 1);
    assert_eq!(
        state, before,
        "February's count is not January's to give back"
    );
}

#[test]
fn only_fixed_windows_take_a_calendar() {
    let daily = Quota::per_day(10).aligned(UtcOffset::hours(1));
    for kind in AlgorithmKind::ALL {
        let spec = LimitSpec::new(Name::new("d"), daily, kind);
        let built = MemoryBackend::new().build(&[spec]);
        match kind {
            AlgorithmKind::FixedWindow => assert!(built.is_ok()),
            _ => {
                let err = built.unwrap_err();
                assert_eq!(err.field(), "quota.calendar", "{kind}");
                assert!(err.message().contains(kind.as_str()), "{err}");
                assert!(err.message().contains("fixed_window"), "{err}");
            }
        }
    }
    let err = FixedWindow::new(Quota::per_minute(5).aligned(UtcOffset::UTC)).unwrap_err();
    assert_eq!(err.field(), "quota.calendar");
}

#[test]
fn several_limits_mix_calendar_and_clock_time() {
    // A calendar limit and a plain one in one all-or-nothing check: each decides on its own time.
    let clock = ManualClock::new();
    clock.set_unix_offset_micros(unix(2024, 12, 31, 23, 59, 0));
    let limits = [
        spec("month", Quota::per_month(1)),
        spec("minute", Quota::per_minute(5)),
    ];
    let store = MemoryBackend::new()
        .clock(clock.clone())
        .build(&limits)
        .unwrap();
    let checks = |key: &'static str| {
        [
            LimitCheck::new(0, Key::string(key), 1),
            LimitCheck::new(1, Key::string(key), 1),
        ]
    };
    let d = store.check_all(&checks("a")).unwrap();
    assert!(d.allowed());
    assert_eq!(
        d.as_slice()[0].reset(),
        Duration::from_secs(60),
        "New Year in a minute"
    );
    assert_eq!(
        d.as_slice()[1].reset(),
        Duration::from_secs(60),
        "the clock's first minute"
    );
    clock.advance(Duration::from_secs(30));
    let d = store.check_all(&checks("a")).unwrap();
    assert!(!d.allowed());
    let month: &Decision = d.rejected().unwrap();
    assert_eq!(month.policy().as_str(), "month");
    assert_eq!(month.retry_after(), Some(Duration::from_secs(30)));
    assert_eq!(
        d.as_slice()[1].remaining(),
        4,
        "nothing charged to the minute"
    );
    clock.advance(Duration::from_secs(30));
    assert!(store.check_all(&checks("a")).unwrap().allowed(), "2025");
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use crate::harness::redis_server::RedisServer;
    use crate::harness::rng::Rng;
    use crate::harness::stores::{decide, memory_store, node_store, one};

    /// Every boundary of the cases, and times around them, in increasing order.
    fn times(cases: &[(u64, UtcOffset, u64)]) -> Vec<u64> {
        let mut times: Vec<u64> = cases
            .iter()
            .flat_map(|&(at, _, end)| {
                [
                    at,
                    end - S,
                    end - 1,
                    end,
                    end + 1,
                    end + HOUR - 1,
                    end + DAY,
                ]
            })
            .collect();
        times.sort_unstable();
        times.dedup();
        times
    }

    fn same(a: &Decision, b: &Decision, what: &str) {
        assert_eq!(
            (
                a.allowed(),
                a.remaining(),
                a.reset(),
                a.retry_after(),
                a.limit()
            ),
            (
                b.allowed(),
                b.remaining(),
                b.reset(),
                b.retry_after(),
                b.limit()
            ),
            "{what}"
        );
    }

    /// The memory store and a real `redis-server` decide calendar windows identically, on a
    /// clock reading Unix time (`offset` 0) or one whose zero is `offset`.
    async fn agree(offset: u64) {
        let server = RedisServer::start();
        let limits = [
            spec("daily", Quota::per_day(3).aligned(UtcOffset::hours(2))),
            spec("monthly", Quota::per_month(4).aligned(UtcOffset::hours(-5))),
            spec(
                "hourly",
                Quota::per_hour(2).aligned(UtcOffset::minutes(330)),
            ),
            spec("utc-month", Quota::per_month(5)),
        ];
        let clock = ManualClock::new();
        clock.set_unix_offset_micros(offset);
        let memory = memory_store(&clock, &limits);
        let redis = node_store(&server.url(), "calendar", &clock, &limits);
        let cases = month_cases();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut compared = 0;
        for t in times(&cases) {
            clock.set_micros(t - offset);
            for (limit, spec) in limits.iter().enumerate() {
                for key in ["a", "b"] {
                    let cost = rng.below(3);
                    let checks = [LimitCheck::new(limit, Key::string(key), cost)];
                    let m = decide(&memory, &checks).await.unwrap();
                    let r = decide(&redis, &checks).await.unwrap();
                    let what = format!("{} {key} cost {cost} at {t}", spec.name());
                    same(&m.as_slice()[0], &r.as_slice()[0], &what);
                    compared += 1;
                }
            }
            // All four limits at once, all-or-nothing, on both.
            let checks: Vec<_> = (0..limits.len())
                .map(|i| LimitCheck::new(i, Key::string("all"), 1))
                .collect();
            let m = decide(&memory, &checks).await.unwrap();
            let r = decide(&redis, &checks).await.unwrap();
            for (i, (a, b)) in m.as_slice().iter().zip(r.as_slice()).enumerate() {
                same(a, b, &format!("all, limit {i} at {t}"));
            }
        }
        assert!(compared > 500, "{compared} decisions compared");

        // On Redis alone, exact to the µs: at 07:00 in UTC+2 the day ends in 17 hours.
        let clock = ManualClock::new();
        clock.set_unix_offset_micros(offset);
        let at = unix(2025, 2, 10, 5, 0, 0);
        clock.set_micros(at - offset);
        let redis = node_store(&server.url(), "calendar-exact", &clock, &limits);
        let d = one(&redis, "fresh", 0).await.unwrap();
        assert_eq!(d.reset(), Duration::ZERO, "nothing spent: no reset");
        assert!(one(&redis, "fresh", 3).await.unwrap().allowed());
        let d = one(&redis, "fresh", 1).await.unwrap();
        assert!(!d.allowed());
        let local_midnight = unix(2025, 2, 10, 22, 0, 0);
        assert_eq!(d.retry_after().map(micros), Some(local_midnight - at));
        assert_eq!(local_midnight - at, 17 * HOUR);
    }

    #[tokio::test]
    async fn redis_and_memory_agree_on_day_and_month_boundaries() {
        agree(0).await;
    }

    #[tokio::test]
    async fn redis_and_memory_agree_when_the_clock_zero_is_not_the_epoch() {
        agree(unix(1999, 6, 1, 0, 0, 0)).await;
    }
}
