//! The pool comparison on small seeded workloads: determinism, the pool's limit with one
//! model, its saving with many idle models, the warm-up, and the search for each strategy's
//! cheapest setting at the target.

use super::*;
use crate::pool::PoolSpec;
use crate::sim::engine::WarmUp;
use crate::sim::multi_model;
use crate::sim::pool_render::render;
use crate::sim::pool_tune::{self, PerModelChoice};
use crate::sim::tests::tiny_profile;
use crate::sim::trace::{self, Synthetic};
use crate::sim::tune::{settings, Grid, Setting};
use crate::spec::ScalingSpec;
use crate::spec::StableAggregate;
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
        warm_up: false,
        cold_start_source: "the tiny profile".into(),
        swap_source: "the test".into(),
    }
}

fn hours(r: &PolicySummary) -> f64 {
    r.spot_replica_hours + r.on_demand_replica_hours
}

#[test]
fn seeded_runs_are_deterministic_and_every_request_completes_once() {
    let reqs = workload(900.0, 0.5, 3);
    let a = simulate_pool(&sim(&reqs, 4, 1.0, 1000, 3), None);
    let b = simulate_pool(&sim(&reqs, 4, 1.0, 1000, 3), None);
    assert_eq!(a.rows, b.rows);
    assert_eq!(a.pool_stats, b.pool_stats);
    let names: Vec<&str> = a.rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, [POOL, PER_MODEL, ALWAYS_ON]);
    let n: usize = a.models.iter().map(|m| m.requests).sum();
    for r in &a.rows {
        assert_eq!((r.completed, r.lost, r.duplicated), (n, 0, 0), "{}", r.name);
    }
    let c = simulate_pool(&sim(&reqs, 4, 1.0, 1000, 4), None);
    assert_ne!(a.rows[0], c.rows[0]);
}

