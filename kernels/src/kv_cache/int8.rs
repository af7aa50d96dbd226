//! Int8 KV quantisation of one (token, KV head) vector: symmetric absmax rounding, like
//! ggml's `quantize_row_q8_0` over a whole head. `scale = max|x| / 127`, `q = round(x /
//! scale)`, so `|x - scale·q| ≤ scale / 2 = max|x| / 254` for every element.

/// Quantises `x` into `out` and returns the scale (0 for an all-zero vector).
///
/// # Panics
/// If the lengths differ.
#[inline]
pub fn quantize_int8(x: &[f32], out: &mut [i8]) -> f32 {
    assert_eq!(x.len(), out.len(), "quantize_int8: length mismatch");
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    if amax == 0.0 || !amax.is_finite() {
        // A non-finite K/V is already a broken model state; zeros keep attention finite.
        out.fill(0);
        return 0.0;
    }
    let scale = amax / 127.0;
    let inv = 127.0 / amax;
    for (q, v) in out.iter_mut().zip(x) {
        // |v * inv| <= 127 up to rounding; `as` saturates anyway.
        *q = (v * inv).round() as i8;
    }
    scale
}

/// `out = scale * q`.
///
/// # Panics
/// If the lengths differ.
pub fn dequantize_int8(q: &[i8], scale: f32, out: &mut [f32]) {
    assert_eq!(q.len(), out.len(), "dequantize_int8: length mismatch");
    for (o, v) in out.iter_mut().zip(q) {
        *o = scale * *v as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{random_vec, rng};
    use rand::Rng;

    #[test]
    fn round_trip_error_is_at_most_half_a_step() {
        let mut r = rng(7);
        for len in [1, 2, 7, 63, 64, 65, 128, 129] {
            let mag = r.random_range(1e-3..50.0);
            let mut x = random_vec(&mut r, len, mag);
            // An outlier channel, as keys have: the rest still meets the bound.
            x[len / 2] *= 8.0;
            let mut q = vec![0i8; len];
            let scale = quantize_int8(&x, &mut q);
            let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            assert!((scale - amax / 127.0).abs() <= 1e-7 * amax);
            assert!(q.iter().any(|v| v.abs() == 127), "the max maps to ±127");
            let mut back = vec![0.0; len];
            dequantize_int8(&q, scale, &mut back);
            for (a, b) in x.iter().zip(&back) {
                assert!(
                    (a - b).abs() <= amax / 254.0 * (1.0 + 1e-5),
                    "len {len}: {a} -> {b} (amax {amax})"
                );
            }
        }
    }

    #[test]
    fn zero_and_non_finite_heads_stay_finite() {
        let mut q = [5i8; 4];
        assert_eq!(quantize_int8(&[0.0; 4], &mut q), 0.0);
        assert_eq!(q, [0; 4]);
        // An infinity zeroes the head; a NaN element becomes 0 and the rest keep their scale.
        assert_eq!(quantize_int8(&[1.0, f32::INFINITY], &mut q[..2]), 0.0);
        assert_eq!(q[..2], [0, 0]);
        assert_eq!(quantize_int8(&[1.0, f32::NAN], &mut q[..2]), 1.0 / 127.0);
        assert_eq!(q[..2], [127, 0]);
    }
}
