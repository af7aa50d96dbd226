//! Floors by time of day (pure): `minReplicas` raised during the hours a model is known to be
//! busy, as KEDA's cron scaler does. A floor held all day is paid all night; a causal policy
//! cannot see the first burst of the morning coming (docs/autoscaling.md, "Against a static
//! fleet sized with hindsight, and with a floor"). Each window reads days and times on the
//! wall clock of its own time zone (IANA, daylight saving time included; UTC by default); the
//! caller passes the instant, so `decide` itself stays on its monotonic clock.

use chrono::{Datelike, Days, LocalResult, NaiveDate, NaiveDateTime, TimeDelta, TimeZone};
/// A time zone of the IANA database (`"Europe/Berlin"`, `"UTC"`), as windows name it.
pub use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use std::str::FromStr;
use thiserror::Error;

/// The IANA time zone database release the windows' zones come from (built in, e.g.
/// "2025b"): the controller logs it, since a zone whose rules changed after it reads wrong.
pub const TZ_DATABASE: &str = chrono_tz::IANA_TZDB_VERSION;

/// Minutes in a day.
pub const MINUTES_PER_DAY: u16 = 24 * 60;

/// Every day of the week, as a [`FloorWindow::days`] mask.
pub const EVERY_DAY: u8 = 0b111_1111;

/// Day names as `FloorWindow`'s text form writes them, Monday first.
const DAY_NAMES: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// A floor of `min_replicas` from `start_minute` to `end_minute` (minutes after midnight on
/// the wall clock of `time_zone`) on the days in `days`. A window whose end is not after its
/// start runs past midnight into the next day; `days` names the day it starts on.
///
/// Daylight saving time moves the window with the local clock. A start or end in the hour
/// skipped in spring stands for the first minute after the skip; one in the hour repeated in
/// autumn opens the window at its first occurrence and closes it at its second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FloorWindow {
    /// Days it starts on: bit 0 Monday … bit 6 Sunday.
    pub days: u8,
    /// First minute of the window, 0..1440.
    pub start_minute: u16,
    /// First minute after the window, 0..1440.
    pub end_minute: u16,
    /// Replicas kept serving inside the window.
    pub min_replicas: u32,
    /// The zone whose wall clock `days` and the minutes are read on.
    #[serde(default)]
    pub time_zone: Tz,
}

impl FloorWindow {
    /// Whether the window holds at `unix_secs` (seconds since 1970-01-01T00:00:00Z).
    pub fn active_at(&self, unix_secs: u64) -> bool {
        let Some(now) = i64::try_from(unix_secs)
            .ok()
            .and_then(|secs| self.time_zone.timestamp_opt(secs, 0).single())
        else {
            // past chrono's calendar (about 262,000 years): no window holds
            return false;
        };
        let today = now.date_naive();
        // A window lasts at most a day plus a clock change, so only one that started today,
        // yesterday or (where the clock fell back across midnight) the day before can hold.
        (0..=2)
            .filter_map(|back| today.checked_sub_days(Days::new(back)))
            .filter(|day| self.days & (1 << day.weekday().num_days_from_monday()) != 0)
            .filter_map(|day| self.span_from(day))
            .any(|(start, end)| (start..end).contains(&now.timestamp()))
    }

    /// The instants (Unix seconds) the window opens and closes when it starts on local `day`.
    fn span_from(&self, day: NaiveDate) -> Option<(i64, i64)> {
        let end_day = if self.end_minute > self.start_minute {
            day
        } else {
            day.checked_add_days(Days::new(1))?
        };
        let at = |day: NaiveDate, minute: u16| {
            day.and_hms_opt(u32::from(minute / 60), u32::from(minute % 60), 0)
        };
        let start = instant(self.time_zone, at(day, self.start_minute)?, Repeated::First)?;
        let end = instant(
            self.time_zone,
            at(end_day, self.end_minute)?,
            Repeated::Second,
        )?;
        Some((start, end))
    }
}

