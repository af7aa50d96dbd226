//! The local fleet: in-process workers per model, started and stopped by the autoscaling
//! policy.
//!
//! Every tick the fleet reads each model's queue depth from the broker, tells the policy
//! ([`tidal_autoscaler::decide`], the function the Kubernetes controller runs) what it has,
//! starts or drains workers to match the decision, and publishes the model's state
//! (`scaled_to_zero`, `starting`, `ready`) in the broker's model record for the gateway.
//! One process has one kind of capacity, so models run in `OnDemand` mode.

mod launcher;
pub mod pool;
mod worker_slot;

pub use launcher::{LaunchError, Launcher};
pub use pool::{PoolFleet, LOCAL_POOL};

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tidal_autoscaler::{
    decide_at, telemetry, CapacityMode, CapacityObserved, Observed, PolicyState, ScalingSpec,
};
use tidal_queue::{Broker, ModelRecord, ModelState, QueueDepth};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use worker_slot::{Phase, WorkerSlot};

/// A model the fleet serves.
#[derive(Debug, Clone)]
pub struct FleetModel {
    /// Its public record (the fleet keeps `state` current).
    pub record: ModelRecord,
    /// Its scaling parameters (`capacity_mode` is forced to `OnDemand`).
    pub spec: ScalingSpec,
}

/// What `tidal status` shows of one model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelStatus {
    pub id: String,
    pub state: ModelState,
    pub ready: u32,
    pub starting: u32,
    pub stopping: u32,
    pub desired: u32,
    pub backlog: u64,
    pub in_flight: u64,
    /// Of `in_flight`, the jobs whose first token is out.
    pub decoding: u64,
    pub oldest_wait_ms: Option<u64>,
    /// Model load time of the most recent worker start.
    pub last_cold_start_ms: Option<u64>,
    pub cold_starts: u64,
    /// Why the policy chose `desired`: its `Reason` as events and metrics name it
    /// (`scheduled-floor`, `scale-to-zero`, ...).
    pub reason: String,
}

/// Fleet settings.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// How often the policy runs.
    pub tick: Duration,
    /// How long shutdown waits for draining workers.
    pub shutdown_timeout: Duration,
    /// The wall clock (Unix seconds) when the fleet starts, which the models'
    /// `floorSchedule` windows read; `None`: the system clock's. Later times are this plus
    /// the fleet's monotonic clock, so a clock step does not open or close a window.
    pub wall_clock_at_start: Option<u64>,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            tick: Duration::from_millis(250),
            shutdown_timeout: Duration::from_secs(60),
            wall_clock_at_start: None,
        }
    }
}

/// Read side of a running fleet.
#[derive(Clone, Default)]
pub struct FleetStatus(Arc<Mutex<Vec<ModelStatus>>>);

