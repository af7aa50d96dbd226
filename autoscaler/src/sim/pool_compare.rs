//! `tidal sim --pool`: one multi-model workload ([`super::multi_model`]) served three ways at
//! the same TTFT target: a warm pool of workers shared by the models ([`run_pool`]), one
//! fleet per model under our policy's cold-start preset (`ours-coldstart`, the production
//! `decide`), and one always-on fleet per model sized on its busiest minute (at least one
//! replica). With a grid ([`super::pool_tune`]) it also finds each strategy's cheapest
//! setting reaching the SLO target. Every row uses the same service profile, prices and cost
//! model ([`report::summarise`]), and with a warm-up every strategy is warmed alike.

use super::engine::{run_policy, FleetConfig, PolicyRun, WarmUp};
use super::multi_model::ModelTrace;
use super::pool_engine::{run_pool, PoolConfig, PoolStats};
use super::pool_tune::{self, PoolTuning};
use super::report::{self, PolicySummary};
use super::scalers::{AlwaysOn, Ours, Scaler};
use super::trace::{self, Request};
use super::tune::Grid;
use super::{peak_replicas, SLO_TARGET};
use crate::pool::PoolSpec;
use crate::spec::ScalingSpec;
use serde::Serialize;

/// Row names.
pub const POOL: &str = "pool";
/// One fleet per model, autoscaled.
pub const PER_MODEL: &str = "per-model";
/// One always-on fleet per model, sized on its busiest minute.
pub const ALWAYS_ON: &str = "always-on";

/// The comparison's input.
#[derive(Debug, Clone)]
pub struct PoolSim {
    /// The models' traces.
    pub models: Vec<ModelTrace>,
    /// How the workload was made.
    pub label: String,
    /// The fleet every strategy runs on (its cold start is the pod's; no warm-up here:
    /// [`PoolSim::warm_up`] warms each strategy).
    pub fleet: FleetConfig,
    /// Each model's fleet's spec in the per-model strategy.
    pub per_model: ScalingSpec,
    /// The pool.
    pub pool: PoolConfig,
    /// Decision interval of the per-model fleets.
    pub tick: std::time::Duration,
    /// Play the workload once, unmeasured, before the measured run: the pool on every
    /// model's requests, each per-model fleet on its own, so that no strategy's first cold
    /// start from empty counts.
    pub warm_up: bool,
    /// Where the pod cold start comes from (a flag, a profile file, a built-in profile).
    pub cold_start_source: String,
    /// Where the swap times come from.
    pub swap_source: String,
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
    /// Where it comes from.
    pub cold_start_source: String,
    /// Swap-in of a model the node has cached, seconds.
    pub swap_s: f64,
    /// Swap-in of a model the node has not cached, seconds.
    pub swap_uncached_s: f64,
    /// Where the swap times come from.
    pub swap_source: String,
    /// Whether every strategy was warmed by one unmeasured pass.
    pub warm_up: bool,
    /// The pool's spec, swap times and models.
    pub pool: PoolConfig,
    /// The rows: pool, per-model, always-on (the presets), then, with a grid, pool-tuned,
    /// per-model-tuned and always-on-slo.
    pub rows: Vec<PolicySummary>,
    /// The preset pool's loads, evictions and overhead.
    pub pool_stats: PoolStats,
    /// The search for each strategy's cheapest setting at the SLO target, where asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tuning: Option<PoolTuning>,
    /// The rows the verdict compares: the cheapest pool row and the cheapest per-model row
    /// reaching the SLO target (the presets where none does).
    pub compared: (String, String),
    /// Per-model cost over the pool's, of the compared rows.
    pub per_model_over_pool: f64,
    /// Per-model replica-hours over the pool's, of the compared rows.
    pub per_model_over_pool_replica_hours: f64,
    /// The pool is at least 2x cheaper than per-model fleets, both at >= 99 % SLO.
    pub target_met: bool,
}

/// The workload as one trace: all requests in arrival order (ties by model), each one's
/// model, and its index in that model's trace.
#[derive(Debug, Clone)]
pub struct Merged {
    /// Every request, sorted by arrival.
    pub reqs: Vec<Request>,
    /// Request `i` is for model `model_of[i]`.
    pub model_of: Vec<usize>,
    /// Request `i` is request `origin[i].1` of model `origin[i].0`.
    pub origin: Vec<(usize, usize)>,
    /// Where the measured run starts after a warm-up pass, ms (`None`: no warm-up).
    pub warm_up_ms: Option<u64>,
}

impl Merged {
    /// The workload of `cfg`.
    pub fn of(cfg: &PoolSim) -> Self {
        let mut all: Vec<(Request, usize, usize)> = cfg
            .models
            .iter()
            .enumerate()
            .flat_map(|(m, t)| t.requests.iter().enumerate().map(move |(i, r)| (*r, m, i)))
            .collect();
        all.sort_by_key(|(r, m, i)| (r.arrival_ms, *m, *i));
        let reqs: Vec<Request> = all.iter().map(|x| x.0).collect();
        // one period of the whole workload, as `--warm-up` places it: every strategy measures
        // from the same instant
        let warm_up_ms = cfg
            .warm_up
            .then(|| trace::period_ms(&reqs).div_ceil(1000) * 1000);
        Self {
            model_of: all.iter().map(|x| x.1).collect(),
            origin: all.iter().map(|x| (x.1, x.2)).collect(),
            reqs,
            warm_up_ms,
        }
    }

    /// The fleet model `k`'s own fleet runs on: warmed by its own requests where asked.
    pub fn fleet_of(&self, cfg: &PoolSim, k: usize) -> FleetConfig {
        let warm_up = match (self.warm_up_ms, cfg.models.get(k)) {
            (Some(length_ms), Some(m)) => WarmUp {
                requests: m.requests.clone(),
                length_ms,
            },
            _ => WarmUp::default(),
        };
        FleetConfig {
            warm_up,
            ..cfg.fleet.clone()
        }
    }

