//! [`Quota`]: how much a key may do, and how fast it comes back.
//!
//! A quota is `count` units per `period`, with an optional `burst` (the bucket capacity for token
//! bucket, GCRA and leaky bucket; it defaults to `count`). Names say what they mean:
//! `Quota::per_second(10)` is ten per second.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::Quota;
//!
//! let q = Quota::per_second(10).burst(50);
//! assert_eq!(q.count(), 10);
//! assert_eq!(q.period(), Duration::from_secs(1));
//! assert_eq!(q.burst_size(), 50);
//!
//! // The same, parsed from configuration text.
//! let parsed: Quota = "10/s burst 50".parse().unwrap();
//! assert_eq!(parsed, q);
//! assert_eq!("100/min".parse::<Quota>().unwrap(), Quota::per_minute(100));
//! assert_eq!("5/15min".parse::<Quota>().unwrap(), Quota::per(Duration::from_secs(900), 5));
//! ```
//!
//! # Calendar-aligned windows
//!
//! With the [`FixedWindow`](crate::algorithm::FixedWindow) algorithm, an hourly or daily quota
//! can follow the calendar in a fixed UTC offset ([`Quota::aligned`]), and
//! [`Quota::per_month`] counts per calendar month: the windows are the local hours, days or
//! months, whatever the process start or the first request. See [`Calendar`].
//!
//! ```
//! use tollgate::quota::{Calendar, UtcOffset};
//! use tollgate::Quota;
//!
//! // 10,000 a day, the day running from midnight to midnight in UTC+2.
//! let daily = Quota::per_day(10_000).aligned(UtcOffset::hours(2));
//! assert_eq!(daily.calendar(), Some(Calendar::Daily { utc_offset: UtcOffset::hours(2) }));
//! assert_eq!("10000/d aligned +02:00".parse::<Quota>().unwrap(), daily);
//!
//! // 1,000,000 a calendar month (UTC unless aligned).
//! let monthly: Quota = "1000000/month".parse().unwrap();
//! assert_eq!(monthly, Quota::per_month(1_000_000));
//! assert_eq!(monthly.aligned(UtcOffset::hours(-5)).to_string(), "1000000/month aligned -05:00");
//!
//! // Only whole hours, days and months have a calendar.
//! assert_eq!(Quota::per_minute(10).aligned(UtcOffset::UTC).validate().unwrap_err().field(), "quota.calendar");
//! ```
//!
//! # Text grammar
//!
//! ```text
//! quota  = rate [ SP+ "burst" SP+ digits ] [ SP+ "aligned" SP+ offset ]
//!                                                 (spaces around words only, never inside the rate)
//! rate   = digits "/" [ digits ] unit             ("10/s", "5/15min", "2/500ms")
//!        | digits "/" [ "1" ] ( "month" | "months" )   (a calendar month, "1000/month")
//! offset = "UTC" | "Z" | ( "+" | "-" ) hh [ ":" mm ]  ("+02:00", "-05:30"; see UtcOffset)
//! digits = 1*( "0"-"9" )                          (no sign, no separators; below 2^53)
//! unit   = "us" | "µs" | "micro" | "micros" | "microsecond" | "microseconds"
//!        | "ms" | "milli" | "millis" | "millisecond" | "milliseconds"
//!        | "s" | "sec" | "secs" | "second" | "seconds"
//!        | "m" | "min" | "mins" | "minute" | "minutes"
//!        | "h" | "hr" | "hrs" | "hour" | "hours"
//!        | "d" | "day" | "days"
//! ```
//!
//! Units are exact and case-sensitive: `M` (months? mega?), `mss`, `hs` or `Sec` are errors, not
//! guesses. Every error quotes the input (`cannot parse "10/M": …`) and says what is wrong.
//! [`Display`](fmt::Display) writes this grammar back, so a quota round-trips through text.
//!
//! # Scale
//!
//! Any rate from one unit per century to far beyond one unit per microsecond is exact: the
//! bucket algorithms keep `count / period` as a reduced fraction ([`Quota::fixed_point`]), so a
//! byte-rate limit such as `Quota::per_second(10 * 1024 * 1024)` with the cost set to the body
//! size, or `Quota::per_second(1_000_000_000)`, is enforced to the unit. The limits are the ones
//! every backend can count exactly (integers below 2^53, Lua's doubles): a count below 2^53, a
//! period of whole microseconds below 2^53 µs (285 years), and `burst × period / gcd(period,
//! count)` below 2^53. Anything else is refused by [`Quota::validate`] with a message naming the
//! fix; nothing is rounded silently.
//!
//! Invalid quotas are [`ConfigError`]s that say what to fix:
//!
//! ```
//! use tollgate::Quota;
//!
//! let err = Quota::per_second(0).validate().unwrap_err();
//! assert_eq!(err.field(), "quota.count");
//! assert!("ten per second".parse::<Quota>().is_err());
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::clock::duration_to_micros;
use crate::error::ConfigError;

