//! AVX2 K-quant matmul: one weight row at a time (read sequentially, so a decode step streams
//! the weights at memory speed) against up to four activation rows, one super-block per step.
//!
//! Each super-block is unpacked once ([`KFormat::unpack_avx2`]: 256 unsigned bytes and 16
//! scales and offsets) and multiplied against every activation row with `maddubs` (pairs of
//! byte products into i16, at most 2 · 63 · 128) and `madd` against the group scales (into
//! i32), as in ggml's `ggml_vec_dot_q4_K_q8_K`; the offsets meet the activations' 16-value
//! sums in one more `madd`. Both sums are exact, and the float steps are the scalar ones of
//! [`super::kformat`], so every batch gives the same bits as the portable reference.

use std::arch::x86_64::*;

use super::format::{CHAINS, WEIGHTS_AHEAD};
use super::kformat::{accumulate, KFormat};
use super::matmul::OutCols;
use super::q8_k::BlockQ8K;
use crate::prefetch;

/// Activation rows processed against one weight row before moving to the next: 64 rows of
/// k = 2048 (~150 KiB of Q8_K) stay in L2.
const M_TILE: usize = 64;

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` and the activation rows `xs`.
///
/// # Safety
/// AVX2, FMA and F16C available; `w` is `rows` rows of `nb` super-blocks of `K`; every `xs`
/// row holds `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows<K: KFormat>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[&[BlockQ8K]],
    out: &mut OutCols,
) {
    let row_bytes = nb * K::BLOCK_BYTES;
    debug_assert_eq!(w.len(), rows * row_bytes);
    for i0 in (0..xs.len()).step_by(M_TILE) {
        let tile = &xs[i0..xs.len().min(i0 + M_TILE)];
        if tile.len() > 4 {
            let mut acc = vec![[0.0f32; CHAINS]; tile.len()];
            for (j, wr) in w.chunks_exact(row_bytes.max(1)).take(rows).enumerate() {
                acc.fill([0.0; CHAINS]);
                // SAFETY: features by contract; wr is nb blocks, each row nb blocks.
                unsafe { dot_tile::<K>(wr, nb, tile, &mut acc) };
                for (i, c) in acc.iter().enumerate() {
                    out.set(i0 + i, j, (c[0] + c[1]) + (c[2] + c[3]));
                }
            }
            continue;
        }
        for (j, wr) in w.chunks_exact(row_bytes.max(1)).take(rows).enumerate() {
            let mut i = 0;
            while i < tile.len() {
                let at = i0 + i;
                // SAFETY (all arms): features by contract; wr is nb blocks, each row nb blocks.
                let n = match tile.len() - i {
                    1 => store(out, at, j, unsafe { dot::<K, 1>(wr, nb, [tile[i]]) }),
                    2 => store(out, at, j, unsafe {
                        dot::<K, 2>(wr, nb, [tile[i], tile[i + 1]])
                    }),
                    3 => store(out, at, j, unsafe {
                        dot::<K, 3>(wr, nb, [tile[i], tile[i + 1], tile[i + 2]])
                    }),
                    _ => store(out, at, j, unsafe {
                        dot::<K, 4>(wr, nb, [tile[i], tile[i + 1], tile[i + 2], tile[i + 3]])
                    }),
                };
                i += n;
            }
        }
    }
}

/// Writes `r[k]` to `out[i + k, j]`; returns how many rows that was.
#[inline(always)]
fn store<const R: usize>(out: &mut OutCols, i: usize, j: usize, r: [f32; R]) -> usize {
    for (k, v) in r.into_iter().enumerate() {
        out.set(i + k, j, v);
    }
    R
}

/// Sum of the eight i32 lanes of `v`.
///
/// # Safety
/// AVX2 available.
#[inline(always)]
pub(super) unsafe fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Group 2c's scale in the low 128 bits of `scv[c]`, group 2c + 1's in the high ones, as
/// i16 lanes (the pairs `maddubs` leaves for weights 32c..32c + 16 and 32c + 16..32c + 32).
///
/// # Safety
/// AVX2 available.
#[inline(always)]
unsafe fn scale_vectors(sc: __m256i) -> [__m256i; 8] {
    // SAFETY: AVX2 by the caller's contract.
    unsafe {
        let spread = _mm256_setr_epi8(
            0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2,
            3, 2, 3,
        );
        let mut v = [sc; 8];
        for (c, vc) in v.iter_mut().enumerate() {
            *vc = _mm256_shuffle_epi8(
                _mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(c as i32)),
                spread,
            );
        }
        v
    }
}

