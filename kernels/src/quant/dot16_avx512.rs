//! AVX-512 VNNI decode and small batches for Q4_0, Q4_1 and Q5_0 (below the 16-row panel
//! GEMM: decode, and the verify steps of speculative decoding): sixteen weight rows at a time
//! against up to four activation rows per pass, each weight row's result in its own lane. The
//! 512-bit form of [`super::dot8_avx2`].
//!
//! The one-row kernel ([`super::dot_avx512`]) puts sixteen blocks of one weight row in a step
//! and needs the activations re-laid in its order; its cost per block is one weight row's
//! share of a 16-block step. Here block `b` of sixteen weight rows is the step: one 512-bit
//! register takes the 16 nibble bytes of rows `t`, `t + 4`, `t + 8` and `t + 12` (one per
//! 128-bit segment), one `and` and one shift unpack 32 weights of each (Q5_0's fifth bits by a
//! byte mask, as the one-row kernel spreads them), and two `vpdpbusd` against the activation
//! block's halves (broadcast to the four segments; the unpacked weights serve every
//! activation row) leave each row's products in its own segment. The one-row kernel's 4×4
//! transposing reduction then gives the sixteen rows' exact block sums in one vector, lane `r`
//! = row `r`, one gather their sixteen `d` (and Q4_1's `m`), and the float steps run on
//! sixteen rows at once: chain `b % 4` of lane `r` is the common arithmetic's chain of row `r`
//! ([`super::format`]), FMA for FMA, so results are the same bits as every other kernel's.
//! The activations are read as the file's Q8_1 blocks, with no per-input re-layout.
//!
//! On a 2-core Ice Lake Xeon (AVX-512 VNNI, no AMX, 16.8 GB/s), the 210 weight matmuls of a
//! SmolLM2 step (criterion `q{4_0,4_1,5_0}_step_30_layers_m{1,2,4}/avx512vnni`, five runs
//! alternating with a build on the one-row and block-per-lane kernels, medians of the runs'
//! ratios) took 0.91, 1.00 and 0.91 of the time at one row, 0.85, 0.87 and 0.85 at two,
//! 0.84, 0.78 and 0.90 at four; the AVX2 eight-row kernel ran level with it at one row.

use std::arch::x86_64::*;

use super::dot_avx512::{block_products_of, halves_of, scales16, transpose_sums};
use super::format::{Format, CHAINS, WEIGHTS_AHEAD};
use super::matmul::{OutCols, XRow};
use crate::prefetch;

/// Weight rows per pass.
const ROWS: usize = 16;

/// Activation rows per pass over the weights. Matmul sends this kernel up to this many rows
/// and five to eight to the block-per-lane kernel ([`super::dot_lanes_avx512`]), which takes
/// them in one pass: a second pass here streams the weights again (criterion
/// `q{4_0,4_1,5_0}_step_30_layers_m5`, 2-core Ice Lake Xeon: 12.1–19.9 ms against 8.0–15.5).
pub(super) const PASS_ROWS: usize = 4;

/// Whether this kernel reads `F` (as [`super::dot8_avx2::reads`]: Q4_0, Q4_1 and Q5_0).
pub(super) const fn reads<F: Format>() -> bool {
    super::dot8_avx2::reads::<F>()
}

