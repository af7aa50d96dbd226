//! AVX-512 VNNI Q4_K decode on the sixteen-row repacked layout ([`super::q4_k_x16`]):
//! one group of sixteen weight rows against up to four activation rows, each weight row's
//! result in its own lane.
//!
//! Per super-block: three 64-byte loads and ten logic ops unpack the sixteen rows' 6-bit
//! scales and minimums (ggml's `get_scale_min_k4` on 16 lanes); each of 32 loads of nibbles
//! (4 bytes of each row) is split into low and high nibbles and meets the matching four
//! activation bytes, broadcast, in one `vpdpbusd` each; one `vpmulld` per 32-weight
//! sub-block applies its scale, and four `vpdpwssd` meet the minimums with the activations'
//! 32-value sums. `isum` and `msum` are exact, and chain `b % 4` of lane `r` takes the
//! common arithmetic's FMAs ([`super::kformat`]), so results are the same bits as every
//! other kernel's.

use std::arch::x86_64::*;

use super::format::CHAINS;
use super::matmul::OutCols;
use super::q4_k_x16::{GROUP_BLOCK_BYTES, GROUP_ROWS};
use super::q8_k::BlockQ8K;

// `group` unrolls one step per chain.
const _: () = assert!(CHAINS == 4);

/// The activations' 32-value sums of each super-block as the four `vpdpwssd` pairs:
/// `(s0, s2), (s1, s3), (s4, s6), (s5, s7)`, `s_j` = sum of values `32 j..32 j + 32`.
pub(super) fn sum_pairs(x: &[BlockQ8K]) -> Vec<[i32; 4]> {
    x.iter()
        .map(|b| {
            let s: [i32; 8] =
                std::array::from_fn(|j| i32::from(b.bsums[2 * j]) + i32::from(b.bsums[2 * j + 1]));
            let pair = |a: i32, b: i32| (a & 0xFFFF) | (b << 16);
            [
                pair(s[0], s[2]),
                pair(s[1], s[3]),
                pair(s[4], s[6]),
                pair(s[5], s[7]),
            ]
        })
        .collect()
}

/// `out[i, j] = w_j · x_i` for the `rows` weight rows (whole groups) in `w` and the
/// activation rows `xs` (`pairs`: [`sum_pairs`] of all of them, row after row), each group
/// against every activation row in passes of up to four, the later passes reading the group
/// from cache.
///
/// # Safety
/// AVX-512 F/BW/VNNI, AVX2, FMA and F16C available; `w` is `rows / 16` groups of `nb`
/// group blocks; every `xs` row holds `nb` blocks and `pairs` `nb` entries per row.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[&[BlockQ8K]],
    pairs: &[[i32; 4]],
    out: &mut OutCols,
) {
    let group_bytes = nb * GROUP_BLOCK_BYTES;
    debug_assert_eq!(w.len(), rows / GROUP_ROWS * group_bytes);
    debug_assert_eq!(pairs.len(), xs.len() * nb);
    let pair = |i: usize| &pairs[i * nb..(i + 1) * nb];
    for (g, wg) in w.chunks_exact(group_bytes).enumerate() {
        let mut i = 0;
        while i < xs.len() {
            // SAFETY (all arms): features and shapes by the caller's contract.
            i += match xs.len() - i {
                1 => store(out, i, g, unsafe { group(wg, nb, [xs[i]], [pair(i)]) }),
                2 => store(out, i, g, unsafe {
                    group(wg, nb, [xs[i], xs[i + 1]], [pair(i), pair(i + 1)])
                }),
                3 => store(out, i, g, unsafe {
                    group(
                        wg,
                        nb,
                        [xs[i], xs[i + 1], xs[i + 2]],
                        [pair(i), pair(i + 1), pair(i + 2)],
                    )
                }),
                _ => store(out, i, g, unsafe {
                    group(
                        wg,
                        nb,
                        [xs[i], xs[i + 1], xs[i + 2], xs[i + 3]],
                        [pair(i), pair(i + 1), pair(i + 2), pair(i + 3)],
                    )
                }),
            };
        }
    }
}

/// Writes group `g`'s results for activation rows `i..i + R`; returns `R`.
#[inline(always)]
fn store<const R: usize>(
    out: &mut OutCols,
    i: usize,
    g: usize,
    r: [[f32; GROUP_ROWS]; R],
) -> usize {
    for (k, lanes) in r.iter().enumerate() {
        for (l, &v) in lanes.iter().enumerate() {
            out.set(i + k, g * GROUP_ROWS + l, v);
        }
    }
    R
}

