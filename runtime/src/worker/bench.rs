//! Benchmark driver behind `tidal bench worker`: concurrent requests sent through a queue
//! worker the way the gateway sends them (enqueue a job, read its response stream), so
//! the queue path can be compared with the engine alone (`crate::bench::concurrency`) on the
//! same model and load.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tidal_queue::clock::system_now_ms;
use tidal_queue::{Broker, Job, QueueError, ResponseEvent};
use uuid::Uuid;

use super::{ClaimBudget, Worker, WorkerConfig, WorkerError, WorkerSummary};
use crate::server::LoadedModel;

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum WorkerBenchError {
    /// The broker failed.
    #[error("broker: {0}")]
    Queue(#[from] QueueError),
    /// The worker refused its settings.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// A request ended with an error event.
    #[error("request failed: {0}")]
    Request(String),
    /// A reader task panicked.
    #[error("reader task failed")]
    Reader,
}

/// Throughput and latency of one batch of requests through a worker.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerBenchReport {
    /// Which broker carried them.
    pub broker: String,
    /// Requests, all enqueued at once.
    pub requests: usize,
    /// Completion tokens received over all requests.
    pub completion_tokens: u64,
    /// Response events read (fewer than tokens when deltas were coalesced).
    pub response_events: u64,
    /// From the first enqueue to the last `done`.
    pub wall_time: Duration,
    /// `completion_tokens / wall_time`.
    pub aggregate_tokens_per_second: f64,
    /// Median time from enqueue to the first token.
    pub median_time_to_first_token: Duration,
    /// Median time from enqueue to `done`.
    pub median_latency: Duration,
}

/// A greedy fixed-length completion job (token prompt, `ignore_eos`) for `model`.
pub fn fixed_length_job(model: &str, prompt: &[u32], max_tokens: usize) -> Job {
    let request = serde_json::json!({
        "kind": "completion",
        "request": {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": true,
            "stream": true,
        }
    });
    Job {
        id: Uuid::now_v7(),
        tenant: "bench".into(),
        model: model.into(),
        body: request,
        enqueued_at_ms: system_now_ms(),
        deadline_ms: 0,
        resume: None,
    }
}

struct Timing {
    first_token: Duration,
    total: Duration,
    tokens: u64,
    events: u64,
}

async fn read_stream(
    broker: Arc<dyn Broker>,
    id: Uuid,
    started: Instant,
) -> Result<Timing, WorkerBenchError> {
    let mut after = 0;
    let mut first = None;
    let mut tokens = 0;
    let mut events = 0;
    loop {
        let page = broker
            .read_responses(id, after, 1000, Duration::from_secs(5))
            .await?;
        for ev in page {
            after = ev.seq();
            events += 1;
            match ev {
                ResponseEvent::Delta { token_ids, .. } => {
                    if first.is_none() && !token_ids.is_empty() {
                        first = Some(started.elapsed());
                    }
                    tokens += token_ids.len() as u64;
                }
                ResponseEvent::Done { .. } => {
                    let total = started.elapsed();
                    broker.delete_responses(id).await?;
                    return Ok(Timing {
                        first_token: first.unwrap_or(total),
                        total,
                        tokens,
                        events,
                    });
                }
                ResponseEvent::Error { message, .. } => {
                    return Err(WorkerBenchError::Request(message))
                }
            }
        }
    }
}

/// Enqueues one job per prompt and starts a reader of each response stream (times counted
/// from `started`).
async fn enqueue_all(
    broker: &Arc<dyn Broker>,
    model_id: &str,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    started: Instant,
) -> Result<Vec<tokio::task::JoinHandle<Result<Timing, WorkerBenchError>>>, WorkerBenchError> {
    let mut readers = Vec::new();
    for prompt in prompts {
        let job = fixed_length_job(model_id, prompt, max_tokens);
        broker.enqueue(&job).await?;
        readers.push(tokio::spawn(read_stream(broker.clone(), job.id, started)));
    }
    Ok(readers)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    at_fraction(&v, 0.5)
}