    /// The pool under `spec` (the pool's other settings as in `cfg`).
    pub fn pool_run(&self, cfg: &PoolSim, spec: &PoolSpec) -> (PolicyRun, PoolStats) {
        let pool = PoolConfig {
            spec: spec.clone(),
            ..cfg.pool.clone()
        };
        run_pool(
            &self.reqs,
            &self.model_of,
            &cfg.fleet,
            &pool,
            self.warm_up_ms,
        )
    }

    /// One fleet per model, model `k` under `scaler_for(k, its requests)`, folded into one
    /// run over the merged requests.
    pub fn per_model_runs(
        &self,
        name: &str,
        cfg: &PoolSim,
        mut scaler_for: impl FnMut(usize, &[Request]) -> Box<dyn Scaler>,
    ) -> PolicyRun {
        let runs: Vec<PolicyRun> = cfg
            .models
            .iter()
            .enumerate()
            .map(|(k, m)| {
                let fleet = self.fleet_of(cfg, k);
                run_policy(&m.requests, &fleet, scaler_for(k, &m.requests).as_mut())
            })
            .collect();
        let n = self.origin.len();
        let mut out = PolicyRun {
            spot_ms: runs.iter().map(|r| r.spot_ms).sum(),
            on_demand_ms: runs.iter().map(|r| r.on_demand_ms).sum(),
            cold_starts: runs.iter().map(|r| r.cold_starts).sum(),
            interruptions: runs.iter().map(|r| r.interruptions).sum(),
            recomputed_tokens: runs.iter().map(|r| r.recomputed_tokens).sum(),
            end_ms: runs.iter().map(|r| r.end_ms).max().unwrap_or(0),
            ..PolicyRun::empty(name, n)
        };
        for (k, (m, i)) in self.origin.iter().enumerate() {
            let r = &runs[*m];
            out.queue_wait_ms[k] = r.queue_wait_ms[*i];
            out.ttft_ms[k] = r.ttft_ms[*i];
            out.evicted_after_first_token[k] = r.evicted_after_first_token[*i];
            out.completions[k] = r.completions[*i];
        }
        out
    }

    /// A run over the merged requests as a report row.
    pub fn row(&self, run: PolicyRun, cfg: &PoolSim) -> PolicySummary {
        PolicySummary {
            // there is no multi-model oracle: the ratio is left out (zero)
            cost_vs_oracle: 0.0,
            ..report::summarise(run, &self.reqs, &cfg.fleet.profile, 0)
        }
    }
}

/// Runs the three strategies under their presets and, with `grid`, searches each one's
/// cheapest setting reaching [`SLO_TARGET`] ([`pool_tune::search`]).
pub fn simulate_pool(cfg: &PoolSim, grid: Option<&Grid>) -> PoolReport {
    let w = Merged::of(cfg);
    let p = &cfg.fleet.profile;
    let (pool_run, pool_stats) = w.pool_run(cfg, &cfg.pool.spec);
    let per_model = w.per_model_runs(PER_MODEL, cfg, |_, _| {
        Box::new(Ours::new(PER_MODEL, cfg.per_model.clone(), cfg.tick))
    });
    let always = w.per_model_runs(ALWAYS_ON, cfg, |_, r| {
        Box::new(AlwaysOn::named(ALWAYS_ON, peak_replicas(r, p)))
    });
    let mut rows: Vec<PolicySummary> = [pool_run, per_model, always]
        .into_iter()
        .map(|run| w.row(run, cfg))
        .collect();
    let tuning = grid.map(|g| pool_tune::search(cfg, &w, g, SLO_TARGET));
    if let Some(t) = &tuning {
        rows.extend(t.rows.iter().cloned());
    }
    // the cheapest row of each strategy at the target, the preset where none reaches it
    let cheapest_at_target = |names: &[&str]| {
        rows.iter()
            .filter(|r| names.contains(&r.name.as_str()) && r.slo_attainment >= SLO_TARGET)
            .min_by_key(|r| r.cost_micros)
            .or_else(|| rows.iter().find(|r| r.name == names[0]))
    };
    let pool_row = cheapest_at_target(&[POOL, pool_tune::POOL_TUNED]);
    let fleet_row = cheapest_at_target(&[PER_MODEL, pool_tune::PER_MODEL_TUNED]);
    let hours = |r: &PolicySummary| r.spot_replica_hours + r.on_demand_replica_hours;
    let (compared, over, over_hours, met) = match (pool_row, fleet_row) {
        (Some(a), Some(b)) => {
            let over = b.cost_micros as f64 / a.cost_micros.max(1) as f64;
            (
                (a.name.clone(), b.name.clone()),
                over,
                hours(b) / hours(a).max(f64::MIN_POSITIVE),
                over >= 2.0 && a.slo_attainment >= SLO_TARGET && b.slo_attainment >= SLO_TARGET,
            )
        }
        _ => ((POOL.into(), PER_MODEL.into()), 0.0, 0.0, false),
    };
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
        cold_start_source: cfg.cold_start_source.clone(),
        swap_s: cfg.pool.swap_ms as f64 / 1000.0,
        swap_uncached_s: cfg.pool.swap_uncached_ms as f64 / 1000.0,
        swap_source: cfg.swap_source.clone(),
        warm_up: cfg.warm_up,
        pool: cfg.pool.clone(),
        rows,
        pool_stats,
        tuning,
        compared,
        per_model_over_pool: over,
        per_model_over_pool_replica_hours: over_hours,
        target_met: met,
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
