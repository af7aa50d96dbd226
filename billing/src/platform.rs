//! The platform view: what serving each model cost (fleet time, spot vs on-demand), what it
//! earned, and the margin.
//!
//! Fleet cost of a line is `replica_ms * price_per_hour / 3_600_000` micros, rounded once
//! (half-up) per figure from the exact rational sum. Tokens served count prompt tokens
//! (cached included) plus completion tokens.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::ledger::FleetUsage;
use crate::period::Period;
use crate::report::UsageRow;
use crate::usage::CapacityType;

const MS_PER_HOUR: i128 = 3_600_000;

/// `n / d` rounded half-up (ties away from zero); `d > 0`.
fn round_div(n: i128, d: i128) -> Result<i64> {
    let q = if n >= 0 {
        (2 * n + d) / (2 * d)
    } else {
        -((-2 * n + d) / (2 * d))
    };
    i64::try_from(q).map_err(|_| Error::Overflow("platform figure"))
}

/// One model on one capacity type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CapacityLine {
    /// Capacity type.
    pub capacity: CapacityType,
    /// Replica time in milliseconds.
    pub replica_ms: i64,
    /// Fleet cost in micros.
    pub fleet_cost_micros: i64,
    /// Tokens served on this capacity.
    pub tokens_served: i64,
    /// Fleet cost per million tokens served (`None` when nothing was served).
    pub cost_per_million_tokens_micros: Option<i64>,
}

/// One model over the period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelEconomics {
    /// Model id.
    pub model: String,
    /// Spot and on-demand lines (only those with time or tokens).
    pub by_capacity: Vec<CapacityLine>,
    /// Tokens served.
    pub tokens_served: i64,
    /// Revenue in micros (usage priced, rounded once).
    pub revenue_micros: i64,
    /// Fleet cost in micros.
    pub fleet_cost_micros: i64,
    /// Revenue minus fleet cost.
    pub margin_micros: i64,
    /// Fleet cost per million tokens served.
    pub cost_per_million_tokens_micros: Option<i64>,
}

/// The platform report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlatformReport {
    /// The period covered.
    pub period: Period,
    /// Per model, sorted.
    pub models: Vec<ModelEconomics>,
    /// Revenue in micros.
    pub revenue_micros: i64,
    /// Fleet cost in micros.
    pub fleet_cost_micros: i64,
    /// Revenue minus fleet cost.
    pub margin_micros: i64,
}

#[derive(Default)]
struct Cap {
    replica_ms: i64,
    cost_num: i128,
    tokens: i64,
}

#[derive(Default)]
struct ModelAcc {
    caps: BTreeMap<CapacityType, Cap>,
    revenue_picos: i128,
}

fn per_million(cost_num: i128, tokens: i64) -> Result<Option<i64>> {
    if tokens <= 0 {
        return Ok(None);
    }
    round_div(cost_num * 1_000_000, MS_PER_HOUR * i128::from(tokens)).map(Some)
}

