//! `e^x` eight lanes at a time on AVX2 + FMA: ggml's `ggml_v_expf` (ARM's
//! optimized-routines algorithm, max error ~1.5 ulp), shared by the attention softmax and the
//! SwiGLU gate, where a libm call per value showed up in profiles.

use std::arch::x86_64::*;

/// `e^x` for 8 lanes: ggml's `ggml_v_expf` (ARM's optimized-routines algorithm), 1.5 ulp.
///
/// # Safety
/// AVX2 and FMA available.
#[inline(always)]
pub(crate) unsafe fn exp(x: __m256) -> __m256 {
    /// A constant given by its bits (the reference writes them as hex floats).
    #[inline(always)]
    unsafe fn c(bits: u32) -> __m256 {
        // SAFETY: AVX by the caller's contract.
        unsafe { _mm256_set1_ps(f32::from_bits(bits)) }
    }
    // SAFETY: by the caller's contract.
    unsafe {
        let r = c(0x4b40_0000); // 0x1.8p23
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r); // x · log2(e) + r
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
        let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
        let k = _mm256_castsi256_ps(_mm256_add_epi32(
            e,
            _mm256_castps_si256(_mm256_set1_ps(1.0)),
        ));
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let big = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_mul_ps(c(0x3f7f_fff6), b),
        );
        if _mm256_movemask_ps(big) == 0 {
            return _mm256_fmadd_ps(j, k, k);
        }
        let g = _mm256_and_si256(
            _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
            _mm256_set1_epi32(0x8200_0000u32 as i32),
        );
        let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
        let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
        let huge = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        _mm256_or_ps(
            _mm256_and_ps(huge, _mm256_mul_ps(s1, s1)),
            _mm256_andnot_ps(
                huge,
                _mm256_or_ps(
                    _mm256_and_ps(big, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                    _mm256_andnot_ps(big, _mm256_fmadd_ps(k, j, k)),
                ),
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: [f32; 8]) -> [f32; 8] {
        let mut out = [0.0; 8];
        // SAFETY: 8 floats each.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp(_mm256_loadu_ps(x.as_ptr()))) };
        out
    }

    #[test]
    fn vector_exp_matches_libm_over_the_softmax_range() {
        if !crate::cpu::avx2() {
            return;
        }
        let mut x = -120.0f32;
        while x <= 10.0 {
            let xs: [f32; 8] = std::array::from_fn(|i| x + i as f32 * 0.0037);
            // SAFETY: AVX2/FMA detected above.
            let got = unsafe { exp8(xs) };
            for (g, v) in got.iter().zip(xs) {
                let want = v.exp();
                assert!(
                    (g - want).abs() <= want * 4e-7 + f32::MIN_POSITIVE,
                    "exp({v}) = {g}, libm {want}"
                );
            }
            x += 0.031;
        }
        // Underflow to zero and -inf (a fully masked score) stay finite.
        // SAFETY: as above.
        let got = unsafe {
            exp8([
                -200.0,
                -1e30,
                f32::NEG_INFINITY,
                0.0,
                88.0,
                -87.0,
                -103.0,
                1.0,
            ])
        };
        assert_eq!(&got[..4], &[0.0, 0.0, 0.0, 1.0]);
        assert!((got[4] / 88f32.exp() - 1.0).abs() < 1e-6);
    }
}
