//! Shared support of the in-process worker tests: brokers (in-process and real Redis), tiny
//! models, workers run as tasks (shut down, or dropped as a crash would), and readers that
//! check response streams and usage events the way the gateway and billing see them.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidal_queue::{
    Broker, BrokerConfig, Job, MemoryBroker, RedisBroker, ResponseEvent, UsageEvent,
};
use tidal_runtime::engine::{EngineConfig, GenerationEvent, GenerationRequest};
use tidal_runtime::load::load_model;
use tidal_runtime::model::{write_tiny_gguf, TinySpec};
use tidal_runtime::sampling::SamplingParams;
use tidal_runtime::server::LoadedModel;
use tidal_runtime::worker::bench::fixed_length_job;
use tidal_runtime::worker::{Worker, WorkerConfig, WorkerStatus, WorkerSummary};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// A broker for one test; Redis keys are deleted on drop, also when the test fails.
pub struct Harness {
    pub broker: Arc<dyn Broker>,
    redis: Option<(String, String)>,
}

impl Harness {
    pub fn memory() -> Self {
        Harness {
            broker: Arc::new(MemoryBroker::default()),
            redis: None,
        }
    }

    pub async fn redis() -> Self {
        let url = tidal_queue::testing::ensure_redis()
            .await
            .expect("test Redis");
        let prefix = format!("tidal-wtest-{}:", Uuid::now_v7());
        let config = BrokerConfig {
            prefix: prefix.clone(),
            ..BrokerConfig::default()
        };
        let broker = RedisBroker::connect(&url, config).await.unwrap();
        Harness {
            broker: Arc::new(broker),
            redis: Some((url, prefix)),
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some((url, prefix)) = &self.redis {
            tidal_queue::testing::delete_prefix(url, prefix);
        }
    }
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tiny model fast enough for many short requests.
pub fn fast_spec() -> TinySpec {
    TinySpec::default()
}

/// A tiny model with a long context whose tokens take a while (long generations to cut).
pub fn slow_spec() -> TinySpec {
    TinySpec {
        layers: 4,
        hidden: 256,
        ffn: 1024,
        heads: 4,
        kv_heads: 2,
        context: 4096,
        seed: 11,
        ..TinySpec::default()
    }
}

/// Loads a generated model into an engine (one kernel thread: the machine is shared).
pub fn tiny_model(spec: &TinySpec) -> (TempDir, Arc<LoadedModel>) {
    tiny_model_with(spec, 256)
}

/// A generated model whose engine computes one token per step (`max_num_batched_tokens`
/// 1), so a resumed sequence re-prefills its delivered tokens exactly as they were first
/// computed, one decode step each. The kernels' multi-token prefill differs from decode in
/// the last bits, which flips greedy near-ties of random tiny models (their logits are
/// nearly flat); these tests check the worker protocol, the engine's own tests check resume
/// with chunked prefill, and the process tests check it on the real model.
pub fn tiny_model_stepwise(spec: &TinySpec) -> (TempDir, Arc<LoadedModel>) {
    tiny_model_with(spec, 1)
}

fn tiny_model_with(spec: &TinySpec, max_num_batched_tokens: usize) -> (TempDir, Arc<LoadedModel>) {
    let dir = TempDir(std::env::temp_dir().join(format!("tidal-wtest-{}", Uuid::now_v7())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("tiny.gguf");
    write_tiny_gguf(&path, spec).unwrap();
    let config = EngineConfig {
        block_size: 16,
        kv_cache_memory: 64 << 20,
        max_num_batched_tokens,
        max_num_seqs: 16,
        enable_prefix_caching: true,
        threads: Some(1),
        kv_cache_dtype: Default::default(),
        device: Default::default(),
        device_memory: None,
        speculative: Default::default(),
    };
    let loaded = load_model(&path, config, None).unwrap();
    (dir, Arc::new(loaded.into_model()))
}

/// Worker settings for tests: short timeouts so takeovers and drains happen quickly.
pub fn test_config(model_id: &str, name: &str) -> WorkerConfig {
    let mut c = WorkerConfig::new(model_id, name);
    c.claim_timeout = Duration::from_millis(800);
    c.heartbeat_interval = Duration::from_millis(200);
    // presumed dead after as long as the claim timeout: a loaded 2-core machine can delay
    // a live worker's beats by more than two intervals
    c.missed_heartbeats = 4;
    c.cancel_poll_interval = Duration::from_millis(20);
    c.claim_block = Duration::from_millis(100);
    c.drain_timeout = Duration::ZERO;
    c
}

/// A worker running as a task.
pub struct Running {
    handle: JoinHandle<WorkerSummary>,
    stop: oneshot::Sender<()>,
    pub status: WorkerStatus,
}

pub fn spawn_worker(
    model: Arc<LoadedModel>,
    broker: Arc<dyn Broker>,
    config: WorkerConfig,
) -> Running {
    let worker = Worker::new(model, broker, config).unwrap();
    let status = worker.status();
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    Running {
        handle,
        stop,
        status,
    }
}

impl Running {
    /// Asks for shutdown and waits for the drain.
    pub async fn shutdown(self) -> WorkerSummary {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("worker drained in time")
            .unwrap()
    }

    /// Stops the worker dead, as SIGKILL would: no drain, no acks, no usage.
    pub async fn crash(self) -> WorkerSummary {
        let summary = self.status.summary();
        self.handle.abort();
        let _ = self.handle.await;
        summary
    }
}

/// A greedy completion job over token ids (every token generated).
pub fn job(model_id: &str, prompt: &[u32], max_tokens: usize) -> Job {
    fixed_length_job(model_id, prompt, max_tokens)
}

/// Distinct prompts of a few tokens inside the tiny vocabulary.
pub fn prompts(n: usize) -> Vec<Vec<u32>> {
    prompts_of(n, 6)
}

/// `n` distinct prompts of `len` tokens inside the tiny vocabulary.
pub fn prompts_of(n: usize, len: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..len)
                .map(|k| 2 + ((i * 7 + k * 13) % 90) as u32)
                .collect()
        })
        .collect()
}

/// What the engine alone produces for a greedy request: token ids and text.
pub async fn reference(
    model: &LoadedModel,
    prompt: &[u32],
    max_tokens: usize,
) -> (Vec<u32>, String) {
    let mut rx = model
        .engine
        .submit(GenerationRequest {
            prompt: prompt.to_vec(),
            max_tokens,
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            stop: vec![],
            stop_token_ids: vec![],
            ignore_eos: true,
            resume: None,
            cache_scope: Default::default(),
            num_speculative_tokens: None,
        })
        .unwrap();
    let (mut ids, mut text) = (Vec::new(), String::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            GenerationEvent::Delta {
                text: t, token_ids, ..
            } => {
                ids.extend(token_ids);
                text.push_str(&t);
            }
            GenerationEvent::Done { .. } => return (ids, text),
            GenerationEvent::Error { message } => panic!("{message}"),
        }
    }
    panic!("engine stopped");
}

