//! The pool worker on the in-process broker with two generated models: follows its
//! assignment, serves every model it holds, unloads a model with a job in flight without
//! losing it, bills every segment to the right model, refuses a file whose SHA-256 differs
//! from its manifest's, counts each model's delivered tokens and its whole memory (weights,
//! KV cache, activations).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidal_queue::{Broker, Job, MemoryBroker, ResponseEvent, UsageEvent};
use uuid::Uuid;

use super::model_dir::{sha256_file, MANIFEST};
use super::*;
use crate::engine::EngineConfig;
use crate::model::{write_tiny_gguf, TinySpec};
use crate::worker::bench::fixed_length_job;

const POOL: &str = "tiny";
const NAME: &str = "pool-w1";

fn spec(seed: u64) -> TinySpec {
    TinySpec {
        layers: 4,
        hidden: 256,
        ffn: 1024,
        heads: 4,
        kv_heads: 2,
        context: 4096,
        seed,
        ..TinySpec::default()
    }
}

/// A model directory with `a` and `b` (sums in the manifest) and `bad` (a wrong sum).
fn model_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    write_tiny_gguf(&root.join("a.gguf"), &spec(1)).unwrap();
    write_tiny_gguf(&root.join("b.gguf"), &spec(2)).unwrap();
    write_tiny_gguf(&root.join("bad.gguf"), &TinySpec::default()).unwrap();
    let sum = |f: &str| sha256_file(&root.join(f)).unwrap();
    let manifest = serde_json::json!({"models": {
        "ns/a": {"path": "a.gguf", "sha256": sum("a.gguf")},
        "ns/b": {"path": "b.gguf", "sha256": sum("b.gguf")},
        "ns/bad": {"path": "bad.gguf", "sha256": "0".repeat(64)},
    }});
    std::fs::write(root.join(MANIFEST), manifest.to_string()).unwrap();
    d
}

fn config(memory_bytes: u64) -> PoolConfig {
    let mut c = PoolConfig::new(POOL, NAME, memory_bytes);
    c.node = "node-1".into();
    c.engine = EngineConfig {
        kv_cache_memory: 64 << 20,
        max_num_seqs: 16,
        threads: Some(1),
        ..EngineConfig::default()
    };
    let w = &mut c.worker;
    w.claim_timeout = Duration::from_millis(800);
    w.heartbeat_interval = Duration::from_millis(100);
    w.missed_heartbeats = 4;
    w.cancel_poll_interval = Duration::from_millis(20);
    w.claim_block = Duration::from_millis(100);
    w.drain_timeout = Duration::ZERO;
    c
}

struct Running {
    handle: PoolHandle,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<(String, WorkerSummary)>>,
}

fn start(dir: &Path, broker: Arc<dyn Broker>, memory_bytes: u64) -> Running {
    start_with(ModelDir::open(dir).unwrap(), broker, memory_bytes)
}

