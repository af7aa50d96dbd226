//! Kernel choice for the quantised matmul, and the portable block dot product that defines
//! every kernel's arithmetic (see [`super::format`]): block `b` feeds chain `b % 4` as
//! `acc = fma(Σ q·q8, d·d8, acc)` then `acc = fma(m, s8, acc)`, after ggml's
//! `ggml_vec_dot_q4_0_q8_0`, `_q4_1_q8_1` and `_q8_0_q8_0`.

use std::sync::OnceLock;

use super::format::{Format, CHAINS};
use super::q8_1::BlockQ8_1;
use crate::cpu;

/// The kernel [`DotKernel::select`] fixed for this process.
static SELECTED: OnceLock<DotKernel> = OnceLock::new();

/// Which implementation a matmul runs (chosen at run time, see [`DotKernel::detect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotKernel {
    /// Plain Rust, any CPU: one dot product per output.
    Portable,
    /// AVX2 + FMA + F16C (x86-64 only): one weight row at a time against up to four
    /// activation rows for decode and small batches (`dot_avx2`; for Q4_0, Q4_1 and Q5_0, eight
    /// weight rows at a time, `dot8_avx2`), the interleaved panel GEMM
    /// (`gemm_avx2`) for batches of [`super::matmul::PANEL_MIN_ROWS`] rows or more.
    Avx2,
    /// [`DotKernel::Avx2`] with AVX-VNNI's `vpdpbusd` (the multiply-add of four byte pairs
    /// into i32 in one instruction) in both paths.
    Avx2Vnni,
    /// The AVX2 row path for every batch size (no panel GEMM, to measure what it brings).
    Avx2Rows,
    /// AVX-512 VNNI: the 16-row panel GEMM with 512-bit `vpdpbusd` (`gemm_avx512`) for
    /// batches of [`super::matmul::PANEL16_MIN_ROWS`] rows or more; below, for Q4_0, Q4_1 and
    /// Q5_0 up to four rows sixteen weight rows at a time (`dot16_avx512`), otherwise the
    /// block-per-lane kernel (`dot_lanes_avx512`) for two rows or more and the 512-bit row
    /// kernel (`dot_avx512`, sixteen blocks per step) for one.
    Avx512Vnni,
    /// AMX: [`DotKernel::Avx512Vnni`], with batches of [`super::matmul::AMX_MIN_ROWS`] rows
    /// or more (prefill chunks) on AMX tile products (`gemm_amx`), 16 weight rows × 16
    /// activation rows of a block's integer sums per instruction.
    Amx,
}

