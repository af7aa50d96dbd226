//! Small f32 vector primitives shared by the kernels, written so LLVM vectorises them: eight
//! independent accumulators break the floating-point dependency chain of a plain sum.

/// Dot product of two equal-length slices.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let chunks_a = a.chunks_exact(8);
    let chunks_b = b.chunks_exact(8);
    let tail: f32 = chunks_a
        .remainder()
        .iter()
        .zip(chunks_b.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (ca, cb) in chunks_a.zip(chunks_b) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y *= alpha`.
#[inline]
pub(crate) fn scale(y: &mut [f32], alpha: f32) {
    for yi in y.iter_mut() {
        *yi *= alpha;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close, random_vec, rng};

    #[test]
    fn dot_matches_naive_for_every_tail_length() {
        let mut r = rng(1);
        for n in 0..40 {
            let a = random_vec(&mut r, n, 1.0);
            let b = random_vec(&mut r, n, 1.0);
            let naive: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert_close(&[dot(&a, &b)], &[naive as f32], 1e-5, 1e-5);
        }
    }

    #[test]
    fn scale_matches_naive() {
        let mut r = rng(2);
        let mut y = random_vec(&mut r, 19, 1.0);
        let expected: Vec<f32> = y.iter().map(|a| a * 3.0).collect();
        scale(&mut y, 3.0);
        assert_close(&y, &expected, 1e-6, 1e-6);
    }
}
