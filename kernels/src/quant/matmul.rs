//! `out[m, n] = x[m, k] · Wᵀ` with W the raw GGUF bytes of n rows of k weights in Q4_0, Q4_1,
//! Q5_0, Q8_0 or a K-quant.
//!
//! As in ggml's `mul_mat`: the activations are quantised to Q8_1 once
//! ([`QuantizedActivations`], which callers may share between matmuls of the same input), then
//! every output is a sum of integer block dot products. The weight rows are split across
//! rayon threads; each task owns a run of them, i.e. a range of output columns, and writes its
//! results straight into `[m, n]`. On AVX2 (with AVX-VNNI where present) a task runs its
//! weight rows one at a time against up to four activation rows (`dot_avx2`: decode and small
//! batches; one row at a time streams the weights sequentially), Q4_0, Q4_1 and Q5_0 against
//! up to four activation rows eight weight rows at a time (`dot8_avx2`: each row's sum in its
//! own lane, no horizontal sum per row), or, for [`PANEL_MIN_ROWS`]
//! rows or more, interleaves the activations into 8-row panels once and runs the panel GEMM
//! (`gemm_avx2`, after llama.cpp's repacked GEMMs), which unpacks each weight block once per
//! 16 activation rows. With AVX-512 VNNI up to four rows of Q4_0, Q4_1 or Q5_0
//! run sixteen weight rows at a time (`dot16_avx512`, the 512-bit form of `dot8_avx2`); one
//! row of Q8_0 takes sixteen blocks per step (`dot_avx512`); two to eight rows of Q8_0, and
//! five to eight of the others, share each step's weights transposed to one block per lane
//! (`dot_lanes_avx512`); and, from [`PANEL16_MIN_ROWS`] rows, the panels hold 16 rows, one
//! per 512-bit register (`gemm_avx512`); with AMX 16 weight rows × 16 activation rows of a
//! block's integer sums are one tile product (`gemm_amx`, from [`AMX_MIN_ROWS`] rows). The K-quants
//! take Q8_K activations (256 values per scale) and the AVX2 row kernel (`kdot_avx2`) or,
//! with AVX-512 VNNI from [`KPANEL16_MIN_ROWS`] rows, a 16-row panel GEMM
//! (`kgemm_avx512`), and with AMX, for Q4_K and Q5_K from [`AMX_MIN_ROWS`] rows, tile
//! products (`kgemm_amx`). A Q4_K matrix repacked into groups of sixteen rows at load
//! ([`super::q4_k_x16`]) takes [`super::matmul_x16`] instead: with AVX-512 VNNI a sixteen-row
//! kernel for every batch below AMX's. Every path computes
//! each output with the same operations in the same order ([`super::format`]), so a row's
//! result does not depend on the batch it is in.

use std::sync::OnceLock;

use rayon::prelude::*;

use super::dot::{dot_portable, DotKernel};
use super::format::{Format, QuantType, Q4_0, Q4_1, Q5_0, Q8_0};
use super::kformat::{dot_portable_k, KFormat, QK_K};
use super::kpanel16::{build_kpanels16, KPanel16Block};
use super::panel::{build_panels, PanelBlock};
use super::panel16::{build_panels16, Panel16Block};
use super::q4_1::QK;
use super::q8_1::{quantize_q8_1, BlockQ8_1};
use super::q8_k::{quantize_q8_k, BlockQ8K};
use super::{q2_k::Q2K, q3_k::Q3K, q4_k::Q4K, q5_k::Q5K, q6_k::Q6K};

/// Smallest batch that takes the panel GEMM on AVX2 (see [`PANEL16_MIN_ROWS`] for AVX-512):
/// below it, a panel's eight lanes would be
/// mostly empty and the row dot products (four rows per weight unpack) do as well.
pub const PANEL_MIN_ROWS: usize = 6;