fn start_with(md: ModelDir, broker: Arc<dyn Broker>, memory_bytes: u64) -> Running {
    let worker = PoolWorker::new(config(memory_bytes), md, broker).unwrap();
    let handle = worker.handle();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    Running { handle, stop, task }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn assign(b: &dyn Broker, models: &[&str]) {
    let models: Vec<String> = models.iter().map(|m| (*m).to_owned()).collect();
    b.set_pool_assignment(POOL, NAME, &models).await.unwrap();
}

fn job(model: &str, max_tokens: usize) -> Job {
    fixed_length_job(model, &[5, 17, 29, 41], max_tokens)
}

/// Reads a request's stream until its last event.
async fn read_to_end(b: &dyn Broker, id: Uuid) -> Vec<ResponseEvent> {
    tidal_queue::testing::read_to_end(b, id, Duration::from_secs(120)).await
}

/// Consecutive seqs, deltas, then one `done` counting every delivered token; the count.
fn assert_complete(events: &[ResponseEvent]) -> u64 {
    let seqs: Vec<u64> = events.iter().map(ResponseEvent::seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    let tokens: usize = events
        .iter()
        .map(|e| match e {
            ResponseEvent::Delta { token_ids, .. } => token_ids.len(),
            _ => 0,
        })
        .sum();
    match events.last() {
        Some(ResponseEvent::Done { usage, .. }) => {
            assert_eq!(usage.completion_tokens, tokens as u64);
        }
        other => panic!("stream does not end with done: {other:?}"),
    }
    tokens as u64
}

fn completion_billed(usage: &[UsageEvent], id: Uuid) -> u64 {
    usage
        .iter()
        .filter(|e| e.request_id == id)
        .map(|e| e.completion_tokens)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_its_assignment_and_never_loses_a_job_to_an_unload() {
    let dir = model_dir();
    let b: Arc<dyn Broker> = Arc::new(MemoryBroker::default());
    let pool = start(dir.path(), b.clone(), 1 << 30);
    let h = pool.handle.clone();

    // Assign A: it loads and serves.
    assign(&*b, &["ns/a"]).await;
    wait_until("a loaded", || h.snapshot().loaded == ["ns/a"]).await;
    let j1 = job("ns/a", 8);
    b.enqueue(&j1).await.unwrap();
    assert_eq!(assert_complete(&read_to_end(&*b, j1.id).await), 8);

    // Assign B as well: both serve.
    assign(&*b, &["ns/a", "ns/b"]).await;
    wait_until("b loaded", || h.snapshot().loaded == ["ns/a", "ns/b"]).await;
    let (j2, j3) = (job("ns/a", 6), job("ns/b", 7));
    b.enqueue(&j2).await.unwrap();
    b.enqueue(&j3).await.unwrap();
    assert_eq!(assert_complete(&read_to_end(&*b, j2.id).await), 6);
    assert_eq!(assert_complete(&read_to_end(&*b, j3.id).await), 7);
    // Both per-model heartbeats are written, for gateway admission and autoscaling.
    for m in ["ns/a", "ns/b"] {
        let ws = b.workers(m).await.unwrap();
        assert!(ws.iter().any(|w| w.worker == NAME), "{m}: {ws:?}");
    }
    // The pool heartbeat shows both, their memory, and the node cache.
    wait_until("pool beat with both", || {
        futures::executor::block_on(b.pool_workers(POOL))
            .unwrap()
            .first()
            .is_some_and(|w| w.loaded.len() == 2)
    })
    .await;
    let beat = b.pool_workers(POOL).await.unwrap().remove(0);
    let used: u64 = beat.loaded.iter().map(|l| l.bytes).sum();
    assert_eq!(beat.memory_free_bytes, (1 << 30) - used);
    assert_eq!(beat.node, "node-1");
    let cached: Vec<&str> = beat.cached.iter().map(|c| c.model.as_str()).collect();
    assert_eq!(cached, ["ns/a", "ns/b", "ns/bad"]);
    assert!(beat
        .cached
        .iter()
        .all(|c| c.sha256.is_some() && c.bytes > 0));

    // Unassign A while a long job of A is in flight: its worker drains (drain timeout
    // zero: the job is re-enqueued with what it delivered), then A unloads.
    let long = job("ns/a", 400);
    b.enqueue(&long).await.unwrap();
    let first = b
        .read_responses(long.id, 0, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(!first.is_empty(), "the long job started");
    assign(&*b, &["ns/b"]).await;
    wait_until("a unloaded", || h.snapshot().loaded == ["ns/b"]).await;
    wait_until("a gone", || {
        let s = h.snapshot();
        s.unloading.is_empty() && s.loading.is_empty()
    })
    .await;
    // Nothing claims A now: the job waits, resumable, in its resumed stream.
    let depth = b.depth("ns/a").await.unwrap();
    assert_eq!(depth.backlog, 1, "{depth:?}");
    // B still serves.
    let j4 = job("ns/b", 5);
    b.enqueue(&j4).await.unwrap();
    assert_eq!(assert_complete(&read_to_end(&*b, j4.id).await), 5);

    // Assign A again: it reloads and the job resumes in the same stream, whole.
    assign(&*b, &["ns/a", "ns/b"]).await;
    let events = read_to_end(&*b, long.id).await;
    assert_eq!(assert_complete(&events), 400);

    let _ = pool.stop.send(());
    let summaries = tokio::time::timeout(Duration::from_secs(60), pool.task)
        .await
        .expect("pool drained")
        .unwrap();
    let requeued: u64 = summaries
        .iter()
        .filter(|(m, _)| m == "ns/a")
        .map(|(_, s)| s.requeued)
        .sum();
    assert_eq!(requeued, 1, "{summaries:?}");

    // Every usage event names its request's model and this worker; the long job was
    // billed in two segments, each token once.
    let usage = tidal_queue::testing::drain_usage(&*b).await;
    for (j, tokens) in [(&j1, 8), (&j2, 6), (&j3, 7), (&j4, 5)] {
        assert_eq!(completion_billed(&usage, j.id), tokens);
    }
    for e in &usage {
        let want = [&j1, &j2, &j3, &j4, &long]
            .iter()
            .find(|j| j.id == e.request_id)
            .map(|j| j.model.clone());
        assert_eq!(Some(e.model.clone()), want, "{e:?}");
        assert_eq!(e.worker, NAME);
    }
    let segments = usage.iter().filter(|e| e.request_id == long.id).count();
    assert_eq!(segments, 2);
    assert_eq!(completion_billed(&usage, long.id), 400);
    // Shut down: the pool beat says draining and holds nothing.
    let beat = b.pool_workers(POOL).await.unwrap().remove(0);
    assert!(beat.draining && beat.loaded.is_empty(), "{beat:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_whose_sum_differs_is_never_loaded() {
    let dir = model_dir();
    let b: Arc<dyn Broker> = Arc::new(MemoryBroker::default());
    let pool = start(dir.path(), b.clone(), 1 << 30);
    let h = pool.handle.clone();
    let e = h.load("ns/bad").await.unwrap_err();
    assert!(matches!(e, PoolError::Checksum { .. }), "{e}");
    assert!(e.to_string().contains("sha256"), "{e}");
    assert!(h.snapshot().loaded.is_empty());
    // By assignment: reported as failed with why, never loaded, not retried every beat.
    assign(&*b, &["ns/bad"]).await;
    wait_until("failure reported", || {
        futures::executor::block_on(b.pool_workers(POOL))
            .unwrap()
            .first()
            .is_some_and(|w| w.failed.iter().any(|f| f.model == "ns/bad"))
    })
    .await;
    let beat = b.pool_workers(POOL).await.unwrap().remove(0);
    assert!(beat.failed[0].error.contains("sha256"), "{beat:?}");
    assert!(beat.loaded.is_empty() && beat.loading.is_empty());
    // A model not in the directory, and one too big for the memory left.
    let e = h.load("ns/missing").await.unwrap_err();
    assert_eq!(e, PoolError::NotInModelDir("ns/missing".into()));
    drop(pool.stop);
    let _ = pool.task.await;

    let small = start(dir.path(), b.clone(), 1024);
    let e = small.handle.load("ns/a").await.unwrap_err();
    assert!(matches!(e, PoolError::DoesNotFit { .. }), "{e}");
    drop(small.stop);
    let _ = small.task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_load_and_unload_without_an_assignment() {
    let dir = model_dir();
    let b: Arc<dyn Broker> = Arc::new(MemoryBroker::default());
    let pool = start(dir.path(), b.clone(), 1 << 30);
    let h = pool.handle.clone();
    let seconds = h.load("ns/b").await.unwrap();
    assert!(seconds > 0.0);
    assert_eq!(h.snapshot().loaded, ["ns/b"]);
    let j = job("ns/b", 4);
    b.enqueue(&j).await.unwrap();
    assert_eq!(assert_complete(&read_to_end(&*b, j.id).await), 4);
    let summary = h.unload("ns/b").await.unwrap();
    assert_eq!(summary.completed, 1);
    assert!(h.snapshot().loaded.is_empty());
    // Unloading what is not held is done at once.
    h.unload("ns/a").await.unwrap();
    drop(pool.stop);
    let _ = pool.task.await;
}

/// The pool heartbeat once it satisfies `cond`.
async fn beat_when(
    b: &dyn Broker,
    what: &str,
    cond: impl Fn(&tidal_queue::PoolHeartbeat) -> bool,
) -> tidal_queue::PoolHeartbeat {
    let mut last = None;
    wait_until(what, || {
        last = futures::executor::block_on(b.pool_workers(POOL))
            .unwrap()
            .into_iter()
            .next();
        last.as_ref().is_some_and(&cond)
    })
    .await;
    last.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_beat_counts_each_models_delivered_tokens() {
    let dir = model_dir();
    // Pinned as `--pool-model ns/p=a.gguf` would, over the manifest.
    let pinned = vec![PinnedModel {
        model: "ns/p".into(),
        path: "a.gguf".into(),
        sha256: Some(sha256_file(&dir.path().join("a.gguf")).unwrap()),
    }];
    let md = ModelDir::with_pinned(dir.path(), pinned).unwrap();
    let b: Arc<dyn Broker> = Arc::new(MemoryBroker::default());
    let pool = start_with(md, b.clone(), 1 << 30);
    let h = pool.handle.clone();
    h.load("ns/p").await.unwrap();
    h.load("ns/b").await.unwrap();
    let j = job("ns/p", 9);
    b.enqueue(&j).await.unwrap();
    assert_eq!(assert_complete(&read_to_end(&*b, j.id).await), 9);
    let tokens = |beat: &tidal_queue::PoolHeartbeat, m: &str| {
        beat.loaded
            .iter()
            .find(|l| l.model == m)
            .map(|l| l.tokens_delivered)
    };
    let beat = beat_when(&*b, "p's tokens", |w| tokens(w, "ns/p") == Some(9)).await;
    assert_eq!(tokens(&beat, "ns/b"), Some(0), "{beat:?}");
    // Loaded again, the model counts from zero.
    h.unload("ns/p").await.unwrap();
    h.load("ns/p").await.unwrap();
    let reloaded = tidal_queue::clock::system_now_ms();
    let beat = beat_when(&*b, "p again", |w| w.last_seen_ms > reloaded).await;
    assert_eq!(tokens(&beat, "ns/p"), Some(0), "{beat:?}");
    drop(pool.stop);
    let _ = pool.task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_takes_its_weights_kv_cache_and_activations() {
    let dir = model_dir();
    let a = dir.path().join("a.gguf");
    let engine = config(0).engine;
    let total = super::loading::footprint("ns/a", &a, &engine, None).unwrap();
    let file = std::fs::metadata(&a).unwrap().len();
    // The KV cache alone is larger than the file: counting the file would let it in.
    assert!(
        total > file + engine.kv_cache_memory as u64 / 2,
        "{total} {file}"
    );
    let b: Arc<dyn Broker> = Arc::new(MemoryBroker::default());

    // One byte short: refused before anything is allocated, and reported.
    let short = start(dir.path(), b.clone(), total - 1);
    match short.handle.load("ns/a").await {
        Err(PoolError::DoesNotFit { bytes, free, .. }) => {
            assert_eq!((bytes, free), (total, total - 1));
        }
        other => panic!("{other:?}"),
    }
    let s = short.handle.snapshot();
    assert!(s.loaded.is_empty() && s.loading.is_empty(), "{s:?}");
    drop(short.stop);
    let _ = short.task.await;

    // Exactly enough: it loads, counts its total, and leaves no room for another.
    let exact = start(dir.path(), b.clone(), total);
    exact.handle.load("ns/a").await.unwrap();
    let beat = beat_when(&*b, "a loaded", |w| w.loaded.len() == 1).await;
    assert_eq!(beat.loaded[0].bytes, total);
    assert_eq!(
        (beat.memory_total_bytes, beat.memory_free_bytes),
        (total, 0)
    );
    let e = exact.handle.load("ns/b").await.unwrap_err();
    assert!(matches!(e, PoolError::DoesNotFit { free: 0, .. }), "{e}");
    assert!(e.to_string().contains("KV cache"), "{e}");
    assert_eq!(exact.handle.snapshot().loaded, ["ns/a"]);
    drop(exact.stop);
    let _ = exact.task.await;
}
