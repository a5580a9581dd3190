//! Calendar-aligned windows: [`Calendar`] and [`UtcOffset`].
//!
//! See [`Calendar`] (this private module's docs are on the types).

use std::fmt;
use std::str::FromStr;

use crate::error::ConfigError;

/// Microseconds in an hour.
const HOUR: u64 = 3_600_000_000;
/// Microseconds in a day.
const DAY: u64 = 86_400_000_000;
/// Month indexes beyond this (year 1970 + 10^6) end at the end of time: no real clock gets there.
const MAX_MONTH: u64 = 12_000_000;

/// A fixed offset from UTC, at most 18 hours either way (as RFC 3339 and ISO 8601 allow): the
/// local time a [`Calendar`] cuts its windows in.
///
/// Constructors take any value; [`validate`](Self::validate) (called by
/// [`Quota::validate`](crate::Quota::validate)) refuses one beyond ±18 h. As text: `UTC`
/// (or `Z`), `+02:00`, `-05:30`, `+0530`, `+2`, optionally after `UTC` (`UTC+02:00`).
///
/// ```
/// use tollgate::quota::UtcOffset;
///
/// assert_eq!(UtcOffset::hours(2).to_string(), "+02:00");
/// assert_eq!("-05:30".parse::<UtcOffset>().unwrap(), UtcOffset::minutes(-330));
/// assert_eq!("UTC".parse::<UtcOffset>().unwrap(), UtcOffset::UTC);
/// assert_eq!(UtcOffset::hours(19).validate().unwrap_err().field(), "quota.utc_offset");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct UtcOffset {
    seconds: i32,
}

impl UtcOffset {
    /// UTC itself.
    pub const UTC: Self = Self { seconds: 0 };

    /// The largest offset either way: 18 hours, in seconds.
    pub const MAX_SECONDS: i32 = 18 * 3600;

    /// `hours` ahead of UTC (negative: behind).
    pub const fn hours(hours: i32) -> Self {
        Self::seconds(hours.saturating_mul(3600))
    }

    /// `minutes` ahead of UTC (negative: behind): `UtcOffset::minutes(330)` is India's +05:30.
    pub const fn minutes(minutes: i32) -> Self {
        Self::seconds(minutes.saturating_mul(60))
    }

    /// `seconds` ahead of UTC (negative: behind).
    pub const fn seconds(seconds: i32) -> Self {
        Self { seconds }
    }

    /// The offset in seconds, positive east of Greenwich.
    pub const fn as_seconds(&self) -> i32 {
        self.seconds
    }

    /// The offset in microseconds.
    pub(crate) const fn as_micros(&self) -> i64 {
        self.seconds as i64 * 1_000_000
    }

    /// Checks that the offset is at most 18 hours either way.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.seconds.unsigned_abs() > Self::MAX_SECONDS.unsigned_abs() {
            return Err(ConfigError::new(
                "quota.utc_offset",
                format!(
                    "the UTC offset {} is beyond ±18 hours; real offsets run from -12:00 to +14:00",
                    self
                ),
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for UtcOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `UTC`, or `±HH:MM` (`±HH:MM:SS` when the offset has seconds).
impl fmt::Display for UtcOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.seconds == 0 {
            return f.write_str("UTC");
        }
        let sign = if self.seconds < 0 { '-' } else { '+' };
        let s = self.seconds.unsigned_abs();
        write!(f, "{sign}{:02}:{:02}", s / 3600, s / 60 % 60)?;
        if !s.is_multiple_of(60) {
            write!(f, ":{:02}", s % 60)?;
        }
        Ok(())
    }
}

/// Parses `UTC`, `Z`, `+02:00`, `-05:30`, `+0530`, `+2`, `-03:30:15`, optionally prefixed by
/// `UTC` (`UTC+2`), and validates the range.
impl FromStr for UtcOffset {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            ConfigError::new(
                "quota.utc_offset",
                format!(
                    "cannot parse the UTC offset {s:?}; expected UTC, or a sign, hours and minutes such as +02:00 or -05:30"
                ),
            )
        };
        let text = s.trim();
        let text = text.strip_prefix("UTC").unwrap_or(text);
        if text.is_empty() || text == "Z" {
            return Ok(Self::UTC);
        }
        let (sign, rest) = match text.as_bytes()[0] {
            b'+' => (1, &text[1..]),
            b'-' => (-1, &text[1..]),
            _ => return Err(bad()),
        };
        if !rest.is_ascii() {
            return Err(bad());
        }
        let parts: Vec<&str> = if rest.contains(':') {
            rest.split(':').collect()
        } else if rest.len() == 4 {
            vec![&rest[..2], &rest[2..]]
        } else {
            vec![rest]
        };
        let field = |p: &str, max: u32| -> Option<u32> {
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse().ok().filter(|v| *v <= max)
        };
        let (h, m, sec) = match parts.as_slice() {
            [h] => (field(h, 99), Some(0), Some(0)),
            [h, m] => (field(h, 99), field(m, 59), Some(0)),
            [h, m, sec] => (field(h, 99), field(m, 59), field(sec, 59)),
            _ => return Err(bad()),
        };
        let (Some(h), Some(m), Some(sec)) = (h, m, sec) else {
            return Err(bad());
        };
        let offset = Self::seconds(sign * (h * 3600 + m * 60 + sec) as i32);
        offset.validate().map_err(|e| {
            ConfigError::new(e.field(), format!("cannot parse {s:?}: {}", e.message()))
        })?;
        Ok(offset)
    }
}