/// Smallest batch that takes the 16-row panel GEMM on AVX-512 VNNI (and AMX below
/// [`AMX_MIN_ROWS`]); below, Q4_0, Q4_1 and Q5_0 run the sixteen-weight-row kernel
/// (`dot16_avx512`) up to four rows, and otherwise one row runs the one-row kernel
/// (`dot_avx512`), two up to this the block-per-lane kernel (`dot_lanes_avx512`). The
/// GEMM's cost hardly depends on the rows it fills, the row kernels' grows with every row. Measured on a 2-core AMD EPYC with
/// AVX-512 VNNI (criterion `q{4_1,8_0}_step_30_layers_m*`, the 210 weight matmuls of a
/// SmolLM2 step; two runs, times relative to one row): the block-per-lane kernel took 1.4,
/// 1.5, 1.7-1.8, 2.2-2.6 and 2.9-3.8 at 2, 3, 4, 6 and 9 rows for Q4_1 (1.2, 1.3, 1.4-1.5,
/// 1.9-2.1 and 2.3-3.0 for Q8_0), the GEMM 2.8-3.0 at 4 rows and 3.5-3.8 at 9 (Q8_0: 1.9-2.1
/// and 2.1-2.3). So up to eight rows, the verify steps of speculative decoding, run the
/// block-per-lane kernel.
pub const PANEL16_MIN_ROWS: usize = 9;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(PANEL16_MIN_ROWS - 1 <= super::dot_lanes_avx512::MAX_ROWS);

/// Smallest batch that takes the AVX-512 K-quant GEMM (`kgemm_avx512`) with
/// [`DotKernel::Avx512Vnni`] or [`DotKernel::Amx`]; smaller batches run the AVX2 row kernel,
/// which takes up to four rows per pass over the weights. Measured on a 2-core AVX-512 Xeon
/// (criterion `quant_matmul/*/q{3,4,6}_k_m{4,8}_k{1024,2048}_n640`): at four rows the two
/// were even for Q4_K and the row kernel up to 1.5x faster for Q6_K and Q3_K; at eight rows
/// the GEMM took 0.46-0.69x the row kernel's time. An AVX-512 form of the row kernel (the
/// same unpack, `maddubs` and VNNI `dpwssd` on 512 bits with `vpermw` spreading the group
/// scales, or `dpwssd` on 256 bits in two chains) was no faster: Llama 3.2 1B's shape in
/// Q4_K_M (`tidal bench fixture`, `tidal bench decode`, three alternating rounds on a 2-core
/// AMX Xeon) decoded 20.2 and 20.5 tokens/s against this kernel's 21.5.
pub const KPANEL16_MIN_ROWS: usize = 5;

/// Smallest batch that takes the AMX GEMM (with [`DotKernel::Amx`]); smaller batches run the
/// AVX-512 GEMM. Each block's tile product must be stored and scaled by the vector units, so
/// AMX wins only once a group of weight rows meets several panels: measured on a 2-core
/// Sapphire Rapids class Xeon (criterion `q8_0_step_30_layers_m*`, the 210 weight matmuls
/// of a SmolLM2 step), AMX took 1.24x the AVX-512 time at 16 rows, 1.02x at 32, 0.87x at 64
/// (0.70x for one 576 x 1536 matmul at 128 rows). So decode batches stay on AVX-512 and
/// prefill chunks go to AMX.
pub const AMX_MIN_ROWS: usize = 48;

/// Activation rows processed against one weight row before moving to the next (portable
/// path): 64 rows of k = 1536 quantised activations (~120 KiB) stay in L2.
const M_TILE: usize = 64;

/// Block products (m · n · k/32) below which the matmul stays on the calling thread.
const PAR_MIN_BLOCKS: usize = 2048;

/// `m` activation rows of `k` values, quantised on first use to Q8_1 (for the 32-weight
/// formats; and, when a batched matmul asks for them, interleaved into panels) and to Q8_K
/// (for the K-quants), for one or more matmuls with the same input.
#[derive(Debug)]
pub struct QuantizedActivations {
    m: usize,
    k: usize,
    /// The rows as given (each quantisation is made from them when first asked for).
    x: Vec<f32>,
    q8_1: OnceLock<Q8_1Rows>,
    q8_k: OnceLock<Vec<BlockQ8K>>,
    /// The Q8_K rows as 16-row panels, for the AVX-512 K-quant GEMM.
    kpanels16: OnceLock<Vec<KPanel16Block>>,
    /// Every Q8_K block's 32-value sums, paired for the sixteen-row Q4_K kernel.
    #[cfg(target_arch = "x86_64")]
    sum_pairs: OnceLock<Vec<[i32; 4]>>,
    panels: OnceLock<Vec<PanelBlock>>,
    /// The same as 16-row panels, for the AVX-512 GEMM.
    panels16: OnceLock<Vec<Panel16Block>>,
    /// Every row's whole 16-block steps in the AVX-512 row kernel's order.
    #[cfg(target_arch = "x86_64")]
    interleaved16: OnceLock<Vec<super::dot_avx512::Interleaved16>>,
    /// All rows in the AVX-512 small-batch kernel's order (2 to 8 rows).
    #[cfg(target_arch = "x86_64")]
    block_lanes: OnceLock<super::dot_lanes_avx512::BlockLanes>,
}

