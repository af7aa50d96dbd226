//! Row dot products of quantised weights against Q8_1 activation rows, after ggml's
//! `ggml_vec_dot_q4_0_q8_0`, `_q4_1_q8_1` and `_q8_0_q8_0`: per block
//! `d · d8 · Σ q·q8 + m · s8` (see [`super::format`]). One weight row is dotted with up to
//! `R` activation rows at once, so each unpacked weight block serves all of them. These serve
//! decode (one activation row) and small batches; larger batches go through the panel GEMM
//! (`gemm_avx2`).

use super::format::{Format, QuantType, Q4_0, Q4_1, Q8_0};
use super::q8_1::BlockQ8_1;

/// Which implementation a matmul runs (chosen at run time, see [`DotKernel::detect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotKernel {
    /// Plain Rust, any CPU: row dot products for every batch size.
    Portable,
    /// AVX2 + FMA + F16C (x86-64 only): row dot products for small batches, the interleaved
    /// panel GEMM for batches of [`super::matmul::PANEL_MIN_ROWS`] rows or more.
    Avx2,
    /// [`DotKernel::Avx2`] with AVX-VNNI's `vpdpbusd` in the panel GEMM (one instruction for
    /// the multiply-add of four byte pairs into i32).
    Avx2Vnni,
    /// AVX2 row dot products for every batch size (the batched path before the panel GEMM,
    /// kept to measure what the GEMM brings).
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

    /// Dot products of one weight row `w` of type `ty` against `R` Q8_1 activation rows.
    ///
    /// # Panics
    /// If a row's block count differs from `w`'s, or this kernel is not supported here.
    pub fn dot<const R: usize>(self, ty: QuantType, w: &[u8], xs: [&[BlockQ8_1]; R]) -> [f32; R] {
        assert!(
            self.is_supported(),
            "{self:?} kernel is not supported on this CPU"
        );
        // SAFETY: support checked just above.
        unsafe {
            match ty {
                QuantType::Q4_0 => self.row_dots::<Q4_0, R>(w, xs),
                QuantType::Q4_1 => self.row_dots::<Q4_1, R>(w, xs),
                QuantType::Q8_0 => self.row_dots::<Q8_0, R>(w, xs),
            }
        }
    }

    /// [`DotKernel::dot`] for a format known at compile time, without the CPU-support check.
    ///
    /// # Safety
    /// `self.is_supported()` must be true.
    ///
    /// # Panics
    /// If a row's block count differs from `w`'s.
    #[inline]
    pub(crate) unsafe fn row_dots<F: Format, const R: usize>(
        self,
        w: &[u8],
        xs: [&[BlockQ8_1]; R],
    ) -> [f32; R] {
        let nb = w.len() / F::BLOCK_BYTES;
        assert_eq!(
            nb * F::BLOCK_BYTES,
            w.len(),
            "weight row is not whole blocks"
        );
        for x in &xs {
            assert_eq!(
                x.len(),
                nb,
                "activation and weight rows differ in block count"
            );
        }
        match self {
            DotKernel::Portable => dot_portable::<F, R>(w, xs),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the caller guarantees AVX2/FMA/F16C; lengths checked above.
            DotKernel::Avx2 | DotKernel::Avx2Vnni | DotKernel::Avx2Rows => unsafe {
                super::dot_avx2::row_dots::<F, R>(w, xs)
            },
            #[cfg(not(target_arch = "x86_64"))]
            DotKernel::Avx2 | DotKernel::Avx2Vnni | DotKernel::Avx2Rows => {
                unreachable!("AVX2 is never supported off x86-64")
            }
        }
    }
}

fn dot_portable<F: Format, const R: usize>(w: &[u8], xs: [&[BlockQ8_1]; R]) -> [f32; R] {
    let mut acc = [0.0f32; R];
    for (b, wb) in w.chunks_exact(F::BLOCK_BYTES).enumerate() {
        let (d, m) = F::scales(wb);
        for (r, x) in xs.iter().enumerate() {
            let xb = &x[b];
            acc[r] += d * xb.d * F::isum(wb, &xb.qs) as f32 + m * xb.s;
        }
    }
    acc
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
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

    #[test]
    fn every_kernel_and_format_matches_the_dequantised_dot() {
        let mut r = rng(60);
        for ty in QuantType::ALL {
            for nb in [1, 2, 3, 18, 48] {
                let w = random_blocks(&mut r, ty, nb);
                let rows: Vec<Vec<BlockQ8_1>> = (0..4)
                    .map(|_| {
                        let x = random_vec(&mut r, nb * QK, 3.0);
                        let mut q = vec![BlockQ8_1::default(); nb];
                        quantize_q8_1(&x, &mut q);
                        q
                    })
                    .collect();
                for k in kernels() {
                    let four = k.dot(ty, &w, [&rows[0], &rows[1], &rows[2], &rows[3]]);
                    for (i, row) in rows.iter().enumerate() {
                        let want = dequantised_dot(ty, &w, row);
                        let one = k.dot(ty, &w, [row.as_slice()])[0];
                        let tol = 1e-5 * (1.0 + want.abs()) + 1e-4 * nb as f64;
                        assert!(
                            (one as f64 - want).abs() <= tol,
                            "{k:?} {ty:?} nb {nb}: {one} vs {want}"
                        );
                        assert_eq!(one, four[i], "{k:?} {ty:?}: batched and single dot differ");
                    }
                }
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
        for k in kernels() {
            let got = k.dot(QuantType::Q8_0, &w, [&x[..]])[0];
            // Exactly 128 · 32 = 4096 up to float rounding; saturation would lose hundreds.
            assert!((got - 4096.0).abs() < 1e-2, "{k:?}: {got}");
        }
    }

    #[test]
    fn detect_returns_a_supported_kernel() {
        assert!(DotKernel::detect().is_supported());
    }

    #[test]
    #[should_panic(expected = "block count")]
    fn rejects_mismatched_rows() {
        let w = vec![0u8; 2 * 20];
        DotKernel::Portable.dot(QuantType::Q4_1, &w, [&[BlockQ8_1::default()][..]]);
    }
}
