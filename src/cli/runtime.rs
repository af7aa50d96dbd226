//! `tidal runtime`: one model, either behind the direct OpenAI-compatible HTTP server or,
//! with `--queue`, as a queue worker (with `/health` and `/metrics` on `--listen`); or, with
//! `--pool --queue --model-dir`, a pool worker holding the models its pool assigns it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::future::IntoFuture;

use anyhow::Context;
use clap::{Args, ValueEnum};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tidal_queue::{BrokerConfig, CapacityType, RedisBroker};
use tidal_runtime::memory::{self, gib, MemoryPlan};
use tidal_runtime::model::ModelFile;
use tidal_runtime::server::{router, ServerState};
use tidal_runtime::worker::pool::{ModelDir, PinnedModel, PoolConfig, PoolWorker};
use tidal_runtime::worker::{probe, ClaimBudget, SharedPrefix, Worker, WorkerConfig};
use tokio::sync::watch;

use super::engine_args::{parse_bytes, parse_duration, EngineArgs};

/// Flags of `tidal runtime`.
#[derive(Args, Debug)]
pub struct RuntimeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address of the HTTP server (worker mode: `/health` and `/metrics` only).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Name clients pass as `model` (default: the file name without `.gguf`).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Print the memory plan (weights, KV cache, activations and their total against the
    /// device's memory) from the file's header and exit: 0 when it fits, 1 when it does not.
    /// Nothing is loaded or allocated.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub worker: WorkerArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
}

/// Pool-mode flags: one worker holding the models its pool assigns it.
#[derive(Args, Debug)]
pub struct PoolArgs {
    /// Serve as a worker of this model pool instead of one model: hold the models assigned
    /// to this worker (`{prefix}pool:{pool}:assign`), loading them from --model-dir and
    /// unloading them (a drain) without restarting, and report memory and models in
    /// `{prefix}pool:{pool}:workers`. Needs --queue and --model-dir; takes no --model.
    #[arg(
        long,
        env = "TIDAL_POOL",
        requires_all = ["queue", "model_dir"],
        conflicts_with_all = ["model", "model_id", "model_name", "dry_run"]
    )]
    pub pool: Option<String>,
    /// Node-local directory of the models a pool worker may load: `{model}.gguf` files
    /// (`ns/name.gguf` for `ns/name`), or a `models.json` manifest mapping model ids to
    /// files and their SHA-256, checked before a file's first load; models given with
    /// --pool-model come first.
    #[arg(
        long,
        env = "TIDAL_POOL_MODEL_DIR",
        value_name = "DIR",
        requires = "pool"
    )]
    pub model_dir: Option<PathBuf>,
    /// A model of a pool worker and its GGUF file, `ID=PATH` (e.g.
    /// `ns/llama=ns/llama/model.gguf`; PATH absolute or relative to --model-dir).
    /// It takes precedence over the directory's `models.json` and `{model}.gguf` files, and
    /// is reported in the node cache while the file exists.
    #[arg(long, value_name = "ID=PATH", requires = "pool")]
    pub pool_model: Vec<String>,
    /// The SHA-256 of a --pool-model file, `ID=HEX` (64 hex digits), checked before its
    /// first load: a file that differs is never loaded. An ID without a --pool-model is
    /// refused at start.
    #[arg(long, value_name = "ID=HEX", requires = "pool")]
    pub pool_model_sha256: Vec<String>,
    /// Memory a pool worker's models may take, e.g. 60GiB: each loaded model counts its
    /// weights, KV cache (--kv-cache-memory) and activations, as its memory plan works them
    /// out from the file's header; a load that does not fit the memory left is refused
    /// before anything is allocated (default: the device's free memory at start).
    #[arg(long, value_parser = parse_bytes, requires = "pool")]
    pub worker_memory: Option<usize>,
    /// Bytes of unloaded models' files a pool worker keeps in the page cache; past it the
    /// least recently unloaded are dropped from it (they stay on disk). Default: as the
    /// kernel decides.
    #[arg(long, value_parser = parse_bytes, requires = "pool")]
    pub host_cache_bytes: Option<usize>,
    /// The node a pool worker runs on, reported in its pool heartbeat (default: the host
    /// name).
    #[arg(long, env = "NODE_NAME", requires = "pool")]
    pub node_name: Option<String>,
}