mod calendar;

pub use calendar::{Calendar, UtcOffset};

/// The largest integer every backend represents exactly (Lua numbers are IEEE doubles).
pub const MAX_EXACT: u64 = 1 << 53;

/// `count` units per `period`, with a `burst` capacity. See the [module docs](self).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    count: u64,
    period: Duration,
    burst: Option<u64>,
    calendar: Option<Calendar>,
}

impl Quota {
    /// `count` units per `period`.
    pub const fn per(period: Duration, count: u64) -> Self {
        Self {
            count,
            period,
            burst: None,
            calendar: None,
        }
    }

    /// `count` per second.
    pub const fn per_second(count: u64) -> Self {
        Self::per(Duration::from_secs(1), count)
    }

    /// `count` per minute.
    pub const fn per_minute(count: u64) -> Self {
        Self::per(Duration::from_secs(60), count)
    }

    /// `count` per hour.
    pub const fn per_hour(count: u64) -> Self {
        Self::per(Duration::from_secs(3600), count)
    }

    /// `count` per day (86,400 s).
    pub const fn per_day(count: u64) -> Self {
        Self::per(Duration::from_secs(86_400), count)
    }

    /// `count` per calendar month, in UTC unless [`aligned`](Self::aligned) to another offset:
    /// windows from midnight on the first to midnight on the first of the next month (28 to 31
    /// days). Only the [`FixedWindow`](crate::algorithm::FixedWindow) algorithm takes it; its
    /// [`period`](Self::period) is the longest month, 31 days.
    ///
    /// ```
    /// use tollgate::quota::{Calendar, UtcOffset};
    /// use tollgate::Quota;
    ///
    /// let q = Quota::per_month(50_000);
    /// assert_eq!(q.calendar(), Some(Calendar::Monthly { utc_offset: UtcOffset::UTC }));
    /// assert_eq!(q.to_string(), "50000/month");
    /// ```
    pub const fn per_month(count: u64) -> Self {
        Self {
            count,
            period: Duration::from_secs(31 * 86_400),
            burst: None,
            calendar: Some(Calendar::Monthly {
                utc_offset: UtcOffset::UTC,
            }),
        }
    }

    /// Aligns the windows to the calendar in `utc_offset`: an hourly quota
    /// ([`per_hour`](Self::per_hour)) resets on the local hour, a daily one
    /// ([`per_day`](Self::per_day)) at local midnight, a monthly one
    /// ([`per_month`](Self::per_month)) at local midnight on the first. Only the
    /// [`FixedWindow`](crate::algorithm::FixedWindow) algorithm takes it (the others have no
    /// windows to align); any other period is refused by [`validate`](Self::validate).
    ///
    /// ```
    /// use tollgate::quota::UtcOffset;
    /// use tollgate::Quota;
    ///
    /// let q = Quota::per_day(100).aligned(UtcOffset::minutes(330)); // midnight in India
    /// assert!(q.validate().is_ok());
    /// assert_eq!(q.to_string(), "100/d aligned +05:30");
    /// ```
    #[must_use]
    pub const fn aligned(mut self, utc_offset: UtcOffset) -> Self {
        self.calendar = Some(match self.calendar {
            Some(Calendar::Monthly { .. }) => Calendar::Monthly { utc_offset },
            _ if self.period.as_secs() == 3600 && self.period.subsec_nanos() == 0 => {
                Calendar::Hourly { utc_offset }
            }
            // Daily, or a period with no calendar, which `validate` refuses.
            _ => Calendar::Daily { utc_offset },
        });
        self
    }

    /// The calendar the windows follow, if the quota is [aligned](Self::aligned) or
    /// [monthly](Self::per_month).
    pub const fn calendar(&self) -> Option<Calendar> {
        self.calendar
    }

