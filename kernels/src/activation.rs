//! The gated activations of transformer FFNs, in place on the gate: SwiGLU
//! `silu(gate) * up` (llama, ggml `ggml_swiglu_split`) and GeGLU `gelu(gate) * up` with the
//! tanh approximation of GELU (Gemma, ggml `ggml_geglu_split`, PyTorch `gelu_pytorch_tanh`).
//!
//! Both are `g / (1 + e^-a(g)) * u`: `a(g) = g` for SiLU, and for GELU
//! `a(g) = 2·sqrt(2/π)·(g + 0.044715·g³)`, since `0.5·(1 + tanh(z)) = 1 / (1 + e^-2z)`. So one
//! loop, and on AVX2 one 8-wide exponential, serves both.

use rayon::prelude::*;

/// The activation applied to the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    Silu,
    GeluTanh,
}

/// `sqrt(2/π)`, the GELU tanh approximation's constant.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic term's coefficient of the GELU tanh approximation.
const GELU_CUBIC: f32 = 0.044_715;

impl Gate {
    /// The exponent argument `a(g)` of `g / (1 + e^-a(g))`.
    #[inline(always)]
    fn arg(self, g: f32) -> f32 {
        match self {
            Self::Silu => g,
            Self::GeluTanh => 2.0 * SQRT_2_OVER_PI * (g + GELU_CUBIC * g * g * g),
        }
    }
}

/// In place: `gate[i] = silu(gate[i]) * up[i]` where `silu(x) = x / (1 + e^-x)`.
///
/// On AVX2 every value goes through the same 8-wide exponential (`crate::vexp`), the last
/// partial group padded, so a value's result does not depend on where it falls in the slice
/// (the batch it is in); elsewhere libm's `exp`.
///
/// # Panics
/// If the slices differ in length.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    gated(Gate::Silu, gate, up, "silu_mul");
}

/// In place: `gate[i] = gelu(gate[i]) * up[i]` with GELU's tanh approximation,
/// `gelu(x) = 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))`. Same evaluation as
/// [`silu_mul`], so equally independent of a value's place in the slice.
///
/// # Panics
/// If the slices differ in length.
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    gated(Gate::GeluTanh, gate, up, "gelu_mul");
}

