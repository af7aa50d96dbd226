//! Turning raw runs into the comparison: cost, replica-hours, latency percentiles, SLO
//! attainment, and the lower bounds every cost is compared with.
//!
//! - [`oracle`]: perfect foresight, whole replicas at the spot price, every request's TTFT
//!   within the target, and the profile's cold start for every replica it starts, which it
//!   starts early enough that no request waits for one. Every cost is a ratio to it. It
//!   bounds every run whose requests all meet the TTFT and are not evicted after their first
//!   token; [`bound::clairvoyant_bound_ms`] gives the bound for the requests of one run that do.
//! - [`oracle_no_cold_start`]: the same with replicas that start instantly and free
//!   ([`bound::bound_ms`]); no simulated fleet can start that way, so it bounds them loosely.
//! - [`fluid_bound`]: every request's work (prefill at the prefill rate, decode at the fully
//!   batched rate) billed at the spot price, with no cold start, queueing or idle time. No run
//!   of any policy can cost less, whatever its latency.
//!
//! The proofs are in `docs/oracle.md`.

use super::bound::{self, fluid_ms, unloaded_ttft_ms};
use super::engine::{PolicyRun, Sample};
use super::profile::ServiceProfile;
use super::trace::Request;
use serde::Serialize;

/// p50 / p90 / p99 in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Percentiles {
    /// median
    pub p50: f64,
    /// 90th percentile
    pub p90: f64,
    /// 99th percentile
    pub p99: f64,
}

/// Nearest-rank percentiles of `values_ms`, in seconds.
pub fn percentiles(values_ms: &[u64]) -> Percentiles {
    if values_ms.is_empty() {
        return Percentiles::default();
    }
    let mut v = values_ms.to_vec();
    v.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1] as f64 / 1000.0
    };
    Percentiles {
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
    }
}

/// Integer cost of `ms` replica-milliseconds at `micros_per_hour`.
pub fn cost_micros(ms: u64, micros_per_hour: u64) -> u64 {
    let c = u128::from(ms) * u128::from(micros_per_hour) / 3_600_000;
    u64::try_from(c).unwrap_or(u64::MAX)
}

/// One row of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicySummary {
    /// Policy name.
    pub name: String,
    /// Total cost, micro-units.
    pub cost_micros: u64,
    /// Cost of spot replicas, micro-units.
    pub spot_cost_micros: u64,
    /// Cost of on-demand replicas, micro-units.
    pub on_demand_cost_micros: u64,
    /// Cost per million (prompt + generated) tokens served, micro-units.
    pub cost_per_million_tokens_micros: u64,
    /// Cost relative to the oracle.
    pub cost_vs_oracle: f64,
    /// Share of cost on spot, 0..1.
    pub spot_share: f64,
    /// Billed replica-hours, spot.
    pub spot_replica_hours: f64,
    /// Billed replica-hours, on demand.
    pub on_demand_replica_hours: f64,
    /// Queue wait (arrival to first claim).
    pub queue_wait_s: Percentiles,
    /// Time to first token.
    pub ttft_s: Percentiles,
    /// Fraction of requests with TTFT within the target.
    pub slo_attainment: f64,
    /// The same over the requests that arrive one cold start or more after the trace starts:
    /// the steady state, without the start from no replica that every autoscaled fleet makes
    /// (the trace is cut from traffic that was already flowing).
    pub slo_attainment_after_first_cold_start: f64,
    /// Replicas started.
    pub cold_starts: u64,
    /// Spot interruption notices.
    pub interruptions: u64,
    /// Requests completed exactly once.
    pub completed: usize,
    /// Requests never completed (must be zero).
    pub lost: usize,
    /// Requests completed more than once (must be zero).
    pub duplicated: usize,
    /// Tokens prefilled again after evictions.
    pub recomputed_tokens: u64,
    /// Time series (not in JSON output).
    #[serde(skip)]
    pub series: Vec<Sample>,
}

/// Tokens a trace bills: prompt + generated.
pub fn billable_tokens(reqs: &[Request]) -> u64 {
    reqs.iter()
        .map(|r| u64::from(r.prompt_tokens) + u64::from(r.generated_tokens))
        .sum()
}

