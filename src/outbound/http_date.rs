//! HTTP-date (RFC 9110 §5.6.7): IMF-fixdate, and the obsolete RFC 850 and asctime forms a
//! recipient must accept, to Unix seconds. No allocation, no panic on any input.

/// Seconds since 1970-01-01T00:00:00Z of an HTTP-date, or `None` when `text` is not one.
///
/// Accepts the three forms of RFC 9110 §5.6.7:
///
/// - IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT` (what senders must produce);
/// - RFC 850: `Sunday, 06-Nov-94 08:49:37 GMT` (a two-digit year more than 50 years after
///   `now_unix_secs` is taken as the century before, as §5.6.7 asks);
/// - asctime: `Sun Nov  6 08:49:37 1994`.
///
/// The day name is checked to be a day name but not against the date (a mismatch is the
/// sender's mistake, and the date is what matters). Dates before 1970 give `None`.
///
/// ```
/// use tollgate::outbound::parse::http_date;
///
/// let now = 1_700_000_000;
/// assert_eq!(http_date("Sun, 06 Nov 1994 08:49:37 GMT", now), Some(784_111_777));
/// assert_eq!(http_date("Sunday, 06-Nov-94 08:49:37 GMT", now), Some(784_111_777));
/// assert_eq!(http_date("Sun Nov  6 08:49:37 1994", now), Some(784_111_777));
/// assert_eq!(http_date("yesterday", now), None);
/// ```
pub fn http_date(text: &str, now_unix_secs: u64) -> Option<u64> {
    let text = text.trim();
    if !text.is_ascii() {
        return None;
    }
    let (day_name, rest) = text.split_once([',', ' '])?;
    if text.as_bytes().get(day_name.len()) == Some(&b',') {
        if is_short_day(day_name) {
            imf_fixdate(rest.strip_prefix(' ')?)
        } else if is_long_day(day_name) {
            rfc850(rest.strip_prefix(' ')?, now_unix_secs)
        } else {
            None
        }
    } else if is_short_day(day_name) {
        asctime(rest)
    } else {
        None
    }
}

const SHORT_DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const LONG_DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

fn is_short_day(s: &str) -> bool {
    SHORT_DAYS.contains(&s)
}

fn is_long_day(s: &str) -> bool {
    LONG_DAYS.contains(&s)
}

fn month(s: &str) -> Option<u32> {
    MONTHS.iter().position(|m| *m == s).map(|i| i as u32 + 1)
}

/// Exactly `width` ASCII digits.
fn digits(s: &str, width: usize) -> Option<u32> {
    if s.len() != width || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `08:49:37` to seconds of the day.
fn time_of_day(s: &str) -> Option<u64> {
    let mut parts = s.split(':');
    let h = digits(parts.next()?, 2)?;
    let m = digits(parts.next()?, 2)?;
    let sec = digits(parts.next()?, 2)?;
    // 60 is a leap second, which Unix time folds into the next one.
    if parts.next().is_some() || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    Some(u64::from(h) * 3600 + u64::from(m) * 60 + u64::from(sec))
}

/// `06 Nov 1994 08:49:37 GMT`
fn imf_fixdate(s: &str) -> Option<u64> {
    let mut parts = s.split(' ');
    let day = digits(parts.next()?, 2)?;
    let month = month(parts.next()?)?;
    let year = digits(parts.next()?, 4)?;
    let time = time_of_day(parts.next()?)?;
    if parts.next()? != "GMT" || parts.next().is_some() {
        return None;
    }
    unix(year, month, day, time)
}

/// `06-Nov-94 08:49:37 GMT`
fn rfc850(s: &str, now_unix_secs: u64) -> Option<u64> {
    let mut parts = s.split(' ');
    let mut date = parts.next()?.split('-');
    let day = digits(date.next()?, 2)?;
    let month = month(date.next()?)?;
    let yy = digits(date.next()?, 2)?;
    if date.next().is_some() {
        return None;
    }
    let time = time_of_day(parts.next()?)?;
    if parts.next()? != "GMT" || parts.next().is_some() {
        return None;
    }
    // The year in this century, unless that is more than 50 years ahead of now.
    let this_year = 1970 + (now_unix_secs / 31_556_952).min(8_000) as u32;
    let century = this_year / 100 * 100;
    let mut year = century + yy;
    if year > this_year + 50 {
        year -= 100;
    }
    unix(year, month, day, time)
}

/// `Nov  6 08:49:37 1994` (the day is space-padded: one or two spaces before it).
fn asctime(s: &str) -> Option<u64> {
    let (month_name, rest) = s.split_once(' ')?;
    let month = month(month_name)?;
    let (day, rest) = if let Some(rest) = rest.strip_prefix(' ') {
        let (d, rest) = rest.split_once(' ')?;
        (digits(d, 1)?, rest)
    } else {
        let (d, rest) = rest.split_once(' ')?;
        (digits(d, 2)?, rest)
    };
    let (time, year) = rest.split_once(' ')?;
    let time = time_of_day(time)?;
    let year = digits(year, 4)?;
    unix(year, month, day, time)
}

/// Unix seconds of a civil date and second of the day, `None` when the date does not exist.
fn unix(year: u32, month: u32, day: u32, secs_of_day: u64) -> Option<u64> {
    if year < 1970 || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + secs_of_day)
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        _ => 0,
    }
}

