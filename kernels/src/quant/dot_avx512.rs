//! AVX-512 VNNI quantised matmul for decode: one weight row at a time (read sequentially, as
//! [`super::dot_avx2`]) against the step's one activation row, sixteen blocks per step. (The
//! step functions take `R` activation rows; decode instantiates one.) Matmul runs it for
//! Q8_0; Q4_0, Q4_1 and Q5_0 take [`super::dot16_avx512`], which shares this file's unpack,
//! reduction and scale gather.
//!
//! The AVX2 row kernel spends most of its instructions turning each block's eight partial
//! sums into one (a `hadd` tree per four blocks) and gathering f16 scales one at a time. Here
//! a step takes 16 blocks as four 512-bit vectors of 16-byte halves: vector `j` holds, in its
//! 128-bit segment `s`, half of block `4s + j`. Two `vpdpbusd` per vector (low and high
//! halves) leave each block's products in one segment, and one transposing reduction of the
//! four vectors (`unpack` and `add`, as a 4×4 transpose) turns them into the sixteen exact
//! block sums in block order, lane `b` = block `b`. Each weight's `d` (and Q4_1's `m`) comes
//! from one 16-lane gather. The activations are laid out once per input in the same
//! segment order ([`Interleaved16`]), so they are plain aligned loads.
//!
//! The arithmetic is the common one ([`super::format`]): exact i32 block sums, block `b` into
//! chain `b % 4` with `fma(Σ, d·d8)` then `fma(m, s8)`, in block order (four 4-wide FMAs per
//! step, one per group of four blocks), chains summed as `(a0 + a1) + (a2 + a3)`. A last
//! partial step reads only its blocks (masked loads) and runs only the groups that hold one,
//! as the other kernels' tails; so results are bit-identical to every other kernel.
//!
//! The models' rows are short: 576 weights (SmolLM2) are 18 blocks, 640 (Gemma 3) 20, so a
//! second step would hold two or four blocks and cost as much as a full one. Where a row's
//! last step holds one to four blocks, four consecutive weight rows share it instead
//! ([`tail_quad`]): block `4s + j` of that step is block `j` of row `s`'s tail, against the
//! activations' tail broadcast to the four segments, and group `s` of its sums goes into row
//! `s`'s chains exactly as a partial step's first group would. That cut the 210 weight
//! matmuls of a SmolLM2 step at one row by 14–38 % (criterion
//! `q{4_0,4_1,5_0}_step_30_layers_m1/avx512vnni`, 2-core AMX Xeon).

use std::arch::x86_64::*;

use super::dot_avx2::chain_totals;
use super::format::{Format, CHAINS, WEIGHTS_AHEAD};
use super::matmul::{OutCols, XRow};
use super::q4_1::QK;
use super::q8_1::BlockQ8_1;
use crate::prefetch;

/// Blocks per step.
pub(super) const STEP: usize = 16;

/// Weight rows whose tails share one step ([`tail_quad`]).
pub(super) const QUAD: usize = 4;

/// 64 activation bytes: four 16-byte halves of four blocks, one per 128-bit segment.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Lane64(pub [i8; 64]);

/// One activation row's 16-block steps in the kernel's order: per step, for `j` in `0..4`,
/// the low halves (values 0..16) of blocks `j, 4 + j, 8 + j, 12 + j`, then their high halves
/// (values 16..32). A last partial step is padded with zeros.
#[derive(Debug, Clone)]
pub(super) struct Interleaved16 {
    /// `8` lanes per step.
    pub lanes: Vec<Lane64>,
}

impl Interleaved16 {
    /// The steps of `blocks` (a row's Q8_1 blocks) in the kernel's order.
    pub(super) fn new(blocks: &[BlockQ8_1]) -> Self {
        let steps = blocks.len().div_ceil(STEP);
        let mut lanes = vec![Lane64([0; 64]); steps * 8];
        for (step, group) in blocks.chunks(STEP).enumerate() {
            for j in 0..CHAINS {
                for half in 0..2 {
                    let lane = &mut lanes[step * 8 + 2 * j + half].0;
                    for s in 0..4 {
                        if let Some(b) = group.get(4 * s + j) {
                            lane[16 * s..16 * s + 16]
                                .copy_from_slice(&b.qs[16 * half..16 * half + 16]);
                        }
                    }
                }
            }
        }
        Self { lanes }
    }
}