/// The value at fraction `q` of `sorted` (index `⌊q · n⌋`, the last for `q = 1`).
fn at_fraction(sorted: &[Duration], q: f64) -> Duration {
    let i = ((q * sorted.len() as f64) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or_default()
}

/// Enqueues one job per prompt at once (greedy, `max_tokens` each, every token generated),
/// serves them with a worker on `broker`, and reads every response stream to its end.
pub async fn bench_worker(
    model: Arc<LoadedModel>,
    broker: Arc<dyn Broker>,
    broker_name: &str,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Result<WorkerBenchReport, WorkerBenchError> {
    let model_id = format!("bench-{}", Uuid::now_v7());
    let mut config = WorkerConfig::new(model_id.clone(), "bench-worker");
    config.max_jobs = Some(prompts.len().max(1));
    // The engine alone gets every request at once; so does the worker, so that the two
    // differ only by the queue path.
    config.claim_budget = ClaimBudget::Off;
    config.claim_block = Duration::from_millis(100);
    let (stop, running) = spawn_bench_worker(model, broker.clone(), config)?;
    let started = Instant::now();
    let readers = enqueue_all(&broker, &model_id, prompts, max_tokens, started).await?;
    let mut timings = Vec::new();
    for r in readers {
        timings.push(r.await.map_err(|_| WorkerBenchError::Reader)??);
    }
    let wall_time = started.elapsed();
    let _ = stop.send(());
    let _ = running.await;
    broker.purge_model(&model_id).await?;
    let completion_tokens: u64 = timings.iter().map(|t| t.tokens).sum();
    Ok(WorkerBenchReport {
        broker: broker_name.to_owned(),
        requests: prompts.len(),
        completion_tokens,
        response_events: timings.iter().map(|t| t.events).sum(),
        wall_time,
        aggregate_tokens_per_second: completion_tokens as f64 / wall_time.as_secs_f64().max(1e-9),
        median_time_to_first_token: median(timings.iter().map(|t| t.first_token).collect()),
        median_latency: median(timings.iter().map(|t| t.total).collect()),
    })
}

/// Time to first token when a second worker comes up after a burst was queued: how a
/// worker's claim rule spreads the burst (`tidal bench scale-up`).
#[derive(Debug, Clone, Serialize)]
pub struct ScaleUpReport {
    /// Both workers' claim rule.
    pub claim_budget: ClaimBudget,
    /// Requests, all enqueued at once.
    pub requests: usize,
    /// When the second worker started, after the enqueue.
    pub second_worker_after: Duration,
    /// Jobs the worker that was already up claimed.
    pub claimed_by_first: u64,
    /// Jobs the worker that came later claimed.
    pub claimed_by_second: u64,
    /// Time from enqueue to the first token: median.
    pub median_time_to_first_token: Duration,
    /// Time from enqueue to the first token: 90th percentile.
    pub p90_time_to_first_token: Duration,
    /// Time from enqueue to the first token: the longest.
    pub max_time_to_first_token: Duration,
    /// From the enqueue to the last `done`.
    pub wall_time: Duration,
    /// Each engine's measured prefill rate at the end (first, second worker), tokens/s.
    pub prefill_tokens_per_s: [f64; 2],
}

/// A worker running as a task: the sender stops it (with its drain), the handle gives its
/// summary.
type RunningWorker = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<WorkerSummary>,
);

fn spawn_bench_worker(
    model: Arc<LoadedModel>,
    broker: Arc<dyn Broker>,
    config: WorkerConfig,
) -> Result<RunningWorker, WorkerBenchError> {
    let worker = Worker::new(model, broker, config)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    Ok((stop, running))
}

/// Enqueues one job per prompt at once while worker `first` is up, starts worker `second`
/// `second_after` later (a replica of a scale-up becoming ready), both claiming under
/// `budget`, and reads every response stream to its end.
pub async fn bench_scale_up(
    first: Arc<LoadedModel>,
    second: Arc<LoadedModel>,
    broker: Arc<dyn Broker>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    second_after: Duration,
    budget: ClaimBudget,
) -> Result<ScaleUpReport, WorkerBenchError> {
    let model_id = format!("bench-{}", Uuid::now_v7());
    let config = |name: &str| {
        let mut c = WorkerConfig::new(model_id.clone(), name);
        c.claim_block = Duration::from_millis(100);
        c.claim_budget = budget;
        c
    };
    let rates = [first.clone(), second.clone()];
    let (stop_first, first_run) = spawn_bench_worker(first, broker.clone(), config("first"))?;
    let started = Instant::now();
    let readers = enqueue_all(&broker, &model_id, prompts, max_tokens, started).await?;
    tokio::time::sleep(second_after.saturating_sub(started.elapsed())).await;
    let (stop_second, second_run) = spawn_bench_worker(second, broker.clone(), config("second"))?;
    let mut first_tokens = Vec::new();
    for r in readers {
        first_tokens.push(r.await.map_err(|_| WorkerBenchError::Reader)??.first_token);
    }
    let wall_time = started.elapsed();
    let _ = (stop_first.send(()), stop_second.send(()));
    let first_summary = first_run.await.map_err(|_| WorkerBenchError::Reader)?;
    let second_summary = second_run.await.map_err(|_| WorkerBenchError::Reader)?;
    broker.purge_model(&model_id).await?;
    first_tokens.sort();
    let rank = |q| at_fraction(&first_tokens, q);
    Ok(ScaleUpReport {
        claim_budget: budget,
        requests: prompts.len(),
        second_worker_after: second_after,
        claimed_by_first: first_summary.claimed,
        claimed_by_second: second_summary.claimed,
        median_time_to_first_token: rank(0.5),
        p90_time_to_first_token: rank(0.9),
        max_time_to_first_token: rank(1.0),
        wall_time,
        prefill_tokens_per_s: rates.map(|m| m.engine.stats().prefill_tokens_per_s),
    })
}