fn gated(kind: Gate, gate: &mut [f32], up: &[f32], name: &str) {
    assert_eq!(gate.len(), up.len(), "{name}: gate and up differ in length");
    let avx2 = crate::cpu::avx2();
    let run = |(g, u): (&mut [f32], &[f32])| {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: AVX2 and FMA were detected on this CPU.
            unsafe { avx2::gated(kind, g, u) };
            return;
        }
        let _ = avx2;
        for (g, u) in g.iter_mut().zip(u) {
            *g = *g / (1.0 + (-kind.arg(*g)).exp()) * u;
        }
    };
    // Chunks are whole groups of eight, so only the slice's own tail is ever padded.
    const CHUNK: usize = 4096;
    if gate.len() >= crate::PAR_MIN_ELEMS {
        gate.par_chunks_mut(CHUNK)
            .zip(up.par_chunks(CHUNK))
            .for_each(run);
    } else {
        run((gate, up));
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Gate, GELU_CUBIC, SQRT_2_OVER_PI};
    use crate::vexp::exp;

    /// [`super::gated`] eight values at a time.
    ///
    /// # Safety
    /// AVX2 and FMA available; `gate` and `up` have the same length.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gated(kind: Gate, gate: &mut [f32], up: &[f32]) {
        let mut g8 = gate.chunks_exact_mut(8);
        let mut u8 = up.chunks_exact(8);
        for (g, u) in (&mut g8).zip(&mut u8) {
            // SAFETY: eight values each.
            unsafe { gate8(kind, g.as_mut_ptr(), u.as_ptr()) };
        }
        let (g, u) = (g8.into_remainder(), u8.remainder());
        if !g.is_empty() {
            let (mut gp, mut up) = ([0.0f32; 8], [0.0f32; 8]);
            gp[..g.len()].copy_from_slice(g);
            up[..u.len()].copy_from_slice(u);
            // SAFETY: eight values each.
            unsafe { gate8(kind, gp.as_mut_ptr(), up.as_ptr()) };
            let n = g.len();
            g.copy_from_slice(&gp[..n]);
        }
    }

    /// `g[i] = g[i] / (1 + e^-a(g[i])) * u[i]` for eight values.
    ///
    /// # Safety
    /// AVX2 and FMA available; eight values readable at `u` and writable at `g`.
    #[inline(always)]
    unsafe fn gate8(kind: Gate, g: *mut f32, u: *const f32) {
        // SAFETY: by the caller's contract.
        unsafe {
            let x = _mm256_loadu_ps(g);
            let a = match kind {
                Gate::Silu => x,
                Gate::GeluTanh => {
                    let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
                    let inner = _mm256_fmadd_ps(_mm256_set1_ps(GELU_CUBIC), x3, x);
                    _mm256_mul_ps(_mm256_set1_ps(2.0 * SQRT_2_OVER_PI), inner)
                }
            };
            let e = exp(_mm256_sub_ps(_mm256_setzero_ps(), a));
            let s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(g, _mm256_mul_ps(s, _mm256_loadu_ps(u)));
        }
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
    fn a_value_does_not_depend_on_its_place_in_the_slice() {
        let mut r = rng(21);
        let g = random_vec(&mut r, 3 * 4096 + 13, 12.0);
        let u = random_vec(&mut r, g.len(), 2.0);
        let mut whole = g.clone();
        silu_mul(&mut whole, &u);
        for start in [0, 5, 4090, 3 * 4096 + 7] {
            let mut part = g[start..].to_vec();
            silu_mul(&mut part, &u[start..]);
            assert_eq!(part, whole[start..], "from {start}");
        }
    }

    /// GELU with the tanh approximation, in f64.
    fn gelu_tanh(x: f64) -> f64 {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    }

    #[test]
    fn gelu_matches_the_tanh_formula_on_random_lengths() {
        let mut r = rng(22);
        for n in [0, 1, 5, 2048, 16 * 2048 + 3] {
            let g = random_vec(&mut r, n, 8.0);
            let u = random_vec(&mut r, n, 2.0);
            let expected: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| (gelu_tanh(*g as f64) * *u as f64) as f32)
                .collect();
            let mut out = g.clone();
            gelu_mul(&mut out, &u);
            assert_close(&out, &expected, 1e-6, 1e-5);
        }
        // Known values of PyTorch's gelu(approximate="tanh").
        let mut g = [1.0f32, -1.0, 0.5];
        gelu_mul(&mut g, &[1.0; 3]);
        assert_close(&g, &[0.841_192, -0.158_808, 0.345_714], 1e-5, 0.0);
    }

    #[test]
    fn gelu_does_not_depend_on_a_values_place_and_saturates() {
        let mut r = rng(23);
        let g = random_vec(&mut r, 2 * 4096 + 11, 12.0);
        let u = random_vec(&mut r, g.len(), 2.0);
        let mut whole = g.clone();
        gelu_mul(&mut whole, &u);
        for start in [0, 3, 4093] {
            let mut part = g[start..].to_vec();
            gelu_mul(&mut part, &u[start..]);
            assert_eq!(part, whole[start..], "from {start}");
        }
        let mut g = [-1000.0, 1000.0, 0.0];
        gelu_mul(&mut g, &[1.0, 1.0, 1.0]);
        assert_eq!(g, [-0.0, 1000.0, 0.0]);
    }

    #[test]
    fn saturates_without_nan() {
        let mut g = [-1000.0, 1000.0, 0.0];
        silu_mul(&mut g, &[1.0, 1.0, 1.0]);
        assert_eq!(g, [-0.0, 1000.0, 0.0]);
    }
}