impl DotKernel {
    /// Every kernel with its name (as `--cpu-kernel` spells it).
    pub const NAMED: [(&'static str, DotKernel); 6] = [
        ("amx", DotKernel::Amx),
        ("avx512-vnni", DotKernel::Avx512Vnni),
        ("avx2-vnni", DotKernel::Avx2Vnni),
        ("avx2", DotKernel::Avx2),
        ("avx2-rows", DotKernel::Avx2Rows),
        ("portable", DotKernel::Portable),
    ];

    /// The kernel called `name` (see [`DotKernel::NAMED`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMED
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()))
            .map(|(_, k)| *k)
    }

    /// This kernel's name.
    pub fn name(self) -> &'static str {
        Self::NAMED
            .iter()
            .find(|(_, k)| *k == self)
            .map_or("portable", |(n, _)| n)
    }

    /// Makes `self` the kernel of every later [`DotKernel::selected`] in this process (to
    /// compare kernels on one machine, or to rule one out). Call it before the first matmul.
    /// Fails when the CPU lacks it, or when another kernel is already fixed.
    pub fn select(self) -> Result<(), String> {
        if !self.is_supported() {
            return Err(format!(
                "CPU kernel `{}` needs instructions this CPU lacks (best here: `{}`)",
                self.name(),
                DotKernel::detect().name()
            ));
        }
        match *SELECTED.get_or_init(|| self) {
            k if k == self => Ok(()),
            k => Err(format!("CPU kernel `{}` was selected already", k.name())),
        }
    }

    /// The kernel of this process: the one [`DotKernel::select`] fixed, else the fastest one
    /// ([`DotKernel::detect`]), fixed by this first call (every matmul asks; detection runs once).
    pub fn selected() -> Self {
        *SELECTED.get_or_init(DotKernel::detect)
    }

    /// The fastest kernel this CPU supports (checked at run time).
    pub fn detect() -> Self {
        [
            DotKernel::Amx,
            DotKernel::Avx512Vnni,
            DotKernel::Avx2Vnni,
            DotKernel::Avx2,
        ]
        .into_iter()
        .find(|k| k.is_supported())
        .unwrap_or(DotKernel::Portable)
    }

    /// Whether this kernel can run on this CPU.
    pub fn is_supported(self) -> bool {
        match self {
            DotKernel::Portable => true,
            DotKernel::Avx2 | DotKernel::Avx2Rows => cpu::avx2(),
            DotKernel::Avx2Vnni => cpu::avx2() && cpu::avx_vnni(),
            DotKernel::Avx512Vnni => cpu::avx2() && cpu::avx512_vnni(),
            DotKernel::Amx => cpu::avx2() && cpu::avx512_vnni() && cpu::amx_int8(),
        }
    }

    /// Whether this kernel's row path (small batches) uses AVX-VNNI.
    pub(crate) fn rows_use_vnni(self) -> bool {
        match self {
            DotKernel::Avx2Vnni => true,
            DotKernel::Avx512Vnni | DotKernel::Amx => cpu::avx_vnni(),
            DotKernel::Portable | DotKernel::Avx2 | DotKernel::Avx2Rows => false,
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
    use crate::quant::format::{QuantType, Q4_0, Q4_1, Q5_0, Q8_0};
    use crate::quant::q4_1::QK;
    use crate::quant::q8_1::quantize_q8_1;
    use crate::test_util::{random_vec, rng};
    use rand::rngs::StdRng;
    use rand::Rng;

    /// `n_blocks` random blocks of `ty`: every q value occurs, scales like real weights.
    pub(crate) fn random_blocks(r: &mut StdRng, ty: QuantType, n_blocks: usize) -> Vec<u8> {
        let mut w = Vec::with_capacity(n_blocks * ty.block_bytes());
        let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
        for _ in 0..n_blocks {
            let d: f32 = r.random_range(0.001..0.05);
            let start = w.len();
            match ty {
                QuantType::Q4_0 => {
                    w.extend_from_slice(&f16(d));
                    w.extend((0..16).map(|_| r.random::<u8>()));
                }
                QuantType::Q4_1 => {
                    let m: f32 = -d * r.random_range(0.0..15.0);
                    w.extend_from_slice(&f16(d));
                    w.extend_from_slice(&f16(m));
                    w.extend((0..16).map(|_| r.random::<u8>()));
                }
                // Every byte, -128 included (ggml's quantiser never writes it; a file may).
                QuantType::Q8_0 => {
                    w.extend_from_slice(&f16(d));
                    w.extend((0..32).map(|_| r.random::<u8>()));
                }
                // Random bits for every quant, scale and high-bit byte; then sane f16 scales
                // where the format keeps them (d, and dmin as a fraction of it).
                _ => {
                    w.extend((0..ty.block_bytes()).map(|_| r.random::<u8>()));
                    let b = &mut w[start..];
                    let dmin: f32 = d * r.random_range(0.0..1.0);
                    let (d_at, dmin_at) = ty.f16_fields();
                    // The K-quants' scales multiply d by up to 63 (127 for Q6_K).
                    let d = if ty.is_k_quant() { d / 16.0 } else { d };
                    b[d_at..d_at + 2].copy_from_slice(&f16(d));
                    if let Some(at) = dmin_at {
                        b[at..at + 2].copy_from_slice(&f16(dmin / 16.0));
                    }
                }
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
            DotKernel::Avx512Vnni,
            DotKernel::Amx,
        ]
        .into_iter()
        .filter(|k| k.is_supported())
        .collect()
    }

    fn portable(ty: QuantType, w: &[u8], x: &[BlockQ8_1]) -> f32 {
        match ty {
            QuantType::Q4_0 => dot_portable::<Q4_0>(w, x),
            QuantType::Q4_1 => dot_portable::<Q4_1>(w, x),
            QuantType::Q5_0 => dot_portable::<Q5_0>(w, x),
            QuantType::Q8_0 => dot_portable::<Q8_0>(w, x),
            _ => panic!("{ty:?} is not multiplied against Q8_1"),
        }
    }

    #[test]
    fn portable_dot_matches_the_dequantised_dot() {
        let mut r = rng(60);
        for ty in QuantType::BLOCK32 {
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
        // Twenty blocks: one 16-block step of the AVX-512 row kernel and a tail.
        let nb = 20;
        let mut w = Vec::new();
        for _ in 0..nb {
            w.extend(half::f16::from_f32(1.0).to_le_bytes());
            w.extend([0x80u8; 32]);
        }
        let mut x = [BlockQ8_1::default()];
        quantize_q8_1(&[-1.0; QK], &mut x);
        for m in [1, 8] {
            let xs = vec![-1.0f32; m * QK * nb];
            for k in kernels() {
                let mut out = vec![0.0; m];
                crate::quant::matmul::matmul_with(
                    k,
                    QuantType::Q8_0,
                    &xs,
                    &w,
                    m,
                    QK * nb,
                    1,
                    &mut out,
                );
                // Exactly 128 · 32 per block up to float rounding; saturation would lose
                // hundreds.
                for v in out {
                    assert!((v - 4096.0 * nb as f32).abs() < 1e-1, "{k:?} m={m}: {v}");
                }
            }
        }
        let w = &w[..34];
        assert!((portable(QuantType::Q8_0, w, &x) - 4096.0).abs() < 1e-2);
    }

    #[test]
    fn detect_returns_a_supported_kernel() {
        assert!(DotKernel::detect().is_supported());
    }

    #[test]
    fn names_round_trip_and_selection_is_fixed_once() {
        for (name, k) in DotKernel::NAMED {
            assert_eq!(DotKernel::from_name(name), Some(k));
            assert_eq!(k.name(), name);
        }
        assert_eq!(DotKernel::from_name("nope"), None);
        // The process-wide choice (other tests in this binary see the same kernel either way).
        let best = DotKernel::detect();
        best.select().unwrap();
        best.select().unwrap();
        assert_eq!(DotKernel::selected(), best);
        if best != DotKernel::Portable {
            let e = DotKernel::Portable.select().unwrap_err();
            assert!(e.contains(best.name()), "{e}");
        }
        if let Some(missing) = DotKernel::NAMED
            .iter()
            .map(|(_, k)| *k)
            .find(|k| !k.is_supported())
        {
            let e = missing.select().unwrap_err();
            assert!(e.contains("lacks"), "{e}");
        }
    }

    #[test]
    #[should_panic(expected = "block count")]
    fn rejects_mismatched_rows() {
        let w = vec![0u8; 2 * 20];
        dot_portable::<Q4_1>(&w, &[BlockQ8_1::default()]);
    }
}
