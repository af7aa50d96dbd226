//! `tidal sim --pool --tune`: each strategy's cheapest setting reaching the SLO target on the
//! multi-model workload, so that the strategies are compared at the same SLO rather than at
//! their presets. The grid is `--tune`'s ([`Grid`]); attainment is over every request of
//! every model.
//!
//! - **pool**: each setting as the pool's worker sizing (`PoolSpec::workers`, which also
//!   sizes each model's holders);
//! - **per-model**: each setting for every model's fleet, and each fleet its own cheapest
//!   setting reaching the target on its own traffic (an operator's per-`Model` tuning); the
//!   cheaper of the two that reaches the target over all requests;
//! - **always-on**: each model's smallest fixed on-demand fleet reaching the target on its
//!   own traffic ([`fixed_fleet::smallest_meeting_slo`]).
//!
//! The search is in-sample: one split of the trace, one seed.

use super::engine::PolicyRun;
use super::fixed_fleet;
use super::pool_compare::{Merged, PoolSim};
use super::pool_engine::PoolStats;
use super::report::{self, PolicySummary};
use super::scalers::{AlwaysOn, Ours};
use super::tune::{pick, replay_all, settings, threads, Grid, Setting, Tried};
use super::{peak_replicas, run_policy, ServiceProfile};
use crate::pool::PoolSpec;
use serde::Serialize;

/// The pool under its cheapest worker sizing.
pub const POOL_TUNED: &str = "pool-tuned";
/// One fleet per model under the cheapest settings.
pub const PER_MODEL_TUNED: &str = "per-model-tuned";
/// One smallest fixed fleet per model.
pub const ALWAYS_ON_SLO: &str = fixed_fleet::NAME;

/// How the per-model fleets were set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PerModelChoice {
    /// One setting for every model's fleet.
    Uniform,
    /// Each fleet its own setting.
    EachOwn,
}

/// What the search found. A [`Tried`]'s `cost_vs_oracle` is 0: there is no multi-model
/// oracle.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolTuning {
    /// The attainment a setting must reach over all requests.
    pub slo_target: f64,
    /// Settings replayed per strategy.
    pub tried: usize,
    /// The pool's cheapest worker sizing reaching the target, if any.
    pub pool: Option<Tried>,
    /// The pool's cost/attainment frontier, cheapest first.
    pub pool_frontier: Vec<Tried>,
    /// The cheapest one setting for every model's fleet reaching the target, if any.
    pub per_model_uniform: Option<Tried>,
    /// Its frontier, cheapest first.
    pub per_model_frontier: Vec<Tried>,
    /// Per model, its fleet's cheapest setting reaching the target on its own traffic, or,
    /// where none does, the one reaching the most (attainment on its own traffic; `None`
    /// for an empty grid, which leaves the preset).
    pub per_model_each: Vec<Option<Tried>>,
    /// Which of the two the `per-model-tuned` row runs.
    pub per_model_choice: PerModelChoice,
    /// Per model, the replicas of its `always-on-slo` fleet.
    pub always_on_replicas: Vec<u32>,
    /// Per model, whether that fleet reaches the target on its own traffic (no when even
    /// `maxReplicas` misses it).
    pub always_on_reached: Vec<bool>,
    /// The tuned rows: pool-tuned, per-model-tuned, always-on-slo.
    pub rows: Vec<PolicySummary>,
    /// The tuned pool's loads, evictions and overhead.
    pub pool_stats: PoolStats,
}

/// What a run cost, micro-units.
fn cost(run: &PolicyRun, p: &ServiceProfile) -> u64 {
    report::cost_micros(run.spot_ms, p.spot_price_micros_per_hour)
        + report::cost_micros(run.on_demand_ms, p.on_demand_price_micros_per_hour)
}

/// Requests of a run whose first token came within `slo_ms`.
fn met(run: &PolicyRun, slo_ms: u64) -> usize {
    run.ttft_ms
        .iter()
        .filter(|t| t.is_some_and(|t| t <= slo_ms))
        .count()
}

/// `met` of `n` as an attainment (all of nothing is met).
fn share(met: usize, n: usize) -> f64 {
    if n == 0 {
        1.0
    } else {
        met as f64 / n as f64
    }
}

fn tried(setting: Setting, cost_micros: u64, slo_attainment: f64) -> Tried {
    Tried {
        setting,
        cost_micros,
        cost_vs_oracle: 0.0,
        slo_attainment,
    }
}

/// The cheapest reaching the target and the frontier, and which to run: that one, else the
/// one reaching the most (`None` for an empty grid).
fn best_or_most(tried: Vec<Tried>, slo_target: f64) -> (Option<Tried>, Vec<Tried>, Option<Tried>) {
    let (best, frontier) = pick(tried, slo_target);
    let chosen = best.clone().or_else(|| frontier.last().cloned());
    (best, frontier, chosen)
}

/// Whether (cost, attainment) `a` is at least as good as `b`: reaching the target first,
/// then the cheaper; where neither reaches it, the higher attainment.
fn beats(a: (u64, f64), b: (u64, f64), slo_target: f64) -> bool {
    match (a.1 >= slo_target, b.1 >= slo_target) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => a.0 <= b.0,
        (false, false) => a.1 >= b.1,
    }
}

