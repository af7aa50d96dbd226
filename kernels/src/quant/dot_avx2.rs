//! AVX2 quantised matmul for decode and small batches: one weight row at a time (read
//! sequentially, so a decode step streams the weights at memory speed) against up to four
//! activation rows, four blocks per step.
//!
//! Each block's `q` are unpacked into bytes and multiplied against the activation block with
//! `maddubs` + `madd` (or AVX-VNNI's `vpdpbusd`), as in ggml's `ggml_vec_dot_q4_1_q8_1`;
//! Q8_0's signed weights use ggml's sign trick `|q| · (q8 · sign(q))`. A `hadd` tree turns
//! four blocks' partial sums into their four exact block sums, one per 128-bit lane, and one
//! 4-wide FMA adds `Σ q·q8 · d·d8` to the four accumulation chains at once: lane `c` is chain
//! `c` of the common arithmetic ([`super::format`]), so decode gives the same bits as the
//! batched panel GEMM.
//!
//! Q4_0, Q4_1 and Q5_0 take [`super::dot8_avx2`] instead, eight weight rows at a time; the
//! rows after its last whole group of eight come here.

use std::arch::x86_64::*;

use super::format::{Format, CHAINS, WEIGHTS_AHEAD};
use super::matmul::{OutCols, XRow};
use crate::prefetch;

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` and the activation rows `xs`.
///
/// # Safety
/// AVX2, FMA and F16C available; `w` is `rows` rows of `nb` blocks of `F`; every `xs` row
/// holds `nb` blocks (and `nb` values of `d` and `s`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[XRow<'_>],
    out: &mut OutCols,
) {
    // SAFETY: by the caller's contract.
    unsafe { rows_body::<F, false>(w, rows, nb, xs, out) }
}

/// [`rows`] with AVX-VNNI's `vpdpbusd`.
///
/// # Safety
/// As [`rows`], and AVX-VNNI available.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn rows_vnni<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[XRow<'_>],
    out: &mut OutCols,
) {
    // SAFETY: by the caller's contract.
    unsafe { rows_body::<F, true>(w, rows, nb, xs, out) }
}

#[inline(always)]
unsafe fn rows_body<F: Format, const VNNI: bool>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[XRow<'_>],
    out: &mut OutCols,
) {
    let row_bytes = nb * F::BLOCK_BYTES;
    debug_assert_eq!(w.len(), rows * row_bytes);
    for (j, wr) in w.chunks_exact(row_bytes.max(1)).take(rows).enumerate() {
        let mut i = 0;
        while i < xs.len() {
            let left = xs.len() - i;
            // SAFETY (all arms): features by contract; wr is nb blocks, each row nb blocks.
            let n = match left {
                1 => store(out, i, j, unsafe { dot::<F, 1, VNNI>(wr, nb, [xs[i]]) }),
                2 => store(out, i, j, unsafe {
                    dot::<F, 2, VNNI>(wr, nb, [xs[i], xs[i + 1]])
                }),
                3 => store(out, i, j, unsafe {
                    dot::<F, 3, VNNI>(wr, nb, [xs[i], xs[i + 1], xs[i + 2]])
                }),
                _ => store(out, i, j, unsafe {
                    dot::<F, 4, VNNI>(wr, nb, [xs[i], xs[i + 1], xs[i + 2], xs[i + 3]])
                }),
            };
            i += n;
        }
    }
}

/// Writes `r[k]` to `out[i + k, j]`; returns how many rows that was.
#[inline(always)]
pub(super) fn store<const R: usize>(out: &mut OutCols, i: usize, j: usize, r: [f32; R]) -> usize {
    for (k, v) in r.into_iter().enumerate() {
        out.set(i + k, j, v);
    }
    R
}

/// Weight row `wr` against `R` activation rows.
///
/// (No closures around intrinsics here or below: a closure does not get the caller's target
/// features, and an intrinsic left out of line costs a call per use.)
#[inline(always)]
unsafe fn dot<F: Format, const R: usize, const VNNI: bool>(
    wr: &[u8],
    nb: usize,
    xs: [XRow<'_>; R],
) -> [f32; R] {
    debug_assert_eq!(wr.len(), nb * F::BLOCK_BYTES);
    // SAFETY (whole function): blocks b..b + 4 (or the nb - b < 4 remaining) exist in the
    // weight row and every activation row; features by the caller's contract.
    unsafe {
        let mut acc = [_mm_setzero_ps(); R];
        let mut b = 0;
        while b + CHAINS <= nb {
            // The next cache lines of the weight stream (past the row's end: the next row).
            prefetch::lines(
                wr.as_ptr().wrapping_add(b * F::BLOCK_BYTES + WEIGHTS_AHEAD),
                3,
            );
            step::<F, R, VNNI>(wr, b, CHAINS, &xs, &mut acc);
            b += CHAINS;
        }
        if b < nb {
            step::<F, R, VNNI>(wr, b, nb - b, &xs, &mut acc);
        }
        chain_totals(acc)
    }
}

/// Each row's result from its four chains (one per lane): `(a0 + a1) + (a2 + a3)`.
///
/// # Safety
/// SSE available (baseline on x86-64).
#[inline(always)]
pub(super) unsafe fn chain_totals<const R: usize>(acc: [__m128; R]) -> [f32; R] {
    acc.map(|v| {
        let mut c = [0.0f32; CHAINS];
        // SAFETY: c holds four f32.
        unsafe { _mm_storeu_ps(c.as_mut_ptr(), v) };
        (c[0] + c[1]) + (c[2] + c[3])
    })
}

/// `count` (≤ 4) f16 values at byte `off` of blocks `b..b + count`, as f32 lanes (zero past
/// `count`).
///
/// # Safety
/// F16C available; the blocks exist.
#[inline(always)]
unsafe fn half4<F: Format>(wr: &[u8], b: usize, count: usize, off: usize) -> __m128 {
    let mut h = [0i16; 8];
    for (c, v) in h.iter_mut().enumerate().take(count) {
        // SAFETY: the block exists (caller's contract).
        *v = unsafe {
            (wr.as_ptr().add((b + c) * F::BLOCK_BYTES + off) as *const i16).read_unaligned()
        };
    }
    // SAFETY: h is 16 readable bytes; F16C by contract.
    unsafe { _mm_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i)) }
}

/// Blocks `b..b + count` (`count <= 4`) into chains `0..count`; lanes past `count` add zero.
#[inline(always)]
unsafe fn step<F: Format, const R: usize, const VNNI: bool>(
    wr: &[u8],
    b: usize,
    count: usize,
    xs: &[XRow<'_>; R],
    acc: &mut [__m128; R],
) {
    // SAFETY (whole function): blocks b..b + count exist (caller's contract); missing lanes
    // use zero weights, scales and activation scales.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut q = [_mm256_setzero_si256(); CHAINS];
        for (c, qc) in q.iter_mut().enumerate().take(count) {
            *qc = F::unpack(wr.as_ptr().add((b + c) * F::BLOCK_BYTES));
        }
        let d = half4::<F>(wr, b, count, 0);
        let m = match F::M_AT {
            Some(off) => half4::<F>(wr, b, count, off),
            None => _mm_mul_ps(d, _mm_set1_ps(F::M_PER_D)),
        };
        for r in 0..R {
            let x = &xs[r];
            let mut p = [_mm256_setzero_si256(); CHAINS];
            for c in 0..count {
                let xv = _mm256_loadu_si256(x.blocks[b + c].qs.as_ptr() as *const __m256i);
                let (wa, xv) = if F::SIGNED {
                    (_mm256_sign_epi8(q[c], q[c]), _mm256_sign_epi8(xv, q[c]))
                } else {
                    (q[c], xv)
                };
                p[c] = if VNNI {
                    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), wa, xv)
                } else {
                    _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xv), ones)
                };
            }
            let isum = reduce4(p);
            let (d8, s8) = if count == CHAINS {
                (
                    _mm_loadu_ps(x.d.as_ptr().add(b)),
                    _mm_loadu_ps(x.s.as_ptr().add(b)),
                )
            } else {
                let mut dd = [0.0f32; CHAINS];
                let mut ss = [0.0f32; CHAINS];
                dd[..count].copy_from_slice(&x.d[b..b + count]);
                ss[..count].copy_from_slice(&x.s[b..b + count]);
                (_mm_loadu_ps(dd.as_ptr()), _mm_loadu_ps(ss.as_ptr()))
            };
            acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(d, d8), acc[r]);
            if F::HAS_OFFSET {
                acc[r] = _mm_fmadd_ps(m, s8, acc[r]);
            }
        }
    }
}

/// Lane `c` of the result is the exact sum of the eight lanes of `p[c]`.
///
/// # Safety
/// AVX2 available.
#[inline(always)]
unsafe fn reduce4(p: [__m256i; CHAINS]) -> __m128i {
    // SAFETY: by the caller's contract.
    unsafe {
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
    }
}
