//! AVX-512 VNNI quantised matmul for small batches (2 to 8 activation rows: the verify steps
//! of speculative decoding, small decode batches; for Q4_0, Q4_1 and Q5_0 five to eight, as
//! [`super::dot16_avx512`] takes up to four): one weight row at a time against all the rows,
//! with each block's integer sum in its own 32-bit lane.
//!
//! The one-row kernel ([`super::dot_avx512`]) leaves a block's four partial sums in four lanes
//! of a 128-bit segment, and pays a transposing reduction per activation row and step to
//! gather them. Here the weights are transposed instead, once per step for all rows: the 16
//! blocks of a step are loaded as in that kernel, and a 4×4 transpose of 32-bit words within
//! each segment (eight unpacks: once for Q4_0's and Q4_1's packed nibbles, once per half for
//! the others) leaves vector `u` holding bytes `4u..4u + 4` of block `b` in lane `b`. Against activations laid out the same way ([`BlockLanes`]), eight
//! `vpdpbusd` then leave block `b`'s exact sum in lane `b`, with nothing to reduce. Q8_0's
//! signed weights go in biased by 128 (one XOR per vector, shared by all rows), and the sum
//! starts from the row's `−128 · Σ q8` per block, so it stays exact (as the panel GEMM does,
//! [`super::panel16`]).
//!
//! The float steps run four activation rows at once: a transpose of 128-bit segments turns
//! four rows' block sums (lane `b` = block `b`) into four vectors, one per group of four
//! blocks, whose lane `4r + c` is row `r`'s block `4g + c`; so one 16-lane FMA per group
//! advances the four accumulation chains of four rows, with the activation scales laid out
//! in that order beforehand (a lone fifth row runs its four chains on 128-bit vectors). The
//! arithmetic is the common one ([`super::format`]): block `b` into chain `b % 4` with
//! `fma(Σ, d·d8)` then `fma(m, s8)`, in block order, the chains summed as
//! `(a0 + a1) + (a2 + a3)`; a last partial step reads only its blocks and runs only the
//! groups that hold one. So results are bit-identical to every other kernel.
//!
//! Per step of 16 blocks an activation row costs eight `vpdpbusd` and a quarter of the four
//! rows' float steps, where the one-row kernel spends about forty instructions per row.
//!
//! Where a row's last step holds one to four blocks (576 and 640 weights: 18 and 20 blocks),
//! four consecutive weight rows share that step, as in the one-row kernel
//! ([`super::dot_avx512`]): lane `4s + j` holds block `j` of row `s`'s tail, the activations'
//! first four lanes are broadcast to the four segments, and after the transpose of segments,
//! vector `s` holds the tails of row `s` for the four activation rows ([`tail_quad`]).

use std::arch::x86_64::*;

use super::dot_avx512::{
    block_offsets, halves, halves_of, load4, scales16, segments, step_start, tail_quad_offsets,
    Lane64, QsLayout, QUAD as WEIGHT_QUAD, STEP,
};
use super::format::{Format, CHAINS};
use super::matmul::OutCols;
use super::q4_1::QK;
use super::q8_1::BlockQ8_1;

/// Activation rows whose float steps run together (one per 128-bit segment).
const QUAD: usize = 4;

/// Most activation rows the kernel takes in one pass over the weights.
pub(super) const MAX_ROWS: usize = 8;

/// Sixteen 32-bit values, aligned for one 512-bit load.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
pub(super) struct I32x16(pub [i32; 16]);

/// Sixteen f32 values, aligned for one 512-bit load.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
pub(super) struct F32x16(pub [f32; 16]);

