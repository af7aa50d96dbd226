//! The 32-weight block formats our matmul runs, as one trait so every kernel is written
//! once and compiled per format (the K-quants, in 256-weight super-blocks, are
//! [`super::kformat`]). Each block of 32 weights is `d · q + m` with integer `q`:
//!
//! | format | bytes | q | m |
//! | --- | --- | --- | --- |
//! | Q4_0 | f16 d, 16 nibble bytes | 0..=15 | −8·d |
//! | Q4_1 | f16 d, f16 m, 16 nibble bytes | 0..=15 | m |
//! | Q5_0 | f16 d, u32 high bits, 16 nibble bytes | 0..=31 | −16·d |
//! | Q8_0 | f16 d, 32 signed bytes | −128..=127 | 0 |
//!
//! So against Q8_1 activations (`x ≈ d8 · q8`, `s8 = d8 · Σ q8`) a block's dot product is
//! `d · d8 · Σ q·q8 + m · s8` for all of them, as in ggml's `vec_dot_q4_0_q8_0`,
//! `vec_dot_q4_1_q8_1`, `vec_dot_q5_0_q8_0` and `vec_dot_q8_0_q8_0`.
//!
//! Every kernel (portable, AVX2 rows, AVX2 panels) computes an output the same way, so results
//! do not depend on the batch a row is in (the runtime's batch invariance): the block sum
//! `Σ q·q8` is exact in i32; block `b` goes to accumulation chain `b % 4` as
//! `acc[c] = fma(Σ q·q8, d·d8, acc[c])`, then `acc[c] = fma(m, s8, acc[c])` for formats with
//! an offset; the result is `(acc[0] + acc[1]) + (acc[2] + acc[3])`. Four chains keep a
//! single row's FMA latency from bounding decode (one lane per chain in the row kernel).

use super::kformat::{dequantize_k, KFormat, QK_K};
use super::q4_1::{f16_at, QK};
use super::{q2_k::Q2K, q3_k::Q3K, q4_k::Q4K, q5_k::Q5K, q6_k::Q6K};

/// Accumulation chains per output (see the module docs).
pub(crate) const CHAINS: usize = 4;

/// How far ahead of the block being multiplied the kernels prefetch the weight stream
/// ([`crate::prefetch`]): 4 KiB, 120 Q8_0 or 204 Q4_1 blocks. Batch-1 decode of SmolLM2 on a
/// 2-core AVX-512 Xeon (21–22 GB/s, three alternating rounds, medians) ran Q4_1 at 145, 166
/// and 185 tokens/s with 1, 2 and 4 KiB, Q8_0 at 110, 111 and 113; with 1 KiB or less the
/// loads wait on memory (docs/benchmarks.md). A model that streams from memory wants less:
/// Llama 3.2 1B's shape (`tidal bench fixture`) on a 2-core AMX Xeon, three alternating
/// rounds, decoded Q4_0 at 31.8 tokens/s with 2 KiB against 26.3 with 4 KiB (llama.cpp 30.1),
/// and Q4_K_M at 27.0 against 21.6, while SmolLM2 Q4_1 ran 233 against 268 on the same
/// machine. So the best distance depends on the model and the machine: on a 2-core Zen 5 EPYC
/// with 66 GB/s, the 1B shape's Q4_0 ran 63–67 tokens/s at 4 KiB, 60 at 2 KiB and 63–71 at
/// 8 KiB (1.15× llama.cpp at 4 KiB), so 4 KiB stays until a per-machine choice is measured.
pub(crate) const WEIGHTS_AHEAD: usize = 4096;

/// A weight block type our kernels run: the four 32-weight formats of this module (a
/// `Format`) and the K-quants of [`super::kformat`] (super-blocks of 256 weights).
/// (Variants are named as ggml names the types.)
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    Q3_K,
    Q2_K,
}

