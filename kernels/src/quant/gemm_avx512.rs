//! The batched quantised matmul on AVX-512 VNNI: the panel GEMM of [`super::gemm_avx2`] with
//! 512-bit registers, one 16-row activation panel ([`super::panel16`]) per register.
//!
//! Four weight blocks at a time are unpacked into unsigned bytes (Q8_0's signed `q` biased
//! by 128, see [`super::panel16`]) and stored, with their `d` and `m` as f32, to a small
//! aligned buffer. Each group of four bytes is then broadcast to all 16 lanes straight from
//! that buffer (`vpbroadcastd` from memory is a load, no shuffle), and one `vpdpbusd`
//! against the panel's matching 64 bytes adds that group's products to 16 rows' exact i32
//! sums; then one FMA applies `d · d8` for all 16 rows (and one more `m · s8`). On AVX2 the
//! same 16 rows take twice the multiply-adds and scale FMAs plus a shuffle per group; here
//! the integer loop is loads and `vpdpbusd` only. Measured on a 2-core AVX-512 Xeon at
//! m = 16 on the SmolLM2-135M shapes, the GEMM alone ran 1.75-2.3x as fast as the AVX-VNNI
//! one (1.5x on the 49152-row LM head, which streams 30 MB of weights).
//!
//! A pass runs four (then two) weight rows against one panel (16 rows, the batched decode
//! step: the rows share the activation loads) or one weight row against two panels (32 rows:
//! the panels share the unpacked weights). The panels of a tile stay in L1 while the task's
//! weight rows pass over them, so the tile holds as many as fit (one at k = 1536).
//!
//! Every output follows the common arithmetic ([`super::format`]): the block sum is exact
//! in i32, block `b` feeds chain `b % 4` with the same two FMAs, the chains are summed as
//! `(a0 + a1) + (a2 + a3)`; so results are bit-identical to the other kernels.
//!
//! No closures wrap intrinsics here: a closure does not get the caller's target features, so
//! an intrinsic inside one can stay out of line (a call per use).

use std::arch::x86_64::*;

use super::format::{Format, CHAINS};
use super::matmul::{gemm_shape, OutCols};
use super::panel16::{Panel16Block, PANEL16_ROWS};
use crate::prefetch;

/// Activation bytes per tile: every weight row of a task passes over the tile's panels, so
/// they should stay in L1 (about two thirds of a 48 KiB L1 data cache, leaving room for the
/// weights streaming through). Measured: at k = 1536 (33 KiB per panel), two-panel tiles
/// read from L2 and cost 30 % more per panel than one-panel tiles.
const TILE_BYTES: usize = 32 << 10;