/// An activation row as this kernel reads it: the Q8_1 blocks (for `d`, `s` and the tail)
/// and the interleaved steps.
#[derive(Debug, Clone, Copy)]
pub(super) struct XRow16<'a> {
    pub row: XRow<'a>,
    pub lanes: &'a [Lane64],
}

/// `out[0, j] = w_j · x` for the `rows` weight rows in `w` and the one activation row `x`
/// (decode; two to eight rows take [`super::dot_lanes_avx512`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C available; `w` is `rows` rows of `nb` blocks of
/// `F`; `x` holds `nb` blocks (and `nb` values of `d` and `s`) and `nb / STEP * 8` lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    x: XRow16<'_>,
    out: &mut OutCols,
) {
    let row_bytes = nb * F::BLOCK_BYTES;
    debug_assert_eq!(w.len(), rows * row_bytes);
    let tail = nb % STEP;
    let quads = if (1..=CHAINS).contains(&tail) {
        rows / QUAD
    } else {
        0
    };
    for q in 0..quads {
        let wq = &w[q * QUAD * row_bytes..(q + 1) * QUAD * row_bytes];
        // SAFETY: features by contract; wq is four rows of nb blocks.
        let sums = unsafe { dot_quad::<F, 1>(wq, nb, [x]) };
        for (jj, [v]) in sums.into_iter().enumerate() {
            out.set(0, q * QUAD + jj, v);
        }
    }
    let done = quads * QUAD;
    for (j, wr) in w[done * row_bytes..]
        .chunks_exact(row_bytes.max(1))
        .take(rows - done)
        .enumerate()
    {
        // SAFETY: features by contract; wr is nb blocks, as is x.
        let [v] = unsafe { dot::<F, 1>(wr, nb, [x]) };
        out.set(0, done + j, v);
    }
}

