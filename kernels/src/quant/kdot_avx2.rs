//! AVX2 K-quant matmul: one weight row at a time (read sequentially, so a decode step streams
//! the weights at memory speed) against up to four activation rows, four super-blocks per
//! step (more rows: [`dot_tile`], one super-block at a time against the whole tile).
//!
//! Each super-block is unpacked once ([`KFormat::unpack_avx2`]: 256 unsigned bytes and 16
//! scales and offsets) and multiplied against every activation row with `maddubs` (pairs of
//! byte products into i16, at most 2 · 63 · 128) and `madd` against the group scales (into
//! i32), as in ggml's `ggml_vec_dot_q4_K_q8_K`; the offsets meet the activations' 16-value
//! sums in one more `madd`. Both sums are exact, and the float steps are the scalar ones of
//! [`super::kformat`], so every batch gives the same bits as the portable reference.
//!
//! Up to four rows, a step leaves each super-block's two sums spread over eight lanes and
//! reduces the four super-blocks' vectors together ([`sums4`]), so one 4-wide FMA per step
//! does the four chains' float steps, with the chains in a register. Summing each
//! super-block on its own (two horizontal sums, the chain picked by index on the stack) made
//! Llama 3.2 1B's shape in Q4_K_M (`tidal bench fixture`) decode 1.10× slower on one thread
//! and 1.06× on two (`tidal bench decode --cpu-kernel avx2`, three alternating rounds,
//! medians; 2-core AMD EPYC of the Zen 4 generation). Spreading the same step over 512-bit
//! vectors (`vpermw` for the scales, `vpdpwssd`) was no faster there than the AVX2 step it
//! replaced.

use std::arch::x86_64::*;

use super::dot_avx2::chain_totals;
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

/// Weight row `wr` against `R` activation rows, four super-blocks per step.
#[inline(always)]
unsafe fn dot<K: KFormat, const R: usize>(wr: &[u8], nb: usize, xs: [&[BlockQ8K]; R]) -> [f32; R] {
    debug_assert_eq!(wr.len(), nb * K::BLOCK_BYTES);
    // SAFETY (whole function): the steps cover super-blocks 0..nb of the weight row and of
    // every activation row; features by the caller's contract.
    unsafe {
        let mut acc = [_mm_setzero_ps(); R];
        let whole = nb / CHAINS;
        for g in 0..whole {
            step::<K, R>(wr, g * CHAINS, CHAINS, &xs, &mut acc);
        }
        if nb > whole * CHAINS {
            step::<K, R>(wr, whole * CHAINS, nb - whole * CHAINS, &xs, &mut acc);
        }
        chain_totals(acc)
    }
}

/// Super-blocks `b0..b0 + count` (`count` ≤ 4, one per chain) of weight row `wr` against
/// `R` activation rows, into chains `0..count` of `acc`.
///
/// Each super-block leaves its `isum` and `msum` spread over eight i32 lanes; the four
/// super-blocks' vectors meet in one transposing reduction ([`sums4`]) that gives their
/// exact sums in one vector, lane `t` = super-block `b0 + t` = chain `t`, and one 4-wide FMA
/// (two for the `dmin` formats) performs the reference's scalar FMAs for all four.
///
/// (No closures around intrinsics: a closure does not get the caller's target features.)
///
/// # Safety
/// As [`rows`]; super-blocks `b0..b0 + count` exist in `wr` and every row of `xs`.
#[inline(always)]
unsafe fn step<K: KFormat, const R: usize>(
    wr: &[u8],
    b0: usize,
    count: usize,
    xs: &[&[BlockQ8K]; R],
    acc: &mut [__m128; R],
) {
    // SAFETY (whole function): super-blocks b0..b0 + count are in bounds (caller's
    // contract); features likewise.
    unsafe {
        let zero = [_mm256_setzero_si256(); R];
        let mut isum = [zero; CHAINS];
        let mut msum = [zero; CHAINS];
        let mut d = [0.0f32; CHAINS];
        let mut dmin = [0.0f32; CHAINS];
        for t in 0..count {
            (isum[t], msum[t], d[t], dmin[t]) = superblock::<K, R>(wr, b0 + t, xs);
        }
        // Chains past `count` keep their value (a blend, so not even a zero's sign changes).
        let keep = _mm_castsi128_ps(_mm_cmplt_epi32(
            _mm_setr_epi32(0, 1, 2, 3),
            _mm_set1_epi32(count as i32),
        ));
        let d = _mm_loadu_ps(d.as_ptr());
        let dmin = _mm_loadu_ps(dmin.as_ptr());
        for r in 0..R {
            let mut d8 = [0.0f32; CHAINS];
            for (t, v) in d8.iter_mut().enumerate().take(count) {
                *v = xs[r][b0 + t].d;
            }
            let d8 = _mm_loadu_ps(d8.as_ptr());
            let isum = sums4([isum[0][r], isum[1][r], isum[2][r], isum[3][r]]);
            let msum = sums4([msum[0][r], msum[1][r], msum[2][r], msum[3][r]]);
            let next = if K::HAS_DMIN {
                let a = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(d, d8), acc[r]);
                // `-(msum as f32)`, exactly (a sign flip, not `0 - x`).
                let neg = _mm_xor_ps(_mm_cvtepi32_ps(msum), _mm_set1_ps(-0.0));
                _mm_fmadd_ps(neg, _mm_mul_ps(dmin, d8), a)
            } else {
                let sum = _mm_cvtepi32_ps(_mm_sub_epi32(isum, msum));
                _mm_fmadd_ps(sum, _mm_mul_ps(d, d8), acc[r])
            };
            acc[r] = _mm_blendv_ps(acc[r], next, keep);
        }
    }
}

