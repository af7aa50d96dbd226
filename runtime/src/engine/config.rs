use crate::model::{KvDtype, ModelConfig};

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
            kv_cache_dtype: KvDtype::F32,
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
