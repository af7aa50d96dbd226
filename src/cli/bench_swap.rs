//! `tidal bench swap`: how long a pool worker takes from a load command to the first token
//! of a request that was waiting for the model, with the model file (a) in the page cache,
//! (b) on local disk with its pages dropped from the page cache, and, for comparison,
//! (c) a new `tidal runtime --model` process answering its first completion (a pod start
//! without the image pull and the scheduling).

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use tidal_queue::{Broker, Job, MemoryBroker};
use tidal_runtime::bench::median;
use tidal_runtime::worker::bench::fixed_length_job;
use tidal_runtime::worker::pool::host_cache::{evict, resident_fraction};
use tidal_runtime::worker::pool::{ModelDir, PoolConfig, PoolHandle, PoolWorker};

use super::engine_args::EngineArgs;

/// The model's id inside the benchmark's model directory.
const MODEL_ID: &str = "swap";

/// Flags of `tidal bench swap`.
#[derive(Args, Debug)]
pub struct SwapArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Rounds of each case; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Skip case (c), the new process.
    #[arg(long)]
    pub no_process: bool,
    /// Port of the process started in case (c).
    #[arg(long, default_value_t = 18931)]
    pub port: u16,
}

/// One case's rounds.
#[derive(Default, serde::Serialize)]
struct Case {
    /// Load command (or process start) to first token, seconds, per round.
    first_token_s: Vec<f64>,
    /// Of that, the load itself (file to running engine), per round.
    load_s: Vec<f64>,
    /// Share of the file's pages resident before the round.
    resident_before: Vec<f64>,
}

impl Case {
    fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "first_token_median_s": median(self.first_token_s.clone()),
            "load_median_s": if self.load_s.is_empty() { None } else { Some(median(self.load_s.clone())) },
            "resident_before_median": median(self.resident_before.clone()),
            "rounds": self,
        })
    }
}

/// A completion job for the benchmark's model: one token of a short text prompt.
fn one_token_job() -> Job {
    let mut job = fixed_length_job(MODEL_ID, &[], 1);
    job.body = serde_json::json!({
        "kind": "completion",
        "request": {
            "model": MODEL_ID,
            "prompt": "The tide comes in and goes out twice a day",
            "max_tokens": 1,
            "temperature": 0.0,
            "stream": true,
        }
    });
    job
}

/// Reads the whole file (its pages come into the page cache).
fn warm(path: &Path) -> anyhow::Result<()> {
    let mut f = std::fs::File::open(path)?;
    std::io::copy(&mut f, &mut std::io::sink())?;
    Ok(())
}

/// One round in the pool worker: a request waits, the load command comes, the first token
/// is out; then the model is unloaded.
async fn pool_round(
    broker: &Arc<dyn Broker>,
    pool: &PoolHandle,
    case: &mut Case,
    path: &Path,
) -> anyhow::Result<()> {
    case.resident_before
        .push(resident_fraction(path).unwrap_or(f64::NAN));
    let job = one_token_job();
    broker.enqueue(&job).await?;
    let started = Instant::now();
    let load_s = pool.load(MODEL_ID).await?;
    let first = broker
        .read_responses(job.id, 0, 1, Duration::from_secs(120))
        .await?;
    let took = started.elapsed().as_secs_f64();
    anyhow::ensure!(!first.is_empty(), "no token within 120 s");
    case.first_token_s.push(took);
    case.load_s.push(load_s);
    pool.unload(MODEL_ID).await?;
    Ok(())
}

