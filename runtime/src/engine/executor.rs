//! The model and its KV memory on the device the engine runs on (`--device`).

use crate::model::{ForwardBatch, KvStorage, Model, ModelConfig, ModelError};

use super::{Device, EngineConfig, EngineError};

/// Runs forward passes on the CPU or on a GPU; the engine loop does not care which.
// One per engine, built once and never moved on a hot path: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Executor {
    Cpu {
        model: Model,
        kv: KvStorage,
    },
    #[cfg(feature = "cuda")]
    Cuda(crate::model::CudaModel),
}

impl Executor {
    /// Puts `model` and a KV cache of `num_blocks` blocks on `config.device`.
    pub fn new(
        model: Model,
        config: &EngineConfig,
        num_blocks: usize,
    ) -> Result<Self, EngineError> {
        match config.device {
            Device::Cpu => {
                let started = std::time::Instant::now();
                let repacked = model.prepare_cpu(tidal_kernels::DotKernel::selected());
                if repacked > 0 {
                    tracing::info!(
                        matrices = repacked,
                        ms = started.elapsed().as_millis() as u64,
                        "weights repacked for the CPU kernels"
                    );
                }
                let kv = KvStorage::new(
                    model.config(),
                    config.kv_cache_dtype,
                    num_blocks,
                    config.block_size,
                );
                Ok(Executor::Cpu { model, kv })
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                let gpu = tidal_kernels::cuda::Gpu::new(ordinal)
                    .map_err(|e| EngineError::Invalid(format!("--device cuda:{ordinal}: {e}")))?;
                let model = crate::model::CudaModel::new(
                    gpu,
                    model,
                    config.kv_cache_dtype,
                    num_blocks,
                    config.block_size,
                )
                .map_err(|e| EngineError::Invalid(format!("--device cuda:{ordinal}: {e}")))?;
                Ok(Executor::Cuda(model))
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(EngineError::Invalid(
                "--device cuda: this build of tidal has no CUDA support \
                 (rebuild with `cargo build --release --features cuda`)"
                    .into(),
            )),
        }
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        match self {
            Executor::Cpu { model, .. } => model.config(),
            #[cfg(feature = "cuda")]
            Executor::Cuda(m) => m.config(),
        }
    }

    /// Bytes of KV cache held (on the device it runs on).
    pub fn kv_memory_bytes(&self) -> usize {
        match self {
            Executor::Cpu { kv, .. } => kv.memory_bytes(),
            #[cfg(feature = "cuda")]
            Executor::Cuda(m) => m.kv_memory_bytes(),
        }
    }

    /// One forward pass; logits of the sequences that want them, in batch order.
    pub fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<Vec<f32>, ModelError> {
        match self {
            Executor::Cpu { model, kv } => model.forward(batch, kv),
            #[cfg(feature = "cuda")]
            Executor::Cuda(m) => m.forward(batch),
        }
    }
}