/// Up to [`MAX_ROWS`] activation rows in the kernel's order, made once per input: per row and
/// step of 16 blocks, eight lanes where lane `t` holds bytes `4t..4t + 4` of block `b` at
/// bytes `4b..4b + 4`, and every block's `−128 · Σ q8`; per group of four rows (a quad), step
/// and group `g` of four blocks, `d8` and `s8` of row `4q + r`'s block `4g + c` at lane
/// `4r + c`. Blocks past the row's end and rows past `m` are zeros.
#[derive(Debug, Clone)]
pub(super) struct BlockLanes {
    m: usize,
    steps: usize,
    lanes: Vec<Lane64>,
    bias: Vec<I32x16>,
    d8: Vec<F32x16>,
    s8: Vec<F32x16>,
}

impl BlockLanes {
    /// The layout of `m` rows of `nb` Q8_1 blocks (`blocks` holds `m * nb`).
    ///
    /// # Panics
    /// If `m` is more than [`MAX_ROWS`] or `blocks` is not `m * nb` blocks.
    pub(super) fn new(blocks: &[BlockQ8_1], m: usize, nb: usize) -> Self {
        assert!(
            m <= MAX_ROWS,
            "block-lane kernel: {m} rows, at most {MAX_ROWS}"
        );
        assert_eq!(blocks.len(), m * nb, "block-lane kernel: not m * nb blocks");
        let steps = nb.div_ceil(STEP);
        let quads = m.div_ceil(QUAD);
        let mut lanes = vec![Lane64([0; 64]); m * steps * 8];
        let mut bias = vec![I32x16::default(); m * steps];
        let mut d8 = vec![F32x16::default(); quads * steps * CHAINS];
        let mut s8 = vec![F32x16::default(); quads * steps * CHAINS];
        for i in 0..m {
            for (b, x) in blocks[i * nb..(i + 1) * nb].iter().enumerate() {
                let (step, lane) = (b / STEP, b % STEP);
                let at = (i * steps + step) * 8;
                for (t, l) in lanes[at..at + 8].iter_mut().enumerate() {
                    l.0[4 * lane..4 * lane + 4].copy_from_slice(&x.qs[4 * t..4 * t + 4]);
                }
                bias[i * steps + step].0[lane] = -128 * x.qs.iter().map(|&q| q as i32).sum::<i32>();
                let (q, r) = (i / QUAD, i % QUAD);
                let (g, c) = (lane / CHAINS, lane % CHAINS);
                let at = (q * steps + step) * CHAINS + g;
                d8[at].0[CHAINS * r + c] = x.d;
                s8[at].0[CHAINS * r + c] = x.s;
            }
        }
        Self {
            m,
            steps,
            lanes,
            bias,
            d8,
            s8,
        }
    }

    /// Row `i`'s eight lanes of step `step`.
    #[inline(always)]
    fn lanes(&self, i: usize, step: usize) -> &[Lane64] {
        let at = (i * self.steps + step) * 8;
        &self.lanes[at..at + 8]
    }

    /// Quad `q`'s activation scales (`d8`, `s8`) of group `g` of step `step`.
    #[inline(always)]
    fn scales(&self, q: usize, step: usize, g: usize) -> (&F32x16, &F32x16) {
        let at = (q * self.steps + step) * CHAINS + g;
        (&self.d8[at], &self.s8[at])
    }
}

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` and the activation rows of `x`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C available; `w` is `rows` rows of `nb` blocks of
/// `F`; `x` was made from rows of `nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    x: &BlockLanes,
    out: &mut OutCols,
) {
    debug_assert_eq!(x.steps, nb.div_ceil(STEP));
    // SAFETY (all arms): by the contract above.
    unsafe {
        match x.m.div_ceil(QUAD) {
            0 => {}
            1 => rows_in_quads::<F, 1>(w, rows, nb, x, out),
            _ => rows_in_quads::<F, 2>(w, rows, nb, x, out),
        }
    }
}