/// Capacity a worker runs on.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CapacityArg {
    /// Spot / preemptible nodes.
    Spot,
    /// On-demand nodes.
    OnDemand,
}

/// Worker-mode flags.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Pull jobs from this broker (`redis://host:port/db`) instead of serving requests
    /// directly.
    #[arg(long, env = "TIDAL_QUEUE")]
    pub queue: Option<String>,
    /// Prefix of the broker's keys.
    #[arg(long, default_value = "tidal:")]
    pub queue_prefix: String,
    /// Model id whose jobs to serve (default: --model-name, else the file name).
    #[arg(long)]
    pub model_id: Option<String>,
    /// This worker's consumer name, unique per model (default: host name and process id).
    #[arg(long, env = "TIDAL_WORKER_NAME")]
    pub worker_name: Option<String>,
    /// Capacity this worker runs on (reported in heartbeats and usage).
    #[arg(long, value_enum, default_value = "on-demand")]
    pub capacity_type: CapacityArg,
    /// On SIGTERM/SIGINT, how long running requests may take to finish before the rest are
    /// re-enqueued for another worker.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// A job not renewed by its worker for this long is taken over (same for every worker);
    /// the backstop for workers that never wrote a heartbeat.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub claim_timeout: Duration,
    /// How often this worker writes its heartbeat.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// Heartbeats a worker may miss before the other workers take its jobs over (same for
    /// every worker; their clocks must agree to well within interval × this).
    #[arg(long, default_value_t = 3)]
    pub missed_heartbeats: u32,
    /// How long a job retries its broker calls through a Redis outage before it is left
    /// to a takeover (default: --claim-timeout). Generation continues meanwhile and the
    /// stream resumes within about half a second of Redis answering again.
    #[arg(long, value_parser = parse_duration)]
    pub broker_retry: Option<Duration>,
    /// Most jobs held at once (default: --max-num-seqs).
    #[arg(long)]
    pub max_jobs: Option<usize>,
    /// Claim jobs only while the prefill queued in this worker takes less than this at the
    /// engine's measured prefill rate (one job at a time until it has measured it), so that
    /// a worker busy prefilling leaves new jobs to free workers and the queue's backlog
    /// shows the load. `0s`: no budget, claim whenever slots and KV blocks allow.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub claim_prefill_budget: Duration,
    /// A fixed budget in prompt tokens instead of `--claim-prefill-budget` (which it
    /// overrides).
    #[arg(long)]
    pub claim_prefill_budget_tokens: Option<std::num::NonZeroUsize>,
    /// Public prompt prefixes (system prompts) whose prefix-cache blocks every tenant
    /// shares: a JSON array of prompt texts, `{"system": "..."}` messages or
    /// `{"tokens": [...]}`. Without it each tenant's prompts are cached apart from every
    /// other tenant's, so no tenant can learn another's prompts from `cached_tokens`.
    #[arg(long, value_name = "PATH", conflicts_with = "shared_prefixes")]
    pub shared_prefix_file: Option<std::path::PathBuf>,
    /// The same list as `--shared-prefix-file`, given inline as JSON (the controller passes
    /// a Model's `runtime.sharedPrefixes` this way).
    #[arg(long, value_name = "JSON", env = "TIDAL_SHARED_PREFIXES")]
    pub shared_prefixes: Option<String>,
}

/// The public prefixes of `--shared-prefix-file` or `--shared-prefixes` (none without
/// either).
fn shared_prefixes(w: &WorkerArgs) -> anyhow::Result<Vec<SharedPrefix>> {
    if let Some(path) = &w.shared_prefix_file {
        let json =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        return SharedPrefix::parse_list(&json).with_context(|| format!("in {}", path.display()));
    }
    match &w.shared_prefixes {
        Some(json) => SharedPrefix::parse_list(json).context("in --shared-prefixes"),
        None => Ok(Vec::new()),
    }
}