fn per_million(cost: u64, tokens: u64) -> u64 {
    if tokens == 0 {
        return 0;
    }
    u64::try_from(u128::from(cost) * 1_000_000 / u128::from(tokens)).unwrap_or(u64::MAX)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        if a == 0 {
            1.0
        } else {
            f64::INFINITY
        }
    } else {
        a as f64 / b as f64
    }
}

/// A bound as a report row: `ms` of spot billing, each request at its unloaded latency.
fn bound_row(name: &str, ms: f64, reqs: &[Request], p: &ServiceProfile) -> PolicySummary {
    let ms = ms.floor() as u64;
    let cost = cost_micros(ms, p.spot_price_micros_per_hour);
    let ttft: Vec<u64> = reqs.iter().map(|r| unloaded_ttft_ms(r, p)).collect();
    let slo_ms = (p.ttft_slo_s * 1000.0) as u64;
    PolicySummary {
        name: name.into(),
        cost_micros: cost,
        spot_cost_micros: cost,
        on_demand_cost_micros: 0,
        cost_per_million_tokens_micros: per_million(cost, billable_tokens(reqs)),
        cost_vs_oracle: 1.0,
        spot_share: 1.0,
        spot_replica_hours: ms as f64 / 3_600_000.0,
        on_demand_replica_hours: 0.0,
        queue_wait_s: Percentiles::default(),
        ttft_s: percentiles(&ttft),
        slo_attainment: attainment(reqs, |i| Some(ttft[i]), slo_ms, 0),
        slo_attainment_after_first_cold_start: attainment(
            reqs,
            |i| Some(ttft[i]),
            slo_ms,
            p.cold_start_ms(),
        ),
        cold_starts: 0,
        interruptions: 0,
        completed: reqs.len(),
        lost: 0,
        duplicated: 0,
        recomputed_tokens: 0,
        series: Vec::new(),
    }
}

/// The fluid lower bound row (`fluid-bound`), valid for every run whatever its latency.
pub fn fluid_bound(reqs: &[Request], p: &ServiceProfile) -> PolicySummary {
    bound_row("fluid-bound", fluid_ms(reqs, p), reqs, p)
}

/// The oracle row, the reference of every ratio, from [`bound::oracle_schedule`]: at least
/// what a fleet with perfect foresight pays to meet every request's TTFT when its replicas
/// take the profile's cold start to start, as every other row's do.
pub fn oracle(schedule: &bound::Schedule, reqs: &[Request], p: &ServiceProfile) -> PolicySummary {
    PolicySummary {
        cold_starts: schedule.starts,
        ..bound_row("oracle", schedule.ms, reqs, p)
    }
}

/// The oracle whose replicas start instantly and free (`oracle-no-cold`): [`bound::bound_ms`] with
/// every request anchored: "no cold start" read literally; no fleet that pays cold starts can approach it when requests are sparser than a cold start (see
/// `docs/oracle.md`, "Which oracle the target is measured against").
pub fn oracle_no_cold_start(reqs: &[Request], p: &ServiceProfile) -> PolicySummary {
    let all = vec![true; reqs.len()];
    bound_row("oracle-no-cold", bound::bound_ms(reqs, p, &all), reqs, p)
}