    /// The same quota with `calendar` (for quotas derived from another: a local fallback's share).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn with_calendar(mut self, calendar: Option<Calendar>) -> Self {
        self.calendar = calendar;
        self
    }

    /// Sets the burst: the bucket capacity of token bucket, GCRA and leaky bucket. Window
    /// algorithms reject a burst different from the count.
    #[must_use]
    pub const fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Units replenished per [`period`](Self::period) (the window's limit for window algorithms).
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// The period over which [`count`](Self::count) units are replenished (the window length).
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// The capacity: the explicit burst, or [`count`](Self::count) when none was set.
    pub const fn burst_size(&self) -> u64 {
        match self.burst {
            Some(b) => b,
            None => self.count,
        }
    }

    /// Whether a burst was set explicitly.
    pub const fn has_explicit_burst(&self) -> bool {
        self.burst.is_some()
    }

    /// The period in whole microseconds.
    pub fn period_micros(&self) -> u64 {
        duration_to_micros(self.period)
    }

    /// Time to earn one unit, in microseconds, rounded **up** (so 1 for any rate of at least one
    /// unit per microsecond). Informational: the algorithms use the exact
    /// [`fixed_point`](Self::fixed_point) instead.
    pub fn emission_interval_micros(&self) -> u64 {
        self.period_micros().div_ceil(self.count.max(1))
    }

    /// The exact fixed-point scale used by the bucket algorithms: one unit is worth
    /// `unit` fixed-point steps, and each microsecond earns `per_micro` steps. Both are reduced
    /// by their gcd, so `count / period` is represented without rounding.
    pub fn fixed_point(&self) -> FixedPoint {
        let period = self.period_micros().max(1);
        let count = self.count.max(1);
        let g = gcd(period, count);
        FixedPoint {
            unit: period / g,
            per_micro: count / g,
        }
    }

    /// Checks that every backend can enforce this quota exactly.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.count == 0 {
            return Err(ConfigError::new(
                "quota.count",
                "the count must be at least 1 (to block everything, do not route to the service)",
            ));
        }
        if self.period.is_zero() || self.period_micros() == 0 {
            return Err(ConfigError::new(
                "quota.period",
                "the period must be at least 1 microsecond, e.g. Quota::per_second(10)",
            ));
        }
        if !self.period.subsec_nanos().is_multiple_of(1_000) {
            return Err(ConfigError::new(
                "quota.period",
                format!(
                    "the period {:?} is not a whole number of microseconds, and tollgate does not \
                     round it; use Duration::from_micros({}) or Duration::from_micros({}), and \
                     scale the count to keep the rate",
                    self.period,
                    self.period_micros(),
                    self.period_micros() + 1
                ),
            ));
        }
        if self.count >= MAX_EXACT {
            return Err(ConfigError::new(
                "quota.count",
                format!(
                    "the count {} is not below 2^53, the largest integer every backend counts exactly; \
                     count in larger units (e.g. KiB instead of bytes)",
                    self.count
                ),
            ));
        }
        if self.burst == Some(0) {
            return Err(ConfigError::new(
                "quota.burst",
                "the burst must be at least 1; omit it to use the count",
            ));
        }
        if self.period_micros() >= MAX_EXACT {
            return Err(ConfigError::new(
                "quota.period",
                "the period is too long; use at most 100 years",
            ));
        }
        self.validate_calendar()?;
        let fp = self.fixed_point();
        match self.burst_size().checked_mul(fp.unit) {
            Some(cap) if cap < MAX_EXACT => Ok(()),
            _ => Err(ConfigError::new(
                "quota.burst",
                format!(
                    "burst {} with {} per {:?} overflows exact arithmetic (burst × period / gcd(period, count) must stay below 2^53); lower the burst or pick a count that divides the period",
                    self.burst_size(),
                    self.count,
                    self.period
                ),
            )),
        }
    }
}

impl Quota {
    /// A calendar's offset is within ±18 h and its period is the calendar's unit.
    fn validate_calendar(&self) -> Result<(), ConfigError> {
        let Some(calendar) = self.calendar else {
            return Ok(());
        };
        calendar.utc_offset().validate()?;
        if self.period_micros() != calendar.longest_window_micros() {
            return Err(ConfigError::new(
                "quota.calendar",
                format!(
                    "only hourly, daily and monthly quotas follow the calendar, and this one is {} \
                     per {:?}; use Quota::per_hour(n), Quota::per_day(n) or Quota::per_month(n) \
                     with .aligned(..), or drop .aligned(..)",
                    self.count, self.period
                ),
            ));
        }
        Ok(())
    }
}

