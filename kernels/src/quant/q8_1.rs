//! Activations quantised to Q8_1 as ggml's `quantize_row_q8_1_ref` does, so the Q4_1 dot
//! product runs on integers: per 32 values `d = max|x| / 127`, `q = round(x / d)`, and
//! `s = d * sum(q)` (which folds Q4_1's offset `m` into one multiply). Unlike ggml, `d` and `s`
//! stay f32: the block never leaves memory, so rounding them to f16 would only lose accuracy.

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
    for (xb, b) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in b.qs.iter_mut().zip(xb) {
            // |v * id| <= 127 by construction; `as` saturates anyway.
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        b.d = d;
        b.s = d * sum as f32;
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