/// Summarises one run against the oracle's cost.
pub fn summarise(
    run: PolicyRun,
    reqs: &[Request],
    p: &ServiceProfile,
    oracle_cost: u64,
) -> PolicySummary {
    let spot = cost_micros(run.spot_ms, p.spot_price_micros_per_hour);
    let od = cost_micros(run.on_demand_ms, p.on_demand_price_micros_per_hour);
    let cost = spot + od;
    let slo_ms = (p.ttft_slo_s * 1000.0) as u64;
    let waits: Vec<u64> = run.queue_wait_ms.iter().flatten().copied().collect();
    let ttft: Vec<u64> = run.ttft_ms.iter().flatten().copied().collect();
    PolicySummary {
        name: run.name,
        cost_micros: cost,
        spot_cost_micros: spot,
        on_demand_cost_micros: od,
        cost_per_million_tokens_micros: per_million(cost, billable_tokens(reqs)),
        cost_vs_oracle: ratio(cost, oracle_cost),
        spot_share: if cost == 0 {
            0.0
        } else {
            spot as f64 / cost as f64
        },
        spot_replica_hours: run.spot_ms as f64 / 3_600_000.0,
        on_demand_replica_hours: run.on_demand_ms as f64 / 3_600_000.0,
        queue_wait_s: percentiles(&waits),
        ttft_s: percentiles(&ttft),
        slo_attainment: attainment(reqs, |i| run.ttft_ms[i], slo_ms, 0),
        slo_attainment_after_first_cold_start: attainment(
            reqs,
            |i| run.ttft_ms[i],
            slo_ms,
            p.cold_start_ms(),
        ),
        cold_starts: run.cold_starts,
        interruptions: run.interruptions,
        completed: run.completions.iter().filter(|c| **c == 1).count(),
        lost: run.completions.iter().filter(|c| **c == 0).count(),
        duplicated: run.completions.iter().filter(|c| **c > 1).count(),
        recomputed_tokens: run.recomputed_tokens,
        series: run.series,
    }
}

/// Fraction of the requests arriving at `from_ms` or later whose TTFT (`ttft_of(index)`,
/// `None` if never served) is within `slo_ms`.
fn attainment(
    reqs: &[Request],
    ttft_of: impl Fn(usize) -> Option<u64>,
    slo_ms: u64,
    from_ms: u64,
) -> f64 {
    let counted: Vec<usize> = (0..reqs.len())
        .filter(|i| reqs[*i].arrival_ms >= from_ms)
        .collect();
    let met = counted
        .iter()
        .filter(|i| ttft_of(**i).is_some_and(|t| t <= slo_ms))
        .count();
    ratio(met as u64, counted.len() as u64)
}

fn money(micros: u64) -> String {
    format!("{}.{:04}", micros / 1_000_000, (micros % 1_000_000) / 100)
}

/// The comparison table, fixed-width.
pub fn table(rows: &[PolicySummary], slo_s: f64) -> String {
    let mut out = format!(
        "{:<16} {:>10} {:>8} {:>10} {:>6} {:>8} {:>8} {:>22} {:>22} {:>8} {:>6} {:>5} {:>10}\n",
        "policy",
        "cost",
        "xoracle",
        "per Mtok",
        "spot%",
        "rep-h",
        "od rep-h",
        "queue wait p50/90/99 s",
        "TTFT p50/90/99 s",
        &format!("SLO<={slo_s}s"),
        "cold",
        "lost",
        "recompute",
    );
    for r in rows {
        let q = r.queue_wait_s;
        let f = r.ttft_s;
        out.push_str(&format!(
            "{:<16} {:>10} {:>8.2} {:>10} {:>6.1} {:>8.2} {:>8.2} {:>22} {:>22} {:>7.2}% {:>6} {:>5} {:>10}\n",
            r.name,
            money(r.cost_micros),
            r.cost_vs_oracle,
            money(r.cost_per_million_tokens_micros),
            r.spot_share * 100.0,
            r.spot_replica_hours + r.on_demand_replica_hours,
            r.on_demand_replica_hours,
            format!("{:.2}/{:.2}/{:.2}", q.p50, q.p90, q.p99),
            format!("{:.2}/{:.2}/{:.2}", f.p50, f.p90, f.p99),
            r.slo_attainment * 100.0,
            r.cold_starts,
            r.lost,
            r.recomputed_tokens,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(
            percentiles(&v),
            Percentiles {
                p50: 50.0,
                p90: 90.0,
                p99: 99.0
            }
        );
        assert_eq!(
            percentiles(&[7000]),
            Percentiles {
                p50: 7.0,
                p90: 7.0,
                p99: 7.0
            }
        );
        assert_eq!(percentiles(&[]), Percentiles::default());
    }

    #[test]
    fn cost_is_integer_micro_units() {
        // one replica-hour at 1.6 units/h
        assert_eq!(cost_micros(3_600_000, 1_600_000), 1_600_000);
        // 100 ms at 4 units/h = 111.1 micro-units, truncated
        assert_eq!(cost_micros(100, 4_000_000), 111);
        assert_eq!(money(1_234_567), "1.2345");
    }
}
