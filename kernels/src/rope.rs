//! Rotary position embedding as in llama.cpp's `ggml_rope_ext` (no YaRN): `Normal` rotates
//! adjacent pairs `(2i, 2i+1)` (LLAMA_ROPE_TYPE_NORM: llama, SmolLM), `Neox` rotates pairs
//! `(i, i + d/2)` (LLAMA_ROPE_TYPE_NEOX: qwen2, GPT-NeoX). Pair `i` turns by
//! `pos / scaling_factor * theta^(-2i/d)` radians.

use rayon::prelude::*;

/// Which elements of a head form the rotated pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i + 1)`: llama.cpp `LLAMA_ROPE_TYPE_NORM`.
    Normal,
    /// Pairs `(i, i + head_dim / 2)`: llama.cpp `LLAMA_ROPE_TYPE_NEOX` (qwen2).
    Neox,
}

/// Rotary embedding of one model: per-pair inverse frequencies precomputed for `head_dim`.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    head_dim: usize,
    style: RopeStyle,
}

impl Rope {
    /// Precomputes `inv_freq[i] = theta^(-2i/head_dim) / scaling_factor` (linear scaling;
    /// pass 1.0 for none).
    ///
    /// # Panics
    /// If `head_dim` is zero or odd, or `theta`/`scaling_factor` are not positive and finite.
    pub fn new(head_dim: usize, theta: f32, scaling_factor: f32, style: RopeStyle) -> Self {
        assert!(
            head_dim > 0 && head_dim.is_multiple_of(2),
            "Rope: head_dim must be even and non-zero"
        );
        assert!(
            theta.is_finite() && theta > 0.0,
            "Rope: theta must be positive"
        );
        assert!(
            scaling_factor.is_finite() && scaling_factor > 0.0,
            "Rope: scaling_factor must be positive"
        );
        let inv_freq = (0..head_dim / 2)
            .map(|i| {
                let f = (theta as f64).powf(-2.0 * i as f64 / head_dim as f64);
                (f / scaling_factor as f64) as f32
            })
            .collect();
        Self {
            inv_freq,
            head_dim,
            style,
        }
    }

