//! Oracle tests of the K-quants and Q5_0: dequantisation against candle's (which follows
//! ggml), and every kernel against the exact value of the product it computes.

use candle_core::quantized::k_quants::{
    self, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ5_0, BlockQ6K, GgmlType,
};

use super::dot::tests::{kernels, random_blocks};
use super::dot::DotKernel;
use super::format::QuantType;
use super::kformat::{dot_portable_k, KFormat, QK_K};
use super::matmul::tests::k_shapes;
use super::matmul::{matmul, matmul_with};
use super::q8_k::{quantize_q8_k, BlockQ8K};
use super::{q2_k::Q2K, q3_k::Q3K, q4_k::Q4K, q5_k::Q5K, q6_k::Q6K};
use crate::test_util::{random_vec, rng};

/// `w` as candle's blocks of `T`.
fn candle_blocks<T: GgmlType>(w: &[u8]) -> Vec<T> {
    let n = w.len() / std::mem::size_of::<T>();
    assert_eq!(n * std::mem::size_of::<T>(), w.len());
    let mut blocks = vec![T::zeros(); n];
    // SAFETY: candle's blocks are #[repr(C)] structs of f16/u8/i8 in the ggml layout (sizes
    // asserted above); any bit pattern is a valid f16 / u8 / i8.
    unsafe { std::ptr::copy_nonoverlapping(w.as_ptr(), blocks.as_mut_ptr() as *mut u8, w.len()) };
    blocks
}

/// candle's dequantisation of `w` as `ty`.
pub(crate) fn candle_dequantize(ty: QuantType, w: &[u8]) -> Vec<f32> {
    fn to_f32<T: GgmlType>(w: &[u8], n: usize) -> Vec<f32> {
        let mut out = vec![0.0; n];
        T::to_float(&candle_blocks::<T>(w), &mut out);
        out
    }
    let n = w.len() / ty.block_bytes() * ty.block_elems();
    match ty {
        QuantType::Q5_0 => to_f32::<BlockQ5_0>(w, n),
        QuantType::Q4_K => to_f32::<BlockQ4K>(w, n),
        QuantType::Q5_K => to_f32::<BlockQ5K>(w, n),
        QuantType::Q6_K => to_f32::<BlockQ6K>(w, n),
        QuantType::Q3_K => to_f32::<BlockQ3K>(w, n),
        QuantType::Q2_K => to_f32::<BlockQ2K>(w, n),
        QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0 => {
            unreachable!("covered by their own modules")
        }
    }
}

const NEW_TYPES: [QuantType; 6] = [
    QuantType::Q5_0,
    QuantType::Q4_K,
    QuantType::Q5_K,
    QuantType::Q6_K,
    QuantType::Q3_K,
    QuantType::Q2_K,
];

#[test]
fn dequantisation_matches_candle_bit_for_bit() {
    let mut r = rng(80);
    for ty in NEW_TYPES {
        let w = random_blocks(&mut r, ty, 7);
        let mut ours = vec![f32::NAN; 7 * ty.block_elems()];
        ty.dequantize(&w, &mut ours);
        let theirs = candle_dequantize(ty, &w);
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{ty:?} value {i}: ours {a}, candle {b}"
            );
        }
    }
}

/// Exact value (f64) of the weight · Q8_K product the kernels compute.
fn dequantised_dot_k(ty: QuantType, w: &[u8], x: &[BlockQ8K]) -> f64 {
    let mut wf = vec![0.0; w.len() / ty.block_bytes() * QK_K];
    ty.dequantize(w, &mut wf);
    let xf = x
        .iter()
        .flat_map(|b| b.qs.iter().map(move |q| b.d as f64 * *q as f64));
    wf.iter().zip(xf).map(|(a, b)| *a as f64 * b).sum()
}

fn portable_k(ty: QuantType, w: &[u8], x: &[BlockQ8K]) -> f32 {
    match ty {
        QuantType::Q4_K => dot_portable_k::<Q4K>(w, x),
        QuantType::Q5_K => dot_portable_k::<Q5K>(w, x),
        QuantType::Q6_K => dot_portable_k::<Q6K>(w, x),
        QuantType::Q3_K => dot_portable_k::<Q3K>(w, x),
        QuantType::Q2_K => dot_portable_k::<Q2K>(w, x),
        _ => panic!("{ty:?} is not a K-quant"),
    }
}

/// Tolerance of a float sum of `nb` super-block terms of magnitude up to `scale`.
fn tol(want: f64, nb: usize) -> f64 {
    1e-5 * (1.0 + want.abs()) + 2e-5 * nb as f64
}