/// [`rows`] for `Q` quads of activation rows.
///
/// # Safety
/// As [`rows`]; `x` holds at most `4 Q` rows.
#[inline(always)]
unsafe fn rows_in_quads<F: Format, const Q: usize>(
    w: &[u8],
    rows: usize,
    nb: usize,
    x: &BlockLanes,
    out: &mut OutCols,
) {
    let row_bytes = nb * F::BLOCK_BYTES;
    debug_assert_eq!(w.len(), rows * row_bytes);
    debug_assert!(x.m <= QUAD * Q);
    let tail = nb % STEP;
    let quads = if (1..=CHAINS).contains(&tail) {
        rows / WEIGHT_QUAD
    } else {
        0
    };
    for wq in 0..quads {
        let j = wq * WEIGHT_QUAD;
        let rows4 = &w[j * row_bytes..(j + WEIGHT_QUAD) * row_bytes];
        // SAFETY: four rows of nb blocks whose last step holds 1 to 4; x holds nb blocks per
        // row; features by contract.
        let acc = unsafe { dot_quad::<F, Q>(rows4, nb, x) };
        for (jj, a) in acc.iter().enumerate() {
            // SAFETY: AVX-512F by contract.
            unsafe { store_chains(a, x.m, j + jj, out) };
        }
    }
    let done = quads * WEIGHT_QUAD;
    for (j, wr) in w[done * row_bytes..]
        .chunks_exact(row_bytes.max(1))
        .take(rows - done)
        .enumerate()
    {
        // SAFETY: wr is nb blocks; x holds nb blocks per row; features by contract.
        let acc = unsafe { dot::<F, Q>(wr, nb, x) };
        // SAFETY: AVX-512F by contract.
        unsafe { store_chains(&acc, x.m, done + j, out) };
    }
}

/// Writes weight row `j`'s results for the `m` activation rows: per quad, the sums of the
/// four chains of each row (lane `4r + c` = chain `c` of row `4q + r`).
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
unsafe fn store_chains<const Q: usize>(acc: &[__m512; Q], m: usize, j: usize, out: &mut OutCols) {
    for (q, a) in acc.iter().enumerate() {
        let mut lanes = F32x16::default();
        // SAFETY: lanes is 64 aligned bytes; AVX-512F by the caller's contract.
        unsafe { _mm512_store_ps(lanes.0.as_mut_ptr(), *a) };
        for (r, c) in lanes.0.chunks_exact(CHAINS).enumerate() {
            let i = QUAD * q + r;
            if i < m {
                out.set(i, j, (c[0] + c[1]) + (c[2] + c[3]));
            }
        }
    }
}

/// Four consecutive weight rows (`rows4`) against every row of `x`, for rows whose last step
/// holds one to four blocks: each row's whole steps as in [`dot`], then the four tails as one
/// step ([`tail_quad`]) instead of four mostly empty ones.
#[inline(always)]
unsafe fn dot_quad<F: Format, const Q: usize>(
    rows4: &[u8],
    nb: usize,
    x: &BlockLanes,
) -> [[__m512; Q]; WEIGHT_QUAD] {
    let row_bytes = nb * F::BLOCK_BYTES;
    // SAFETY (whole function): as `dot` per row; the tails are `tail_quad`'s contract.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); Q]; WEIGHT_QUAD];
        let offsets = block_offsets::<F>();
        let whole = nb / STEP;
        for (wr, acc) in rows4.chunks_exact(row_bytes).zip(&mut acc) {
            for step in 0..whole {
                step16::<F, Q, false>(wr, step, STEP, offsets, x, acc);
            }
        }
        tail_quad::<F, Q>(rows4, row_bytes, whole, nb - whole * STEP, x, &mut acc);
        acc
    }
}

