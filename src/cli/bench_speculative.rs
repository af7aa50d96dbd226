//! `tidal bench speculative`: tokens/s without and with speculative decoding, side by side,
//! on a grounded and an open-ended chat workload, and what one more verified token costs.

use anyhow::Context;
use clap::Args;
use tidal_runtime::bench::speculative::{self as spec, SpeculativeReport};
use tidal_runtime::engine::EngineConfig;
use tidal_runtime::load::load_model;
use tidal_runtime::model::{Model, ModelFile};
use tidal_runtime::speculative::{NgramProposer, SpeculativeMethod, StepCost};
use tidal_tokenizer::ChatMessage;

use super::engine_args::EngineArgs;

/// Flags of `tidal bench speculative`.
#[derive(Args, Debug)]
pub struct SpeculativeArgs {
    /// The engine with speculation (`--speculative ngram` unless given; `--speculative draft
    /// --draft-model PATH` for a draft model).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Comma-separated concurrency levels (1: the requests one after another).
    #[arg(long, default_value = "1,16", value_delimiter = ',')]
    pub levels: Vec<usize>,
    /// Most tokens per request (the model usually ends earlier).
    #[arg(long, default_value_t = 160)]
    pub max_tokens: usize,
    /// Rounds, alternating which engine goes first; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Also time steps of 1 + k tokens against a one-token step (the verify cost), and with
    /// ngram replay the greedy answers offline through the lookup policy and an oracle on
    /// that curve (`speculative-replay` lines: what lookup can give, free of timing noise).
    #[arg(long)]
    pub verify_cost: bool,
    /// Also replay the greedy answers through the lookup policy on this curve (ngram only):
    /// the time of a step of 1 + k tokens against a one-token step for k = 1, 2, 3, ...
    /// (comma-separated; e.g. another machine's `--verify-cost` figures).
    #[arg(long, value_delimiter = ',')]
    pub replay_curve: Vec<f64>,
}

/// Runs the benchmark and prints one JSON line per workload and level.
pub fn run(mut args: SpeculativeArgs) -> anyhow::Result<()> {
    if args.engine.speculative == SpeculativeMethod::Off {
        args.engine.speculative = SpeculativeMethod::Ngram;
    }
    // Checked before the benchmark runs: a bad curve fails at once.
    let spec_config = args.engine.speculative_config();
    let limit = spec_config.num_speculative_tokens;
    let mut curves = Vec::new();
    if !args.replay_curve.is_empty() {
        anyhow::ensure!(
            args.engine.speculative == SpeculativeMethod::Ngram,
            "--replay-curve replays the lookup proposer: use it with --speculative ngram"
        );
        let points: Vec<(usize, f64)> = (1..).zip(args.replay_curve.iter().copied()).collect();
        curves.push(
            StepCost::from_measured(&points, limit)
                .context("--replay-curve needs positive relative step times")?,
        );
    }
    let on = args.engine.load()?;
    let off_config = EngineConfig {
        speculative: tidal_runtime::speculative::SpeculativeConfig {
            method: SpeculativeMethod::Off,
            ..args.engine.speculative_config()
        },
        ..args.engine.engine_config()
    };
    let model_path = args.engine.model_path()?;
    let off = load_model(model_path, off_config, args.engine.quantize)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let template = on
        .chat_template
        .as_ref()
        .context("the model has no chat template: the workloads are chat messages")?;
    let tokenizer = on.engine.tokenizer().clone();
    let encode = |messages: Vec<&str>| -> anyhow::Result<Vec<Vec<u32>>> {
        messages
            .into_iter()
            .map(|m| {
                let text = template.render(&[ChatMessage::new("user", m)], true)?;
                Ok(tokenizer.encode(&text, false))
            })
            .collect()
    };
    let workloads = [
        ("grounded", encode(spec::grounded_messages())?),
        ("open-chat", encode(spec::open_messages())?),
    ];
    let mut reports: Vec<SpeculativeReport> = Vec::new();
    for &level in &args.levels {
        for (name, prompts) in &workloads {
            let report = spec::speculative(
                &off.engine,
                &on.engine,
                name,
                prompts,
                level,
                args.max_tokens,
                args.rounds,
            )?;
            println!(
                "{}",
                serde_json::json!({
                    "bench": "speculative",
                    "proposer": args.engine.speculative.name(),
                    "draft_model": args.engine.draft_model,
                    "draft_quantize": args.engine.draft_quantize.map(|q| format!("{q:?}").to_lowercase()),
                    "draft_cost": on.engine.stats().draft_cost,
                    "verify_cost": on.engine.stats().verify_cost,
                    "report": report
                })
            );
            reports.push(report);
        }
    }
    if args.verify_cost {
        let file = ModelFile::open(args.engine.model_path()?)?;
        let model = Model::load(&file, args.engine.quantize)?;
        // Every k the engine may propose, as its own calibration times them.
        let ks: Vec<usize> = (1..=limit.max(1)).collect();
        let report = spec::verify_cost(model, args.engine.threads, 256, &ks, 15)
            .context("timing steps of 1 + k tokens")?;
        println!(
            "{}",
            serde_json::json!({"bench": "speculative-verify-cost", "report": report})
        );
        curves.push(
            StepCost::from_measured(&report.relative_step_time, limit)
                .context("the verify cost measurement gave no usable point")?,
        );
    }
    if args.engine.speculative == SpeculativeMethod::Ngram {
        let proposer = NgramProposer::new(spec_config.ngram_min, spec_config.ngram_max);
        for cost in &curves {
            for (name, prompts) in &workloads {
                let Some(recorded) = reports.iter().find(|r| r.workload == *name) else {
                    continue;
                };
                let replayed = spec::replay(
                    name,
                    prompts,
                    &recorded.answers,
                    &proposer,
                    limit,
                    args.max_tokens,
                    cost,
                );
                println!(
                    "{}",
                    serde_json::json!({"bench": "speculative-replay", "curve": cost.relative(), "report": replayed})
                );
            }
        }
    }
    if reports.iter().any(|r| !r.identical) {
        anyhow::bail!("speculation changed the output of a greedy request");
    }
    Ok(())
}