/// Starts `tidal runtime --model` and times it to its first completion.
async fn process_round(args: &SwapArgs, path: &Path, case: &mut Case) -> anyhow::Result<()> {
    case.resident_before
        .push(resident_fraction(path).unwrap_or(f64::NAN));
    let exe = std::env::current_exe().context("finding the tidal binary")?;
    let e = &args.engine;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("runtime")
        .arg("--model")
        .arg(path)
        .arg("--model-name")
        .arg(MODEL_ID)
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", args.port))
        .arg("--kv-cache-memory")
        .arg(e.kv_cache_memory.to_string())
        .arg("--max-num-seqs")
        .arg(e.max_num_seqs.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(t) = e.threads {
        cmd.arg("--threads").arg(t.to_string());
    }
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{}/v1/completions", args.port);
    let body = serde_json::json!({
        "model": MODEL_ID,
        "prompt": "The tide comes in and goes out twice a day",
        "max_tokens": 1,
        "temperature": 0.0,
    });
    let started = Instant::now();
    let mut child = cmd.spawn().context("starting tidal runtime")?;
    let deadline = started + Duration::from_secs(120);
    loop {
        anyhow::ensure!(Instant::now() < deadline, "no answer within 120 s");
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("tidal runtime exited with {status}");
        }
        // Refused connections and 503s (still loading) are retried; any other answer ends it.
        if let Ok(r) = client
            .post(&url)
            .json(&body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
        {
            if r.status().is_success() {
                break;
            }
            if r.status() != reqwest::StatusCode::SERVICE_UNAVAILABLE {
                let status = r.status();
                anyhow::bail!("tidal runtime answered {status}: {}", r.text().await?);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    case.first_token_s.push(started.elapsed().as_secs_f64());
    child.kill().await.context("stopping tidal runtime")?;
    Ok(())
}

/// Runs the three cases and prints one JSON object.
pub fn run(args: SwapArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime.block_on(measure(args))
}

async fn measure(args: SwapArgs) -> anyhow::Result<()> {
    let file = args.engine.model_path()?.canonicalize()?;
    let bytes = std::fs::metadata(&file)?.len();
    args.engine.prepare()?;
    // The model directory: one link to the file, under the benchmark's id.
    let dir = std::env::temp_dir().join(format!("tidal-bench-swap-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let link = dir.join(format!("{MODEL_ID}.gguf"));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&file, &link)?;
    let result = measure_in(&args, &file, &dir, bytes).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn measure_in(args: &SwapArgs, file: &Path, dir: &Path, bytes: u64) -> anyhow::Result<()> {
    let broker: Arc<dyn Broker> = Arc::new(MemoryBroker::default());
    let mut config = PoolConfig::new("bench", "bench-worker", u64::MAX / 2);
    config.engine = args.engine.engine_config();
    config.quantize = args.engine.quantize;
    config.worker.drain_timeout = Duration::from_secs(10);
    let worker = PoolWorker::new(config, ModelDir::open(dir)?, broker.clone())?;
    let pool = worker.handle();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    // A first load and unload outside the rounds (allocator and kernels warmed up).
    pool.load(MODEL_ID).await?;
    pool.unload(MODEL_ID).await?;

    let (mut cached, mut disk, mut process) = (Case::default(), Case::default(), Case::default());
    for round in 0..args.rounds {
        warm(file)?;
        pool_round(&broker, &pool, &mut cached, file).await?;
        evict(file).with_context(|| format!("dropping {} from the page cache", file.display()))?;
        pool_round(&broker, &pool, &mut disk, file).await?;
        if !args.no_process {
            warm(file)?;
            process_round(args, file, &mut process).await?;
        }
        eprintln!(
            "round {}: page cache {:.3} s, disk {:.3} s{}",
            round + 1,
            cached.first_token_s[round],
            disk.first_token_s[round],
            process
                .first_token_s
                .get(round)
                .map(|s| format!(", new process {s:.3} s"))
                .unwrap_or_default()
        );
    }
    drop(stop);
    let _ = task.await;
    let report = serde_json::json!({
        "bench": "swap",
        "model": file.display().to_string(),
        "bytes": bytes,
        "threads": args.engine.threads,
        "kv_cache_memory": args.engine.kv_cache_memory,
        "page_cache": cached.summary(),
        "disk": disk.summary(),
        "process": if args.no_process { serde_json::Value::Null } else { process.summary() },
    });
    println!("{report}");
    Ok(())
}