/// Which instant a local time that a clock change repeats stands for.
#[derive(Clone, Copy)]
enum Repeated {
    First,
    Second,
}

/// The instant (Unix seconds) of local time `local` in `zone`. A time that the clock skips
/// stands for the first minute after the skip; one that it repeats for the first or second
/// time it occurs: windows open at the first and close at the second, so they never shrink.
fn instant(zone: Tz, local: NaiveDateTime, repeated: Repeated) -> Option<i64> {
    // skips last an hour in most zones and never more than a day
    (0..=i64::from(MINUTES_PER_DAY)).find_map(|late| {
        let t = local.checked_add_signed(TimeDelta::minutes(late))?;
        match (zone.from_local_datetime(&t), repeated) {
            (LocalResult::Single(x), _) | (LocalResult::Ambiguous(x, _), Repeated::First) => {
                Some(x.timestamp())
            }
            (LocalResult::Ambiguous(_, x), Repeated::Second) => Some(x.timestamp()),
            (LocalResult::None, _) => None,
        }
    })
}

/// The highest floor of the windows that hold at `unix_secs`; 0 outside all of them.
pub fn scheduled_floor(windows: &[FloorWindow], unix_secs: u64) -> u32 {
    windows
        .iter()
        .filter(|w| w.active_at(unix_secs))
        .map(|w| w.min_replicas)
        .max()
        .unwrap_or(0)
}

/// "HH:MM" (two digits each, 00:00 to 23:59) as minutes after midnight.
pub fn minute_of_day(hhmm: &str) -> Option<u16> {
    let (h, m) = hhmm.split_once(':')?;
    let two_digits = |x: &str| x.len() == 2 && x.bytes().all(|b| b.is_ascii_digit());
    if !(two_digits(h) && two_digits(m)) {
        return None;
    }
    let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60).then_some(h * 60 + m)
}

/// A floor window written as text that cannot be read.
#[derive(Debug, Error, PartialEq)]
#[error(
    "floor window {text:?}: {why} (expected DAYS HH:MM-HH:MM MIN_REPLICAS [ZONE], e.g. \"Mon-Fri 08:00-19:00 2 Europe/Berlin\"; DAYS is \"daily\" or days and ranges such as \"Sat,Sun\")"
)]
pub struct FloorWindowParseError {
    text: String,
    why: String,
}

/// `DAYS HH:MM-HH:MM MIN_REPLICAS [ZONE]`, the command-line form of a `floorSchedule`
/// entry (`tidal sim --floor-window`): DAYS is `daily` or comma-separated days and ranges
/// (`Mon-Fri`, `Sat,Sun`, `Fri-Mon`), the zone an IANA name (UTC when left out).
impl FromStr for FloorWindow {
    type Err = FloorWindowParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: String| FloorWindowParseError {
            text: text.to_string(),
            why,
        };
        let fields: Vec<&str> = text.split_whitespace().collect();
        let [days, times, min_replicas, zone @ ..] = fields.as_slice() else {
            return Err(bad("needs days, times and a replica count".into()));
        };
        let time_zone = match zone {
            [] => Tz::UTC,
            [zone] => zone
                .parse()
                .map_err(|_| bad(format!("unknown time zone {zone:?}")))?,
            _ => return Err(bad("too many fields".into())),
        };
        let days = day_mask(days).ok_or_else(|| bad(format!("{days:?} are not days")))?;
        let minute = |t: &str| minute_of_day(t).ok_or_else(|| bad(format!("{t:?} is not HH:MM")));
        let (start, end) = times
            .split_once('-')
            .ok_or_else(|| bad(format!("{times:?} is not START-END")))?;
        Ok(Self {
            days,
            start_minute: minute(start)?,
            end_minute: minute(end)?,
            min_replicas: min_replicas
                .parse()
                .map_err(|_| bad(format!("{min_replicas:?} is not a replica count")))?,
            time_zone,
        })
    }
}