    /// `theta^(-2i/head_dim) / scaling_factor` for each pair `i` (what other backends upload).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Which elements form the rotated pairs.
    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// The head dimension this embedding was built for.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// x: `[n_tokens, n_heads, head_dim]`, rotated in place at each token's position.
    ///
    /// # Panics
    /// If `x.len() != positions.len() * n_heads * head_dim`.
    pub fn apply(&self, x: &mut [f32], positions: &[usize], n_heads: usize) {
        let d = self.head_dim;
        let row = n_heads * d;
        assert_eq!(
            x.len(),
            positions.len() * row,
            "Rope::apply: x is not [positions.len(), n_heads, head_dim]"
        );
        if row == 0 {
            return;
        }
        let token = |(xt, &pos): (&mut [f32], &usize)| {
            // One sin/cos table per token, shared by all its heads.
            let (mut sin, mut cos) = (Vec::with_capacity(d / 2), Vec::with_capacity(d / 2));
            for f in &self.inv_freq {
                let (s, c) = (pos as f32 * f).sin_cos();
                sin.push(s);
                cos.push(c);
            }
            for head in xt.chunks_exact_mut(d) {
                match self.style {
                    RopeStyle::Normal => {
                        for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                            let (a, b) = (pair[0], pair[1]);
                            pair[0] = a * cos[i] - b * sin[i];
                            pair[1] = a * sin[i] + b * cos[i];
                        }
                    }
                    RopeStyle::Neox => {
                        let (lo, hi) = head.split_at_mut(d / 2);
                        for i in 0..d / 2 {
                            let (a, b) = (lo[i], hi[i]);
                            lo[i] = a * cos[i] - b * sin[i];
                            hi[i] = a * sin[i] + b * cos[i];
                        }
                    }
                }
            }
        };
        if x.len() >= crate::PAR_MIN_ELEMS {
            x.par_chunks_mut(row)
                .zip(positions.par_iter())
                .for_each(token);
        } else {
            x.chunks_mut(row).zip(positions).for_each(token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close, random_vec, rng};
    use rand::Rng;

    /// Straight transcription of ggml's CPU rope loop (theta multiplied pair by pair), in f64.
    fn naive(
        x: &[f32],
        pos: &[usize],
        n_heads: usize,
        d: usize,
        base: f64,
        scale: f64,
        neox: bool,
    ) -> Vec<f32> {
        let mut out = x.to_vec();
        for (t, &p) in pos.iter().enumerate() {
            for h in 0..n_heads {
                let o = (t * n_heads + h) * d;
                let mut theta = p as f64 / scale;
                let theta_scale = base.powf(-2.0 / d as f64);
                for i in 0..d / 2 {
                    let (ia, ib) = if neox {
                        (i, i + d / 2)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (a, b) = (x[o + ia] as f64, x[o + ib] as f64);
                    out[o + ia] = (a * theta.cos() - b * theta.sin()) as f32;
                    out[o + ib] = (a * theta.sin() + b * theta.cos()) as f32;
                    theta *= theta_scale;
                }
            }
        }
        out
    }

    #[test]
    fn matches_ggml_reference_for_both_styles() {
        let mut r = rng(30);
        for &(n_tokens, n_heads, d) in &[(1, 1, 2), (3, 9, 64), (7, 3, 64), (2, 2, 6), (40, 9, 64)]
        {
            for (style, neox) in [(RopeStyle::Normal, false), (RopeStyle::Neox, true)] {
                for &(base, scale) in &[(10_000.0f32, 1.0f32), (100_000.0, 4.0)] {
                    let x = random_vec(&mut r, n_tokens * n_heads * d, 2.0);
                    let pos: Vec<usize> = (0..n_tokens).map(|_| r.random_range(0..4096)).collect();
                    let mut got = x.clone();
                    Rope::new(d, base, scale, style).apply(&mut got, &pos, n_heads);
                    let want = naive(&x, &pos, n_heads, d, base as f64, scale as f64, neox);
                    // f32 angles of positions up to 4096 carry ~1e-3 absolute error, as in ggml.
                    assert_close(&got, &want, 2e-3, 1e-3);
                }
            }
        }
    }

    #[test]
    fn position_zero_is_identity_and_norm_is_preserved() {
        let mut r = rng(31);
        let x = random_vec(&mut r, 2 * 4 * 8, 1.0);
        let mut y = x.clone();
        Rope::new(8, 10_000.0, 1.0, RopeStyle::Neox).apply(&mut y, &[0, 0], 4);
        assert_eq!(x, y);
        let mut z = x.clone();
        Rope::new(8, 10_000.0, 1.0, RopeStyle::Normal).apply(&mut z, &[5, 17], 4);
        for (a, b) in x.chunks(8).zip(z.chunks(8)) {
            let na: f32 = a.iter().map(|v| v * v).sum();
            let nb: f32 = b.iter().map(|v| v * v).sum();
            assert!((na - nb).abs() < 1e-4 * na.max(1.0));
        }
    }

    #[test]
    fn first_pair_turns_by_position_radians() {
        // Pair 0 has inverse frequency 1, so position p turns (1, 0) to (cos p, sin p).
        let mut x = [1.0, 0.0, 0.0, 0.0];
        Rope::new(4, 10_000.0, 1.0, RopeStyle::Normal).apply(&mut x, &[2], 1);
        assert_close(&x[..2], &[2f32.cos(), 2f32.sin()], 1e-6, 0.0);
        let mut y = [1.0, 0.0, 0.0, 0.0];
        Rope::new(4, 10_000.0, 2.0, RopeStyle::Neox).apply(&mut y, &[2], 1);
        assert_close(&[y[0], y[2]], &[1f32.cos(), 1f32.sin()], 1e-6, 0.0);
    }
}
