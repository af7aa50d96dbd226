//! `strftime_now(format)` for chat templates (Hugging Face `transformers` provides it; Llama 3,
//! Mistral and others print today's date with it). A small subset of C `strftime` over UTC.

/// Formats `unix_secs` (UTC) with `%Y %y %m %d %e %j %H %M %S %b %B %a %A %p %%`; other
/// conversions are copied unchanged.
pub(crate) fn format_utc(unix_secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday.
    let weekday = (days + 4).rem_euclid(7) as usize;
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let month = MONTHS[(m - 1) as usize];
    let day = DAYS[weekday];

    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&day[..3]),
            Some('A') => out.push_str(day),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Day count since 1970-01-01 of a civil date (inverse of [`civil_from_days`]).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates_format_like_strftime() {
        assert_eq!(
            format_utc(0, "%Y-%m-%d %H:%M:%S %a %A"),
            "1970-01-01 00:00:00 Thu Thursday"
        );
        // 2024-07-26 (Llama 3.1's default date string), 13:05:09 UTC.
        assert_eq!(
            format_utc(1_721_999_109, "%d %b %Y %H:%M:%S"),
            "26 Jul 2024 13:05:09"
        );
        // Leap day, day of year, 12-hour marker, two-digit year, literal percent.
        assert_eq!(
            format_utc(951_782_400, "%j %B %e %p %y %%"),
            "060 February 29 AM 00 %"
        );
        assert_eq!(format_utc(-1, "%Y-%m-%d %H:%M:%S"), "1969-12-31 23:59:59");
        assert_eq!(format_utc(0, "%Q %"), "%Q %");
    }

    #[test]
    fn civil_conversion_round_trips_over_centuries() {
        for days in (-800_000..800_000).step_by(7_919) {
            let (y, m, d) = civil_from_days(days);
            assert!((1..=12).contains(&m) && (1..=31).contains(&d));
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