/// Which calendar a fixed window's windows follow, and in which UTC offset.
///
/// A fixed window normally starts wherever the store's clock puts it. A calendar-aligned
/// quota's windows are the hours, days or months of the calendar in a fixed offset from UTC:
/// a daily quota in `UtcOffset::hours(2)` resets at midnight UTC+2, a monthly one on the first
/// of each month. Offsets are fixed (no daylight-saving rules): pick the offset your customers'
/// billing day is written in.
///
/// The arithmetic is integer-only (Howard Hinnant's `days_from_civil` / `civil_from_days`), on
/// Unix microseconds, so the Redis script computes the same windows bit for bit.
///
/// ```
/// use tollgate::quota::{Calendar, UtcOffset};
///
/// // 2024-02-29T23:30:00Z, in microseconds since the Unix epoch.
/// let t = 1_709_249_400_000_000;
/// let month = Calendar::Monthly { utc_offset: UtcOffset::UTC };
/// // February 2024 ends at 2024-03-01T00:00:00Z.
/// assert_eq!(month.window_end(month.window_of(t)), 1_709_251_200_000_000);
/// // At UTC+2 it is already 01:30 on March 1: that month ends on 2024-03-31T22:00:00Z.
/// let local = Calendar::Monthly { utc_offset: UtcOffset::hours(2) };
/// assert_eq!(local.window_end(local.window_of(t)), 1_711_922_400_000_000);
/// ```
///
/// A quota gets one with [`Quota::aligned`](crate::Quota::aligned) (an hourly or daily quota)
/// or [`Quota::per_month`](crate::Quota::per_month); only the
/// [`FixedWindow`](crate::algorithm::FixedWindow) algorithm accepts it.
///
/// Window indexes count from the Unix epoch in local time: hours or days since
/// 1970-01-01T00:00 local, months since January 1970. Times before the epoch (in local time)
/// fall in window 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Calendar {
    /// Windows are the clock hours of local time (an offset such as +05:30 moves them to the
    /// half hour).
    Hourly {
        /// The local time's offset from UTC.
        utc_offset: UtcOffset,
    },
    /// Windows are the days of local time, from midnight to midnight.
    Daily {
        /// The local time's offset from UTC.
        utc_offset: UtcOffset,
    },
    /// Windows are the months of local time (28 to 31 days), from midnight on the first.
    Monthly {
        /// The local time's offset from UTC.
        utc_offset: UtcOffset,
    },
}

impl Calendar {
    /// The local time's offset from UTC.
    pub const fn utc_offset(&self) -> UtcOffset {
        match *self {
            Calendar::Hourly { utc_offset }
            | Calendar::Daily { utc_offset }
            | Calendar::Monthly { utc_offset } => utc_offset,
        }
    }

    /// The index of the window holding `unix_micros` (microseconds since the Unix epoch).
    pub fn window_of(&self, unix_micros: u64) -> u64 {
        let local = unix_micros.saturating_add_signed(self.utc_offset().as_micros());
        match self {
            Calendar::Hourly { .. } => local / HOUR,
            Calendar::Daily { .. } => local / DAY,
            Calendar::Monthly { .. } => {
                let (y, m) = civil_from_days(local / DAY);
                (y - 1970) * 12 + (m - 1)
            }
        }
    }

    /// When window `window` ends (the next one starts), in microseconds since the Unix epoch;
    /// `u64::MAX` for an index beyond any real time.
    pub fn window_end(&self, window: u64) -> u64 {
        let next = window.saturating_add(1);
        let local_end = match self {
            Calendar::Hourly { .. } => next.saturating_mul(HOUR),
            Calendar::Daily { .. } => next.saturating_mul(DAY),
            Calendar::Monthly { .. } if next > MAX_MONTH => return u64::MAX,
            Calendar::Monthly { .. } => {
                days_from_civil(1970 + next / 12, next % 12 + 1).saturating_mul(DAY)
            }
        };
        if local_end == u64::MAX {
            return u64::MAX;
        }
        local_end.saturating_add_signed(-self.utc_offset().as_micros())
    }

    /// The longest window, in microseconds: an hour, a day, or 31 days.
    pub(crate) const fn longest_window_micros(&self) -> u64 {
        match self {
            Calendar::Hourly { .. } => HOUR,
            Calendar::Daily { .. } => DAY,
            Calendar::Monthly { .. } => 31 * DAY,
        }
    }