/// Most panels per tile.
const TILE_PANELS: usize = 4;

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` (the columns of `out`) and all
/// `m` activation rows in `panels` (`m.div_ceil(16)` panels of `nb` blocks).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C available; `w` is `rows` rows of `nb` blocks of
/// `F`; `panels` holds `m.div_ceil(16) * nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn gemm<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    panels: &[Panel16Block],
    m: usize,
    out: &mut OutCols,
) {
    let (row_bytes, n_panels) = gemm_shape::<F, _>(w, rows, nb, panels, m, PANEL16_ROWS);
    let panel = |p: usize| &panels[p * nb..(p + 1) * nb];
    let tile = (TILE_BYTES / (nb * std::mem::size_of::<Panel16Block>())).clamp(1, TILE_PANELS);
    let wrow = |j: usize| &w[j * row_bytes..(j + 1) * row_bytes];
    // Unpacked weight blocks, one per row of a pass; made once per call, not per pass.
    let (mut prep4, mut prep2, mut prep1) = (
        [Prepared::EMPTY; R4],
        [Prepared::EMPTY; 2],
        [Prepared::EMPTY; 1],
    );
    for t0 in (0..n_panels).step_by(tile) {
        let t1 = (t0 + tile).min(n_panels);
        let mut j = 0;
        // SAFETY (all calls): features by contract; every weight row is nb blocks, every
        // panel nb blocks.
        if t1 - t0 == 1 {
            // One panel in the tile (16 rows, the batched decode step; or large k): four
            // weight rows per pass share its activation loads and give four independent
            // integer sums, then two, then one.
            while j + R4 <= rows {
                let r = unsafe {
                    pass::<F, R4, 1, 1>(
                        [wrow(j), wrow(j + 1), wrow(j + 2), wrow(j + 3)],
                        [panel(t0)],
                        &mut prep4,
                    )
                };
                for (i, ri) in r.iter().enumerate() {
                    unsafe { store(out, m, j + i, t0, ri[0]) };
                }
                j += R4;
            }
            while j + 2 <= rows {
                let r =
                    unsafe { pass::<F, 2, 1, 1>([wrow(j), wrow(j + 1)], [panel(t0)], &mut prep2) };
                unsafe {
                    store(out, m, j, t0, r[0][0]);
                    store(out, m, j + 1, t0, r[1][0]);
                }
                j += 2;
            }
        }
        for j in j..rows {
            let mut p = t0;
            while p + 2 <= t1 {
                let r =
                    unsafe { pass::<F, 1, 2, 1>([wrow(j)], [panel(p), panel(p + 1)], &mut prep1) };
                unsafe {
                    store(out, m, j, p, r[0][0]);
                    store(out, m, j, p + 1, r[0][1]);
                }
                p += 2;
            }
            if p < t1 {
                let r = unsafe { pass::<F, 1, 1, 2>([wrow(j)], [panel(p)], &mut prep1) };
                unsafe { store(out, m, j, p, r[0][0]) };
            }
        }
    }
}

/// Weight rows per pass against a single panel.
const R4: usize = 4;

/// Writes the lanes of panel `p` that are real rows (of `m`) to column `j` of the task.
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
pub(super) unsafe fn store(out: &mut OutCols, m: usize, j: usize, p: usize, v: __m512) {
    let mut lanes = [0.0f32; PANEL16_ROWS];
    // SAFETY: `lanes` holds 16 floats; AVX-512F by contract.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
    let first = p * PANEL16_ROWS;
    for (l, &x) in lanes.iter().enumerate().take(m - first) {
        out.set(first + l, j, x);
    }
}

/// Up to four weight blocks made ready for [`block`]: their `q` as unsigned bytes and their
/// `d` and `m` as f32, in memory, so that every use is a broadcast load (no shuffle).
#[repr(C, align(64))]
struct Prepared {
    /// Block `c`'s 32 bytes at `32 c`.
    q: [u8; 4 * 32],
    /// `d` of block `c`.
    d: [f32; CHAINS],
    /// `m` of block `c`.
    m: [f32; CHAINS],
}

impl Prepared {
    /// Nothing unpacked yet.
    const EMPTY: Self = Self {
        q: [0; 4 * 32],
        d: [0.0; CHAINS],
        m: [0.0; CHAINS],
    };
}

/// `R` weight rows against `P` panels: lane `l` of result `[r][p]` is the dot product of
/// weight row `r` with activation row `16p + l`. `S`: independent partial integer sums per
/// output (see [`block`]).
///
/// # Safety
/// As [`gemm`]; every `wr` is the same number of whole blocks of `F`; each panel holds as
/// many.
#[inline(always)]
unsafe fn pass<F: Format, const R: usize, const P: usize, const S: usize>(
    wr: [&[u8]; R],
    panels: [&[Panel16Block]; P],
    prep: &mut [Prepared; R],
) -> [[__m512; P]; R] {
    // The four accumulation chains of the common arithmetic (block b feeds chain b % 4), as
    // four separate locals so they can live in registers.
    let zero = [[_mm512_setzero_ps(); P]; R];
    let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
    let nb = wr[0].len() / F::BLOCK_BYTES;
    let mut b = 0;
    // SAFETY (all calls): blocks b..b + count < nb; features by contract.
    while b + CHAINS <= nb {
        unsafe {
            let pr = prepare::<F, R>(wr, b, CHAINS, prep);
            block::<F, R, P, S>(pr, 0, b, &panels, &mut a0);
            block::<F, R, P, S>(pr, 1, b + 1, &panels, &mut a1);
            block::<F, R, P, S>(pr, 2, b + 2, &panels, &mut a2);
            block::<F, R, P, S>(pr, 3, b + 3, &panels, &mut a3);
        }
        b += CHAINS;
    }
    if b < nb {
        unsafe {
            let pr = prepare::<F, R>(wr, b, nb - b, prep);
            block::<F, R, P, S>(pr, 0, b, &panels, &mut a0);
            if b + 1 < nb {
                block::<F, R, P, S>(pr, 1, b + 1, &panels, &mut a1);
            }
            if b + 2 < nb {
                block::<F, R, P, S>(pr, 2, b + 2, &panels, &mut a2);
            }
        }
    }
    let mut out = zero;
    for r in 0..R {
        for p in 0..P {
            out[r][p] = _mm512_add_ps(
                _mm512_add_ps(a0[r][p], a1[r][p]),
                _mm512_add_ps(a2[r][p], a3[r][p]),
            );
        }
    }
    out
}

