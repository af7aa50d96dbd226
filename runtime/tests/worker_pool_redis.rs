//! The pool worker against real Redis, as the controller drives it: models pinned the way
//! `--pool-model` and `--pool-model-sha256` pin them, an assignment written with
//! `set_pool_assignment`, jobs enqueued through the broker, and the heartbeats read back
//! from Redis. Skips (counted as skipped by `scripts/test.sh`) when no Redis answers and
//! none can be started.

#[path = "../../tests/skip/mod.rs"]
mod skip;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tidal_queue::testing::{delete_prefix, keys_under, read_to_end};
use tidal_queue::{Broker, BrokerConfig, Keys, PoolHeartbeat, RedisBroker, ResponseEvent};
use tidal_runtime::engine::EngineConfig;
use tidal_runtime::model::{write_tiny_gguf, TinySpec};
use tidal_runtime::worker::bench::fixed_length_job;
use tidal_runtime::worker::pool::model_dir::sha256_file;
use tidal_runtime::worker::pool::{ModelDir, PinnedModel, PoolConfig, PoolWorker};
use uuid::Uuid;

const POOL: &str = "models/tiny-pool";
const NAME: &str = "pool-redis-w1";
const LONG: Duration = Duration::from_secs(120);

/// Deletes the test's keys when dropped, also when the test fails.
struct Keyspace {
    url: String,
    prefix: String,
}

impl Drop for Keyspace {
    fn drop(&mut self) {
        delete_prefix(&self.url, &self.prefix);
    }
}

/// Models `ns/a` and `ns/b` in `root`, laid out as the pool's node cache holds them
/// (`<namespace>/<model>/<file>`, which the `{id}.gguf` layout does not find) and pinned
/// with their checksums as the controller pins them on the command line.
fn pinned_models(root: &Path) -> ModelDir {
    let (a, b) = ("ns/a/model.gguf", "ns/b/model.gguf");
    for (file, seed) in [(a, 1), (b, 2)] {
        let spec = TinySpec {
            seed,
            ..TinySpec::default()
        };
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        write_tiny_gguf(&path, &spec).unwrap();
    }
    let sum = |f: &str| sha256_file(&root.join(f)).unwrap();
    let paths = [format!("ns/a={a}"), format!("ns/b={b}")];
    let sums = [format!("ns/a={}", sum(a)), format!("ns/b={}", sum(b))];
    let pinned = PinnedModel::from_flags(&paths, &sums).unwrap();
    ModelDir::with_pinned(root, pinned).unwrap()
}

fn config() -> PoolConfig {
    let mut c = PoolConfig::new(POOL, NAME, 1 << 30);
    c.node = "node-1".into();
    c.engine = EngineConfig {
        kv_cache_memory: 16 << 20,
        max_num_seqs: 8,
        threads: Some(1),
        ..EngineConfig::default()
    };
    let w = &mut c.worker;
    w.claim_timeout = Duration::from_secs(5);
    w.heartbeat_interval = Duration::from_millis(100);
    w.cancel_poll_interval = Duration::from_millis(20);
    w.claim_block = Duration::from_millis(100);
    w.drain_timeout = Duration::from_secs(10);
    c
}

