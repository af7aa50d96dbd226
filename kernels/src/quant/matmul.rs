//! `out[m, n] = x[m, k] · Wᵀ` with W the raw GGUF Q4_1 bytes of n rows of k weights.
//!
//! As in ggml's `mul_mat`: the activations are quantised to Q8_1 once, then every output is an
//! integer block dot product. Decode (m = 1) splits the weight rows across rayon threads. For a
//! batch, each thread takes a run of weight rows and walks them once per tile of `M_TILE`
//! activation rows, four activation rows per weight-block unpack, so a weight row is read from
//! memory once per tile instead of once per activation row.

use rayon::prelude::*;

use super::dot::DotKernel;
use super::q4_1::{q4_1_row_bytes, QK};
use super::q8_1::{quantize_q8_1, BlockQ8_1};

/// Activation rows processed against one weight row before moving to the next: 64 rows of
/// k = 1536 quantised activations (~120 KiB) stay in L2.
const M_TILE: usize = 64;

/// Block products (m · n · k/32) below which the matmul stays on the calling thread.
const PAR_MIN_BLOCKS: usize = 2048;

/// Quantised matmul for the GGUF Q4_1 type: x [m, k] f32, w = raw GGUF bytes of n rows of k
/// values (ggml block layout: f16 d, f16 m, 16 bytes of nibbles per 32 values), out [m, n].
///
/// # Panics
/// If `k` is not a multiple of 32 or a slice length does not match the shape.
pub fn matmul_q4_1(x: &[f32], w: &[u8], m: usize, k: usize, n: usize, out: &mut [f32]) {
    matmul_q4_1_with(DotKernel::detect(), x, w, m, k, n, out);
}

/// [`matmul_q4_1`] with a chosen dot-product kernel (for tests and benchmarks).
///
/// # Panics
/// As [`matmul_q4_1`], and if `kernel` is not supported on this CPU.
pub fn matmul_q4_1_with(
    kernel: DotKernel,
    x: &[f32],
    w: &[u8],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) {
    let row_bytes = q4_1_row_bytes(k);
    assert_eq!(x.len(), m * k, "matmul_q4_1: x is not [m, k]");
    assert_eq!(
        w.len(),
        n * row_bytes,
        "matmul_q4_1: w is not n rows of k Q4_1 values"
    );
    assert_eq!(out.len(), m * n, "matmul_q4_1: out is not [m, n]");
    assert!(
        kernel.is_supported(),
        "matmul_q4_1: {kernel:?} is not supported on this CPU"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let nb = k / QK;
    let mut xq = vec![BlockQ8_1::default(); m * nb];
    if m * k >= crate::PAR_MIN_ELEMS {
        x.par_chunks(k)
            .zip(xq.par_chunks_mut(nb))
            .for_each(|(xr, qr)| quantize_q8_1(xr, qr));
    } else {
        quantize_q8_1(x, &mut xq);
    }
    let threads = rayon::current_num_threads();
    // Several chunks per thread so an unlucky (preempted) thread does not hold up the call;
    // below PAR_MIN_BLOCKS block products a thread wake-up costs more than it saves.
    let rows_per_task = if m * n * nb < PAR_MIN_BLOCKS {
        n
    } else {
        n.div_ceil(threads * 4).max(16)
    };
    if m == 1 {
        let task = |(c, o): (usize, &mut [f32])| {
            let first = c * rows_per_task;
            for (j, oj) in o.iter_mut().enumerate() {
                let wr = &w[(first + j) * row_bytes..(first + j + 1) * row_bytes];
                // SAFETY: kernel support asserted above.
                *oj = unsafe { kernel.dot_unchecked(wr, [&xq[..]]) }[0];
            }
        };
        if rows_per_task >= n {
            task((0, out));
        } else {
            out.par_chunks_mut(rows_per_task).enumerate().for_each(task);
        }
        return;
    }
    // Transposed result [n, m]: each task owns whole rows of it, then one transpose.
    let mut out_t = vec![0.0f32; n * m];
    let task = |(c, ot): (usize, &mut [f32])| {
        let first = c * rows_per_task;
        let rows = ot.len() / m;
        for i0 in (0..m).step_by(M_TILE) {
            let i1 = (i0 + M_TILE).min(m);
            for j in 0..rows {
                let wr = &w[(first + j) * row_bytes..(first + j + 1) * row_bytes];
                let o = &mut ot[j * m..(j + 1) * m];
                // SAFETY: kernel support asserted above.
                unsafe { dot_tile(kernel, wr, &xq, nb, i0..i1, o) };
            }
        }
    };
    if rows_per_task >= n {
        task((0, &mut out_t));
    } else {
        out_t
            .par_chunks_mut(rows_per_task * m)
            .enumerate()
            .for_each(task);
    }
    if m * n >= crate::PAR_MIN_ELEMS {
        out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
            for (j, v) in row.iter_mut().enumerate() {
                *v = out_t[j * m + i];
            }
        });
    } else {
        for (i, row) in out.chunks_mut(n).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = out_t[j * m + i];
            }
        }
    }
}

