//! The real [`Launcher`]s: [`RuntimeLauncher`] loads a GGUF model into an engine on a
//! blocking thread and runs a queue worker on it ([`tidal_runtime::worker::Worker`]);
//! stopping drains the worker and drops the engine, which frees the KV memory and unmaps the
//! weights. [`PoolLauncher`] runs a pool worker ([`PoolWorker`]) that loads the models it is
//! assigned.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tidal_queue::Broker;
use tidal_runtime::engine::EngineConfig;
use tidal_runtime::load::load_model;
use tidal_runtime::model::QuantizeTo;
use tidal_runtime::worker::pool::{ModelDir, PinnedModel, PoolConfig, PoolWorker};
use tidal_runtime::worker::{ClaimBudget, Worker, WorkerConfig};
use tokio::sync::{oneshot, watch};

use crate::fleet::{LaunchError, Launcher};

/// How one model is loaded.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The verified local GGUF file.
    pub path: PathBuf,
    /// Engine settings of each worker.
    pub engine: EngineConfig,
    /// Re-quantise at load.
    pub quantize: Option<QuantizeTo>,
}

/// Starts in-process workers for the models it knows.
pub struct RuntimeLauncher {
    broker: Arc<dyn Broker>,
    models: HashMap<String, LaunchSpec>,
    drain_timeout: Duration,
    claim_timeout: Duration,
    claim_budget: ClaimBudget,
}

impl RuntimeLauncher {
    /// A launcher for `models` (by model id) whose workers serve `broker`.
    pub fn new(
        broker: Arc<dyn Broker>,
        models: HashMap<String, LaunchSpec>,
        drain_timeout: Duration,
        claim_timeout: Duration,
    ) -> Self {
        Self {
            broker,
            models,
            drain_timeout,
            claim_timeout,
            claim_budget: ClaimBudget::default(),
        }
    }

    /// Workers claim under `budget` (`WorkerConfig::claim_budget`; default one second of
    /// measured prefill).
    pub fn with_claim_budget(mut self, budget: ClaimBudget) -> Self {
        self.claim_budget = budget;
        self
    }
}

#[async_trait]
impl Launcher for RuntimeLauncher {
    async fn run(
        &self,
        model: &str,
        name: &str,
        ready: oneshot::Sender<Duration>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), LaunchError> {
        let spec = self
            .models
            .get(model)
            .cloned()
            .ok_or_else(|| LaunchError(format!("no model `{model}` in this fleet")))?;
        let started = Instant::now();
        let load =
            tokio::task::spawn_blocking(move || load_model(&spec.path, spec.engine, spec.quantize));
        // A stop that arrives while loading abandons the load (the model is dropped as soon
        // as it is ready).
        let loaded = tokio::select! {
            r = load => r
                .map_err(|e| LaunchError(format!("model load task failed: {e}")))?
                .map_err(|e| LaunchError(e.to_string()))?,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        let mut config = WorkerConfig::new(model, name);
        config.drain_timeout = self.drain_timeout;
        config.claim_timeout = self.claim_timeout;
        config.claim_budget = self.claim_budget;
        let worker = Worker::new(Arc::new(loaded.into_model()), self.broker.clone(), config)
            .map_err(|e| LaunchError(e.to_string()))?;
        let _ = ready.send(started.elapsed());
        let summary = worker
            .run(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await;
        tracing::info!(
            model,
            worker = name,
            ?summary,
            "worker drained; model unloaded"
        );
        Ok(())
    }
}

/// Starts in-process pool workers (`tidal up --pool-memory`): each holds the models its
/// assignment names, loaded from their verified files ([`PinnedModel`]), and loads or
/// unloads one without restarting.
pub struct PoolLauncher {
    broker: Arc<dyn Broker>,
    /// The pool's model directory (only the pinned files are read from it).
    dir: PathBuf,
    models: Vec<PinnedModel>,
    engine: EngineConfig,
    quantize: Option<QuantizeTo>,
    memory_bytes: u64,
    drain_timeout: Duration,
    claim_timeout: Duration,
}

impl PoolLauncher {
    /// A launcher of pool workers that may load `models` (ids and files), each worker's
    /// models taking at most `memory_bytes`, serving `broker`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        broker: Arc<dyn Broker>,
        dir: PathBuf,
        models: Vec<PinnedModel>,
        engine: EngineConfig,
        quantize: Option<QuantizeTo>,
        memory_bytes: u64,
        drain_timeout: Duration,
        claim_timeout: Duration,
    ) -> Self {
        Self {
            broker,
            dir,
            models,
            engine,
            quantize,
            memory_bytes,
            drain_timeout,
            claim_timeout,
        }
    }
}

#[async_trait]
impl Launcher for PoolLauncher {
    async fn run(
        &self,
        pool: &str,
        name: &str,
        ready: oneshot::Sender<Duration>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), LaunchError> {
        let started = Instant::now();
        let mut config = PoolConfig::new(pool, name, self.memory_bytes);
        config.worker.drain_timeout = self.drain_timeout;
        config.worker.claim_timeout = self.claim_timeout;
        config.engine = self.engine.clone();
        config.quantize = self.quantize;
        config.node = "local".into();
        let dir = ModelDir::with_pinned(&self.dir, self.models.clone())
            .map_err(|e| LaunchError(e.to_string()))?;
        let worker = PoolWorker::new(config, dir, self.broker.clone())
            .map_err(|e| LaunchError(e.to_string()))?;
        // it holds nothing yet: ready at once, its models load on assignment
        let _ = ready.send(started.elapsed());
        let summaries = worker
            .run(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await;
        tracing::info!(pool, worker = name, ?summaries, "pool worker drained");
        Ok(())
    }
}