/// Weight row `wr` against `R` activation rows.
#[inline(always)]
unsafe fn dot<F: Format, const R: usize>(wr: &[u8], nb: usize, xs: [XRow16<'_>; R]) -> [f32; R] {
    debug_assert_eq!(wr.len(), nb * F::BLOCK_BYTES);
    // SAFETY (whole function): steps cover blocks 0..nb / STEP * STEP of the weight row and
    // of every activation row (with their lanes); the tail is the AVX2 step's contract;
    // features by the caller's contract.
    unsafe {
        let mut acc = [_mm_setzero_ps(); R];
        let offsets = block_offsets::<F>();
        let whole = nb / STEP;
        for step in 0..whole {
            step16::<F, R, false>(wr, step, STEP, offsets, &xs, &mut acc);
        }
        if nb > whole * STEP {
            step16::<F, R, true>(wr, whole, nb - whole * STEP, offsets, &xs, &mut acc);
        }
        chain_totals(acc)
    }
}

/// Four consecutive weight rows (`wq`) against `R` activation rows, for rows whose last step
/// holds one to four blocks: each row's whole steps run as in [`dot`], then the four tails
/// share one step ([`tail_quad`]) instead of four mostly empty ones.
#[inline(always)]
unsafe fn dot_quad<F: Format, const R: usize>(
    wq: &[u8],
    nb: usize,
    xs: [XRow16<'_>; R],
) -> [[f32; R]; QUAD] {
    let row_bytes = nb * F::BLOCK_BYTES;
    debug_assert_eq!(wq.len(), QUAD * row_bytes);
    // SAFETY (whole function): as `dot` for each row; the tails are `tail_quad`'s contract.
    unsafe {
        let mut acc = [[_mm_setzero_ps(); R]; QUAD];
        let offsets = block_offsets::<F>();
        let whole = nb / STEP;
        for (wr, acc) in wq.chunks_exact(row_bytes).zip(&mut acc) {
            for step in 0..whole {
                step16::<F, R, false>(wr, step, STEP, offsets, &xs, acc);
            }
        }
        tail_quad::<F, R>(wq, row_bytes, whole, nb - whole * STEP, &xs, &mut acc);
        [
            chain_totals(acc[0]),
            chain_totals(acc[1]),
            chain_totals(acc[2]),
            chain_totals(acc[3]),
        ]
    }
}

/// The last `count` (1 to 4) blocks of four weight rows as one step: block `4s + j` of the
/// step is block `j` of row `s`'s tail, so group `s` of the block sums is row `s`'s tail,
/// added to row `s`'s chains exactly as the group of a partial step (block `16 step + j`
/// into chain `j`). The activation blocks are the same for the four rows: the tail step's
/// first segment, broadcast to all four.
///
/// # Safety
/// As [`dot`]; `wq` holds four rows of `row_bytes` bytes whose blocks from `16 step` on are
/// the last `count` ≤ 4; every activation row's lanes hold step `step`.
#[inline(always)]
unsafe fn tail_quad<F: Format, const R: usize>(
    wq: &[u8],
    row_bytes: usize,
    step: usize,
    count: usize,
    xs: &[XRow16<'_>; R],
    acc: &mut [[__m128; R]; QUAD],
) {
    debug_assert!((1..=CHAINS).contains(&count));
    // SAFETY (whole function): only blocks j < count of each row's tail are read (masked
    // loads and gather); features by the caller's contract.
    unsafe {
        let base = wq.as_ptr().add(step * STEP * F::BLOCK_BYTES);
        let block = |s: usize, j: usize| base.wrapping_add(s * row_bytes + j * F::BLOCK_BYTES);
        let mut wv = [(_mm512_setzero_si512(), _mm512_setzero_si512()); 4];
        for (j, v) in wv.iter_mut().enumerate().take(count) {
            *v = halves_of::<F, false>([0, 1, 2, 3].map(|s| (true, block(s, j))));
        }
        let (offsets, valid) = tail_quad_offsets::<F>(row_bytes, count);
        let (d, m) = scales16::<F, true>(base, offsets, valid);
        for r in 0..R {
            let xl = &xs[r].lanes[step * 8..step * 8 + 8];
            let mut v = [_mm512_setzero_si512(); 4];
            for j in 0..count {
                let lo = _mm512_load_si512(xl[2 * j].0.as_ptr() as *const __m512i);
                let hi = _mm512_load_si512(xl[2 * j + 1].0.as_ptr() as *const __m512i);
                v[j] = block_products_of::<F>(
                    wv[j],
                    _mm512_shuffle_i32x4::<0>(lo, lo),
                    _mm512_shuffle_i32x4::<0>(hi, hi),
                );
            }
            let sums = _mm512_cvtepi32_ps(transpose_sums(v));
            let x4 = (1u8 << count) - 1;
            let pd = xs[r].row.d.as_ptr().add(step * STEP);
            let ps = xs[r].row.s.as_ptr().add(step * STEP);
            let d8 = _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(x4, pd));
            let s8 = _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(x4, ps));
            let dd = _mm512_mul_ps(d, d8);
            let o = F::HAS_OFFSET;
            acc[0][r] = group::<0>(acc[0][r], sums, dd, m, s8, o);
            acc[1][r] = group::<1>(acc[1][r], sums, dd, m, s8, o);
            acc[2][r] = group::<2>(acc[2][r], sums, dd, m, s8, o);
            acc[3][r] = group::<3>(acc[3][r], sums, dd, m, s8, o);
        }
    }
}

/// The gather offsets (from the first row's tail) and mask of a tail step shared by four
/// rows of `row_bytes`: lane `4s + j` is block `j` of row `s`'s tail, valid for `j < count`.
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
pub(super) unsafe fn tail_quad_offsets<F: Format>(
    row_bytes: usize,
    count: usize,
) -> (__m512i, __mmask16) {
    let per_row = (1u32 << count) as u16 - 1;
    let valid = per_row | per_row << 4 | per_row << 8 | per_row << 12;
    let (b, r) = (F::BLOCK_BYTES as i32, row_bytes as i32);
    // SAFETY: AVX-512F by the caller's contract.
    let offsets = unsafe {
        _mm512_set_epi32(
            3 * r + 3 * b,
            3 * r + 2 * b,
            3 * r + b,
            3 * r,
            2 * r + 3 * b,
            2 * r + 2 * b,
            2 * r + b,
            2 * r,
            r + 3 * b,
            r + 2 * b,
            r + b,
            r,
            3 * b,
            2 * b,
            b,
            0,
        )
    };
    (offsets, valid)
}

/// Blocks `16 step..16 step + count` of weight row `wr` against `R` activation rows, added to
/// the chains. A partial step (`PARTIAL`, `count < 16`) reads only its blocks (masked loads
/// and gather) and runs only the chain groups that hold one, as the AVX2 kernel's tail does.
///
/// # Safety
/// As [`dot`]; `count` blocks from block `16 step` exist in the weight row and every
/// activation row, whose lanes hold step `step`.
#[inline(always)]
unsafe fn step16<F: Format, const R: usize, const PARTIAL: bool>(
    wr: &[u8],
    step: usize,
    count: usize,
    offsets: __m512i,
    xs: &[XRow16<'_>; R],
    acc: &mut [__m128; R],
) {
    // SAFETY (whole function): by the caller's contract; masked loads and the masked gather
    // touch only blocks below `count`.
    unsafe {
        let (base, valid) = step_start::<F, PARTIAL>(wr, step, count);
        // The step's weights, unpacked once for all rows: (low, high) halves of vector j.
        let mut wv = [(_mm512_setzero_si512(), _mm512_setzero_si512()); 4];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = halves::<F, PARTIAL>(base, j, count);
        }
        let mut isum = [_mm512_setzero_si512(); R];
        for r in 0..R {
            let xl = &xs[r].lanes[step * 8..step * 8 + 8];
            let mut v = [_mm512_setzero_si512(); 4];
            for j in 0..4 {
                v[j] = block_products::<F>(wv[j], &xl[2 * j], &xl[2 * j + 1]);
            }
            isum[r] = transpose_sums(v);
        }
        let (d, m) = scales16::<F, PARTIAL>(base, offsets, valid);
        let groups = if PARTIAL { count.div_ceil(CHAINS) } else { 4 };
        for r in 0..R {
            let (pd, ps) = (
                xs[r].row.d.as_ptr().add(step * STEP),
                xs[r].row.s.as_ptr().add(step * STEP),
            );
            let (d8, s8) = if PARTIAL {
                (
                    _mm512_maskz_loadu_ps(valid, pd),
                    _mm512_maskz_loadu_ps(valid, ps),
                )
            } else {
                (_mm512_loadu_ps(pd), _mm512_loadu_ps(ps))
            };
            let sums = _mm512_cvtepi32_ps(isum[r]);
            let dd = _mm512_mul_ps(d, d8);
            acc[r] = chain4(acc[r], sums, dd, m, s8, F::HAS_OFFSET, groups);
        }
    }
}

/// The 4×4 transposing reduction of a step's four product vectors (vector `j`, segment `s`:
/// the four partial sums of block `4s + j`) into the sixteen block sums, lane `b` = block `b`.
/// Per segment: first [v0[0] + v0[2], v1[0] + v1[2], v0[1] + v0[3], v1[1] + v1[3]] (and v2,
/// v3), then the sums of vectors 0..4.
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
pub(super) unsafe fn transpose_sums(v: [__m512i; 4]) -> __m512i {
    // SAFETY: AVX-512F by the caller's contract.
    unsafe {
        let p01 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(v[0], v[1]),
            _mm512_unpackhi_epi32(v[0], v[1]),
        );
        let p23 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(v[2], v[3]),
            _mm512_unpackhi_epi32(v[2], v[3]),
        );
        _mm512_add_epi32(
            _mm512_unpacklo_epi64(p01, p23),
            _mm512_unpackhi_epi64(p01, p23),
        )
    }
}

