//! The pool comparison on small seeded workloads: determinism, the pool's limit with one
//! model, and its saving with many idle models.

use super::*;
use crate::pool::PoolSpec;
use crate::sim::engine::WarmUp;
use crate::sim::multi_model;
use crate::sim::tests::tiny_profile;
use crate::sim::trace::{self, Synthetic};
use crate::spec::ScalingSpec;
use std::time::Duration;

fn workload(duration_s: f64, rps: f64, seed: u64) -> Vec<Request> {
    trace::synthetic(&Synthetic {
        duration_s,
        mean_rps: rps,
        diurnal_amplitude: 0.5,
        period_s: duration_s,
        bursts_per_hour: 2.0,
        burst_multiplier: 3.0,
        burst_s: 30.0,
        prompt_mean: 300.0,
        generated_mean: 20.0,
        seed,
    })
}

/// `n` models sharing `reqs`; the tiny profile's 10 s cold start; workers hold 3 models.
fn sim(reqs: &[Request], n: u32, zipf: f64, swap_ms: u64, seed: u64) -> PoolSim {
    let profile = tiny_profile();
    let per_model = ScalingSpec {
        target_in_flight_per_replica: profile.target_in_flight,
        max_replicas: 50,
        ..ScalingSpec::default()
    }
    .with_cold_start(Duration::from_secs_f64(profile.cold_start_s));
    let models = multi_model::split(reqs, n, zipf, seed);
    let names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    PoolSim {
        label: "test".into(),
        pool: PoolConfig {
            spec: PoolSpec {
                worker_memory_bytes: 100,
                idle_unload_after: Duration::from_secs(30),
                workers: per_model.clone(),
            },
            memory_bytes: vec![30; names.len()],
            names,
            swap_ms,
            swap_uncached_ms: swap_ms,
            tick: Duration::from_secs(1),
        },
        models,
        fleet: FleetConfig {
            profile,
            dt_ms: 100,
            drain_ms: 30_000,
            notice_ms: 120_000,
            interruptions_per_hour: 0.0,
            spot_outages: vec![],
            sample_ms: 10_000,
            seed,
            max_overrun_ms: 3_600_000,
            claim_prefill_budget_s: Some(1.0),
            warm_up: WarmUp::default(),
        },
        per_model,
        tick: Duration::from_secs(1),
    }
}

fn hours(r: &PolicySummary) -> f64 {
    r.spot_replica_hours + r.on_demand_replica_hours
}

#[test]
fn seeded_runs_are_deterministic_and_every_request_completes_once() {
    let reqs = workload(900.0, 0.5, 3);
    let a = simulate_pool(&sim(&reqs, 4, 1.0, 1000, 3));
    let b = simulate_pool(&sim(&reqs, 4, 1.0, 1000, 3));
    assert_eq!(a.rows, b.rows);
    assert_eq!(a.pool_stats, b.pool_stats);
    let names: Vec<&str> = a.rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, [POOL, PER_MODEL, ALWAYS_ON]);
    let n: usize = a.models.iter().map(|m| m.requests).sum();
    for r in &a.rows {
        assert_eq!((r.completed, r.lost, r.duplicated), (n, 0, 0), "{}", r.name);
    }
    let c = simulate_pool(&sim(&reqs, 4, 1.0, 1000, 4));
    assert_ne!(a.rows[0], c.rows[0]);
}

#[test]
fn with_one_model_and_a_swap_as_slow_as_a_pod_start_the_pool_is_a_fleet() {
    // one model: the pool's worker count is the fleet's policy on the same demand, and a
    // swap as long as a pod start buys nothing
    let reqs = workload(1800.0, 0.5, 7);
    let cold_ms = (tiny_profile().cold_start_s * 1000.0) as u64;
    let r = simulate_pool(&sim(&reqs, 1, 1.0, cold_ms, 7));
    let (pool, fleet) = (&r.rows[0], &r.rows[1]);
    let ratio = hours(pool) / hours(fleet);
    assert!(
        (0.8..=1.3).contains(&ratio),
        "replica-hours pool/fleet {ratio}"
    );
    assert!(
        (pool.slo_attainment - fleet.slo_attainment).abs() <= 0.03,
        "{} vs {}",
        pool.slo_attainment,
        fleet.slo_attainment
    );
}

#[test]
fn with_many_idle_models_the_pool_uses_fewer_replica_hours() {
    // twelve models with little traffic each: every fleet keeps a replica through its
    // silences, the pool keeps a few workers for all of them
    let reqs = workload(1800.0, 0.6, 11);
    let r = simulate_pool(&sim(&reqs, 12, 0.5, 1000, 11));
    let (pool, fleet) = (&r.rows[0], &r.rows[1]);
    assert!(
        hours(pool) * 2.0 < hours(fleet),
        "pool {} h, per-model {} h",
        hours(pool),
        hours(fleet)
    );
    assert!(r.per_model_over_pool > 2.0, "{}", r.per_model_over_pool);
    // the tiny profile's slow prefill leaves a swap little of the 2 s target
    assert!(pool.slo_attainment >= 0.9, "{}", pool.slo_attainment);
    assert!(r.pool_stats.loads >= 12);
}
