//! Device-resident weights and KV memory.

use cudarc::driver::CudaSlice;
use half::f16;

use super::{CudaError, Gpu};
use crate::{KvBuffer, KvDtype, QuantType};

/// How a [`GpuMatrix`] stores its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuWeightFormat {
    /// GGUF blocks, read in place by the block kernels.
    Blocks(QuantType),
    /// IEEE half rows: every other GGUF type, dequantised at load.
    F16,
}

/// The block types the GPU's matmul kernels read in place; every other type is uploaded as
/// f16 ([`GpuMatrix::from_f32`]).
pub const GPU_BLOCK_TYPES: [QuantType; 9] = QuantType::GPU_BLOCKS;

/// A weight matrix `[rows, cols]` on the GPU (`y = x · Wᵀ`).
pub struct GpuMatrix {
    pub(crate) format: GpuWeightFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: CudaSlice<u8>,
}

impl GpuMatrix {
    /// Uploads GGUF blocks of `format` as they are: `rows` rows of `cols / 32` blocks (or
    /// `cols / 256` super-blocks of a K-quant).
    pub fn from_blocks(
        gpu: &Gpu,
        format: QuantType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, CudaError> {
        if !GPU_BLOCK_TYPES.contains(&format) {
            return Err(CudaError::Shape(format!(
                "{format:?} has no GPU block kernel (upload it as f16)"
            )));
        }
        let expected = if cols.is_multiple_of(format.block_elems()) {
            rows * format.row_bytes(cols)
        } else {
            0
        };
        if expected == 0 || bytes.len() != expected {
            return Err(CudaError::Shape(format!(
                "{format:?} matrix [{rows}, {cols}]: {} bytes, expected {expected} in whole blocks",
                bytes.len()
            )));
        }
        Ok(Self {
            format: GpuWeightFormat::Blocks(format),
            rows,
            cols,
            data: gpu.upload(bytes)?,
        })
    }

    /// Uploads `values` (`rows * cols`, row-major) as f16.
    pub fn from_f32(
        gpu: &Gpu,
        values: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Self, CudaError> {
        if values.len() != rows * cols {
            return Err(CudaError::Shape(format!(
                "matrix [{rows}, {cols}] from {} values",
                values.len()
            )));
        }
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes())
            .collect();
        Ok(Self {
            format: GpuWeightFormat::F16,
            rows,
            cols,
            data: gpu.upload(&bytes)?,
        })
    }

    /// Output features (rows of W).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (columns of W).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The storage format.
    pub fn format(&self) -> GpuWeightFormat {
        self.format
    }

    /// Bytes on the device (what one matmul reads).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// One layer's K or V cache on the GPU, laid out as [`KvBuffer`].
pub enum GpuKvBuffer {
    F32(CudaSlice<f32>),
    /// f16 bit patterns.
    F16(CudaSlice<u16>),
    Int8 {
        values: CudaSlice<i8>,
        scales: CudaSlice<f32>,
    },
}

impl GpuKvBuffer {
    /// A zeroed cache of `num_slots` tokens.
    pub fn new(
        gpu: &Gpu,
        dtype: KvDtype,
        num_slots: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self, CudaError> {
        let n = num_slots * n_kv_heads * head_dim;
        Ok(match dtype {
            KvDtype::F32 => GpuKvBuffer::F32(gpu.zeros(n)?),
            KvDtype::F16 => GpuKvBuffer::F16(gpu.zeros(n)?),
            KvDtype::Int8 => GpuKvBuffer::Int8 {
                values: gpu.zeros(n)?,
                scales: gpu.zeros(num_slots * n_kv_heads)?,
            },
        })
    }

    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        match self {
            GpuKvBuffer::F32(_) => KvDtype::F32,
            GpuKvBuffer::F16(_) => KvDtype::F16,
            GpuKvBuffer::Int8 { .. } => KvDtype::Int8,
        }
    }

    /// Number of values (scales excluded).
    pub fn len(&self) -> usize {
        match self {
            GpuKvBuffer::F32(v) => v.len(),
            GpuKvBuffer::F16(v) => v.len(),
            GpuKvBuffer::Int8 { values, .. } => values.len(),
        }
    }

    /// Whether the cache holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held, scales included.
    pub fn memory_bytes(&self) -> usize {
        match self {
            GpuKvBuffer::F32(v) => v.len() * 4,
            GpuKvBuffer::F16(v) => v.len() * 2,
            GpuKvBuffer::Int8 { values, scales } => values.len() + scales.len() * 4,
        }
    }

    /// Copies the cache to host memory (tests compare it with the CPU cache).
    pub fn to_host(&self, gpu: &Gpu) -> Result<KvBuffer, CudaError> {
        Ok(match self {
            GpuKvBuffer::F32(v) => KvBuffer::F32(gpu.download(v)?),
            GpuKvBuffer::F16(v) => {
                KvBuffer::F16(gpu.download(v)?.into_iter().map(f16::from_bits).collect())
            }
            GpuKvBuffer::Int8 { values, scales } => KvBuffer::Int8 {
                values: gpu.download(values)?,
                scales: gpu.download(scales)?,
            },
        })
    }
}

impl GpuKvBuffer {
    /// Uploads a host cache as it is (same layout and element type).
    pub fn from_host(gpu: &Gpu, host: &KvBuffer) -> Result<Self, CudaError> {
        Ok(match host {
            KvBuffer::F32(v) => GpuKvBuffer::F32(gpu.upload(v)?),
            KvBuffer::F16(v) => {
                let bits: Vec<u16> = v.iter().map(|h| h.to_bits()).collect();
                GpuKvBuffer::F16(gpu.upload(&bits)?)
            }
            KvBuffer::Int8 { values, scales } => GpuKvBuffer::Int8 {
                values: gpu.upload(values)?,
                scales: gpu.upload(scales)?,
            },
        })
    }
}