/// The last `count` (1 to 4) blocks of four weight rows as one step: lane `4s + j` holds block
/// `j` of row `s`'s tail, against the activations' tail blocks broadcast to the four
/// segments, so group `s` of the block sums is row `s`'s tail, added to row `s`'s chains as
/// the one group of a partial step would be (block `16 step + j` into chain `j`).
///
/// # Safety
/// As [`dot`]; `rows4` holds four rows of `row_bytes` bytes whose blocks from `16 step` on
/// are the last `count` ≤ 4; `x`'s rows hold step `step`.
#[inline(always)]
unsafe fn tail_quad<F: Format, const Q: usize>(
    rows4: &[u8],
    row_bytes: usize,
    step: usize,
    count: usize,
    x: &BlockLanes,
    acc: &mut [[__m512; Q]; WEIGHT_QUAD],
) {
    // SAFETY (whole function): only blocks j < count of each row's tail are read (masked
    // loads and gather); features by the caller's contract.
    unsafe {
        let base = rows4.as_ptr().add(step * STEP * F::BLOCK_BYTES);
        let blocks: [[(bool, *const u8); 4]; 4] = [0, 1, 2, 3].map(|j| {
            [0, 1, 2, 3].map(|s| {
                (
                    j < count,
                    base.wrapping_add(s * row_bytes + j * F::BLOCK_BYTES),
                )
            })
        });
        let (lo, hi) = weights::<F, _>(&AnyBlocks(blocks));
        let (offsets, valid) = tail_quad_offsets::<F>(row_bytes, count);
        let (d, m) = scales16::<F, true>(base, offsets, valid);
        let mut scales = [F32x16::default(), F32x16::default()];
        _mm512_store_ps(scales[0].0.as_mut_ptr(), d);
        _mm512_store_ps(scales[1].0.as_mut_ptr(), m);
        let w = Step {
            lo,
            hi,
            step,
            groups: 1,
        };
        let (d, m) = (scales[0].0.as_ptr(), scales[1].0.as_ptr());
        for q in 0..Q {
            let sums = block_sums::<F, true>(x, q, &w);
            let (d8, s8) = x.scales(q, step, 0);
            if x.m - QUAD * q == 1 {
                // A lone row: its chains on 128-bit vectors, as in `quad`.
                for (s, acc) in acc.iter_mut().enumerate() {
                    let mut a = _mm512_castps512_ps128(acc[q]);
                    let dd = _mm_mul_ps(_mm_load_ps(d.add(CHAINS * s)), _mm_load_ps(d8.0.as_ptr()));
                    a = _mm_fmadd_ps(segment(sums[0], s), dd, a);
                    if F::HAS_OFFSET {
                        let ms = _mm_load_ps(m.add(CHAINS * s));
                        a = _mm_fmadd_ps(ms, _mm_load_ps(s8.0.as_ptr()), a);
                    }
                    acc[q] = _mm512_castps128_ps512(a);
                }
                continue;
            }
            // Vector s: lane 4r + c = activation row r's sum with row s's tail block c.
            let by_weight_row = transpose_segments(sums);
            for (s, (t, acc)) in by_weight_row.into_iter().zip(acc.iter_mut()).enumerate() {
                let ds = _mm512_broadcast_f32x4(_mm_load_ps(d.add(CHAINS * s)));
                let dd = _mm512_mul_ps(ds, _mm512_load_ps(d8.0.as_ptr()));
                acc[q] = _mm512_fmadd_ps(t, dd, acc[q]);
                if F::HAS_OFFSET {
                    let ms = _mm512_broadcast_f32x4(_mm_load_ps(m.add(CHAINS * s)));
                    acc[q] = _mm512_fmadd_ps(ms, _mm512_load_ps(s8.0.as_ptr()), acc[q]);
                }
            }
        }
    }
}

/// Weight row `wr` against every row of `x`: per quad, the four chains of its four rows (lane
/// `4r + c` = chain `c` of row `4q + r`).
#[inline(always)]
unsafe fn dot<F: Format, const Q: usize>(wr: &[u8], nb: usize, x: &BlockLanes) -> [__m512; Q] {
    // SAFETY (whole function): steps cover the row's blocks; features by the caller's
    // contract.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); Q];
        let offsets = block_offsets::<F>();
        let whole = nb / STEP;
        for step in 0..whole {
            step16::<F, Q, false>(wr, step, STEP, offsets, x, &mut acc);
        }
        if nb > whole * STEP {
            step16::<F, Q, true>(wr, whole, nb - whole * STEP, offsets, x, &mut acc);
        }
        acc
    }
}