    /// The Redis script's `p1` and `p3` for this calendar (see `scripts/fixed_window.lua`):
    /// the window length in µs (0 for months), and the offset in µs plus one day (so it is
    /// positive, and 0 still means "no calendar").
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn script_params(&self) -> (u64, u64) {
        let period = match self {
            Calendar::Hourly { .. } => HOUR,
            Calendar::Daily { .. } => DAY,
            Calendar::Monthly { .. } => 0,
        };
        let biased = DAY.saturating_add_signed(self.utc_offset().as_micros());
        (period, biased)
    }
}

/// Year and month (1..=12) of day `z` since 1970-01-01 (Hinnant's `civil_from_days`, for
/// `z >= 0`, where every step is non-negative integer arithmetic).
fn civil_from_days(z: u64) -> (u64, u64) {
    let z = z + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let y = yoe + era * 400;
    if mp < 10 {
        (y, mp + 3)
    } else {
        (y + 1, mp - 9)
    }
}

/// Days from 1970-01-01 to the first of month `m` (1..=12) of year `y >= 1970` (Hinnant's
/// `days_from_civil` with `d = 1`).
fn days_from_civil(y: u64, m: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1), 0);
        assert_eq!(days_from_civil(2024, 3), 19_783);
        assert_eq!(days_from_civil(2023, 3), 19_417);
        assert_eq!(days_from_civil(2025, 1), 20_089);
        assert_eq!(days_from_civil(2000, 3), 11_017);
        assert_eq!(days_from_civil(2100, 3), 47_541);
        assert_eq!(civil_from_days(0), (1970, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2), "2024-02-29");
        assert_eq!(civil_from_days(19_783), (2024, 3));
        assert_eq!(civil_from_days(20_088), (2024, 12), "2024-12-31");
        assert_eq!(civil_from_days(20_089), (2025, 1));
    }

    #[test]
    fn month_windows_round_trip_for_four_centuries() {
        // Every month from 1970 to 2370: its first day maps back to it, its last day too.
        for w in 0..400 * 12 {
            let (y, m) = (1970 + w / 12, w % 12 + 1);
            let first = days_from_civil(y, m);
            let next = days_from_civil(1970 + (w + 1) / 12, (w + 1) % 12 + 1);
            assert!((28..=31).contains(&(next - first)), "{y}-{m}");
            assert_eq!(civil_from_days(first), (y, m));
            assert_eq!(civil_from_days(next - 1), (y, m));
        }
    }

    #[test]
    fn windows_and_ends_agree() {
        let cals = [
            Calendar::Hourly {
                utc_offset: UtcOffset::minutes(330),
            },
            Calendar::Daily {
                utc_offset: UtcOffset::hours(-5),
            },
            Calendar::Monthly {
                utc_offset: UtcOffset::hours(14),
            },
        ];
        let mut t = 0u64;
        for _ in 0..5_000 {
            t = t.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1) % (DAY * 40_000);
            for c in cals {
                let w = c.window_of(t);
                let end = c.window_end(w);
                assert!(end > t, "{c:?} at {t}");
                assert_eq!(c.window_of(end - 1), w, "{c:?} at {t}");
                assert_eq!(c.window_of(end), w + 1, "{c:?} at {t}");
            }
        }
    }

    #[test]
    fn extremes_saturate() {
        let m = Calendar::Monthly {
            utc_offset: UtcOffset::hours(-18),
        };
        assert_eq!(m.window_of(0), 0);
        assert_eq!(m.window_end(u64::MAX), u64::MAX);
        assert_eq!(m.window_end(MAX_MONTH), u64::MAX);
        let _ = m.window_of(u64::MAX);
        let d = Calendar::Daily {
            utc_offset: UtcOffset::hours(18),
        };
        assert_eq!(d.window_end(u64::MAX), u64::MAX);
        assert_eq!(d.window_of(u64::MAX), u64::MAX / DAY);
    }

    #[test]
    fn offsets_parse_and_print() {
        for (text, seconds) in [
            ("UTC", 0),
            ("Z", 0),
            ("+00:00", 0),
            ("+02:00", 7_200),
            ("UTC+2", 7_200),
            ("-05:30", -19_800),
            ("+0545", 20_700),
            ("+14", 50_400),
            ("-03:30:15", -12_615),
            ("+18:00", 64_800),
        ] {
            let o: UtcOffset = text.parse().unwrap();
            assert_eq!(o.as_seconds(), seconds, "{text}");
            assert_eq!(o.to_string().parse::<UtcOffset>().unwrap(), o, "{text}");
        }
        for text in ["+18:01", "2", "+2:60", "+", "+1:2:3:4", "UTC+x", "+123"] {
            let err = text.parse::<UtcOffset>().unwrap_err();
            assert_eq!(err.field(), "quota.utc_offset", "{text}");
            assert!(err.message().contains(text), "{text}: {err}");
        }
        assert_eq!(UtcOffset::minutes(-330).to_string(), "-05:30");
        assert!(UtcOffset::hours(-18).validate().is_ok());
        assert!(UtcOffset::seconds(-64_801).validate().is_err());
        assert!(UtcOffset::hours(i32::MAX).validate().is_err());
    }
}
