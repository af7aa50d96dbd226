//! AVX2 decode and small batches for Q4_0, Q4_1 and Q5_0 (below the panel GEMM: decode, and
//! the verify steps of speculative decoding): eight weight rows at a time against up to four
//! activation rows per pass, each weight row's result in its own lane.
//!
//! The row kernel ([`super::dot_avx2`]) sums each block's eight i32 partial sums per weight
//! row with a `hadd` tree and gathers four blocks' scales through the stack; on a core where
//! the step is bound by arithmetic, not by the weight stream (an AVX2-only EPYC,
//! docs/benchmarks.md), that per-row work sets the price. llama.cpp repacks Q4_0 at load into
//! an eight-row interleaved layout for the same reason. Here the layout stays the file's (the
//! weights are mapped, not copied) and eight rows share each block's work: one 256-bit load
//! takes the 16 nibble bytes of a block from two rows (`t` and `t + 4`), one `and` and one
//! shift unpack 32 weights of each, and two `maddubs` against the activation block's halves
//! (broadcast to both 128-bit lanes; the unpacked pair serves every activation row) leave
//! each row's products in its own half (Q5_0's fifth bits are spread into each pair as the
//! row kernel spreads them). Three `hadd`s give the eight rows' exact block sums in one
//! vector, lane `t` = row `t`, and the float steps run on eight rows at once: chain `b % 4`
//! of lane `t` is the common arithmetic's chain for row `t` ([`super::format`]), FMA for FMA,
//! so results are the same bits as every other kernel's. On that EPYC a speculative step of
//! 1 + k tokens of SmolLM2 Q4_1 measured 1.30, 1.74, 2.21 and 2.85 one-token steps for k = 1
//! to 4 (the engine's own timing at start, one run), where the row kernel's gave 1.58, 2.13,
//! 2.73 and 3.65.
//!
//! Q8_0 stays on the row kernel: the same scheme for its signed bytes (one register per row,
//! a transposing reduction of the eight) decoded SmolLM2 Q8_0 at 0.89× the row kernel's speed
//! (132.6–139.1 against 143.4–158.6 tokens/s, three alternating rounds, the AVX2-only EPYC).

use std::arch::x86_64::*;

use super::dot_avx512::QsLayout;
use super::format::{Format, CHAINS, WEIGHTS_AHEAD};
use super::matmul::{OutCols, XRow};
use crate::prefetch;

/// Weight rows per pass.
const ROWS: usize = 8;

