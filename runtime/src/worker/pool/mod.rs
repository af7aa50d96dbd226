//! Pool worker (`tidal runtime --pool`): one process that holds one or more models and
//! loads or unloads one on command, without restarting, so that many models share one warm
//! pool of workers.
//!
//! Each loaded model runs the single-model queue worker ([`super::Worker`]) over its own
//! engine, under the pool worker's name: the same claim loop, job tasks, chores and
//! per-model heartbeat (`{prefix}workers:{model}`, which gateway admission and autoscaling
//! read as for any worker), so every job keeps the preemption-safe path and every usage
//! event names its model and this worker. Unloading a model is that worker's drain: it
//! stops claiming the model, lets its sequences finish within the drain timeout and
//! re-enqueues the rest with what they delivered (`resume`); then the engine is dropped.
//! Loads run on blocking threads, so the other models keep serving meanwhile.
//!
//! What the worker holds follows its assignment (`{prefix}pool:{pool}:assign`), read every
//! [`ASSIGNMENT_POLL`]: assigned models it does not hold are loaded from its model directory
//! ([`ModelDir`], models pinned to files first, [`PinnedModel`]; SHA-256 checked before the
//! first load), held models no longer assigned are unloaded. Without an assignment (none
//! written, or removed with a stale heartbeat) it keeps what it holds, and
//! [`PoolHandle::load`] / [`PoolHandle::unload`] drive it directly (tests, benchmarks, a
//! local fleet). Every heartbeat it reports its memory, models (with the completion tokens
//! each delivered since its load) and node cache in `{prefix}pool:{pool}:workers`
//! ([`tidal_queue::PoolHeartbeat`]).
//!
//! Memory: `memory_bytes` is what the models may take. A model counts its memory plan's
//! total (weights, KV cache and one step's activation buffers, worked out from its file's
//! header and the engine settings) from the end of its plan until its unload ends, and its
//! file's size while the plan is worked out; a load whose plan does not fit the memory left
//! is refused before anything is allocated. Unloaded models stay in the host's page cache
//! ([`host_cache`]).

mod beat;
pub mod host_cache;
mod loading;
pub mod model_dir;
pub mod pinned;
mod state;
#[cfg(test)]
mod tests;

pub use model_dir::{ModelDir, ModelEntry};
pub use pinned::PinnedModel;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidal_queue::Broker;
use tokio::sync::{mpsc, oneshot};

use super::{WorkerConfig, WorkerSummary};
use crate::engine::EngineConfig;
use crate::model::QuantizeTo;

/// Why a pool worker could not start, or could not load or unload a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// A setting is out of range.
    #[error("invalid pool worker setting: {0}")]
    Config(String),
    /// The model directory or its manifest cannot be read.
    #[error("model directory: {0}")]
    ModelDir(String),
    /// A model id that cannot name a file under the model directory.
    #[error("bad model id {0:?}: {1}")]
    BadModelId(String, String),
    /// The model directory has no file for this model.
    #[error("model {0:?} is not in the model directory")]
    NotInModelDir(String),
    /// The file pinned to this model (`--pool-model`) or named by the manifest cannot be
    /// read.
    #[error("model {model:?}: its file {path} cannot be read: {reason}")]
    FileUnreadable {
        /// The model id.
        model: String,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file's SHA-256 is not the one expected (`--pool-model-sha256` or the manifest's):
    /// it is never loaded.
    #[error("model {model:?}: {path} has sha256 {got}, expected {want}; not loaded")]
    Checksum {
        /// The model id.
        model: String,
        /// Its file.
        path: PathBuf,
        /// The expected SHA-256.
        want: String,
        /// The file's.
        got: String,
    },
    /// Its weights, KV cache and activations do not fit the memory left.
    #[error(
        "model {model:?} takes {bytes} bytes (weights, KV cache and activations) but only \
         {free} of the worker's memory are free"
    )]
    DoesNotFit {
        /// The model id.
        model: String,
        /// What it takes.
        bytes: u64,
        /// What is free.
        free: u64,
    },
    /// Loading failed (a broken file, an engine that would not start).
    #[error("loading model {model:?}: {reason}")]
    Load {
        /// The model id.
        model: String,
        /// What went wrong.
        reason: String,
    },
    /// The model is being unloaded; load it again once that is done.
    #[error("model {0:?} is unloading")]
    Unloading(String),
    /// The pool worker stopped (shutdown) before the command was done.
    #[error("the pool worker stopped")]
    Stopped,
}

/// How a pool worker runs. Build with [`PoolConfig::new`] and adjust the public fields.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The pool's name (its keys are `{prefix}pool:{pool}:...`).
    pub pool: String,
    /// The node it runs on (reported: its model directory is the node's cache).
    pub node: String,
    /// Settings of each model's queue worker; `model_id` is set per model, `name` is this
    /// worker's name in every model's stream and in the pool.
    pub worker: WorkerConfig,
    /// Engine settings of every model it loads.
    pub engine: EngineConfig,
    /// Re-quantisation at load, as `--quantize`.
    pub quantize: Option<QuantizeTo>,
    /// Memory the models may take, bytes: each one's weights, KV cache and activations.
    pub memory_bytes: u64,
    /// Bytes unloaded models may keep in the page cache (`None`: as the kernel decides).
    pub host_cache_bytes: Option<u64>,
    /// How often the worker reads its assignment ([`ASSIGNMENT_POLL`]): a model assigned
    /// to it waits up to this long before its load starts.
    pub assignment_poll: Duration,
}

