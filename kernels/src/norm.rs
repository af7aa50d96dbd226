//! RMS normalisation as in llama.cpp's `ggml_rms_norm` followed by the weight multiply:
//! `out = x / sqrt(mean(x²) + eps) * weight`, row by row.

use rayon::prelude::*;

/// RMS-normalises each row of `x` (rows of `weight.len()` values) and scales by `weight`.
///
/// # Panics
/// If `weight` is empty, `x.len()` is not a multiple of `weight.len()`, or `out.len() != x.len()`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    assert!(dim > 0, "rms_norm: empty weight");
    assert!(
        x.len().is_multiple_of(dim),
        "rms_norm: x is not whole rows of weight.len()"
    );
    assert_eq!(out.len(), x.len(), "rms_norm: out and x differ in length");
    let row = |(xr, or): (&[f32], &mut [f32])| {
        let inv = inverse_rms(xr, eps);
        for ((o, xi), wi) in or.iter_mut().zip(xr).zip(weight) {
            *o = xi * inv * wi;
        }
    };
    if x.len() >= crate::PAR_MIN_ELEMS {
        x.par_chunks(dim).zip(out.par_chunks_mut(dim)).for_each(row);
    } else {
        x.chunks(dim).zip(out.chunks_mut(dim)).for_each(row);
    }
}

/// [`rms_norm`] in place: each row of `x` (rows of `weight.len()` values, e.g. one attention
/// head for Gemma's Q/K norms) becomes `x / sqrt(mean(x²) + eps) * weight`.
///
/// # Panics
/// If `weight` is empty or `x.len()` is not a multiple of `weight.len()`.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    assert!(dim > 0, "rms_norm: empty weight");
    assert!(
        x.len().is_multiple_of(dim),
        "rms_norm: x is not whole rows of weight.len()"
    );
    let row = |xr: &mut [f32]| {
        let inv = inverse_rms(xr, eps);
        for (xi, wi) in xr.iter_mut().zip(weight) {
            *xi = *xi * inv * wi;
        }
    };
    if x.len() >= crate::PAR_MIN_ELEMS {
        x.par_chunks_mut(dim).for_each(row);
    } else {
        x.chunks_mut(dim).for_each(row);
    }
}

/// `1 / sqrt(mean(x²) + eps)` of one row.
#[inline]
fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    // Sum of squares in f64 would be slower; f32 with the vectorised dot is what ggml does.
    let mean_sq = crate::simd::dot(x, x) / x.len() as f32;
    1.0 / (mean_sq + eps).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close, random_vec, rng};

    fn naive(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        x.chunks(w.len())
            .flat_map(|r| {
                let ms = r.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / r.len() as f64;
                let inv = 1.0 / (ms + eps as f64).sqrt();
                r.iter()
                    .zip(w)
                    .map(move |(v, wi)| (*v as f64 * inv * *wi as f64) as f32)
            })
            .collect()
    }

    #[test]
    fn matches_naive_on_random_shapes() {
        let mut r = rng(10);
        for &(rows, dim) in &[(1, 1), (1, 7), (3, 576), (5, 33), (64, 576), (2, 1536)] {
            let x = random_vec(&mut r, rows * dim, 3.0);
            let w = random_vec(&mut r, dim, 1.5);
            let mut out = vec![0.0; rows * dim];
            rms_norm(&x, &w, 1e-5, &mut out);
            assert_close(&out, &naive(&x, &w, 1e-5), 1e-5, 1e-4);
        }
    }

    #[test]
    fn in_place_equals_out_of_place_bit_for_bit() {
        let mut r = rng(11);
        for &(rows, dim) in &[(1, 256), (9, 256), (64, 640)] {
            let x = random_vec(&mut r, rows * dim, 3.0);
            let w = random_vec(&mut r, dim, 1.5);
            let mut out = vec![0.0; rows * dim];
            rms_norm(&x, &w, 1e-6, &mut out);
            let mut in_place = x.clone();
            rms_norm_in_place(&mut in_place, &w, 1e-6);
            assert_eq!(in_place, out);
        }
    }

    #[test]
    fn eps_keeps_zero_rows_finite() {
        let mut out = vec![1.0; 4];
        rms_norm(&[0.0; 4], &[1.0; 4], 1e-6, &mut out);
        assert_eq!(out, vec![0.0; 4]);
    }

    #[test]
    fn unit_weight_gives_unit_rms() {
        // mean(x²) = 25 / 4, so rms = 2.5.
        let x = [3.0, -4.0, 0.0, 0.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        assert_close(&out, &[1.2, -1.6, 0.0, 0.0], 1e-6, 0.0);
    }

    #[test]
    #[should_panic(expected = "whole rows")]
    fn rejects_partial_rows() {
        let mut out = [0.0; 5];
        rms_norm(&[0.0; 5], &[1.0; 2], 1e-5, &mut out);
    }
}
