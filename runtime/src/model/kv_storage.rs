/// Physical paged KV memory: per layer, K and V as `[num_blocks * block_size, kv_width]` f32.
///
/// The block manager (`crate::kv_cache`) decides which block each token goes to; this is only
/// the memory those block ids index.
pub struct KvStorage {
    block_size: usize,
    num_blocks: usize,
    kv_width: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvStorage {
    /// Allocates `num_blocks` blocks of `block_size` tokens for `num_layers` layers.
    pub fn new(num_layers: usize, num_blocks: usize, block_size: usize, kv_width: usize) -> Self {
        let slots = num_blocks * block_size * kv_width;
        Self {
            block_size,
            num_blocks,
            kv_width,
            keys: (0..num_layers).map(|_| vec![0f32; slots]).collect(),
            values: (0..num_layers).map(|_| vec![0f32; slots]).collect(),
        }
    }

    /// How many blocks fit in `bytes` for a model with the given per-token KV footprint.
    pub fn blocks_for_memory(bytes: usize, block_size: usize, kv_bytes_per_token: usize) -> usize {
        bytes / (block_size * kv_bytes_per_token).max(1)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks per layer.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// KV heads × head dim.
    pub fn kv_width(&self) -> usize {
        self.kv_width
    }

    /// K and V memory of one layer, mutable.
    pub fn layer_mut(&mut self, layer: usize) -> (&mut [f32], &mut [f32]) {
        (&mut self.keys[layer], &mut self.values[layer])
    }

    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        2 * self.keys.len()
            * self.num_blocks
            * self.block_size
            * self.kv_width
            * std::mem::size_of::<f32>()
    }
}
