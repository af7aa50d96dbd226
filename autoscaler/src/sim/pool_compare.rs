//! `tidal sim --pool`: one multi-model workload ([`super::multi_model`]) served three ways at
//! the same TTFT target: a warm pool of workers shared by the models ([`run_pool`]), one
//! fleet per model under our policy's cold-start preset (`ours-coldstart`, the production
//! `decide`), and one always-on fleet per model sized on its busiest minute (at least one
//! replica). Every row uses the same service profile, prices and cost model
//! ([`report::summarise`]).

use super::engine::{run_policy, FleetConfig, PolicyRun};
use super::multi_model::ModelTrace;
use super::pool_engine::{run_pool, PoolConfig, PoolStats};
use super::report::{self, PolicySummary};
use super::scalers::AlwaysOn;
use super::scalers::Ours;
use super::trace::Request;
use super::{peak_replicas, SLO_TARGET};
use crate::spec::ScalingSpec;
use serde::Serialize;

/// Row names.
pub const POOL: &str = "pool";
/// One fleet per model, autoscaled.
pub const PER_MODEL: &str = "per-model";
/// One always-on fleet per model.
pub const ALWAYS_ON: &str = "always-on";

/// The comparison's input.
#[derive(Debug, Clone)]
pub struct PoolSim {
    /// The models' traces.
    pub models: Vec<ModelTrace>,
    /// How the workload was made.
    pub label: String,
    /// The fleet every strategy runs on (its cold start is the pod's).
    pub fleet: FleetConfig,
    /// Each model's fleet's spec in the per-model strategy.
    pub per_model: ScalingSpec,
    /// The pool.
    pub pool: PoolConfig,
    /// Decision interval of the per-model fleets.
    pub tick: std::time::Duration,
}

/// One model of the workload, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct ModelRow {
    /// Its name.
    pub name: String,
    /// Its share of the traffic.
    pub share: f64,
    /// Its requests.
    pub requests: usize,
}

/// The comparison.
#[derive(Debug, Clone, Serialize)]
pub struct PoolReport {
    /// How the workload was made.
    pub workload: String,
    /// The models.
    pub models: Vec<ModelRow>,
    /// Pod cold start (per-model fleets and new pool workers), seconds.
    pub cold_start_s: f64,
    /// Swap-in of a model the node has cached, seconds.
    pub swap_s: f64,
    /// Swap-in of a model the node has not cached, seconds.
    pub swap_uncached_s: f64,
    /// The pool's spec, swap times and models.
    pub pool: PoolConfig,
    /// The rows: pool, per-model, always-on.
    pub rows: Vec<PolicySummary>,
    /// The pool's loads, evictions and overhead.
    pub pool_stats: PoolStats,
    /// Per-model cost over the pool's.
    pub per_model_over_pool: f64,
    /// Per-model replica-hours over the pool's.
    pub per_model_over_pool_replica_hours: f64,
    /// The pool is at least 2x cheaper than per-model fleets, both at >= 99 % SLO.
    pub target_met: bool,
}

/// All requests in arrival order (ties by model), with each one's model and its index in
/// that model's trace.
fn merged(models: &[ModelTrace]) -> (Vec<Request>, Vec<usize>, Vec<(usize, usize)>) {
    let mut all: Vec<(Request, usize, usize)> = models
        .iter()
        .enumerate()
        .flat_map(|(m, t)| t.requests.iter().enumerate().map(move |(i, r)| (*r, m, i)))
        .collect();
    all.sort_by_key(|(r, m, i)| (r.arrival_ms, *m, *i));
    let reqs = all.iter().map(|x| x.0).collect();
    let model_of = all.iter().map(|x| x.1).collect();
    let origin = all.iter().map(|x| (x.1, x.2)).collect();
    (reqs, model_of, origin)
}

/// One run per model, folded into one run over the merged requests.
fn per_model_runs(
    name: &str,
    cfg: &PoolSim,
    origin: &[(usize, usize)],
    mut scaler_for: impl FnMut(&[Request]) -> Box<dyn super::scalers::Scaler>,
) -> PolicyRun {
    let runs: Vec<PolicyRun> = cfg
        .models
        .iter()
        .map(|m| run_policy(&m.requests, &cfg.fleet, scaler_for(&m.requests).as_mut()))
        .collect();
    let n = origin.len();
    let mut out = PolicyRun {
        name: name.into(),
        spot_ms: runs.iter().map(|r| r.spot_ms).sum(),
        on_demand_ms: runs.iter().map(|r| r.on_demand_ms).sum(),
        cold_starts: runs.iter().map(|r| r.cold_starts).sum(),
        interruptions: runs.iter().map(|r| r.interruptions).sum(),
        recomputed_tokens: runs.iter().map(|r| r.recomputed_tokens).sum(),
        queue_wait_ms: vec![None; n],
        ttft_ms: vec![None; n],
        evicted_after_first_token: vec![false; n],
        completions: vec![0; n],
        series: Vec::new(),
        end_ms: runs.iter().map(|r| r.end_ms).max().unwrap_or(0),
    };
    for (k, (m, i)) in origin.iter().enumerate() {
        let r = &runs[*m];
        out.queue_wait_ms[k] = r.queue_wait_ms[*i];
        out.ttft_ms[k] = r.ttft_ms[*i];
        out.evicted_after_first_token[k] = r.evicted_after_first_token[*i];
        out.completions[k] = r.completions[*i];
    }
    out
}

