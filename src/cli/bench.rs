//! `tidal bench`: the runtime benchmarks of docs/benchmarks.md, printed as a table or JSON.

use clap::{Args, Subcommand};
use tidal_runtime::bench;
use tidal_tokenizer::Tokenizer;

use super::engine_args::EngineArgs;

/// Flags of `tidal bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: BenchCommand,
}

/// The benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Batch-1 prefill and decode tokens/s, with the machine's memory bandwidth beside it.
    Decode {
        #[command(flatten)]
        engine: EngineArgs,
        /// Prompt length in tokens.
        #[arg(long, default_value_t = 128)]
        prompt_tokens: usize,
        /// Generated tokens per run.
        #[arg(long, default_value_t = 128)]
        generate: usize,
        /// Runs (the best is reported: noise on a shared machine only slows a run down).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
    },
    /// Aggregate generated tokens/s at several concurrency levels.
    Concurrency {
        #[command(flatten)]
        engine: EngineArgs,
        /// Comma-separated concurrency levels.
        #[arg(long, default_value = "1,4,16,64", value_delimiter = ',')]
        levels: Vec<usize>,
        #[arg(long, default_value_t = 128)]
        prompt_tokens: usize,
        #[arg(long, default_value_t = 128)]
        generate: usize,
    },
    /// Time to first token with a shared system prompt: cold versus prefix-cache hit.
    Prefix {
        #[command(flatten)]
        engine: EngineArgs,
        /// Length of the shared system prompt in tokens.
        #[arg(long, default_value_t = 1200)]
        prefix_tokens: usize,
    },
    /// Memory read bandwidth of this machine (the ceiling for batch-1 decode).
    Bandwidth,
    /// Ledger ingest: usage events/s batched versus one insert per event, side by side, in a
    /// scratch database it creates and drops.
    Billing {
        /// Server URL (`postgres://user@host:port`) or `sqlite:` for a temporary SQLite file.
        #[arg(
            long,
            env = "TIDAL_DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432"
        )]
        database: String,
        /// Events to ingest.
        #[arg(long, default_value_t = 100_000)]
        events: usize,
    },
}

/// Runs one benchmark and prints its report as JSON lines.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.which {
        BenchCommand::Decode {
            engine,
            prompt_tokens,
            generate,
            repeats,
        } => {
            let loaded = engine.load()?;
            let tokenizer = loaded.engine.tokenizer().clone();
            let prompt = text_tokens(&tokenizer, 0, prompt_tokens);
            let report = bench::decode(&loaded.engine, &prompt, generate, repeats)?;
            let weights_mb = std::fs::metadata(&engine.model)
                .map(|m| m.len() as f64 / 1e6)
                .unwrap_or(0.0);
            let bandwidth = bench::memory_bandwidth_gb_per_s(1 << 30);
            // Each decoded token reads every weight once: bandwidth / model size bounds tokens/s.
            let ceiling = bandwidth * 1e3 / weights_mb.max(1e-9);
            print(&serde_json::json!({
                "bench": "decode",
                "model": engine.model.display().to_string(),
                "quantize": engine.quantize.map(|q| format!("{q:?}")),
                "load_seconds": loaded.load_seconds,
                "report": report,
                "memory_bandwidth_gb_per_s": bandwidth,
                "model_file_mb": weights_mb,
                "bandwidth_ceiling_tokens_per_s": ceiling,
                "fraction_of_ceiling": report.decode_tokens_per_second / ceiling,
            }));
        }
        BenchCommand::Concurrency {
            engine,
            levels,
            prompt_tokens,
            generate,
        } => {
            let loaded = engine.load()?;
            let tokenizer = loaded.engine.tokenizer().clone();
            let max = levels.iter().copied().max().unwrap_or(1);
            let prompts: Vec<Vec<u32>> = (0..max)
                .map(|i| text_tokens(&tokenizer, i, prompt_tokens))
                .collect();
            for level in levels {
                let report = bench::concurrency(&loaded.engine, level, &prompts, generate)?;
                print(&serde_json::json!({"bench": "concurrency", "report": report}));
            }
        }
        BenchCommand::Prefix {
            engine,
            prefix_tokens,
        } => {
            let loaded = engine.load()?;
            let tokenizer = loaded.engine.tokenizer().clone();
            let prefix = text_tokens(&tokenizer, 0, prefix_tokens);
            let a = tokenizer.encode(
                " Question one: what does the licence say about copies?",
                false,
            );
            let b = tokenizer.encode(" Question two: who may modify the program?", false);
            let report = bench::prefix_cache(&loaded.engine, &prefix, &a, &b)?;
            print(&serde_json::json!({"bench": "prefix", "report": report}));
        }
        BenchCommand::Billing { database, events } => {
            let runtime = tokio::runtime::Runtime::new()?;
            let report = runtime.block_on(tidal_billing::bench::bench_ingest(&database, events))?;
            print(&serde_json::json!({"bench": "billing", "report": report}));
        }
        BenchCommand::Bandwidth => {
            let gb = bench::memory_bandwidth_gb_per_s(1 << 30);
            print(&serde_json::json!({"bench": "bandwidth", "gb_per_s": gb}));
        }
    }
    Ok(())
}

fn print(value: &serde_json::Value) {
    println!("{value}");
}

/// Exactly `n` tokens of English text; `variant` changes the first words so that prompts of
/// different requests share no prefix-cache block.
fn text_tokens(tokenizer: &Tokenizer, variant: usize, n: usize) -> Vec<u32> {
    let mut text = format!("Request number {variant}. ");
    while tokenizer.encode(&text, false).len() < n + 1 {
        text.push_str(TEXT);
    }
    let mut ids = tokenizer.encode(&text, false);
    ids.truncate(n);
    ids
}

const TEXT: &str = "The tide comes in and goes out twice a day, pulled by the moon and the sun. \
Fishermen learn its rhythm early: when to set out, when to wait on the shore, and when the \
sandbars will rise above the water. A harbour that looks calm at noon may be a field of mud by \
evening, and a channel that was safe yesterday may be blocked tomorrow after a storm moves the \
sand. ";
