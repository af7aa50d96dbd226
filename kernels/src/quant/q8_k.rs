//! Activations quantised to Q8_K for the K-quant dot products, as ggml's
//! `quantize_row_q8_K`: per 256 values `d = max / -127` with `max` the value of largest
//! magnitude (the first of them), `q = round(x / d)` (to nearest, ties to even),
//! and the sum of every 16 consecutive `q` (the K-quants' offsets and minimums are multiplied
//! against those sums rather than against every value). The AVX2 build (chosen at run time)
//! gives bit-identical blocks; as for Q8_1, the portable loop's rounding is a libm call per
//! value: 2048 of them for each input to Gemma 3's FFN down projection at every decode step.

use super::kformat::QK_K;

/// 256 activations as signed bytes with their scale `d` and the sum of each 16.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(32))]
pub struct BlockQ8K {
    /// Scale: value ≈ `d * q`.
    pub d: f32,
    /// The quantised values.
    pub qs: [i8; QK_K],
    /// `bsums[g]` = sum of `qs[16 g..16 g + 16]`.
    pub bsums: [i16; QK_K / 16],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        Self {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; QK_K / 16],
        }
    }
}

/// Quantises `x` (a multiple of 256 values) into `out` (one block per 256 values).
///
/// # Panics
/// If the lengths do not match.
pub fn quantize_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(
        x.len(),
        out.len() * QK_K,
        "quantize_q8_k: x is not out.len() blocks"
    );
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected just above; lengths checked.
        unsafe { avx2::quantize(x, out) };
        return;
    }
    quantize_portable(x, out);
}

fn quantize_portable(x: &[f32], out: &mut [BlockQ8K]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = BlockQ8K::default();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, v) in b.qs.iter_mut().zip(xb) {
            // |iscale · v| <= 127 by construction; `as` saturates anyway.
            *q = (iscale * v).round_ties_even() as i8;
        }
        for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::kdot_avx2::hsum;
    use super::*;
    use std::arch::x86_64::*;

    /// Vectors of eight values per block.
    const VECS: usize = QK_K / 8;

    /// [`quantize_portable`] with 8-wide vectors: the same operations in the same order.
    ///
    /// # Safety
    /// AVX2 available; `x.len() == out.len() * 256`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize(x: &[f32], out: &mut [BlockQ8K]) {
        let sign = _mm256_set1_ps(-0.0);
        for (xb, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
            // SAFETY: xb is 256 floats.
            let v: [__m256; VECS] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * i)) });
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for vi in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
            }
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
            if amax == 0.0 {
                *b = BlockQ8K::default();
                continue;
            }
            // The first value of largest magnitude, as the scalar scan keeps it.
            let at = _mm256_set1_ps(amax);
            let first = v
                .iter()
                .enumerate()
                .find_map(|(i, vi)| {
                    let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                        _mm256_andnot_ps(sign, *vi),
                        at,
                    ));
                    (hit != 0).then(|| 8 * i + hit.trailing_zeros() as usize)
                })
                .unwrap_or(0);
            let iscale = -127.0 / xb[first];
            let is = _mm256_set1_ps(iscale);
            for c in 0..VECS / 4 {
                // cvtps rounds to nearest even (the default MXCSR mode), like
                // round_ties_even.
                let q: [__m256i; 4] =
                    std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[4 * c + i], is)));
                // Values 32c..32c + 16 and 32c + 16..32c + 32: groups 2c and 2c + 1.
                for (h, pair) in q.chunks_exact(2).enumerate() {
                    b.bsums[2 * c + h] = hsum(_mm256_add_epi32(pair[0], pair[1])) as i16;
                }
                // i32 -> i16 -> i8 packs interleave 128-bit lanes; the permute restores order.
                let p = _mm256_packs_epi16(
                    _mm256_packs_epi32(q[0], q[1]),
                    _mm256_packs_epi32(q[2], q[3]),
                );
                let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                // SAFETY: qs[32c..32c + 32] is writable.
                unsafe { _mm256_storeu_si256(b.qs.as_mut_ptr().add(32 * c) as *mut __m256i, p) };
            }
            b.d = 1.0 / iscale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{random_vec, rng};

    #[test]
    fn round_trip_error_is_at_most_half_a_step_and_sums_match() {
        let mut r = rng(52);
        let x = random_vec(&mut r, 3 * QK_K, 5.0);
        let mut b = vec![BlockQ8K::default(); 3];
        quantize_q8_k(&x, &mut b);
        for (xb, blk) in x.chunks(QK_K).zip(&b) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            assert!((blk.d.abs() - amax / 127.0).abs() <= 1e-6 * amax);
            assert!(blk.qs.contains(&-127));
            for (v, q) in xb.iter().zip(blk.qs) {
                assert!((v - blk.d * q as f32).abs() <= blk.d.abs() * 0.5 + 1e-5);
            }
            for (g, s) in blk.bsums.iter().enumerate() {
                let want: i32 = blk.qs[16 * g..16 * g + 16].iter().map(|q| *q as i32).sum();
                assert_eq!(*s as i32, want);
            }
        }
    }

    #[test]
    fn agrees_with_candle() {
        use candle_core::quantized::k_quants::{BlockQ8K as Theirs, GgmlType};
        let mut r = rng(53);
        let x = random_vec(&mut r, 4 * QK_K, 3.0);
        let mut ours = vec![BlockQ8K::default(); 4];
        quantize_q8_k(&x, &mut ours);
        let mut theirs = vec![Theirs::zeros(); 4];
        Theirs::from_float(&x, &mut theirs);
        let mut back = vec![0.0; x.len()];
        Theirs::to_float(&theirs, &mut back);
        for (i, v) in back.iter().enumerate() {
            let b = &ours[i / QK_K];
            assert_eq!(*v, b.d * b.qs[i % QK_K] as f32, "value {i}");
        }
    }

    #[test]
    fn every_build_gives_the_same_blocks() {
        let mut r = rng(54);
        let mut x = random_vec(&mut r, 32 * QK_K, 7.0);
        // Exact ties: the first value of largest magnitude is -127, so the scale is
        // -127 / -127 = 1 and 2.5 and -3.5 round to even (2, -4).
        x[..5].copy_from_slice(&[-127.0, 2.5, -3.5, 0.5, 127.0]);
        x[QK_K..2 * QK_K].fill(0.0);
        x[2 * QK_K + 200] = 50.0;
        x[2 * QK_K + 201] = -50.0;
        let mut portable = vec![BlockQ8K::default(); 32];
        let mut dispatched = vec![BlockQ8K::default(); 32];
        quantize_portable(&x, &mut portable);
        quantize_q8_k(&x, &mut dispatched);
        assert_eq!(portable, dispatched);
        assert_eq!(&portable[0].qs[..5], &[-127, 2, -4, 0, 127]);
    }

    #[test]
    fn zero_block_is_all_zero() {
        let mut b = [BlockQ8K {
            d: 9.0,
            qs: [1; QK_K],
            bsums: [3; 16],
        }];
        quantize_q8_k(&[0.0; QK_K], &mut b);
        assert_eq!(b[0], BlockQ8K::default());
    }
}
