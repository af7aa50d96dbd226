//! Usage reports: tokens and cost per model and per day for one tenant and period.
//!
//! Pure functions over aggregate rows. Every money figure is rounded once from its exact
//! pico value (see [`crate::money`]), so a total is the rounded exact sum, which may differ
//! from the sum of rounded lines by less than one micro per line. The invoice, not the
//! report, is what is charged.

use std::collections::BTreeMap;

use chrono::NaiveDate;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::money::{format_micros, round_picos};
use crate::period::Period;
use crate::price::{Prices, UNPRICED};
use crate::usage::{CapacityType, Totals};

/// One daily aggregate row joined with its prices: the input of reports and invoices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsageRow {
    /// Tenant id.
    pub tenant: String,
    /// Model id.
    pub model: String,
    /// UTC day.
    pub day: NaiveDate,
    /// Capacity type.
    pub capacity: CapacityType,
    /// Price version id ([`UNPRICED`] when none applied).
    pub price_version_id: i64,
    /// Prices of that version (zero when unpriced).
    pub prices: Prices,
    /// Token totals.
    pub totals: Totals,
}

/// One report line: a model on a day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReportLine {
    /// UTC day.
    pub day: NaiveDate,
    /// Model id.
    pub model: String,
    /// Token totals.
    pub totals: Totals,
    /// Cost in micros (rounded once).
    pub cost_micros: i64,
}

/// Per-model totals over the period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelTotal {
    /// Model id.
    pub model: String,
    /// Token totals.
    pub totals: Totals,
    /// Cost in micros (rounded once).
    pub cost_micros: i64,
}

/// A tenant's usage report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsageReport {
    /// Tenant id.
    pub tenant: String,
    /// The period covered.
    pub period: Period,
    /// Per day and model, sorted by day then model.
    pub lines: Vec<ReportLine>,
    /// Per model, sorted by model.
    pub models: Vec<ModelTotal>,
    /// All tokens.
    pub totals: Totals,
    /// Total cost in micros (rounded once).
    pub cost_micros: i64,
    /// Tokens that had no price in effect (counted in `totals`, costed at zero).
    pub unpriced_tokens: i64,
}

#[derive(Default)]
struct Acc {
    totals: Totals,
    picos: i128,
}

impl Acc {
    fn add(&mut self, row: &UsageRow) -> Result<()> {
        self.totals.add(&row.totals)?;
        self.picos += row.totals.cost_picos(&row.prices);
        Ok(())
    }
}

/// Builds `tenant`'s report over `period` from aggregate rows.
///
/// Rows of other tenants or outside the period are ignored, so a caller that passes too
/// much can never leak another tenant's usage into a report.
pub fn build_report(tenant: &str, period: Period, rows: &[UsageRow]) -> Result<UsageReport> {
    let mut by_line: BTreeMap<(NaiveDate, &str), Acc> = BTreeMap::new();
    let mut by_model: BTreeMap<&str, Acc> = BTreeMap::new();
    let mut all = Acc::default();
    let mut unpriced_tokens = 0i64;
    for row in rows
        .iter()
        .filter(|r| r.tenant == tenant && period.contains(r.day))
    {
        by_line
            .entry((row.day, row.model.as_str()))
            .or_default()
            .add(row)?;
        by_model.entry(row.model.as_str()).or_default().add(row)?;
        all.add(row)?;
        if row.price_version_id == UNPRICED {
            unpriced_tokens = unpriced_tokens.saturating_add(row.totals.tokens_served());
        }
    }
    let lines = by_line
        .into_iter()
        .map(|((day, model), acc)| {
            Ok(ReportLine {
                day,
                model: model.into(),
                totals: acc.totals,
                cost_micros: round_picos(acc.picos)?,
            })
        })
        .collect::<Result<_>>()?;
    let models = by_model
        .into_iter()
        .map(|(model, acc)| {
            Ok(ModelTotal {
                model: model.into(),
                totals: acc.totals,
                cost_micros: round_picos(acc.picos)?,
            })
        })
        .collect::<Result<_>>()?;
    Ok(UsageReport {
        tenant: tenant.into(),
        period,
        lines,
        models,
        totals: all.totals,
        cost_micros: round_picos(all.picos)?,
        unpriced_tokens,
    })
}

/// Renders a report as pretty JSON.
pub fn render_json(report: &UsageReport) -> Result<String> {
    serde_json::to_string_pretty(report).map_err(|e| Error::Invalid(e.to_string()))
}

/// CSV header of [`render_csv`].
pub const CSV_HEADER: [&str; 9] = [
    "tenant",
    "date",
    "model",
    "segments",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "cost_micros",
    "cost",
];