/// Where step `step` of weight row `wr` starts and which of its 16 blocks exist (the first
/// `count`); prefetches the weight stream [`WEIGHTS_AHEAD`] bytes on.
///
/// # Safety
/// Block `16 step` exists in `wr`.
#[inline(always)]
pub(super) unsafe fn step_start<F: Format, const PARTIAL: bool>(
    wr: &[u8],
    step: usize,
    count: usize,
) -> (*const u8, __mmask16) {
    // SAFETY: the step's first block is in `wr` (caller's contract); the prefetch address
    // is never dereferenced.
    let base = unsafe { wr.as_ptr().add(step * STEP * F::BLOCK_BYTES) };
    prefetch::lines(
        base.wrapping_add(WEIGHTS_AHEAD),
        (STEP * F::BLOCK_BYTES).div_ceil(prefetch::LINE),
    );
    let valid = if PARTIAL {
        (1u32 << count) as u16 - 1
    } else {
        0xFFFF
    };
    (base, valid)
}

/// Byte offsets of a step's 16 blocks from its start (where each block's `d`, and Q4_1's
/// `m` after it, are).
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
pub(super) unsafe fn block_offsets<F: Format>() -> __m512i {
    let b = F::BLOCK_BYTES as i32;
    // SAFETY: AVX-512F by the caller's contract.
    unsafe {
        _mm512_set_epi32(
            15 * b,
            14 * b,
            13 * b,
            12 * b,
            11 * b,
            10 * b,
            9 * b,
            8 * b,
            7 * b,
            6 * b,
            5 * b,
            4 * b,
            3 * b,
            2 * b,
            b,
            0,
        )
    }
}

