//! Kernel choice for the quantised matmul, and the portable block dot product that defines
//! every kernel's arithmetic (see [`super::format`]): block `b` feeds chain `b % 4` as
//! `acc = fma(Σ q·q8, d·d8, acc)` then `acc = fma(m, s8, acc)`, after ggml's
//! `ggml_vec_dot_q4_0_q8_0`, `_q4_1_q8_1` and `_q8_0_q8_0`.

use super::format::{Format, CHAINS};
use super::q8_1::BlockQ8_1;

/// Which implementation a matmul runs (chosen at run time, see [`DotKernel::detect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotKernel {
    /// Plain Rust, any CPU: one dot product per output.
    Portable,
    /// AVX2 + FMA + F16C (x86-64 only): one weight row at a time against up to four
    /// activation rows for decode and small batches (`dot_avx2`), the interleaved panel GEMM
    /// (`gemm_avx2`) for batches of [`super::matmul::PANEL_MIN_ROWS`] rows or more.
    Avx2,
    /// [`DotKernel::Avx2`] with AVX-VNNI's `vpdpbusd` (the multiply-add of four byte pairs
    /// into i32 in one instruction) in both paths.
    Avx2Vnni,
    /// The AVX2 row path for every batch size (no panel GEMM, to measure what it brings).
    Avx2Rows,
}

impl DotKernel {
    /// The fastest kernel this CPU supports (checked at run time).
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                if is_x86_feature_detected!("avxvnni") {
                    return DotKernel::Avx2Vnni;
                }
                return DotKernel::Avx2;
            }
        }
        DotKernel::Portable
    }

    /// Whether this kernel can run on this CPU.
    pub fn is_supported(self) -> bool {
        let best = DotKernel::detect();
        match self {
            DotKernel::Portable => true,
            DotKernel::Avx2 | DotKernel::Avx2Rows => {
                matches!(best, DotKernel::Avx2 | DotKernel::Avx2Vnni)
            }
            DotKernel::Avx2Vnni => best == DotKernel::Avx2Vnni,
        }
    }
}

/// One weight row (whole blocks of `F`) against one activation row: the reference arithmetic.
///
/// # Panics
/// If the block counts differ.
pub(crate) fn dot_portable<F: Format>(w: &[u8], x: &[BlockQ8_1]) -> f32 {
    assert_eq!(
        w.len(),
        x.len() * F::BLOCK_BYTES,
        "activation and weight rows differ in block count"
    );
    let mut acc = [0.0f32; CHAINS];
    for (b, (wb, xb)) in w.chunks_exact(F::BLOCK_BYTES).zip(x).enumerate() {
        let (d, m) = F::scales(wb);
        let a = &mut acc[b % CHAINS];
        *a = (F::isum(wb, &xb.qs) as f32).mul_add(d * xb.d, *a);
        if F::HAS_OFFSET {
            *a = m.mul_add(xb.s, *a);
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::quant::format::{QuantType, Q4_0, Q4_1, Q8_0};
    use crate::quant::q4_1::QK;
    use crate::quant::q8_1::quantize_q8_1;
    use crate::test_util::{random_vec, rng};
    use rand::rngs::StdRng;
    use rand::Rng;

    /// `n_blocks` random blocks of `ty`: every q value occurs, scales like real weights.
    pub(crate) fn random_blocks(r: &mut StdRng, ty: QuantType, n_blocks: usize) -> Vec<u8> {
        let mut w = Vec::with_capacity(n_blocks * ty.block_bytes());
        for _ in 0..n_blocks {
            let d: f32 = r.random_range(0.001..0.05);
            w.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
            match ty {
                QuantType::Q4_0 => w.extend((0..16).map(|_| r.random::<u8>())),
                QuantType::Q4_1 => {
                    let m: f32 = -d * r.random_range(0.0..15.0);
                    w.extend_from_slice(&half::f16::from_f32(m).to_le_bytes());
                    w.extend((0..16).map(|_| r.random::<u8>()));
                }
                // Every byte, -128 included (ggml's quantiser never writes it; a file may).
                QuantType::Q8_0 => w.extend((0..32).map(|_| r.random::<u8>())),
            }
        }
        w
    }

    /// Exact value (f64) of the weight · Q8_1 product the kernels compute.
    pub(crate) fn dequantised_dot(ty: QuantType, w: &[u8], x: &[BlockQ8_1]) -> f64 {
        let mut wf = vec![0.0; w.len() / ty.block_bytes() * QK];
        ty.dequantize(w, &mut wf);
        let xf = x
            .iter()
            .flat_map(|b| b.qs.iter().map(move |q| b.d as f64 * *q as f64));
        wf.iter().zip(xf).map(|(a, b)| *a as f64 * b).sum()
    }

    /// Every kernel this CPU runs.
    pub(crate) fn kernels() -> Vec<DotKernel> {
        [
            DotKernel::Portable,
            DotKernel::Avx2,
            DotKernel::Avx2Vnni,
            DotKernel::Avx2Rows,
        ]
        .into_iter()
        .filter(|k| k.is_supported())
        .collect()
    }

    fn portable(ty: QuantType, w: &[u8], x: &[BlockQ8_1]) -> f32 {
        match ty {
            QuantType::Q4_0 => dot_portable::<Q4_0>(w, x),
            QuantType::Q4_1 => dot_portable::<Q4_1>(w, x),
            QuantType::Q8_0 => dot_portable::<Q8_0>(w, x),
        }
    }

    #[test]
    fn portable_dot_matches_the_dequantised_dot() {
        let mut r = rng(60);
        for ty in QuantType::ALL {
            for nb in [1, 2, 3, 18, 48] {
                let w = random_blocks(&mut r, ty, nb);
                let x = random_vec(&mut r, nb * QK, 3.0);
                let mut q = vec![BlockQ8_1::default(); nb];
                quantize_q8_1(&x, &mut q);
                let want = dequantised_dot(ty, &w, &q);
                let got = portable(ty, &w, &q);
                let tol = 1e-5 * (1.0 + want.abs()) + 1e-4 * nb as f64;
                assert!(
                    (got as f64 - want).abs() <= tol,
                    "{ty:?} nb {nb}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn extreme_q8_0_values_do_not_saturate() {
        // -128 weights against ±127 activations: the largest pair sums maddubs can see.
        let mut w = half::f16::from_f32(1.0).to_le_bytes().to_vec();
        w.extend([0x80u8; 32]);
        let mut x = [BlockQ8_1::default()];
        quantize_q8_1(&[-1.0; QK], &mut x);
        for m in [1, 8] {
            let xs = vec![-1.0f32; m * QK];
            for k in kernels() {
                let mut out = vec![0.0; m];
                crate::quant::matmul::matmul_with(k, QuantType::Q8_0, &xs, &w, m, QK, 1, &mut out);
                // Exactly 128 · 32 = 4096 up to float rounding; saturation would lose hundreds.
                for v in out {
                    assert!((v - 4096.0).abs() < 1e-2, "{k:?} m={m}: {v}");
                }
            }
        }
        assert!((portable(QuantType::Q8_0, &w, &x) - 4096.0).abs() < 1e-2);
    }

    #[test]
    fn detect_returns_a_supported_kernel() {
        assert!(DotKernel::detect().is_supported());
    }

    #[test]
    #[should_panic(expected = "block count")]
    fn rejects_mismatched_rows() {
        let w = vec![0u8; 2 * 20];
        dot_portable::<Q4_1>(&w, &[BlockQ8_1::default()]);
    }
}
