//! The worker's periodic duties besides claiming: read the cancel flags of every held job
//! (one round trip for all), renew every held job so no other worker takes it over
//! (one keep-alive call for all), and write the heartbeat by which other workers tell this
//! one is alive (and the autoscaler reads its load).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tidal_queue::clock::system_now_ms;
use tidal_queue::WorkerHeartbeat;
use tokio::sync::watch;
use tokio::time::{interval, MissedTickBehavior};

use super::metrics;
use super::registry::Control;
use super::Shared;

/// Runs the chores until `stop` turns true.
pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let config = &shared.config;
    let mut cancels = interval(config.cancel_poll_interval);
    let mut keep_alive = interval(config.keep_alive_every());
    let mut beat = interval(config.heartbeat_interval);
    for t in [&mut cancels, &mut keep_alive, &mut beat] {
        t.set_missed_tick_behavior(MissedTickBehavior::Delay);
    }
    loop {
        tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return;
                }
            }
            _ = cancels.tick() => poll_cancels(&shared).await,
            _ = keep_alive.tick() => renew(&shared).await,
            _ = beat.tick() => heartbeat(&shared).await,
        }
    }
}

/// Tells the tasks of cancelled requests to stop.
async fn poll_cancels(shared: &Shared) {
    let held = shared.registry.requests();
    if held.is_empty() {
        return;
    }
    let ids: Vec<_> = held.iter().map(|(_, id)| *id).collect();
    match shared.broker.cancelled(&ids).await {
        Ok(flags) => {
            for ((entry, id), flag) in held.iter().zip(flags) {
                if let Some(delivered_seq) = flag {
                    tracing::info!(request_id = %id, delivered_seq, "request cancelled by its client");
                    shared
                        .registry
                        .signal(entry, Control::Cancel(delivered_seq));
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read cancel flags"),
    }
}

/// Renews every held job; tells the tasks of jobs another worker holds now to stop.
async fn renew(shared: &Shared) {
    let jobs = shared.registry.jobs();
    if jobs.is_empty() {
        return;
    }
    match shared.broker.keep_alive(&jobs).await {
        Ok(alive) => {
            for (job, alive) in jobs.iter().zip(alive) {
                if !alive {
                    tracing::warn!(request_id = %job.job.id, "job no longer held by this worker");
                    shared.registry.signal(&job.entry_id, Control::Lost);
                }
            }
        }
        // Not renewed this time; the interval leaves room for a few misses.
        Err(e) => tracing::warn!(error = %e, "keep-alive failed"),
    }
}

/// Writes this worker's heartbeat (load, KV room, draining).
pub(crate) async fn heartbeat(shared: &Shared) {
    let stats = shared.model.engine.stats();
    let held = shared.registry.len();
    let draining = shared.draining.load(Ordering::Relaxed);
    let running = stats.num_running.min(held);
    let beat = WorkerHeartbeat {
        worker: shared.config.name.clone(),
        model: shared.config.model_id.clone(),
        running: u32::try_from(running).unwrap_or(u32::MAX),
        waiting: u32::try_from(held - running).unwrap_or(u32::MAX),
        free_kv_blocks: u32::try_from(stats.num_free_blocks).unwrap_or(u32::MAX),
        capacity_type: shared.config.capacity_type,
        draining,
        last_seen_ms: system_now_ms(),
    };
    metrics::load(&shared.config.model_id, held, draining);
    let written = shared.broker.heartbeat(&beat).await;
    let mut contact = shared.contact.lock().unwrap_or_else(|e| e.into_inner());
    match written {
        Ok(()) => contact.beat_ok(Instant::now(), shared.config.dead_after()),
        Err(e) => {
            contact.beat_failed();
            tracing::warn!(error = %e, "heartbeat failed");
        }
    }
}
