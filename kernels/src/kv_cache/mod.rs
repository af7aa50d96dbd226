//! The paged KV cache's memory: its element types and the write into it.
//!
//! A layer's K (and V) cache is `[num_slots, n_kv_heads, head_dim]` values with
//! `slot = block * block_size + offset`, as vLLM lays out its cache blocks. The values are
//! stored as f32, f16 or int8 ([`KvDtype`]); int8 keeps one f32 scale per (slot, KV head).
//!
//! Why per (token, head) scales for int8 rather than per (block, head): a block fills one token
//! per decode step, and a block's content must never change once written (prefix-cache blocks
//! are shared between sequences, and the block manager promises no copying on append). A
//! per-block scale is unknown until the block is full, and widening it later would re-round the
//! earlier tokens. A per-token scale is fixed when the token is written, so the cached values
//! are the same whether a token arrived in a prefill chunk or a decode step (chunking and
//! batching cannot change results), and it follows each token's own magnitude. It costs 4
//! bytes per head of `head_dim` values: 68 bytes instead of 256 (f32) at head dim 64, 3.8×.

mod buffer;
pub(crate) mod elem;
mod int8;
mod write;

pub use buffer::KvBuffer;
pub use int8::{dequantize_int8, quantize_int8};
pub use write::write_kv;

/// Element type of the KV cache (`--kv-cache-dtype`). The default is f16, as in llama.cpp:
/// twice the tokens of f32 in the same memory, perplexity within the noise of f32 (+0.17 %,
/// docs/benchmarks.md), and faster with many sequences, whose decode steps wait on reading
/// the cache (the SIMD attention builds convert f16 as they load it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum KvDtype {
    /// 4 bytes per value, exact.
    F32,
    /// 2 bytes per value (IEEE half, round to nearest; values beyond ±65504 saturate).
    #[default]
    F16,
    /// 1 byte per value plus an f32 scale per (token, KV head): symmetric absmax rounding.
    Int8,
}

impl KvDtype {
    /// Every dtype, in the order the CLI lists them.
    pub const ALL: [KvDtype; 3] = [KvDtype::F32, KvDtype::F16, KvDtype::Int8];

    /// The flag spelling: `f32`, `f16` or `int8`.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Int8 => "int8",
        }
    }

    /// Bytes one token's K (or V) takes for one KV head of `head_dim` values, scale included.
    pub fn bytes_per_head(self, head_dim: usize) -> usize {
        match self {
            KvDtype::F32 => 4 * head_dim,
            KvDtype::F16 => 2 * head_dim,
            KvDtype::Int8 => head_dim + std::mem::size_of::<f32>(),
        }
    }

    /// Bytes of K and V one token takes across `num_layers` layers.
    pub fn bytes_per_token(self, num_layers: usize, n_kv_heads: usize, head_dim: usize) -> usize {
        2 * num_layers * n_kv_heads * self.bytes_per_head(head_dim)
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            "int8" => Ok(KvDtype::Int8),
            other => Err(format!(
                "unknown KV cache dtype `{other}` (expected f32, f16 or int8)"
            )),
        }
    }
}

/// One layer's K or V cache, read-only (see the module docs for the layout).
#[derive(Debug, Clone, Copy)]
pub enum KvCache<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
    /// `values[slot * kv_width + h * head_dim + i] * scales[slot * n_kv_heads + h]`.
    Int8 {
        values: &'a [i8],
        scales: &'a [f32],
    },
}

/// One layer's K or V cache, writable.
#[derive(Debug)]
pub enum KvCacheMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [half::f16]),
    /// As [`KvCache::Int8`].
    Int8 {
        values: &'a mut [i8],
        scales: &'a mut [f32],
    },
}

impl KvCache<'_> {
    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        match self {
            KvCache::F32(_) => KvDtype::F32,
            KvCache::F16(_) => KvDtype::F16,
            KvCache::Int8 { .. } => KvDtype::Int8,
        }
    }

    /// Number of values (excluding scales).
    pub fn len(&self) -> usize {
        match self {
            KvCache::F32(v) => v.len(),
            KvCache::F16(v) => v.len(),
            KvCache::Int8 { values, .. } => values.len(),
        }
    }

    /// Whether the cache holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> From<&'a [f32]> for KvCache<'a> {
    fn from(v: &'a [f32]) -> Self {
        KvCache::F32(v)
    }
}

impl<'a> From<&'a Vec<f32>> for KvCache<'a> {
    fn from(v: &'a Vec<f32>) -> Self {
        KvCache::F32(v)
    }
}

impl<'a> From<&'a mut [f32]> for KvCacheMut<'a> {
    fn from(v: &'a mut [f32]) -> Self {
        KvCacheMut::F32(v)
    }
}

impl<'a> From<&'a mut Vec<f32>> for KvCacheMut<'a> {
    fn from(v: &'a mut Vec<f32>) -> Self {
        KvCacheMut::F32(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_every_dtype() {
        for d in KvDtype::ALL {
            assert_eq!(d.name().parse::<KvDtype>(), Ok(d));
            assert_eq!(d.to_string(), d.name());
        }
        assert_eq!("INT8".parse::<KvDtype>(), Ok(KvDtype::Int8));
        assert!("q8_0"
            .parse::<KvDtype>()
            .unwrap_err()
            .contains("f32, f16 or int8"));
    }

    #[test]
    fn bytes_per_token_counts_scales() {
        // SmolLM2-135M: 30 layers, 3 KV heads of 64.
        assert_eq!(KvDtype::F32.bytes_per_token(30, 3, 64), 2 * 30 * 3 * 256);
        assert_eq!(KvDtype::F16.bytes_per_token(30, 3, 64), 2 * 30 * 3 * 128);
        assert_eq!(KvDtype::Int8.bytes_per_token(30, 3, 64), 2 * 30 * 3 * 68);
        assert_eq!(KvDtype::Int8.bytes_per_head(1), 5);
    }
}
