//! The engine: one thread that owns the model, the KV memory and the scheduler, and runs
//! step after step (schedule → forward → sample → stream), like vLLM's `EngineCore` busy
//! loop. Callers talk to it through channels, so the HTTP server and the queue worker never
//! block on the model.

mod config;
mod core;
mod executor;
mod metrics;
mod prefill_rate;
mod request;
mod sequence;

pub use config::{Device, EngineConfig};
pub(crate) use executor::Executor;
pub use request::{
    FinishReason, GenerationEvent, GenerationRequest, ResumeFrom, TokenLogprob, Usage,
};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use tidal_tokenizer::Tokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;

use crate::model::{Model, ModelConfig};
use crate::scheduler::SchedulerStats;
use crate::speculative::{DraftError, Proposer};

/// Why the engine refused a request.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the engine has stopped")]
    Stopped,
    #[error(
        "KV cache too small: {needed} tokens can never fit in {capacity} (raise --kv-cache-memory)"
    )]
    TooLong { needed: usize, capacity: usize },
    #[error("{0}")]
    Invalid(String),
    /// The draft model of `--speculative draft` cannot be used.
    #[error(transparent)]
    Draft(#[from] DraftError),
}

pub(crate) enum Command {
    Submit {
        id: u64,
        request: GenerationRequest,
        events: UnboundedSender<GenerationEvent>,
    },
}

/// Handle to a running engine; cheap to clone, the engine stops when every handle is gone.
#[derive(Clone)]
pub struct Engine {
    commands: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    model_config: Arc<ModelConfig>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    stats: watch::Receiver<SchedulerStats>,
    capacity_tokens: usize,
    weight_bytes: usize,
}

impl Engine {
    /// Bytes of weight matrices one decode step reads (as loaded: after any re-quantisation,
    /// so not the file's size).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Allocates the KV memory and starts the engine thread; with `--speculative draft`,
    /// loads the draft model first (refused unless its vocabulary is the target's).
    pub fn start(
        model: Model,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        let model_config = Arc::new(model.config().clone());
        let num_blocks = config.num_blocks(&model_config);
        if num_blocks == 0 {
            return Err(EngineError::Invalid(format!(
                "--kv-cache-memory {} bytes holds no block of {} tokens ({} bytes per token)",
                config.kv_cache_memory,
                config.block_size,
                config.kv_bytes_per_token(&model_config)
            )));
        }
        config
            .speculative
            .validate()
            .map_err(EngineError::Invalid)?;
        let weight_bytes = model.weight_bytes();
        let proposer = Proposer::for_config(
            &config,
            &tokenizer,
            model_config.vocab_size,
            weight_bytes,
            num_blocks,
        )?;
        let executor = executor::Executor::new(model, &config, num_blocks)?;
        tracing::info!(
            device = %config.device,
            blocks = num_blocks,
            block_size = config.block_size,
            kv_tokens = num_blocks * config.block_size,
            kv_mib = executor.kv_memory_bytes() >> 20,
            "KV cache allocated"
        );
        let (commands, receiver) = mpsc::channel();
        let (stats_tx, stats) = watch::channel(SchedulerStats::default());
        let core = core::EngineCore::new(
            executor,
            tokenizer.clone(),
            &config,
            num_blocks,
            proposer,
            stats_tx,
        );
        // The loop runs on a worker of the kernels' rayon pool: parallel kernels called from
        // outside a pool pay a cross-thread hand-off on every call (4× slower attention).
        let pool = kernel_pool(config.threads)
            .map_err(|e| EngineError::Invalid(format!("cannot start kernel threads: {e}")))?;
        std::thread::Builder::new()
            .name("tidal-engine".into())
            .spawn(move || pool.install(move || core.run(receiver)))
            .map_err(|e| EngineError::Invalid(format!("cannot start engine thread: {e}")))?;
        Ok(Self {
            commands,
            next_id: Arc::new(AtomicU64::new(1)),
            model_config,
            tokenizer,
            capacity_tokens: num_blocks * config.block_size,
            weight_bytes,
            config,
            stats,
        })
    }

    /// Queues a request; its events arrive on the returned receiver. Dropping the receiver
    /// cancels the request and frees its KV blocks at the next step. A request with
    /// `resume` continues an earlier run (see [`ResumeFrom`]).
    pub fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<UnboundedReceiver<GenerationEvent>, EngineError> {
        if let Some(resume) = &request.resume {
            if resume.token_ids.len() > request.max_tokens {
                return Err(EngineError::Invalid(format!(
                    "resumed from {} tokens, more than max_tokens {}",
                    resume.token_ids.len(),
                    request.max_tokens
                )));
            }
            let vocab = self.model_config.vocab_size;
            if let Some(bad) = resume.token_ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(EngineError::Invalid(format!(
                    "resumed token id {bad} is outside the vocabulary (size {vocab})"
                )));
            }
        }
        let needed = request.prompt.len() + request.max_tokens;
        if needed > self.capacity_tokens {
            return Err(EngineError::TooLong {
                needed,
                capacity: self.capacity_tokens,
            });
        }
        let (events, receiver) = unbounded_channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.commands
            .send(Command::Submit {
                id,
                request,
                events,
            })
            .map_err(|_| EngineError::Stopped)?;
        Ok(receiver)
    }

    /// The model's hyper-parameters.
    pub fn model_config(&self) -> &ModelConfig {
        &self.model_config
    }

    /// The tokenizer the engine detokenises with.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Tokens the whole KV cache holds: no single request may need more.
    pub fn capacity_tokens(&self) -> usize {
        self.capacity_tokens
    }

    /// Load figures as of the last engine step (running, waiting, KV usage, prefix hits).
    pub fn stats(&self) -> SchedulerStats {
        *self.stats.borrow()
    }

    /// The same figures as a channel that changes once per engine step: `changed()` wakes a
    /// caller (the queue worker waiting for room) when the engine has made progress.
    pub fn stats_updates(&self) -> watch::Receiver<SchedulerStats> {
        self.stats.clone()
    }

    /// The engine's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
}

/// A rayon pool of `threads` kernel workers (`None`: one per core) for forward passes to run
/// in (`pool.install`). Parallel kernels called from outside a pool pay a cross-thread hand-off
/// on every call: the engine's loop, and the benchmarks that time passes without an engine,
/// run inside one.
pub(crate) fn kernel_pool(
    threads: Option<usize>,
) -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .thread_name(|i| format!("tidal-kernel-{i}"))
        .build()
}

#[cfg(test)]
mod tests;