/// How often a pool worker reads its assignment by default: one small read, well below
/// the time a load takes, so that the swap-in is the load and not the wait for it.
pub const ASSIGNMENT_POLL: Duration = Duration::from_millis(200);

impl PoolConfig {
    /// A pool worker named `name` in `pool` with `memory_bytes` for its models; defaults
    /// elsewhere ([`WorkerConfig::new`], [`EngineConfig::default`]).
    pub fn new(pool: impl Into<String>, name: impl Into<String>, memory_bytes: u64) -> Self {
        let pool = pool.into();
        PoolConfig {
            worker: WorkerConfig::new(format!("pool:{pool}"), name),
            pool,
            node: std::env::var("NODE_NAME").unwrap_or_default(),
            engine: EngineConfig::default(),
            quantize: None,
            memory_bytes,
            host_cache_bytes: None,
            assignment_poll: ASSIGNMENT_POLL,
        }
    }

    /// Checks that the settings can work together.
    pub fn validate(&self) -> Result<(), PoolError> {
        tidal_queue::pool::check_name("pool", &self.pool)
            .map_err(|e| PoolError::Config(e.to_string()))?;
        if self.memory_bytes == 0 {
            return Err(PoolError::Config(
                "the worker memory must be above zero".into(),
            ));
        }
        if self.assignment_poll.is_zero() {
            return Err(PoolError::Config(
                "the assignment poll interval must be above zero".into(),
            ));
        }
        self.worker_config("m")
            .validate()
            .map_err(|e| PoolError::Config(e.to_string()))
    }

    /// The queue worker settings of `model`.
    fn worker_config(&self, model: &str) -> WorkerConfig {
        WorkerConfig {
            model_id: model.to_owned(),
            ..self.worker.clone()
        }
    }
}

/// A command to the running pool worker.
enum Command {
    Load(String, oneshot::Sender<Result<f64, PoolError>>),
    Unload(String, oneshot::Sender<Result<WorkerSummary, PoolError>>),
}

/// What the pool worker holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// Models loaded and serving.
    pub loaded: Vec<String>,
    /// Models loading.
    pub loading: Vec<String>,
    /// Models unloading (draining).
    pub unloading: Vec<String>,
    /// Jobs held, all models.
    pub jobs: usize,
    /// Whether the pool worker is shutting down.
    pub draining: bool,
}

/// Commands to a running pool worker and a view of it (cheap to clone).
#[derive(Clone)]
pub struct PoolHandle {
    commands: mpsc::UnboundedSender<Command>,
    view: Arc<Mutex<state::View>>,
    config: Arc<PoolConfig>,
}

impl PoolHandle {
    /// Loads `model` from the model directory and starts serving it; returns the seconds
    /// the load took once its worker claims. An assignment written for this worker
    /// overrides what commands did when the worker next reads it.
    pub async fn load(&self, model: &str) -> Result<f64, PoolError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Load(model.to_owned(), tx))
            .map_err(|_| PoolError::Stopped)?;
        rx.await.map_err(|_| PoolError::Stopped)?
    }

    /// Unloads `model` (a drain of its worker: finish or re-enqueue its jobs, then drop
    /// the engine); returns what its worker did. A model not held unloads at once.
    pub async fn unload(&self, model: &str) -> Result<WorkerSummary, PoolError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Unload(model.to_owned(), tx))
            .map_err(|_| PoolError::Stopped)?;
        rx.await.map_err(|_| PoolError::Stopped)?
    }

    /// What it holds now.
    pub fn snapshot(&self) -> PoolSnapshot {
        self.view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot()
    }

    /// Its settings.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }
}

/// A pool worker: create it, keep its [`PoolHandle`], then [`PoolWorker::run`] it.
pub struct PoolWorker {
    state: state::Pool,
    handle: PoolHandle,
}

impl PoolWorker {
    /// A pool worker serving the models of `dir` from `broker`.
    pub fn new(
        config: PoolConfig,
        dir: ModelDir,
        broker: Arc<dyn Broker>,
    ) -> Result<Self, PoolError> {
        config.validate()?;
        // Models come and go: their large buffers must not stay behind in the heap.
        host_cache::keep_large_allocations_mapped(1 << 20);
        let config = Arc::new(config);
        let (tx, rx) = mpsc::unbounded_channel();
        let view = Arc::new(Mutex::new(state::View::default()));
        let handle = PoolHandle {
            commands: tx,
            view: view.clone(),
            config: config.clone(),
        };
        Ok(PoolWorker {
            state: state::Pool::new(config, Arc::new(dir), broker, rx, view),
            handle,
        })
    }

    /// Commands to it and a view of it.
    pub fn handle(&self) -> PoolHandle {
        self.handle.clone()
    }

    /// Serves until `shutdown` completes, then drains every model (as a single-model
    /// worker drains) and returns each one's summary. Dropping the future stops everything
    /// at once, as a crash would.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Vec<(String, WorkerSummary)> {
        self.state.run(shutdown).await
    }
}
