//! Cost of one policy decision (the controller runs one per model per tick) and of a whole
//! simulated hour on the shipped trace.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;
use tidal_autoscaler::sim::{self, scalers::Ours, FleetConfig, ServiceProfile, WarmUp};
use tidal_autoscaler::{decide, CapacityObserved, Observed, PolicyState, ScalingSpec};

fn decide_tick(c: &mut Criterion) {
    let plain = ScalingSpec::default();
    let sized = ScalingSpec {
        prefill_tokens_per_second: 10_000.0,
        ..ScalingSpec::default()
    };
    for (name, spec) in [
        ("decide (one tick, 60 s window warm)", plain),
        ("decide (one tick, 60 s window warm, prefill sizing)", sized),
    ] {
        let mut state = PolicyState::new(&spec);
        let mut t = 0u64;
        c.bench_function(name, |b| {
            b.iter(|| {
                t += 1000;
                let obs = Observed {
                    backlog: t % 37,
                    in_flight: t % 23,
                    spot: CapacityObserved {
                        ready: 3,
                        starting: 1,
                        pending_since: vec![Duration::from_millis(t.saturating_sub(40_000))],
                        interrupted: 0,
                    },
                    on_demand: CapacityObserved::default(),
                    last_request_at: Some(Duration::from_millis(t)),
                    arrived_prompt_tokens: t * 10,
                    decoding: 0,
                };
                black_box(decide(
                    black_box(&obs),
                    &spec,
                    &mut state,
                    Duration::from_millis(t),
                ))
            })
        });
    }
}

fn replay_hour(c: &mut Criterion) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/azure-llm-2023-code.csv");
    let Ok(reqs) = sim::trace::load_csv(&path) else {
        eprintln!("skipping replay bench: {} not readable", path.display());
        return;
    };
    let profile = ServiceProfile::gpu_8b();
    let fleet = FleetConfig {
        profile: profile.clone(),
        dt_ms: 100,
        drain_ms: 30_000,
        notice_ms: 120_000,
        interruptions_per_hour: 0.1,
        spot_outages: vec![],
        sample_ms: 10_000,
        seed: 1,
        max_overrun_ms: 7_200_000,
        claim_prefill_budget_s: None,
        warm_up: WarmUp::default(),
    };
    // as `tidal sim` runs its `ours` row: prefill sizing from the profile
    let spec = ScalingSpec {
        target_in_flight_per_replica: profile.target_in_flight,
        max_replicas: 200,
        prefill_tokens_per_second: profile.prefill_tokens_per_s,
        ..ScalingSpec::default()
    };
    let mut group = c.benchmark_group("replay");
    group.sample_size(10);
    group.bench_function(
        "ours, shipped trace (1 h, 8,819 requests, 100 ms steps)",
        |b| {
            b.iter(|| {
                let mut ours = Ours::new("ours", spec.clone(), Duration::from_secs(1));
                black_box(sim::run_policy(&reqs, &fleet, &mut ours).end_ms)
            })
        },
    );
    group.finish();
}

criterion_group!(benches, decide_tick, replay_hour);
criterion_main!(benches);
