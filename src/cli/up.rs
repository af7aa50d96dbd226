//! `tidal up`: the whole platform in one process (gateway, in-process broker, metering on
//! an SQLite ledger, a local fleet that scales each model to and from zero).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use metrics_exporter_prometheus::PrometheusBuilder;
use tidal_autoscaler::{FloorWindow, ScalingSpec};
use tidal_local::fetch::FetchConfig;
use tidal_local::source::ModelSource;
use tidal_local::up::{self, Started, UpConfig, UpPool};
use tidal_queue::Prices;
use tidal_runtime::engine::EngineConfig;
use tidal_runtime::model::QuantizeTo;
use tidal_runtime::speculative::{SpeculativeConfig, SpeculativeMethod};

use super::engine_args::{parse_bytes, parse_duration};
use super::signals::terminated;

/// Flags of `tidal up`.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// A model to serve, `[NAME=]SOURCE` (repeat for several). SOURCE: a GGUF path,
    /// file://PATH, https://URL[#sha256=HEX], hf://ORG/REPO/FILE.gguf[#sha256=HEX], or
    /// `default` (SmolLM2-135M-Instruct Q4_1, fetched and verified on first use).
    #[arg(long = "model", default_value = "default")]
    pub models: Vec<ModelSource>,
    /// Address of the API.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Ledger, credentials (default: $TIDAL_DATA_DIR, else ~/.local/share/tidal).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Use this PostgreSQL ledger instead of the SQLite file.
    #[arg(long, env = "TIDAL_DATABASE_URL")]
    pub postgres: Option<String>,
    /// Use this Redis as the broker (and rate-limit store) instead of the in-process one.
    #[arg(long, env = "TIDAL_REDIS_URL")]
    pub redis: Option<String>,
    /// Key prefix in Redis.
    #[arg(long, default_value = "tidal:")]
    pub key_prefix: String,
    /// KV cache memory of each worker, e.g. 512MiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub kv_cache_memory: usize,
    /// Most sequences a worker runs at once.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Token budget of one engine step.
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Kernel threads per worker (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Speculative decoding in every worker: off or ngram (prompt lookup: the continuation of
    /// the latest earlier occurrence of the last few tokens, verified in the same step; the
    /// tokens are the same either way, answers that quote their prompt come faster). A draft
    /// model belongs to one model: use `tidal runtime --speculative draft` for that.
    #[arg(long, default_value = "off")]
    pub speculative: SpeculativeMethod,
    /// Most tokens proposed for one sequence in one step under `--speculative ngram`.
    #[arg(long, default_value_t = SpeculativeConfig::default().num_speculative_tokens)]
    pub num_speculative_tokens: usize,
    /// Re-quantise weights at load: q4_0, q4_1, q8_0, f16, f32 or stored
    /// (default: as stored, Q5_1 matrices as Q8_0).
    #[arg(long)]
    pub quantize: Option<QuantizeTo>,
    /// A model with no request for this long is unloaded (scale to zero).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub scale_to_zero_after: Duration,
    /// Workers per model kept loaded even when idle (0: scale to zero): no request waits for
    /// a model load while traffic stays within them (docs/autoscaling.md, "Knobs").
    #[arg(long, default_value_t = 0)]
    pub min_workers: u32,
    /// A floor by time of day for every model, as a `Model`'s `floorSchedule` entry:
    /// `DAYS HH:MM-HH:MM MIN_WORKERS [ZONE]`, e.g. `Mon-Fri 08:00-19:00 1 Europe/Berlin`
    /// (DAYS `daily` or days and ranges such as `Sat,Sun`; ZONE an IANA name, UTC when left
    /// out): the workers stay loaded while the window holds. Repeat for more windows.
    #[arg(long = "floor-window", value_name = "WINDOW")]
    pub floor_windows: Vec<FloorWindow>,
    /// Most workers per model (each loads its own copy of the model); with --pool-memory,
    /// most workers of the pool.
    #[arg(long, default_value_t = 1)]
    pub max_workers: u32,
    /// Serve every model from one warm pool of workers instead of a fleet per model: each
    /// worker holds the models with traffic, up to this much memory for their weights, KV
    /// caches and activations (e.g. 8GiB), loads a model when a request for it arrives and
    /// unloads it after --pool-idle-unload-after idle; the pool scales with the models'
    /// summed demand (--min-workers, --max-workers, --scale-to-zero-after apply to it).
    #[arg(long, value_parser = parse_bytes)]
    pub pool_memory: Option<usize>,
    /// A model idle on a pool worker this long is unloaded (it stays in the page cache).
    #[arg(long, default_value = "1m", value_parser = parse_duration, requires = "pool_memory")]
    pub pool_idle_unload_after: Duration,
    /// Queued plus running requests one worker is sized for.
    #[arg(long, default_value_t = 32.0)]
    pub target_in_flight: f64,
    /// One worker's prefill rate in prompt tokens/s (`tidal bench profile` measures it): with
    /// several workers, also size for the prompt tokens of each `--ttft-target` (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub prefill_tokens_per_second: f64,
    /// What a request whose first token is out (only decoding) weighs in a worker's load,
    /// against one waiting for prefill, 0 to 1 (`decodingWeight`; 1: every request alike).
    #[arg(long, default_value_t = ScalingSpec::default().decoding_weight)]
    pub decoding_weight: f64,
    /// The time to first token that `--prefill-tokens-per-second` sizes for.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub ttft_target: Duration,
    /// Longest a request waits for a worker, cold start included, before a 503.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub max_queue_wait: Duration,
    /// Most queued requests per model before a 503.
    #[arg(long, default_value_t = 1000)]
    pub backlog_cap: u64,
    /// How long a stopping worker lets running requests finish.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// Workers claim only while the prefill they have queued takes less than this at their
    /// measured prefill rate (see `tidal runtime --help`; `0s`: whatever fits).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub claim_prefill_budget: Duration,
    /// A fixed claim budget in prompt tokens, overriding `--claim-prefill-budget`.
    #[arg(long)]
    pub claim_prefill_budget_tokens: Option<std::num::NonZeroUsize>,
    /// Price per million prompt tokens, in micro-units of the currency.
    #[arg(long, default_value_t = 100_000)]
    pub input_price: u64,
    /// Price per million prompt tokens served from the prefix cache, in micro-units.
    #[arg(long, default_value_t = 50_000)]
    pub cached_input_price: u64,
    /// Price per million completion tokens, in micro-units.
    #[arg(long, default_value_t = 400_000)]
    pub output_price: u64,
    /// ISO 4217 currency of the prices.
    #[arg(long, default_value = "USD")]
    pub currency: String,
}

/// Runs the platform until Ctrl-C or SIGTERM.
pub fn run(args: UpArgs) -> anyhow::Result<()> {
    let prometheus = PrometheusBuilder::new()
        .set_buckets(&[
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ])
        .context("configuring metrics")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    let scaling = ScalingSpec {
        min_replicas: args.min_workers,
        max_replicas: args.max_workers,
        target_in_flight_per_replica: args.target_in_flight,
        scale_to_zero_after: args.scale_to_zero_after,
        prefill_tokens_per_second: args.prefill_tokens_per_second,
        ttft_target: args.ttft_target,
        decoding_weight: args.decoding_weight,
        floor_schedule: args.floor_windows,
        ..ScalingSpec::default()
    };
    scaling.validate().context(
        "scaling settings (--min-workers, --max-workers, --floor-window, --decoding-weight, ...)",
    )?;
    if args.speculative == SpeculativeMethod::Draft {
        anyhow::bail!(
            "--speculative draft needs a draft model of each model's vocabulary; tidal up takes \
             off or ngram (serve one model with `tidal runtime --speculative draft --draft-model PATH`)"
        );
    }
    let config = UpConfig {
        models: args.models,
        listen: args.listen,
        data_dir: args
            .data_dir
            .unwrap_or_else(tidal_local::paths::default_data_dir),
        ledger_url: args.postgres,
        redis_url: args.redis,
        key_prefix: args.key_prefix,
        fetch: FetchConfig::default(),
        engine: EngineConfig {
            kv_cache_memory: args.kv_cache_memory,
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: args.max_num_batched_tokens,
            threads: args.threads,
            speculative: SpeculativeConfig {
                method: args.speculative,
                num_speculative_tokens: args.num_speculative_tokens,
                ..SpeculativeConfig::default()
            },
            ..EngineConfig::default()
        },
        quantize: args.quantize,
        scaling,
        pool: args.pool_memory.map(|bytes| UpPool {
            worker_memory_bytes: bytes as u64,
            idle_unload_after: args.pool_idle_unload_after,
        }),
        prices: Prices {
            currency: args.currency,
            input_per_mtok_micros: args.input_price,
            cached_input_per_mtok_micros: args.cached_input_price,
            output_per_mtok_micros: args.output_price,
        },
        max_queue_wait: args.max_queue_wait,
        backlog_cap: args.backlog_cap,
        drain_timeout: args.drain_timeout,
        claim_budget: super::runtime::claim_budget(
            args.claim_prefill_budget,
            args.claim_prefill_budget_tokens,
        ),
        prometheus: Some(prometheus),
    };
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime
        .block_on(up::run(config, terminated(), print_banner))
        .context("tidal up")
}

fn print_banner(s: &Started) {
    let base = format!("http://{}/v1", s.addr);
    let key = &s.credentials.api_key;
    let model = s
        .models
        .first()
        .map(|(n, _)| n.as_str())
        .unwrap_or_default();
    let names: Vec<&str> = s.models.iter().map(|(n, _)| n.as_str()).collect();
    println!();
    println!("Tidal is up at {base}");
    println!(
        "  models:  {} (scaled to zero until the first request)",
        names.join(", ")
    );
    println!("  ledger:  {}", s.ledger_url);
    println!(
        "  API key of tenant `{}`: {key}{}",
        s.credentials.tenant,
        if s.new_credentials { "  (new)" } else { "" }
    );
    println!("  admin token: {}", s.credentials.admin_token);
    println!();
    println!("Try it:");
    println!("  curl {base}/chat/completions \\");
    println!("    -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\");
    println!(
        "    -d '{{\"model\": \"{model}\", \"max_tokens\": 64, \"messages\": [{{\"role\": \"user\", \"content\": \"What is the capital of France?\"}}]}}'"
    );
    println!();
    println!("  python3 -c 'from openai import OpenAI");
    println!("  c = OpenAI(base_url=\"{base}\", api_key=\"{key}\")");
    println!("  r = c.chat.completions.create(model=\"{model}\", max_tokens=64, messages=[{{\"role\": \"user\", \"content\": \"Hello!\"}}])");
    println!("  print(r.choices[0].message.content)'");
    println!();
    println!("  tidal status        models, workers, backlog, this month's usage");
    println!("  tidal report        this month's usage report of tenant `local`");
    println!();
}