pub use tidal_queue::testing::read_to_end;

/// Token ids and text of a stream's deltas.
pub fn delivered(events: &[ResponseEvent]) -> (Vec<u32>, String) {
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

/// Asserts a stream is complete and well-formed: seqs 1, 2, ... without gaps, deltas, then
/// one `done` whose completion count is the number of delivered tokens.
pub fn assert_complete(events: &[ResponseEvent]) {
    let seqs: Vec<u64> = events.iter().map(ResponseEvent::seq).collect();
    let want: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, want, "seqs not consecutive");
    let (ids, _) = delivered(events);
    match events.last() {
        Some(ResponseEvent::Done { usage, .. }) => {
            assert_eq!(usage.completion_tokens, ids.len() as u64)
        }
        other => panic!("stream does not end with done: {other:?}"),
    }
    assert!(events[..events.len() - 1]
        .iter()
        .all(|e| matches!(e, ResponseEvent::Delta { .. })));
}

pub use tidal_queue::testing::drain_usage as usage_events;

/// Usage events by request, deduplicated by (request, segment) as billing does.
pub fn usage_by_request(events: &[UsageEvent]) -> BTreeMap<Uuid, BTreeMap<u32, UsageEvent>> {
    let mut by: BTreeMap<Uuid, BTreeMap<u32, UsageEvent>> = BTreeMap::new();
    for e in events {
        by.entry(e.request_id)
            .or_default()
            .entry(e.segment)
            .or_insert_with(|| e.clone());
    }
    by
}

/// Asserts request `id` was billed its prompt once and exactly `completion` tokens.
pub fn assert_billed(
    by: &BTreeMap<Uuid, BTreeMap<u32, UsageEvent>>,
    id: Uuid,
    prompt: u64,
    completion: u64,
) {
    let segs = by.get(&id).unwrap_or_else(|| panic!("no usage for {id}"));
    let p: u64 = segs.values().map(|e| e.prompt_tokens).sum();
    let c: u64 = segs.values().map(|e| e.completion_tokens).sum();
    assert_eq!((p, c), (prompt, completion), "billing of {id}: {segs:?}");
}

/// Waits until `cond` holds (polling), or panics after `timeout`.
pub async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