impl QuantType {
    /// Every type.
    pub const ALL: [QuantType; 9] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
        QuantType::Q3_K,
        QuantType::Q2_K,
    ];

    /// The types of 32-weight blocks, multiplied against Q8_1 activations.
    pub const BLOCK32: [QuantType; 4] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q8_0,
    ];

    /// The K-quants: super-blocks of 256 weights, multiplied against Q8_K activations.
    pub const K_QUANTS: [QuantType; 5] = [
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
        QuantType::Q3_K,
        QuantType::Q2_K,
    ];

    /// The types the CUDA matmul kernels read in place (feature `cuda`): all of them; a matrix
    /// of a GGUF type without a CPU kernel (f16, bf16, f32) is uploaded as f16. Here, not in
    /// `cuda`, so a build without CUDA can plan a GPU's memory.
    pub const GPU_BLOCKS: [QuantType; 9] = QuantType::ALL;

    /// Whether this is a K-quant (256-weight super-blocks, Q8_K activations).
    pub fn is_k_quant(self) -> bool {
        self.block_elems() == QK_K
    }

    /// Weights per block: 32, or 256 for the K-quants.
    pub fn block_elems(self) -> usize {
        match self {
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q8_0 => QK,
            _ => QK_K,
        }
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::Q4_0 => Q4_0::BLOCK_BYTES,
            QuantType::Q4_1 => Q4_1::BLOCK_BYTES,
            QuantType::Q5_0 => Q5_0::BLOCK_BYTES,
            QuantType::Q8_0 => Q8_0::BLOCK_BYTES,
            QuantType::Q4_K => Q4K::BLOCK_BYTES,
            QuantType::Q5_K => Q5K::BLOCK_BYTES,
            QuantType::Q6_K => Q6K::BLOCK_BYTES,
            QuantType::Q3_K => Q3K::BLOCK_BYTES,
            QuantType::Q2_K => Q2K::BLOCK_BYTES,
        }
    }

    /// Byte offsets in a block of its f16 scale `d` and, where the format has one, of its
    /// second f16 field (Q4_1's minimum `m`; Q4_K's, Q5_K's and Q2_K's `dmin`).
    pub fn f16_fields(self) -> (usize, Option<usize>) {
        match self {
            QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => (0, None),
            QuantType::Q4_1 | QuantType::Q4_K | QuantType::Q5_K => (0, Some(2)),
            QuantType::Q6_K => (208, None),
            QuantType::Q3_K => (108, None),
            QuantType::Q2_K => (80, Some(82)),
        }
    }

    /// Bytes of a row of `k` weights.
    ///
    /// # Panics
    /// If `k` is not a multiple of [`QuantType::block_elems`].
    pub fn row_bytes(self, k: usize) -> usize {
        let qk = self.block_elems();
        assert!(
            k.is_multiple_of(qk),
            "{self:?} rows hold whole blocks of {qk} values, not {k}"
        );
        k / qk * self.block_bytes()
    }

    /// Dequantises whole blocks `w` into `out` ([`QuantType::block_elems`] values per block).
    ///
    /// # Panics
    /// If `w` is not whole blocks or `out` does not hold that many values per block.
    pub fn dequantize(self, w: &[u8], out: &mut [f32]) {
        match self {
            QuantType::Q4_0 => super::q4_0::dequantize_q4_0(w, out),
            QuantType::Q4_1 => super::q4_1::dequantize_q4_1(w, out),
            QuantType::Q5_0 => super::q5_0::dequantize_q5_0(w, out),
            QuantType::Q8_0 => super::q8_0::dequantize_q8_0(w, out),
            QuantType::Q4_K => dequantize_k::<Q4K>(w, out),
            QuantType::Q5_K => dequantize_k::<Q5K>(w, out),
            QuantType::Q6_K => dequantize_k::<Q6K>(w, out),
            QuantType::Q3_K => dequantize_k::<Q3K>(w, out),
            QuantType::Q2_K => dequantize_k::<Q2K>(w, out),
        }
    }

    /// Quantises `x` (whole blocks of [`QuantType::block_elems`] values) into blocks `out`, as
    /// llama.cpp's reference quantiser of the type does without an importance matrix
    /// (`quantize_row_*_ref`).
    ///
    /// # Panics
    /// If `x` is not whole blocks or `out` is not one block per block of `x`.
    pub fn quantize(self, x: &[f32], out: &mut [u8]) {
        use super::{quantize_32 as b32, quantize_k as k, quantize_k_low as kl};
        match self {
            QuantType::Q4_0 => b32::quantize_q4_0(x, out),
            QuantType::Q4_1 => b32::quantize_q4_1(x, out),
            QuantType::Q5_0 => b32::quantize_q5_0(x, out),
            QuantType::Q8_0 => b32::quantize_q8_0(x, out),
            QuantType::Q4_K => k::quantize_q4_k(x, out),
            QuantType::Q5_K => k::quantize_q5_k(x, out),
            QuantType::Q6_K => k::quantize_q6_k(x, out),
            QuantType::Q3_K => kl::quantize_q3_k(x, out),
            QuantType::Q2_K => kl::quantize_q2_k(x, out),
        }
    }
}

