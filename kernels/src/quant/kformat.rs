//! The K-quant weight formats (ggml's Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) as one trait, so every
//! kernel is written once and compiled per format, and the reference arithmetic every kernel
//! follows.
//!
//! A super-block holds 256 weights in 16 groups of 16; every format is, per group `g`,
//! `w = d · sc_g · q − c · mn_g` with unsigned integer `q` (0..=63), integer scales `sc_g`,
//! and an integer offset `mn_g` that is either a minimum scaled by the block's `dmin`
//! ([`KFormat::HAS_DMIN`]: Q2_K, Q4_K, Q5_K, `c = dmin`) or the format's fixed zero point
//! times the scale (Q3_K: `4 · sc_g`, Q6_K: `32 · sc_g`; `c = d`). Against Q8_K activations
//! (`x ≈ d8 · q8`, `bsum_g = Σ_{i∈g} q8_i`) the super-block's dot product is
//!
//! `d · d8 · isum − c · d8 · msum`, `isum = Σ_g sc_g · Σ_{i∈g} q_i · q8_i`,
//! `msum = Σ_g mn_g · bsum_g`,
//!
//! both sums exact in i32, as in ggml's `ggml_vec_dot_q4_K_q8_K` and its siblings.
//!
//! Every kernel computes an output the same way, so results do not depend on the batch a row
//! is in: super-block `b` goes to accumulation chain `b % 4` as
//! `acc = fma(isum, d·d8, acc)` then `acc = fma(−msum, dmin·d8, acc)` for the `dmin` formats,
//! or `acc = fma(isum − msum, d·d8, acc)` for the others; the result is
//! `(acc[0] + acc[1]) + (acc[2] + acc[3])`.

use super::format::CHAINS;
use super::q8_k::BlockQ8K;

/// Weights per K-quant super-block (and Q8_K block).
pub const QK_K: usize = 256;

/// Groups of 16 weights per super-block: one scale and one offset each.
pub(crate) const GROUPS: usize = QK_K / 16;

/// A super-block unpacked into the terms of the module docs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KBlock {
    /// `q` of every weight, in weight order.
    pub q: [u8; QK_K],
    /// `sc_g`.
    pub sc: [i16; GROUPS],
    /// `mn_g`.
    pub mn: [i16; GROUPS],
    /// The block scale.
    pub d: f32,
    /// The minimums' scale (0 for formats without one).
    pub dmin: f32,
}

