//! `out[m, n] = x[m, k] · Wᵀ` with W the raw GGUF bytes of n rows of k weights in Q4_0, Q4_1
//! or Q8_0.
//!
//! As in ggml's `mul_mat`: the activations are quantised to Q8_1 once
//! ([`QuantizedActivations`], which callers may share between matmuls of the same input), then
//! every output is an integer block dot product. Decode (m = 1) splits the weight rows across
//! rayon threads and runs the row dot products ([`super::dot`]). A batch of
//! [`PANEL_MIN_ROWS`] rows or more, on AVX2 (with AVX-VNNI where present), interleaves the
//! activations into 8-row panels once and runs the panel GEMM (`gemm_avx2`, after
//! llama.cpp's repacked GEMMs), which
//! unpacks each weight block once per 16 activation rows and shares the scale work of eight.
//! Each task owns a run of weight rows, i.e. a range of output columns, and writes its results
//! straight into `[m, n]`.

use std::sync::OnceLock;

use rayon::prelude::*;

use super::dot::DotKernel;
use super::format::{Format, QuantType, Q4_0, Q4_1, Q8_0};
use super::panel::{build_panels, PanelBlock};
use super::q4_1::QK;
use super::q8_1::{quantize_q8_1, BlockQ8_1};

/// Smallest batch that takes the panel GEMM on AVX2: below it, a panel's eight lanes would be
/// mostly empty and the row dot products (four rows per weight unpack) do as well.
pub const PANEL_MIN_ROWS: usize = 6;

/// Activation rows processed against one weight row before moving to the next (row dot
/// products): 64 rows of k = 1536 quantised activations (~120 KiB) stay in L2.
const M_TILE: usize = 64;

/// Block products (m · n · k/32) below which the matmul stays on the calling thread.
const PAR_MIN_BLOCKS: usize = 2048;

/// `m` activation rows of `k` values quantised to Q8_1 (and, when a batched matmul asks for
/// them, interleaved into panels), for one or more matmuls with the same input.
#[derive(Debug)]
pub struct QuantizedActivations {
    m: usize,
    k: usize,
    blocks: Vec<BlockQ8_1>,
    panels: OnceLock<Vec<PanelBlock>>,
}

impl QuantizedActivations {
    /// Quantises `x` (`m` rows of `k` values).
    ///
    /// # Panics
    /// If `k` is not a multiple of 32 or `x` is not `m * k` values.
    pub fn new(x: &[f32], m: usize, k: usize) -> Self {
        assert!(
            k.is_multiple_of(QK),
            "quantised matmul: k = {k} is not a multiple of {QK}"
        );
        assert_eq!(x.len(), m * k, "quantised matmul: x is not [m, k]");
        let nb = k / QK;
        let mut blocks = vec![BlockQ8_1::default(); m * nb];
        if nb > 0 {
            if m * k >= crate::PAR_MIN_ELEMS {
                x.par_chunks(k)
                    .zip(blocks.par_chunks_mut(nb))
                    .for_each(|(xr, qr)| quantize_q8_1(xr, qr));
            } else {
                quantize_q8_1(x, &mut blocks);
            }
        }
        Self {
            m,
            k,
            blocks,
            panels: OnceLock::new(),
        }
    }

    /// Rows (`m`).
    pub fn rows(&self) -> usize {
        self.m
    }

    /// Values per row (`k`).
    pub fn cols(&self) -> usize {
        self.k
    }

    fn row(&self, i: usize) -> &[BlockQ8_1] {
        let nb = self.k / QK;
        &self.blocks[i * nb..(i + 1) * nb]
    }

    fn panels(&self) -> &[PanelBlock] {
        self.panels
            .get_or_init(|| build_panels(&self.blocks, self.m, self.k / QK))
    }
}

/// Quantised matmul: x `[m, k]` f32, w = raw GGUF bytes of `n` rows of `k` values of type
/// `ty`, out `[m, n]`. Uses the fastest kernel of this CPU.
///
/// # Panics
/// If `k` is not a multiple of 32 or a slice length does not match the shape.
pub fn matmul(ty: QuantType, x: &[f32], w: &[u8], m: usize, k: usize, n: usize, out: &mut [f32]) {
    matmul_with(DotKernel::detect(), ty, x, w, m, k, n, out);
}

/// [`matmul`] with a chosen kernel (for tests and benchmarks).
///
/// # Panics
/// As [`matmul`], and if `kernel` is not supported on this CPU.
#[allow(clippy::too_many_arguments)]
pub fn matmul_with(
    kernel: DotKernel,
    ty: QuantType,
    x: &[f32],
    w: &[u8],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) {
    let xq = QuantizedActivations::new(x, m, k);
    matmul_quantized(kernel, ty, &xq, w, n, out);
}