/// Blocks `16 step..16 step + count` of weight row `wr` against every row of `x`, added to the
/// chains. A partial step (`PARTIAL`, `count < 16`) reads only its blocks and runs only the
/// groups that hold one.
///
/// # Safety
/// As [`dot`]; `count` blocks from block `16 step` exist in the weight row.
#[inline(always)]
unsafe fn step16<F: Format, const Q: usize, const PARTIAL: bool>(
    wr: &[u8],
    step: usize,
    count: usize,
    offsets: __m512i,
    x: &BlockLanes,
    acc: &mut [__m512; Q],
) {
    // SAFETY (whole function): by the caller's contract; masked loads and the masked gather
    // touch only blocks below `count`; every activation index is below `x.m` and the step
    // below `x.steps`.
    unsafe {
        let (base, valid) = step_start::<F, PARTIAL>(wr, step, count);
        let (lo, hi) = weights::<F, _>(&RowStep::<PARTIAL> { base, count });
        let (d, m) = scales16::<F, PARTIAL>(base, offsets, valid);
        let mut scales = [F32x16::default(), F32x16::default()];
        _mm512_store_ps(scales[0].0.as_mut_ptr(), d);
        _mm512_store_ps(scales[1].0.as_mut_ptr(), m);
        let groups = if PARTIAL { count.div_ceil(CHAINS) } else { 4 };
        // One call per quad with a constant index, so the accumulators stay in registers.
        let w = Step {
            lo,
            hi,
            step,
            groups,
        };
        acc[0] = quad::<F>(x, 0, &w, &scales, acc[0]);
        if Q > 1 {
            acc[1] = quad::<F>(x, 1, &w, &scales, acc[1]);
        }
    }
}

/// A step's weights as the rows read them: vector `u` of `lo` (`hi`) holds bytes `4u..4u + 4`
/// (`16 + 4u..`) of block `b` in lane `b`, as unsigned bytes; and how many of the four groups
/// of blocks the step holds.
struct Step {
    lo: [__m512i; 4],
    hi: [__m512i; 4],
    step: usize,
    groups: usize,
}

/// Where a step's sixteen blocks are read from: vector `j`'s four blocks `j`, `4 + j`,
/// `8 + j`, `12 + j`, one per 128-bit segment.
trait StepBlocks {
    /// 16 bytes at byte `at` of vector `j`'s blocks.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL available; the blocks the source reads are readable.
    unsafe fn segments<F: Format>(&self, j: usize, at: usize) -> __m512i;
    /// The unpacked `q` of vector `j`'s blocks (weights 0..16, 16..32).
    ///
    /// # Safety
    /// As [`StepBlocks::segments`].
    unsafe fn halves<F: Format>(&self, j: usize) -> (__m512i, __m512i);
}

/// Step `16 step` of one weight row: its blocks in order from `base`; with `PARTIAL`, only the
/// first `count` read (the others zeros).
struct RowStep<const PARTIAL: bool> {
    base: *const u8,
    count: usize,
}

impl<const PARTIAL: bool> StepBlocks for RowStep<PARTIAL> {
    #[inline(always)]
    unsafe fn segments<F: Format>(&self, j: usize, at: usize) -> __m512i {
        // SAFETY: by the caller's contract.
        unsafe { segments::<F, PARTIAL>(self.base, j, self.count, at) }
    }

    #[inline(always)]
    unsafe fn halves<F: Format>(&self, j: usize) -> (__m512i, __m512i) {
        // SAFETY: by the caller's contract.
        unsafe { halves::<F, PARTIAL>(self.base, j, self.count) }
    }
}

/// Any sixteen blocks: `[j][s]` is block `4s + j` (its start, and whether it is read; one not
/// read is zeros).
struct AnyBlocks([[(bool, *const u8); 4]; 4]);