/// Unpacks blocks `b..b + count` (`count <= 4`) of each weight row into `prep`.
///
/// # Safety
/// As [`gemm`]; the blocks are inside every `wr`.
#[inline(always)]
unsafe fn prepare<'a, F: Format, const R: usize>(
    wr: [&[u8]; R],
    b: usize,
    count: usize,
    prep: &'a mut [Prepared; R],
) -> &'a [Prepared; R] {
    // A task's weight rows are contiguous, so the same block of the rows of the next pass
    // lies R rows ahead: prefetch it there. The rows are short (612 bytes at k = 576 in
    // Q8_0), so a fixed distance would mostly land in rows this pass already reads.
    let ahead = R * wr[0].len();
    for (wr, prep) in wr.iter().zip(prep.iter_mut()) {
        // SAFETY: by the caller's contract.
        unsafe { prepare_row::<F>(wr, b, count, ahead, prep) };
    }
    // Without this the compiler forwards the stores to the loads in `block` and broadcasts
    // each group with two shuffles (vpshufd + vpbroadcastd / vshufi64x2), the port-5 work
    // this design avoids; behind the barrier each broadcast is a load.
    std::hint::black_box(prep)
}

/// [`prepare`] for one weight row.
///
/// # Safety
/// As [`prepare`].
#[inline(always)]
unsafe fn prepare_row<F: Format>(
    wr: &[u8],
    b: usize,
    count: usize,
    ahead: usize,
    prep: &mut Prepared,
) {
    // SAFETY (whole function): blocks b..b + count are inside wr; the stores stay inside
    // prep (q: 4 · 32 bytes, 64-byte aligned; d and m: 4 floats, 16-byte aligned).
    unsafe {
        let wb = wr.as_ptr().add(b * F::BLOCK_BYTES);
        prefetch::lines(wb.wrapping_add(ahead), 3);
        for c in 0..count {
            let q = F::unpack(wb.add(c * F::BLOCK_BYTES));
            // vpdpbusd multiplies unsigned by signed bytes: Q8_0's q go in as q + 128, and
            // the panel's c (−128 · Σ q8 per row) starts the sum so that it stays exactly
            // Σ q·q8.
            let q = if F::SIGNED {
                _mm256_xor_si256(q, _mm256_set1_epi8(i8::MIN))
            } else {
                q
            };
            _mm256_store_si256(prep.q.as_mut_ptr().add(32 * c) as *mut __m256i, q);
        }
        // The blocks' f16 scales, converted four at a time.
        let (d, m) = match F::M_AT {
            Some(2) => {
                // d and m adjacent (Q4_1): one dword per block, (d, m) pairs after F16C.
                let mut dm = [0i32; CHAINS];
                for (c, v) in dm.iter_mut().enumerate().take(count) {
                    *v = (wb.add(c * F::BLOCK_BYTES) as *const i32).read_unaligned();
                }
                let f = _mm256_cvtph_ps(_mm_loadu_si128(dm.as_ptr() as *const __m128i));
                // [d0, m0, d1, m1 | d2, m2, d3, m3] → d in lanes 0, 2, 4, 6; m in 1, 3, 5, 7.
                let ev = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
                (_mm256_castps256_ps128(ev), _mm256_extractf128_ps::<1>(ev))
            }
            _ => {
                let mut h = [0i16; 8];
                for (c, v) in h.iter_mut().enumerate().take(count) {
                    *v = (wb.add(c * F::BLOCK_BYTES) as *const i16).read_unaligned();
                }
                let d = _mm_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i));
                // The same f32 product as the scalar `d * M_PER_D` of the other kernels.
                (d, _mm_mul_ps(d, _mm_set1_ps(F::M_PER_D)))
            }
        };
        _mm_store_ps(prep.d.as_mut_ptr(), d);
        _mm_store_ps(prep.m.as_mut_ptr(), m);
    }
}

