//! The memory a model will take on its device, worked out from the GGUF header before any
//! weight is read or any KV block allocated: weights (in the types the loader keeps or makes),
//! KV cache, one step's activations and the total, against what the device has. Every load
//! checks it first ([`crate::load::load_model`]), so a model that cannot fit is refused with
//! the numbers instead of being killed half-way through (the OOM killer on a host, an
//! allocation failure on a GPU); `tidal runtime --dry-run` prints it and stops.

mod available;
mod plan;

pub use available::{available, AvailableError};
pub use plan::{activation_bytes, gib, Available, DoesNotFit, MemoryPlan};

use crate::engine::EngineConfig;
use crate::model::{ModelConfig, ModelError, ModelFile, QuantizeTo};

impl MemoryPlan {
    /// The plan for the opened GGUF `file` (its header only: no tensor is read).
    pub fn for_file(
        file: &ModelFile,
        engine: &EngineConfig,
        quantize: Option<QuantizeTo>,
    ) -> Result<Self, ModelError> {
        let config = ModelConfig::from_file(file)?;
        Self::new(
            &config,
            |name| file.tensor_info(name).map(|t| t.ggml_dtype),
            engine,
            quantize,
        )
    }
}

/// What a plan for `engine` is checked against: `engine.device_memory` when given, else what
/// the device has free now.
pub fn available_for(engine: &EngineConfig) -> Result<Available, AvailableError> {
    match engine.device_memory {
        Some(bytes) => Ok(Available {
            bytes,
            source: "--device-memory".into(),
        }),
        None => available(engine.device),
    }
}

#[cfg(test)]
mod tests;