/// Runs the three strategies.
pub fn simulate_pool(cfg: &PoolSim) -> PoolReport {
    let (reqs, model_of, origin) = merged(&cfg.models);
    let p = &cfg.fleet.profile;
    let (pool_run, pool_stats) = run_pool(&reqs, &model_of, &cfg.fleet, &cfg.pool);
    let per_model = per_model_runs(PER_MODEL, cfg, &origin, |_| {
        Box::new(Ours::new(PER_MODEL, cfg.per_model.clone(), cfg.tick))
    });
    let always = per_model_runs(ALWAYS_ON, cfg, &origin, |r| {
        Box::new(AlwaysOn::named(ALWAYS_ON, peak_replicas(r, p)))
    });
    let rows: Vec<PolicySummary> = [pool_run, per_model, always]
        .into_iter()
        .map(|run| PolicySummary {
            // there is no multi-model oracle: the ratio is left out (zero)
            cost_vs_oracle: 0.0,
            ..report::summarise(run, &reqs, p, 0)
        })
        .collect();
    let hours = |r: &PolicySummary| r.spot_replica_hours + r.on_demand_replica_hours;
    let per_model_over_pool = rows[1].cost_micros as f64 / rows[0].cost_micros.max(1) as f64;
    let per_model_over_pool_replica_hours =
        hours(&rows[1]) / hours(&rows[0]).max(f64::MIN_POSITIVE);
    PoolReport {
        workload: cfg.label.clone(),
        models: cfg
            .models
            .iter()
            .map(|m| ModelRow {
                name: m.name.clone(),
                share: m.share,
                requests: m.requests.len(),
            })
            .collect(),
        cold_start_s: p.cold_start_s,
        swap_s: cfg.pool.swap_ms as f64 / 1000.0,
        swap_uncached_s: cfg.pool.swap_uncached_ms as f64 / 1000.0,
        pool: cfg.pool.clone(),
        target_met: per_model_over_pool >= 2.0
            && rows[0].slo_attainment >= SLO_TARGET
            && rows[1].slo_attainment >= SLO_TARGET,
        rows,
        pool_stats,
        per_model_over_pool,
        per_model_over_pool_replica_hours,
    }
}

fn money(micros: u64) -> String {
    format!("{}.{:04}", micros / 1_000_000, (micros % 1_000_000) / 100)
}

/// The report as text.
pub fn render(r: &PoolReport, slo_s: f64) -> String {
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let mut out = format!(
        "workload: {}\nmodels: {}\npod cold start {:.1} s; swap-in {:.2} s cached, {:.2} s uncached; worker memory {:.0} GiB, model memory {:.0}-{:.0} GiB; unload after {:.0} s idle\n\n",
        r.workload,
        r.models
            .iter()
            .map(|m| format!("{} {:.1}% ({} req)", m.name, m.share * 100.0, m.requests))
            .collect::<Vec<_>>()
            .join(", "),
        r.cold_start_s,
        r.swap_s,
        r.swap_uncached_s,
        gib(r.pool.spec.worker_memory_bytes),
        gib(r.pool.memory_bytes.iter().copied().min().unwrap_or(0)),
        gib(r.pool.memory_bytes.iter().copied().max().unwrap_or(0)),
        r.pool.spec.idle_unload_after.as_secs_f64(),
    );
    out.push_str(&format!(
        "{:<10} {:>10} {:>10} {:>8} {:>8} {:>22} {:>9} {:>6} {:>5}\n",
        "strategy",
        "cost",
        "per Mtok",
        "rep-h",
        "od rep-h",
        "TTFT p50/90/99 s",
        format!("SLO<={slo_s}s"),
        "starts",
        "lost"
    ));
    for row in &r.rows {
        let f = row.ttft_s;
        out.push_str(&format!(
            "{:<10} {:>10} {:>10} {:>8.2} {:>8.2} {:>22} {:>8.2}% {:>6} {:>5}\n",
            row.name,
            money(row.cost_micros),
            money(row.cost_per_million_tokens_micros),
            row.spot_replica_hours + row.on_demand_replica_hours,
            row.on_demand_replica_hours,
            format!("{:.2}/{:.2}/{:.2}", f.p50, f.p90, f.p99),
            row.slo_attainment * 100.0,
            row.cold_starts,
            row.lost,
        ));
    }
    let s = &r.pool_stats;
    out.push_str(&format!(
        "\npool: {} loads ({} from the node cache), {} evictions, {} idle unloads, {:.2} worker-hours with nothing loaded (pool overhead)\n",
        s.loads, s.cached_loads, s.evictions, s.idle_unloads, s.overhead_ms as f64 / 3_600_000.0
    ));
    out.push_str(&format!(
        "target (pool >= 2x cheaper than per-model, both >= {}% SLO): {} — per-model costs {:.2}x the pool ({:.2}x its replica-hours)\n",
        SLO_TARGET * 100.0,
        if r.target_met { "MET" } else { "NOT MET" },
        r.per_model_over_pool,
        r.per_model_over_pool_replica_hours,
    ));
    out
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
