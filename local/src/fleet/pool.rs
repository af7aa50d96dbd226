//! The local fleet's model pool (`tidal up --pool-memory`): models served by one pool of
//! in-process workers that load and unload models on assignment instead of one fleet each.
//! The same loop as the Kubernetes controller's places them and sizes the pool
//! ([`tidal_pool::PoolDriver`]): a model with queued requests and no worker is assigned to
//! one with room, an idle one leaves after `idleUnloadAfter`, and the worker count follows
//! the models' summed demand, to zero when all are idle.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use tidal_autoscaler::pool::PoolSpec;
use tidal_autoscaler::CapacityObserved;
use tidal_pool::{PoolDriver, PoolTick};
use tidal_queue::{Broker, ModelState};

use super::worker_slot::{Phase, WorkerSlot};
use super::{count_phase, reap_finished, scale_workers, FleetModel, Launcher, ModelStatus};

/// The pool's id in the broker's keys (`{prefix}pool:local:...`).
pub const LOCAL_POOL: &str = "local";

/// The models of the pool and its workers.
pub struct PoolFleet {
    driver: PoolDriver,
    models: Vec<FleetModel>,
    launcher: Arc<dyn Launcher>,
    pub(super) workers: Vec<WorkerSlot>,
    next_worker: u32,
    published: BTreeMap<String, ModelState>,
    pub(super) status: Vec<ModelStatus>,
}

impl PoolFleet {
    /// A pool serving `models` (their own scaling specs are not used: the pool's `spec`
    /// sizes the workers) with workers from `launcher`, which runs a pool worker for
    /// [`LOCAL_POOL`].
    pub fn new(models: Vec<FleetModel>, spec: PoolSpec, launcher: Arc<dyn Launcher>) -> Self {
        let status = models.iter().map(|m| idle_status(&m.record.id)).collect();
        PoolFleet {
            driver: PoolDriver::new(LOCAL_POOL, spec),
            models,
            launcher,
            workers: Vec::new(),
            next_worker: 1,
            published: BTreeMap::new(),
            status,
        }
    }

    /// One round: reap, plan, scale the workers, publish each model's state.
    pub(super) async fn tick(&mut self, broker: &dyn Broker, now: SystemTime) {
        reap_finished(LOCAL_POOL, &mut self.workers).await;
        for w in &mut self.workers {
            if let Some(load) = w.poll_ready() {
                tracing::info!(worker = %w.name, start_ms = load.as_millis() as u64, "pool worker ready");
            }
        }
        let on_demand = CapacityObserved {
            ready: count_phase(&self.workers, Phase::Ready),
            starting: count_phase(&self.workers, Phase::Starting),
            ..CapacityObserved::default()
        };
        let ids: Vec<String> = self.models.iter().map(|m| m.record.id.clone()).collect();
        let tick = match self
            .driver
            .tick(broker, &ids, CapacityObserved::default(), on_demand, now)
            .await
        {
            Ok(t) => t,
            Err(e) => {
                // without the broker's figures the safe move is to change nothing
                tracing::warn!(error = %e, "pool tick failed");
                return;
            }
        };
        let desired = tick
            .plan
            .workers
            .on_demand
            .saturating_add(tick.plan.workers.spot);
        scale_workers(
            &mut self.workers,
            &mut self.next_worker,
            desired,
            &self.launcher,
            LOCAL_POOL,
            &tick.plan.workers.reason.to_string(),
        );
        let ready = count_phase(&self.workers, Phase::Ready);
        let starting = count_phase(&self.workers, Phase::Starting);
        self.status = self
            .models
            .iter()
            .map(|m| model_status(&m.record.id, &tick, ready, starting))
            .collect();
        for i in 0..self.models.len() {
            let state = self.status[i].state;
            self.publish(broker, i, state).await;
        }
    }

    async fn publish(&mut self, broker: &dyn Broker, i: usize, state: ModelState) {
        let id = self.models[i].record.id.clone();
        if self.published.get(&id) == Some(&state) {
            return;
        }
        let mut record = self.models[i].record.clone();
        record.state = state;
        match broker.put_model(&record).await {
            Ok(()) => {
                self.published.insert(id, state);
            }
            Err(e) => tracing::warn!(model = %id, error = %e, "cannot publish model state"),
        }
    }

    /// Drains every worker (within `deadline`) and publishes every model scaled to zero.
    pub(super) async fn stop(&mut self, broker: &dyn Broker, deadline: tokio::time::Instant) {
        for w in &mut self.workers {
            if w.is_active() {
                w.request_stop();
            }
        }
        for w in self.workers.drain(..) {
            let name = w.name.clone();
            match tokio::time::timeout_at(deadline, w.join()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(worker = %name, error = %e, "pool worker failed"),
                Err(_) => tracing::warn!(worker = %name, "pool worker did not drain in time"),
            }
        }
        for i in 0..self.models.len() {
            self.status[i].state = ModelState::ScaledToZero;
            self.publish(broker, i, ModelState::ScaledToZero).await;
        }
    }
}

/// A model's status before any tick: scaled to zero, nothing queued.
pub(super) fn idle_status(id: &str) -> ModelStatus {
    ModelStatus {
        id: id.to_string(),
        state: ModelState::ScaledToZero,
        ready: 0,
        starting: 0,
        stopping: 0,
        desired: 0,
        backlog: 0,
        in_flight: 0,
        decoding: 0,
        oldest_wait_ms: None,
        last_cold_start_ms: None,
        cold_starts: 0,
        reason: String::new(),
    }
}

/// One model's status in the pool: `ready` the workers that have it loaded, `starting` those
/// loading it, `desired` the holders the placement wants; its state is the pool's (a
/// request is served once a worker is up, which loads the model on assignment).
fn model_status(id: &str, tick: &PoolTick, ready: u32, starting: u32) -> ModelStatus {
    let holding = |f: &dyn Fn(&tidal_queue::PoolHeartbeat) -> bool| {
        tick.beats.iter().filter(|b| f(b)).count() as u32
    };
    let queue = tick.queues.iter().find(|q| q.model == id);
    let depth = queue.map(|q| q.depth).unwrap_or_default();
    ModelStatus {
        id: id.to_string(),
        state: if ready > 0 {
            ModelState::Ready
        } else if starting > 0 {
            ModelState::Starting
        } else {
            ModelState::ScaledToZero
        },
        ready: holding(&|b| b.loaded.iter().any(|l| l.model == id)),
        starting: holding(&|b| b.loading.iter().any(|m| m == id)),
        stopping: holding(&|b| b.unloading.iter().any(|m| m == id)),
        desired: tick.plan.holders.get(id).copied().unwrap_or(0),
        backlog: depth.backlog,
        in_flight: depth.in_flight,
        decoding: depth.decoding,
        oldest_wait_ms: depth.oldest_wait_ms,
        last_cold_start_ms: None,
        cold_starts: 0,
        reason: format!("pool {LOCAL_POOL}"),
    }
}
