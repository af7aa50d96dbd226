//! `tidal bench profile`: the simulator's per-replica service model (`tidal sim
//! --service-profile`) measured on this runtime, so that `tidal sim` replays traces against
//! what a replica of ours really does rather than against reference figures.

use anyhow::Context;
use clap::Args;
use tidal_autoscaler::sim::ServiceProfile;
use tidal_runtime::bench;
use tidal_runtime::bench::median;

use super::bench::text_tokens;
use super::engine_args::EngineArgs;

/// Flags of `tidal bench profile`.
#[derive(Args, Debug)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Name of the profile in `tidal sim`'s reports.
    #[arg(long, default_value = "measured")]
    pub name: String,
    /// Prompt length of the prefill measurement (the shipped trace's median prompt is 1,469).
    #[arg(long, default_value_t = 1469)]
    pub prefill_tokens: usize,
    /// Prompt length of the decode measurements.
    #[arg(long, default_value_t = 128)]
    pub decode_context: usize,
    /// Tokens generated per request in the decode measurements.
    #[arg(long, default_value_t = 128)]
    pub generate: usize,
    /// Sequences a replica runs at once (`maxConcurrentSeqs`); the aggregate decode rate is
    /// measured with this many requests at once.
    #[arg(long, default_value_t = 16)]
    pub max_concurrent_seqs: usize,
    /// Runs of each measurement; the median is kept.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Node and image start before the model loads, seconds: a property of the cluster, not
    /// of this runtime. The measured model load is added to it for `coldStartS`.
    #[arg(long, default_value_t = 30.0)]
    pub node_and_image_s: f64,
    /// Spot price of one replica, micro-units per hour.
    #[arg(long, default_value_t = 34_000)]
    pub spot_price_micros_per_hour: u64,
    /// On-demand price of one replica, micro-units per hour.
    #[arg(long, default_value_t = 85_000)]
    pub on_demand_price_micros_per_hour: u64,
    /// Time-to-first-token target, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub ttft_slo_s: f64,
    /// The autoscaler's per-replica in-flight target (default: the requests of the prefill
    /// measurement's length one replica prefills within half the TTFT target, at least 1).
    #[arg(long)]
    pub target_in_flight: Option<f64>,
}

/// Measures and prints the profile as JSON (`tidal sim --service-profile FILE` reads it).
pub fn run(args: ProfileArgs) -> anyhow::Result<()> {
    let loaded = args.engine.load()?;
    let engine = &loaded.engine;
    let tokenizer = engine.tokenizer().clone();
    let repeats = args.repeats.max(1);
    let seqs = args.max_concurrent_seqs.max(1);
    // Distinct prompts everywhere: a prefix-cache hit would measure the cache, not prefill.
    let mut variant = 0;
    let mut prompts = |n: usize, len: usize| -> Vec<Vec<u32>> {
        (0..n)
            .map(|_| {
                variant += 1;
                text_tokens(&tokenizer, variant, len)
            })
            .collect()
    };

    let mut prefill = Vec::new();
    for prompt in prompts(repeats, args.prefill_tokens) {
        let r = bench::concurrency(engine, 1, &[prompt], 1).context("prefill run")?;
        prefill.push(args.prefill_tokens as f64 / r.median_time_to_first_token.as_secs_f64());
    }
    let generate = args.generate.max(2);
    // Decode rates leave out each request's prefill: tokens after the first over the time
    // after the (median) first token.
    let decode_rate = |n: usize, prompts: Vec<Vec<u32>>| -> anyhow::Result<f64> {
        let r = bench::concurrency(engine, n, &prompts, generate).context("decode run")?;
        let decode_s = r
            .wall_time
            .saturating_sub(r.median_time_to_first_token)
            .as_secs_f64();
        Ok((n * (generate - 1)) as f64 / decode_s.max(1e-9))
    };
    let mut single = Vec::new();
    let mut at_max = Vec::new();
    for _ in 0..repeats {
        single.push(decode_rate(1, prompts(1, args.decode_context))?);
        at_max.push(decode_rate(seqs, prompts(seqs, args.decode_context))?);
    }
    let prefill = median(prefill);
    let single = median(single);
    // The batching curve needs single <= at max <= single x seqs; noise can cross the bounds.
    let at_max = median(at_max).clamp(single, single * seqs as f64);
    let half_slo_tokens = prefill * args.ttft_slo_s / 2.0;
    let profile = ServiceProfile {
        name: args.name,
        prefill_tokens_per_s: prefill,
        decode_tokens_per_s_single: single,
        decode_tokens_per_s_at_max: at_max,
        max_concurrent_seqs: u32::try_from(seqs).context("--max-concurrent-seqs")?,
        cold_start_s: args.node_and_image_s + loaded.load_seconds,
        spot_price_micros_per_hour: args.spot_price_micros_per_hour,
        on_demand_price_micros_per_hour: args.on_demand_price_micros_per_hour,
        ttft_slo_s: args.ttft_slo_s,
        target_in_flight: args.target_in_flight.unwrap_or_else(|| {
            (half_slo_tokens / args.prefill_tokens.max(1) as f64)
                .floor()
                .clamp(1.0, seqs as f64)
        }),
    };
    profile.validate()?;
    println!("{}", serde_json::to_string_pretty(&profile)?);
    Ok(())
}