/// Waits until the pool heartbeat in Redis satisfies `cond`; returns it.
async fn beat_until(
    b: &dyn Broker,
    what: &str,
    cond: impl Fn(&PoolHeartbeat) -> bool,
) -> PoolHeartbeat {
    let deadline = Instant::now() + LONG;
    loop {
        let beats = b.pool_workers(POOL).await.unwrap();
        if let Some(beat) = beats.into_iter().find(|w| w.worker == NAME) {
            if cond(&beat) {
                return beat;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {beat:?}"
            );
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn loaded(beat: &PoolHeartbeat) -> Vec<&str> {
    beat.loaded.iter().map(|l| l.model.as_str()).collect()
}

/// Enqueues a job of `model` and checks its whole answer arrives.
async fn answered(b: &dyn Broker, model: &str, tokens: usize) {
    let job = fixed_length_job(model, &[5, 17, 29, 41], tokens);
    b.enqueue(&job).await.unwrap();
    let events = read_to_end(b, job.id, LONG).await;
    let delivered: usize = events
        .iter()
        .map(|e| match e {
            ResponseEvent::Delta { token_ids, .. } => token_ids.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(delivered, tokens, "{model}: {events:?}");
    assert!(
        matches!(events.last(), Some(ResponseEvent::Done { .. })),
        "{model}: {events:?}"
    );
}

/// Whether `model`'s per-model heartbeat hash in Redis names this worker.
async fn serves(b: &dyn Broker, model: &str) -> bool {
    b.workers(model)
        .await
        .unwrap()
        .iter()
        .any(|w| w.worker == NAME)
}

async fn with_timeout<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LONG, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_worker_follows_its_assignment_in_redis() {
    let url = match tidal_queue::testing::ensure_redis().await {
        Ok(url) => url,
        Err(e) => return skip::skip(&format!("no Redis ({e})")),
    };
    let keyspace = Keyspace {
        url: url.clone(),
        prefix: format!("tidal-pooltest-{}:", Uuid::now_v7()),
    };
    let broker_config = BrokerConfig {
        prefix: keyspace.prefix.clone(),
        ..BrokerConfig::default()
    };
    let b: Arc<dyn Broker> = Arc::new(RedisBroker::connect(&url, broker_config).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let worker = PoolWorker::new(config(), pinned_models(dir.path()), b.clone()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));

    let checked = AssertUnwindSafe(follow_the_assignment(&*b, &url, &keyspace.prefix))
        .catch_unwind()
        .await;
    // Stop the worker before its keys are deleted, also when a check failed: a worker
    // still running would write its heartbeats again.
    let _ = stop.send(());
    let summaries = with_timeout("the pool drained", task).await.unwrap();
    delete_prefix(&url, &keyspace.prefix);
    if let Err(panic) = checked {
        std::panic::resume_unwind(panic);
    }
    let completed = |m: &str| -> u64 {
        summaries
            .iter()
            .filter(|(s, _)| s == m)
            .map(|(_, s)| s.completed)
            .sum()
    };
    assert_eq!(
        (completed("ns/a"), completed("ns/b")),
        (1, 1),
        "{summaries:?}"
    );
    // Nothing is left under the test's prefix.
    assert_eq!(keys_under(&url, &keyspace.prefix), Vec::<String>::new());
}

/// Assigned A, then switched to B: each loads, answers a job and shows in the heartbeats.
async fn follow_the_assignment(b: &dyn Broker, url: &str, prefix: &str) {
    let assign = |models: &[&str]| {
        let models: Vec<String> = models.iter().map(|m| (*m).to_owned()).collect();
        async move { b.set_pool_assignment(POOL, NAME, &models).await.unwrap() }
    };
    // Assigned A: it loads, and the pool heartbeat in Redis says so.
    assign(&["ns/a"]).await;
    let beat = beat_until(b, "a loaded", |w| loaded(w) == ["ns/a"]).await;
    assert_eq!((beat.pool.as_str(), beat.node.as_str()), (POOL, "node-1"));
    let cached: Vec<(&str, bool)> = beat
        .cached
        .iter()
        .map(|c| (c.model.as_str(), c.sha256.is_some()))
        .collect();
    assert_eq!(cached, [("ns/a", true), ("ns/b", true)]);
    let a_bytes = beat.loaded[0].bytes;
    assert_eq!(beat.memory_free_bytes, beat.memory_total_bytes - a_bytes);

    // A job for A is answered, and counted in the heartbeat.
    with_timeout("a job of a", answered(b, "ns/a", 6)).await;
    assert!(serves(b, "ns/a").await, "no heartbeat of ns/a");
    beat_until(b, "a's tokens", |w| {
        w.loaded
            .iter()
            .any(|l| l.model == "ns/a" && l.tokens_delivered == 6)
    })
    .await;

    // Switched to B: A unloads, B loads and serves.
    assign(&["ns/b"]).await;
    let beat = beat_until(b, "b alone", |w| {
        loaded(w) == ["ns/b"] && w.loading.is_empty() && w.unloading.is_empty()
    })
    .await;
    assert_eq!(beat.loaded[0].tokens_delivered, 0);
    with_timeout("a job of b", answered(b, "ns/b", 5)).await;
    assert!(serves(b, "ns/b").await, "no heartbeat of ns/b");
    beat_until(b, "b's tokens", |w| {
        w.loaded
            .iter()
            .any(|l| l.model == "ns/b" && l.tokens_delivered == 5)
    })
    .await;

    // Both kinds of heartbeat are keys of their own in Redis.
    let keys = Keys::new(prefix);
    let present = keys_under(url, prefix);
    for key in [
        keys.pool_workers(POOL),
        keys.pool_assign(POOL),
        keys.workers("ns/b"),
    ] {
        assert!(present.contains(&key), "{key} not in {present:?}");
    }
}