/// Prepared block `c` (block `b`) of each weight row against block `b` of each panel, into
/// one chain per output. `S` independent partial sums per output (group `s` into sum
/// `s % S`): with a single output, one chain of eight dependent `vpdpbusd` would make the
/// block wait on their latency.
///
/// # Safety
/// As [`pass`]; `b` is a block of every panel; `c` was prepared.
#[inline(always)]
unsafe fn block<F: Format, const R: usize, const P: usize, const S: usize>(
    prep: &[Prepared; R],
    c: usize,
    b: usize,
    panels: &[&[Panel16Block]; P],
    acc: &mut [[__m512; P]; R],
) {
    // SAFETY: b is a block of every panel (caller's contract).
    let pb: [&Panel16Block; P] = std::array::from_fn(|p| unsafe { panels[p].get_unchecked(b) });
    let mut part = [[[_mm512_setzero_si512(); P]; R]; S];
    if F::SIGNED {
        for p in 0..P {
            // SAFETY: c is 16 i32, 64-byte aligned inside the panel block.
            let corr = unsafe { _mm512_load_si512(pb[p].c.as_ptr() as *const __m512i) };
            for part_r in part[0].iter_mut() {
                part_r[p] = corr;
            }
        }
    }
    for s in 0..QK4 {
        let mut ws = [_mm512_setzero_si512(); R];
        for r in 0..R {
            // SAFETY: bytes 32c + 4s..32c + 4s + 4 of q are readable (c < 4, s < 8).
            let g = unsafe { (prep[r].q.as_ptr().add(32 * c + 4 * s) as *const i32).read() };
            ws[r] = _mm512_set1_epi32(g);
        }
        for p in 0..P {
            // SAFETY: qs[s] is 64 readable, 64-byte aligned bytes.
            let xs = unsafe { _mm512_load_si512(pb[p].qs[s].as_ptr() as *const __m512i) };
            for r in 0..R {
                part[s % S][r][p] = _mm512_dpbusd_epi32(part[s % S][r][p], ws[r], xs);
            }
        }
    }
    // Exact in i32, so the order of these additions does not matter.
    let mut isum = part[0];
    for ps in &part[1..] {
        for r in 0..R {
            for p in 0..P {
                isum[r][p] = _mm512_add_epi32(isum[r][p], ps[r][p]);
            }
        }
    }
    for r in 0..R {
        let dv = _mm512_set1_ps(prep[r].d[c]);
        let mv = _mm512_set1_ps(prep[r].m[c]);
        for p in 0..P {
            // SAFETY: d and s are 16 floats each, 64-byte aligned inside the panel block.
            let (pd, ps) = unsafe {
                (
                    _mm512_load_ps(pb[p].d.as_ptr()),
                    _mm512_load_ps(pb[p].s.as_ptr()),
                )
            };
            let a = &mut acc[r][p];
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][p]), _mm512_mul_ps(dv, pd), *a);
            if F::HAS_OFFSET {
                *a = _mm512_fmadd_ps(mv, ps, *a);
            }
        }
    }
}

/// Groups of four values in a block.
const QK4: usize = super::q4_1::QK / 4;