/// Builds the platform report from all tenants' usage rows and the fleet usage over `period`.
pub fn build_platform_report(
    period: Period,
    usage: &[UsageRow],
    fleet: &[FleetUsage],
) -> Result<PlatformReport> {
    let mut models: BTreeMap<&str, ModelAcc> = BTreeMap::new();
    for row in usage.iter().filter(|r| period.contains(r.day)) {
        let m = models.entry(row.model.as_str()).or_default();
        m.revenue_picos += row.totals.cost_picos(&row.prices);
        let cap = m.caps.entry(row.capacity).or_default();
        cap.tokens = cap.tokens.saturating_add(row.totals.tokens_served());
    }
    for f in fleet.iter().filter(|f| period.contains(f.day)) {
        let cap = models
            .entry(f.model.as_str())
            .or_default()
            .caps
            .entry(f.capacity)
            .or_default();
        cap.replica_ms = cap.replica_ms.saturating_add(f.replica_ms);
        cap.cost_num += i128::from(f.replica_ms) * i128::from(f.price_per_hour_micros);
    }
    let mut out = Vec::with_capacity(models.len());
    let (mut revenue_picos, mut cost_num) = (0i128, 0i128);
    for (model, acc) in models {
        let mut by_capacity = Vec::new();
        let (mut m_cost, mut m_tokens) = (0i128, 0i64);
        for (capacity, c) in acc.caps {
            by_capacity.push(CapacityLine {
                capacity,
                replica_ms: c.replica_ms,
                fleet_cost_micros: round_div(c.cost_num, MS_PER_HOUR)?,
                tokens_served: c.tokens,
                cost_per_million_tokens_micros: per_million(c.cost_num, c.tokens)?,
            });
            m_cost += c.cost_num;
            m_tokens = m_tokens.saturating_add(c.tokens);
        }
        let revenue_micros = crate::money::round_picos(acc.revenue_picos)?;
        let fleet_cost_micros = round_div(m_cost, MS_PER_HOUR)?;
        out.push(ModelEconomics {
            model: model.into(),
            by_capacity,
            tokens_served: m_tokens,
            revenue_micros,
            fleet_cost_micros,
            margin_micros: revenue_micros - fleet_cost_micros,
            cost_per_million_tokens_micros: per_million(m_cost, m_tokens)?,
        });
        revenue_picos += acc.revenue_picos;
        cost_num += m_cost;
    }
    let revenue_micros = crate::money::round_picos(revenue_picos)?;
    let fleet_cost_micros = round_div(cost_num, MS_PER_HOUR)?;
    Ok(PlatformReport {
        period,
        models: out,
        revenue_micros,
        fleet_cost_micros,
        margin_micros: revenue_micros - fleet_cost_micros,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::price::Prices;
    use crate::report::tests::{day, row};
    use chrono::NaiveDate;

    fn nov() -> Period {
        Period::new(day(1), NaiveDate::from_ymd_opt(2026, 12, 1).unwrap()).unwrap()
    }

    fn fleet(model: &str, capacity: CapacityType, d: u32, hours: i64, per_hour: i64) -> FleetUsage {
        FleetUsage {
            model: model.into(),
            capacity,
            day: day(d),
            price_per_hour_micros: per_hour,
            replica_ms: hours * 3_600_000,
        }
    }

    #[test]
    fn round_div_is_half_up() {
        assert_eq!(round_div(1, 2).unwrap(), 1);
        assert_eq!(round_div(1, 3).unwrap(), 0);
        assert_eq!(round_div(2, 3).unwrap(), 1);
        assert_eq!(round_div(-1, 2).unwrap(), -1);
        assert_eq!(round_div(5, 1).unwrap(), 5);
    }

    #[test]
    fn cost_per_million_spot_vs_on_demand_and_margin() {
        let p = Prices {
            input_per_m: 1_000_000,
            cached_input_per_m: 0,
            output_per_m: 2_000_000,
        };
        let mut on_demand = row("b", "m", 2, 1, p, (0, 0, 1_000_000));
        on_demand.capacity = CapacityType::OnDemand;
        let usage = vec![
            row("a", "m", 2, 1, p, (2_000_000, 0, 1_000_000)),
            on_demand,
            row("a", "other", 2, 1, p, (1, 0, 0)),
            UsageRow {
                day: NaiveDate::from_ymd_opt(2026, 12, 1).unwrap(),
                ..row("a", "m", 2, 1, p, (9, 9, 9))
            },
        ];
        let fleet = vec![
            fleet("m", CapacityType::Spot, 2, 2, 1_000_000), // 2 h at $1/h
            fleet("m", CapacityType::OnDemand, 2, 1, 3_000_000), // 1 h at $3/h
            fleet("idle", CapacityType::Spot, 3, 1, 500_000),
            fleet("m", CapacityType::Spot, 30, 0, 1_000_000),
        ];
        let r = build_platform_report(nov(), &usage, &fleet).unwrap();
        let names: Vec<_> = r.models.iter().map(|m| m.model.as_str()).collect();
        assert_eq!(names, ["idle", "m", "other"]);
        let m = &r.models[1];
        assert_eq!(m.tokens_served, 4_000_000);
        assert_eq!(m.revenue_micros, 2_000_000 + 2_000_000 + 2_000_000);
        assert_eq!(m.fleet_cost_micros, 5_000_000);
        assert_eq!(m.margin_micros, 1_000_000);
        assert_eq!(m.cost_per_million_tokens_micros, Some(1_250_000));
        let spot = &m.by_capacity[0];
        assert_eq!(
            (spot.capacity, spot.tokens_served, spot.fleet_cost_micros),
            (CapacityType::Spot, 3_000_000, 2_000_000)
        );
        assert_eq!(
            spot.cost_per_million_tokens_micros,
            Some(666_667),
            "2/3 rounds half-up"
        );
        let od = &m.by_capacity[1];
        assert_eq!(od.cost_per_million_tokens_micros, Some(3_000_000));
        let idle = &r.models[0];
        assert_eq!(
            (
                idle.revenue_micros,
                idle.fleet_cost_micros,
                idle.margin_micros
            ),
            (0, 500_000, -500_000)
        );
        assert_eq!(idle.cost_per_million_tokens_micros, None);
        assert_eq!(r.revenue_micros, 6_000_001);
        assert_eq!(r.fleet_cost_micros, 5_500_000);
        assert_eq!(r.margin_micros, 500_001);
    }

    #[test]
    fn sub_micro_fleet_time_rounds_once() {
        // 1 ms at $1/h = 0.2778 micro each; 1,800 such intervals = 500 micros exactly.
        let fleet: Vec<_> = (0..1800)
            .map(|_| FleetUsage {
                model: "m".into(),
                capacity: CapacityType::Spot,
                day: day(1),
                price_per_hour_micros: 1_000_000,
                replica_ms: 1,
            })
            .collect();
        let r = build_platform_report(nov(), &[], &fleet).unwrap();
        assert_eq!(r.fleet_cost_micros, 500);
    }
}