/// Every row's Q8_1 blocks.
#[derive(Debug)]
struct Q8_1Rows {
    blocks: Vec<BlockQ8_1>,
    /// Every block's `d`, then every block's `s`, contiguous (the row kernel loads four at
    /// once).
    d: Vec<f32>,
    s: Vec<f32>,
}

/// One activation row as the kernels read it.
#[derive(Debug, Clone, Copy)]
pub(super) struct XRow<'a> {
    pub blocks: &'a [BlockQ8_1],
    pub d: &'a [f32],
    pub s: &'a [f32],
}

impl QuantizedActivations {
    /// `x` (`m` rows of `k` values), to be quantised when a matmul first needs it.
    ///
    /// # Panics
    /// If `k` is not a multiple of 32 or `x` is not `m * k` values.
    pub fn new(x: &[f32], m: usize, k: usize) -> Self {
        assert!(
            k.is_multiple_of(QK),
            "quantised matmul: k = {k} is not a multiple of {QK}"
        );
        assert_eq!(x.len(), m * k, "quantised matmul: x is not [m, k]");
        Self {
            m,
            k,
            x: x.to_vec(),
            q8_1: OnceLock::new(),
            q8_k: OnceLock::new(),
            kpanels16: OnceLock::new(),
            #[cfg(target_arch = "x86_64")]
            sum_pairs: OnceLock::new(),
            panels: OnceLock::new(),
            panels16: OnceLock::new(),
            #[cfg(target_arch = "x86_64")]
            interleaved16: OnceLock::new(),
            #[cfg(target_arch = "x86_64")]
            block_lanes: OnceLock::new(),
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

    fn q8_1(&self) -> &Q8_1Rows {
        self.q8_1.get_or_init(|| {
            let (m, k) = (self.m, self.k);
            let nb = k / QK;
            let mut blocks = vec![BlockQ8_1::default(); m * nb];
            if nb > 0 {
                if m * k >= crate::PAR_MIN_ELEMS {
                    self.x
                        .par_chunks(k)
                        .zip(blocks.par_chunks_mut(nb))
                        .for_each(|(xr, qr)| quantize_q8_1(xr, qr));
                } else {
                    quantize_q8_1(&self.x, &mut blocks);
                }
            }
            Q8_1Rows {
                d: blocks.iter().map(|b| b.d).collect(),
                s: blocks.iter().map(|b| b.s).collect(),
                blocks,
            }
        })
    }

    /// Every row's Q8_K blocks (`k / 256` per row).
    ///
    /// # Panics
    /// If `k` is not a multiple of 256.
    pub(super) fn q8_k(&self) -> &[BlockQ8K] {
        self.q8_k.get_or_init(|| {
            let (m, k) = (self.m, self.k);
            assert!(
                k.is_multiple_of(QK_K),
                "quantised matmul: k = {k} is not a multiple of {QK_K}"
            );
            let nb = k / QK_K;
            let mut blocks = vec![BlockQ8K::default(); m * nb];
            if nb > 0 {
                if m * k >= crate::PAR_MIN_ELEMS {
                    self.x
                        .par_chunks(k)
                        .zip(blocks.par_chunks_mut(nb))
                        .for_each(|(xr, qr)| quantize_q8_k(xr, qr));
                } else {
                    quantize_q8_k(&self.x, &mut blocks);
                }
            }
            blocks
        })
    }

    /// [`super::kdot16_avx512::sum_pairs`] of every row's Q8_K blocks.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn sum_pairs(&self) -> &[[i32; 4]] {
        self.sum_pairs
            .get_or_init(|| super::kdot16_avx512::sum_pairs(self.q8_k()))
    }

    fn kpanels16(&self) -> &[KPanel16Block] {
        self.kpanels16
            .get_or_init(|| build_kpanels16(self.q8_k(), self.m, self.k / QK_K))
    }

    fn row(&self, i: usize) -> XRow<'_> {
        let q = self.q8_1();
        let r = i * (self.k / QK)..(i + 1) * (self.k / QK);
        XRow {
            blocks: &q.blocks[r.clone()],
            d: &q.d[r.clone()],
            s: &q.s[r],
        }
    }