impl FleetStatus {
    /// The models as of the last tick.
    pub fn snapshot(&self) -> Vec<ModelStatus> {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

struct Slot {
    model: FleetModel,
    policy: PolicyState,
    workers: Vec<WorkerSlot>,
    next_worker: u32,
    last_request_at: Option<Duration>,
    published: Option<ModelState>,
    status: ModelStatus,
}

/// The fleet: owns every local worker.
pub struct Fleet {
    broker: Arc<dyn Broker>,
    launcher: Arc<dyn Launcher>,
    config: FleetConfig,
    slots: Vec<Slot>,
    pool: Option<PoolFleet>,
    status: FleetStatus,
    started: Instant,
    wall_clock_at_start: u64,
}

impl Fleet {
    /// A fleet for `models`, none of them running yet.
    pub fn new(
        broker: Arc<dyn Broker>,
        launcher: Arc<dyn Launcher>,
        models: Vec<FleetModel>,
        config: FleetConfig,
    ) -> Self {
        let slots = models
            .into_iter()
            .map(|mut model| {
                model.spec.capacity_mode = CapacityMode::OnDemand;
                let status = pool::idle_status(&model.record.id);
                Slot {
                    policy: PolicyState::new(&model.spec),
                    model,
                    workers: Vec::new(),
                    next_worker: 1,
                    last_request_at: None,
                    published: None,
                    status,
                }
            })
            .collect();
        let wall_clock_at_start = config.wall_clock_at_start.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
        Self {
            broker,
            launcher,
            config,
            slots,
            pool: None,
            status: FleetStatus::default(),
            started: Instant::now(),
            wall_clock_at_start,
        }
    }

    /// Serves `pool`'s models from a pool of workers besides the models of their own.
    pub fn with_pool(mut self, pool: PoolFleet) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Handle for reading the fleet's status while it runs.
    pub fn status(&self) -> FleetStatus {
        self.status.clone()
    }

    /// Runs until `shutdown` becomes true, then drains every worker.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut interval = tokio::time::interval(self.config.tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => self.tick().await,
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
            }
        }
        self.stop_all().await;
    }

    /// One policy round over every model.
    pub async fn tick(&mut self) {
        let now = self.started.elapsed();
        for i in 0..self.slots.len() {
            let id = self.slots[i].model.record.id.clone();
            let depth = match self.broker.depth(&id).await {
                Ok(d) => d,
                Err(e) => {
                    // Without depth figures the safe move is to change nothing.
                    tracing::warn!(model = %id, error = %e, "cannot read queue depth");
                    continue;
                }
            };
            let slot = &mut self.slots[i];
            reap_finished(&slot.model.record.id, &mut slot.workers).await;
            self.reconcile(i, depth, now);
            self.publish(i).await;
        }
        if let Some(pool) = &mut self.pool {
            pool.tick(self.broker.as_ref(), SystemTime::now()).await;
        }
        if let Ok(mut s) = self.status.0.lock() {
            *s = self.slots.iter().map(|s| s.status.clone()).collect();
            if let Some(pool) = &self.pool {
                s.extend(pool.status.iter().cloned());
            }
        }
    }

    fn reconcile(&mut self, i: usize, depth: QueueDepth, now: Duration) {
        let launcher = self.launcher.clone();
        let wall_clock = self.wall_clock_at_start.saturating_add(now.as_secs());
        let slot = &mut self.slots[i];
        let id = slot.model.record.id.clone();
        for w in &mut slot.workers {
            if let Some(load) = w.poll_ready() {
                slot.status.last_cold_start_ms = Some(load.as_millis() as u64);
                slot.status.cold_starts += 1;
                metrics::histogram!("tidal_cold_start_seconds", "model" => id.clone())
                    .record(load.as_secs_f64());
                tracing::info!(model = %id, worker = %w.name, load_ms = load.as_millis() as u64, "worker ready");
            }
        }
        if depth.backlog + depth.in_flight > 0 {
            slot.last_request_at = Some(now);
        }
        let count = |p: Phase| slot.workers.iter().filter(|w| w.phase == p).count() as u32;
        let observed = Observed {
            backlog: depth.backlog,
            in_flight: depth.in_flight,
            spot: CapacityObserved::default(),
            on_demand: CapacityObserved {
                ready: count(Phase::Ready),
                starting: count(Phase::Starting),
                pending_since: Vec::new(),
                interrupted: 0,
            },
            last_request_at: slot.last_request_at,
            arrived_prompt_tokens: depth.arrived_prompt_tokens,
            decoding: depth.decoding,
        };
        let decision = decide_at(
            &observed,
            &slot.model.spec,
            &mut slot.policy,
            now,
            wall_clock,
        );
        // the same `tidal_autoscaler_*` series as the controller's, so one dashboard fits both
        telemetry::record(&id, &observed, &decision);
        let desired = decision.on_demand.saturating_add(decision.spot);
        tracing::debug!(model = %id, backlog = depth.backlog, desired, "policy");
        scale_workers(
            &mut slot.workers,
            &mut slot.next_worker,
            desired,
            &launcher,
            &id,
            &decision.reason.to_string(),
        );
        let (ready, starting, stopping) = (
            count_phase(&slot.workers, Phase::Ready),
            count_phase(&slot.workers, Phase::Starting),
            count_phase(&slot.workers, Phase::Stopping),
        );
        slot.status.state = if ready > 0 {
            ModelState::Ready
        } else if starting > 0 {
            ModelState::Starting
        } else {
            ModelState::ScaledToZero
        };
        slot.status.ready = ready;
        slot.status.starting = starting;
        slot.status.stopping = stopping;
        slot.status.desired = desired;
        slot.status.backlog = depth.backlog;
        slot.status.in_flight = depth.in_flight;
        slot.status.decoding = depth.decoding;
        slot.status.oldest_wait_ms = depth.oldest_wait_ms;
        slot.status.reason = decision.reason.to_string();
        metrics::gauge!("tidal_fleet_replicas", "model" => id.clone(), "phase" => "ready")
            .set(f64::from(ready));
        // what the policy asked for is `tidal_autoscaler_desired_replicas` (telemetry::record)
        metrics::gauge!("tidal_fleet_replicas", "model" => id, "phase" => "starting")
            .set(f64::from(starting));
    }

    async fn publish(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if slot.published == Some(slot.status.state) {
            return;
        }
        let mut record = slot.model.record.clone();
        record.state = slot.status.state;
        match self.broker.put_model(&record).await {
            Ok(()) => slot.published = Some(record.state),
            Err(e) => tracing::warn!(model = %record.id, error = %e, "cannot publish model state"),
        }
    }

    async fn stop_all(&mut self) {
        for slot in &mut self.slots {
            for w in &mut slot.workers {
                if w.is_active() {
                    w.request_stop();
                }
            }
        }
        let deadline = Instant::now() + self.config.shutdown_timeout;
        for slot in &mut self.slots {
            for w in slot.workers.drain(..) {
                let name = w.name.clone();
                match tokio::time::timeout_at(deadline, w.join()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(worker = %name, error = %e, "worker failed"),
                    Err(_) => tracing::warn!(worker = %name, "worker did not drain in time"),
                }
            }
            slot.status.state = ModelState::ScaledToZero;
        }
        for i in 0..self.slots.len() {
            self.publish(i).await;
        }
        if let Some(pool) = &mut self.pool {
            pool.stop(self.broker.as_ref(), deadline).await;
        }
    }
}