/// The claim budget that `--claim-prefill-budget` and `--claim-prefill-budget-tokens` ask
/// for: the token count if given, else the duration (`0s`: off).
pub(super) fn claim_budget(
    duration: Duration,
    tokens: Option<std::num::NonZeroUsize>,
) -> ClaimBudget {
    match tokens {
        Some(n) => ClaimBudget::Tokens(n),
        None if duration.is_zero() => ClaimBudget::Off,
        None => ClaimBudget::Prefill(duration),
    }
}

fn prometheus() -> anyhow::Result<PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets(&[
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ])
        .context("configuring metrics")?
        .install_recorder()
        .context("installing the metrics recorder")
}

fn model_name(args: &RuntimeArgs) -> String {
    args.model_name.clone().unwrap_or_else(|| {
        args.engine
            .model
            .as_deref()
            .and_then(|m| m.file_stem())
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    })
}

/// Runs the direct server, or the worker when `--queue` is given.
pub fn run(args: RuntimeArgs) -> anyhow::Result<()> {
    if args.dry_run {
        return dry_run(&args.engine);
    }
    if args.pool.pool.is_none() {
        args.engine.model_path()?;
    }
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    match (args.worker.queue.clone(), args.pool.pool.clone()) {
        (Some(url), Some(pool)) => runtime.block_on(run_pool(args, url, pool)),
        (Some(url), None) => runtime.block_on(run_worker(args, url)),
        (None, _) => runtime.block_on(serve(args)),
    }
}

/// `--dry-run`: prints the memory plan and what it is checked against; an error (exit 1)
/// when it does not fit or the device cannot say how much memory it has.
fn dry_run(engine: &EngineArgs) -> anyhow::Result<()> {
    let path = engine.model_path()?;
    let file = ModelFile::open(path).with_context(|| format!("opening {}", path.display()))?;
    let config = engine.engine_config();
    let plan = MemoryPlan::for_file(&file, &config, engine.quantize)
        .with_context(|| format!("planning {}", path.display()))?;
    let available = match memory::available_for(&config) {
        Ok(a) => a,
        Err(e) => {
            print!("{plan}");
            return Err(e).context("the plan cannot be checked");
        }
    };
    match plan.check(&available) {
        Ok(spare) => {
            println!("{plan}{available}\nfits, with {} to spare", gib(spare));
            Ok(())
        }
        Err(does_not_fit) => {
            println!("{does_not_fit}");
            Err(anyhow::anyhow!(
                "{} does not fit {}",
                path.display(),
                config.device
            ))
        }
    }
}

/// Starts listening at once (health says 503 while loading), loads the model, then serves.
async fn serve(args: RuntimeArgs) -> anyhow::Result<()> {
    let name = model_name(&args);
    let state = ServerState::new(name.clone(), Some(prometheus()?));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(addr = %listener.local_addr()?, model = %name, "listening");
    let server = tokio::spawn(axum::serve(listener, router(state.clone())).into_future());
    let engine_args = args.engine.clone();
    let loaded = tokio::task::spawn_blocking(move || engine_args.load()).await??;
    state.set_loaded(loaded.into_model());
    server.await.context("server task")?.context("serving HTTP")
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into())
}

fn default_worker_name() -> String {
    format!("{}-{}", host_name(), std::process::id())
}

/// Turns true on the first SIGTERM or SIGINT (or `/drain`, through the returned sender); a
/// second signal ends the process at once.
fn shutdown_signal() -> anyhow::Result<(Arc<watch::Sender<bool>>, watch::Receiver<bool>)> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let (tx, rx) = watch::channel(false);
    let tx = Arc::new(tx);
    let switch = tx.clone();
    tokio::spawn(async move {
        for n in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if n == 0 {
                tracing::info!("shutdown signal: draining");
                let _ = tx.send(true);
            } else {
                tracing::warn!("second shutdown signal: exiting without draining");
                std::process::exit(1);
            }
        }
    });
    Ok((switch, rx))
}