/// Searches `grid` for each strategy's cheapest setting reaching `slo_target` on the
/// workload `w` of `cfg`, and replays what it found as rows.
pub fn search(cfg: &PoolSim, w: &Merged, grid: &Grid, slo_target: f64) -> PoolTuning {
    let all = settings(grid);
    let p = &cfg.fleet.profile;
    let slo_ms = (p.ttft_slo_s * 1000.0) as u64;
    let n = w.reqs.len();

    let pool_spec = |s: &Setting| PoolSpec {
        workers: s.apply(&cfg.pool.spec.workers),
        ..cfg.pool.spec.clone()
    };
    let pool_tried = replay_all(&all, threads(), |s| {
        let spec = pool_spec(&s);
        spec.validate().ok()?;
        let (run, _) = w.pool_run(cfg, &spec);
        Some(tried(s, cost(&run, p), share(met(&run, slo_ms), n)))
    });
    let (pool_best, pool_frontier, pool_chosen) = best_or_most(pool_tried, slo_target);

    // every model's fleet under every setting: (cost, met) per model
    let cells: Vec<(Setting, Vec<(u64, usize)>)> = replay_all(&all, threads(), |s| {
        let spec = s.apply(&cfg.per_model);
        spec.validate().ok()?;
        let per_model = cfg.models.iter().enumerate().map(|(k, m)| {
            let mut ours = Ours::new(PER_MODEL_TUNED, spec.clone(), cfg.tick);
            let run = run_policy(&m.requests, &w.fleet_of(cfg, k), &mut ours);
            (cost(&run, p), met(&run, slo_ms))
        });
        Some((s, per_model.collect()))
    });
    let uniform: Vec<Tried> = cells
        .iter()
        .map(|(s, v)| {
            let met_all = v.iter().map(|c| c.1).sum();
            tried(*s, v.iter().map(|c| c.0).sum(), share(met_all, n))
        })
        .collect();
    let (uniform_best, per_model_frontier, uniform_chosen) = best_or_most(uniform, slo_target);
    let mut each = Vec::new();
    let mut each_met = 0usize;
    for (k, m) in cfg.models.iter().enumerate() {
        let own = m.requests.len();
        let tried_k: Vec<Tried> = cells
            .iter()
            .map(|(s, v)| tried(*s, v[k].0, share(v[k].1, own)))
            .collect();
        let (_, _, chosen) = best_or_most(tried_k, slo_target);
        let met_k = chosen.as_ref().map_or(0.0, |t| t.slo_attainment) * own as f64;
        each_met += met_k.round() as usize;
        each.push(chosen);
    }
    let each_total = (
        each.iter().flatten().map(|t| t.cost_micros).sum::<u64>(),
        share(each_met, n),
    );
    let choice = match &uniform_chosen {
        Some(u) if beats((u.cost_micros, u.slo_attainment), each_total, slo_target) => {
            PerModelChoice::Uniform
        }
        _ => PerModelChoice::EachOwn,
    };
    let spec_of = |k: usize| {
        let chosen = match choice {
            PerModelChoice::Uniform => uniform_chosen.as_ref(),
            PerModelChoice::EachOwn => each.get(k).and_then(Option::as_ref),
        };
        chosen.map_or_else(
            || cfg.per_model.clone(),
            |t| t.setting.apply(&cfg.per_model),
        )
    };

    let pool_chosen = pool_chosen.map_or_else(|| cfg.pool.spec.clone(), |t| pool_spec(&t.setting));
    let (pool_run, pool_stats) = w.pool_run(cfg, &pool_chosen);
    let pool_row = w.row(
        PolicyRun {
            name: POOL_TUNED.into(),
            ..pool_run
        },
        cfg,
    );
    let fleets = w.per_model_runs(PER_MODEL_TUNED, cfg, |k, _| {
        Box::new(Ours::new(PER_MODEL_TUNED, spec_of(k), cfg.tick))
    });
    let fleets_row = w.row(fleets, cfg);

    let max = cfg.per_model.max_replicas;
    let sized: Vec<fixed_fleet::FixedFleet> = cfg
        .models
        .iter()
        .enumerate()
        .map(|(k, m)| {
            let start = (peak_replicas(&m.requests, p), None);
            fixed_fleet::smallest_meeting_slo(&m.requests, &w.fleet_of(cfg, k), 0, start, max)
        })
        .collect();
    let always = w.per_model_runs(ALWAYS_ON_SLO, cfg, |k, _| {
        let n = sized.get(k).map_or(1, |f| f.replicas);
        Box::new(AlwaysOn::named(ALWAYS_ON_SLO, n))
    });
    let always_row = w.row(always, cfg);

    PoolTuning {
        slo_target,
        tried: all.len(),
        pool: pool_best,
        pool_frontier,
        per_model_uniform: uniform_best,
        per_model_frontier,
        per_model_each: each,
        per_model_choice: choice,
        always_on_replicas: sized.iter().map(|f| f.replicas).collect(),
        always_on_reached: sized
            .iter()
            .map(|f| f.summary.slo_attainment >= slo_target)
            .collect(),
        rows: vec![pool_row, fleets_row, always_row],
        pool_stats,
    }
}