impl StepBlocks for AnyBlocks {
    #[inline(always)]
    unsafe fn segments<F: Format>(&self, j: usize, at: usize) -> __m512i {
        // SAFETY: by the caller's contract.
        unsafe { load4::<true>(self.0[j].map(|(live, b)| (live, b.wrapping_add(at)))) }
    }

    #[inline(always)]
    unsafe fn halves<F: Format>(&self, j: usize) -> (__m512i, __m512i) {
        // SAFETY: by the caller's contract.
        unsafe { halves_of::<F, true>(self.0[j]) }
    }
}

/// A step's weights in the kernel's order ([`Step`]'s `lo`, `hi`): Q4_0 and Q4_1 are
/// transposed while packed (one transpose for both halves), the others after unpacking; Q8_0
/// biased by 128. Blocks not read are zeros (biased for Q8_0).
///
/// # Safety
/// AVX-512 F/BW/VL available; the blocks `src` reads are readable.
#[inline(always)]
unsafe fn weights<F: Format, B: StepBlocks>(src: &B) -> ([__m512i; 4], [__m512i; 4]) {
    // SAFETY: only the blocks `src` reads are read (caller's contract).
    unsafe {
        let zero = _mm512_setzero_si512();
        let (mut lo, mut hi) = ([zero; 4], [zero; 4]);
        if let QsLayout::Nibbles {
            at,
            high_bits: None,
        } = F::QS_AT
        {
            let mut packed = [zero; 4];
            for (j, p) in packed.iter_mut().enumerate() {
                *p = src.segments::<F>(j, at);
            }
            let packed = transpose_words(packed);
            let mask = _mm512_set1_epi8(0x0F);
            for u in 0..4 {
                lo[u] = _mm512_and_si512(packed[u], mask);
                hi[u] = _mm512_and_si512(_mm512_srli_epi16::<4>(packed[u]), mask);
            }
            return (lo, hi);
        }
        for j in 0..4 {
            (lo[j], hi[j]) = src.halves::<F>(j);
            if F::SIGNED {
                let bias = _mm512_set1_epi8(-128);
                lo[j] = _mm512_xor_si512(lo[j], bias);
                hi[j] = _mm512_xor_si512(hi[j], bias);
            }
        }
        (transpose_words(lo), transpose_words(hi))
    }
}

/// Quad `q` of `x` against the step's weights `w`, added to its chains `acc`; `scales` holds
/// the step's `d` and `m` in block order.
///
/// # Safety
/// AVX-512 F/BW/VNNI and FMA available; the quad and step exist in `x`.
#[inline(always)]
unsafe fn quad<F: Format>(
    x: &BlockLanes,
    q: usize,
    w: &Step,
    scales: &[F32x16; 2],
    mut acc: __m512,
) -> __m512 {
    // SAFETY: every row index is below `x.m` and the step below `x.steps` (caller's
    // contract); features by the caller's contract.
    unsafe {
        let sums = block_sums::<F, false>(x, q, w);
        let (d, m) = (scales[0].0.as_ptr(), scales[1].0.as_ptr());
        if x.m - QUAD * q == 1 {
            // A lone row (five rows in all): its four chains in lanes 0..4, on 128-bit
            // vectors, instead of a transpose and 512-bit steps for one row.
            let mut a = _mm512_castps512_ps128(acc);
            for g in 0..w.groups {
                let (d8, s8) = x.scales(q, w.step, g);
                let dd = _mm_mul_ps(_mm_load_ps(d.add(CHAINS * g)), _mm_load_ps(d8.0.as_ptr()));
                a = _mm_fmadd_ps(segment(sums[0], g), dd, a);
                if F::HAS_OFFSET {
                    let mg = _mm_load_ps(m.add(CHAINS * g));
                    a = _mm_fmadd_ps(mg, _mm_load_ps(s8.0.as_ptr()), a);
                }
            }
            return _mm512_castps128_ps512(a);
        }
        let groups_of_rows = transpose_segments(sums);
        for (g, t) in groups_of_rows.into_iter().enumerate().take(w.groups) {
            let (d8, s8) = x.scales(q, w.step, g);
            let dg = _mm512_broadcast_f32x4(_mm_load_ps(d.add(CHAINS * g)));
            let dd = _mm512_mul_ps(dg, _mm512_load_ps(d8.0.as_ptr()));
            acc = _mm512_fmadd_ps(t, dd, acc);
            if F::HAS_OFFSET {
                let mg = _mm512_broadcast_f32x4(_mm_load_ps(m.add(CHAINS * g)));
                acc = _mm512_fmadd_ps(mg, _mm512_load_ps(s8.0.as_ptr()), acc);
            }
        }
        acc
    }
}

