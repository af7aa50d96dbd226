use std::cell::OnceCell;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use candle_core::quantized::k_quants::{
    self, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8_0, GgmlType,
};
use candle_core::quantized::GgmlDType;
use half::{bf16, f16};
use memmap2::{Mmap, MmapMut};
use tidal_kernels::{DotKernel, QuantType, QuantizedActivations};

use super::error::ModelError;
use super::file::ModelFile;

/// Runs `$body` with `$t` bound to the candle block type of a GGML dtype.
macro_rules! with_block_type {
    ($dtype:expr, $t:ident => $body:expr, else $other:expr) => {
        match $dtype {
            GgmlDType::F32 => {
                type $t = f32;
                $body
            }
            GgmlDType::F16 => {
                type $t = f16;
                $body
            }
            GgmlDType::BF16 => {
                type $t = bf16;
                $body
            }
            GgmlDType::Q4_0 => {
                type $t = BlockQ4_0;
                $body
            }
            GgmlDType::Q4_1 => {
                type $t = BlockQ4_1;
                $body
            }
            GgmlDType::Q5_0 => {
                type $t = BlockQ5_0;
                $body
            }
            GgmlDType::Q5_1 => {
                type $t = BlockQ5_1;
                $body
            }
            GgmlDType::Q8_0 => {
                type $t = BlockQ8_0;
                $body
            }
            GgmlDType::Q2K => {
                type $t = BlockQ2K;
                $body
            }
            GgmlDType::Q3K => {
                type $t = BlockQ3K;
                $body
            }
            GgmlDType::Q4K => {
                type $t = BlockQ4K;
                $body
            }
            GgmlDType::Q5K => {
                type $t = BlockQ5K;
                $body
            }
            GgmlDType::Q6K => {
                type $t = BlockQ6K;
                $body
            }
            _ => $other,
        }
    };
}

/// The block types our own matmul kernels run (candle's path for the rest).
pub(crate) fn own_kernel_type(dtype: GgmlDType) -> Option<QuantType> {
    match dtype {
        GgmlDType::Q4_0 => Some(QuantType::Q4_0),
        GgmlDType::Q4_1 => Some(QuantType::Q4_1),
        GgmlDType::Q5_0 => Some(QuantType::Q5_0),
        GgmlDType::Q8_0 => Some(QuantType::Q8_0),
        GgmlDType::Q2K => Some(QuantType::Q2_K),
        GgmlDType::Q3K => Some(QuantType::Q3_K),
        GgmlDType::Q4K => Some(QuantType::Q4_K),
        GgmlDType::Q5K => Some(QuantType::Q5_K),
        GgmlDType::Q6K => Some(QuantType::Q6_K),
        _ => None,
    }
}

/// The input of one or more matmuls: `m` rows of f32, quantised (to Q8_1, and to Q8_K for
/// K-quant matrices) on first use and then shared (the Q, K and V projections read the same
/// normed rows, as do gate and up).
pub struct Activations<'a> {
    x: &'a [f32],
    m: usize,
    kernel: DotKernel,
    quantized: OnceCell<QuantizedActivations>,
}

impl<'a> Activations<'a> {
    /// `m` rows of `x`, for matrices whose `cols` is `x.len() / m`.
    pub fn new(x: &'a [f32], m: usize) -> Self {
        Self {
            x,
            m,
            kernel: DotKernel::selected(),
            quantized: OnceCell::new(),
        }
    }
}

/// Target type of `--quantize`: weights re-quantised once at load time. Without one, the
/// loader keeps every matrix our kernels run (Q4_0, Q4_1, Q5_0, Q8_0 and the K-quants) as
/// stored and re-quantises the other quantised types (Q5_1) to Q8_0 ([`needs_fast_type`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantizeTo {
    Q4_0,
    Q4_1,
    Q8_0,
    F16,
    /// Every matrix dequantised to f32 (candle's matmul, slow: the exact reference of a
    /// file's weights, e.g. for perplexity).
    F32,
    /// Every matrix in its stored block type, however slow its matmul.
    Stored,
}

impl QuantizeTo {
    /// The GGML dtype this produces (`None`: each matrix keeps its own).
    pub fn target(self) -> Option<GgmlDType> {
        match self {
            Self::Q4_0 => Some(GgmlDType::Q4_0),
            Self::Q4_1 => Some(GgmlDType::Q4_1),
            Self::Q8_0 => Some(GgmlDType::Q8_0),
            Self::F16 => Some(GgmlDType::F16),
            Self::F32 => Some(GgmlDType::F32),
            Self::Stored => None,
        }
    }
}