fn count_phase(workers: &[WorkerSlot], phase: Phase) -> u32 {
    workers.iter().filter(|w| w.phase == phase).count() as u32
}

/// Drops workers whose task returned, logging failures (the policy starts replacements).
async fn reap_finished(id: &str, workers: &mut Vec<WorkerSlot>) {
    let mut i = 0;
    while i < workers.len() {
        if !workers[i].is_finished() {
            i += 1;
            continue;
        }
        let w = workers.swap_remove(i);
        let expected = w.phase == Phase::Stopping;
        let name = w.name.clone();
        // The task is finished, so this join returns at once.
        match w.join().await {
            Ok(()) if expected => tracing::info!(model = %id, worker = %name, "worker stopped"),
            Ok(()) => tracing::warn!(model = %id, worker = %name, "worker exited unasked"),
            Err(e) => tracing::error!(model = %id, worker = %name, error = %e, "worker failed"),
        }
    }
}

/// Starts or drains workers of `id` until `desired` are active: new ones named
/// `local-{id}-{n}`; drained ones those still loading first (they serve nobody), then the
/// newest.
fn scale_workers(
    workers: &mut Vec<WorkerSlot>,
    next_worker: &mut u32,
    desired: u32,
    launcher: &Arc<dyn Launcher>,
    id: &str,
    reason: &str,
) {
    let active = workers.iter().filter(|w| w.is_active()).count() as u32;
    if desired > active {
        for _ in active..desired {
            let name = format!("local-{}-{}", sanitize(id), next_worker);
            *next_worker += 1;
            tracing::info!(model = %id, worker = %name, %reason, "starting worker");
            workers.push(spawn_worker(launcher.clone(), id, name));
        }
    } else if desired < active {
        let mut to_stop = active - desired;
        for phase in [Phase::Starting, Phase::Ready] {
            for w in workers.iter_mut().rev() {
                if to_stop > 0 && w.phase == phase {
                    tracing::info!(model = %id, worker = %w.name, %reason, "stopping worker");
                    w.request_stop();
                    to_stop -= 1;
                }
            }
        }
    }
}

fn spawn_worker(launcher: Arc<dyn Launcher>, model: &str, name: String) -> WorkerSlot {
    let (ready_tx, ready_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (model, task_name) = (model.to_owned(), name.clone());
    let task =
        tokio::spawn(async move { launcher.run(&model, &task_name, ready_tx, stop_rx).await });
    WorkerSlot::new(name, ready_rx, stop_tx, task)
}

/// A model id as it may appear in a worker name (`ns/name` → `ns-name`).
fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
