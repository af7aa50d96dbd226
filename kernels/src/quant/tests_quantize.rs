//! The quantisers: bit-for-bit against candle's ports of the same ggml reference functions
//! where candle follows them (the 32-weight formats and Q3_K; its Q2_K, Q4_K, Q5_K and Q6_K
//! still use older versions of ggml's searches, so there ours must do about as well), the
//! round-trip error within each format's step, and the edge cases.

use candle_core::quantized::k_quants::{BlockQ2K, BlockQ4K, BlockQ5K};
use candle_core::quantized::k_quants::{
    BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, GgmlType,
};
use rand::rngs::StdRng;
use rand::Rng;

use super::format::QuantType;
use super::quantize_32::{dequantize_q5_1, quantize_q5_1, Q5_1_BLOCK_BYTES};
use crate::test_util::rng;

/// Weight-like rows: roughly normal values (sum of four uniforms), a few rows with outliers
/// of 20× the spread, and a few all-positive or all-negative rows.
fn weights(r: &mut StdRng, n: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n)
        .map(|_| (0..4).map(|_| r.random_range(-0.02f32..0.02)).sum())
        .collect();
    for chunk in x.chunks_mut(256) {
        match r.random_range(0..6) {
            0 => {
                let at = r.random_range(0..chunk.len());
                chunk[at] = r.random_range(-0.8f32..0.8);
            }
            1 => chunk.iter_mut().for_each(|v| *v = v.abs() + 0.01),
            2 => chunk.iter_mut().for_each(|v| *v = -v.abs()),
            _ => {}
        }
    }
    x
}

/// A quantiser of f32 values to block bytes.
type Quantiser = fn(&[f32]) -> Vec<u8>;
/// A quantise-then-dequantise of f32 values.
type RoundTrip = fn(&[f32]) -> Vec<f32>;

/// candle's quantisation of `x` into `T` blocks, as bytes.
fn candle_quantize<T: GgmlType>(x: &[f32]) -> Vec<u8> {
    let mut blocks = vec![T::zeros(); x.len() / T::BLCK_SIZE];
    T::from_float(x, &mut blocks);
    let bytes = std::mem::size_of_val(blocks.as_slice());
    // SAFETY: candle's blocks are #[repr(C)] plain-old-data in the ggml layout.
    unsafe { std::slice::from_raw_parts(blocks.as_ptr() as *const u8, bytes) }.to_vec()
}

fn ours(ty: QuantType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / ty.block_elems() * ty.block_bytes()];
    ty.quantize(x, &mut out);
    out
}

fn round_trip(ty: QuantType, x: &[f32]) -> Vec<f32> {
    let mut y = vec![f32::NAN; x.len()];
    ty.dequantize(&ours(ty, x), &mut y);
    y
}

#[test]
fn matches_candle_bit_for_bit_where_it_follows_the_same_reference() {
    let mut r = rng(31);
    let x = weights(&mut r, 64 * 256);
    let cases: [(QuantType, Quantiser); 5] = [
        (QuantType::Q4_0, candle_quantize::<BlockQ4_0>),
        (QuantType::Q4_1, candle_quantize::<BlockQ4_1>),
        (QuantType::Q5_0, candle_quantize::<BlockQ5_0>),
        (QuantType::Q8_0, candle_quantize::<BlockQ8_0>),
        (QuantType::Q3_K, candle_quantize::<BlockQ3K>),
    ];
    for (ty, theirs) in cases {
        let (a, b) = (ours(ty, &x), theirs(&x));
        let bb = ty.block_bytes();
        if let Some(i) =
            (0..a.len() / bb).find(|&i| a[i * bb..(i + 1) * bb] != b[i * bb..(i + 1) * bb])
        {
            panic!("{ty:?}: block {i} differs from candle's");
        }
    }
    let mut q51 = vec![0u8; x.len() / 32 * Q5_1_BLOCK_BYTES];
    quantize_q5_1(&x, &mut q51);
    assert!(
        q51 == candle_quantize::<BlockQ5_1>(&x),
        "Q5_1 differs from candle's"
    );
}

/// Sum of squared errors of `y` against `x`.
fn sse(x: &[f32], y: &[f32]) -> f64 {
    x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum()
}

