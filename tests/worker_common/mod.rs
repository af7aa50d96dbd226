//! Support of the worker-process tests: `tidal runtime --queue` processes on the real
//! default model against the test Redis, a gateway-like driver (enqueue jobs, read every
//! response stream concurrently), an undisturbed in-process reference run, and the checks
//! of design.md's invariants on streams and usage.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tidal_queue::{
    Broker, BrokerConfig, Job, MemoryBroker, RedisBroker, ResponseEvent, UsageEvent,
};
use tidal_runtime::engine::EngineConfig;
use tidal_runtime::load::load_model;
use tidal_runtime::worker::bench::fixed_length_job;
use tidal_runtime::worker::{Worker, WorkerConfig};
use uuid::Uuid;

pub use super::process::{default_model, free_port};

pub const MODEL_ID: &str = "ns/smol";
pub const MAX_TOKENS: usize = 32;

/// A Redis key prefix for one test run; its keys are deleted on drop.
pub struct Queue {
    pub url: String,
    pub prefix: String,
    pub broker: Arc<dyn Broker>,
}

impl Queue {
    /// A prefix on the shared test Redis.
    pub async fn new(test: &str) -> Self {
        let url = tidal_queue::testing::ensure_redis()
            .await
            .expect("test Redis");
        Queue::on(&url, test).await
    }

    /// A prefix on the Redis at `url`.
    pub async fn on(url: &str, test: &str) -> Self {
        let url = url.to_owned();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let prefix = format!("tidal-{test}-{}-{nanos}:", std::process::id());
        let config = BrokerConfig {
            prefix: prefix.clone(),
            ..BrokerConfig::default()
        };
        let broker = Arc::new(RedisBroker::connect(&url, config).await.unwrap());
        Queue {
            url,
            prefix,
            broker,
        }
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        tidal_queue::testing::delete_prefix(&self.url, &self.prefix);
    }
}

/// A `tidal runtime --queue` process; killed on drop. Its log goes to a file shown when a
/// test fails.
pub struct WorkerProcess {
    pub name: String,
    /// Port of its `/health`, `/metrics` and `/drain`.
    pub port: u16,
    child: Child,
    pub log: PathBuf,
}

impl WorkerProcess {
    pub fn start(
        model: &Path,
        queue: &Queue,
        name: &str,
        drain_timeout: &str,
        claim_timeout: &str,
    ) -> Self {
        Self::start_with(model, queue, name, drain_timeout, claim_timeout, 10)
    }