/// Whether rows of `row_bytes` are short enough for the scale gather's 32-bit offsets: row
/// 15's block starts at most `i32::MAX` bytes after row 0's (rows up to about 143 MB, far
/// longer than any model's).
pub(super) const fn offsets_fit(row_bytes: usize) -> bool {
    row_bytes <= i32::MAX as usize / (ROWS - 1)
}

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` and the activation rows `xs`:
/// whole groups of sixteen weight rows here, the rest on the AVX2 eight-row kernel.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C available; [`reads`]`::<F>()`; `w` is `rows` rows
/// of `nb` blocks of `F`; every `xs` row holds `nb` blocks (and `nb` values of `d` and `s`);
/// `out` has `xs.len()` activation rows; [`offsets_fit`]`(nb * F::BLOCK_BYTES)`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[XRow<'_>],
    out: &mut OutCols,
) {
    let row_bytes = nb * F::BLOCK_BYTES;
    debug_assert_eq!(w.len(), rows * row_bytes);
    debug_assert!(reads::<F>());
    debug_assert!(offsets_fit(row_bytes));
    let grouped = rows / ROWS * ROWS;
    let mut i = 0;
    while i < xs.len() {
        // SAFETY (all arms): by the caller's contract; the groups are whole rows of `w`.
        i += unsafe {
            match &xs[i..] {
                [x] => groups_of::<F, 1>(w, grouped, nb, [*x], i, out),
                [x0, x1] => groups_of::<F, 2>(w, grouped, nb, [*x0, *x1], i, out),
                [x0, x1, x2] => groups_of::<F, 3>(w, grouped, nb, [*x0, *x1, *x2], i, out),
                [x0, x1, x2, x3, ..] => {
                    groups_of::<F, 4>(w, grouped, nb, [*x0, *x1, *x2, *x3], i, out)
                }
                [] => 0,
            }
        };
    }
    if grouped < rows {
        let tail = &w[grouped * row_bytes..];
        let mut rest = out.skip(grouped);
        // SAFETY: by the caller's contract, for the rows after the groups (AVX-VNNI is not
        // asked for: not every AVX-512 VNNI CPU has it).
        unsafe { super::dot8_avx2::rows::<F>(false, tail, rows - grouped, nb, xs, &mut rest) };
    }
}

/// Every group of sixteen rows of `w` (`rows` a multiple of sixteen) against the `R`
/// activation rows from row `i`; returns `R`.
#[inline(always)]
unsafe fn groups_of<F: Format, const R: usize>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: [XRow<'_>; R],
    i: usize,
    out: &mut OutCols,
) -> usize {
    let row_bytes = nb * F::BLOCK_BYTES;
    for (g, group) in w[..rows * row_bytes]
        .chunks_exact((ROWS * row_bytes).max(1))
        .enumerate()
    {
        // SAFETY: `group` is sixteen rows of nb blocks; features and `xs` by the caller's
        // contract.
        let totals = unsafe { group_dot::<F, R>(group.as_ptr(), row_bytes, nb, &xs) };
        for (k, row) in totals.into_iter().enumerate() {
            for (t, v) in row.into_iter().enumerate() {
                out.set(i + k, g * ROWS + t, v);
            }
        }
    }
    R
}

/// The sixteen rows from `base` (`row_bytes` apart) against each of `xs`.
#[inline(always)]
unsafe fn group_dot<F: Format, const R: usize>(
    base: *const u8,
    row_bytes: usize,
    nb: usize,
    xs: &[XRow<'_>; R],
) -> [[f32; ROWS]; R] {
    // The bytes of four blocks of sixteen rows, in cache lines: what one step consumes.
    let step_lines = (ROWS * CHAINS * F::BLOCK_BYTES).div_ceil(prefetch::LINE);
    let ahead = WEIGHTS_AHEAD.max(ROWS * row_bytes);
    // SAFETY (whole function): blocks b..b + 4 (or the nb - b < 4 remaining) exist in all
    // sixteen rows and in every `xs` row; features by the caller's contract.
    unsafe {
        let offsets = row_offsets(row_bytes);
        // The four chains as four named variables: an array indexed by a variable (the
        // tail) would keep them on the stack.
        let [mut a0, mut a1, mut a2, mut a3] = [[_mm512_setzero_ps(); R]; CHAINS];
        let mut b = 0;
        while b + CHAINS <= nb {
            // The group is read as sixteen interleaved streams; ask for one step's worth of
            // the bytes a group further along as if they were read in order, so the next
            // group arrives while this one is multiplied.
            prefetch::lines(
                base.wrapping_add(b * ROWS * F::BLOCK_BYTES + ahead),
                step_lines,
            );
            a0 = block::<F, R>(base, row_bytes, offsets, b, xs, a0);
            a1 = block::<F, R>(base, row_bytes, offsets, b + 1, xs, a1);
            a2 = block::<F, R>(base, row_bytes, offsets, b + 2, xs, a2);
            a3 = block::<F, R>(base, row_bytes, offsets, b + 3, xs, a3);
            b += CHAINS;
        }
        let left = nb - b;
        if left > 0 {
            a0 = block::<F, R>(base, row_bytes, offsets, b, xs, a0);
        }
        if left > 1 {
            a1 = block::<F, R>(base, row_bytes, offsets, b + 1, xs, a1);
        }
        if left > 2 {
            a2 = block::<F, R>(base, row_bytes, offsets, b + 2, xs, a2);
        }
        let mut r = [[0.0f32; ROWS]; R];
        for (i, out) in r.iter_mut().enumerate() {
            let total = _mm512_add_ps(_mm512_add_ps(a0[i], a1[i]), _mm512_add_ps(a2[i], a3[i]));
            _mm512_storeu_ps(out.as_mut_ptr(), total);
        }
        r
    }
}

/// Byte offsets of the sixteen rows from row 0 (lane `r` = row `r`), for the scale gather.
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
unsafe fn row_offsets(row_bytes: usize) -> __m512i {
    // Within i32 times 15 by the caller's contract ([`offsets_fit`]).
    let r = row_bytes as i32;
    // SAFETY: AVX-512F by the caller's contract.
    unsafe {
        _mm512_mullo_epi32(
            _mm512_set1_epi32(r),
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        )
    }
}

/// Block `b` of the sixteen rows added to one chain of each activation row (lane `r` = row
/// `r`).
#[inline(always)]
unsafe fn block<F: Format, const R: usize>(
    base: *const u8,
    row_bytes: usize,
    offsets: __m512i,
    b: usize,
    xs: &[XRow<'_>; R],
    mut acc: [__m512; R],
) -> [__m512; R] {
    // SAFETY (whole function): block b of the sixteen rows and of every xs row exists
    // (caller's contract).
    unsafe {
        let first = base.add(b * F::BLOCK_BYTES);
        let isum = block_sums::<F, R>(first, row_bytes, xs, b);
        let (d, m) = scales16::<F, false>(first, offsets, 0xFFFF);
        for i in 0..R {
            acc[i] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(isum[i]),
                _mm512_mul_ps(d, _mm512_set1_ps(xs[i].d[b])),
                acc[i],
            );
            if F::HAS_OFFSET {
                acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[i].s[b]), acc[i]);
            }
        }
        acc
    }
}

/// The exact `Σ q·q8` of block `b` of the sixteen rows (lane `r` = row `r`) against each of
/// `xs`: the blocks of rows `t`, `t + 4`, `t + 8`, `t + 12` (from `first`, row 0's) in one
/// register per `t`, against the activation halves broadcast to the four segments.
#[inline(always)]
unsafe fn block_sums<F: Format, const R: usize>(
    first: *const u8,
    row_bytes: usize,
    xs: &[XRow<'_>; R],
    b: usize,
) -> [__m512i; R] {
    // SAFETY (whole function): the sixteen blocks and block b of every xs row exist
    // (caller's contract).
    unsafe {
        // (Loops, not closures, around intrinsics: a closure does not get the caller's
        // target features.)
        let mut x_lo = [_mm512_setzero_si512(); R];
        let mut x_hi = [_mm512_setzero_si512(); R];
        for ((lo, hi), x) in x_lo.iter_mut().zip(&mut x_hi).zip(xs) {
            let p = x.blocks[b].qs.as_ptr();
            *lo = _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i));
            *hi = _mm512_broadcast_i32x4(_mm_loadu_si128(p.add(16) as *const __m128i));
        }
        let mut sums = [[_mm512_setzero_si512(); 4]; R];
        for t in 0..4 {
            let row = first.add(t * row_bytes);
            let quad = row_bytes * 4;
            let halves = halves_of::<F, false>([
                (true, row),
                (true, row.add(quad)),
                (true, row.add(2 * quad)),
                (true, row.add(3 * quad)),
            ]);
            // The unpacked weights serve every activation row.
            for ((s, &lo), &hi) in sums.iter_mut().zip(&x_lo).zip(&x_hi) {
                s[t] = block_products_of::<F>(halves, lo, hi);
            }
        }
        let mut isum = [_mm512_setzero_si512(); R];
        for (total, s) in isum.iter_mut().zip(sums) {
            *total = transpose_sums(s);
        }
        isum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_fit_exactly_while_row_15_is_within_i32() {
        let longest = i32::MAX as usize / (ROWS - 1);
        assert!(offsets_fit(longest));
        assert!((ROWS - 1) * longest <= i32::MAX as usize);
        assert!(!offsets_fit(longest + 1));
        assert!((ROWS - 1) * (longest + 1) > i32::MAX as usize);
    }
}
