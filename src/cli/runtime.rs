//! `tidal runtime`: one model, either behind the direct OpenAI-compatible HTTP server or,
//! with `--queue`, as a queue worker (with `/health` and `/metrics` on `--listen`).

use std::net::SocketAddr;
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
use tidal_runtime::worker::{probe, ClaimBudget, SharedPrefix, Worker, WorkerConfig};
use tokio::sync::watch;

use super::engine_args::{parse_duration, EngineArgs};

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
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    match args.worker.queue.clone() {
        Some(url) => runtime.block_on(run_worker(args, url)),
        None => runtime.block_on(serve(args)),
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

fn default_worker_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into());
    format!("{host}-{}", std::process::id())
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
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(addr = %listener.local_addr()?, "health and metrics listening");
    // Stopped gracefully after the worker is done, so a pending `/drain` gets its answer.
    let (probes_done, probes_stop) = watch::channel(false);
    let probe_server = tokio::spawn(
        axum::serve(listener, probe::router(probes.clone()))
            .with_graceful_shutdown(signalled(probes_stop))
            .into_future(),
    );

    let w = &args.worker;
    let mut config = WorkerConfig::new(
        w.model_id.clone().unwrap_or_else(|| model_name(&args)),
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
    let _ = probes_done.send(true);
    if tokio::time::timeout(Duration::from_secs(5), probe_server)
        .await
        .is_err()
    {
        tracing::warn!("health server did not stop in 5 s");
    }
    Ok(())
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