impl Default for KBlock {
    fn default() -> Self {
        Self {
            q: [0; QK_K],
            sc: [0; GROUPS],
            mn: [0; GROUPS],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

/// A super-block's `q` as eight vectors of 32 bytes (weights `32 c..32 c + 32` in vector
/// `c`), with `sc` and `mn` as 16 i16 lanes each.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct KBlockAvx2 {
    pub q: [std::arch::x86_64::__m256i; 8],
    pub sc: std::arch::x86_64::__m256i,
    pub mn: std::arch::x86_64::__m256i,
    pub d: f32,
    pub dmin: f32,
}

/// A K-quant format, as a type: the kernels are generic over it.
pub(crate) trait KFormat: Copy + Send + Sync + 'static {
    /// Bytes of one super-block.
    const BLOCK_BYTES: usize;
    /// Whether `mn` is scaled by `dmin` (a separate term) rather than `d`.
    const HAS_DMIN: bool;
    /// The fixed zero point of the formats without `dmin` (`mn_g = ZERO · sc_g`), else 0.
    const ZERO: i32;
    /// Weights per scale: 32 where the stored scales cover 32 weights (Q4_K, Q5_K: `sc` and
    /// `mn` repeat over each pair of groups), else 16. The AVX-512 GEMM applies each scale
    /// once per span.
    const SCALE_SPAN: usize;

    /// Unpacks super-block `wb` (the reference every kernel matches).
    fn unpack(wb: &[u8], out: &mut KBlock);

    /// Unpacks the super-block at `wb` with AVX2.
    ///
    /// # Safety
    /// AVX2 and F16C available; `wb..wb + BLOCK_BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn unpack_avx2(wb: *const u8) -> KBlockAvx2;
}

/// Reads a little-endian f16 at `bytes[at..at + 2]` as f32.
#[inline(always)]
pub(crate) fn f16_le(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Q4_K's and Q5_K's 12 bytes of 6-bit scales and minimums: `(sc, m)` of 32-weight sub-block
/// `j` (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// `sc` and `mn` of a Q4_K or Q5_K block (both per 32 weights, so each covers two groups).
#[inline(always)]
pub(crate) fn scales_k4(s: &[u8]) -> ([i16; GROUPS], [i16; GROUPS]) {
    let mut sc = [0i16; GROUPS];
    let mut mn = [0i16; GROUPS];
    for j in 0..8 {
        let (a, m) = scale_min_k4(j, s);
        sc[2 * j..2 * j + 2].fill(a as i16);
        mn[2 * j..2 * j + 2].fill(m as i16);
    }
    (sc, mn)
}

/// `(isum, msum)` of an unpacked super-block against a Q8_K block.
#[inline(always)]
pub(crate) fn isums(k: &KBlock, x: &BlockQ8K) -> (i32, i32) {
    let mut isum = 0i32;
    let mut msum = 0i32;
    for g in 0..GROUPS {
        let dot: i32 = k.q[16 * g..16 * g + 16]
            .iter()
            .zip(&x.qs[16 * g..16 * g + 16])
            .map(|(&q, &v)| q as i32 * v as i32)
            .sum();
        isum += k.sc[g] as i32 * dot;
        msum += k.mn[g] as i32 * x.bsums[g] as i32;
    }
    (isum, msum)
}

/// Adds one super-block's dot product to its chain (the float steps of the module docs).
#[inline(always)]
pub(crate) fn accumulate<K: KFormat>(
    acc: &mut f32,
    isum: i32,
    msum: i32,
    d: f32,
    dmin: f32,
    d8: f32,
) {
    if K::HAS_DMIN {
        *acc = (isum as f32).mul_add(d * d8, *acc);
        *acc = (-(msum as f32)).mul_add(dmin * d8, *acc);
    } else {
        *acc = ((isum - msum) as f32).mul_add(d * d8, *acc);
    }
}

/// One weight row (whole super-blocks of `K`) against one activation row: the reference
/// arithmetic.
///
/// # Panics
/// If the block counts differ.
pub(crate) fn dot_portable_k<K: KFormat>(w: &[u8], x: &[BlockQ8K]) -> f32 {
    assert_eq!(
        w.len(),
        x.len() * K::BLOCK_BYTES,
        "activation and weight rows differ in block count"
    );
    let mut acc = [0.0f32; CHAINS];
    let mut k = KBlock::default();
    for (b, (wb, xb)) in w.chunks_exact(K::BLOCK_BYTES).zip(x).enumerate() {
        K::unpack(wb, &mut k);
        let (isum, msum) = isums(&k, xb);
        accumulate::<K>(&mut acc[b % CHAINS], isum, msum, k.d, k.dmin, xb.d);
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// Dequantises whole super-blocks `w` into `out` (256 values per block), as ggml's
/// `dequantize_row_q*_K`: `d · sc · q − c · mn` per weight (the zero-point formats as
/// `d · sc · (q − zero)`, which is the same value).
///
/// # Panics
/// If `w` is not whole blocks or `out` does not hold 256 values per block.
pub(crate) fn dequantize_k<K: KFormat>(w: &[u8], out: &mut [f32]) {
    assert!(
        w.len().is_multiple_of(K::BLOCK_BYTES),
        "dequantize: partial super-block"
    );
    assert_eq!(
        out.len(),
        w.len() / K::BLOCK_BYTES * QK_K,
        "dequantize: out length"
    );
    let mut k = KBlock::default();
    for (wb, o) in w
        .chunks_exact(K::BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        K::unpack(wb, &mut k);
        for g in 0..GROUPS {
            let (dl, ml) = if K::HAS_DMIN {
                (k.d * k.sc[g] as f32, k.dmin * k.mn[g] as f32)
            } else {
                (k.d * k.sc[g] as f32, 0.0)
            };
            let span = 16 * g..16 * g + 16;
            for (y, &q) in o[span.clone()].iter_mut().zip(&k.q[span]) {
                *y = dl * (q as i32 - K::ZERO) as f32 - ml;
            }
        }
    }
}

/// The f16 at `p` and the one after it, as f32, with F16C.
///
/// # Safety
/// F16C available; 4 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn f16_pair_f16c(p: *const u8) -> (f32, f32) {
    use std::arch::x86_64::*;
    // SAFETY: 4 readable bytes, converted by one F16C instruction.
    unsafe {
        let bits = (p as *const i32).read_unaligned();
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }
}

/// Q4_K's and Q5_K's 12 scale bytes as two little-endian words of eight bytes: the eight
/// sub-block scales, and the eight minimums (the same values as [`scale_min_k4`], from 32-bit
/// masks and shifts as ggml's `kmask` code rather than one sub-block at a time).
#[inline(always)]
pub(crate) fn scales_mins_k4_packed(s: &[u8]) -> (u64, u64) {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (word(0), word(1), word(2));
    let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
    let mn_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
    (
        (u0 & LOW6) as u64 | (sc_hi as u64) << 32,
        (u1 & LOW6) as u64 | (mn_hi as u64) << 32,
    )
}

/// [`scales_k4`] as two vectors of 16 i16 lanes (`sc`, `mn`), from the 12 scale bytes at `p`.
///
/// # Safety
/// AVX2 available; 12 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn scales_k4_avx2(
    p: *const u8,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    // SAFETY: 12 readable bytes (caller's contract).
    let (sc, mn) = scales_mins_k4_packed(unsafe { std::slice::from_raw_parts(p, 12) });
    // SAFETY: AVX2 by the caller's contract.
    unsafe {
        let both = _mm_set_epi64x(mn as i64, sc as i64);
        // Each 32-weight scale twice, once per 16-weight group.
        (
            _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(both, both)),
            _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(both, both)),
        )
    }
}

/// 16 i16 values as one vector.
///
/// # Safety
/// AVX available.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn load_i16x16(v: &[i16; GROUPS]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: 32 readable bytes.
    unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) }
}