/// Whether a matrix stored as `dtype` is re-quantised to Q8_0 when no `--quantize` is
/// given: a quantised type our kernels do not run (Q5_1). Those would go through candle's
/// matmul, one thread and row by row, many times slower; Q8_0 holds every value of a 5-bit
/// block within its rounding. Float matrices stay as stored.
pub(crate) fn needs_fast_type(dtype: GgmlDType) -> bool {
    own_kernel_type(dtype).is_none()
        && !matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

/// The block type a matrix stored as `stored` has once loaded with `quantize`: what
/// [`super::weights::ModelWeights::load`] makes of it, and what the memory plan counts.
pub(crate) fn loaded_type(stored: GgmlDType, quantize: Option<QuantizeTo>) -> GgmlDType {
    match quantize {
        Some(q) => q.target().unwrap_or(stored),
        None if needs_fast_type(stored) => GgmlDType::Q8_0,
        None => stored,
    }
}

/// Bytes of a `rows` × `cols` matrix in block type `dtype`.
pub(crate) fn matrix_bytes(dtype: GgmlDType, rows: usize, cols: usize) -> usize {
    rows * cols / dtype.block_size() * dtype.type_size()
}

impl std::str::FromStr for QuantizeTo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "q4_0" => Ok(Self::Q4_0),
            "q4_1" => Ok(Self::Q4_1),
            "q8_0" => Ok(Self::Q8_0),
            "f16" => Ok(Self::F16),
            "f32" => Ok(Self::F32),
            "stored" => Ok(Self::Stored),
            other => Err(format!(
                "unknown quantisation `{other}` (expected q4_0, q4_1, q8_0, f16, f32 or stored)"
            )),
        }
    }
}

enum Storage {
    /// Bytes inside the memory-mapped file: loading copies nothing.
    Mapped {
        mmap: Arc<Mmap>,
        range: Range<usize>,
    },
    /// Re-quantised at load; `u64` words keep every block type aligned.
    Owned { words: Vec<u64>, len: usize },
}

/// A 2-D weight matrix of `rows` × `cols` in a GGML block type (rows are output features).
pub struct Weight {
    name: String,
    dtype: GgmlDType,
    rows: usize,
    cols: usize,
    storage: Storage,
    /// The same blocks repacked for the CPU kernels where that is faster, made once at the
    /// first CPU matmul or by [`Weight::prepare_cpu`]: Q4_K in groups of sixteen rows for
    /// AVX-512 VNNI ([`tidal_kernels::matmul_q4_k_x16`]). `None`: the kernels read `storage`.
    repacked: OnceLock<Option<MmapMut>>,
}

impl Weight {
    /// Maps tensor `name`; 1-D tensors become one row.
    pub(crate) fn load(file: &ModelFile, name: &str) -> Result<Self, ModelError> {
        let (info, range) = file.tensor_range(name)?;
        let dims = info.shape.dims();
        let (rows, cols) = match dims {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            other => {
                return Err(ModelError::BadShape {
                    name: name.to_string(),
                    expected: vec![0, 0],
                    actual: other.to_vec(),
                })
            }
        };
        let supported = with_block_type!(info.ggml_dtype, T => {
            let _ = std::mem::size_of::<T>();
            true
        }, else false);
        if !supported {
            return Err(ModelError::UnsupportedTensorType {
                name: name.to_string(),
                dtype: info.ggml_dtype,
            });
        }
        if !cols.is_multiple_of(info.ggml_dtype.block_size()) {
            return Err(ModelError::BadShape {
                name: name.to_string(),
                expected: vec![rows, cols.next_multiple_of(info.ggml_dtype.block_size())],
                actual: dims.to_vec(),
            });
        }
        let weight = Self {
            name: name.to_string(),
            dtype: info.ggml_dtype,
            rows,
            cols,
            storage: Storage::Mapped {
                mmap: file.mmap().clone(),
                range,
            },
            repacked: OnceLock::new(),
        };
        // GGUF aligns tensor data (32 bytes by default), so a misaligned tensor is a broken
        // file or an exotic alignment: copy it rather than read it unaligned.
        if !(weight.bytes().as_ptr() as usize).is_multiple_of(8) {
            return Ok(weight.to_owned_copy());
        }
        Ok(weight)
    }

    fn to_owned_copy(&self) -> Self {
        let bytes = self.bytes();
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck_copy(bytes, &mut words);
        Self {
            name: self.name.clone(),
            dtype: self.dtype,
            rows: self.rows,
            cols: self.cols,
            storage: Storage::Owned {
                words,
                len: bytes.len(),
            },
            repacked: OnceLock::new(),
        }
    }