/// Renders the per-day lines as CSV (one row per day and model).
pub fn render_csv(report: &UsageReport) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let csv_err = |e: csv::Error| Error::Csv(e.to_string());
    w.write_record(CSV_HEADER).map_err(csv_err)?;
    for l in &report.lines {
        w.write_record([
            report.tenant.clone(),
            l.day.to_string(),
            l.model.clone(),
            l.totals.segments.to_string(),
            l.totals.input_tokens.to_string(),
            l.totals.cached_input_tokens.to_string(),
            l.totals.output_tokens.to_string(),
            l.cost_micros.to_string(),
            format_micros(l.cost_micros),
        ])
        .map_err(csv_err)?;
    }
    let bytes = w.into_inner().map_err(|e| Error::Csv(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| Error::Csv(e.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, d).unwrap()
    }

    pub(crate) fn row(
        tenant: &str,
        model: &str,
        d: u32,
        version: i64,
        prices: Prices,
        tokens: (i64, i64, i64),
    ) -> UsageRow {
        UsageRow {
            tenant: tenant.into(),
            model: model.into(),
            day: day(d),
            capacity: CapacityType::Spot,
            price_version_id: version,
            prices,
            totals: Totals {
                segments: 1,
                input_tokens: tokens.0,
                cached_input_tokens: tokens.1,
                output_tokens: tokens.2,
            },
        }
    }

    const P1: Prices = Prices {
        input_per_m: 150_000,
        cached_input_per_m: 75_000,
        output_per_m: 600_000,
    };
    const P2: Prices = Prices {
        input_per_m: 300_000,
        cached_input_per_m: 0,
        output_per_m: 1_200_000,
    };

    fn nov() -> Period {
        Period::new(day(1), NaiveDate::from_ymd_opt(2026, 12, 1).unwrap()).unwrap()
    }

    #[test]
    fn report_groups_by_day_and_model_and_rounds_once() {
        let rows = vec![
            row("a", "m1", 2, 1, P1, (1, 0, 0)),
            row("a", "m1", 2, 2, P2, (1, 0, 0)),
            row("a", "m1", 3, 2, P2, (0, 0, 1)),
            row("a", "m2", 2, 3, P1, (1_000_000, 1_000_000, 1_000_000)),
            row("b", "m1", 2, 1, P1, (999, 999, 999)),
            row("a", "m1", 30, 0, Prices::default(), (5, 0, 5)),
        ];
        let r = build_report("a", nov(), &rows).unwrap();
        assert_eq!(r.lines.len(), 4);
        // Day 2, m1: 0.15 + 0.3 micros = 0.45 -> 0 (rounded once, from the exact sum).
        assert_eq!(
            (
                r.lines[0].day,
                r.lines[0].model.as_str(),
                r.lines[0].cost_micros
            ),
            (day(2), "m1", 0)
        );
        assert_eq!(r.lines[0].totals.input_tokens, 2);
        assert_eq!(r.lines[0].totals.segments, 2);
        assert_eq!(
            (r.lines[1].model.as_str(), r.lines[1].cost_micros),
            ("m2", 825_000)
        );
        assert_eq!(
            (r.lines[2].day, r.lines[2].cost_micros),
            (day(3), 1),
            "1.2 micro -> 1"
        );
        assert_eq!((r.lines[3].day, r.lines[3].cost_micros), (day(30), 0));
        // m1 total: 0.15 + 0.3 + 1.2 = 1.65 -> 2; the lines above sum to 1.
        assert_eq!(r.models[0].model, "m1");
        assert_eq!(r.models[0].cost_micros, 2);
        assert_eq!(r.models[1].cost_micros, 825_000);
        assert_eq!(r.cost_micros, 825_002, "825,001.65 rounds to 825,002");
        assert_eq!(r.unpriced_tokens, 10);
        assert_eq!(r.totals.output_tokens, 1_000_006);
    }

    #[test]
    fn report_never_includes_other_tenants_or_days_outside_the_period() {
        let rows = vec![
            row("b", "m1", 2, 1, P1, (7, 7, 7)),
            row("a", "m1", 2, 1, P1, (1, 1, 1)),
            UsageRow {
                day: NaiveDate::from_ymd_opt(2026, 12, 1).unwrap(),
                ..row("a", "m1", 1, 1, P1, (9, 9, 9))
            },
            UsageRow {
                day: NaiveDate::from_ymd_opt(2026, 10, 31).unwrap(),
                ..row("a", "m1", 1, 1, P1, (9, 9, 9))
            },
        ];
        let r = build_report("a", nov(), &rows).unwrap();
        assert_eq!(
            r.totals,
            Totals {
                segments: 1,
                input_tokens: 1,
                cached_input_tokens: 1,
                output_tokens: 1
            }
        );
        let empty = build_report("c", nov(), &rows).unwrap();
        assert!(empty.lines.is_empty() && empty.models.is_empty());
        assert_eq!(empty.cost_micros, 0);
    }

    #[test]
    fn csv_and_json_rendering() {
        let rows = vec![row("a", "m,1", 2, 1, P1, (1_000_000, 0, 0))];
        let r = build_report("a", nov(), &rows).unwrap();
        let csv = render_csv(&r).unwrap();
        let mut lines = csv.lines();
        assert_eq!(lines.next().unwrap(), CSV_HEADER.join(","));
        assert_eq!(
            lines.next().unwrap(),
            "a,2026-11-02,\"m,1\",1,1000000,0,0,150000,0.150000"
        );
        assert!(lines.next().is_none());
        let json: serde_json::Value = serde_json::from_str(&render_json(&r).unwrap()).unwrap();
        assert_eq!(json["tenant"], "a");
        assert_eq!(json["cost_micros"], 150_000);
        assert_eq!(json["lines"][0]["day"], "2026-11-02");
        assert_eq!(json["period"]["from"], "2026-11-01");
    }
}
