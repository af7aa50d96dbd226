//! The pool heartbeat (`{prefix}pool:{pool}:workers`): memory, models loaded, loading,
//! unloading and in the node cache, and what failed to load; and the pool's metrics.

use std::sync::Arc;

use tidal_queue::clock::system_now_ms;
use tidal_queue::{CachedModel, FailedLoad, PoolHeartbeat, PoolLoadedModel};

use super::host_cache::is_warm;
use super::model_dir::ModelDir;
use super::state::{touch, Held, Pool};

/// The models in the model directory, with sizes, sums and whether each is warm (reads the
/// directory and asks the kernel about pages: run on a blocking thread).
fn cached(dir: &ModelDir) -> Vec<CachedModel> {
    match dir.list() {
        Ok(entries) => entries
            .into_iter()
            .map(|e| CachedModel {
                warm: is_warm(&e.path),
                model: e.model,
                bytes: e.bytes,
                sha256: e.sha256,
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the model directory");
            Vec::new()
        }
    }
}

/// Builds the heartbeat (touching each model's last use).
pub(super) async fn build(pool: &mut Pool) -> PoolHeartbeat {
    let dir = pool.dir.clone();
    let cached = tokio::task::spawn_blocking(move || cached(&dir))
        .await
        .unwrap_or_default();
    let now = system_now_ms();
    let memory_free_bytes = pool.free_bytes();
    let (mut loaded, mut loading, mut unloading) = (Vec::new(), Vec::new(), Vec::new());
    for (m, h) in pool.held.iter_mut() {
        match h {
            Held::Loading(_) => loading.push(m.clone()),
            Held::Unloading(_) => unloading.push(m.clone()),
            Held::Serving(slot) => {
                let held = slot.status.held();
                let stats = slot.model.engine.stats();
                let running = stats.num_running.min(held);
                loaded.push(PoolLoadedModel {
                    model: m.clone(),
                    bytes: slot.bytes,
                    running: u32::try_from(running).unwrap_or(u32::MAX),
                    waiting: u32::try_from(held - running).unwrap_or(u32::MAX),
                    last_used_ms: touch(slot, now),
                    tokens_delivered: slot.status.tokens_delivered(),
                });
            }
        }
    }
    let config = &pool.config;
    metrics::gauge!("tidal_pool_models_loaded", "pool" => config.pool.clone())
        .set(loaded.len() as f64);
    metrics::gauge!("tidal_pool_memory_free_bytes", "pool" => config.pool.clone())
        .set(memory_free_bytes as f64);
    PoolHeartbeat {
        worker: config.worker.name.clone(),
        pool: config.pool.clone(),
        node: config.node.clone(),
        capacity_type: config.worker.capacity_type,
        memory_total_bytes: config.memory_bytes,
        memory_free_bytes,
        loaded,
        loading,
        unloading,
        cached,
        failed: pool
            .failed
            .iter()
            .map(|(m, e)| FailedLoad {
                model: m.clone(),
                error: e.clone(),
            })
            .collect(),
        draining: pool.draining,
        last_seen_ms: now,
    }
}

/// Writes the heartbeat; a failure is logged (the next beat tries again).
pub(super) async fn write(pool: &mut Pool) {
    let beat = build(pool).await;
    let broker: Arc<dyn tidal_queue::Broker> = pool.broker.clone();
    if let Err(e) = broker.pool_heartbeat(&beat).await {
        tracing::warn!(error = %e, "pool heartbeat failed");
    }
}

/// Counts a model loaded and how long it took.
pub(super) fn loaded(model: &str, seconds: f64) {
    metrics::histogram!("tidal_pool_load_seconds", "model" => model.to_owned()).record(seconds);
}

/// Counts a load that failed.
pub(super) fn load_failed(model: &str) {
    metrics::counter!("tidal_pool_load_failures_total", "model" => model.to_owned()).increment(1);
}
