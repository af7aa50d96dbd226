//! Calendar months and date ranges (UTC) used by budgets, reports and invoices.

use std::fmt;

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// A calendar month, e.g. `2026-11`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
#[schemars(extend("pattern" = "^[0-9]{4}-(0[1-9]|1[0-2])$"))]
pub struct Month {
    year: i32,
    month: u32,
}

impl Month {
    /// Builds a month; `month` is 1..=12.
    pub fn new(year: i32, month: u32) -> Result<Self, Error> {
        if !(1..=12).contains(&month) || NaiveDate::from_ymd_opt(year, month, 1).is_none() {
            return Err(Error::Invalid(format!("no such month {year}-{month}")));
        }
        Ok(Month { year, month })
    }

    /// Parses `YYYY-MM`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let bad = || Error::Invalid(format!("month {s:?} is not YYYY-MM"));
        let (y, m) = s.split_once('-').ok_or_else(bad)?;
        if y.len() != 4 || m.len() != 2 {
            return Err(bad());
        }
        let year = y.parse().map_err(|_| bad())?;
        let month = m.parse().map_err(|_| bad())?;
        Month::new(year, month)
    }

    /// The month containing `date`.
    pub fn of_date(date: NaiveDate) -> Self {
        Month {
            year: date.year(),
            month: date.month(),
        }
    }

    /// The month containing instant `at` (UTC).
    pub fn of_instant(at: DateTime<Utc>) -> Self {
        Month::of_date(at.date_naive())
    }

    /// First day of the month.
    pub fn first_day(self) -> NaiveDate {
        // Validated in `new`, and every constructor goes through it or a real date.
        NaiveDate::from_ymd_opt(self.year, self.month, 1).unwrap_or(NaiveDate::MIN)
    }

    /// The following month.
    pub fn next(self) -> Self {
        if self.month == 12 {
            Month {
                year: self.year + 1,
                month: 1,
            }
        } else {
            Month {
                year: self.year,
                month: self.month + 1,
            }
        }
    }

    /// The days of this month as a half-open range.
    pub fn period(self) -> Period {
        Period {
            from: self.first_day(),
            until: self.next().first_day(),
        }
    }

    /// Whether the month has fully passed at instant `now`.
    pub fn is_closed_at(self, now: DateTime<Utc>) -> bool {
        now.date_naive() >= self.next().first_day()
    }
}

impl fmt::Display for Month {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}", self.year, self.month)
    }
}

impl From<Month> for String {
    fn from(m: Month) -> String {
        m.to_string()
    }
}

impl TryFrom<String> for Month {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        Month::parse(&s)
    }
}

/// A half-open range of UTC days `[from, until)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Period {
    /// First day included.
    pub from: NaiveDate,
    /// First day excluded.
    pub until: NaiveDate,
}

impl Period {
    /// Builds a period, rejecting an inverted range.
    pub fn new(from: NaiveDate, until: NaiveDate) -> Result<Self, Error> {
        if until < from {
            return Err(Error::Invalid(format!(
                "period {from}..{until} is inverted"
            )));
        }
        Ok(Period { from, until })
    }

    /// Whether `day` lies inside.
    pub fn contains(&self, day: NaiveDate) -> bool {
        self.from <= day && day < self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn parses_and_prints_months() {
        let m = Month::parse("2026-11").unwrap();
        assert_eq!(m.to_string(), "2026-11");
        assert_eq!(m.next().to_string(), "2026-12");
        assert_eq!(m.next().next().to_string(), "2027-01");
        for bad in [
            "2026-13", "2026-00", "2026-1", "26-11", "2026/11", "", "abcd-ef",
        ] {
            assert!(Month::parse(bad).is_err(), "{bad}");
        }
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, "\"2026-11\"");
        assert_eq!(serde_json::from_str::<Month>(&json).unwrap(), m);
    }

    #[test]
    fn month_period_and_closing() {
        let m = Month::parse("2026-02").unwrap();
        let p = m.period();
        assert_eq!(p.from, NaiveDate::from_ymd_opt(2026, 2, 1).unwrap());
        assert_eq!(p.until, NaiveDate::from_ymd_opt(2026, 3, 1).unwrap());
        assert!(p.contains(NaiveDate::from_ymd_opt(2026, 2, 28).unwrap()));
        assert!(!p.contains(NaiveDate::from_ymd_opt(2026, 3, 1).unwrap()));
        let last_moment = Utc.with_ymd_and_hms(2026, 2, 28, 23, 59, 59).unwrap();
        assert!(!m.is_closed_at(last_moment));
        assert!(m.is_closed_at(Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap()));
        assert_eq!(Month::of_instant(last_moment), m);
    }

    #[test]
    fn inverted_period_is_rejected() {
        let a = NaiveDate::from_ymd_opt(2026, 1, 2).unwrap();
        let b = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap();
        assert!(Period::new(a, b).is_err());
        assert!(Period::new(b, a).is_ok());
    }
}