    /// [`WorkerProcess::start`] with room for `max_num_seqs` sequences (and as many jobs).
    pub fn start_with(
        model: &Path,
        queue: &Queue,
        name: &str,
        drain_timeout: &str,
        claim_timeout: &str,
        max_num_seqs: usize,
    ) -> Self {
        let log =
            std::env::temp_dir().join(format!("{}{name}.log", queue.prefix.replace(':', "-")));
        let file = std::fs::File::create(&log).unwrap();
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_tidal"))
            .args(["runtime", "--model"])
            .arg(model)
            .args(["--queue", &queue.url, "--queue-prefix", &queue.prefix])
            .args(["--model-id", MODEL_ID, "--worker-name", name])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--threads", "1", "--kv-cache-memory", "256MiB"])
            .args(["--max-num-seqs", &max_num_seqs.to_string()])
            .args([
                "--drain-timeout",
                drain_timeout,
                "--claim-timeout",
                claim_timeout,
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        WorkerProcess {
            name: name.into(),
            port,
            child,
            log,
        }
    }

    /// Sends a signal by number (9 SIGKILL, 15 SIGTERM).
    pub fn signal(&self, sig: i32) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit; its exit code.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit:\n{}",
                self.name,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- log of {} ---\n{}", self.name, self.log_text());
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Waits until every named worker has sent a heartbeat (its model is loaded).
pub async fn wait_ready(broker: &dyn Broker, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let beats = broker.workers(MODEL_ID).await.unwrap();
        if names
            .iter()
            .all(|n| beats.iter().any(|b| b.worker == *n && !b.draining))
        {
            return;
        }
        assert!(Instant::now() < deadline, "workers not ready: {beats:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// 20 streaming greedy chat requests (fixed length), as the gateway enqueues them.
pub fn jobs(n: usize) -> Vec<Job> {
    (0..n)
        .map(|i| {
            let mut job = fixed_length_job(MODEL_ID, &[1], MAX_TOKENS);
            job.tenant = format!("tenant-{}", i % 3);
            job.body = serde_json::json!({"kind": "chat", "request": {
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": format!("Tell me fact number {i} about the sea.")}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "ignore_eos": true,
                "stream": true,
            }});
            job
        })
        .collect()
}

/// Runs `jobs` undisturbed through an in-process worker (same model and engine settings
/// as the processes); the events of each stream.
pub async fn reference_run(model: &Path, jobs: &[Job]) -> Vec<Vec<ResponseEvent>> {
    let config = EngineConfig {
        kv_cache_memory: 256 << 20,
        max_num_seqs: 10,
        threads: Some(1),
        ..EngineConfig::default()
    };
    let path = model.to_owned();
    let loaded = tokio::task::spawn_blocking(move || load_model(&path, config, None))
        .await
        .unwrap()
        .unwrap();
    let broker: Arc<dyn Broker> = Arc::new(MemoryBroker::default());
    let worker = Worker::new(
        Arc::new(loaded.into_model()),
        broker.clone(),
        WorkerConfig::new(MODEL_ID, "reference"),
    )
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    for j in jobs {
        broker.enqueue(j).await.unwrap();
    }
    let counter = Arc::new(AtomicU64::new(0));
    let out = read_all(broker.clone(), jobs, counter).await;
    let _ = stop.send(());
    running.await.unwrap();
    out
}

/// A response event and when the reader received it.
pub type Timed = (Instant, ResponseEvent);

/// Pause after a failed read, as the gateway's relay makes.
const READ_RETRY: Duration = Duration::from_millis(200);

/// Reads request `id`'s stream as a gateway does (reconnecting from the last seq, retrying
/// failed reads) until its last event, adding delivered tokens to `counter`.
async fn read_stream(broker: Arc<dyn Broker>, id: Uuid, counter: Arc<AtomicU64>) -> Vec<Timed> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut out: Vec<Timed> = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "stream {id} incomplete: {out:?}");
        let after = out.last().map_or(0, |(_, e)| e.seq());
        let page = match broker
            .read_responses(id, after, 100, Duration::from_millis(500))
            .await
        {
            Ok(page) => page,
            Err(_) => {
                tokio::time::sleep(READ_RETRY).await;
                continue;
            }
        };
        let at = Instant::now();
        for ev in &page {
            if let ResponseEvent::Delta { token_ids, .. } = ev {
                counter.fetch_add(token_ids.len() as u64, Ordering::Relaxed);
            }
        }
        let end = page.iter().any(ResponseEvent::is_terminal);
        out.extend(page.into_iter().map(|e| (at, e)));
        if end {
            return out;
        }
    }
}

/// Reads every job's stream concurrently.
pub async fn read_all(
    broker: Arc<dyn Broker>,
    jobs: &[Job],
    counter: Arc<AtomicU64>,
) -> Vec<Vec<ResponseEvent>> {
    read_all_timed(broker, jobs, counter)
        .await
        .into_iter()
        .map(|s| s.into_iter().map(|(_, e)| e).collect())
        .collect()
}

/// Reads every job's stream concurrently, with the time each event arrived.
pub async fn read_all_timed(
    broker: Arc<dyn Broker>,
    jobs: &[Job],
    counter: Arc<AtomicU64>,
) -> Vec<Vec<Timed>> {
    let readers: Vec<_> = jobs
        .iter()
        .map(|j| tokio::spawn(read_stream(broker.clone(), j.id, counter.clone())))
        .collect();
    let mut out = Vec::new();
    for r in readers {
        out.push(r.await.unwrap());
    }
    out
}

/// The events of timed streams.
pub fn untimed(streams: &[Vec<Timed>]) -> Vec<Vec<ResponseEvent>> {
    streams
        .iter()
        .map(|s| s.iter().map(|(_, e)| e.clone()).collect())
        .collect()
}

/// For the streams not finished at `fault`, the longest wait from `from` to the first event
/// after `fault` (zero for one that came before `from`); `None` when every stream had ended
/// by `fault`.
pub fn longest_resumption(
    streams: &[Vec<Timed>],
    fault: Instant,
    from: Instant,
) -> Option<Duration> {
    streams
        .iter()
        .filter(|s| !s.iter().any(|(at, e)| *at <= fault && e.is_terminal()))
        .filter_map(|s| s.iter().find(|(at, _)| *at > fault))
        .map(|(at, _)| at.saturating_duration_since(from))
        .max()
}

/// Waits until every job is acked (a worker acks after writing `done` and publishing the
/// segment's usage, so a reader can see `done` a moment before the usage event exists).
pub async fn wait_settled(broker: &dyn Broker) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // A failed read (the test's own connection to a Redis that restarted) is retried.
        let d = broker.depth(MODEL_ID).await;
        if d.as_ref().is_ok_and(|d| (d.backlog, d.in_flight) == (0, 0)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "jobs still queued or held: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[allow(unused_imports)] // not every test crate that shares this module reads usage
pub use tidal_queue::testing::drain_usage as usage_events;

fn deltas(events: &[ResponseEvent]) -> (Vec<u32>, String) {
    let mut ids = Vec::new();
    let mut text = String::new();
    for ev in events {
        if let ResponseEvent::Delta {
            text: t, token_ids, ..
        } = ev
        {
            ids.extend_from_slice(token_ids);
            text.push_str(t);
        }
    }
    (ids, text)
}

fn done_usage(events: &[ResponseEvent]) -> tidal_queue::Usage {
    match events.last() {
        Some(ResponseEvent::Done { usage, .. }) => *usage,
        other => panic!("stream does not end with done: {other:?}"),
    }
}

/// Checks design.md's promises for every request: one complete stream (seqs 1, 2, ... with
/// no gap, deltas then `done`) whose tokens and text are the undisturbed greedy run's, and
/// usage events (deduplicated by request and segment, as billing does) that bill the prompt
/// once and exactly the delivered tokens. Returns the segments each request ran in.
pub fn check_streams_and_billing(
    jobs: &[Job],
    got: &[Vec<ResponseEvent>],
    want: &[Vec<ResponseEvent>],
    usage: &[UsageEvent],
) -> BTreeMap<Uuid, usize> {
    let mut by: BTreeMap<Uuid, BTreeMap<u32, &UsageEvent>> = BTreeMap::new();
    for e in usage {
        by.entry(e.request_id)
            .or_default()
            .entry(e.segment)
            .or_insert(e);
    }
    let mut segments = BTreeMap::new();
    for ((job, got), want) in jobs.iter().zip(got).zip(want) {
        let seqs: Vec<u64> = got.iter().map(ResponseEvent::seq).collect();
        let consecutive: Vec<u64> = (1..=got.len() as u64).collect();
        assert_eq!(seqs, consecutive, "request {}: seqs", job.id);
        assert!(got[..got.len() - 1]
            .iter()
            .all(|e| matches!(e, ResponseEvent::Delta { .. })));
        let (ids, text) = deltas(got);
        let (want_ids, want_text) = deltas(want);
        assert_eq!(ids.len(), MAX_TOKENS, "request {}", job.id);
        assert_eq!(ids, want_ids, "request {}: token ids", job.id);
        assert_eq!(text, want_text, "request {}: text", job.id);
        let (u, w) = (done_usage(got), done_usage(want));
        assert_eq!(u.completion_tokens, ids.len() as u64);
        assert_eq!(u.prompt_tokens, w.prompt_tokens);
        let segs = by
            .get(&job.id)
            .unwrap_or_else(|| panic!("request {} was not billed", job.id));
        let prompt: u64 = segs.values().map(|e| e.prompt_tokens).sum();
        let completion: u64 = segs.values().map(|e| e.completion_tokens).sum();
        assert_eq!(
            (prompt, completion),
            (w.prompt_tokens, ids.len() as u64),
            "request {}: billed {segs:?}",
            job.id
        );
        assert!(segs
            .values()
            .all(|e| e.tenant == job.tenant && e.model == MODEL_ID));
        segments.insert(job.id, segs.len());
    }
    segments
}
