//! RFC 3339 UTC timestamps (`2026-03-01T12:00:00Z`) from Unix seconds, without a date library.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `9999-12-31T23:59:59Z`: RFC 3339 years have four digits; later times are written as this.
const MAX_SECS: u64 = 253_402_300_799;

/// Unix seconds of `now + wait`, rounded up to a whole second (a time before 1970 counts as
/// the epoch).
pub(crate) fn unix_secs_ceil(now: SystemTime, wait: Duration) -> u64 {
    let at = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_add(wait);
    at.as_secs()
        .saturating_add(u64::from(at.subsec_nanos() > 0))
}

/// `secs` after the Unix epoch as an RFC 3339 UTC time with whole seconds, clamped to
/// `9999-12-31T23:59:59Z`.
pub(crate) fn format_utc(secs: u64) -> String {
    String::from_utf8_lossy(&utc_bytes(secs)).into_owned()
}

/// [`format_utc`] into a buffer (ASCII), without allocating.
pub(crate) fn utc_bytes(secs: u64) -> [u8; 20] {
    let secs = secs.min(MAX_SECS);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    // Fixed-width digits into a buffer (this is on every rejection's path; `format!` costs
    // several times more).
    let mut out = *b"0000-00-00T00:00:00Z";
    let mut put = |at: usize, width: usize, mut n: u64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, rem / 3600);
    put(14, 2, rem / 60 % 60);
    put(17, 2, rem % 60);
    out
}

/// The proleptic Gregorian date `days` days after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for non-negative days): eras of 400 years, years starting on March 1st.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z / 146_097;
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365], from March 1st
    let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z"); // leap day, 400-year rule
        assert_eq!(format_utc(951_868_800), "2000-03-01T00:00:00Z");
        assert_eq!(format_utc(1_234_567_890), "2009-02-13T23:31:30Z");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(format_utc(4_107_542_399), "2100-02-28T23:59:59Z"); // 2100 is no leap year
        assert_eq!(format_utc(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(format_utc(1_709_164_800), "2024-02-29T00:00:00Z");
        assert_eq!(format_utc(1_735_689_599), "2024-12-31T23:59:59Z");
        assert_eq!(format_utc(1_735_689_600), "2025-01-01T00:00:00Z");
        assert_eq!(format_utc(MAX_SECS), "9999-12-31T23:59:59Z");
        assert_eq!(format_utc(u64::MAX), "9999-12-31T23:59:59Z");
    }

    /// Every day for 1,000 years follows the previous one: the day of month steps by one or
    /// rolls over to the 1st of the next month after the month's last day.
    #[test]
    fn days_follow_each_other() {
        let days_in = |y: u64, m: u64| match m {
            4 | 6 | 9 | 11 => 30,
            2 if (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400) => 29,
            2 => 28,
            _ => 31,
        };
        let mut prev = civil_from_days(0);
        assert_eq!(prev, (1970, 1, 1));
        for d in 1..365_250 {
            let (y, m, day) = civil_from_days(d);
            let (py, pm, pd) = prev;
            if pd < days_in(py, pm) {
                assert_eq!((y, m, day), (py, pm, pd + 1), "day {d}");
            } else if pm < 12 {
                assert_eq!((y, m, day), (py, pm + 1, 1), "day {d}");
            } else {
                assert_eq!((y, m, day), (py + 1, 1, 1), "day {d}");
            }
            prev = (y, m, day);
        }
    }

    #[test]
    fn reset_time_rounds_up() {
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        assert_eq!(
            unix_secs_ceil(now, Duration::from_millis(59_750)),
            1_700_000_060
        );
        assert_eq!(
            unix_secs_ceil(now, Duration::from_millis(59_751)),
            1_700_000_061
        );
        assert_eq!(unix_secs_ceil(UNIX_EPOCH, Duration::ZERO), 0);
        let before_epoch = UNIX_EPOCH - Duration::from_secs(10);
        assert_eq!(unix_secs_ceil(before_epoch, Duration::from_secs(5)), 5);
        assert_eq!(
            unix_secs_ceil(now, Duration::MAX),
            u64::MAX,
            "saturates, and format_utc clamps it"
        );
    }
}