/// The sixteen rows of group block `wg` (its `nb` super-blocks) against `R` activation rows
/// (`pairs[r]` = [`sum_pairs`] of `xs[r]`): `[r][lane]`.
///
/// # Safety
/// AVX-512 F/BW/VNNI, FMA and F16C available; `wg` holds `nb` group blocks; every `xs` and
/// `pairs` row holds `nb` entries.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn group<const R: usize>(
    wg: &[u8],
    nb: usize,
    xs: [&[BlockQ8K]; R],
    pairs: [&[[i32; 4]]; R],
) -> [[f32; GROUP_ROWS]; R] {
    debug_assert_eq!(wg.len(), nb * GROUP_BLOCK_BYTES);
    // SAFETY (whole function): super-blocks 0..nb exist in `wg` and every row of `xs` and
    // `pairs`; features by the caller's contract.
    unsafe {
        // acc[t][r]: chain t of activation row r (constant indices only, so the chains stay
        // in registers).
        let mut acc = [[_mm512_setzero_ps(); R]; CHAINS];
        let whole = nb / 4 * 4;
        for b0 in (0..whole).step_by(4) {
            step::<R>(wg, b0, &xs, &pairs, &mut acc[0]);
            step::<R>(wg, b0 + 1, &xs, &pairs, &mut acc[1]);
            step::<R>(wg, b0 + 2, &xs, &pairs, &mut acc[2]);
            step::<R>(wg, b0 + 3, &xs, &pairs, &mut acc[3]);
        }
        let rest = nb - whole;
        if rest > 0 {
            step::<R>(wg, whole, &xs, &pairs, &mut acc[0]);
        }
        if rest > 1 {
            step::<R>(wg, whole + 1, &xs, &pairs, &mut acc[1]);
        }
        if rest > 2 {
            step::<R>(wg, whole + 2, &xs, &pairs, &mut acc[2]);
        }
        let mut out = [[0f32; GROUP_ROWS]; R];
        for (r, o) in out.iter_mut().enumerate() {
            let total = _mm512_add_ps(
                _mm512_add_ps(acc[0][r], acc[1][r]),
                _mm512_add_ps(acc[2][r], acc[3][r]),
            );
            _mm512_storeu_ps(o.as_mut_ptr(), total);
        }
        out
    }
}

/// Super-block `b` of group blocks `wg` against `R` activation rows, into one chain.
#[inline(always)]
unsafe fn step<const R: usize>(
    wg: &[u8],
    b: usize,
    xs: &[&[BlockQ8K]; R],
    pairs: &[&[[i32; 4]]; R],
    acc: &mut [__m512; R],
) {
    // SAFETY (whole function): super-block b exists in `wg` and every row (caller's
    // contract); features likewise.
    unsafe {
        let base = wg.as_ptr().add(b * GROUP_BLOCK_BYTES);
        let (isum, msum) = superblock::<R>(base, b, xs, pairs);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(base as *const __m256i));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(32) as *const __m256i));
        for r in 0..R {
            let d8 = _mm512_set1_ps(xs[r][b].d);
            let a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, d8), acc[r]);
            // `-(msum as f32)`, exactly (a sign flip, not `0 - x`).
            let neg = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(_mm512_cvtepi32_ps(msum[r])),
                _mm512_set1_epi32(i32::MIN),
            ));
            acc[r] = _mm512_fmadd_ps(neg, _mm512_mul_ps(dmin, d8), a);
        }
    }
}