/// Days since 1970-01-01 of a date on or after it (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: u32, month: u32, day: u32) -> u64 {
    let y = u64::from(if month <= 2 { year - 1 } else { year });
    let era = y / 400;
    let yoe = y - era * 400;
    let m = u64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + u64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The IMF-fixdate of Unix second `secs`, for tests and for servers that answer with dates.
#[cfg(test)]
pub(crate) fn format_imf_fixdate(secs: u64) -> String {
    let days = secs / 86_400;
    let sod = secs % 86_400;
    // civil_from_days
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    // 1970-01-01 was a Thursday.
    let wd = SHORT_DAYS[((days + 3) % 7) as usize];
    format!(
        "{wd}, {d:02} {} {y:04} {:02}:{:02}:{:02} GMT",
        MONTHS[(m - 1) as usize],
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_633_600; // 2025-12-02

    #[test]
    fn the_three_forms_of_rfc_9110() {
        for text in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "  Sun, 06 Nov 1994 08:49:37 GMT  ",
        ] {
            assert_eq!(http_date(text, NOW), Some(784_111_777), "{text}");
        }
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:00 GMT", NOW), Some(0));
        assert_eq!(
            http_date("Thu Feb 29 12:00:00 2024", NOW),
            Some(1_709_208_000)
        );
        assert_eq!(
            http_date("Tue Nov 14 22:13:20 2023", NOW),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn rfc850_years_more_than_fifty_years_ahead_are_the_last_century() {
        // In 2025, "26" is 2026 and "99" is 1999 (2099 is more than 50 years ahead).
        let y2026 = http_date("Thursday, 01-Jan-26 00:00:00 GMT", NOW).unwrap();
        assert_eq!(y2026, 1_767_225_600);
        let y1999 = http_date("Friday, 01-Jan-99 00:00:00 GMT", NOW).unwrap();
        assert_eq!(y1999, 915_148_800);
    }

    #[test]
    fn formats_and_parses_back() {
        for secs in [
            0,
            784_111_777,
            951_782_400,
            1_709_208_000,
            NOW,
            4_102_444_799,
        ] {
            let text = format_imf_fixdate(secs);
            assert_eq!(http_date(&text, NOW), Some(secs), "{text}");
        }
        assert_eq!(
            format_imf_fixdate(784_111_777),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
    }

    #[test]
    fn garbage_is_none_never_a_panic() {
        for text in [
            "",
            ",",
            " ",
            "Sun,",
            "Sun, ",
            "Sun, 06 Nov 1994 08:49:37",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 31 Feb 1994 08:49:37 GMT",
            "Sun, 00 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:61:00 GMT",
            "Sun, 06 Nov 1994 08:49:37:00 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT extra",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sunday, 06-Nov-94-1 08:49:37 GMT",
            "Sun Nov 6 08:49:37 1994",
            "Sun Nov  06 08:49:37 1994",
            "Sun Nov  6 08:49:37",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "Sün, 06 Nov 1994 08:49:37 GMT",
            "Sun, +6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 -8:49:37 GMT",
            "Sun, 99 Nov 9999 99:99:99 GMT",
            "Sun\t06 Nov 1994 08:49:37 GMT",
            "12345",
        ] {
            assert_eq!(http_date(text, NOW), None, "{text:?}");
        }
        // Every prefix and every single-byte change of a valid date, for panics.
        let valid = "Sun, 06 Nov 1994 08:49:37 GMT";
        for end in 0..valid.len() {
            let _ = http_date(&valid[..end], NOW);
        }
        for i in 0..valid.len() {
            for b in [b'0', b'9', b' ', b',', b'-', b':', b'x', 0xff] {
                let mut bytes = valid.as_bytes().to_vec();
                bytes[i] = b;
                let _ = http_date(&String::from_utf8_lossy(&bytes), NOW);
            }
        }
        let _ = http_date(valid, u64::MAX);
    }
}
