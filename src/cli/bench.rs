//! `tidal bench`: the runtime benchmarks of docs/benchmarks.md, printed as a table or JSON.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use tidal_runtime::bench;
use tidal_runtime::model::{KvDtype, Model, ModelFile, QuantizeTo};
use tidal_runtime::worker::bench::ScaleUpReport;
use tidal_runtime::worker::ClaimBudget;
use tidal_tokenizer::Tokenizer;

use super::engine_args::{parse_bytes, parse_duration, EngineArgs};

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
        /// Prompt length of each request, in tokens.
        #[arg(long, default_value_t = 128)]
        prompt_tokens: usize,
        /// Tokens each request generates.
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
    /// A burst queued while one worker is up and a second starts later (a scale-up): time to
    /// first token with greedy claims, a claim budget in tokens and one in seconds of
    /// measured prefill (the default), in turn each round.
    /// Each worker has its own engine (`--threads` each, default 1: two replicas on one
    /// machine).
    ScaleUp {
        #[command(flatten)]
        engine: EngineArgs,
        /// Requests in the burst.
        #[arg(long, default_value_t = 8)]
        requests: usize,
        /// Prompt tokens per request (the shipped trace's median is 1,469).
        #[arg(long, default_value_t = 1469)]
        prompt_tokens: usize,
        /// Tokens each request generates.
        #[arg(long, default_value_t = 16)]
        generate: usize,
        /// When the second worker starts, milliseconds after the burst.
        #[arg(long, default_value_t = 1000)]
        second_worker_after_ms: u64,
        /// The budget in prompt tokens compared (one median prompt of the trace).
        #[arg(long, default_value = "1469")]
        claim_prefill_budget_tokens: NonZeroUsize,
        /// The budget in seconds of each engine's measured prefill compared (the workers'
        /// default).
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        claim_prefill_budget: Duration,
        /// Rounds of the three (greedy, tokens, seconds).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// The simulator's service profile of one replica (prefill and decode rates, cold start),
    /// measured on this runtime, as JSON for `tidal sim --service-profile`.
    Profile(super::bench_profile::ProfileArgs),
    /// Tokens/s without and with speculative decoding, side by side, on a grounded and an
    /// open-ended chat workload, with the acceptance rate.
    Speculative(super::bench_speculative::SpeculativeArgs),
    /// A pool worker's model swap: load command to the first token of a waiting request,
    /// with the file in the page cache and with its pages dropped (on local disk), against a
    /// new `tidal runtime --model` process answering its first completion. Medians of
    /// `--rounds`, as JSON.
    Swap(super::bench_swap::SwapArgs),
    /// Write a throughput fixture: a GGUF of a real model's shape (Llama 3 8B, Llama 3.2 1B)
    /// with seeded random weights and a byte-level vocabulary; its output is meaningless.
    Fixture(super::bench_fixture::FixtureArgs),
    /// Perplexity on a text file with each KV cache dtype (llama.cpp's method: chunks of
    /// `--context` tokens, each started with BOS where the model's tokenizer adds one, second
    /// half of each scored), and the tokens and sequences a KV memory budget holds per dtype.
    Perplexity(PerplexityArgs),
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
    /// Gateway overhead: the same load direct to a fake-model server and through gateway +
    /// Redis + a fake worker; added median/p99 latency and requests/s.
    Gateway {
        /// Redis for the broker and the rate limiter (a scratch key prefix, removed after).
        #[arg(
            long,
            env = "TIDAL_REDIS_URL",
            default_value = "redis://127.0.0.1:6379"
        )]
        redis: String,
        /// Ledger database (default: a temporary SQLite file).
        #[arg(long)]
        database: Option<String>,
        /// Concurrent clients (closed loop).
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Requests per path.
        #[arg(long, default_value_t = 4000)]
        requests: usize,
        /// Completion tokens per request.
        #[arg(long, default_value_t = 4)]
        tokens: usize,
        /// Open loop at this many requests/s instead of closed loop.
        #[arg(long)]
        rate: Option<u32>,
    },
    /// Queue-worker throughput: the same concurrent requests to the engine directly, through
    /// a worker on the in-process broker, and (with --queue) through a worker on Redis.
    Worker {
        #[command(flatten)]
        engine: EngineArgs,
        /// Concurrent requests (all enqueued at once).
        #[arg(long, default_value_t = 16)]
        requests: usize,
        /// Prompt length of each request, in tokens.
        #[arg(long, default_value_t = 128)]
        prompt_tokens: usize,
        /// Tokens each request generates.
        #[arg(long, default_value_t = 64)]
        generate: usize,
        /// Also measure through Redis at this URL (a scratch key prefix, removed after).
        #[arg(long)]
        queue: Option<String>,
    },
}