/// Super-block `b` of weight row `wr` against `R` activation rows: per row, `isum` and
/// `msum` spread over eight i32 lanes; and the block's `d` and `dmin`.
///
/// # Safety
/// As [`step`]; super-block `b` exists in `wr` and every row of `xs`.
#[inline(always)]
unsafe fn superblock<K: KFormat, const R: usize>(
    wr: &[u8],
    b: usize,
    xs: &[&[BlockQ8K]; R],
) -> ([__m256i; R], [__m256i; R], f32, f32) {
    // SAFETY (whole function): super-block b is in bounds (caller's contract); features
    // likewise.
    unsafe {
        let wb = wr.as_ptr().add(b * K::BLOCK_BYTES);
        // The next cache lines of the weight stream (past the row's end: the next row).
        prefetch::lines(wb.wrapping_add(WEIGHTS_AHEAD), K::BLOCK_BYTES.div_ceil(64));
        let k = K::unpack_avx2(wb);
        let scv = if K::SCALE_SPAN == 32 {
            broadcast_scales(k.sc)
        } else {
            scale_vectors(k.sc)
        };
        let mut isum = [_mm256_setzero_si256(); R];
        for (c, sv) in scv.iter().enumerate() {
            for r in 0..R {
                let xv = _mm256_loadu_si256(xs[r][b].qs.as_ptr().add(32 * c) as *const __m256i);
                let p = _mm256_maddubs_epi16(k.q[c], xv);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, *sv));
            }
        }
        let mut msum = [_mm256_setzero_si256(); R];
        for r in 0..R {
            let bs = _mm256_loadu_si256(xs[r][b].bsums.as_ptr() as *const __m256i);
            msum[r] = _mm256_madd_epi16(bs, k.mn);
        }
        (isum, msum, k.d, k.dmin)
    }
}

/// [`scale_vectors`] for the formats whose scales each cover 32 weights (`sc` holds each
/// twice): vector `c`'s one scale, broadcast from a stored copy.
///
/// # Safety
/// AVX2 available.
#[inline(always)]
unsafe fn broadcast_scales(sc: __m256i) -> [__m256i; 8] {
    /// The sixteen i16 scales, aligned for one store.
    #[repr(C, align(32))]
    struct Scales([i16; 16]);
    let mut stored = Scales([0; 16]);
    // SAFETY: AVX2 by the caller's contract; `stored` is 32 aligned bytes.
    unsafe {
        _mm256_store_si256(stored.0.as_mut_ptr() as *mut __m256i, sc);
        let mut v = [sc; 8];
        for (c, vc) in v.iter_mut().enumerate() {
            *vc = _mm256_set1_epi16(stored.0[2 * c]);
        }
        v
    }
}

/// The four totals of `v[t]`'s eight i32 lanes, lane `t` = `v[t]`: a 4×4 transpose per
/// 128-bit half by `unpack` and `add`, then the halves added.
///
/// # Safety
/// AVX2 available.
#[inline(always)]
unsafe fn sums4(v: [__m256i; 4]) -> __m128i {
    // SAFETY: AVX2 by the caller's contract.
    unsafe {
        let a = _mm256_add_epi32(
            _mm256_unpacklo_epi32(v[0], v[1]),
            _mm256_unpackhi_epi32(v[0], v[1]),
        );
        let b = _mm256_add_epi32(
            _mm256_unpacklo_epi32(v[2], v[3]),
            _mm256_unpackhi_epi32(v[2], v[3]),
        );
        let s = _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
        _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s))
    }
}