#[test]
fn k_quants_do_at_least_as_well_as_the_older_search() {
    let mut r = rng(32);
    let x = weights(&mut r, 64 * 256);
    fn candle_round_trip<T: GgmlType>(x: &[f32]) -> Vec<f32> {
        let mut blocks = vec![T::zeros(); x.len() / T::BLCK_SIZE];
        T::from_float(x, &mut blocks);
        let mut y = vec![0.0; x.len()];
        T::to_float(&blocks, &mut y);
        y
    }
    let cases: [(QuantType, RoundTrip); 4] = [
        (QuantType::Q2_K, candle_round_trip::<BlockQ2K>),
        (QuantType::Q4_K, candle_round_trip::<BlockQ4K>),
        (QuantType::Q5_K, candle_round_trip::<BlockQ5K>),
        (QuantType::Q6_K, candle_round_trip::<BlockQ6K>),
    ];
    for (ty, theirs) in cases {
        let (e_ours, e_theirs) = (sse(&x, &round_trip(ty, &x)), sse(&x, &theirs(&x)));
        eprintln!("{ty:?}: squared error ours {e_ours:.4e}, candle's {e_theirs:.4e}");
        // ggml's current Q2_K search minimises the |x|-weighted absolute error, not the
        // squared one: measured 4% above the older search's squared error here (and equal to
        // ggml's own, see `matches_ggml_reference_quantisers`).
        let allowed = if ty == QuantType::Q2_K { 1.06 } else { 1.0 };
        assert!(
            e_ours <= e_theirs * allowed,
            "{ty:?}: squared error {e_ours:.4e} vs candle's {e_theirs:.4e}"
        );
    }
}

/// The worst error a type may make, as a multiple of its step: the range of a block's values
/// (a super-block's for the K-quants, whose sub-block scales are themselves quantised against
/// the largest one) over the number of levels, the minimum at most 0 for the formats with a
/// minimum. Returns (values per step, levels - 1, allowed error in steps).
fn step_bound(ty: QuantType) -> (usize, f32, f32) {
    match ty {
        // Rounding to nearest: half a step, plus the f16 rounding of the scale.
        QuantType::Q8_0 => (32, 254.0, 0.55),
        QuantType::Q4_1 => (32, 15.0, 0.55),
        // The level of the value of largest magnitude is −8 (−16), so a value of the
        // opposite sign as large is clamped to +7 (+15): a whole step.
        QuantType::Q4_0 => (32, 16.0, 1.01),
        QuantType::Q5_0 => (32, 32.0, 1.01),
        // The searches may clip a group's extremes to lower the error of the rest.
        QuantType::Q6_K => (256, 63.0, 1.0),
        QuantType::Q5_K => (256, 31.0, 1.0),
        QuantType::Q4_K => (256, 15.0, 1.0),
        QuantType::Q3_K => (256, 7.0, 1.0),
        QuantType::Q2_K => (256, 3.0, 1.0),
    }
}

#[test]
fn round_trip_errors_stay_within_the_step() {
    let mut r = rng(33);
    let x = weights(&mut r, 64 * 256);
    for ty in QuantType::ALL {
        let y = round_trip(ty, &x);
        let (group, levels, allowed) = step_bound(ty);
        let mut worst = 0.0f32;
        for (xg, yg) in x.chunks(group).zip(y.chunks(group)) {
            let (lo, hi) = xg
                .iter()
                .fold((0.0f32, 0.0f32), |(a, b), &v| (a.min(v), b.max(v)));
            let range = if ty.is_k_quant() && !matches!(ty, QuantType::Q6_K | QuantType::Q3_K) {
                hi - lo
            } else {
                2.0 * lo.abs().max(hi.abs())
            };
            let step = range / levels;
            for (a, b) in xg.iter().zip(yg) {
                assert!(b.is_finite(), "{ty:?}: non-finite value");
                worst = worst.max((a - b).abs() / step);
            }
        }
        eprintln!("{ty:?}: worst error {worst:.3} steps");
        assert!(worst <= allowed, "{ty:?}: error of {worst} steps");
    }
    let y = {
        let mut q = vec![0u8; x.len() / 32 * Q5_1_BLOCK_BYTES];
        quantize_q5_1(&x, &mut q);
        let mut y = vec![0.0; x.len()];
        dequantize_q5_1(&q, &mut y);
        y
    };
    for (xg, yg) in x.chunks(32).zip(y.chunks(32)) {
        let (lo, hi) = xg
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let step = (hi - lo) / 31.0;
        for (a, b) in xg.iter().zip(yg) {
            assert!(
                (a - b).abs() <= 0.6 * step + 1e-3 * lo.abs(),
                "Q5_1: {a} → {b}"
            );
        }
    }
}