/// The `d` and `m` of the blocks of the step at `base` as f32 lanes in block order, by one
/// gather at `offsets` ([`block_offsets`]); zeros (and no read) for blocks outside `valid`
/// with `PARTIAL`.
///
/// # Safety
/// AVX-512 F/BW and F16C available; the blocks in `valid` (all 16 unless `PARTIAL`) are
/// readable at `base`.
#[inline(always)]
pub(super) unsafe fn scales16<F: Format, const PARTIAL: bool>(
    base: *const u8,
    offsets: __m512i,
    valid: __mmask16,
) -> (__m512, __m512) {
    // SAFETY: the gather reads 4 bytes at each valid block's start (caller's contract).
    unsafe {
        let dm = if PARTIAL {
            _mm512_mask_i32gather_epi32::<1>(
                _mm512_setzero_si512(),
                valid,
                offsets,
                base as *const i32,
            )
        } else {
            _mm512_i32gather_epi32::<1>(offsets, base as *const i32)
        };
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        let m = match F::M_AT {
            Some(_) => _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dm))),
            None => _mm512_mul_ps(d, _mm512_set1_ps(F::M_PER_D)),
        };
        (d, m)
    }
}

/// One vector's products: in segment `s`, the four i32 partial sums of block `4s + j` (weights
/// `w` as (low, high) halves against the activation lanes `xlo`, `xhi`).
///
/// # Safety
/// AVX-512 F/BW/VNNI available.
#[inline(always)]
unsafe fn block_products<F: Format>(w: (__m512i, __m512i), xlo: &Lane64, xhi: &Lane64) -> __m512i {
    // SAFETY: lanes are 64 aligned bytes; features by the caller's contract.
    unsafe {
        block_products_of::<F>(
            w,
            _mm512_load_si512(xlo.0.as_ptr() as *const __m512i),
            _mm512_load_si512(xhi.0.as_ptr() as *const __m512i),
        )
    }
}

/// [`block_products`] of activation halves already in registers.
///
/// # Safety
/// AVX-512 F/BW/VNNI available.
#[inline(always)]
pub(super) unsafe fn block_products_of<F: Format>(
    w: (__m512i, __m512i),
    mut xlo: __m512i,
    mut xhi: __m512i,
) -> __m512i {
    // SAFETY: features by the caller's contract.
    unsafe {
        let (lo, hi) = w;
        let (wlo, whi) = if F::SIGNED {
            // vpdpbusd multiplies unsigned by signed bytes: |q| against x with q's sign (q8
            // is within ±127, so the negation cannot wrap).
            let zero = _mm512_setzero_si512();
            xlo = _mm512_mask_sub_epi8(xlo, _mm512_movepi8_mask(lo), zero, xlo);
            xhi = _mm512_mask_sub_epi8(xhi, _mm512_movepi8_mask(hi), zero, xhi);
            (_mm512_abs_epi8(lo), _mm512_abs_epi8(hi))
        } else {
            (lo, hi)
        };
        let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wlo, xlo);
        _mm512_dpbusd_epi32(p, whi, xhi)
    }
}

