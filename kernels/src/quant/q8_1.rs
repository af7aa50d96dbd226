//! Activations quantised to Q8_1 as ggml's `quantize_row_q8_1` does, so the weight dot
//! products run on integers: per 32 values `d = max|x| / 127`, `q = round(x / d)` (to nearest,
//! ties to even, as ggml's AVX2 path), and `s = d * sum(q)` (which folds Q4_0's and Q4_1's
//! offset into one multiply). Unlike ggml, `d` and `s` stay f32: the block never leaves
//! memory, so rounding them to f16 would only lose accuracy. The AVX2 build (chosen at run
//! time) gives bit-identical blocks; it exists because the portable loop's rounding is a libm
//! call per value, which showed as 7% of a batched decode step.

use super::q4_1::QK;

/// 32 activations as signed bytes with their scale `d` and `s = d * sum(qs)`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct BlockQ8_1 {
    /// Scale: value ≈ `d * q`.
    pub d: f32,
    /// `d * sum(qs)`.
    pub s: f32,
    /// The quantised values.
    pub qs: [i8; QK],
}

impl Default for BlockQ8_1 {
    fn default() -> Self {
        Self {
            d: 0.0,
            s: 0.0,
            qs: [0; QK],
        }
    }
}

/// Quantises `x` (a multiple of 32 values) into `out` (one block per 32 values).
///
/// # Panics
/// If the lengths do not match.
pub fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    assert_eq!(
        x.len(),
        out.len() * QK,
        "quantize_q8_1: x is not out.len() blocks"
    );
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected just above; lengths checked.
        unsafe { avx2::quantize(x, out) };
        return;
    }
    quantize_portable(x, out);
}

fn quantize_portable(x: &[f32], out: &mut [BlockQ8_1]) {
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in b.qs.iter_mut().zip(xb) {
            // |v * id| <= 127 by construction; `as` saturates anyway.
            *q = (v * id).round_ties_even() as i8;
            sum += *q as i32;
        }
        b.d = d;
        b.s = d * sum as f32;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// [`quantize_portable`] with 8-wide vectors: the same operations in the same order.
    ///
    /// # Safety
    /// AVX2 available; `x.len() == out.len() * 32`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize(x: &[f32], out: &mut [BlockQ8_1]) {
        let sign = _mm256_set1_ps(-0.0);
        for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
            // SAFETY: xb is 32 floats.
            let v: [__m256; 4] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * i)) });
            let a = |i: usize| _mm256_andnot_ps(sign, v[i]);
            let m = _mm256_max_ps(_mm256_max_ps(a(0), a(1)), _mm256_max_ps(a(2), a(3)));
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_movehdup_ps(m));
            let amax = _mm_cvtss_f32(m);
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
            // cvtps rounds to nearest even (the default MXCSR mode), like round_ties_even.
            let q: [__m256i; 4] =
                std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)));
            let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let sum = _mm_add_epi32(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256::<1>(sum),
            );
            let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01_00_11_10>(sum));
            let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b10_11_00_01>(sum));
            // i32 -> i16 -> i8 packs interleave 128-bit lanes; the permute restores order.
            let p = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            // SAFETY: qs is 32 writable bytes.
            unsafe { _mm256_storeu_si256(b.qs.as_mut_ptr() as *mut __m256i, p) };
            b.d = d;
            b.s = d * _mm_cvtsi128_si32(sum) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{random_vec, rng};

    #[test]
    fn round_trip_error_is_at_most_half_a_step() {
        let mut r = rng(50);
        let x = random_vec(&mut r, 4 * QK, 5.0);
        let mut b = vec![BlockQ8_1::default(); 4];
        quantize_q8_1(&x, &mut b);
        for (xb, blk) in x.chunks(QK).zip(&b) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            assert_eq!(blk.d, amax / 127.0);
            assert!(blk.qs.iter().any(|q| q.abs() == 127));
            for (v, q) in xb.iter().zip(blk.qs) {
                assert!((v - blk.d * q as f32).abs() <= blk.d * 0.5 + 1e-6);
            }
            let sum: i32 = blk.qs.iter().map(|q| *q as i32).sum();
            assert_eq!(blk.s, blk.d * sum as f32);
        }
    }

    #[test]
    fn every_build_gives_the_same_blocks() {
        let mut r = rng(51);
        let mut x = random_vec(&mut r, 64 * QK, 7.0);
        // Exact ties: with max 127 the scale is 1, so 2.5 and -3.5 round to even (2, -4).
        x[..4].copy_from_slice(&[127.0, 2.5, -3.5, 0.5]);
        x[QK..2 * QK].fill(0.0);
        let mut portable = vec![BlockQ8_1::default(); 64];
        let mut dispatched = vec![BlockQ8_1::default(); 64];
        quantize_portable(&x, &mut portable);
        quantize_q8_1(&x, &mut dispatched);
        assert_eq!(portable, dispatched);
        assert_eq!(&portable[0].qs[..4], &[127, 2, -4, 0]);
    }

    #[test]
    fn zero_block_is_all_zero() {
        let mut b = [BlockQ8_1 {
            d: 9.0,
            s: 9.0,
            qs: [1; QK],
        }];
        quantize_q8_1(&[0.0; QK], &mut b);
        assert_eq!(b[0], BlockQ8_1::default());
    }
}