/// One weight row against activation rows `range`, four at a time; `o` is indexed by row.
///
/// # Safety
/// `kernel.is_supported()` must be true.
unsafe fn dot_tile(
    kernel: DotKernel,
    wr: &[u8],
    xq: &[BlockQ8_1],
    nb: usize,
    range: std::ops::Range<usize>,
    o: &mut [f32],
) {
    let row = |i: usize| &xq[i * nb..(i + 1) * nb];
    let mut i = range.start;
    while i + 4 <= range.end {
        // SAFETY: the caller guarantees kernel support.
        let r = unsafe { kernel.dot_unchecked(wr, [row(i), row(i + 1), row(i + 2), row(i + 3)]) };
        o[i..i + 4].copy_from_slice(&r);
        i += 4;
    }
    while i < range.end {
        // SAFETY: as above.
        o[i] = unsafe { kernel.dot_unchecked(wr, [row(i)]) }[0];
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dot::tests::{dequantised_dot, random_q4_1};
    use crate::quant::q4_1::dequantize_q4_1;
    use crate::test_util::{random_vec, rng};
    use rand::Rng;

    fn kernels() -> Vec<DotKernel> {
        [DotKernel::Portable, DotKernel::Avx2]
            .into_iter()
            .filter(|k| k.is_supported())
            .collect()
    }

    struct Case {
        x: Vec<f32>,
        w: Vec<u8>,
    }

    fn case(seed: u64, m: usize, k: usize, n: usize) -> Case {
        let mut r = rng(seed);
        let x = random_vec(&mut r, m * k, 2.0);
        let w = random_q4_1(&mut r, n * k / QK);
        Case { x, w }
    }

    fn shapes() -> Vec<(usize, usize, usize)> {
        let mut r = rng(70);
        let mut s = vec![
            (1, 576, 576),
            (16, 576, 1536),
            (3, 1536, 576),
            (1, 32, 1),
            (65, 64, 7),
            (130, 96, 33),
        ];
        for _ in 0..12 {
            s.push((
                r.random_range(1..40),
                QK * r.random_range(1..10),
                r.random_range(1..90),
            ));
        }
        s
    }

    #[test]
    fn matches_exact_q8_1_reference_for_every_kernel() {
        for (seed, (m, k, n)) in shapes().into_iter().enumerate() {
            let c = case(seed as u64, m, k, n);
            let nb = k / QK;
            let mut xq = vec![BlockQ8_1::default(); m * nb];
            quantize_q8_1(&c.x, &mut xq);
            for kernel in kernels() {
                let mut out = vec![f32::NAN; m * n];
                matmul_q4_1_with(kernel, &c.x, &c.w, m, k, n, &mut out);
                for i in 0..m {
                    for j in 0..n {
                        let want = dequantised_dot(
                            &c.w[j * nb * 20..(j + 1) * nb * 20],
                            &xq[i * nb..(i + 1) * nb],
                        );
                        let got = out[i * n + j] as f64;
                        let tol = 1e-5 * (1.0 + want.abs()) + 2e-5 * nb as f64;
                        assert!(
                            (got - want).abs() <= tol,
                            "{kernel:?} ({m},{k},{n}) [{i},{j}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// Against the dequantise-then-f32 product, the only error is Q8_1 rounding of x: at most
    /// half a step per activation, so |err| ≤ Σ_blocks d8/2 · Σ|w| (plus float slack).
    #[test]
    fn matches_f32_reference_within_the_q8_1_rounding_bound() {
        for (seed, (m, k, n)) in shapes().into_iter().enumerate() {
            let c = case(100 + seed as u64, m, k, n);
            let mut wf = vec![0.0; n * k];
            dequantize_q4_1(&c.w, &mut wf);
            let mut out = vec![0.0; m * n];
            matmul_q4_1(&c.x, &c.w, m, k, n, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let (xr, wr) = (&c.x[i * k..(i + 1) * k], &wf[j * k..(j + 1) * k]);
                    let want: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let bound: f64 = xr
                        .chunks(QK)
                        .zip(wr.chunks(QK))
                        .map(|(xb, wb)| {
                            let d8 = xb.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64 / 127.0;
                            d8 / 2.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                        })
                        .sum();
                    let got = out[i * n + j] as f64;
                    assert!(
                        (got - want).abs() <= bound * 1.01 + 1e-4,
                        "({m},{k},{n}) [{i},{j}]: {got} vs {want}, bound {bound}"
                    );
                }
            }
        }
    }

    /// candle's `k_quants::matmul::<BlockQ4_1>` on the same bytes. Candle stores Q8_1 scales as
    /// f16, so the two differ by f16 rounding on top of the Q8_1 bound. Candle's Q4_1 dot
    /// needs an even number of blocks, so only k multiple of 64 is compared.
    #[test]
    fn agrees_with_candle() {
        use candle_core::quantized::k_quants::{self, BlockQ4_1, GgmlType};
        assert_eq!(std::mem::size_of::<BlockQ4_1>(), 20);
        let even = shapes()
            .into_iter()
            .filter(|s| s.1 % 64 == 0)
            .collect::<Vec<_>>();
        assert!(even.len() >= 5);
        for (seed, (m, k, n)) in even.into_iter().enumerate() {
            let c = case(200 + seed as u64, m, k, n);
            let mut blocks = vec![BlockQ4_1::zeros(); n * k / QK];
            // SAFETY: BlockQ4_1 is #[repr(C)] {f16 d, f16 m, [u8; 16]} (20 bytes, asserted above),
            // the ggml layout of the bytes; any bit pattern is a valid f16 / u8.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    c.w.as_ptr(),
                    blocks.as_mut_ptr() as *mut u8,
                    c.w.len(),
                );
            }
            let mut theirs = vec![0.0; m * n];
            k_quants::matmul((m, k, n), &c.x, &blocks, &mut theirs).unwrap();
            let mut ours = vec![0.0; m * n];
            matmul_q4_1(&c.x, &c.w, m, k, n, &mut ours);
            let scale = ours
                .iter()
                .chain(&theirs)
                .fold(1.0f32, |a, v| a.max(v.abs()));
            for (idx, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-3 * scale,
                    "({m},{k},{n}) [{idx}]: ours {a}, candle {b}"
                );
            }
        }
    }

    #[test]
    fn zero_sizes_are_fine() {
        let mut out = vec![];
        matmul_q4_1(&[], &[], 0, 64, 0, &mut out);
        let mut out = vec![1.0; 2];
        matmul_q4_1(&[], &[], 2, 0, 1, &mut out);
        assert_eq!(out, vec![0.0; 2]);
    }

    #[test]
    #[should_panic(expected = "not n rows")]
    fn rejects_short_weights() {
        let mut out = vec![0.0; 2];
        matmul_q4_1(&[0.0; 32], &[0u8; 20], 1, 32, 2, &mut out);
    }
}