/// Weight row `wr` against every row of `xs` (a batch): each super-block is unpacked once
/// for all of them; `acc[i]` receives row `i`'s chains.
///
/// # Safety
/// As [`rows`]; `acc` holds one entry per row of `xs`.
#[inline(always)]
unsafe fn dot_tile<K: KFormat>(
    wr: &[u8],
    nb: usize,
    xs: &[&[BlockQ8K]],
    acc: &mut [[f32; CHAINS]],
) {
    debug_assert_eq!(wr.len(), nb * K::BLOCK_BYTES);
    // SAFETY (whole function): block b exists in the weight row and every activation row;
    // features by the caller's contract.
    unsafe {
        for b in 0..nb {
            let k = K::unpack_avx2(wr.as_ptr().add(b * K::BLOCK_BYTES));
            let scv = scale_vectors(k.sc);
            for (x, a) in xs.iter().zip(acc.iter_mut()) {
                let x = &x[b];
                let mut s = _mm256_setzero_si256();
                for (c, (q, sv)) in k.q.iter().zip(&scv).enumerate() {
                    let xv = _mm256_loadu_si256(x.qs.as_ptr().add(32 * c) as *const __m256i);
                    let p = _mm256_maddubs_epi16(*q, xv);
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, *sv));
                }
                let bs = _mm256_loadu_si256(x.bsums.as_ptr() as *const __m256i);
                let msum = hsum(_mm256_madd_epi16(bs, k.mn));
                accumulate::<K>(&mut a[b % CHAINS], hsum(s), msum, k.d, k.dmin, x.d);
            }
        }
    }
}

/// Weight row `wr` against `R` activation rows.
///
/// (No closures around intrinsics: a closure does not get the caller's target features.)
#[inline(always)]
unsafe fn dot<K: KFormat, const R: usize>(wr: &[u8], nb: usize, xs: [&[BlockQ8K]; R]) -> [f32; R] {
    debug_assert_eq!(wr.len(), nb * K::BLOCK_BYTES);
    // SAFETY (whole function): block b exists in the weight row and every activation row;
    // features by the caller's contract.
    unsafe {
        // Group 2c's scale in the low 128 bits, group 2c + 1's in the high ones, as i16 lanes
        // (the pairs `maddubs` leaves for weights 32c..32c + 16 and 32c + 16..32c + 32).
        let spread = _mm256_setr_epi8(
            0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2,
            3, 2, 3,
        );
        let mut acc = [[0.0f32; CHAINS]; R];
        for b in 0..nb {
            let wb = wr.as_ptr().add(b * K::BLOCK_BYTES);
            // The next cache lines of the weight stream (past the row's end: the next row).
            prefetch::lines(wb.wrapping_add(WEIGHTS_AHEAD), K::BLOCK_BYTES.div_ceil(64));
            let k = K::unpack_avx2(wb);
            let mut s = [_mm256_setzero_si256(); R];
            for c in 0..8 {
                let pair = _mm256_permutevar8x32_epi32(k.sc, _mm256_set1_epi32(c as i32));
                let scv = _mm256_shuffle_epi8(pair, spread);
                for r in 0..R {
                    let xv = _mm256_loadu_si256(xs[r][b].qs.as_ptr().add(32 * c) as *const __m256i);
                    let p = _mm256_maddubs_epi16(k.q[c], xv);
                    s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(p, scv));
                }
            }
            for r in 0..R {
                let x = &xs[r][b];
                let bs = _mm256_loadu_si256(x.bsums.as_ptr() as *const __m256i);
                let msum = hsum(_mm256_madd_epi16(bs, k.mn));
                accumulate::<K>(&mut acc[r][b % CHAINS], hsum(s[r]), msum, k.d, k.dmin, x.d);
            }
        }
        acc.map(|c| (c[0] + c[1]) + (c[2] + c[3]))
    }
}