    /// Whether the bytes are read in place from the memory-mapped file (no copy at load).
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }

    /// Tensor name in the GGUF file.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Block type of the stored data.
    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Raw GGML bytes of the whole matrix.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped { mmap, range } => &mmap[range.clone()],
            Storage::Owned { words, len } => {
                // SAFETY: a u64 buffer viewed as its first `len` bytes.
                unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), *len) }
            }
        }
    }

    /// `out[m, rows] = x[m, cols] · selfᵀ` with `x` from `a`.
    ///
    /// The types of [`own_kernel_type`] run on our kernels (SIMD with a portable fallback), on
    /// `a`'s Q8_1 or Q8_K quantisation, made once however many matrices share the input.
    /// Other types go through candle's quantised matmul.
    pub fn matmul(&self, a: &Activations<'_>, out: &mut [f32]) -> Result<(), ModelError> {
        let m = a.m;
        if a.x.len() != m * self.cols || out.len() < m * self.rows {
            return Err(ModelError::Kernel(format!(
                "{}: matmul of {} inputs × {} rows into {} outputs for a {}×{} matrix",
                self.name,
                a.x.len(),
                m,
                out.len(),
                self.rows,
                self.cols
            )));
        }
        let out = &mut out[..m * self.rows];
        if let Some(ty) = own_kernel_type(self.dtype) {
            let xq = a
                .quantized
                .get_or_init(|| QuantizedActivations::new(a.x, m, self.cols));
            match self.repacked(a.kernel) {
                Some(q4_k_x16) => {
                    tidal_kernels::matmul_q4_k_x16(a.kernel, xq, q4_k_x16, self.rows, out)
                }
                None => {
                    tidal_kernels::matmul_quantized(a.kernel, ty, xq, self.bytes(), self.rows, out)
                }
            }
            return Ok(());
        }
        let mkn = (m, self.cols, self.rows);
        with_block_type!(self.dtype, T => {
            k_quants::matmul::<T>(mkn, a.x, blocks::<T>(self.bytes()), out)
                .map_err(|e| ModelError::Kernel(format!("{}: {e}", self.name)))
        }, else Err(ModelError::UnsupportedTensorType { name: self.name.clone(), dtype: self.dtype }))
    }

    /// Repacks the matrix for `kernel` now if it ever will be (see [`Weight::repacked`]), so
    /// that the first forward pass does not; returns whether it did.
    pub fn prepare_cpu(&self, kernel: DotKernel) -> bool {
        self.repacked(kernel).is_some()
    }

    /// The blocks in the layout `kernel` reads fastest where that is not the stored one,
    /// made on first use: a memory-mapped Q4_K matrix of whole groups of sixteen rows, for
    /// a kernel with AVX-512 VNNI. Its mapped pages are then released, so the matrix stays
    /// resident once (the file's pages stay in the page cache, and the embedding lookups that
    /// read the stored rows bring back only the pages they touch).
    fn repacked(&self, kernel: DotKernel) -> Option<&[u8]> {
        self.repacked
            .get_or_init(|| {
                let eligible = self.dtype == GgmlDType::Q4K
                    && self.rows.is_multiple_of(tidal_kernels::Q4_K_X16_GROUP_ROWS)
                    && tidal_kernels::reads_q4_k_x16(kernel);
                let Storage::Mapped { mmap, range } = &self.storage else {
                    return None;
                };
                if !eligible {
                    return None;
                }
                let mut packed = match huge_page_buffer(self.bytes().len()) {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(name = %self.name, error = %e, "no memory to repack into: the stored layout stays");
                        return None;
                    }
                };
                tidal_kernels::repack_q4_k_x16_into(
                    self.bytes(),
                    self.rows,
                    self.cols / tidal_kernels::QK_K,
                    &mut packed[..self.bytes().len()],
                );
                release_pages(&self.name, mmap, range);
                Some(packed)
            })
            .as_deref()
    }

    /// Dequantises row `row` into `out` (`cols` values): embedding lookup.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let row_bytes = self.bytes().len() / self.rows;
        let bytes = &self.bytes()[row * row_bytes..(row + 1) * row_bytes];
        with_block_type!(self.dtype, T => T::to_float(blocks::<T>(bytes), &mut out[..self.cols]), else ())
    }

    /// The whole matrix as f32 (norm weights and biases are small 1-D tensors).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (row, chunk) in out.chunks_mut(self.cols).enumerate() {
            self.dequantize_row(row, chunk);
        }
        out
    }

    /// Re-quantises to another block type (owned memory); same-type requests are no-ops.
    pub fn requantize(self, to: QuantizeTo) -> Result<Self, ModelError> {
        match to.target() {
            Some(dtype) => self.convert(dtype),
            None => Ok(self),
        }
    }

    /// Re-quantises to block type `dtype` (owned memory); a no-op when it is the stored type.
    pub(crate) fn convert(self, dtype: GgmlDType) -> Result<Self, ModelError> {
        if dtype == self.dtype {
            return Ok(self);
        }
        if !self.cols.is_multiple_of(dtype.block_size()) {
            return Err(ModelError::Quantize(
                dtype,
                format!(
                    "{} has {} columns, not a multiple of {}",
                    self.name,
                    self.cols,
                    dtype.block_size()
                ),
            ));
        }
        let len = self.rows * self.cols / dtype.block_size() * dtype.type_size();
        let mut words = vec![0u64; len.div_ceil(8)];
        let mut row_f32 = vec![0f32; self.cols];
        let row_bytes = len / self.rows;
        for row in 0..self.rows {
            self.dequantize_row(row, &mut row_f32);
            // SAFETY: `words` holds `len` bytes; each row writes its own byte range.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(
                    words.as_mut_ptr().cast::<u8>().add(row * row_bytes),
                    row_bytes,
                )
            };
            with_block_type!(dtype, T => T::from_float(&row_f32, blocks_mut::<T>(dst)), else ());
        }
        Ok(Self {
            name: self.name,
            dtype,
            rows: self.rows,
            cols: self.cols,
            storage: Storage::Owned { words, len },
            repacked: OnceLock::new(),
        })
    }
}

