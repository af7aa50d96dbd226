use crate::model::{KvDtype, ModelConfig};
use crate::speculative::SpeculativeConfig;

/// Engine settings (the `--kv-cache-memory`, `--max-num-seqs`, ... flags).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Bytes of KV memory; sets the number of blocks.
    pub kv_cache_memory: usize,
    /// Token budget of one step (prefill chunks + decode tokens).
    pub max_num_batched_tokens: usize,
    /// Sequences in one step.
    pub max_num_seqs: usize,
    pub enable_prefix_caching: bool,
    /// Kernel threads (`None`: one per core).
    pub threads: Option<usize>,
    /// Element type of the KV cache (`--kv-cache-dtype`): f16 holds 2× and int8 3.8× the
    /// tokens of f32 in the same `kv_cache_memory`.
    pub kv_cache_dtype: KvDtype,
    /// Where the forward pass runs (`--device`).
    pub device: Device,
    /// Bytes the model may take on its device (`--device-memory`); `None`: what the device
    /// has free now. The load's memory plan is checked against it.
    pub device_memory: Option<usize>,
    /// Speculative decoding (`--speculative`, `--num-speculative-tokens`).
    pub speculative: SpeculativeConfig,
}

/// Where the engine runs the model (`--device cpu|cuda|cuda:N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// This machine's CPU cores (the default, and the oracle for the GPU kernels).
    #[default]
    Cpu,
    /// NVIDIA GPU number N (needs a build with `--features cuda`).
    Cuda(usize),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("unknown device `{s}` (expected cpu, cuda or cuda:N)")),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            kv_cache_memory: 1 << 30,
            max_num_batched_tokens: 512,
            max_num_seqs: 64,
            enable_prefix_caching: true,
            threads: None,
            kv_cache_dtype: KvDtype::default(),
            device: Device::Cpu,
            device_memory: None,
            speculative: SpeculativeConfig::default(),
        }
    }
}

impl EngineConfig {
    /// Bytes of K and V one token takes for this model in the configured KV dtype.
    pub fn kv_bytes_per_token(&self, model: &ModelConfig) -> usize {
        model.kv_bytes_per_token(self.kv_cache_dtype)
    }

    /// Blocks that fit in `kv_cache_memory` for this model.
    pub fn num_blocks(&self, model: &ModelConfig) -> usize {
        crate::model::KvStorage::blocks_for_memory(
            self.kv_cache_memory,
            self.block_size,
            self.kv_bytes_per_token(model),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("CUDA".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
        let err = "tpu".parse::<Device>().unwrap_err();
        assert!(err.contains("cpu, cuda or cuda:N"), "{err}");
        assert!("cuda:x".parse::<Device>().is_err());
    }
}
