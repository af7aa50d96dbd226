//! Activations quantised to Q8_K for the K-quant dot products, as ggml's
//! `quantize_row_q8_K`: per 256 values `d = max / -127` with `max` the value of largest
//! magnitude (the first of them), `q = round(x / d)` (to nearest, ties to even),
//! and the sum of every 16 consecutive `q` (the K-quants' offsets and minimums are multiplied
//! against those sums rather than against every value).

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