/// Adds the first `groups` groups of four of 16 blocks, in block order, to the four chains:
/// for each group `acc = fma(sums, dd, acc)`, then `acc = fma(m, s8, acc)` where the format
/// has an offset.
///
/// # Safety
/// AVX-512 F and FMA available.
#[inline(always)]
unsafe fn chain4(
    mut acc: __m128,
    sums: __m512,
    dd: __m512,
    m: __m512,
    s8: __m512,
    offset: bool,
    groups: usize,
) -> __m128 {
    // SAFETY: by the caller's contract.
    unsafe {
        acc = group::<0>(acc, sums, dd, m, s8, offset);
        if groups > 1 {
            acc = group::<1>(acc, sums, dd, m, s8, offset);
        }
        if groups > 2 {
            acc = group::<2>(acc, sums, dd, m, s8, offset);
        }
        if groups > 3 {
            acc = group::<3>(acc, sums, dd, m, s8, offset);
        }
        acc
    }
}

/// Group `G` of four blocks (lanes `4G..4G + 4`) added to the four chains `acc`:
/// `fma(sums, dd, acc)`, then `fma(m, s8, acc)` where the format has an offset.
///
/// # Safety
/// AVX-512 F and FMA available.
#[inline(always)]
unsafe fn group<const G: i32>(
    acc: __m128,
    sums: __m512,
    dd: __m512,
    m: __m512,
    s8: __m512,
    offset: bool,
) -> __m128 {
    // SAFETY: by the caller's contract.
    unsafe {
        let acc = _mm_fmadd_ps(
            _mm512_extractf32x4_ps::<G>(sums),
            _mm512_extractf32x4_ps::<G>(dd),
            acc,
        );
        if offset {
            _mm_fmadd_ps(
                _mm512_extractf32x4_ps::<G>(m),
                _mm512_extractf32x4_ps::<G>(s8),
                acc,
            )
        } else {
            acc
        }
    }
}

/// The `q` of vector `j` of the step at `base`: segment `s` holds weights 0..16 (first
/// vector) and 16..32 (second) of block `4s + j`, as unsigned bytes (signed for Q8_0); with
/// `PARTIAL`, zeros for blocks from `count` on, which are not read.
///
/// # Safety
/// AVX-512 F/BW/VL available; the step's blocks below `count` (all 16 unless `PARTIAL`) are
/// readable at `base`.
#[inline(always)]
pub(super) unsafe fn halves<F: Format, const PARTIAL: bool>(
    base: *const u8,
    j: usize,
    count: usize,
) -> (__m512i, __m512i) {
    let blocks = [0, 1, 2, 3].map(|s| {
        (
            !PARTIAL || 4 * s + j < count,
            base.wrapping_add((4 * s + j) * F::BLOCK_BYTES),
        )
    });
    // SAFETY: only blocks 4s + j below `count` are read (caller's contract).
    unsafe { halves_of::<F, PARTIAL>(blocks) }
}