/// A block format, as a type: the kernels are generic over it.
pub(crate) trait Format: Copy + Send + Sync + 'static {
    /// Bytes of one block.
    const BLOCK_BYTES: usize;
    /// Whether `q` is signed (Q8_0): the AVX2 kernels then need the sign trick, since
    /// `maddubs` multiplies unsigned by signed bytes.
    const SIGNED: bool;
    /// Whether `m` can be non-zero.
    const HAS_OFFSET: bool;
    /// Byte offset of `m` as an f16 in the block, for formats that store it (Q4_1).
    const M_AT: Option<usize>;
    /// `m / d` for formats whose offset follows from `d` (Q4_0: −8).
    const M_PER_D: f32;
    /// Where the block's `q` are (the AVX-512 row kernel loads them itself).
    #[cfg(target_arch = "x86_64")]
    const QS_AT: super::dot_avx512::QsLayout;

    /// `(d, m)` of block `wb`.
    fn scales(wb: &[u8]) -> (f32, f32);

    /// `Σ q·q8` over the block.
    fn isum(wb: &[u8], q8: &[i8; QK]) -> i32;

    /// `(d, m)` of the block at `wb`, with F16C.
    ///
    /// # Safety
    /// F16C available; `wb..wb + BLOCK_BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn scales_f16c(wb: *const u8) -> (f32, f32);

    /// The block's 32 `q` as bytes in weight order (unsigned for Q4, signed for Q8_0).
    ///
    /// # Safety
    /// AVX2 available; `wb..wb + BLOCK_BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn unpack(wb: *const u8) -> std::arch::x86_64::__m256i;
}

/// `Σ nibble·q8` of a Q4 block's 16 nibble bytes.
#[inline(always)]
fn nibble_isum(qs: &[u8], q8: &[i8; QK]) -> i32 {
    let mut sum = 0i32;
    for j in 0..QK / 2 {
        sum += (qs[j] & 0x0F) as i32 * q8[j] as i32 + (qs[j] >> 4) as i32 * q8[j + QK / 2] as i32;
    }
    sum
}

/// The 32 nibbles of 16 bytes at `p` as bytes: low nibbles (weights 0..16) then high.
///
/// # Safety
/// AVX2 available; 16 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn unpack_nibbles(p: *const u8) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: 16 readable bytes; loadu has no alignment requirement.
    unsafe {
        let packed = _mm_loadu_si128(p as *const __m128i);
        let hi = _mm_srli_epi16::<4>(packed);
        _mm256_and_si256(_mm256_set_m128i(hi, packed), _mm256_set1_epi8(0x0F))
    }
}

