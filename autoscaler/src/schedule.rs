//! Floors by time of day (pure): `minReplicas` raised during the hours a model is known to be
//! busy, as KEDA's cron scaler does. A floor held all day is paid all night; a causal policy
//! cannot see the first burst of the morning coming (docs/autoscaling.md, "Against a static
//! fleet sized with hindsight, and with a floor"). Times are UTC; the caller passes the wall
//! clock, so `decide` itself stays on its monotonic clock.

use serde::{Deserialize, Serialize};

/// Minutes in a day.
pub const MINUTES_PER_DAY: u16 = 24 * 60;

/// Every day of the week, as a [`FloorWindow::days`] mask.
pub const EVERY_DAY: u8 = 0b111_1111;

/// A floor of `min_replicas` from `start_minute` to `end_minute` (UTC minutes after midnight)
/// on the days in `days`. A window whose end is not after its start runs past midnight into
/// the next day; `days` names the day it starts on.
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
}

impl FloorWindow {
    /// Whether the window holds at `unix_secs` (seconds since 1970-01-01T00:00:00Z).
    pub fn active_at(&self, unix_secs: u64) -> bool {
        let day = unix_secs / 86_400;
        let minute = ((unix_secs % 86_400) / 60) as u16;
        // 1970-01-01 was a Thursday: weekday 3 with Monday as 0.
        let weekday = ((day + 3) % 7) as u8;
        let yesterday = (weekday + 6) % 7;
        let starts_on = |d: u8| self.days & (1 << d) != 0;
        if self.start_minute < self.end_minute {
            starts_on(weekday) && (self.start_minute..self.end_minute).contains(&minute)
        } else {
            // past midnight: the evening part belongs to today, the morning part to yesterday
            (starts_on(weekday) && minute >= self.start_minute)
                || (starts_on(yesterday) && minute < self.end_minute)
        }
    }
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
}
