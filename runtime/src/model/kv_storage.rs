//! Physical paged KV memory: per layer, K and V as `[num_blocks * block_size, kv_width]`
//! values in the configured element type (`--kv-cache-dtype`).
//!
//! The block manager (`crate::kv_cache`) decides which block each token goes to; this is only
//! the memory those block ids index.

use tidal_kernels::{KvBuffer, KvCache, KvCacheMut, KvDtype};

use super::config::ModelConfig;

/// The KV memory of every layer of one model.
pub struct KvStorage {
    dtype: KvDtype,
    block_size: usize,
    num_blocks: usize,
    n_kv_heads: usize,
    head_dim: usize,
    layers: Vec<(KvBuffer, KvBuffer)>,
}

impl KvStorage {
    /// Allocates `num_blocks` blocks of `block_size` tokens for every layer of `model`.
    pub fn new(model: &ModelConfig, dtype: KvDtype, num_blocks: usize, block_size: usize) -> Self {
        let slots = num_blocks * block_size;
        let buffer = || KvBuffer::new(dtype, slots, model.num_kv_heads, model.head_dim);
        Self {
            dtype,
            block_size,
            num_blocks,
            n_kv_heads: model.num_kv_heads,
            head_dim: model.head_dim,
            layers: (0..model.num_layers)
                .map(|_| (buffer(), buffer()))
                .collect(),
        }
    }

    /// How many blocks fit in `bytes` for a model with the given per-token KV footprint.
    pub fn blocks_for_memory(bytes: usize, block_size: usize, kv_bytes_per_token: usize) -> usize {
        bytes / (block_size * kv_bytes_per_token).max(1)
    }

    /// Element type of the cache.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks per layer.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Layers held.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// KV heads × head dim.
    pub fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// K and V memory of one layer, writable.
    pub fn layer_mut(&mut self, layer: usize) -> (KvCacheMut<'_>, KvCacheMut<'_>) {
        let (k, v) = &mut self.layers[layer];
        (k.view_mut(), v.view_mut())
    }

    /// K and V memory of one layer, read-only.
    pub fn layer(&self, layer: usize) -> (KvCache<'_>, KvCache<'_>) {
        let (k, v) = &self.layers[layer];
        (k.view(), v.view())
    }

    /// Bytes held, int8 scales included.
    pub fn memory_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| k.memory_bytes() + v.memory_bytes())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Architecture, RopeScaling};

    fn config() -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            name: None,
            num_layers: 3,
            hidden_size: 64,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            ffn_size: 96,
            vocab_size: 100,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            context_length: 128,
            attention_scale: 0.25,
            sliding_window: None,
        }
    }

    #[test]
    fn memory_matches_the_per_token_accounting_for_every_dtype() {
        let c = config();
        for dtype in KvDtype::ALL {
            let kv = KvStorage::new(&c, dtype, 5, 4);
            assert_eq!(kv.dtype(), dtype);
            assert_eq!(kv.memory_bytes(), 5 * 4 * c.kv_bytes_per_token(dtype));
            // So a memory budget sized by bytes per token is never exceeded.
            let budget = 10_000;
            let blocks = KvStorage::blocks_for_memory(budget, 4, c.kv_bytes_per_token(dtype));
            assert!(KvStorage::new(&c, dtype, blocks, 4).memory_bytes() <= budget);
            assert!(KvStorage::new(&c, dtype, blocks + 1, 4).memory_bytes() > budget);
        }
    }
}
