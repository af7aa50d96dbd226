//! Trace-replay simulator (`tidal sim`): replays a request trace through the real autoscaling
//! policy on a simulated fleet, side by side with the baselines people use today (Knative KPA,
//! KEDA + HPA, always-on at the peak, the smallest fixed fleet meeting the SLO;
//! `fixed_fleet`), three lower bounds (the oracle, the oracle without
//! cold starts and the fluid bound; `bound`) and a fleet that knows every arrival
//! (`foresight`), which bounds the best fleet's cost from above.

pub mod bound;
pub mod cli;
pub mod engine;
pub mod fixed_fleet;
pub mod fleet;
pub mod foresight;
pub mod multi_model;
pub mod pool_compare;
pub mod pool_engine;
pub mod pool_render;
pub mod pool_tune;
pub mod profile;
pub mod report;
pub mod scalers;
pub mod svg;
pub mod trace;
pub mod tune;

pub use cli::{run, Outcome, SimArgs};
pub use engine::{run_policy, FleetConfig, PolicyRun, Sample, WarmUp};
pub use profile::ServiceProfile;
pub use report::PolicySummary;
pub use trace::Request;

use crate::spec::ScalingSpec;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use scalers::{AlwaysOn, Keda, Ours, Scaler};
use serde::Serialize;
use std::time::Duration;

/// One simulation: the trace, the fleet and our policy's spec.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Requests sorted by arrival.
    pub requests: Vec<Request>,
    /// How the trace was made (for the report).
    pub trace_label: String,
    /// The simulated fleet.
    pub fleet: FleetConfig,
    /// Our policy under one or more specs (names start with "ours"); the first one's
    /// `maxReplicas` bounds the baselines too.
    pub ours: Vec<(String, ScalingSpec)>,
    /// Decision interval of our policy and the KPA baseline.
    pub tick: Duration,
    /// Wall-clock time of the trace's start (Unix seconds): our policy's `floorSchedule`
    /// reads it.
    pub wall_clock_start_s: u64,
}

impl SimConfig {
    /// Our policy under `spec`, deciding every tick, its floor schedule on the replay's wall
    /// clock (which starts with the warm-up, before the trace's own start).
    pub fn our_policy(&self, name: &str, spec: ScalingSpec) -> Ours {
        let replay_start_s = self
            .wall_clock_start_s
            .saturating_sub(self.fleet.warm_up.length_ms.div_ceil(1000));
        Ours::new(name, spec, self.tick).starting_at(replay_start_s)
    }
}

/// The comparison for one trace.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// How the trace was made.
    pub trace: String,
    /// Requests in the trace.
    pub requests: usize,
    /// Last arrival, seconds.
    pub trace_duration_s: f64,
    /// Prompt + generated tokens in the trace.
    pub billable_tokens: u64,
    /// The fleet configuration.
    pub fleet: FleetConfig,
    /// Our policy's specs.
    pub ours: Vec<(String, ScalingSpec)>,
    /// Replicas of the always-on baseline.
    pub always_on_replicas: u32,
    /// Replicas of the `always-on-slo` baseline: the smallest fixed fleet meeting the SLO.
    pub always_on_slo_replicas: u32,
    /// The oracle: lower bound for fleets that pay cold starts and meet every request's TTFT
    /// (see `report`); every `cost_vs_oracle` is relative to it.
    pub oracle: PolicySummary,
    /// A simulated fleet that knows every arrival and follows the oracle's schedule: what
    /// perfect foresight achieves on this fleet model (an upper bound on the best fleet's
    /// cost when it meets every TTFT). Not a baseline.
    pub foresight: PolicySummary,
    /// The oracle with replicas that start instantly and free.
    pub oracle_no_cold_start: PolicySummary,
    /// The fluid lower bound, valid for every run (looser than the oracle).
    pub fluid_bound: PolicySummary,
    /// Every simulated policy, ours first.
    pub policies: Vec<PolicySummary>,
    /// Per variant of ours: whether it meets the target, and why not if it does not.
    pub targets: Vec<TargetCheck>,
    /// The cheapest time constants of ours reaching the target on this trace, where asked
    /// for (`tidal sim --tune`; [`tune::tune`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tuning: Option<tune::Tuning>,
}