/// Quad `q`'s exact block sums with the step's weights `w`, as f32 (vector `r`, lane `b`:
/// activation row `4q + r`, block `b`); zeros for rows past `x.m`. With `TAIL`, the
/// activations' first four blocks of the step (lanes 0..4, bias included) are broadcast to
/// the four segments, for a [`tail_quad`] step.
///
/// # Safety
/// AVX-512 F/BW/VNNI available; the quad and step exist in `x`.
#[inline(always)]
unsafe fn block_sums<F: Format, const TAIL: bool>(
    x: &BlockLanes,
    q: usize,
    w: &Step,
) -> [__m512; QUAD] {
    // SAFETY: every row index is below `x.m` and the step below `x.steps` (caller's
    // contract); features by the caller's contract.
    unsafe {
        let zero = _mm512_setzero_si512();
        let mut sums = [_mm512_setzero_ps(); QUAD];
        for (r, s) in sums.iter_mut().enumerate() {
            let i = QUAD * q + r;
            if i >= x.m {
                break;
            }
            let xl = x.lanes(i, w.step);
            let start = if F::SIGNED {
                spread::<TAIL>(_mm512_load_si512(
                    x.bias[i * x.steps + w.step].0.as_ptr() as *const __m512i
                ))
            } else {
                zero
            };
            // Two chains of four, so a lone row is not bound by vpdpbusd's latency.
            let mut a = start;
            let mut b = zero;
            for u in 0..4 {
                a = _mm512_dpbusd_epi32(a, w.lo[u], spread::<TAIL>(load(&xl[u])));
                b = _mm512_dpbusd_epi32(b, w.hi[u], spread::<TAIL>(load(&xl[4 + u])));
            }
            *s = _mm512_cvtepi32_ps(_mm512_add_epi32(a, b));
        }
        sums
    }
}

/// With `TAIL`, `v`'s first 128-bit segment in all four; otherwise `v`.
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
unsafe fn spread<const TAIL: bool>(v: __m512i) -> __m512i {
    // SAFETY: register operations only.
    unsafe {
        if TAIL {
            _mm512_shuffle_i32x4::<0>(v, v)
        } else {
            v
        }
    }
}

/// Segment `g` (0..4) of `v`.
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
unsafe fn segment(v: __m512, g: usize) -> __m128 {
    // SAFETY: register operations only.
    unsafe {
        match g {
            0 => _mm512_castps512_ps128(v),
            1 => _mm512_extractf32x4_ps::<1>(v),
            2 => _mm512_extractf32x4_ps::<2>(v),
            _ => _mm512_extractf32x4_ps::<3>(v),
        }
    }
}

/// A lane of activation bytes as a vector.
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
unsafe fn load(l: &Lane64) -> __m512i {
    // SAFETY: 64 aligned bytes.
    unsafe { _mm512_load_si512(l.0.as_ptr() as *const __m512i) }
}

/// Within every 128-bit segment, the 4×4 transpose of 32-bit words across the four vectors:
/// word `u` of vector `j` becomes word `j` of vector `u`.
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
unsafe fn transpose_words(v: [__m512i; 4]) -> [__m512i; 4] {
    // SAFETY: register operations only.
    unsafe {
        let t0 = _mm512_unpacklo_epi32(v[0], v[1]);
        let t1 = _mm512_unpackhi_epi32(v[0], v[1]);
        let t2 = _mm512_unpacklo_epi32(v[2], v[3]);
        let t3 = _mm512_unpackhi_epi32(v[2], v[3]);
        [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ]
    }
}

