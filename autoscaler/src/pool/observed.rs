//! What the placement sees of the pool on one tick: each model's demand and each worker's
//! memory, models and node cache. The controller reads these from the broker (per-model
//! backlog, pending entries, last enqueue) and from the workers' heartbeats.

use crate::observed::CapacityObserved;
use std::time::Duration;

/// One model's demand on the pool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelDemand {
    /// The model id (`namespace/name` on Kubernetes).
    pub model: String,
    /// Jobs in its stream not yet claimed by any worker.
    pub queued: u64,
    /// Jobs claimed and not yet acknowledged, on all workers.
    pub in_flight: u64,
    /// When its last request was enqueued, if ever (same clock as `now`).
    pub last_request_at: Option<Duration>,
    /// Device memory its weights take on a worker, bytes.
    pub memory_bytes: u64,
}

impl ModelDemand {
    /// Whether it has work: queued or running anywhere.
    pub fn busy(&self) -> bool {
        self.queued > 0 || self.in_flight > 0
    }
}

/// A model loaded on a worker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoadedModel {
    /// The model id.
    pub model: String,
    /// When the worker last ran a job of it (or finished loading it), same clock as `now`.
    pub last_used: Duration,
    /// Its jobs running on this worker.
    pub in_flight: u64,
}

/// One ready pool worker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkerState {
    /// The worker id (pod name).
    pub worker: String,
    /// The node it runs on (its local cache is the node's).
    pub node: String,
    /// Device memory still free for weights, bytes: its memory less what `loaded` and
    /// `loading` take.
    pub free_memory_bytes: u64,
    /// Models loaded and serving.
    pub loaded: Vec<LoadedModel>,
    /// Models it is loading now (their memory is taken; they count as held).
    pub loading: Vec<String>,
    /// Models whose weights are in its node's local cache (page cache or local disk), which
    /// load in a swap rather than a download.
    pub cached: Vec<String>,
    /// Models it failed to load (a file missing or corrupt on its node, too large once
    /// loaded): they are never placed on it again while it reports them.
    pub refused: Vec<String>,
}

impl WorkerState {
    /// Whether it holds `model`, loaded or loading.
    pub fn holds(&self, model: &str) -> bool {
        self.loaded.iter().any(|l| l.model == model) || self.loading.iter().any(|m| m == model)
    }

    /// Whether it is loading a model now.
    pub fn is_loading(&self) -> bool {
        !self.loading.is_empty()
    }

    /// Jobs running on it, all models.
    pub fn in_flight(&self) -> u64 {
        self.loaded.iter().map(|l| l.in_flight).sum()
    }
}

/// Everything the placement reads on one tick.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PoolObserved {
    /// Every model served by the pool, busy or not.
    pub models: Vec<ModelDemand>,
    /// The ready workers (those still starting are counted in `spot`/`on_demand`).
    pub workers: Vec<WorkerState>,
    /// The pool's spot workers, as a model's fleet reports them.
    pub spot: CapacityObserved,
    /// The pool's on-demand workers.
    pub on_demand: CapacityObserved,
}