async fn signalled(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Worker mode: probes first, then the broker and the model, then pull until signalled.
async fn run_worker(args: RuntimeArgs, url: String) -> anyhow::Result<()> {
    let (switch, shutdown) = shutdown_signal()?;
    let probes = probe::ProbeState::new(Some(prometheus()?), switch);
    let (probes_done, probe_server) = start_probes(&args, probes.clone()).await?;
    let config = worker_config(
        &args,
        args.worker
            .model_id
            .clone()
            .unwrap_or_else(|| model_name(&args)),
    )?;
    let w = &args.worker;
    let broker_config = BrokerConfig {
        prefix: w.queue_prefix.clone(),
        ..BrokerConfig::default()
    };
    let broker = RedisBroker::connect(&url, broker_config)
        .await
        .with_context(|| format!("connecting to the queue at {url}"))?;
    let engine_args = args.engine.clone();
    let load = tokio::task::spawn_blocking(move || engine_args.load());
    let loaded = tokio::select! {
        loaded = load => loaded.context("model loading task")??,
        _ = signalled(shutdown.clone()) => {
            tracing::info!("shutdown before the model was loaded");
            return Ok(());
        }
    };
    let worker = Worker::new(Arc::new(loaded.into_model()), Arc::new(broker), config)?;
    probes.set_worker(worker.status());
    let summary = worker.run(signalled(shutdown)).await;
    tracing::info!(?summary, "worker exited");
    stop_probes(probes_done, probe_server).await;
    Ok(())
}

/// Stops the probe server once the worker is done (a pending `/drain` gets its answer).
async fn stop_probes(
    done: watch::Sender<bool>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let _ = done.send(true);
    if tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .is_err()
    {
        tracing::warn!("health server did not stop in 5 s");
    }
}

/// The probe server on `--listen` and the switch that stops it.
async fn start_probes(
    args: &RuntimeArgs,
    probes: Arc<probe::ProbeState>,
) -> anyhow::Result<(
    watch::Sender<bool>,
    tokio::task::JoinHandle<std::io::Result<()>>,
)> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(addr = %listener.local_addr()?, "health and metrics listening");
    let (probes_done, probes_stop) = watch::channel(false);
    let server = tokio::spawn(
        axum::serve(listener, probe::router(probes))
            .with_graceful_shutdown(signalled(probes_stop))
            .into_future(),
    );
    Ok((probes_done, server))
}

/// Pool mode: probes, the broker, the model directory, then follow the assignment until
/// signalled (draining every model).
async fn run_pool(args: RuntimeArgs, url: String, pool: String) -> anyhow::Result<()> {
    let (switch, shutdown) = shutdown_signal()?;
    let probes = probe::ProbeState::new(Some(prometheus()?), switch);
    let (probes_done, probe_server) = start_probes(&args, probes.clone()).await?;
    let p = &args.pool;
    let dir_path = p.model_dir.clone().context("--pool needs --model-dir")?;
    let dir = ModelDir::with_pinned(&dir_path, pinned_models(p)?)?;
    let worker = worker_config(&args, format!("pool:{pool}"))?;
    args.engine.prepare()?;
    let engine = args.engine.engine_config();
    let memory = match p.worker_memory {
        Some(b) => b as u64,
        None => {
            memory::available_for(&engine)
                .context("the device's free memory is unknown: give --worker-memory")?
                .bytes as u64
        }
    };
    let mut config = PoolConfig::new(pool, worker.name.clone(), memory);
    config.worker = worker;
    config.engine = engine;
    config.quantize = args.engine.quantize;
    config.host_cache_bytes = p.host_cache_bytes.map(|b| b as u64);
    config.node = p.node_name.clone().unwrap_or_else(host_name);
    let broker_config = BrokerConfig {
        prefix: args.worker.queue_prefix.clone(),
        ..BrokerConfig::default()
    };
    let broker = RedisBroker::connect(&url, broker_config)
        .await
        .with_context(|| format!("connecting to the queue at {url}"))?;
    let worker = PoolWorker::new(config, dir, Arc::new(broker))?;
    probes.set_pool(worker.handle());
    let summaries = worker.run(signalled(shutdown)).await;
    tracing::info!(?summaries, "pool worker exited");
    stop_probes(probes_done, probe_server).await;
    Ok(())
}

