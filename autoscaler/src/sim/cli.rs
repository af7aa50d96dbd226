//! `tidal sim` arguments and entry point.

use super::engine::{FleetConfig, WarmUp};
use super::multi_model;
use super::pool_compare::{simulate_pool, PoolReport, PoolSim};
use super::pool_engine::PoolConfig;
use super::profile::ServiceProfile;
use super::trace::{self, Synthetic};
use super::{bound, report, simulate, spot_outages, svg, tune, SimConfig, SimReport};
use crate::pool::PoolSpec;
use crate::schedule::FloorWindow;
use crate::spec::{CapacityMode, ScaleDownHold, ScalingSpec, StableAggregate};
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// Replay a request trace through the autoscaling policies on a simulated fleet.
#[derive(Debug, Clone, Args)]
pub struct SimArgs {
    /// Trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens).
    #[arg(long, default_value = "../shared/traces/azure-llm-2023-code.csv")]
    pub trace: PathBuf,
    /// Use the synthetic diurnal/bursty generator instead of --trace.
    #[arg(long)]
    pub synthetic: bool,
    /// Keep this fraction of requests (seeded).
    #[arg(long, default_value_t = 1.0)]
    pub thin: f64,
    /// Multiply arrival times by this (above 1 stretches, below 1 compresses).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Play the trace this many times back to back.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Play the (transformed) trace once before the measured run, unmeasured, so that every
    /// fleet meets the trace in the state its own traffic leaves it instead of empty (a trace
    /// cut from a running service starts mid-traffic). Replicas up when measuring starts pay
    /// their cold start. `foresight` and the bounds are unchanged. With --pool every strategy
    /// is warmed alike: the pool on every model's requests, each model's fleet on its own.
    #[arg(long)]
    pub warm_up: bool,
    /// Seed for thinning, the generator, interruptions and spot outages.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Synthetic: length, seconds.
    #[arg(long, default_value_t = 3600.0)]
    pub syn_duration_s: f64,
    /// Synthetic: mean requests/s.
    #[arg(long, default_value_t = 2.0)]
    pub syn_rps: f64,
    /// Synthetic: diurnal amplitude 0..1.
    #[arg(long, default_value_t = 0.6)]
    pub syn_amplitude: f64,
    /// Synthetic: diurnal period, seconds.
    #[arg(long, default_value_t = 3600.0)]
    pub syn_period_s: f64,
    /// Synthetic: bursts per hour.
    #[arg(long, default_value_t = 2.0)]
    pub syn_bursts_per_hour: f64,
    /// Synthetic: rate multiplier during a burst.
    #[arg(long, default_value_t = 5.0)]
    pub syn_burst_multiplier: f64,
    /// Synthetic: burst length, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub syn_burst_s: f64,
    /// Synthetic: mean prompt tokens.
    #[arg(long, default_value_t = 1024.0)]
    pub syn_prompt_mean: f64,
    /// Synthetic: mean generated tokens.
    #[arg(long, default_value_t = 128.0)]
    pub syn_generated_mean: f64,
    /// Built-in service profile: gpu-8b or cpu-smollm2-135m.
    #[arg(long, default_value = "gpu-8b")]
    pub profile: String,
    /// JSON service profile (e.g. from the runtime's benchmark); replaces --profile.
    #[arg(long)]
    pub service_profile: Option<PathBuf>,
    /// Override the profile's cold start (pod created to ready: node, image, weights, load),
    /// seconds. Feed it a measured figure (`kubectl get model` shows COLD-START); the
    /// built-in profiles' are 30 s (CPU: node and image, estimated) and 60 s (GPU,
    /// illustrative). With --pool it is the per-model and always-on fleets' cold start and a
    /// new pool worker's start, and the report prints it with its source.
    #[arg(long, visible_alias = "cold-start-seconds")]
    pub cold_start_s: Option<f64>,
    /// Compare a warm pool of workers shared by --models models with one fleet per model and
    /// one always-on fleet per model, on the trace split into the models (Zipf popularity,
    /// each model's arrivals shifted in time) (docs/autoscaling.md, "Model pools").
    #[arg(long)]
    pub pool: bool,
    /// With --pool: how many models share the trace.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub models: u32,
    /// With --pool: Zipf exponent of the models' popularity (0: all equal).
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// With --pool: time for a pool worker to load a model its node has cached (page cache
    /// or local disk), seconds. The default is a placeholder to override with a measured
    /// figure: 1 s, the order of the measured loads of a model file in the page cache
    /// (docs/benchmarks.md: 44-111 ms on CPU, 0.31 s for map + upload + NVRTC compile on an
    /// H200, both SmolLM2-135M); an 8B model's upload takes longer. The report says which
    /// was used.
    #[arg(long, visible_alias = "swap-seconds", default_value_t = DEFAULT_SWAP_S)]
    pub swap_s: f64,
    /// With --pool: time to load a model its worker's node has not cached yet (a download),
    /// seconds; default: --swap-s (a placeholder, as is --swap-s).
    #[arg(long)]
    pub swap_uncached_s: Option<f64>,
    /// With --pool: device memory of one model's weights, GiB (16: an 8B model in 16 bits).
    #[arg(long, default_value_t = 16.0)]
    pub model_memory_gib: f64,
    /// With --pool: device memory of one worker that weights may use, GiB (60: an 80 GiB
    /// device with the rest for KV cache and activations).
    #[arg(long, default_value_t = 60.0)]
    pub worker_memory_gib: f64,
    /// With --pool: unload a model from a worker after it has idled there this long, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub idle_unload_after_s: f64,
    /// Override the profile's TTFT target, seconds.
    #[arg(long)]
    pub ttft_slo_s: Option<f64>,
    /// Override the profile's per-replica in-flight target.
    #[arg(long)]
    pub target_in_flight: Option<f64>,
    /// Interruptions per spot replica-hour.
    #[arg(long, default_value_t = 0.1)]
    pub interruptions_per_hour: f64,
    /// Interruption notice, seconds (AWS 120, GCP 30).
    #[arg(long, default_value_t = 120.0)]
    pub notice_s: f64,
    /// Spot-unavailable periods per hour.
    #[arg(long, default_value_t = 0.5)]
    pub spot_outages_per_hour: f64,
    /// Mean length of a spot-unavailable period, seconds.
    #[arg(long, default_value_t = 600.0)]
    pub spot_outage_mean_s: f64,
    /// Workers claim a job only while their unstarted prefill is below this many seconds,
    /// as the runtime's workers do by default (`--claim-prefill-budget 1s`); 0: whenever a
    /// sequence slot is free.
    #[arg(long, default_value_t = 1.0)]
    pub claim_prefill_budget_s: f64,
    /// Drain budget of a scaled-down replica, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub drain_s: f64,
    /// Our policy: idle time before scaling to zero, seconds.
    #[arg(long, default_value_t = 120.0)]
    pub scale_to_zero_after_s: f64,
    /// Our policy: scale-down delay, seconds.
    #[arg(long, default_value_t = 0.0)]
    pub scale_down_delay_s: f64,
    /// Our policy: stable window, seconds (the panic window is a tenth of it).
    #[arg(long, default_value_t = 60.0)]
    pub stable_window_s: f64,
    /// Our policy: how the scale-down delay holds past targets (flat, per-level).
    #[arg(long, default_value = "flat")]
    pub scale_down_hold: String,
    /// Our policy: size stable mode on the window's peak instead of its mean.
    #[arg(long)]
    pub stable_max: bool,
    /// Our policy: max scale-up rate per decision, relative to ready replicas.
    #[arg(long, default_value_t = 1000.0)]
    pub max_scale_up_rate: f64,
    /// Our policy: spot pending time before on-demand fallback, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub fallback_after_s: f64,
    /// Our policy: size on request counts alone, without the prefill sizing that the
    /// profile's prefill rate and TTFT target otherwise give both `ours` rows.
    #[arg(long)]
    pub no_prefill_sizing: bool,
    /// Our policy: `prefillUtilisation` (both `ours` rows).
    #[arg(long, default_value_t = ScalingSpec::default().prefill_utilisation)]
    pub prefill_utilisation: f64,
    /// Our policy: `prefillToleranceReplicas` (both `ours` rows).
    #[arg(long, default_value_t = ScalingSpec::default().prefill_tolerance_replicas)]
    pub prefill_tolerance: f64,
    /// Our policy: `decodingWeight`, what a job that has delivered its first token weighs in
    /// the demand against a waiting one, 0 to 1 (both `ours` rows).
    #[arg(long, default_value_t = ScalingSpec::default().decoding_weight)]
    pub decoding_weight: f64,
    /// Our policy: capacity mode (spot, on-demand, spot-with-fallback).
    #[arg(long, default_value = "spot-with-fallback")]
    pub capacity_mode: String,
    /// Our policy: `minReplicas`, a floor of always-running replicas (both `ours` rows).
    #[arg(long, default_value_t = 0)]
    pub min_replicas: u32,
    /// Our policy: a floor by time of day, as a `Model`'s `floorSchedule` entry (both `ours`
    /// rows): `DAYS HH:MM-HH:MM MIN_REPLICAS [ZONE]`, e.g. `Mon-Fri 08:00-19:00 2
    /// Europe/Berlin`; DAYS is `daily` or days and ranges such as `Sat,Sun`. Repeat for more
    /// windows.
    #[arg(long = "floor-window", value_name = "WINDOW")]
    pub floor_windows: Vec<FloorWindow>,
    /// Wall-clock time of the trace's start (RFC 3339, e.g. 2026-11-30T08:00:00Z), which
    /// `--floor-window` reads; default: a CSV trace's first timestamp, read as UTC, and for
    /// `--synthetic` Monday 2026-11-30 00:00 UTC.
    #[arg(long, value_name = "TIME")]
    pub start_at: Option<String>,
    /// Upper bound on replicas for every policy.
    #[arg(long, default_value_t = 200)]
    pub max_replicas: u32,
    /// Decision interval of our policy and KPA, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub tick_s: f64,
    /// Simulation step, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub dt_ms: u64,
    /// Also replay our policy under a grid of its time constants (stable window and
    /// aggregate, scale-down delay, scale-to-zero time, decoding weight; 320 settings) and
    /// print the cheapest reaching 99 % SLO on every sample as a Model's `scaling` block,
    /// with the cost/attainment frontier and the preset for comparison. With --pool: the
    /// same grid for the pool's worker sizing and for the per-model fleets (one setting for
    /// all, and each fleet its own), and each model's smallest always-on fleet, all at 99 %
    /// over every request of one sample (the seed).
    #[arg(long)]
    pub tune: bool,
    /// With --tune: replay each setting on this many samples, seeds --seed, --seed + 1, ...
    /// (each thins, interrupts and cuts spot differently); a setting must reach the target
    /// on all of them, which carries better to other samples than one (docs/autoscaling.md,
    /// "Tuning").
    #[arg(long, default_value_t = 3, requires = "tune", conflicts_with = "pool", value_parser = clap::value_parser!(u64).range(1..=100))]
    pub tune_samples: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write the load/replicas plot (SVG) here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write every policy's time series (CSV) here.
    #[arg(long)]
    pub series_csv: Option<PathBuf>,
}