/// One f16 at `p` as f32, with F16C.
///
/// # Safety
/// F16C available; 2 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn f16_f16c(p: *const u8) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: 2 readable bytes.
    unsafe {
        let bits = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

/// ggml `block_q4_0`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q4_0;

/// ggml `block_q4_1`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q4_1;

/// ggml `block_q5_0`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q5_0;

/// ggml `block_q8_0`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q8_0;

impl Format for Q4_0 {
    const BLOCK_BYTES: usize = 18;
    const SIGNED: bool = false;
    const HAS_OFFSET: bool = true;
    const M_AT: Option<usize> = None;
    const M_PER_D: f32 = -8.0;
    #[cfg(target_arch = "x86_64")]
    const QS_AT: super::dot_avx512::QsLayout = super::dot_avx512::QsLayout::Nibbles {
        at: 2,
        high_bits: None,
    };

    #[inline(always)]
    fn scales(wb: &[u8]) -> (f32, f32) {
        let d = f16_at(wb, 0);
        (d, d * Self::M_PER_D)
    }

    #[inline(always)]
    fn isum(wb: &[u8], q8: &[i8; QK]) -> i32 {
        nibble_isum(&wb[2..18], q8)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scales_f16c(wb: *const u8) -> (f32, f32) {
        // SAFETY: by the caller's contract.
        let d = unsafe { f16_f16c(wb) };
        (d, d * Self::M_PER_D)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack(wb: *const u8) -> std::arch::x86_64::__m256i {
        // SAFETY: the nibbles are bytes 2..18 of the block.
        unsafe { unpack_nibbles(wb.add(2)) }
    }
}

impl Format for Q4_1 {
    const BLOCK_BYTES: usize = 20;
    const SIGNED: bool = false;
    const HAS_OFFSET: bool = true;
    const M_AT: Option<usize> = Some(2);
    const M_PER_D: f32 = 0.0;
    #[cfg(target_arch = "x86_64")]
    const QS_AT: super::dot_avx512::QsLayout = super::dot_avx512::QsLayout::Nibbles {
        at: 4,
        high_bits: None,
    };

    #[inline(always)]
    fn scales(wb: &[u8]) -> (f32, f32) {
        (f16_at(wb, 0), f16_at(wb, 2))
    }

    #[inline(always)]
    fn isum(wb: &[u8], q8: &[i8; QK]) -> i32 {
        nibble_isum(&wb[4..20], q8)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scales_f16c(wb: *const u8) -> (f32, f32) {
        use std::arch::x86_64::*;
        // SAFETY: d and m are adjacent f16s: both converted by one F16C instruction.
        unsafe {
            let bits = (wb as *const i32).read_unaligned();
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
            (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)))
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack(wb: *const u8) -> std::arch::x86_64::__m256i {
        // SAFETY: the nibbles are bytes 4..20 of the block.
        unsafe { unpack_nibbles(wb.add(4)) }
    }
}

impl Format for Q5_0 {
    const BLOCK_BYTES: usize = 22;
    const SIGNED: bool = false;
    const HAS_OFFSET: bool = true;
    const M_AT: Option<usize> = None;
    const M_PER_D: f32 = -16.0;
    #[cfg(target_arch = "x86_64")]
    const QS_AT: super::dot_avx512::QsLayout = super::dot_avx512::QsLayout::Nibbles {
        at: 6,
        high_bits: Some(2),
    };

    #[inline(always)]
    fn scales(wb: &[u8]) -> (f32, f32) {
        let d = f16_at(wb, 0);
        (d, d * Self::M_PER_D)
    }

    #[inline(always)]
    fn isum(wb: &[u8], q8: &[i8; QK]) -> i32 {
        let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
        let high: i32 = (0..QK)
            .filter(|&i| qh >> i & 1 == 1)
            .map(|i| 16 * q8[i] as i32)
            .sum();
        nibble_isum(&wb[6..22], q8) + high
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scales_f16c(wb: *const u8) -> (f32, f32) {
        // SAFETY: by the caller's contract.
        let d = unsafe { f16_f16c(wb) };
        (d, d * Self::M_PER_D)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack(wb: *const u8) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        // SAFETY: the high bits are bytes 2..6 of the block, the nibbles bytes 6..22.
        unsafe {
            let qh = (wb.add(2) as *const u32).read_unaligned();
            // Bit i of qh to byte i (ggml's `bytes_from_bits_32`): each byte gets the qh byte
            // holding its bit, then every other bit is set; a byte is all ones iff its bit was.
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(qh as i32),
                _mm256_set_epi64x(
                    0x0303030303030303,
                    0x0202020202020202,
                    0x0101010101010101,
                    0,
                ),
            );
            let set = _mm256_cmpeq_epi8(
                _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                _mm256_set1_epi64x(-1),
            );
            _mm256_or_si256(
                unpack_nibbles(wb.add(6)),
                _mm256_and_si256(set, _mm256_set1_epi8(0x10)),
            )
        }
    }
}

impl Format for Q8_0 {
    const BLOCK_BYTES: usize = 34;
    const SIGNED: bool = true;
    const HAS_OFFSET: bool = false;
    const M_AT: Option<usize> = None;
    const M_PER_D: f32 = 0.0;
    #[cfg(target_arch = "x86_64")]
    const QS_AT: super::dot_avx512::QsLayout = super::dot_avx512::QsLayout::Bytes { at: 2 };

    #[inline(always)]
    fn scales(wb: &[u8]) -> (f32, f32) {
        (f16_at(wb, 0), 0.0)
    }

    #[inline(always)]
    fn isum(wb: &[u8], q8: &[i8; QK]) -> i32 {
        wb[2..34]
            .iter()
            .zip(q8)
            .map(|(&w, &x)| w as i8 as i32 * x as i32)
            .sum()
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scales_f16c(wb: *const u8) -> (f32, f32) {
        // SAFETY: by the caller's contract.
        (unsafe { f16_f16c(wb) }, 0.0)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack(wb: *const u8) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        // SAFETY: the 32 values are bytes 2..34 of the block.
        unsafe { _mm256_loadu_si256(wb.add(2) as *const __m256i) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_ggml() {
        assert_eq!(QuantType::Q4_0.block_bytes(), 18);
        assert_eq!(QuantType::Q4_1.block_bytes(), 20);
        assert_eq!(QuantType::Q5_0.block_bytes(), 22);
        assert_eq!(QuantType::Q8_0.block_bytes(), 34);
        assert_eq!(QuantType::Q8_0.row_bytes(64), 68);
        assert_eq!(QuantType::Q2_K.block_bytes(), 84);
        assert_eq!(QuantType::Q3_K.block_bytes(), 110);
        assert_eq!(QuantType::Q4_K.block_bytes(), 144);
        assert_eq!(QuantType::Q5_K.block_bytes(), 176);
        assert_eq!(QuantType::Q6_K.block_bytes(), 210);
        assert_eq!(QuantType::Q6_K.row_bytes(512), 420);
        for ty in QuantType::ALL {
            assert_eq!(ty.is_k_quant(), QuantType::K_QUANTS.contains(&ty));
            assert_eq!(!ty.is_k_quant(), QuantType::BLOCK32.contains(&ty));
        }
    }

    /// Doubling the f16 at each offset `f16_fields` names doubles every dequantised weight
    /// (with the other field zero): those are the scales the dequantiser reads.
    #[test]
    fn f16_fields_are_the_scales_the_dequantiser_reads() {
        use rand::Rng;
        let mut r = crate::test_util::rng(9);
        let put = |b: &mut [u8], at: usize, v: f32| {
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes())
        };
        for ty in QuantType::ALL {
            let mut block: Vec<u8> = (0..ty.block_bytes()).map(|_| r.random()).collect();
            let (d_at, second_at) = ty.f16_fields();
            let dequantize = |b: &[u8]| {
                let mut w = vec![0.0f32; ty.block_elems()];
                ty.dequantize(b, &mut w);
                w
            };
            let mut fields = vec![(d_at, second_at)];
            if let Some(at) = second_at {
                fields.push((at, Some(d_at)));
            }
            for (at, other) in fields {
                if let Some(other) = other {
                    put(&mut block, other, 0.0);
                }
                put(&mut block, at, 1.0);
                let once = dequantize(&block);
                put(&mut block, at, 2.0);
                let twice = dequantize(&block);
                assert!(once.iter().any(|&v| v != 0.0), "{ty:?} at {at}: all zero");
                let doubled: Vec<f32> = once.iter().map(|v| 2.0 * v).collect();
                assert_eq!(twice, doubled, "{ty:?}: the f16 at {at}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "whole blocks")]
    fn rejects_partial_rows() {
        QuantType::Q4_0.row_bytes(33);
    }

    #[test]
    #[should_panic(expected = "whole blocks")]
    fn rejects_partial_super_blocks() {
        QuantType::Q4_K.row_bytes(96);
    }
}