/// Exact fixed-point parameters of a quota; see [`Quota::fixed_point`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedPoint {
    /// Fixed-point steps in one unit (token).
    pub unit: u64,
    /// Fixed-point steps earned per microsecond.
    pub per_micro: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Formats as the text [`FromStr`] parses: `10/s`, `100/min`, `5/15min burst 10`.
impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.count)?;
        if let Some(Calendar::Monthly { utc_offset }) = self.calendar {
            f.write_str("month")?;
            if let Some(b) = self.burst {
                write!(f, " burst {b}")?;
            }
            if utc_offset != UtcOffset::UTC {
                write!(f, " aligned {utc_offset}")?;
            }
            return Ok(());
        }
        let micros = self.period_micros();
        const UNITS: [(u64, &str); 5] = [
            (86_400_000_000, "d"),
            (3_600_000_000, "h"),
            (60_000_000, "min"),
            (1_000_000, "s"),
            (1_000, "ms"),
        ];
        let (n, unit) = UNITS
            .iter()
            .find(|(u, _)| micros.is_multiple_of(*u))
            .map(|(u, name)| (micros / u, *name))
            .unwrap_or((micros, "us"));
        if n != 1 {
            write!(f, "{n}")?;
        }
        f.write_str(unit)?;
        if let Some(b) = self.burst {
            write!(f, " burst {b}")?;
        }
        if let Some(calendar) = self.calendar {
            write!(f, " aligned {}", calendar.utc_offset())?;
        }
        Ok(())
    }
}

/// Parses the text grammar of the [module docs](self): `COUNT/[N]UNIT [burst B] [aligned OFFSET]`.
impl FromStr for Quota {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            ConfigError::new(
                "quota",
                format!(
                    "cannot parse {s:?}: {why}; expected e.g. \"100/min\" or \"10/s burst 50\""
                ),
            )
        };
        let mut words = s.split_whitespace();
        let rate = words.next().ok_or_else(|| bad("it is empty"))?;
        let (count, per) = match rate.split_once('/') {
            Some(parts) => parts,
            None if words.next().is_some() => {
                return Err(bad(
                    "the rate is one word with a '/' and no spaces, as in \"10/s\" (not \"10 per second\")",
                ))
            }
            None => return Err(bad("no '/' between the count and the period")),
        };
        let count = whole(count).ok_or_else(|| bad("the count is not a whole number of digits"))?;
        if per.is_empty() {
            return Err(bad(
                "nothing follows '/': write the period right after it, with no space, as in \"10/s\"",
            ));
        }
        let digits = per.bytes().take_while(u8::is_ascii_digit).count();
        let (n, unit) = per.split_at(digits);
        let n = if n.is_empty() {
            1
        } else {
            whole(n).ok_or_else(|| bad("the period multiplier is too large"))?
        };
        let monthly = matches!(unit, "month" | "months");
        if monthly && n != 1 {
            return Err(bad(
                "a calendar month cannot be multiplied: write \"/month\"",
            ));
        }
        let unit_micros = match unit_micros(unit) {
            Some(u) => u,
            None if monthly => 0,
            None => {
                return Err(bad(&format!(
                    "unknown time unit {unit:?} (units are case-sensitive: us, ms, s, min, h, d or month)"
                )))
            }
        };
        let (mut burst, mut aligned) = (None, None);
        while let Some(word) = words.next() {
            match (word, words.next()) {
                ("burst", Some(b)) if burst.is_none() => {
                    burst = Some(
                        whole(b).ok_or_else(|| bad("the burst is not a whole number of digits"))?,
                    );
                }
                ("aligned", Some(o)) if aligned.is_none() => {
                    aligned = Some(o.parse::<UtcOffset>().map_err(|e| {
                        ConfigError::new(e.field(), format!("cannot parse {s:?}: {}", e.message()))
                    })?);
                }
                ("burst", None) => return Err(bad("\"burst\" needs a number after it")),
                ("aligned", None) => {
                    return Err(bad(
                        "\"aligned\" needs a UTC offset after it, e.g. +02:00 or UTC",
                    ))
                }
                _ => {
                    return Err(bad(
                        "only \"burst N\" and \"aligned OFFSET\" may follow the rate, once each",
                    ))
                }
            }
        }
        let mut quota = if monthly {
            Quota::per_month(count)
        } else {
            let micros = n
                .checked_mul(unit_micros)
                .ok_or_else(|| bad("the period overflows"))?;
            Quota::per(Duration::from_micros(micros), count)
        };
        if let Some(b) = burst {
            quota = quota.burst(b);
        }
        if let Some(o) = aligned {
            quota = quota.aligned(o);
        }
        quota.validate().map_err(|e| {
            ConfigError::new(e.field(), format!("cannot parse {s:?}: {}", e.message()))
        })?;
        Ok(quota)
    }
}