/// The row of our policy under the cold-start preset, which `--tune` compares with.
const PRESET_ROW: &str = "ours-coldstart";

/// `--swap-s`'s placeholder, seconds.
const DEFAULT_SWAP_S: f64 = 1.0;

/// Monday 2026-11-30 00:00 UTC: where a synthetic trace starts on the wall clock.
const SYNTHETIC_START_UNIX_S: u64 = 1_795_996_800;

fn secs(x: f64, what: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(x)
        .with_context(|| format!("{what} must be a non-negative number of seconds"))
}

/// Builds the simulation from arguments (reads the trace and profile).
pub fn config(args: &SimArgs) -> anyhow::Result<SimConfig> {
    let mut profile = match &args.service_profile {
        Some(path) => ServiceProfile::from_file(path)?,
        None => ServiceProfile::builtin(&args.profile)?,
    };
    if let Some(c) = args.cold_start_s {
        profile.cold_start_s = c;
    }
    if let Some(s) = args.ttft_slo_s {
        profile.ttft_slo_s = s;
    }
    if let Some(t) = args.target_in_flight {
        profile.target_in_flight = t;
    }
    profile.validate()?;

    let (mut reqs, mut label, trace_start) = if args.synthetic {
        let syn = Synthetic {
            duration_s: args.syn_duration_s,
            mean_rps: args.syn_rps,
            diurnal_amplitude: args.syn_amplitude,
            period_s: args.syn_period_s,
            bursts_per_hour: args.syn_bursts_per_hour,
            burst_multiplier: args.syn_burst_multiplier,
            burst_s: args.syn_burst_s,
            prompt_mean: args.syn_prompt_mean,
            generated_mean: args.syn_generated_mean,
            seed: args.seed,
        };
        (
            trace::synthetic(&syn),
            format!("synthetic {syn:?}"),
            SYNTHETIC_START_UNIX_S,
        )
    } else {
        let (reqs, start) = trace::load_csv_with_start(&args.trace)?;
        let start =
            u64::try_from(start.and_utc().timestamp()).context("the trace starts before 1970")?;
        (reqs, args.trace.display().to_string(), start)
    };
    let wall_clock_start_s = match &args.start_at {
        None => trace_start,
        Some(at) => chrono::DateTime::parse_from_rfc3339(at)
            .ok()
            .and_then(|t| u64::try_from(t.timestamp()).ok())
            .with_context(|| {
                format!("--start-at {at:?} is not an RFC 3339 time after 1970 (such as 2026-11-30T08:00:00Z)")
            })?,
    };
    if !args.floor_windows.is_empty() {
        label.push_str(&format!(
            ", {} floor window(s) from {}",
            args.floor_windows.len(),
            chrono::DateTime::from_timestamp(wall_clock_start_s as i64, 0)
                .map_or_else(|| wall_clock_start_s.to_string(), |t| t.to_rfc3339())
        ));
    }
    if args.thin < 1.0 {
        reqs = trace::thin(&reqs, args.thin, args.seed);
        label.push_str(&format!(", thinned to {} (seed {})", args.thin, args.seed));
    }
    if args.time_scale != 1.0 {
        anyhow::ensure!(args.time_scale > 0.0, "--time-scale must be positive");
        reqs = trace::scale_time(&reqs, args.time_scale);
        label.push_str(&format!(", time x{}", args.time_scale));
    }
    if args.repeat > 1 {
        let period = trace::period_ms(&reqs);
        reqs = trace::repeat(&reqs, args.repeat, period);
        label.push_str(&format!(", repeated {}x", args.repeat));
    }
    anyhow::ensure!(!reqs.is_empty(), "the trace is empty after transformation");
    let warm_up = if args.warm_up {
        label.push_str(", after a warm-up pass");
        WarmUp::once_before(&reqs)
    } else {
        WarmUp::default()
    };

    let horizon = reqs.last().map_or(0, |r| r.arrival_ms);
    let capacity_mode = match args.capacity_mode.as_str() {
        "spot" => CapacityMode::Spot,
        "on-demand" => CapacityMode::OnDemand,
        "spot-with-fallback" => CapacityMode::SpotWithFallback,
        other => anyhow::bail!("unknown capacity mode {other:?}"),
    };
    let spec = ScalingSpec {
        min_replicas: args.min_replicas,
        max_replicas: args.max_replicas,
        target_in_flight_per_replica: profile.target_in_flight,
        scale_to_zero_after: secs(args.scale_to_zero_after_s, "--scale-to-zero-after-s")?,
        fallback_after: secs(args.fallback_after_s, "--fallback-after-s")?,
        max_scale_up_rate: args.max_scale_up_rate,
        stable_aggregate: if args.stable_max {
            StableAggregate::Max
        } else {
            StableAggregate::Mean
        },
        scale_down_delay: secs(args.scale_down_delay_s, "--scale-down-delay-s")?,
        scale_down_hold: match args.scale_down_hold.as_str() {
            "flat" => ScaleDownHold::Flat,
            "per-level" => ScaleDownHold::PerLevel,
            other => anyhow::bail!("unknown scale-down hold {other:?}"),
        },
        stable_window: secs(args.stable_window_s, "--stable-window-s")?,
        panic_window: secs(args.stable_window_s / 10.0, "--stable-window-s")?,
        capacity_mode,
        prefill_tokens_per_second: if args.no_prefill_sizing {
            0.0
        } else {
            profile.prefill_tokens_per_s
        },
        ttft_target: secs(profile.ttft_slo_s, "ttftSloS")?,
        prefill_utilisation: args.prefill_utilisation,
        prefill_tolerance_replicas: args.prefill_tolerance,
        floor_schedule: args.floor_windows.clone(),
        decoding_weight: args.decoding_weight,
        ..ScalingSpec::default()
    };
    spec.validate()?;
    let cold = secs(profile.cold_start_s, "coldStartS")?;
    let scaled = spec.clone().with_cold_start(cold);
    scaled.validate()?;
    let ours = vec![("ours".to_string(), spec), (PRESET_ROW.to_string(), scaled)];
    let fleet = FleetConfig {
        profile,
        dt_ms: args.dt_ms.max(1),
        drain_ms: secs(args.drain_s, "--drain-s")?.as_millis() as u64,
        notice_ms: secs(args.notice_s, "--notice-s")?.as_millis() as u64,
        interruptions_per_hour: args.interruptions_per_hour.max(0.0),
        spot_outages: spot_outages(
            args.spot_outages_per_hour,
            args.spot_outage_mean_s,
            horizon,
            args.seed,
        ),
        sample_ms: (horizon / 600).max(1000),
        seed: args.seed,
        max_overrun_ms: 2 * 3_600_000,
        claim_prefill_budget_s: match args.claim_prefill_budget_s {
            b if b > 0.0 && b.is_finite() => Some(b),
            0.0 => None,
            b => anyhow::bail!(
                "--claim-prefill-budget-s must be 0 (off) or a positive number of seconds, not {b}"
            ),
        },
        warm_up,
    };
    Ok(SimConfig {
        requests: reqs,
        trace_label: label,
        fleet,
        ours,
        tick: secs(args.tick_s, "--tick-s")?.max(Duration::from_millis(1)),
        wall_clock_start_s,
    })
}