    /// Row `i` for the AVX-512 row kernel.
    #[cfg(target_arch = "x86_64")]
    fn row16(&self, i: usize) -> super::dot_avx512::XRow16<'_> {
        let rows = self.interleaved16.get_or_init(|| {
            let nb = self.k / QK;
            self.q8_1()
                .blocks
                .chunks_exact(nb.max(1))
                .take(self.m)
                .map(super::dot_avx512::Interleaved16::new)
                .collect()
        });
        super::dot_avx512::XRow16 {
            row: self.row(i),
            lanes: &rows[i].lanes,
        }
    }

    /// All rows for the AVX-512 small-batch kernel.
    #[cfg(target_arch = "x86_64")]
    fn block_lanes(&self) -> &super::dot_lanes_avx512::BlockLanes {
        self.block_lanes.get_or_init(|| {
            super::dot_lanes_avx512::BlockLanes::new(&self.q8_1().blocks, self.m, self.k / QK)
        })
    }

    fn panels(&self) -> &[PanelBlock] {
        self.panels
            .get_or_init(|| build_panels(&self.q8_1().blocks, self.m, self.k / QK))
    }

    fn panels16(&self) -> &[Panel16Block] {
        self.panels16
            .get_or_init(|| build_panels16(&self.q8_1().blocks, self.m, self.k / QK))
    }
}

/// Bytes of one weight row, and the activation panels of a GEMM call over `m` rows in panels
/// of `panel_rows`; checks in debug builds that `w` holds `rows` rows of `nb` blocks and
/// `panels` that many panels of `nb` blocks (the contract every GEMM kernel shares).
#[inline(always)]
pub(super) fn gemm_shape<F: Format, P>(
    w: &[u8],
    rows: usize,
    nb: usize,
    panels: &[P],
    m: usize,
    panel_rows: usize,
) -> (usize, usize) {
    let row_bytes = nb * F::BLOCK_BYTES;
    let n_panels = m.div_ceil(panel_rows);
    debug_assert_eq!(w.len(), rows * row_bytes);
    debug_assert_eq!(panels.len(), n_panels * nb);
    (row_bytes, n_panels)
}

/// Quantised matmul: x `[m, k]` f32, w = raw GGUF bytes of `n` rows of `k` values of type
/// `ty`, out `[m, n]`. Uses [`DotKernel::selected`] (by default the fastest of this CPU).
///
/// # Panics
/// If `k` is not a multiple of 32 or a slice length does not match the shape.
pub fn matmul(ty: QuantType, x: &[f32], w: &[u8], m: usize, k: usize, n: usize, out: &mut [f32]) {
    matmul_with(DotKernel::selected(), ty, x, w, m, k, n, out);
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
        QuantType::Q5_0 => run::<Q5_0>(kernel, ty, xq, w, n, out),
        QuantType::Q8_0 => run::<Q8_0>(kernel, ty, xq, w, n, out),
        QuantType::Q4_K => run_k::<Q4K>(kernel, ty, xq, w, n, out),
        QuantType::Q5_K => run_k::<Q5K>(kernel, ty, xq, w, n, out),
        QuantType::Q6_K => run_k::<Q6K>(kernel, ty, xq, w, n, out),
        QuantType::Q3_K => run_k::<Q3K>(kernel, ty, xq, w, n, out),
        QuantType::Q2_K => run_k::<Q2K>(kernel, ty, xq, w, n, out),
    }
}

/// Checks a matmul call's shapes; returns the bytes of one weight row.
pub(super) fn check_shapes(
    kernel: DotKernel,
    ty: QuantType,
    xq: &QuantizedActivations,
    w: &[u8],
    n: usize,
    out: &[f32],
) -> usize {
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
    row_bytes
}

/// Smallest batch that takes `kernel`'s panel GEMM rather than its row kernel.
fn panel_min_rows(kernel: DotKernel) -> usize {
    match kernel {
        DotKernel::Avx512Vnni | DotKernel::Amx => PANEL16_MIN_ROWS,
        _ => PANEL_MIN_ROWS,
    }
}