#[test]
fn portable_dot_matches_the_dequantised_dot() {
    let mut r = rng(81);
    for ty in QuantType::K_QUANTS {
        for nb in [1, 2, 3, 4, 5, 9] {
            let w = random_blocks(&mut r, ty, nb);
            let x = random_vec(&mut r, nb * QK_K, 3.0);
            let mut q = vec![BlockQ8K::default(); nb];
            quantize_q8_k(&x, &mut q);
            let want = dequantised_dot_k(ty, &w, &q);
            let got = portable_k(ty, &w, &q) as f64;
            assert!(
                (got - want).abs() <= tol(want, nb),
                "{ty:?} nb {nb}: {got} vs {want}"
            );
        }
    }
}

/// The extremes of every field: all-ones quants, the largest scales and minimums, -128
/// activations (the i16 pair sums and i32 sums of the SIMD path must not saturate).
#[test]
fn extreme_blocks_do_not_saturate() {
    for ty in QuantType::K_QUANTS {
        let mut w = vec![0xFFu8; ty.block_bytes()];
        let one = half::f16::from_f32(1.0).to_le_bytes();
        let (d_at, dmin_at) = ty.f16_fields();
        w[d_at..d_at + 2].copy_from_slice(&one);
        if let Some(at) = dmin_at {
            w[at..at + 2].copy_from_slice(&one);
        }
        if ty == QuantType::Q6_K {
            // The most negative scale (-128): the largest product magnitude.
            w[192..208].fill(0x80);
        }
        for sign in [-1.0f32, 1.0] {
            let x = vec![sign; QK_K];
            let mut q = [BlockQ8K::default()];
            quantize_q8_k(&x, &mut q);
            let want = dequantised_dot_k(ty, &w, &q);
            for m in [1, 5] {
                let xs = x.repeat(m);
                for k in kernels() {
                    let mut out = vec![0.0; m];
                    matmul_with(k, ty, &xs, &w, m, QK_K, 1, &mut out);
                    for v in out {
                        assert!(
                            (v as f64 - want).abs() <= 1e-5 * want.abs() + 1e-3,
                            "{ty:?} {k:?} x = {sign}: {v} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

struct Case {
    x: Vec<f32>,
    w: Vec<u8>,
}

fn case(seed: u64, ty: QuantType, m: usize, k: usize, n: usize) -> Case {
    let mut r = rng(seed);
    let x = random_vec(&mut r, m * k, 2.0);
    let w = random_blocks(&mut r, ty, n * k / QK_K);
    Case { x, w }
}

#[test]
fn matches_exact_q8_k_reference_for_every_kernel_and_format() {
    for ty in QuantType::K_QUANTS {
        for (seed, (m, k, n)) in k_shapes().into_iter().enumerate() {
            let c = case(500 + seed as u64, ty, m, k, n);
            let nb = k / QK_K;
            let rb = ty.row_bytes(k);
            let mut xq = vec![BlockQ8K::default(); m * nb];
            quantize_q8_k(&c.x, &mut xq);
            let want: Vec<f64> = (0..m * n)
                .map(|o| {
                    let (i, j) = (o / n, o % n);
                    dequantised_dot_k(ty, &c.w[j * rb..(j + 1) * rb], &xq[i * nb..(i + 1) * nb])
                })
                .collect();
            for kernel in kernels() {
                let mut out = vec![f32::NAN; m * n];
                matmul_with(kernel, ty, &c.x, &c.w, m, k, n, &mut out);
                for (o, (got, want)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (*got as f64 - want).abs() <= tol(*want, nb),
                        "{kernel:?} {ty:?} ({m},{k},{n}) [{}, {}]: {got} vs {want}",
                        o / n,
                        o % n
                    );
                }
            }
        }
    }
}

/// Against the dequantise-then-f32 product the only error is Q8_K rounding of x: at most
/// half a step (`amax / 127 / 2`) per activation.
#[test]
fn matches_f32_reference_within_the_q8_k_rounding_bound() {
    for ty in QuantType::K_QUANTS {
        for (seed, (m, k, n)) in k_shapes().into_iter().enumerate().take(12) {
            let c = case(600 + seed as u64, ty, m, k, n);
            let mut wf = vec![0.0; n * k];
            ty.dequantize(&c.w, &mut wf);
            let mut out = vec![0.0; m * n];
            matmul(ty, &c.x, &c.w, m, k, n, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let (xr, wr) = (&c.x[i * k..(i + 1) * k], &wf[j * k..(j + 1) * k]);
                    let want: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let bound: f64 = xr
                        .chunks(QK_K)
                        .zip(wr.chunks(QK_K))
                        .map(|(xb, wb)| {
                            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                            amax as f64 / 254.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                        })
                        .sum();
                    let got = out[i * n + j] as f64;
                    assert!(
                        (got - want).abs() <= bound * 1.01 + 1e-4,
                        "{ty:?} ({m},{k},{n}) [{i},{j}]: {got} vs {want}, bound {bound}"
                    );
                }
            }
        }
    }
}

/// candle's `k_quants::matmul` (ggml's K-quant dot products, on its own Q8_K) on the same
/// bytes: the same quantisation of x, so only float summation order differs.
#[test]
fn agrees_with_candle() {
    fn theirs<T: GgmlType>(m: usize, k: usize, n: usize, x: &[f32], w: &[u8]) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        k_quants::matmul((m, k, n), x, &candle_blocks::<T>(w), &mut out).unwrap();
        out
    }
    for ty in QuantType::K_QUANTS {
        for (seed, (m, k, n)) in k_shapes().into_iter().enumerate().take(10) {
            let c = case(700 + seed as u64, ty, m, k, n);
            let cand = match ty {
                QuantType::Q4_K => theirs::<BlockQ4K>(m, k, n, &c.x, &c.w),
                QuantType::Q5_K => theirs::<BlockQ5K>(m, k, n, &c.x, &c.w),
                QuantType::Q6_K => theirs::<BlockQ6K>(m, k, n, &c.x, &c.w),
                QuantType::Q3_K => theirs::<BlockQ3K>(m, k, n, &c.x, &c.w),
                QuantType::Q2_K => theirs::<BlockQ2K>(m, k, n, &c.x, &c.w),
                _ => unreachable!(),
            };
            let mut ours = vec![0.0; m * n];
            matmul(ty, &c.x, &c.w, m, k, n, &mut ours);
            let scale = ours.iter().chain(&cand).fold(1.0f32, |a, v| a.max(v.abs()));
            for (idx, (a, b)) in ours.iter().zip(&cand).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * scale,
                    "{ty:?} ({m},{k},{n}) [{idx}]: ours {a}, candle {b}"
                );
            }
        }
    }
}

/// The SIMD unpacking gives the portable one's values.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_unpack_matches_the_portable_one() {
    use super::kformat::KBlock;
    use std::arch::x86_64::*;
    fn check<K: KFormat>(w: &[u8]) {
        let mut want = KBlock::default();
        K::unpack(w, &mut want);
        // SAFETY: AVX2 and F16C checked by the caller; w is one whole block.
        let got = unsafe { K::unpack_avx2(w.as_ptr()) };
        let mut q = [0u8; QK_K];
        let mut sc = [0i16; 16];
        let mut mn = [0i16; 16];
        // SAFETY: stores into arrays of the vectors' sizes.
        unsafe {
            for (c, v) in got.q.iter().enumerate() {
                _mm256_storeu_si256(q.as_mut_ptr().add(32 * c) as *mut __m256i, *v);
            }
            _mm256_storeu_si256(sc.as_mut_ptr() as *mut __m256i, got.sc);
            _mm256_storeu_si256(mn.as_mut_ptr() as *mut __m256i, got.mn);
        }
        assert_eq!(q, want.q);
        assert_eq!((sc, mn), (want.sc, want.mn));
        assert_eq!((got.d, got.dmin), (want.d, want.dmin));
    }
    if !DotKernel::Avx2.is_supported() {
        return;
    }
    let mut r = rng(82);
    for _ in 0..20 {
        check::<Q4K>(&random_blocks(&mut r, QuantType::Q4_K, 1));
        check::<Q5K>(&random_blocks(&mut r, QuantType::Q5_K, 1));
        check::<Q6K>(&random_blocks(&mut r, QuantType::Q6_K, 1));
        check::<Q3K>(&random_blocks(&mut r, QuantType::Q3_K, 1));
        check::<Q2K>(&random_blocks(&mut r, QuantType::Q2_K, 1));
    }
}

/// The packed scale decoding of Q4_K and Q5_K (the SIMD unpacks use it) gives every
/// sub-block's scale and minimum as the one-at-a-time reference, for any 12 bytes.
#[test]
fn packed_k4_scales_match_the_reference() {
    use super::kformat::{scale_min_k4, scales_mins_k4_packed};
    use rand::Rng;
    let mut r = rng(81);
    for _ in 0..2000 {
        let s: [u8; 12] = std::array::from_fn(|_| r.random());
        let (sc, mn) = scales_mins_k4_packed(&s);
        for j in 0..8 {
            let got = ((sc >> (8 * j)) as u8, (mn >> (8 * j)) as u8);
            assert_eq!(got, scale_min_k4(j, &s), "sub-block {j} of {s:?}");
        }
    }
}