/// What a run of `tidal sim` reports.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// One model's fleets compared.
    Fleet(Box<SimReport>),
    /// `--pool`: the pool against per-model and always-on fleets.
    Pool(Box<PoolReport>),
}

impl Outcome {
    /// The fleet comparison, if that is what ran.
    pub fn fleet(self) -> Option<SimReport> {
        match self {
            Outcome::Fleet(r) => Some(*r),
            Outcome::Pool(_) => None,
        }
    }
}

/// Builds the pool comparison from arguments: the trace as transformed by the traffic flags,
/// split into `--models` models; the per-model fleets run `ours-coldstart`, the pool's
/// workers are sized by the same preset.
pub fn pool_config(args: &SimArgs) -> anyhow::Result<PoolSim> {
    let cfg = config(args)?;
    anyhow::ensure!(
        args.zipf.is_finite() && args.zipf >= 0.0,
        "--zipf must be a finite number of at least 0"
    );
    let gib = |x: f64, what: &str| -> anyhow::Result<u64> {
        anyhow::ensure!(
            x.is_finite() && x > 0.0,
            "{what} must be a positive number of GiB"
        );
        Ok((x * f64::from(1u32 << 30)) as u64)
    };
    let ms = |x: f64, what: &str| secs(x, what).map(|d| d.as_millis() as u64);
    let swap_ms = ms(args.swap_s, "--swap-s")?;
    let swap_uncached_ms = ms(
        args.swap_uncached_s.unwrap_or(args.swap_s),
        "--swap-uncached-s",
    )?;
    let per_model = cfg
        .ours
        .iter()
        .find(|(name, _)| name == PRESET_ROW)
        .map(|(_, s)| s.clone())
        .context("the cold-start preset is missing")?;
    let models = multi_model::split(&cfg.requests, args.models, args.zipf, args.seed);
    let names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    let memory = gib(args.model_memory_gib, "--model-memory-gib")?;
    let spec = PoolSpec {
        worker_memory_bytes: gib(args.worker_memory_gib, "--worker-memory-gib")?,
        idle_unload_after: secs(args.idle_unload_after_s, "--idle-unload-after-s")?,
        workers: per_model.clone(),
    };
    spec.validate()?;
    // no interruptions or outages: the pool replay does not model them; the warm-up is
    // the comparison's own (every strategy on its own share of the workload)
    let fleet = FleetConfig {
        interruptions_per_hour: 0.0,
        spot_outages: Vec::new(),
        warm_up: WarmUp::default(),
        ..cfg.fleet.clone()
    };
    let label = cfg
        .trace_label
        .strip_suffix(", after a warm-up pass")
        .unwrap_or(&cfg.trace_label);
    Ok(PoolSim {
        label: format!(
            "{label} split into {} models (Zipf {}, seed {}), no spot interruptions or outages",
            args.models, args.zipf, args.seed
        ),
        warm_up: args.warm_up,
        cold_start_source: cold_start_source(args),
        swap_source: swap_source(args),
        pool: PoolConfig {
            spec,
            memory_bytes: vec![memory; names.len()],
            names,
            swap_ms,
            swap_uncached_ms,
            tick: cfg.tick,
        },
        models,
        fleet,
        per_model,
        tick: cfg.tick,
    })
}