/// Weight rows per rayon task: one task below [`PAR_MIN_BLOCKS`] products of 32 weights,
/// else several per thread so an unlucky (preempted) thread does not hold up the call, in
/// whole groups of 16 weight rows (the AMX tile product's rows).
fn rows_per_task(m: usize, n: usize, blocks32: usize) -> usize {
    if m * n * blocks32 < PAR_MIN_BLOCKS {
        n
    } else {
        n.div_ceil(rayon::current_num_threads() * 4)
            .next_multiple_of(16)
    }
}

/// Runs `task(c)` for every task `c` of `n` weight rows in runs of `rows_per_task`.
pub(super) fn for_each_task(n: usize, rows_per_task: usize, task: impl Fn(usize) + Sync + Send) {
    let tasks = n.div_ceil(rows_per_task);
    if tasks == 1 {
        task(0);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// The K-quant matmul: every weight row against the Q8_K activations ([`super::kformat`]).
fn run_k<K: KFormat>(
    kernel: DotKernel,
    ty: QuantType,
    xq: &QuantizedActivations,
    w: &[u8],
    n: usize,
    out: &mut [f32],
) {
    let row_bytes = check_shapes(kernel, ty, xq, w, n, out);
    let Some(plan) = KPlan::new::<K>(kernel, xq, n, out, true) else {
        return;
    };
    let out_ptr = SendPtr(out.as_mut_ptr());
    let task = |c: usize| {
        let j0 = c * plan.rows_per_task;
        let cols = plan.rows_per_task.min(n - j0);
        let wr = &w[j0 * row_bytes..(j0 + cols) * row_bytes];
        // SAFETY: tasks own disjoint column ranges of `out`, which is exclusively borrowed
        // for this call and holds m * n values.
        let mut o = unsafe { OutCols::new(out_ptr, plan.m, n, j0, cols) };
        plan.run::<K>(wr, cols, &mut o);
    };
    for_each_task(n, plan.rows_per_task, task);
}

/// What one K-quant matmul call runs on: the activation rows and which kernel takes them.
pub(super) struct KPlan<'a> {
    /// Activation rows.
    pub m: usize,
    /// Super-blocks per row.
    pub nb: usize,
    /// Weight rows per rayon task (whole groups of 16).
    pub rows_per_task: usize,
    /// Every activation row's Q8_K blocks.
    pub rows: Vec<&'a [BlockQ8K]>,
    simd: bool,
    kpanels: Option<&'a [KPanel16Block]>,
    amx: bool,
}

impl<'a> KPlan<'a> {
    /// The plan for `xq` against `n` weight rows of `K`; `None` when there is nothing to
    /// compute (`out` then holds the result). Batches take the GEMMs (and their activation
    /// panels are built now) only if `gemms`.
    pub(super) fn new<K: KFormat>(
        kernel: DotKernel,
        xq: &'a QuantizedActivations,
        n: usize,
        out: &mut [f32],
        gemms: bool,
    ) -> Option<Self> {
        let (m, k) = (xq.m, xq.k);
        if m == 0 || n == 0 {
            return None;
        }
        let nb = k / QK_K;
        if nb == 0 {
            out.fill(0.0);
            return None;
        }
        let kpanels = (gemms
            && matches!(kernel, DotKernel::Avx512Vnni | DotKernel::Amx)
            && m >= KPANEL16_MIN_ROWS)
            .then(|| xq.kpanels16());
        Some(Self {
            m,
            nb,
            rows_per_task: rows_per_task(m, n, k / QK),
            rows: xq.q8_k().chunks_exact(nb).collect(),
            simd: kernel != DotKernel::Portable,
            kpanels,
            // Q4_K and Q5_K only (6-bit unsigned scales over 32 weights): `kgemm_amx` splits
            // each scale into two 3-bit factors folded into the weight bytes, which Q6_K's
            // and Q3_K's signed scales do not allow. (Weighing every span's tile product on
            // the vector units instead measured within 3 % of the AVX-512 GEMM for the
            // 16-weight-span formats.)
            amx: gemms && kernel == DotKernel::Amx && m >= AMX_MIN_ROWS && K::SCALE_SPAN == 32,
        })
    }

    /// `cols` stored weight rows `wr` against every activation row, into `o`.
    pub(super) fn run<K: KFormat>(&self, wr: &[u8], cols: usize, o: &mut OutCols) {
        let nb = self.nb;
        #[cfg(target_arch = "x86_64")]
        if self.simd {
            // SAFETY: every SIMD kernel implies AVX2, FMA and F16C, `kpanels` is only built
            // for AVX-512 VNNI ones and `amx` only set for AMX (the caller asserted the
            // kernel's support); `wr` is `cols` rows of `nb` super-blocks (caller's shapes);
            // panels are built from the same activations.
            unsafe {
                match (self.kpanels, self.amx) {
                    (Some(p), true) => super::kgemm_amx::gemm::<K>(wr, cols, nb, p, self.m, o),
                    (Some(p), false) => super::kgemm_avx512::gemm::<K>(wr, cols, nb, p, self.m, o),
                    (None, _) => super::kdot_avx2::rows::<K>(wr, cols, nb, &self.rows, o),
                }
            };
            return;
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (self.simd, self.kpanels, self.amx);
        let row_bytes = nb * K::BLOCK_BYTES;
        for i0 in (0..self.m).step_by(M_TILE) {
            for (jj, wj) in wr.chunks_exact(row_bytes).take(cols).enumerate() {
                for (i, x) in self.rows.iter().enumerate().skip(i0).take(M_TILE) {
                    o.set(i, jj, dot_portable_k::<K>(wj, x));
                }
            }
        }
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
    let row_bytes = check_shapes(kernel, ty, xq, w, n, out);
    let (m, k) = (xq.m, xq.k);
    if m == 0 || n == 0 {
        return;
    }
    let nb = k / QK;
    if nb == 0 {
        out.fill(0.0);
        return;
    }
    let rows_per_task = rows_per_task(m, n, nb);
    let rows: Vec<XRow<'_>> = (0..m).map(|i| xq.row(i)).collect();
    let simd = kernel != DotKernel::Portable;
    let vnni = kernel.rows_use_vnni();
    let batched = m >= panel_min_rows(kernel);
    let amx = kernel == DotKernel::Amx && m >= AMX_MIN_ROWS;
    let panels16 = (matches!(kernel, DotKernel::Avx512Vnni | DotKernel::Amx) && batched)
        .then(|| xq.panels16());
    let panels =
        (matches!(kernel, DotKernel::Avx2 | DotKernel::Avx2Vnni) && batched).then(|| xq.panels());
    #[cfg(target_arch = "x86_64")]
    let avx512_rows = matches!(kernel, DotKernel::Avx512Vnni | DotKernel::Amx) && !batched;
    #[cfg(target_arch = "x86_64")]
    let rows16 = avx512_rows
        && m <= super::dot16_avx512::PASS_ROWS
        && super::dot16_avx512::reads::<F>()
        && super::dot16_avx512::offsets_fit(row_bytes);
    #[cfg(target_arch = "x86_64")]
    let row16 = (avx512_rows && !rows16 && m == 1).then(|| xq.row16(0));
    #[cfg(target_arch = "x86_64")]
    let block_lanes = (avx512_rows && !rows16 && m > 1).then(|| xq.block_lanes());
    let out_ptr = SendPtr(out.as_mut_ptr());
    let task = |c: usize| {
        let j0 = c * rows_per_task;
        let cols = rows_per_task.min(n - j0);
        let wr = &w[j0 * row_bytes..(j0 + cols) * row_bytes];
        // SAFETY: tasks own disjoint column ranges of `out`, which is exclusively borrowed
        // for this call and holds m * n values.
        let mut o = unsafe { OutCols::new(out_ptr, m, n, j0, cols) };
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: the kernel's support was asserted (AVX2 for all of them, AVX-512 VNNI
            // for `panels16` and `rows16`, AMX for `amx`, AVX-VNNI for `vnni`); shapes follow
            // from the asserts above (and `rows16` from its row-length check); panels are
            // built from `xq`.
            unsafe {
                if let (Some(p), true) = (panels16, amx) {
                    super::gemm_amx::gemm::<F>(wr, cols, nb, p, m, &mut o);
                    return;
                }
                if let Some(p) = panels16 {
                    super::gemm_avx512::gemm::<F>(wr, cols, nb, p, m, &mut o);
                    return;
                }
                if rows16 {
                    super::dot16_avx512::rows::<F>(wr, cols, nb, &rows, &mut o);
                    return;
                }
                if let Some(x16) = row16 {
                    super::dot_avx512::rows::<F>(wr, cols, nb, x16, &mut o);
                    return;
                }
                if let Some(x) = block_lanes {
                    super::dot_lanes_avx512::rows::<F>(wr, cols, nb, x, &mut o);
                    return;
                }
                match (panels, vnni) {
                    (Some(p), true) => super::gemm_avx2::gemm_vnni::<F>(wr, cols, nb, p, m, &mut o),
                    (Some(p), false) => super::gemm_avx2::gemm::<F>(wr, cols, nb, p, m, &mut o),
                    (None, vnni) if super::dot8_avx2::reads::<F>() => {
                        super::dot8_avx2::rows::<F>(vnni, wr, cols, nb, &rows, &mut o)
                    }
                    (None, true) => super::dot_avx2::rows_vnni::<F>(wr, cols, nb, &rows, &mut o),
                    (None, false) => super::dot_avx2::rows::<F>(wr, cols, nb, &rows, &mut o),
                }
            }
            return;
        }
        let _ = (simd, vnni, panels, panels16, amx);
        for i0 in (0..m).step_by(M_TILE) {
            for (jj, wj) in wr.chunks_exact(row_bytes).enumerate() {
                for (i, x) in rows.iter().enumerate().skip(i0).take(M_TILE) {
                    o.set(i, jj, dot_portable::<F>(wj, x.blocks));
                }
            }
        }
    };
    for_each_task(n, rows_per_task, task);
}

/// `out`'s base pointer, shared by the tasks of one matmul (each writes its own columns).
#[derive(Clone, Copy)]
pub(super) struct SendPtr(pub(super) *mut f32);

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
    pub(super) unsafe fn new(ptr: SendPtr, m: usize, n: usize, j0: usize, cols: usize) -> Self {
        debug_assert!(j0 + cols <= n);
        Self {
            ptr: ptr.0,
            m,
            n,
            j0,
            cols,
        }
    }

    /// The columns from `jj` on, as their own view (for a kernel that leaves a tail of
    /// columns to another).
    ///
    /// # Panics
    /// If `jj` is past the columns.
    pub(super) fn skip(&mut self, jj: usize) -> OutCols {
        assert!(jj <= self.cols, "matmul output columns out of range");
        OutCols {
            ptr: self.ptr,
            m: self.m,
            n: self.n,
            j0: self.j0 + jj,
            cols: self.cols - jj,
        }
    }

    /// Columns `jj..jj + cols` of these, as their own view.
    ///
    /// # Panics
    /// If they are not all among the columns.
    pub(super) fn window(&mut self, jj: usize, cols: usize) -> OutCols {
        assert!(jj + cols <= self.cols, "matmul output columns out of range");
        OutCols {
            ptr: self.ptr,
            m: self.m,
            n: self.n,
            j0: self.j0 + jj,
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

#[cfg(test)]
pub(crate) mod tests {
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
        let w = random_blocks(&mut r, ty, n * k / ty.block_elems());
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
            // The AVX-512 row kernel's 16-block steps: exactly one, with tails of one to
            // fifteen blocks, several, for one to five rows.
            (1, 512, 33),
            (2, 1024, 7),
            (3, 544, 5),
            (5, 1568, 3),
            (2, 992, 4),
            (5, 64, 9),
            (6, 64, 9),
            (7, 96, 3),
            // Rows whose last step holds one to four blocks share it four at a time: one
            // quad and a lone row, two quads, a tail of one, two and three blocks.
            (1, 640, 5),
            (3, 544, 8),
            (2, 1088, 11),
            (5, 608, 4),
            (1, 576, 13),
            (6, 544, 9),
            // One to four activation rows on AVX2: whole groups of eight weight rows, with and
            // without a tail of rows, blocks not a multiple of the four chains.
            (1, 96, 17),
            (1, 160, 24),
            (1, 224, 8),
            (2, 160, 16),
            (3, 96, 9),
            (4, 224, 17),
            // Up to four activation rows on AVX-512 (the sixteen-row kernel): whole groups of
            // sixteen weight rows with tails of eight and fewer; five to eight rows of the
            // same shapes go to the block-per-lane kernel.
            (1, 96, 33),
            (2, 160, 48),
            (3, 224, 40),
            (5, 96, 32),
            (7, 160, 25),
            (8, 224, 16),
            // Rows of one short step: nothing but the shared tails.
            (1, 64, 12),
            (5, 96, 8),
            (8, 128, 9),
            // The block-per-lane kernel (two to eight rows): one and two quads of rows, full
            // and partial, at the models' widths (18, 20 and 48 blocks).
            (4, 576, 7),
            (8, 640, 5),
            (6, 1536, 3),
            (8, 512, 2),
            (9, 32, 17),
            (16, 96, 5),
            // One 16-row panel, weight rows in passes of four, two and one.
            (12, 64, 7),
            (17, 160, 5),
            (33, 224, 19),
            // k large enough for one 16-row panel per AVX-512 tile, 49 blocks (a tail of one).
            (33, 1568, 5),
            (48, 32, 6),
            (65, 64, 7),
            (130, 96, 33),
            // AMX (AMX_MIN_ROWS rows or more): whole groups of 16 weight rows (one, three,
            // four) with and without a tail of rows for the AVX-512 GEMM, blocks not a
            // multiple of the four chains, panels full and partial.
            (48, 96, 16),
            (50, 160, 48),
            (49, 1568, 35),
            (64, 576, 64),
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

    /// Shapes for the K-quants (k in whole super-blocks): one to nine super-blocks (tails of
    /// the four chains), both sides of the row kernel's four-row groups and 64-row tiles,
    /// tasks split across threads, and the Gemma 3 270M matrices'.
    pub(crate) fn k_shapes() -> Vec<(usize, usize, usize)> {
        let mut r = rng(71);
        let mut s = vec![
            (1, 256, 1),
            (1, 1024, 640),
            (1, 2048, 640),
            (2, 512, 7),
            (3, 768, 5),
            (4, 2304, 3),
            (5, 1280, 9),
            (16, 2048, 33),
            (17, 256, 40),
            (65, 512, 19),
            (130, 256, 33),
            // The AMX GEMM (from AMX_MIN_ROWS rows): whole groups of 16 weight rows only,
            // and three groups over eight super-blocks.
            (49, 768, 16),
            (64, 2048, 48),
        ];
        for _ in 0..8 {
            s.push((
                r.random_range(1..40),
                QK_K * r.random_range(1..10),
                r.random_range(1..90),
            ));
        }
        s
    }

    #[test]
    fn matches_exact_q8_1_reference_for_every_kernel_and_format() {
        for ty in QuantType::BLOCK32 {
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
        for ty in QuantType::BLOCK32 {
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
        use candle_core::quantized::k_quants::{
            self, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, GgmlType,
        };
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
        for ty in QuantType::BLOCK32 {
            for (seed, &(m, k, n)) in even.iter().enumerate() {
                let c = case(200 + seed as u64, ty, m, k, n);
                let cand = match ty {
                    QuantType::Q4_0 => theirs::<BlockQ4_0>(m, k, n, &c.x, &c.w),
                    QuantType::Q4_1 => theirs::<BlockQ4_1>(m, k, n, &c.x, &c.w),
                    QuantType::Q5_0 => theirs::<BlockQ5_0>(m, k, n, &c.x, &c.w),
                    QuantType::Q8_0 => theirs::<BlockQ8_0>(m, k, n, &c.x, &c.w),
                    _ => unreachable!("{ty:?} is a K-quant"),
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

    /// Every kernel, and every batch a row can be in, gives the same bits: the runtime's
    /// batch invariance (a request's tokens must not depend on its neighbours) rests on it.
    #[test]
    fn results_are_identical_across_kernels_and_batches() {
        for ty in QuantType::ALL {
            let shapes = if ty.is_k_quant() {
                k_shapes()
            } else {
                shapes()
            };
            for (seed, (m, k, n)) in shapes.into_iter().enumerate() {
                let c = case(400 + seed as u64, ty, m, k, n);
                let mut reference = vec![0.0; m * n];
                matmul_with(DotKernel::Portable, ty, &c.x, &c.w, m, k, n, &mut reference);
                for kernel in kernels() {
                    let mut out = vec![f32::NAN; m * n];
                    matmul_with(kernel, ty, &c.x, &c.w, m, k, n, &mut out);
                    assert_eq!(out, reference, "{kernel:?} {ty:?} ({m},{k},{n})");
                }
                let kernel = DotKernel::detect();
                for i in [0, m / 2, m - 1] {
                    let mut alone = vec![0.0; n];
                    matmul_with(
                        kernel,
                        ty,
                        &c.x[i * k..(i + 1) * k],
                        &c.w,
                        1,
                        k,
                        n,
                        &mut alone,
                    );
                    assert_eq!(
                        alone,
                        reference[i * n..(i + 1) * n],
                        "{ty:?} row {i} of {m}"
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