/// Flags of `tidal bench perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// GGUF model file.
    #[arg(long, env = "TIDAL_MODEL")]
    pub model: PathBuf,
    /// Plain-text file to score, e.g. /usr/share/common-licenses/GPL-3.
    #[arg(long)]
    pub text: PathBuf,
    /// KV cache dtypes to compare, comma-separated.
    #[arg(long, default_value = "f32,f16,int8", value_delimiter = ',')]
    pub kv_cache_dtype: Vec<KvDtype>,
    /// Use only the first N tokens of the text.
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Tokens per chunk; the second half of each chunk is scored.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Tokens per forward call.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    /// Re-quantise the weights at load: q4_0, q4_1, q8_0, f16, f32 or stored
    /// (default: as stored, Q5_1 matrices as Q8_0).
    #[arg(long)]
    pub quantize: Option<QuantizeTo>,
    /// Worker threads for the kernels (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// KV memory for the capacity figures, e.g. 1GiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub kv_cache_memory: usize,
    /// Tokens per sequence for the capacity figures (prompt + generated).
    #[arg(long, default_value_t = 256)]
    pub sequence_tokens: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
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
            // one prompt per run: a repeated prompt would be a prefix-cache hit
            let prompts: Vec<Vec<u32>> = (0..repeats.max(1))
                .map(|i| text_tokens(&tokenizer, i, prompt_tokens))
                .collect();
            let report = bench::decode(&loaded.engine, &prompts, generate)?;
            // The weights as loaded: a re-quantised model reads more or fewer bytes than its file.
            let weights_mb = loaded.engine.weight_bytes() as f64 / 1e6;
            let bandwidth = bench::memory_bandwidth_gb_per_s(1 << 30);
            // Each decoded token reads every weight once: bandwidth / weight bytes bounds tokens/s.
            let ceiling = bandwidth * 1e3 / weights_mb.max(1e-9);
            print(&serde_json::json!({
                "bench": "decode",
                "model": engine.model_path()?.display().to_string(),
                "quantize": engine.quantize.map(|q| format!("{q:?}")),
                "load_seconds": loaded.load_seconds,
                "report": report,
                "memory_bandwidth_gb_per_s": bandwidth,
                "weights_mb": weights_mb,
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
        BenchCommand::Gateway {
            redis,
            database,
            clients,
            requests,
            tokens,
            rate,
        } => {
            let runtime = tokio::runtime::Runtime::new()?;
            let opts = tidal_gateway::bench::GatewayBenchOptions {
                redis_url: redis,
                database_url: database,
                clients,
                requests,
                tokens,
                rate_per_s: rate,
                ..Default::default()
            };
            let report = runtime.block_on(tidal_gateway::bench::bench_gateway(opts))?;
            print(&serde_json::json!({"bench": "gateway", "report": report}));
        }
        BenchCommand::Worker {
            engine,
            requests,
            prompt_tokens,
            generate,
            queue,
        } => bench_worker(&engine, requests, prompt_tokens, generate, queue)?,
        BenchCommand::Perplexity(args) => perplexity(args)?,
        BenchCommand::Profile(args) => super::bench_profile::run(args)?,
        BenchCommand::Speculative(args) => super::bench_speculative::run(args)?,
        BenchCommand::Swap(args) => super::bench_swap::run(args)?,
        BenchCommand::Fixture(args) => super::bench_fixture::run(args)?,
        BenchCommand::ScaleUp {
            engine,
            requests,
            prompt_tokens,
            generate,
            second_worker_after_ms,
            claim_prefill_budget_tokens,
            claim_prefill_budget,
            rounds,
        } => bench_scale_up(
            engine,
            ScaleUpLoad {
                requests,
                prompt_tokens,
                generate,
                second_after: Duration::from_millis(second_worker_after_ms),
            },
            [
                ClaimBudget::Off,
                ClaimBudget::Tokens(claim_prefill_budget_tokens),
                super::runtime::claim_budget(claim_prefill_budget, None),
            ],
            rounds,
        )?,
        BenchCommand::Bandwidth => {
            let gb = bench::memory_bandwidth_gb_per_s(1 << 30);
            print(&serde_json::json!({"bench": "bandwidth", "gb_per_s": gb}));
        }
    }
    Ok(())
}

/// The engine alone, then a worker on the in-process broker, then (optionally) a worker on
/// Redis; each path gets its own prompts so no path profits from another's prefix cache.
fn bench_worker(
    engine: &EngineArgs,
    requests: usize,
    prompt_tokens: usize,
    generate: usize,
    queue: Option<String>,
) -> anyhow::Result<()> {
    use tidal_queue::{Broker, BrokerConfig, MemoryBroker, RedisBroker};
    use tidal_runtime::worker::bench::bench_worker;

    let loaded = engine.load()?;
    let tokenizer = loaded.engine.tokenizer().clone();
    let prompts = |path: usize| -> Vec<Vec<u32>> {
        (0..requests)
            .map(|i| text_tokens(&tokenizer, path * requests + i, prompt_tokens))
            .collect()
    };
    let direct = bench::concurrency(&loaded.engine, requests, &prompts(0), generate)?;
    print(&serde_json::json!({"bench": "worker", "path": "engine", "report": direct}));
    let model = Arc::new(loaded.into_model());
    let runtime = tokio::runtime::Runtime::new()?;
    let memory: Arc<dyn Broker> = Arc::new(MemoryBroker::default());
    let report = runtime.block_on(bench_worker(
        model.clone(),
        memory,
        "memory",
        &prompts(1),
        generate,
    ))?;
    print(&serde_json::json!({"bench": "worker", "path": "memory", "report": report}));
    if let Some(url) = queue {
        let prefix = format!("tidal-bench-{}:", std::process::id());
        let config = BrokerConfig {
            prefix: prefix.clone(),
            ..BrokerConfig::default()
        };
        let report = runtime.block_on(async {
            let redis: Arc<dyn Broker> = Arc::new(RedisBroker::connect(&url, config).await?);
            let r = bench_worker(model.clone(), redis, "redis", &prompts(2), generate).await;
            tidal_queue::testing::delete_prefix(&url, &prefix);
            anyhow::Ok(r?)
        })?;
        print(&serde_json::json!({"bench": "worker", "path": "redis", "report": report}));
    }
    Ok(())
}

/// The burst of `tidal bench scale-up`.
struct ScaleUpLoad {
    requests: usize,
    prompt_tokens: usize,
    generate: usize,
    second_after: Duration,
}

/// Rounds of a burst of `requests` fresh prompts while one worker is up and a second
/// `second_after` later (with a freshly loaded engine), once under each of `budgets` per
/// round, each worker with its own engine (one kernel thread unless `--threads` says
/// otherwise). One JSON line per run, then
/// a summary table on stderr.
fn bench_scale_up(
    mut engine: EngineArgs,
    load: ScaleUpLoad,
    budgets: [ClaimBudget; 3],
    rounds: usize,
) -> anyhow::Result<()> {
    use tidal_queue::{Broker, MemoryBroker};
    use tidal_runtime::worker::bench::bench_scale_up;

    engine.threads = engine.threads.or(Some(1));
    let first = engine.load()?;
    let tokenizer = first.engine.tokenizer().clone();
    let first = Arc::new(first.into_model());
    let runtime = tokio::runtime::Runtime::new()?;
    let mut variant = 0;
    let mut reports = Vec::new();
    for _ in 0..rounds.max(1) {
        for budget in budgets {
            // The second worker is a new replica: a fresh engine, which has not measured its
            // prefill rate yet. The first has served earlier runs, as a worker that was up.
            let second = Arc::new(engine.load()?.into_model());
            // fresh prompts every run: no run profits from another's prefix cache
            let prompts: Vec<Vec<u32>> = (0..load.requests)
                .map(|_| {
                    variant += 1;
                    text_tokens(&tokenizer, variant, load.prompt_tokens)
                })
                .collect();
            let broker: Arc<dyn Broker> = Arc::new(MemoryBroker::default());
            let report = runtime.block_on(bench_scale_up(
                first.clone(),
                second,
                broker,
                &prompts,
                load.generate,
                load.second_after,
                budget,
            ))?;
            print(&serde_json::json!({"bench": "scale_up", "report": report}));
            reports.push(report);
        }
    }
    eprint!("{}", scale_up_table(&reports));
    Ok(())
}

/// One row per run: the claim rule, who claimed what, TTFT median / max, wall time.
fn scale_up_table(reports: &[ScaleUpReport]) -> String {
    let width = reports
        .iter()
        .map(|r| r.claim_budget.to_string().len())
        .max()
        .unwrap_or(0)
        .max(6);
    let mut out = format!(
        "{:width$}  first/second  TTFT median  TTFT max     wall  prefill tok/s\n",
        "claims"
    );
    for r in reports {
        let s = |d: Duration| format!("{:.2} s", d.as_secs_f64());
        out.push_str(&format!(
            "{:width$}  {:>5} / {:<4}  {:>11}  {:>8}  {:>7}  {:.0} / {:.0}\n",
            r.claim_budget.to_string(),
            r.claimed_by_first,
            r.claimed_by_second,
            s(r.median_time_to_first_token),
            s(r.max_time_to_first_token),
            s(r.wall_time),
            r.prefill_tokens_per_s[0],
            r.prefill_tokens_per_s[1],
        ));
    }
    out
}

/// Scores the text once per KV dtype with the same weights, then prints the capacity table.
fn perplexity(args: PerplexityArgs) -> anyhow::Result<()> {
    let file = ModelFile::open(&args.model)
        .with_context(|| format!("opening {}", args.model.display()))?;
    let tokenizer = Tokenizer::from_gguf(file.content()).context("building the tokenizer")?;
    let model = Model::load(&file, args.quantize).context("loading the weights")?;
    let text = std::fs::read_to_string(&args.text)
        .with_context(|| format!("reading {}", args.text.display()))?;
    // As llama.cpp's `perplexity`: the text with the model's BOS when it adds one, and every
    // chunk started with that BOS.
    let mut tokens = tokenizer.encode(&text, true);
    if let Some(max) = args.max_tokens {
        tokens.truncate(max);
    }
    let chunk_start = tokenizer.prompt_bos();
    for dtype in &args.kv_cache_dtype {
        let options = bench::PerplexityOptions {
            kv_cache_dtype: *dtype,
            context: args.context,
            batch: args.batch,
            block_size: args.block_size,
            threads: args.threads,
            chunk_start,
        };
        let report = bench::perplexity(&model, &tokens, &options)?;
        print(&serde_json::json!({
            "bench": "perplexity",
            "model": args.model.display().to_string(),
            "quantize": args.quantize.map(|q| format!("{q:?}")),
            "text": args.text.display().to_string(),
            "text_tokens": tokens.len(),
            "report": report,
        }));
    }
    for dtype in &args.kv_cache_dtype {
        let capacity = bench::kv_capacity(
            model.config(),
            *dtype,
            args.kv_cache_memory,
            args.block_size,
            args.sequence_tokens,
        );
        print(&serde_json::json!({"bench": "kv_capacity", "report": capacity}));
    }
    Ok(())
}

/// Prints one report as a JSON line.
pub(super) fn print(value: &serde_json::Value) {
    println!("{value}");
}

/// Exactly `n` tokens of English text; `variant` changes the first words so that prompts of
/// different requests share no prefix-cache block.
pub(super) fn text_tokens(tokenizer: &Tokenizer, variant: usize, n: usize) -> Vec<u32> {
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