/// The `q` of four blocks, one per 128-bit segment (each block's start and whether it is
/// read): weights 0..16 in the first vector, 16..32 in the second, as unsigned bytes (signed
/// for Q8_0); with `PARTIAL`, zeros for a block that is not read.
///
/// # Safety
/// AVX-512 F/BW/VL available; every block to be read is readable.
#[inline(always)]
pub(super) unsafe fn halves_of<F: Format, const PARTIAL: bool>(
    blocks: [(bool, *const u8); 4],
) -> (__m512i, __m512i) {
    let at = |off: usize| blocks.map(|(live, p)| (live, p.wrapping_add(off)));
    // SAFETY: only the blocks marked live are read (caller's contract).
    unsafe {
        match F::QS_AT {
            QsLayout::Nibbles { at: qs, high_bits } => {
                let v = load4::<PARTIAL>(at(qs));
                let mask = _mm512_set1_epi8(0x0F);
                let mut lo = _mm512_and_si512(v, mask);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
                if let Some(at_h) = high_bits {
                    // Q5_0: bit i of the block's 32-bit `qh` is weight i's fifth bit.
                    let mut mlo = 0u64;
                    let mut mhi = 0u64;
                    for (s, &(live, p)) in blocks.iter().enumerate() {
                        if !PARTIAL || live {
                            let qh = (p.add(at_h) as *const u32).read_unaligned() as u64;
                            mlo |= (qh & 0xFFFF) << (16 * s);
                            mhi |= (qh >> 16) << (16 * s);
                        }
                    }
                    let five = _mm512_set1_epi8(0x10);
                    lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(mlo, five));
                    hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(mhi, five));
                }
                (lo, hi)
            }
            QsLayout::Bytes { at: qs } => (load4::<PARTIAL>(at(qs)), load4::<PARTIAL>(at(qs + 16))),
        }
    }
}

/// The 16 bytes at byte `at` of blocks `j`, `4 + j`, `8 + j` and `12 + j` of the step at
/// `base`, one block per 128-bit segment; with `PARTIAL`, zeros (and no read) for blocks from
/// `count` on.
///
/// # Safety
/// AVX-512 F/BW/VL available; 16 bytes readable at `at` of every block read.
#[inline(always)]
pub(super) unsafe fn segments<F: Format, const PARTIAL: bool>(
    base: *const u8,
    j: usize,
    count: usize,
    at: usize,
) -> __m512i {
    let live = |s: usize| !PARTIAL || 4 * s + j < count;
    let addr = |s: usize| base.wrapping_add((4 * s + j) * F::BLOCK_BYTES + at);
    // SAFETY: by the caller's contract.
    unsafe { load4::<PARTIAL>([0, 1, 2, 3].map(|s| (live(s), addr(s)))) }
}

/// 16 bytes from each of four addresses, one per 128-bit segment; with `PARTIAL`, zeros
/// (and no read) for an address whose flag is false.
///
/// # Safety
/// AVX-512 F/BW/VL available; 16 bytes readable at each address read.
#[inline(always)]
pub(super) unsafe fn load4<const PARTIAL: bool>(p: [(bool, *const u8); 4]) -> __m512i {
    // SAFETY: by the caller's contract; unaligned loads, masked ones fault on no masked-out
    // byte.
    unsafe {
        let v = _mm512_castsi128_si512(load16::<PARTIAL>(p[0]));
        let v = _mm512_inserti32x4::<1>(v, load16::<PARTIAL>(p[1]));
        let v = _mm512_inserti32x4::<2>(v, load16::<PARTIAL>(p[2]));
        _mm512_inserti32x4::<3>(v, load16::<PARTIAL>(p[3]))
    }
}

/// 16 bytes at `p`; with `PARTIAL` and `live` false, zeros without a read.
///
/// # Safety
/// AVX-512 BW/VL available; 16 bytes readable at `p` if it is read.
#[inline(always)]
unsafe fn load16<const PARTIAL: bool>((live, p): (bool, *const u8)) -> __m128i {
    // SAFETY: by the caller's contract (a masked-out byte is never read).
    unsafe {
        if PARTIAL {
            _mm_maskz_loadu_epi8(if live { 0xFFFF } else { 0 }, p as *const i8)
        } else {
            _mm_loadu_si128(p as *const __m128i)
        }
    }
}

/// Where a block's `q` are (the trait's [`Format::QS_AT`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum QsLayout {
    /// 16 bytes of nibbles at `at` (low nibbles weights 0..16, high 16..32), and for Q5_0 the
    /// 32-bit fifth bits at `high_bits`.
    Nibbles { at: usize, high_bits: Option<usize> },
    /// 32 signed bytes at `at`.
    Bytes { at: usize },
}

/// Checks at compile time that the four halves of a block are 16 bytes (a segment).
const _: () = assert!(QK == 32);