/// A non-empty run of ASCII digits (no sign, no spaces) that fits a `u64`.
fn whole(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Microseconds in a time unit of the grammar (exact, case-sensitive names).
fn unit_micros(unit: &str) -> Option<u64> {
    Some(match unit {
        "us" | "µs" | "micro" | "micros" | "microsecond" | "microseconds" => 1,
        "ms" | "milli" | "millis" | "millisecond" | "milliseconds" => 1_000,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000_000,
        "d" | "day" | "days" => 86_400_000_000,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_burst() {
        let cases = [
            ("100/min", Quota::per_minute(100)),
            ("10/s burst 50", Quota::per_second(10).burst(50)),
            ("10/sec", Quota::per_second(10)),
            ("3/seconds", Quota::per_second(3)),
            ("1000/h", Quota::per_hour(1000)),
            ("5000/day", Quota::per_day(5000)),
            ("5/15min", Quota::per(Duration::from_secs(900), 5)),
            ("2/500ms", Quota::per(Duration::from_millis(500), 2)),
            ("7/m", Quota::per_minute(7)),
            ("7/min", Quota::per_minute(7)),
            ("1/2h", Quota::per(Duration::from_secs(7200), 1)),
            ("3/µs", Quota::per(Duration::from_micros(1), 3)),
            ("  9/d   burst   12 ", Quota::per_day(9).burst(12)),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Quota>().unwrap(), want, "{text}");
        }
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "100/min",
            "10/s burst 50",
            "5/15min",
            "2/500ms",
            "9/d",
            "1/3us",
        ] {
            let q: Quota = text.parse().unwrap();
            assert_eq!(q.to_string(), text);
            assert_eq!(q.to_string().parse::<Quota>().unwrap(), q);
        }
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        for text in [
            "",
            "10",
            "x/s",
            "10/fortnight",
            "10/s burst",
            "10/s burst x",
            "10/s turbo 5",
        ] {
            let err = text.parse::<Quota>().unwrap_err();
            assert!(err.to_string().contains("expected e.g."), "{text}: {err}");
        }
    }

    #[test]
    fn units_are_exact_and_case_sensitive() {
        for text in [
            "1/mss", "1/msss", "1/hs", "10/M", "10/MS", "10/S", "1/Sec", "1/minn", "1/ds",
        ] {
            let err = text.parse::<Quota>().unwrap_err();
            assert!(err.message().contains("unknown time unit"), "{text}: {err}");
            assert!(
                err.message().contains(&format!("{text:?}")),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn numbers_are_plain_digits() {
        for text in ["+1/s", "-1/s", "1/s burst +3", "1/+2s", "1_000/s", " /s"] {
            let err = text.parse::<Quota>().unwrap_err();
            assert!(err.message().contains("cannot parse"), "{text}: {err}");
        }
    }

    #[test]
    fn errors_say_what_is_actually_wrong() {
        let msg = |text: &str| text.parse::<Quota>().unwrap_err().message().to_owned();
        assert!(
            msg("10 per second").contains("no spaces"),
            "{}",
            msg("10 per second")
        );
        assert!(
            msg("10/ s").contains("nothing follows '/'"),
            "{}",
            msg("10/ s")
        );
        assert!(
            msg("10/s burst").contains("needs a number"),
            "{}",
            msg("10/s burst")
        );
        let zero = "0/s".parse::<Quota>().unwrap_err();
        assert_eq!(zero.field(), "quota.count");
        assert!(
            zero.message().starts_with("cannot parse \"0/s\": "),
            "{zero}"
        );
        assert!(zero.message().contains("at least 1"), "{zero}");
    }

    #[test]
    fn sub_microsecond_periods_are_refused_not_rounded() {
        let err = Quota::per(Duration::from_nanos(1_999), 1)
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), "quota.period");
        assert!(
            err.message().contains("whole number of microseconds"),
            "{err}"
        );
        assert!(Quota::per(Duration::from_nanos(2_000), 1)
            .validate()
            .is_ok());
        assert!(Quota::per(Duration::from_nanos(999), 1).validate().is_err());
    }

    #[test]
    fn rates_above_one_per_microsecond_are_exact() {
        let fp = Quota::per_second(1_000_000_000).fixed_point();
        assert_eq!(
            fp,
            FixedPoint {
                unit: 1,
                per_micro: 1_000
            }
        );
        let bytes = Quota::per_second(10 * 1024 * 1024);
        bytes.validate().unwrap();
        assert_eq!(
            bytes.fixed_point(),
            FixedPoint {
                unit: 3_125,
                per_micro: 32_768
            }
        );
        assert_eq!(
            Quota::per(Duration::from_secs(365 * 86_400), 1).fixed_point(),
            FixedPoint {
                unit: 31_536_000_000_000,
                per_micro: 1
            }
        );
        assert_eq!(
            Quota::per_second(MAX_EXACT).validate().unwrap_err().field(),
            "quota.count"
        );
    }

    #[test]
    fn validation_names_the_field() {
        assert_eq!(
            Quota::per_second(0).validate().unwrap_err().field(),
            "quota.count"
        );
        assert_eq!(
            Quota::per(Duration::ZERO, 1)
                .validate()
                .unwrap_err()
                .field(),
            "quota.period"
        );
        assert_eq!(
            Quota::per_second(1)
                .burst(0)
                .validate()
                .unwrap_err()
                .field(),
            "quota.burst"
        );
        assert!(Quota::per_second(2_000_000).validate().is_ok());
        assert_eq!(
            Quota::per_day(7)
                .burst(u64::MAX / 2)
                .validate()
                .unwrap_err()
                .field(),
            "quota.burst"
        );
        assert!(Quota::per_day(100_000).validate().is_ok());
    }

    #[test]
    fn calendar_quotas_parse_print_and_validate() {
        let cases = [
            (
                "100/d aligned +02:00",
                Quota::per_day(100).aligned(UtcOffset::hours(2)),
            ),
            (
                "100/h aligned UTC",
                Quota::per_hour(100).aligned(UtcOffset::UTC),
            ),
            ("7/month", Quota::per_month(7)),
            (
                "7/month aligned -05:30",
                Quota::per_month(7).aligned(UtcOffset::minutes(-330)),
            ),
        ];
        for (text, want) in cases {
            let q: Quota = text.parse().unwrap();
            assert_eq!(q, want, "{text}");
            assert_eq!(q.to_string(), text);
            q.validate().unwrap();
        }
        for (text, alias) in [
            ("7/months", "7/month"),
            ("7/1month", "7/month"),
            ("100/day aligned Z", "100/d aligned UTC"),
            ("100/24h aligned UTC+2", "100/d aligned +02:00"),
            ("3/month aligned UTC", "3/month"),
        ] {
            assert_eq!(text.parse::<Quota>().unwrap().to_string(), alias, "{text}");
        }
        assert_eq!(
            Quota::per_hour(1).aligned(UtcOffset::hours(3)).calendar(),
            Some(Calendar::Hourly {
                utc_offset: UtcOffset::hours(3)
            })
        );
        assert_ne!(
            Quota::per_month(5),
            Quota::per(Duration::from_secs(31 * 86_400), 5)
        );
        let field = |text: &str| text.parse::<Quota>().unwrap_err().field();
        assert_eq!(field("5/15min aligned UTC"), "quota.calendar");
        assert_eq!(field("5/2d aligned UTC"), "quota.calendar");
        assert_eq!(field("5/d aligned +19:00"), "quota.utc_offset");
        assert_eq!(field("5/d aligned +2x"), "quota.utc_offset");
        assert_eq!(field("5/2month"), "quota");
        assert_eq!(field("5/d aligned"), "quota");
        assert_eq!(field("5/d aligned UTC aligned UTC"), "quota");
        let err = "5/min aligned UTC".parse::<Quota>().unwrap_err();
        assert!(err.message().contains("Quota::per_day"), "{err}");
        assert!(err.message().starts_with("cannot parse"), "{err}");
        let err = Quota::per_day(1)
            .aligned(UtcOffset::hours(-20))
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), "quota.utc_offset");
        assert!(err.message().contains("-20:00"), "{err}");
    }

    #[test]
    fn fixed_point_is_exact() {
        let fp = Quota::per_second(3).fixed_point();
        assert_eq!(
            fp,
            FixedPoint {
                unit: 1_000_000,
                per_micro: 3
            }
        );
        let fp = Quota::per_second(10).fixed_point();
        assert_eq!(
            fp,
            FixedPoint {
                unit: 100_000,
                per_micro: 1
            }
        );
        assert_eq!(Quota::per_second(3).emission_interval_micros(), 333_334);
    }
}