/// Whether this kernel reads `F`: 4-bit weights (with Q5_0's fifth bits or without) and an
/// `m` (if any) in the two bytes after `d`, i.e. Q4_0, Q4_1 and Q5_0.
pub(super) const fn reads<F: Format>() -> bool {
    matches!(
        (F::QS_AT, F::M_AT),
        (QsLayout::Nibbles { .. }, None | Some(2))
    )
}

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` and the activation rows `xs`:
/// whole groups of eight weight rows here, the rest on the row kernel.
///
/// # Safety
/// AVX2, FMA and F16C available (and AVX-VNNI when `vnni`); [`reads`]`::<F>()`; `w` is `rows`
/// rows of `nb` blocks of `F`; every `xs` row holds `nb` blocks (and `nb` values of `d` and
/// `s`); `out` has `xs.len()` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows<F: Format>(
    vnni: bool,
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[XRow<'_>],
    out: &mut OutCols,
) {
    let row_bytes = nb * F::BLOCK_BYTES;
    debug_assert_eq!(w.len(), rows * row_bytes);
    debug_assert!(reads::<F>());
    let grouped = rows / ROWS * ROWS;
    // SAFETY (both calls): by the caller's contract; the groups are whole rows of `w`.
    unsafe {
        if vnni {
            groups_vnni::<F>(w, grouped, nb, xs, out);
        } else {
            groups::<F, false>(w, grouped, nb, xs, out);
        }
    }
    if grouped < rows {
        let tail = &w[grouped * row_bytes..];
        let mut rest = out.skip(grouped);
        // SAFETY: by the caller's contract, for the rows after the groups.
        unsafe {
            if vnni {
                super::dot_avx2::rows_vnni::<F>(tail, rows - grouped, nb, xs, &mut rest);
            } else {
                super::dot_avx2::rows::<F>(tail, rows - grouped, nb, xs, &mut rest);
            }
        }
    }
}

/// [`groups`] with AVX-VNNI's `vpdpbusd`.
///
/// # Safety
/// As [`rows`], with AVX-VNNI available, `rows` a multiple of eight and [`reads`] true.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn groups_vnni<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[XRow<'_>],
    out: &mut OutCols,
) {
    // SAFETY: by the caller's contract.
    unsafe { groups::<F, true>(w, rows, nb, xs, out) }
}

/// Every group of eight rows of `w` (`rows` is a multiple of eight) against `xs`, up to four
/// activation rows per pass over the groups.
#[inline(always)]
unsafe fn groups<F: Format, const VNNI: bool>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[XRow<'_>],
    out: &mut OutCols,
) {
    let mut i = 0;
    while i < xs.len() {
        // SAFETY (all arms): by the caller's contract.
        i += unsafe {
            match &xs[i..] {
                [x] => groups_of::<F, VNNI, 1>(w, rows, nb, [*x], i, out),
                [x0, x1] => groups_of::<F, VNNI, 2>(w, rows, nb, [*x0, *x1], i, out),
                [x0, x1, x2] => groups_of::<F, VNNI, 3>(w, rows, nb, [*x0, *x1, *x2], i, out),
                [x0, x1, x2, x3, ..] => {
                    groups_of::<F, VNNI, 4>(w, rows, nb, [*x0, *x1, *x2, *x3], i, out)
                }
                [] => 0,
            }
        };
    }
}

/// [`groups`] for the `R` activation rows from row `i`; returns `R`.
#[inline(always)]
unsafe fn groups_of<F: Format, const VNNI: bool, const R: usize>(
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
        // SAFETY: `group` is eight rows of nb blocks; features and `xs` by the caller's
        // contract.
        let totals = unsafe { group_dot::<F, VNNI, R>(group.as_ptr(), row_bytes, nb, &xs) };
        for (k, row) in totals.into_iter().enumerate() {
            for (t, v) in row.into_iter().enumerate() {
                out.set(i + k, g * ROWS + t, v);
            }
        }
    }
    R
}

/// The eight rows from `base` (`row_bytes` apart) against each of `xs`.
#[inline(always)]
unsafe fn group_dot<F: Format, const VNNI: bool, const R: usize>(
    base: *const u8,
    row_bytes: usize,
    nb: usize,
    xs: &[XRow<'_>; R],
) -> [[f32; ROWS]; R] {
    // The bytes of four blocks of eight rows, in cache lines: what one step consumes.
    let step_lines = (ROWS * CHAINS * F::BLOCK_BYTES).div_ceil(prefetch::LINE);
    let ahead = WEIGHTS_AHEAD.max(ROWS * row_bytes);
    let rows = Rows {
        stride: row_bytes,
        stride3: 3 * row_bytes,
    };
    // SAFETY (whole function): blocks b..b + 4 (or the nb - b < 4 remaining) exist in all
    // eight rows and in every `xs` row; features by the caller's contract.
    unsafe {
        // The four chains (each for the R activation rows) as four named variables: an
        // array indexed by a variable (the tail) would keep them on the stack.
        let [mut a0, mut a1, mut a2, mut a3] = [[_mm256_setzero_ps(); R]; CHAINS];
        let mut b = 0;
        while b + CHAINS <= nb {
            // The group is read as eight interleaved streams; ask for one step's worth of
            // the bytes at least a group further along as if they were read in order, so the
            // next group arrives while this one is multiplied.
            prefetch::lines(
                base.wrapping_add(b * ROWS * F::BLOCK_BYTES + ahead),
                step_lines,
            );
            a0 = block::<F, VNNI, R>(base, &rows, b, xs, a0);
            a1 = block::<F, VNNI, R>(base, &rows, b + 1, xs, a1);
            a2 = block::<F, VNNI, R>(base, &rows, b + 2, xs, a2);
            a3 = block::<F, VNNI, R>(base, &rows, b + 3, xs, a3);
            b += CHAINS;
        }
        let left = nb - b;
        if left > 0 {
            a0 = block::<F, VNNI, R>(base, &rows, b, xs, a0);
        }
        if left > 1 {
            a1 = block::<F, VNNI, R>(base, &rows, b + 1, xs, a1);
        }
        if left > 2 {
            a2 = block::<F, VNNI, R>(base, &rows, b + 2, xs, a2);
        }
        let mut r = [[0.0f32; ROWS]; R];
        for (i, out) in r.iter_mut().enumerate() {
            let total = _mm256_add_ps(_mm256_add_ps(a0[i], a1[i]), _mm256_add_ps(a2[i], a3[i]));
            _mm256_storeu_ps(out.as_mut_ptr(), total);
        }
        r
    }
}

/// How the eight rows of a group are laid out: rows `t` and `t + 4` are addressed from one
/// pointer each (`+ 0`, `+ stride`, `+ 2 · stride`, `+ stride3`), so the eight streams take
/// two pointers and two strides, not eight pointers that would not fit the registers.
struct Rows {
    stride: usize,
    stride3: usize,
}

impl Rows {
    /// Row `t`'s byte at `p` (row 0's), for `t < 4`.
    #[inline(always)]
    fn at(&self, p: *const u8, t: usize) -> *const u8 {
        match t {
            0 => p,
            1 => p.wrapping_add(self.stride),
            2 => p.wrapping_add(2 * self.stride),
            _ => p.wrapping_add(self.stride3),
        }
    }
}

/// Block `b` of the eight rows added to one chain of each activation row (lane `t` = row
/// `t`).
#[inline(always)]
unsafe fn block<F: Format, const VNNI: bool, const R: usize>(
    base: *const u8,
    rows: &Rows,
    b: usize,
    xs: &[XRow<'_>; R],
    mut acc: [__m256; R],
) -> [__m256; R] {
    // SAFETY (whole function): block b of the eight rows and of every xs row exists (caller's
    // contract).
    unsafe {
        let lo4 = base.add(b * F::BLOCK_BYTES);
        let hi4 = lo4.add(4 * rows.stride);
        let xq = xs.map(|x| x.blocks[b].qs.as_ptr());
        let isum = nibble_sums::<F, VNNI, R>(lo4, hi4, rows, &xq);
        let (d, m) = scales::<F>(lo4, hi4, rows);
        for i in 0..R {
            acc[i] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(isum[i]),
                _mm256_mul_ps(d, _mm256_set1_ps(xs[i].d[b])),
                acc[i],
            );
            if F::HAS_OFFSET {
                acc[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[i].s[b]), acc[i]);
            }
        }
        acc
    }
}

/// The exact `Σ q·q8` of one block of the eight rows (lane `t` = row `t`): the 16 nibble
/// bytes of rows `t` and `t + 4` (blocks at `lo4` and `hi4`, row 0's and row 4's) go in one
/// register, low nibbles (weights 0..16) and high nibbles (16..32), with Q5_0's fifth bits,
/// against the activation halves `xq[..16]` and `xq[16..]`, broadcast to both 128-bit lanes.
#[inline(always)]
unsafe fn nibble_sums<F: Format, const VNNI: bool, const R: usize>(
    lo4: *const u8,
    hi4: *const u8,
    rows: &Rows,
    xq: &[*const i8; R],
) -> [__m256i; R] {
    let (qs_at, high_bits) = match F::QS_AT {
        QsLayout::Nibbles { at, high_bits } => (at, high_bits),
        QsLayout::Bytes { at } => (at, None),
    };
    // SAFETY (whole function): the eight blocks and 32 bytes at xq exist (caller's contract).
    unsafe {
        // (Loops, not closures, around intrinsics: a closure does not get the caller's
        // target features.)
        let mut x_lo = [_mm256_setzero_si256(); R];
        let mut x_hi = [_mm256_setzero_si256(); R];
        for ((lo, hi), &p) in x_lo.iter_mut().zip(&mut x_hi).zip(xq) {
            *lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
            *hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(16) as *const __m128i));
        }
        let nibble = _mm256_set1_epi8(0x0F);
        let mut pair_sums = [[_mm256_setzero_si256(); R]; 4];
        for (t, sums) in pair_sums.iter_mut().enumerate() {
            // Rows t (low lane) and t + 4 (high lane).
            let (row_lo, row_hi) = (rows.at(lo4, t), rows.at(hi4, t));
            let packed = _mm256_loadu2_m128i(
                row_hi.add(qs_at) as *const __m128i,
                row_lo.add(qs_at) as *const __m128i,
            );
            let mut lo = _mm256_and_si256(packed, nibble);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), nibble);
            if let Some(at) = high_bits {
                let bits = _mm256_set_m128i(
                    _mm_set1_epi32((row_hi.add(at) as *const i32).read_unaligned()),
                    _mm_set1_epi32((row_lo.add(at) as *const i32).read_unaligned()),
                );
                // Bits 0..16 of each row's qh to weights 0..16, bits 16..32 to 16..32.
                lo = _mm256_or_si256(lo, fifth_bits(bits, 0x0101010101010101, 0));
                let (hi_bytes_hi, hi_bytes_lo) = (0x0303030303030303, 0x0202020202020202);
                hi = _mm256_or_si256(hi, fifth_bits(bits, hi_bytes_hi, hi_bytes_lo));
            }
            // The unpacked pair serves every activation row.
            for ((sum, &x_lo), &x_hi) in sums.iter_mut().zip(&x_lo).zip(&x_hi) {
                *sum = if VNNI {
                    _mm256_dpbusd_avx_epi32(
                        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, x_lo),
                        hi,
                        x_hi,
                    )
                } else {
                    // Each i16 lane is two products of at most 31 · 127: the sum of both
                    // halves' lanes stays within i16.
                    _mm256_madd_epi16(
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, x_lo),
                            _mm256_maddubs_epi16(hi, x_hi),
                        ),
                        _mm256_set1_epi16(1),
                    )
                };
            }
        }
        // [t t' | t+4 t+4'] per pair → lanes 0..4 rows 0..4, lanes 4..8 rows 4..8.
        let mut isum = [_mm256_setzero_si256(); R];
        for (i, sum) in isum.iter_mut().enumerate() {
            *sum = _mm256_hadd_epi32(
                _mm256_hadd_epi32(pair_sums[0][i], pair_sums[1][i]),
                _mm256_hadd_epi32(pair_sums[2][i], pair_sums[3][i]),
            );
        }
        isum
    }
}

/// `0x10` in each byte of each 128-bit lane whose bit is set in that lane's 32-bit `bits`:
/// byte `i` reads bit `i % 8` of qh byte `b`, `b` being byte `i % 8` of `bytes_lo` for
/// `i < 8`, of `bytes_hi` after (as ggml's `bytes_from_bits_32`).
#[inline(always)]
unsafe fn fifth_bits(bits: __m256i, bytes_hi: i64, bytes_lo: i64) -> __m256i {
    // SAFETY: AVX2 by the caller's contract.
    unsafe {
        // Each byte gets the qh byte holding its bit, then every other bit is set; a byte is
        // all ones iff its bit was.
        let spread = _mm256_shuffle_epi8(
            bits,
            _mm256_set_epi64x(bytes_hi, bytes_lo, bytes_hi, bytes_lo),
        );
        let set = _mm256_cmpeq_epi8(
            _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
            _mm256_set1_epi64x(-1),
        );
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// The eight rows' `d` and `m` of the blocks at `lo4` (rows 0..4) and `hi4` (rows 4..8), lane
/// `t` = row `t`.
#[inline(always)]
unsafe fn scales<F: Format>(lo4: *const u8, hi4: *const u8, rows: &Rows) -> (__m256, __m256) {
    // SAFETY (whole function): the eight blocks exist (caller's contract); each read is
    // inside its block.
    unsafe {
        match F::M_AT {
            // m follows d (see [`reads`]): one 32-bit read per row, then the d halves and
            // m halves gathered into one 128-bit lane each.
            Some(_) => {
                let dm = |p: *const u8, t: usize| (rows.at(p, t) as *const i32).read_unaligned();
                let lo = _mm_setr_epi32(dm(lo4, 0), dm(lo4, 1), dm(lo4, 2), dm(lo4, 3));
                let hi = _mm_setr_epi32(dm(hi4, 0), dm(hi4, 1), dm(hi4, 2), dm(hi4, 3));
                let split = _mm256_setr_epi8(
                    0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, //
                    0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                );
                // [d0..4 m0..4 | d4..8 m4..8] → [d0..8 | m0..8].
                let dm = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(
                    _mm256_set_m128i(hi, lo),
                    split,
                ));
                (
                    _mm256_cvtph_ps(_mm256_castsi256_si128(dm)),
                    _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(dm)),
                )
            }
            None => {
                let h = |p: *const u8, t: usize| (rows.at(p, t) as *const i16).read_unaligned();
                let d = _mm256_cvtph_ps(_mm_setr_epi16(
                    h(lo4, 0),
                    h(lo4, 1),
                    h(lo4, 2),
                    h(lo4, 3),
                    h(hi4, 0),
                    h(hi4, 1),
                    h(hi4, 2),
                    h(hi4, 3),
                ));
                (d, _mm256_mul_ps(d, _mm256_set1_ps(F::M_PER_D)))
            }
        }
    }
}