/// [`matmul`] on activations quantised beforehand: `out [m, n] = xq · Wᵀ`.
///
/// # Panics
/// If `w` is not `n` rows of `xq.cols()` values of `ty`, `out` is not `[m, n]`, or `kernel` is
/// not supported on this CPU.
pub fn matmul_quantized(
    kernel: DotKernel,
    ty: QuantType,
    xq: &QuantizedActivations,
    w: &[u8],
    n: usize,
    out: &mut [f32],
) {
    match ty {
        QuantType::Q4_0 => run::<Q4_0>(kernel, ty, xq, w, n, out),
        QuantType::Q4_1 => run::<Q4_1>(kernel, ty, xq, w, n, out),
        QuantType::Q8_0 => run::<Q8_0>(kernel, ty, xq, w, n, out),
    }
}

fn run<F: Format>(
    kernel: DotKernel,
    ty: QuantType,
    xq: &QuantizedActivations,
    w: &[u8],
    n: usize,
    out: &mut [f32],
) {
    let (m, k) = (xq.m, xq.k);
    let row_bytes = ty.row_bytes(k);
    assert_eq!(
        w.len(),
        n * row_bytes,
        "quantised matmul: w is not {n} rows of {k} {ty:?} values"
    );
    assert_eq!(out.len(), m * n, "quantised matmul: out is not [m, n]");
    assert!(
        kernel.is_supported(),
        "quantised matmul: {kernel:?} is not supported on this CPU"
    );
    if m == 0 || n == 0 {
        return;
    }
    let nb = k / QK;
    if nb == 0 {
        out.fill(0.0);
        return;
    }
    let threads = rayon::current_num_threads();
    // Several chunks per thread so an unlucky (preempted) thread does not hold up the call;
    // below PAR_MIN_BLOCKS block products a thread wake-up costs more than it saves.
    let rows_per_task = if m * n * nb < PAR_MIN_BLOCKS {
        n
    } else {
        n.div_ceil(threads * 4).max(16)
    };
    let weight_rows = |first: usize, rows: usize| &w[first * row_bytes..(first + rows) * row_bytes];
    if m == 1 {
        let x = xq.row(0);
        let task = |(c, o): (usize, &mut [f32])| {
            let wr = weight_rows(c * rows_per_task, o.len());
            for (oj, wj) in o.iter_mut().zip(wr.chunks_exact(row_bytes)) {
                // SAFETY: kernel support asserted above.
                *oj = unsafe { kernel.row_dots::<F, 1>(wj, [x]) }[0];
            }
        };
        if rows_per_task >= n {
            task((0, out));
        } else {
            out.par_chunks_mut(rows_per_task).enumerate().for_each(task);
        }
        return;
    }
    let panel_kernel = matches!(kernel, DotKernel::Avx2 | DotKernel::Avx2Vnni);
    let panels = (panel_kernel && m >= PANEL_MIN_ROWS).then(|| xq.panels());
    let vnni = kernel == DotKernel::Avx2Vnni;
    let out_ptr = SendPtr(out.as_mut_ptr());
    let task = |c: usize| {
        let j0 = c * rows_per_task;
        let rows = rows_per_task.min(n - j0);
        let wr = weight_rows(j0, rows);
        // SAFETY: tasks own disjoint column ranges of `out`, which is exclusively borrowed
        // for this call and holds m * n values.
        let mut o = unsafe { OutCols::new(out_ptr, m, n, j0, rows) };
        match panels {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: panels are only built for the AVX2 kernels, whose support was asserted;
            // shapes follow from the asserts above.
            Some(panels) => unsafe {
                if vnni {
                    super::gemm_avx2::gemm_vnni::<F>(wr, rows, nb, panels, m, &mut o)
                } else {
                    super::gemm_avx2::gemm::<F>(wr, rows, nb, panels, m, &mut o)
                }
            },
            #[cfg(not(target_arch = "x86_64"))]
            Some(_) => unreachable!("AVX2 is never supported off x86-64"),
            None => {
                for i0 in (0..m).step_by(M_TILE) {
                    let i1 = (i0 + M_TILE).min(m);
                    for (jj, wj) in wr.chunks_exact(row_bytes).enumerate() {
                        // SAFETY: kernel support asserted above.
                        unsafe { dot_tile::<F>(kernel, wj, xq, i0..i1, &mut o, jj) };
                    }
                }
            }
        }
    };
    let tasks = n.div_ceil(rows_per_task);
    if tasks == 1 {
        task(0);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// `out`'s base pointer, shared by the tasks of one matmul (each writes its own columns).
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

// SAFETY: the pointer is only written through `OutCols`, whose column ranges are disjoint
// between tasks, while the matmul holds the only borrow of the output.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// Columns `j0..j0 + cols` of the `[m, n]` output, owned by one task: results are written
/// straight into `out` (for a weight row, one value in each activation row), so no
/// transposed copy of the output is needed.
pub(super) struct OutCols {
    ptr: *mut f32,
    m: usize,
    n: usize,
    j0: usize,
    cols: usize,
}

impl OutCols {
    /// # Safety
    /// `ptr` addresses `m * n` writable values that no one else reads or writes while this
    /// exists, except other `OutCols` over disjoint column ranges; `j0 + cols <= n`.
    unsafe fn new(ptr: SendPtr, m: usize, n: usize, j0: usize, cols: usize) -> Self {
        debug_assert!(j0 + cols <= n);
        Self {
            ptr: ptr.0,
            m,
            n,
            j0,
            cols,
        }
    }

    /// `out[i, j0 + jj] = v`.
    ///
    /// # Panics
    /// If `i` or `jj` is out of range.
    #[inline(always)]
    pub(super) fn set(&mut self, i: usize, jj: usize, v: f32) {
        assert!(
            i < self.m && jj < self.cols,
            "matmul output index out of range"
        );
        // SAFETY: in bounds (checked) and owned by this task (constructor's contract).
        unsafe { *self.ptr.add(i * self.n + self.j0 + jj) = v };
    }
}

/// Weight row `jj` of a task against activation rows `range`, four at a time.
///
/// # Safety
/// `kernel.is_supported()` must be true.
unsafe fn dot_tile<F: Format>(
    kernel: DotKernel,
    wr: &[u8],
    xq: &QuantizedActivations,
    range: std::ops::Range<usize>,
    o: &mut OutCols,
    jj: usize,
) {
    let mut i = range.start;
    while i + 4 <= range.end {
        let rows = [xq.row(i), xq.row(i + 1), xq.row(i + 2), xq.row(i + 3)];
        // SAFETY: the caller guarantees kernel support.
        let r = unsafe { kernel.row_dots::<F, 4>(wr, rows) };
        for (d, v) in r.into_iter().enumerate() {
            o.set(i + d, jj, v);
        }
        i += 4;
    }
    while i < range.end {
        // SAFETY: as above.
        let v = unsafe { kernel.row_dots::<F, 1>(wr, [xq.row(i)]) }[0];
        o.set(i, jj, v);
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dot::tests::{dequantised_dot, kernels, random_blocks};
    use crate::test_util::{random_vec, rng};
    use rand::Rng;

    struct Case {
        x: Vec<f32>,
        w: Vec<u8>,
    }

    fn case(seed: u64, ty: QuantType, m: usize, k: usize, n: usize) -> Case {
        let mut r = rng(seed);
        let x = random_vec(&mut r, m * k, 2.0);
        let w = random_blocks(&mut r, ty, n * k / QK);
        Case { x, w }
    }

    /// Odd shapes on both sides of PANEL_MIN_ROWS, partial panels and tiles, and the model's.
    fn shapes() -> Vec<(usize, usize, usize)> {
        let mut r = rng(70);
        let mut s = vec![
            (1, 576, 576),
            (16, 576, 1536),
            (3, 1536, 576),
            (1, 32, 1),
            (5, 64, 9),
            (6, 64, 9),
            (7, 96, 3),
            (9, 32, 17),
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
    fn matches_exact_q8_1_reference_for_every_kernel_and_format() {
        for ty in QuantType::ALL {
            for (seed, (m, k, n)) in shapes().into_iter().enumerate() {
                let c = case(seed as u64, ty, m, k, n);
                let nb = k / QK;
                let rb = ty.row_bytes(k);
                let mut xq = vec![BlockQ8_1::default(); m * nb];
                quantize_q8_1(&c.x, &mut xq);
                for kernel in kernels() {
                    let mut out = vec![f32::NAN; m * n];
                    matmul_with(kernel, ty, &c.x, &c.w, m, k, n, &mut out);
                    for i in 0..m {
                        for j in 0..n {
                            let want = dequantised_dot(
                                ty,
                                &c.w[j * rb..(j + 1) * rb],
                                &xq[i * nb..(i + 1) * nb],
                            );
                            let got = out[i * n + j] as f64;
                            let tol = 1e-5 * (1.0 + want.abs()) + 2e-5 * nb as f64;
                            assert!(
                                (got - want).abs() <= tol,
                                "{kernel:?} {ty:?} ({m},{k},{n}) [{i},{j}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Against the dequantise-then-f32 product, the only error is Q8_1 rounding of x: at most
    /// half a step per activation, so |err| ≤ Σ_blocks d8/2 · Σ|w| (plus float slack).
    #[test]
    fn matches_f32_reference_within_the_q8_1_rounding_bound() {
        for ty in QuantType::ALL {
            for (seed, (m, k, n)) in shapes().into_iter().enumerate() {
                let c = case(100 + seed as u64, ty, m, k, n);
                let mut wf = vec![0.0; n * k];
                ty.dequantize(&c.w, &mut wf);
                let mut out = vec![0.0; m * n];
                matmul(ty, &c.x, &c.w, m, k, n, &mut out);
                for i in 0..m {
                    for j in 0..n {
                        let (xr, wr) = (&c.x[i * k..(i + 1) * k], &wf[j * k..(j + 1) * k]);
                        let want: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let bound: f64 = xr
                            .chunks(QK)
                            .zip(wr.chunks(QK))
                            .map(|(xb, wb)| {
                                let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                                let d8 = amax as f64 / 127.0;
                                d8 / 2.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
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

    /// candle's `k_quants::matmul` on the same bytes. Candle stores Q8 scales as f16, so the
    /// two differ by f16 rounding on top of the Q8_1 bound. Candle's Q4 dots need an even
    /// number of blocks, so only k multiple of 64 is compared.
    #[test]
    fn agrees_with_candle() {
        use candle_core::quantized::k_quants::{self, BlockQ4_0, BlockQ4_1, BlockQ8_0, GgmlType};
        fn theirs<T: GgmlType>(m: usize, k: usize, n: usize, x: &[f32], w: &[u8]) -> Vec<f32> {
            assert_eq!(std::mem::size_of::<T>() * (n * k / QK), w.len());
            let mut blocks = vec![T::zeros(); n * k / QK];
            // SAFETY: candle's blocks are #[repr(C)] structs of f16/u8/i8 in the ggml layout
            // (sizes asserted above); any bit pattern is a valid f16 / u8 / i8.
            unsafe {
                std::ptr::copy_nonoverlapping(w.as_ptr(), blocks.as_mut_ptr() as *mut u8, w.len());
            }
            let mut out = vec![0.0; m * n];
            k_quants::matmul((m, k, n), x, &blocks, &mut out).unwrap();
            out
        }
        let even = shapes()
            .into_iter()
            .filter(|s| s.1 % 64 == 0)
            .collect::<Vec<_>>();
        assert!(even.len() >= 5);
        for ty in QuantType::ALL {
            for (seed, &(m, k, n)) in even.iter().enumerate() {
                let c = case(200 + seed as u64, ty, m, k, n);
                let cand = match ty {
                    QuantType::Q4_0 => theirs::<BlockQ4_0>(m, k, n, &c.x, &c.w),
                    QuantType::Q4_1 => theirs::<BlockQ4_1>(m, k, n, &c.x, &c.w),
                    QuantType::Q8_0 => theirs::<BlockQ8_0>(m, k, n, &c.x, &c.w),
                };
                let mut ours = vec![0.0; m * n];
                matmul(ty, &c.x, &c.w, m, k, n, &mut ours);
                let scale = ours.iter().chain(&cand).fold(1.0f32, |a, v| a.max(v.abs()));
                for (idx, (a, b)) in ours.iter().zip(&cand).enumerate() {
                    assert!(
                        (a - b).abs() <= 2e-3 * scale,
                        "{ty:?} ({m},{k},{n}) [{idx}]: ours {a}, candle {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn shared_activations_give_the_same_result() {
        let c = case(300, QuantType::Q4_1, 12, 64, 20);
        let xq = QuantizedActivations::new(&c.x, 12, 64);
        assert_eq!((xq.rows(), xq.cols()), (12, 64));
        for kernel in kernels() {
            let mut a = vec![0.0; 12 * 20];
            let mut b = vec![0.0; 12 * 20];
            matmul_quantized(kernel, QuantType::Q4_1, &xq, &c.w, 20, &mut a);
            matmul_with(kernel, QuantType::Q4_1, &c.x, &c.w, 12, 64, 20, &mut b);
            assert_eq!(a, b, "{kernel:?}");
        }
    }

    #[test]
    fn zero_sizes_are_fine() {
        let mut out = vec![];
        matmul(QuantType::Q4_1, &[], &[], 0, 64, 0, &mut out);
        let mut out = vec![1.0; 2];
        matmul(QuantType::Q8_0, &[], &[], 2, 0, 1, &mut out);
        assert_eq!(out, vec![0.0; 2]);
    }

    #[test]
    #[should_panic(expected = "not 2 rows")]
    fn rejects_short_weights() {
        let mut out = vec![0.0; 2];
        matmul(QuantType::Q4_1, &[0.0; 32], &[0u8; 20], 1, 32, 2, &mut out);
    }
}