/// The models of `--pool-model` with the checksums of `--pool-model-sha256`.
fn pinned_models(p: &PoolArgs) -> anyhow::Result<Vec<PinnedModel>> {
    Ok(PinnedModel::from_flags(
        &p.pool_model,
        &p.pool_model_sha256,
    )?)
}

/// The queue worker settings from the flags, for `model_id`.
fn worker_config(args: &RuntimeArgs, model_id: String) -> anyhow::Result<WorkerConfig> {
    let w = &args.worker;
    let mut config = WorkerConfig::new(
        model_id,
        w.worker_name.clone().unwrap_or_else(default_worker_name),
    );
    config.capacity_type = match w.capacity_type {
        CapacityArg::Spot => CapacityType::Spot,
        CapacityArg::OnDemand => CapacityType::OnDemand,
    };
    config.drain_timeout = w.drain_timeout;
    config.claim_timeout = w.claim_timeout;
    config.heartbeat_interval = w.heartbeat_interval;
    config.missed_heartbeats = w.missed_heartbeats;
    config.broker_retry = w.broker_retry;
    config.max_jobs = w.max_jobs;
    config.claim_budget = claim_budget(w.claim_prefill_budget, w.claim_prefill_budget_tokens);
    config.shared_prefixes = shared_prefixes(w)?;
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use tidal_runtime::worker::DEFAULT_CLAIM_BUDGET;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        worker: WorkerArgs,
    }

    fn budget(args: &[&str]) -> Result<ClaimBudget, clap::Error> {
        let cli = Cli::try_parse_from([&["tidal"], args].concat())?;
        let w = cli.worker;
        Ok(claim_budget(
            w.claim_prefill_budget,
            w.claim_prefill_budget_tokens,
        ))
    }

    #[test]
    fn claim_budget_flags() {
        assert_eq!(budget(&[]).unwrap(), DEFAULT_CLAIM_BUDGET);
        let ms = |n| ClaimBudget::Prefill(Duration::from_millis(n));
        assert_eq!(
            budget(&["--claim-prefill-budget", "250ms"]).unwrap(),
            ms(250)
        );
        assert_eq!(budget(&["--claim-prefill-budget", "2"]).unwrap(), ms(2000));
        assert_eq!(
            budget(&["--claim-prefill-budget", "0s"]).unwrap(),
            ClaimBudget::Off
        );
        let tokens = ClaimBudget::Tokens(std::num::NonZeroUsize::MIN.saturating_add(1468));
        for extra in [
            &[][..],
            &["--claim-prefill-budget", "0s"],
            &["--claim-prefill-budget", "3s"],
        ] {
            let args = [&["--claim-prefill-budget-tokens", "1469"][..], extra].concat();
            assert_eq!(budget(&args).unwrap(), tokens, "{args:?}");
        }
        for (bad, why) in [
            ("--claim-prefill-budget=soon", "not a duration"),
            ("--claim-prefill-budget=-1s", "not a duration"),
            ("--claim-prefill-budget=1 parsec", "unknown duration unit"),
            ("--claim-prefill-budget-tokens=0", "zero"),
        ] {
            let e = budget(&[bad]).unwrap_err().to_string();
            let flag = bad.split('=').next().unwrap_or_default();
            assert!(e.contains(flag) && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn pool_flags() {
        #[derive(Parser, Debug)]
        struct RuntimeCli {
            #[command(flatten)]
            runtime: RuntimeArgs,
        }
        let parse = |args: &[&str]| RuntimeCli::try_parse_from([&["tidal"], args].concat());
        let q = ["--queue", "redis://127.0.0.1:6379"];
        let cli = parse(
            &[
                &q[..],
                &[
                    "--pool",
                    "gpu",
                    "--model-dir",
                    "/models",
                    "--worker-memory",
                    "2GiB",
                ],
            ]
            .concat(),
        )
        .unwrap();
        let p = cli.runtime.pool;
        assert_eq!(p.pool.as_deref(), Some("gpu"));
        assert_eq!(p.worker_memory, Some(2 << 30));
        assert!(cli.runtime.engine.model.is_none());
        for (bad, why) in [
            (vec!["--pool", "gpu", "--model-dir", "/m"], "--queue"),
            (vec!["--pool", "gpu", "--queue", "redis://x"], "--model-dir"),
            (
                vec![
                    "--pool",
                    "gpu",
                    "--queue",
                    "redis://x",
                    "--model-dir",
                    "/m",
                    "--model",
                    "m.gguf",
                ],
                "cannot be used with",
            ),
            (vec!["--model", "m.gguf", "--model-dir", "/m"], "--pool"),
        ] {
            let e = parse(&bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        // Models pinned to files, with their checksums.
        let sum = "ab".repeat(32);
        let with_sum = format!("ns/a={sum}");
        let pinned = [
            "--pool",
            "gpu",
            "--queue",
            "redis://x",
            "--model-dir",
            "/m",
            "--pool-model",
            "ns/a=a.gguf",
            "--pool-model",
            "ns/b=/abs/b.gguf",
            "--pool-model-sha256",
            &with_sum,
        ];
        let cli = parse(&pinned).unwrap();
        let models = pinned_models(&cli.runtime.pool).unwrap();
        let got: Vec<(&str, &str, Option<&str>)> = models
            .iter()
            .map(|m| {
                let path = m.path.to_str().unwrap_or_default();
                (m.model.as_str(), path, m.sha256.as_deref())
            })
            .collect();
        assert_eq!(
            got,
            [
                ("ns/a", "a.gguf", Some(sum.as_str())),
                ("ns/b", "/abs/b.gguf", None)
            ]
        );
        let orphan = [&pinned[..6], &["--pool-model-sha256", &with_sum]].concat();
        let cli = parse(&orphan).unwrap();
        let e = pinned_models(&cli.runtime.pool).unwrap_err().to_string();
        assert!(e.contains("no --pool-model ns/a=PATH"), "{e}");
        let e = parse(&["--pool-model", "ns/a=a.gguf"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--pool"), "{e}");
        // Without --pool the model file stays required, with an error that names it.
        let cli = parse(&[]).unwrap();
        let e = cli.runtime.engine.model_path().unwrap_err().to_string();
        assert!(e.contains("--model"), "{e}");
    }

    #[test]
    fn shared_prefixes_inline_or_from_a_file() {
        let prefixes = |args: &[&str]| -> anyhow::Result<Vec<SharedPrefix>> {
            let cli = Cli::try_parse_from([&["tidal"], args].concat())?;
            shared_prefixes(&cli.worker)
        };
        assert!(prefixes(&[]).unwrap().is_empty());
        let inline = r#"[{"system": "Be brief."}, "<s>Hi"]"#;
        let want = vec![
            SharedPrefix::System("Be brief.".into()),
            SharedPrefix::Text("<s>Hi".into()),
        ];
        assert_eq!(prefixes(&["--shared-prefixes", inline]).unwrap(), want);
        let dir = std::env::temp_dir().join(format!("tidal-prefixes-{}", std::process::id()));
        std::fs::write(&dir, inline).unwrap();
        let file = dir.to_str().unwrap();
        assert_eq!(prefixes(&["--shared-prefix-file", file]).unwrap(), want);
        let both = prefixes(&["--shared-prefix-file", file, "--shared-prefixes", inline]);
        assert!(both
            .unwrap_err()
            .to_string()
            .contains("cannot be used with"));
        std::fs::remove_file(&dir).unwrap();
        let bad = prefixes(&["--shared-prefixes", r#"[{"user": "x"}]"#]).unwrap_err();
        assert!(format!("{bad:#}").contains("--shared-prefixes"), "{bad:#}");
    }
}