/// `daily`, or comma-separated days and ranges (a range past Sunday wraps to Monday).
fn day_mask(text: &str) -> Option<u8> {
    if text == "daily" {
        return Some(EVERY_DAY);
    }
    let day = |name: &str| DAY_NAMES.iter().position(|d| *d == name);
    text.split(',').try_fold(0u8, |mask, part| {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last) = (day(first)?, day(last)?);
        let span = if first <= last {
            first..=last
        } else {
            first..=last + 7
        };
        Some(span.fold(mask, |m, d| m | 1 << (d % 7)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-30 was a Monday.
    const MONDAY: u64 = 1_795_996_800;
    const HOUR: u64 = 3600;
    const WEEKDAYS: u8 = 0b001_1111;

    fn window(days: u8, start: (u16, u16), end: (u16, u16), min_replicas: u32) -> FloorWindow {
        FloorWindow {
            days,
            start_minute: start.0 * 60 + start.1,
            end_minute: end.0 * 60 + end.1,
            min_replicas,
            time_zone: Tz::UTC,
        }
    }

    #[test]
    fn the_reference_monday_is_a_monday_at_midnight() {
        assert_eq!(MONDAY % 86_400, 0);
        // Monday 00:00..01:00 only
        let w = window(0b1, (0, 0), (1, 0), 1);
        assert!(w.active_at(MONDAY));
        assert!(!w.active_at(MONDAY - 1));
        assert!(!w.active_at(MONDAY + 86_400));
        assert!(w.active_at(MONDAY + 7 * 86_400));
    }

    #[test]
    fn office_hours_on_weekdays() {
        let w = window(WEEKDAYS, (8, 0), (18, 30), 6);
        for day in 0..7u64 {
            let at = |h: u64, m: u64| MONDAY + day * 86_400 + h * HOUR + m * 60;
            let weekday = day < 5;
            assert_eq!(w.active_at(at(8, 0)), weekday, "day {day} 08:00");
            assert_eq!(w.active_at(at(18, 29)), weekday, "day {day} 18:29");
            assert!(!w.active_at(at(7, 59)), "day {day} 07:59");
            assert!(
                !w.active_at(at(18, 30)),
                "day {day} 18:30 (end is exclusive)"
            );
            assert!(!w.active_at(at(23, 0)));
        }
    }

    #[test]
    fn a_window_past_midnight_belongs_to_the_day_it_starts() {
        // Friday 22:00 to Saturday 02:00 (a batch job), starting on Friday only
        let friday = MONDAY + 4 * 86_400;
        let w = window(1 << 4, (22, 0), (2, 0), 3);
        assert!(!w.active_at(friday + 21 * HOUR));
        assert!(w.active_at(friday + 22 * HOUR));
        assert!(w.active_at(friday + 86_400 + HOUR)); // Saturday 01:00
        assert!(!w.active_at(friday + 86_400 + 2 * HOUR)); // Saturday 02:00
        assert!(!w.active_at(friday + 86_400 + 22 * HOUR)); // Saturday evening: not a start day
        assert!(!w.active_at(friday + HOUR)); // Friday 01:00: Thursday did not start it
                                              // a window whose end equals its start runs the whole day from its start
        let all_day = window(EVERY_DAY, (6, 0), (6, 0), 1);
        for h in 0..48 {
            assert!(all_day.active_at(MONDAY + h * HOUR), "hour {h}");
        }
    }

    #[test]
    fn the_highest_active_floor_wins() {
        let windows = [
            window(WEEKDAYS, (8, 0), (18, 0), 4),
            window(WEEKDAYS, (9, 0), (10, 0), 9),
            window(EVERY_DAY, (0, 0), (0, 0), 1),
        ];
        assert_eq!(scheduled_floor(&windows, MONDAY + 7 * HOUR), 1);
        assert_eq!(scheduled_floor(&windows, MONDAY + 8 * HOUR), 4);
        assert_eq!(scheduled_floor(&windows, MONDAY + 9 * HOUR + 59 * 60), 9);
        assert_eq!(scheduled_floor(&windows, MONDAY + 10 * HOUR), 4);
        // Sunday noon: only the every-day window
        assert_eq!(
            scheduled_floor(&windows, MONDAY + 6 * 86_400 + 12 * HOUR),
            1
        );
        assert_eq!(scheduled_floor(&[], MONDAY), 0);
    }

    #[test]
    fn a_zone_with_daylight_saving_moves_the_window_with_its_clock() {
        // weekdays 08:00-18:00 in Berlin: 07:00-17:00 UTC in winter (CET, +1),
        // 06:00-16:00 UTC in summer (CEST, +2)
        let berlin = FloorWindow {
            time_zone: Tz::Europe__Berlin,
            ..window(WEEKDAYS, (8, 0), (18, 0), 2)
        };
        let winter_monday = MONDAY;
        assert!(!berlin.active_at(winter_monday + 7 * HOUR - 1));
        assert!(berlin.active_at(winter_monday + 7 * HOUR));
        assert!(berlin.active_at(winter_monday + 17 * HOUR - 1));
        assert!(!berlin.active_at(winter_monday + 17 * HOUR));
        // 2026-06-01 was a Monday
        let summer_monday = 1_780_272_000;
        assert_eq!(summer_monday % 86_400, 0);
        assert!(!berlin.active_at(summer_monday + 6 * HOUR - 1));
        assert!(berlin.active_at(summer_monday + 6 * HOUR));
        assert!(!berlin.active_at(summer_monday + 16 * HOUR));
        // the UTC window of the same numbers does not move
        let utc = window(WEEKDAYS, (8, 0), (18, 0), 2);
        assert!(!utc.active_at(summer_monday + 7 * HOUR));
        assert!(utc.active_at(summer_monday + 8 * HOUR));
    }

    #[test]
    fn the_local_day_decides_the_weekday() {
        // Sunday 23:30 UTC is already Monday 08:30 in Tokyo (+9, no DST); and Friday
        // 23:00 UTC is Friday 18:00 in New York (EST, -5) but Saturday in UTC
        let tokyo = FloorWindow {
            time_zone: Tz::Asia__Tokyo,
            ..window(0b1, (8, 0), (9, 0), 1)
        };
        assert!(tokyo.active_at(MONDAY - HOUR + 30 * 60));
        assert!(!tokyo.active_at(MONDAY + 23 * HOUR + 30 * 60));
        let new_york = FloorWindow {
            time_zone: Tz::America__New_York,
            ..window(1 << 4, (17, 0), (19, 0), 1)
        };
        let friday = MONDAY + 4 * 86_400;
        assert!(new_york.active_at(friday + 23 * HOUR));
        assert!(!new_york.active_at(friday + 22 * HOUR - 1));
    }

    #[test]
    fn the_clock_change_days_open_and_close_on_local_time() {
        // Berlin springs forward on 2027-03-28 at 02:00 CET (01:00 UTC) to 03:00 CEST, and
        // falls back on 2026-10-25 at 03:00 CEST (01:00 UTC) to 02:00 CET.
        let spring_sunday = 1_806_192_000; // 2027-03-28T00:00Z
        let autumn_sunday = 1_792_886_400; // 2026-10-25T00:00Z
        for day in [spring_sunday, autumn_sunday] {
            assert_eq!(day % 86_400, 0);
            assert_eq!((day / 86_400 + 3) % 7, 6, "a Sunday");
        }
        // 02:30-04:00 local: 02:30 does not exist in spring, so the window opens at 03:00
        // CEST, the first local minute after its start (01:00 UTC)
        let night = FloorWindow {
            time_zone: Tz::Europe__Berlin,
            ..window(1 << 6, (2, 30), (4, 0), 1)
        };
        assert!(!night.active_at(spring_sunday + HOUR - 1)); // 01:59:59 CET
        assert!(night.active_at(spring_sunday + HOUR)); // 03:00 CEST
        assert!(night.active_at(spring_sunday + 2 * HOUR - 1)); // 03:59:59 CEST
        assert!(!night.active_at(spring_sunday + 2 * HOUR)); // 04:00 CEST
                                                             // in autumn 02:00-03:00 comes twice: the window opens at the first 02:30 (CEST,
                                                             // 00:30 UTC) and holds without a break, through the second 02:00-02:30 (CET), to
                                                             // 04:00 CET (03:00 UTC), two and a half hours
        assert!(!night.active_at(autumn_sunday + 30 * 60 - 1));
        assert!(night.active_at(autumn_sunday + 30 * 60));
        assert!(night.active_at(autumn_sunday + HOUR + 15 * 60)); // 02:15 CET
        assert!(night.active_at(autumn_sunday + 3 * HOUR - 1));
        assert!(!night.active_at(autumn_sunday + 3 * HOUR));
    }

    #[test]
    fn a_window_that_ends_in_a_repeated_hour_closes_at_its_second_occurrence() {
        // 01:00-02:30 on the autumn Sunday: 23:00 UTC on Saturday to 01:30 UTC (02:30 CET)
        let autumn_sunday = 1_792_886_400;
        let w = FloorWindow {
            time_zone: Tz::Europe__Berlin,
            ..window(1 << 6, (1, 0), (2, 30), 1)
        };
        assert!(!w.active_at(autumn_sunday - HOUR - 1));
        assert!(w.active_at(autumn_sunday - HOUR));
        assert!(w.active_at(autumn_sunday + HOUR + 30 * 60 - 1));
        assert!(!w.active_at(autumn_sunday + HOUR + 30 * 60));
    }

    #[test]
    fn instants_past_the_calendar_hold_no_window() {
        let w = FloorWindow {
            time_zone: Tz::Europe__Berlin,
            ..window(EVERY_DAY, (0, 0), (0, 0), 1)
        };
        assert!(!w.active_at(u64::MAX));
        assert!(w.active_at(MONDAY));
    }

    #[test]
    fn minutes_of_the_day_are_two_digit_hh_mm() {
        assert_eq!(minute_of_day("00:00"), Some(0));
        assert_eq!(minute_of_day("08:30"), Some(510));
        assert_eq!(minute_of_day("23:59"), Some(1439));
        for bad in [
            "8:00", "24:00", "12:60", "ab:cd", "1200", "12:00:00", "+1:00", "",
        ] {
            assert_eq!(minute_of_day(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_text_form_reads_days_times_floor_and_zone() {
        let w: FloorWindow = "Mon-Fri 08:00-19:00 2 Europe/Berlin".parse().unwrap();
        assert_eq!(
            w,
            FloorWindow {
                time_zone: Tz::Europe__Berlin,
                ..window(WEEKDAYS, (8, 0), (19, 0), 2)
            }
        );
        let w: FloorWindow = "daily 22:00-02:00 1".parse().unwrap();
        assert_eq!(w, window(EVERY_DAY, (22, 0), (2, 0), 1));
        for (days, mask) in [
            ("Sat,Sun", 0b110_0000),
            ("Mon,Wed-Thu", 0b000_1101),
            ("Fri-Mon", 0b111_0001),
            ("Sun", 0b100_0000),
        ] {
            let w: FloorWindow = format!("{days} 00:00-01:00 1").parse().unwrap();
            assert_eq!(w.days, mask, "{days}");
        }
        for (text, why) in [
            ("Mon-Fri 08:00-19:00", "needs days"),
            ("Mon-Fri 08:00-19:00 2 Europe/Berlin x", "too many fields"),
            ("Mon-Fri 08:00-19:00 2 Europe/Berln", "unknown time zone"),
            ("Monday 08:00-19:00 2", "are not days"),
            ("Mon-Fri 8:00-19:00 2", "is not HH:MM"),
            ("Mon-Fri 08:00 2", "is not START-END"),
            ("Mon-Fri 08:00-19:00 two", "not a replica count"),
        ] {
            let err = text.parse::<FloorWindow>().unwrap_err().to_string();
            assert!(err.contains(why) && err.contains("expected DAYS"), "{err}");
        }
    }
}