#[test]
fn zeros_constants_and_tiny_values_are_exact_or_finite() {
    for ty in QuantType::ALL {
        let n = 2 * 256;
        assert!(
            round_trip(ty, &vec![0.0; n]).iter().all(|&v| v == 0.0),
            "{ty:?}: zeros"
        );
        for c in [0.25f32, -0.25] {
            let y = round_trip(ty, &vec![c; n]);
            for v in y {
                assert!(
                    (v - c).abs() <= 0.002,
                    "{ty:?}: constant {c} came back as {v}"
                );
            }
        }
        let tiny: Vec<f32> = (0..n).map(|i| (i as f32 - 200.0) * 1e-30).collect();
        assert!(
            round_trip(ty, &tiny)
                .iter()
                .all(|v| v.is_finite() && v.abs() < 1e-20),
            "{ty:?}: tiny"
        );
    }
}

#[test]
fn a_huge_outlier_is_kept_and_its_neighbours_stay_finite() {
    let mut r = rng(34);
    for ty in QuantType::ALL {
        let mut x = weights(&mut r, 256);
        x[77] = 500.0;
        let y = round_trip(ty, &x);
        assert!(y.iter().all(|v| v.is_finite()), "{ty:?}: non-finite");
        // The outlier sets the scale: it comes back within a step of its own group.
        let (group, levels, allowed) = step_bound(ty);
        let _ = group;
        let step = 2.0 * 500.0 / levels;
        assert!(
            (y[77] - 500.0).abs() <= allowed * step,
            "{ty:?}: outlier came back as {}",
            y[77]
        );
    }
}

/// Against ggml itself: `$TIDAL_GGML_QUANTIZE` names a program that reads f32 values on stdin
/// and writes `quantize_row_<type>_ref` of them on stdout, given the type (`q4_k`, ...) as its
/// argument (`scripts/ggml-oracle.c` around `ggml-quants.c`, built by `scripts/ggml-oracle.sh`;
/// `scripts/test.sh` sets it). Skipped without one. With `ggml-quants.c` of llama.cpp 0c1e570
/// built `-march=native -ffp-contract=off` every block of every type is identical; with GCC's
/// default contraction into FMAs a few K-quant
/// blocks differ (2 of 256 for Q4_K, 5 for Q6_K, 14 for Q2_K, the same squared error within
/// 0.2%), which is what the bounds allow.
#[test]
fn matches_ggml_reference_quantisers() {
    let Some(oracle) = std::env::var_os("TIDAL_GGML_QUANTIZE") else {
        crate::test_util::skip("TIDAL_GGML_QUANTIZE names no ggml quantiser to compare with");
        return;
    };
    let mut r = rng(35);
    let x = weights(&mut r, 256 * 256);
    let input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut report = Vec::new();
    let mut failed = Vec::new();
    for ty in QuantType::ALL {
        let name = format!("{ty:?}").to_lowercase();
        let mut child = std::process::Command::new(&oracle)
            .arg(&name)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run the ggml oracle");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(&input).unwrap();
        }
        let theirs = child.wait_with_output().unwrap().stdout;
        let mine = ours(ty, &x);
        assert_eq!(theirs.len(), mine.len(), "{ty:?}: oracle output length");
        let bb = ty.block_bytes();
        let differing = mine
            .chunks(bb)
            .zip(theirs.chunks(bb))
            .filter(|(a, b)| a != b)
            .count();
        let (mut a, mut b) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        ty.dequantize(&mine, &mut a);
        ty.dequantize(&theirs, &mut b);
        let (e_mine, e_theirs) = (sse(&x, &a), sse(&x, &b));
        report.push(format!(
            "{ty:?}: {differing} of {} blocks differ; squared error ours {e_mine:.5e}, ggml's {e_theirs:.5e}",
            mine.len() / bb
        ));
        if differing * 10 > mine.len() / bb || (e_mine / e_theirs - 1.0).abs() > 0.01 {
            failed.push(ty);
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failed.is_empty(), "differ from ggml: {failed:?}");
}