/// The SLO attainment of the target, also what `always-on-slo` is sized for.
pub const SLO_TARGET: f64 = 0.99;

/// The target: ours at most 1.3x the oracle's cost with at least 99 % SLO attainment,
/// and cheaper than every baseline that reaches the same SLO.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TargetCheck {
    /// Which variant of ours.
    pub policy: String,
    /// Ours' cost relative to the oracle.
    pub cost_vs_oracle: f64,
    /// Ours' cost relative to the oracle without cold starts (not part of the verdict).
    pub cost_vs_oracle_no_cold_start: f64,
    /// Ours' cost relative to `foresight`, the fleet that knows every arrival (not part of
    /// the verdict).
    pub cost_vs_foresight: f64,
    /// Ours' SLO attainment.
    pub slo_attainment: f64,
    /// Ours' SLO attainment over the requests after the first cold start (not part of the
    /// verdict).
    pub slo_attainment_after_first_cold_start: f64,
    /// Baselines reaching 99 % SLO that are not more expensive than ours.
    pub not_beaten: Vec<String>,
    /// All three conditions hold.
    pub met: bool,
}

/// Spot-unavailable periods: Poisson starts at `per_hour`, exponential lengths of mean
/// `mean_s`, over `[0, horizon_ms)`.
pub fn spot_outages(per_hour: f64, mean_s: f64, horizon_ms: u64, seed: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    if per_hour <= 0.0 || mean_s <= 0.0 {
        return out;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5EED_0075_7A6E);
    let mut t = 0.0;
    let exp = |rng: &mut ChaCha8Rng, mean: f64| -(1.0 - rng.random::<f64>()).ln() * mean;
    loop {
        t += exp(&mut rng, 3_600_000.0 / per_hour);
        if t >= horizon_ms as f64 {
            break;
        }
        let len = exp(&mut rng, mean_s * 1000.0);
        out.push((t as u64, (t + len) as u64));
        t += len;
    }
    out
}

/// Replicas a fixed fleet needs for the busiest minute: its fluid work over 60 s, rounded up.
pub fn peak_replicas(reqs: &[Request], p: &ServiceProfile) -> u32 {
    let mut per_minute: std::collections::BTreeMap<u64, f64> = Default::default();
    for r in reqs {
        *per_minute.entry(r.arrival_ms / 60_000).or_default() += bound::work_ms(r, p);
    }
    let busiest = per_minute.values().fold(0.0_f64, |a, b| a.max(*b));
    ((busiest / 60_000.0).ceil() as u32).max(1)
}