#[test]
fn with_one_model_and_a_swap_as_slow_as_a_pod_start_the_pool_is_a_fleet() {
    // one model: the pool's worker count is the fleet's policy on the same demand, and a
    // swap as long as a pod start buys nothing
    let reqs = workload(1800.0, 0.5, 7);
    let cold_ms = (tiny_profile().cold_start_s * 1000.0) as u64;
    let r = simulate_pool(&sim(&reqs, 1, 1.0, cold_ms, 7), None);
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
    let r = simulate_pool(&sim(&reqs, 12, 0.5, 1000, 11), None);
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

/// Requests of `w` arriving within `ms` whose first token came within the tiny profile's
/// 2 s target, and how many arrived then.
fn early_met(w: &Merged, run: &PolicyRun, ms: u64) -> (usize, usize) {
    let early: Vec<usize> = (0..w.reqs.len())
        .filter(|i| w.reqs[*i].arrival_ms < ms)
        .collect();
    let met = early
        .iter()
        .filter(|i| run.ttft_ms[**i].is_some_and(|t| t <= 2_000))
        .count();
    (met, early.len())
}

#[test]
fn a_warm_up_spares_every_strategy_its_first_cold_start_and_bills_the_workers_it_leaves() {
    let reqs = workload(900.0, 0.5, 5);
    let cold = sim(&reqs, 4, 1.0, 1000, 5);
    let warm = PoolSim {
        warm_up: true,
        ..cold.clone()
    };
    let (wc, ww) = (Merged::of(&cold), Merged::of(&warm));
    assert_eq!(wc.warm_up_ms, None);
    let length = ww.warm_up_ms.unwrap();
    assert!(length > ww.reqs.last().unwrap().arrival_ms);
    assert_eq!(length % 1000, 0);
    // each model's fleet is warmed by its own requests, on the same clock as the pool
    let fleet = ww.fleet_of(&warm, 2);
    assert_eq!(fleet.warm_up.requests, warm.models[2].requests);
    assert_eq!(fleet.warm_up.length_ms, length);
    assert!(wc.fleet_of(&cold, 2).warm_up.requests.is_empty());

    // from empty the pool's first requests wait a 10 s pod start; warmed they do not
    let cold_ms = 10_000;
    let (from_empty, _) = wc.pool_run(&cold, &cold.pool.spec);
    let (warmed, _) = ww.pool_run(&warm, &warm.pool.spec);
    let (met, early) = early_met(&wc, &from_empty, cold_ms);
    assert!(early > 0);
    assert_eq!(met, 0);
    let (met, _) = early_met(&ww, &warmed, cold_ms);
    assert!(met * 10 >= early * 9, "{met} of {early}");
    assert_eq!(warmed.completions, vec![1; ww.reqs.len()]);
    // the workers up when measuring starts pay their cold start, and the series starts there
    let first = warmed.series[0];
    assert_eq!(first.t_s, 0.0);
    assert!(first.billed > 0);
    assert!(warmed.cold_starts >= u64::from(first.billed));
    assert!(warmed.end_ms < length + 3_600_000);

    let (a, b) = (simulate_pool(&cold, None), simulate_pool(&warm, None));
    assert!(b.warm_up && !a.warm_up);
    assert_eq!(b.rows, simulate_pool(&warm, None).rows);
    let n: usize = b.models.iter().map(|m| m.requests).sum();
    for (x, y) in a.rows.iter().zip(&b.rows) {
        assert_eq!((y.completed, y.lost, y.duplicated), (n, 0, 0), "{}", y.name);
        if y.name != ALWAYS_ON {
            assert!(
                y.slo_attainment > x.slo_attainment,
                "{}: {} warmed, {} from empty",
                y.name,
                y.slo_attainment,
                x.slo_attainment
            );
        }
    }
    assert!(render(&b, 2.0).contains("after one unmeasured pass"));
    assert!(render(&a, 2.0).contains("from empty"));
}

/// Four settings: short or long windows, quick or slow scale to zero.
fn small_grid() -> Grid {
    Grid {
        stable_windows_s: vec![30, 300],
        aggregates: vec![StableAggregate::Max],
        scale_down_delays_s: vec![0],
        scale_to_zero_after_s: vec![60, 600],
        decoding_weights_percent: vec![100],
    }
}

/// A setting, and (cost, attainment) of the pool and of the per-model fleets under it.
type Alone = (Setting, (u64, f64), (u64, f64));

/// Each setting of `grid` replayed alone on the pool and on every model's fleet.
fn replayed_alone(cfg: &PoolSim, w: &Merged, grid: &Grid) -> Vec<Alone> {
    settings(grid)
        .into_iter()
        .map(|s| {
            let spec = PoolSpec {
                workers: s.apply(&cfg.pool.spec.workers),
                ..cfg.pool.spec.clone()
            };
            let pool = w.row(w.pool_run(cfg, &spec).0, cfg);
            let fleets = w.per_model_runs("x", cfg, |_, _| {
                Box::new(Ours::new("x", s.apply(&cfg.per_model), cfg.tick))
            });
            let fleets = w.row(fleets, cfg);
            (
                s,
                (pool.cost_micros, pool.slo_attainment),
                (fleets.cost_micros, fleets.slo_attainment),
            )
        })
        .collect()
}

#[test]
fn the_search_finds_each_strategys_cheapest_setting_reaching_the_target() {
    // sparse traffic: the pool scales to zero between requests unless it waits long
    let reqs = workload(3600.0, 0.05, 3);
    let cfg = PoolSim {
        warm_up: true,
        ..sim(&reqs, 4, 1.0, 1000, 3)
    };
    let w = Merged::of(&cfg);
    let alone = replayed_alone(&cfg, &w, &small_grid());
    // a target the best pool setting reaches and a cheaper one misses
    let mut by_cost: Vec<(u64, f64)> = alone.iter().map(|a| a.1).collect();
    by_cost.sort_by_key(|c| c.0);
    let target = by_cost.iter().map(|c| c.1).fold(0.0, f64::max) - 1e-9;
    assert!(by_cost[0].1 < target, "{by_cost:?}");
    let t = pool_tune::search(&cfg, &w, &small_grid(), target);
    assert_eq!(t.tried, 4);
    let cheapest = |pick: fn(&Alone) -> (u64, f64)| {
        alone
            .iter()
            .filter(|a| pick(a).1 >= target)
            .min_by_key(|a| pick(a).0)
            .map(|a| (a.0, pick(a).0))
    };
    let pool = t.pool.clone().expect("a pool setting reaches the target");
    assert_eq!(Some((pool.setting, pool.cost_micros)), cheapest(|a| a.1));
    // the tuned rows are those settings' replays
    let rows: Vec<&str> = t.rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        rows,
        [
            pool_tune::POOL_TUNED,
            pool_tune::PER_MODEL_TUNED,
            pool_tune::ALWAYS_ON_SLO
        ]
    );
    assert_eq!(t.rows[0].cost_micros, pool.cost_micros);
    assert_eq!(t.rows[0].slo_attainment, pool.slo_attainment);
    if let Some(u) = &t.per_model_uniform {
        assert_eq!(Some((u.setting, u.cost_micros)), cheapest(|a| a.2));
    }
    if t.per_model_choice == PerModelChoice::Uniform {
        let u = t.per_model_uniform.clone().unwrap();
        assert_eq!(t.rows[1].cost_micros, u.cost_micros);
    }
    // each model's own choice reaches the target on its traffic where any setting does,
    // and whichever the row runs reaches it over all requests here
    assert_eq!(t.per_model_each.len(), 4);
    assert!(
        t.rows[1].slo_attainment >= target,
        "{}",
        t.rows[1].slo_attainment
    );
    // always-on: each model's smallest fleet reaching the target on its own traffic
    assert!(t.always_on_reached.iter().all(|r| *r));
    assert!(t.always_on_replicas.iter().all(|n| *n >= 1));
    assert!(t.rows[2].slo_attainment >= target);
    assert_eq!(t, pool_tune::search(&cfg, &w, &small_grid(), target));
}

#[test]
fn a_target_no_setting_reaches_is_said_and_the_rows_run_the_closest() {
    let reqs = workload(900.0, 0.5, 3);
    let cfg = PoolSim {
        warm_up: true,
        ..sim(&reqs, 4, 1.0, 1000, 3)
    };
    let w = Merged::of(&cfg);
    let t = pool_tune::search(&cfg, &w, &small_grid(), 1.5);
    assert_eq!((t.pool.clone(), t.per_model_uniform.clone()), (None, None));
    let most = t.pool_frontier.last().unwrap();
    assert_eq!(t.rows[0].slo_attainment, most.slo_attainment);
    assert!(t.always_on_reached.iter().all(|r| !*r));
    let mut r = simulate_pool(&cfg, None);
    r.tuning = Some(t);
    let text = render(&r, 2.0);
    assert!(text.contains("search: 4 settings"), "{text}");
    assert!(
        text.contains(
            "pool-tuned workers: no setting reaches 150%; the row runs the one reaching the most"
        ),
        "{text}"
    );
    assert!(text.contains("(misses)"), "{text}");
    // with the report's own target, the tuned rows follow the presets
    let r = simulate_pool(&cfg, Some(&small_grid()));
    let tuned = r.tuning.clone().unwrap();
    assert_eq!(&r.rows[3..], tuned.rows.as_slice());
}
