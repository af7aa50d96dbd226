//! Owned memory of one layer's K or V cache in a chosen [`KvDtype`].

use half::vec::HalfBitsVecExt;

use super::{KvCache, KvCacheMut, KvDtype};

/// One layer's K or V cache memory: `num_slots` tokens of `n_kv_heads × head_dim` values.
///
/// Allocated zeroed in one piece (`vec![0; n]`, which the allocator serves from fresh pages),
/// so a large cache costs physical memory only as tokens are written.
#[derive(Debug, Clone)]
pub enum KvBuffer {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    Int8 { values: Vec<i8>, scales: Vec<f32> },
}

impl KvBuffer {
    /// A zeroed cache of `num_slots` tokens.
    pub fn new(dtype: KvDtype, num_slots: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        let n = num_slots * n_kv_heads * head_dim;
        match dtype {
            KvDtype::F32 => KvBuffer::F32(vec![0.0; n]),
            // Zeroed u16 words are zeroed f16s; `vec![f16::ZERO; n]` would write every element.
            KvDtype::F16 => KvBuffer::F16(vec![0u16; n].reinterpret_into()),
            KvDtype::Int8 => KvBuffer::Int8 {
                values: vec![0; n],
                scales: vec![0.0; num_slots * n_kv_heads],
            },
        }
    }

    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        self.view().dtype()
    }

    /// Read-only view for [`crate::paged_attention`].
    pub fn view(&self) -> KvCache<'_> {
        match self {
            KvBuffer::F32(v) => KvCache::F32(v),
            KvBuffer::F16(v) => KvCache::F16(v),
            KvBuffer::Int8 { values, scales } => KvCache::Int8 { values, scales },
        }
    }

    /// Writable view for [`crate::write_kv`].
    pub fn view_mut(&mut self) -> KvCacheMut<'_> {
        match self {
            KvBuffer::F32(v) => KvCacheMut::F32(v),
            KvBuffer::F16(v) => KvCacheMut::F16(v),
            KvBuffer::Int8 { values, scales } => KvCacheMut::Int8 { values, scales },
        }
    }

    /// Bytes held, scales included.
    pub fn memory_bytes(&self) -> usize {
        match self {
            KvBuffer::F32(v) => std::mem::size_of_val(v.as_slice()),
            KvBuffer::F16(v) => std::mem::size_of_val(v.as_slice()),
            KvBuffer::Int8 { values, scales } => {
                values.len() + std::mem::size_of_val(scales.as_slice())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_per_token_accounting() {
        for dtype in KvDtype::ALL {
            let b = KvBuffer::new(dtype, 48, 3, 64);
            assert_eq!(b.dtype(), dtype);
            assert_eq!(b.view().len(), 48 * 3 * 64);
            // bytes_per_token counts K and V of every layer; one buffer is K of one layer.
            assert_eq!(
                b.memory_bytes(),
                48 * dtype.bytes_per_token(1, 3, 64) / 2,
                "{dtype}"
            );
        }
    }
}