/// Where the pod cold start of a run comes from, for the report.
fn cold_start_source(args: &SimArgs) -> String {
    match (&args.cold_start_s, &args.service_profile) {
        (Some(_), _) => "--cold-start-s".into(),
        (None, Some(path)) => format!("the profile {}", path.display()),
        (None, None) => match args.profile.as_str() {
            "gpu-8b" | "gpu" => {
                "the built-in gpu-8b profile: illustrative, not measured; pass a measured pod start with --cold-start-s".into()
            }
            _ => "the built-in cpu-smollm2-135m profile: 30 s node and image, estimated (the measured model load, 0.08 s, is below its precision)".into(),
        },
    }
}

/// Where the swap times of a run come from, for the report.
fn swap_source(args: &SimArgs) -> String {
    let uncached = if args.swap_uncached_s.is_some() {
        "; uncached: --swap-uncached-s"
    } else {
        ""
    };
    if args.swap_s == DEFAULT_SWAP_S {
        format!("--swap-s default, a placeholder of the order of the measured loads of a model file in the page cache (docs/benchmarks.md: 44-111 ms on CPU, 0.31 s on an H200 with upload and NVRTC compile, SmolLM2-135M); pass your model's measured swap-in{uncached}")
    } else {
        format!("--swap-s{uncached}")
    }
}