/// `len` zeroed bytes of anonymous memory, backed by huge pages where the kernel allows
/// (transparent huge pages in `madvise` or `always` mode): a decode step streams the repacked
/// matrices as it streams the file's mapping, which gets the same hint
/// (`super::file::ModelFile::open`), and with 4 KiB pages every page is a TLB miss and a
/// stop for the hardware prefetchers.
fn huge_page_buffer(len: usize) -> std::io::Result<MmapMut> {
    let buffer = MmapMut::map_anon(len.max(1))?;
    #[cfg(target_os = "linux")]
    if let Err(e) = buffer.advise(memmap2::Advice::HugePage) {
        tracing::debug!(error = %e, "huge-page hint refused");
    }
    Ok(buffer)
}

/// Drops this process's mapping of `range`'s pages (the page cache keeps them), once nothing
/// reads them in bulk any more.
fn release_pages(name: &str, mmap: &Mmap, range: &Range<usize>) {
    #[cfg(unix)]
    {
        // SAFETY: a read-only file mapping: a dropped page reads back the same bytes from the
        // file when touched again, so no reader sees other contents.
        let released = unsafe {
            mmap.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                range.start,
                range.len(),
            )
        };
        if let Err(e) = released {
            tracing::debug!(name, error = %e, "mapped pages not released");
        }
    }
    #[cfg(not(unix))]
    let _ = (name, mmap, range);
}

/// Dequantises whole blocks of `dtype` in `bytes` (any alignment) into `out`, with candle's
/// ports of ggml's `dequantize_row_*`; `scratch` is reused between calls.
pub(crate) fn dequantize_bytes(
    dtype: GgmlDType,
    bytes: &[u8],
    out: &mut [f32],
    scratch: &mut Vec<u64>,
) -> Result<(), ModelError> {
    scratch.clear();
    scratch.resize(bytes.len().div_ceil(8), 0);
    bytemuck_copy(bytes, scratch);
    // SAFETY: a u64 buffer viewed as its first `bytes.len()` bytes (aligned for every block).
    let aligned = unsafe { std::slice::from_raw_parts(scratch.as_ptr().cast::<u8>(), bytes.len()) };
    with_block_type!(dtype, T => {
        T::to_float(blocks::<T>(aligned), out);
        Ok(())
    }, else Err(ModelError::Unsupported(format!("cannot dequantise tensors of type {dtype:?}"))))
}

/// Views GGML bytes as blocks. Blocks are plain-old-data `repr(C)` structs of f16/u8/i8
/// fields, so every bit pattern is valid; alignment is checked at load.
fn blocks<T>(bytes: &[u8]) -> &[T] {
    assert_eq!(
        bytes.as_ptr() as usize % std::mem::align_of::<T>(),
        0,
        "misaligned weight"
    );
    // SAFETY: see above; length is rounded down to whole blocks.
    unsafe {
        std::slice::from_raw_parts(
            bytes.as_ptr().cast::<T>(),
            bytes.len() / std::mem::size_of::<T>(),
        )
    }
}

fn blocks_mut<T>(bytes: &mut [u8]) -> &mut [T] {
    assert_eq!(
        bytes.as_ptr() as usize % std::mem::align_of::<T>(),
        0,
        "misaligned weight"
    );
    // SAFETY: as `blocks`; the buffer starts zeroed, a valid value of every block type.
    unsafe {
        std::slice::from_raw_parts_mut(
            bytes.as_mut_ptr().cast::<T>(),
            bytes.len() / std::mem::size_of::<T>(),
        )
    }
}

fn bytemuck_copy(bytes: &[u8], words: &mut [u64]) {
    // SAFETY: `words` has at least `bytes.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast::<u8>(), bytes.len())
    }
}
