//! The SwiGLU gate of llama-style FFNs: `silu(gate) * up` (ggml `ggml_swiglu_split`).

use rayon::prelude::*;

/// In place: `gate[i] = silu(gate[i]) * up[i]` where `silu(x) = x / (1 + e^-x)`.
///
/// # Panics
/// If the slices differ in length.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(
        gate.len(),
        up.len(),
        "silu_mul: gate and up differ in length"
    );
    let f = |(g, u): (&mut f32, &f32)| *g = *g / (1.0 + (-*g).exp()) * u;
    if gate.len() >= crate::PAR_MIN_ELEMS {
        gate.par_iter_mut()
            .zip(up.par_iter())
            .with_min_len(4096)
            .for_each(f);
    } else {
        gate.iter_mut().zip(up).for_each(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close, random_vec, rng};

    #[test]
    fn matches_naive_on_random_lengths() {
        let mut r = rng(20);
        for n in [0, 1, 5, 1536, 16 * 1536 + 3] {
            let g = random_vec(&mut r, n, 8.0);
            let u = random_vec(&mut r, n, 2.0);
            let expected: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| {
                    let g = *g as f64;
                    (g / (1.0 + (-g).exp()) * *u as f64) as f32
                })
                .collect();
            let mut out = g.clone();
            silu_mul(&mut out, &u);
            assert_close(&out, &expected, 1e-6, 1e-5);
        }
    }

    #[test]
    fn saturates_without_nan() {
        let mut g = [-1000.0, 1000.0, 0.0];
        silu_mul(&mut g, &[1.0, 1.0, 1.0]);
        assert_eq!(g, [-0.0, 1000.0, 0.0]);
    }
}