/// The 4×4 transpose of 128-bit segments across the four vectors: segment `g` of vector `r`
/// becomes segment `r` of vector `g`.
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
unsafe fn transpose_segments(v: [__m512; 4]) -> [__m512; 4] {
    // SAFETY: register operations only.
    unsafe {
        // [v0.0, v0.1, v1.0, v1.1], [v2.0, v2.1, v3.0, v3.1], and the same of segments 2, 3.
        let a = _mm512_shuffle_f32x4::<0x44>(v[0], v[1]);
        let b = _mm512_shuffle_f32x4::<0x44>(v[2], v[3]);
        let c = _mm512_shuffle_f32x4::<0xEE>(v[0], v[1]);
        let d = _mm512_shuffle_f32x4::<0xEE>(v[2], v[3]);
        [
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
            _mm512_shuffle_f32x4::<0x88>(c, d),
            _mm512_shuffle_f32x4::<0xDD>(c, d),
        ]
    }
}

/// Checks at compile time that a block is eight lanes of four bytes.
const _: () = assert!(QK == 8 * 4);

#[cfg(test)]
mod tests {
    use super::*;

    /// Row `i`, block `b`: `qs[v] = i + 3b + v` (wrapping), `d = b`, `s = 100 i + b`.
    fn blocks(m: usize, nb: usize) -> Vec<BlockQ8_1> {
        let mut out = Vec::new();
        for i in 0..m {
            for b in 0..nb {
                let mut x = BlockQ8_1::default();
                for (v, q) in x.qs.iter_mut().enumerate() {
                    *q = (i + 3 * b + v) as u8 as i8;
                }
                x.d = b as f32;
                x.s = (100 * i + b) as f32;
                out.push(x);
            }
        }
        out
    }

    #[test]
    fn rows_are_laid_out_one_block_per_lane() {
        let (m, nb) = (6, 18);
        let x = BlockLanes::new(&blocks(m, nb), m, nb);
        assert_eq!(x.steps, 2);
        for i in 0..m {
            for b in 0..2 * STEP {
                let (step, lane) = (b / STEP, b % STEP);
                let lanes = x.lanes(i, step);
                let bias = x.bias[i * x.steps + step].0[lane];
                let (q, r, g, c) = (i / QUAD, i % QUAD, lane / CHAINS, lane % CHAINS);
                let (d8, s8) = x.scales(q, step, g);
                let (d8, s8) = (d8.0[CHAINS * r + c], s8.0[CHAINS * r + c]);
                if b >= nb {
                    // Padding: zeros everywhere, so a partial step adds nothing.
                    assert!(lanes.iter().all(|l| l.0[4 * lane..4 * lane + 4] == [0; 4]));
                    assert_eq!((bias, d8, s8), (0, 0.0, 0.0));
                    continue;
                }
                for (t, l) in lanes.iter().enumerate() {
                    for v in 0..4 {
                        assert_eq!(l.0[4 * lane + v], (i + 3 * b + 4 * t + v) as u8 as i8);
                    }
                }
                let sum: i32 = (0..32).map(|v| (i + 3 * b + v) as u8 as i8 as i32).sum();
                assert_eq!(bias, -128 * sum);
                assert_eq!((d8, s8), (b as f32, (100 * i + b) as f32));
            }
        }
        // Rows 6 and 7 of the second quad are padding too.
        let (d8, _) = x.scales(1, 0, 0);
        assert_eq!(d8.0[8..], [0.0; 8]);
    }

    #[test]
    #[should_panic(expected = "at most 8")]
    fn refuses_more_rows_than_a_pass_takes() {
        BlockLanes::new(&blocks(9, 1), 9, 1);
    }
}