/// Runs the simulation, prints the table (or JSON) and writes the plot if asked; returns the
/// report for callers that want it.
pub fn run(args: &SimArgs) -> anyhow::Result<Outcome> {
    if args.pool {
        let cfg = pool_config(args)?;
        let grid = args.tune.then(tune::Grid::default);
        let report = simulate_pool(&cfg, grid.as_ref());
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!(
                "{}",
                super::pool_render::render(&report, cfg.fleet.profile.ttft_slo_s)
            );
        }
        return Ok(Outcome::Pool(Box::new(report)));
    }
    let cfg = config(args)?;
    let mut report = simulate(&cfg);
    if args.tune {
        report.tuning = Some(tuning(args, cfg, report.oracle.cost_micros)?);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_text(&report));
    }
    if let Some(path) = &args.svg {
        let panels: Vec<(&str, &[super::Sample])> = report
            .policies
            .iter()
            .chain([&report.foresight])
            .map(|p| (p.name.as_str(), p.series.as_slice()))
            .collect();
        let title = format!("{} — {}", report.fleet.profile.name, report.trace);
        std::fs::write(path, svg::render(&title, &panels))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.series_csv {
        let mut csv = String::from(
            "policy,t_s,arrivals_per_s,ready_spot,ready_on_demand,billed,backlog,desired,reason\n",
        );
        for p in report.policies.iter().chain([&report.foresight]) {
            for x in &p.series {
                csv.push_str(&format!(
                    "{},{},{},{},{},{},{},{},{}\n",
                    p.name,
                    x.t_s,
                    x.arrivals_per_s,
                    x.ready_spot,
                    x.ready_on_demand,
                    x.billed,
                    x.backlog,
                    x.desired,
                    x.reason.unwrap_or("")
                ));
            }
        }
        std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(Outcome::Fleet(Box::new(report)))
}

/// `--tune`: the grid on `--tune-samples` samples, the first `cfg` (whose oracle costs
/// `oracle_cost`), the others the same arguments with the next seeds.
fn tuning(args: &SimArgs, cfg: SimConfig, oracle_cost: u64) -> anyhow::Result<tune::Tuning> {
    let preset = cfg
        .ours
        .iter()
        .find(|(name, _)| name == PRESET_ROW)
        .map(|(_, spec)| tune::Setting::of(spec));
    let mut samples = vec![tune::Sample { cfg, oracle_cost }];
    for k in 1..args.tune_samples {
        let cfg = config(&SimArgs {
            seed: args.seed.wrapping_add(k),
            ..args.clone()
        })?;
        let (reqs, p) = (&cfg.requests, &cfg.fleet.profile);
        let oracle_cost = report::oracle(&bound::oracle_schedule(reqs, p), reqs, p).cost_micros;
        samples.push(tune::Sample { cfg, oracle_cost });
    }
    let grid = tune::Grid::default();
    Ok(tune::tune(&samples, &grid, preset, super::SLO_TARGET))
}

/// The human-readable report: header, table and the target verdict.
pub fn render_text(r: &SimReport) -> String {
    let p = &r.fleet.profile;
    let mut out = format!(
        "trace: {} ({} requests, {:.0} s, {} tokens)\nprofile: {} (prefill {:.0} tok/s, decode {:.0}->{:.0} tok/s at {} seqs, cold start {:.0} s, spot {:.4}/h, on-demand {:.4}/h, TTFT target {} s, target in-flight {})\nspot: {} interruptions per replica-hour, {:.0} s notice, {} unavailable periods; always-on replicas: {} (busiest minute), {} (smallest meeting {}% SLO)\n\n",
        r.trace, r.requests, r.trace_duration_s, r.billable_tokens,
        p.name, p.prefill_tokens_per_s, p.decode_tokens_per_s_single, p.decode_tokens_per_s_at_max,
        p.max_concurrent_seqs, p.cold_start_s,
        p.spot_price_micros_per_hour as f64 / 1e6, p.on_demand_price_micros_per_hour as f64 / 1e6,
        p.ttft_slo_s, p.target_in_flight,
        r.fleet.interruptions_per_hour, r.fleet.notice_ms as f64 / 1000.0, r.fleet.spot_outages.len(),
        r.always_on_replicas, r.always_on_slo_replicas, super::SLO_TARGET * 100.0,
    );
    let mut rows = vec![
        r.oracle.clone(),
        r.foresight.clone(),
        r.oracle_no_cold_start.clone(),
        r.fluid_bound.clone(),
    ];
    rows.extend(r.policies.iter().cloned());
    out.push_str(&super::report::table(&rows, p.ttft_slo_s));
    for t in &r.targets {
        out.push_str(&format!(
            "\ntarget for {} (<= 1.3x oracle, >= 99% SLO, cheaper than every baseline at >= 99% SLO): {} — {:.2}x oracle ({:.2}x oracle-no-cold, {:.2}x foresight), {:.2}% SLO ({:.2}% after the first cold start){}",
            t.policy,
            if t.met { "MET" } else { "NOT MET" },
            t.cost_vs_oracle,
            t.cost_vs_oracle_no_cold_start,
            t.cost_vs_foresight,
            t.slo_attainment * 100.0,
            t.slo_attainment_after_first_cold_start * 100.0,
            if t.not_beaten.is_empty() {
                String::new()
            } else {
                format!(", not cheaper than {}", t.not_beaten.join(", "))
            },
        ));
    }
    out.push('\n');
    if let Some(t) = &r.tuning {
        out.push_str(&tune::render(t));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn config_of(extra: &[&str]) -> anyhow::Result<SimConfig> {
        let base = ["sim", "--synthetic", "--syn-duration-s", "60"];
        let cli = Cli::try_parse_from(base.iter().chain(extra))?;
        config(&cli.sim)
    }

    #[test]
    fn workers_claim_under_a_one_second_prefill_budget_unless_told_otherwise() {
        // the runtime's default (`--claim-prefill-budget 1s`)
        let default = config_of(&[]).unwrap();
        assert_eq!(default.fleet.claim_prefill_budget_s, Some(1.0));
        let set = config_of(&["--claim-prefill-budget-s", "2.5"]).unwrap();
        assert_eq!(set.fleet.claim_prefill_budget_s, Some(2.5));
        let greedy = config_of(&["--claim-prefill-budget-s", "0"]).unwrap();
        assert_eq!(greedy.fleet.claim_prefill_budget_s, None);
        for bad in ["-1", "inf", "NaN"] {
            let flag = format!("--claim-prefill-budget-s={bad}");
            let err = config_of(&[flag.as_str()]).unwrap_err();
            assert!(
                err.to_string().contains("--claim-prefill-budget-s"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn tuning_replays_three_samples_unless_told_otherwise() {
        let cli = |extra: &[&str]| {
            let base = ["sim", "--synthetic", "--tune"];
            Cli::try_parse_from(base.iter().chain(extra)).map(|c| c.sim)
        };
        assert_eq!(cli(&[]).unwrap().tune_samples, 3);
        assert_eq!(cli(&["--tune-samples", "1"]).unwrap().tune_samples, 1);
        for bad in ["0", "101"] {
            assert!(cli(&["--tune-samples", bad]).is_err(), "{bad}");
        }
        let alone = Cli::try_parse_from(["sim", "--tune-samples", "2"]);
        assert!(alone.is_err(), "--tune-samples without --tune");
        // a minute of synthetic traffic, two samples: every setting of the grid replayed on
        // both, and the preset (`ours-coldstart`) beside them
        let args = cli(&["--syn-duration-s", "60", "--tune-samples", "2", "--json"]).unwrap();
        let t = run(&args).unwrap().fleet().unwrap().tuning.unwrap();
        assert_eq!((t.samples, t.tried), (2, 320));
        let preset = config(&args).unwrap().ours[1].1.clone();
        assert_eq!(
            t.preset.map(|p| p.setting),
            Some(tune::Setting::of(&preset))
        );
    }

    #[test]
    fn a_warm_up_pass_plays_the_transformed_trace_once_before_it() {
        let cold = config_of(&["--thin", "0.5"]).unwrap();
        assert!(cold.fleet.warm_up.requests.is_empty());
        assert_eq!(cold.fleet.warm_up.length_ms, 0);
        let warm = config_of(&["--thin", "0.5", "--warm-up"]).unwrap();
        assert_eq!(warm.requests, cold.requests);
        assert_eq!(warm.fleet.warm_up.requests, warm.requests);
        let last = warm.requests.last().unwrap().arrival_ms;
        assert!(warm.fleet.warm_up.length_ms > last);
        assert_eq!(warm.fleet.warm_up.length_ms % 1000, 0);
        assert!(warm.trace_label.ends_with(", after a warm-up pass"));
    }

    #[test]
    fn floor_windows_reach_both_of_our_rows_on_the_trace_wall_clock() {
        let window = "Mon-Fri 08:00-19:00 2 Europe/Berlin";
        let cfg = config_of(&[
            "--floor-window",
            window,
            "--floor-window",
            "Sat 10:00-12:00 1",
        ])
        .unwrap();
        for (name, spec) in &cfg.ours {
            assert_eq!(spec.floor_schedule.len(), 2, "{name}");
            assert_eq!(spec.floor_schedule[0], window.parse().unwrap(), "{name}");
        }
        assert_eq!(cfg.wall_clock_start_s, SYNTHETIC_START_UNIX_S);
        assert!(cfg
            .trace_label
            .contains("2 floor window(s) from 2026-11-30T00:00:00+00:00"));
        let at = config_of(&["--start-at", "2026-12-01T09:30:00+01:00"]).unwrap();
        assert_eq!(
            at.wall_clock_start_s,
            SYNTHETIC_START_UNIX_S + 86_400 + 8 * 3600 + 1800
        );
        assert!(at.ours.iter().all(|(_, s)| s.floor_schedule.is_empty()));
        let err = config_of(&["--start-at", "tomorrow"]).unwrap_err();
        assert!(err.to_string().contains("RFC 3339"), "{err}");
        let err = config_of(&["--floor-window", "weekdays 08:00-19:00 2"]).unwrap_err();
        assert!(err.to_string().contains("expected DAYS"), "{err}");
        let err = config_of(&[
            "--max-replicas",
            "3",
            "--floor-window",
            "daily 00:00-00:00 4",
        ])
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("floorSchedule[0]: minReplicas (4)"),
            "{err}"
        );
    }

    #[test]
    fn the_pool_report_says_which_cold_starts_it_used_and_where_they_come_from() {
        let pool_of = |extra: &[&str]| {
            let base = ["sim", "--synthetic", "--syn-duration-s", "120", "--pool"];
            let cli = Cli::try_parse_from(base.iter().chain(extra)).unwrap();
            pool_config(&cli.sim).unwrap()
        };
        let d = pool_of(&[]);
        assert!(!d.warm_up);
        assert_eq!(d.fleet.profile.cold_start_s, 60.0);
        assert_eq!(d.pool.swap_ms, 1000);
        assert!(d
            .cold_start_source
            .contains("built-in gpu-8b profile: illustrative, not measured"));
        assert!(d.swap_source.contains("placeholder"), "{}", d.swap_source);
        assert!(d
            .swap_source
            .contains("docs/benchmarks.md: 44-111 ms on CPU, 0.31 s on an H200"));
        let text = super::super::pool_render::render(&simulate_pool(&d, None), 2.0);
        assert!(text.contains("pod cold start (per-model and always-on replicas, new pool workers): 60.0 s, from the built-in gpu-8b profile"), "{text}");
        assert!(
            text.contains("swap-in (pool): 1.00 s cached, 1.00 s uncached, from --swap-s default"),
            "{text}"
        );

        let m = pool_of(&[
            "--cold-start-s",
            "45",
            "--swap-s",
            "0.3",
            "--swap-uncached-s",
            "20",
            "--warm-up",
        ]);
        assert!(m.warm_up);
        assert!(!m.label.contains("after a warm-up pass"), "{}", m.label);
        assert!(m.fleet.warm_up.requests.is_empty());
        assert_eq!(m.fleet.profile.cold_start_s, 45.0);
        assert_eq!((m.pool.swap_ms, m.pool.swap_uncached_ms), (300, 20_000));
        assert_eq!(m.cold_start_source, "--cold-start-s");
        assert_eq!(m.swap_source, "--swap-s; uncached: --swap-uncached-s");
        let cpu = pool_of(&["--profile", "cpu-smollm2-135m"]);
        assert!(cpu.cold_start_source.contains("cpu-smollm2-135m"));

        // the pool's search runs on one sample
        let err = Cli::try_parse_from(["sim", "--pool", "--tune", "--tune-samples", "2"]);
        assert!(err.is_err());
    }
}