/// Super-block `b` (group block at `base`) against `R` activation rows: `isum` and `msum`
/// per row, lane = weight row.
#[inline(always)]
unsafe fn superblock<const R: usize>(
    base: *const u8,
    b: usize,
    xs: &[&[BlockQ8K]; R],
    pairs: &[&[[i32; 4]]; R],
) -> ([__m512i; R], [__m512i; R]) {
    // SAFETY (whole function): the group block and super-block b of every row exist
    // (caller's contract); features likewise.
    unsafe {
        let w0 = _mm512_loadu_si512(base.add(64) as *const __m512i);
        let w1 = _mm512_loadu_si512(base.add(128) as *const __m512i);
        let w2 = _mm512_loadu_si512(base.add(192) as *const __m512i);
        let k1 = _mm512_set1_epi32(0x3f3f_3f3f);
        let k2 = _mm512_set1_epi32(0x0f0f_0f0f);
        let k3 = _mm512_set1_epi32(0x0303_0303);
        // Byte j of lane r: sub-block j's (j + 4's) scale or minimum of row r.
        let sc03 = _mm512_and_si512(w0, k1);
        let mn03 = _mm512_and_si512(w1, k1);
        let sc47 = _mm512_or_si512(
            _mm512_and_si512(w2, k2),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(w0), k3)),
        );
        let mn47 = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<4>(w2), k2),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(w1), k3)),
        );
        let m4 = _mm512_set1_epi8(0x0F);
        let mut isum = [_mm512_setzero_si512(); R];
        for p in 0..4 {
            let mut lo = [_mm512_setzero_si512(); R];
            let mut hi = [_mm512_setzero_si512(); R];
            for c in 0..8 {
                let v = _mm512_loadu_si512(base.add(256 + 512 * p + 64 * c) as *const __m512i);
                let l = _mm512_and_si512(v, m4);
                let h = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                for r in 0..R {
                    let q = xs[r][b].qs.as_ptr().add(64 * p + 4 * c);
                    let xl = _mm512_set1_epi32((q as *const i32).read_unaligned());
                    let xh = _mm512_set1_epi32((q.add(32) as *const i32).read_unaligned());
                    lo[r] = _mm512_dpbusd_epi32(lo[r], l, xl);
                    hi[r] = _mm512_dpbusd_epi32(hi[r], h, xh);
                }
            }
            let four = if p < 2 { sc03 } else { sc47 };
            let s_lo = byte_of(four, 2 * (p % 2));
            let s_hi = byte_of(four, 2 * (p % 2) + 1);
            for r in 0..R {
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(lo[r], s_lo));
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(hi[r], s_hi));
            }
        }
        // Minimums as i16 pairs: (m0, m2), (m1, m3), (m4, m6), (m5, m7).
        let even = _mm512_set1_epi32(0x00FF_00FF);
        let m02 = _mm512_and_si512(mn03, even);
        let m13 = _mm512_srli_epi16::<8>(mn03);
        let m46 = _mm512_and_si512(mn47, even);
        let m57 = _mm512_srli_epi16::<8>(mn47);
        let mut msum = [_mm512_setzero_si512(); R];
        for r in 0..R {
            let s = &pairs[r][b];
            let mut m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), m02, _mm512_set1_epi32(s[0]));
            m = _mm512_dpwssd_epi32(m, m13, _mm512_set1_epi32(s[1]));
            m = _mm512_dpwssd_epi32(m, m46, _mm512_set1_epi32(s[2]));
            msum[r] = _mm512_dpwssd_epi32(m, m57, _mm512_set1_epi32(s[3]));
        }
        (isum, msum)
    }
}

/// Byte `j` (0..4) of every 32-bit lane of `v`, zero-extended.
#[inline(always)]
unsafe fn byte_of(v: __m512i, j: usize) -> __m512i {
    // SAFETY: AVX-512 F by the caller's contract.
    unsafe {
        _mm512_and_si512(
            _mm512_srlv_epi32(v, _mm512_set1_epi32(8 * j as i32)),
            _mm512_set1_epi32(0xFF),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dot::tests::random_blocks;
    use crate::quant::format::QuantType;
    use crate::quant::kformat::dot_portable_k;
    use crate::quant::q4_k::Q4K;
    use crate::quant::q4_k_x16::repack;
    use crate::quant::q8_k::quantize_q8_k;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn check<const R: usize>(nb: usize, seed: u64) {
        let mut r = StdRng::seed_from_u64(seed);
        let rows = 32;
        let w = random_blocks(&mut r, QuantType::Q4_K, rows * nb);
        let p = repack(&w, rows, nb);
        let xq: Vec<Vec<BlockQ8K>> = (0..R)
            .map(|_| {
                let x: Vec<f32> = (0..nb * 256).map(|_| r.random_range(-2.0..2.0)).collect();
                let mut q = vec![BlockQ8K::default(); nb];
                quantize_q8_k(&x, &mut q);
                q
            })
            .collect();
        let pairs: Vec<Vec<[i32; 4]>> = xq.iter().map(|x| sum_pairs(x)).collect();
        for g in 0..rows / 16 {
            let wg = &p[g * nb * GROUP_BLOCK_BYTES..(g + 1) * nb * GROUP_BLOCK_BYTES];
            // SAFETY: the test runs only where the features are.
            let out = unsafe {
                group::<R>(
                    wg,
                    nb,
                    std::array::from_fn(|i| &xq[i][..]),
                    std::array::from_fn(|i| &pairs[i][..]),
                )
            };
            for (i, o) in out.iter().enumerate() {
                for (l, got) in o.iter().enumerate() {
                    let j = g * 16 + l;
                    let want = dot_portable_k::<Q4K>(&w[j * nb * 144..(j + 1) * nb * 144], &xq[i]);
                    assert_eq!(got.to_bits(), want.to_bits(), "nb {nb} act {i} row {j}");
                }
            }
        }
    }

    #[test]
    fn sixteen_rows_match_the_reference_bit_for_bit() {
        if !crate::quant::dot::DotKernel::Avx512Vnni.is_supported() {
            return;
        }
        for nb in [1, 2, 3, 4, 5, 8, 9] {
            check::<1>(nb, nb as u64);
            check::<2>(nb, 10 + nb as u64);
            check::<4>(nb, 20 + nb as u64);
        }
    }
}