/// Runs every policy on the trace and compares them with the oracle.
pub fn simulate(cfg: &SimConfig) -> SimReport {
    let p = &cfg.fleet.profile;
    let reqs = &cfg.requests;
    let always = peak_replicas(reqs, p);
    let max = cfg
        .ours
        .first()
        .map_or(ScalingSpec::default().max_replicas, |(_, s)| s.max_replicas);
    let mut scalers: Vec<Box<dyn Scaler>> = Vec::new();
    for (name, spec) in &cfg.ours {
        scalers.push(Box::new(cfg.our_policy(name, spec.clone())));
    }
    scalers.push(Box::new(scalers::knative_kpa(
        p.target_in_flight,
        max,
        cfg.tick,
    )));
    scalers.push(Box::new(Keda::new(p.target_in_flight, max)));
    scalers.push(Box::new(AlwaysOn::new(always)));
    let schedule = bound::oracle_schedule(reqs, p);
    let oracle = report::oracle(&schedule, reqs, p);
    let vs_oracle = |cost: u64| cost as f64 / oracle.cost_micros.max(1) as f64;
    let mut no_cold = report::oracle_no_cold_start(reqs, p);
    no_cold.cost_vs_oracle = vs_oracle(no_cold.cost_micros);
    let mut fluid = report::fluid_bound(reqs, p);
    fluid.cost_vs_oracle = vs_oracle(fluid.cost_micros);
    let mut foresight =
        foresight::Foresight::new(reqs, p, &schedule.stretches, &cfg.fleet.spot_outages);
    // it plans on the trace alone and is ready at its start by construction: no warm-up
    let unwarmed = FleetConfig {
        warm_up: WarmUp::default(),
        ..cfg.fleet.clone()
    };
    let foresight = report::summarise(
        run_policy(reqs, &unwarmed, &mut foresight),
        reqs,
        p,
        oracle.cost_micros,
    );
    let mut policies: Vec<PolicySummary> = scalers
        .iter_mut()
        .map(|s| {
            let run = run_policy(reqs, &cfg.fleet, s.as_mut());
            tracing::debug!(policy = %run.name, end_ms = run.end_ms, "replayed");
            report::summarise(run, reqs, p, oracle.cost_micros)
        })
        .collect();
    let peak_row = policies.iter().find(|s| s.name == scalers::ALWAYS_ON_PEAK);
    let sized = fixed_fleet::smallest_meeting_slo(
        reqs,
        &cfg.fleet,
        oracle.cost_micros,
        (always, peak_row),
        max,
    );
    policies.push(sized.summary);
    let targets = cfg
        .ours
        .iter()
        .map(|(name, _)| check_target(&policies, name, no_cold.cost_micros, foresight.cost_micros))
        .collect();
    SimReport {
        trace: cfg.trace_label.clone(),
        requests: reqs.len(),
        trace_duration_s: reqs.last().map_or(0.0, |r| r.arrival_ms as f64 / 1000.0),
        billable_tokens: report::billable_tokens(reqs),
        fleet: cfg.fleet.clone(),
        ours: cfg.ours.clone(),
        always_on_replicas: always,
        always_on_slo_replicas: sized.replicas,
        oracle,
        foresight,
        oracle_no_cold_start: no_cold,
        fluid_bound: fluid,
        policies,
        targets,
        tuning: None,
    }
}

/// Evaluates the target for the row named `ours` against the baselines (rows whose names do
/// not start with "ours"); `no_cold_micros` and `foresight_micros` are the costs of the
/// oracle without cold starts and of `foresight`, which the check reports beside it.
pub fn check_target(
    policies: &[PolicySummary],
    ours: &str,
    no_cold_micros: u64,
    foresight_micros: u64,
) -> TargetCheck {
    let Some(me) = policies.iter().find(|p| p.name == ours) else {
        return TargetCheck {
            policy: ours.into(),
            cost_vs_oracle: f64::NAN,
            cost_vs_oracle_no_cold_start: f64::NAN,
            cost_vs_foresight: f64::NAN,
            slo_attainment: 0.0,
            slo_attainment_after_first_cold_start: 0.0,
            not_beaten: vec![],
            met: false,
        };
    };
    let not_beaten: Vec<String> = policies
        .iter()
        .filter(|b| !b.name.starts_with("ours"))
        .filter(|b| b.slo_attainment >= SLO_TARGET && b.cost_micros <= me.cost_micros)
        .map(|b| b.name.clone())
        .collect();
    TargetCheck {
        policy: ours.into(),
        cost_vs_oracle: me.cost_vs_oracle,
        cost_vs_oracle_no_cold_start: me.cost_micros as f64 / no_cold_micros.max(1) as f64,
        cost_vs_foresight: me.cost_micros as f64 / foresight_micros.max(1) as f64,
        slo_attainment: me.slo_attainment,
        slo_attainment_after_first_cold_start: me.slo_attainment_after_first_cold_start,
        met: me.cost_vs_oracle <= 1.3 && me.slo_attainment >= SLO_TARGET && not_beaten.is_empty(),
        not_beaten,
    }
}

#[cfg(test)]
mod tests;
