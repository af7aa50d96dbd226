//! The batched quantised matmul on AVX2: weight rows against activation panels (see
//! [`super::panel`]), after llama.cpp's repacked `ggml_gemm_q4_0_8x8_q8_0`.
//!
//! For one weight block, its 32 `q` are unpacked once (in registers) and each group of four
//! is broadcast to all eight lanes (`shuffle_epi32`); one `maddubs` against the panel's
//! matching 32 bytes gives that group's products for eight activation rows. Eight groups
//! accumulate in i16 (8 · 2 · 15 · 127 < 2¹⁵) for the Q4 formats before one `madd` widens them,
//! then one FMA applies `d · d8` for all eight rows. So the per-(row, block) scale and
//! horizontal-sum work of the row dot products is shared eight ways, and each weight block is
//! read and unpacked once per pair of panels (16 rows) instead of once per row.
//!
//! No closures wrap intrinsics here: a closure does not get the caller's target features, so
//! an intrinsic inside one can stay out of line (a call per use).
//!
//! Where the CPU has AVX-VNNI, [`gemm_vnni`] replaces each `maddubs` + add (and the final
//! `madd`) with one `vpdpbusd`, which also accumulates straight into i32.

use std::arch::x86_64::*;

use super::format::{Format, CHAINS, WEIGHTS_AHEAD};
use super::matmul::{gemm_shape, OutCols};
use super::panel::{PanelBlock, PANEL_ROWS};
use crate::prefetch;

/// Panels per tile: the tile's activations (64 rows · k bytes and scales) stay in L2 while
/// every weight row of a task passes over them.
const TILE_PANELS: usize = 8;

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` (the columns of `out`) and all
/// `m` activation rows in `panels` (`m.div_ceil(8)` panels of `nb` blocks).
///
/// # Safety
/// AVX2, FMA and F16C available; `w` is `rows` rows of `nb` blocks of `F`; `panels` holds
/// `m.div_ceil(8) * nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    panels: &[PanelBlock],
    m: usize,
    out: &mut OutCols,
) {
    // SAFETY: by the caller's contract.
    unsafe { gemm_body::<F, false>(w, rows, nb, panels, m, out) }
}

/// [`gemm`] with AVX-VNNI's `vpdpbusd` for the integer dot products.
///
/// # Safety
/// As [`gemm`], and AVX-VNNI available.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn gemm_vnni<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    panels: &[PanelBlock],
    m: usize,
    out: &mut OutCols,
) {
    // SAFETY: by the caller's contract.
    unsafe { gemm_body::<F, true>(w, rows, nb, panels, m, out) }
}

/// The body of [`gemm`] and [`gemm_vnni`], inlined into each with its features.
#[inline(always)]
unsafe fn gemm_body<F: Format, const VNNI: bool>(
    w: &[u8],
    rows: usize,
    nb: usize,
    panels: &[PanelBlock],
    m: usize,
    out: &mut OutCols,
) {
    let (row_bytes, n_panels) = gemm_shape::<F, _>(w, rows, nb, panels, m, PANEL_ROWS);
    let panel = |p: usize| &panels[p * nb..(p + 1) * nb];
    for t0 in (0..n_panels).step_by(TILE_PANELS) {
        let t1 = (t0 + TILE_PANELS).min(n_panels);
        for j in 0..rows {
            let wr = &w[j * row_bytes..(j + 1) * row_bytes];
            let mut p = t0;
            // SAFETY (all four calls): features by contract; wr is nb blocks, each panel nb
            // blocks.
            while p + 2 <= t1 {
                let r = unsafe { row_panels::<F, 2, VNNI>(wr, [panel(p), panel(p + 1)]) };
                unsafe {
                    store(out, m, j, p, r[0]);
                    store(out, m, j, p + 1, r[1]);
                }
                p += 2;
            }
            if p < t1 {
                let r = unsafe { row_panels::<F, 1, VNNI>(wr, [panel(p)]) };
                unsafe { store(out, m, j, p, r[0]) };
            }
        }
    }
}

/// Writes the lanes of panel `p` that are real rows (of `m`) to column `j` of the task.
///
/// # Safety
/// AVX available.
#[inline(always)]
unsafe fn store(out: &mut OutCols, m: usize, j: usize, p: usize, v: __m256) {
    let mut lanes = [0.0f32; PANEL_ROWS];
    // SAFETY: `lanes` holds 8 floats; AVX by contract.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
    let first = p * PANEL_ROWS;
    for (l, &x) in lanes.iter().enumerate().take(m - first) {
        out.set(first + l, j, x);
    }
}

/// Group `s` (32 bytes) of a panel block.
///
/// # Safety
/// AVX available.
#[inline(always)]
unsafe fn load_group(pb: &PanelBlock, s: usize) -> __m256i {
    // SAFETY: qs[s] is 32 readable, 32-byte aligned bytes.
    unsafe { _mm256_load_si256(pb.qs[s].as_ptr() as *const __m256i) }
}

/// Broadcasts 32-bit element `S / 0x55` of each 128-bit half to its whole half.
#[inline(always)]
fn group<const S: i32>(v: __m256i) -> __m256i {
    // SAFETY: only reached from target_feature(avx2) functions (inlined there).
    unsafe { _mm256_shuffle_epi32::<S>(v) }
}

/// One weight row against `P` panels: lane `l` of result `p` is the dot product with
/// activation row `8p + l`.
///
/// # Safety
/// AVX2, FMA and F16C available (and AVX-VNNI when `VNNI`); `wr` is whole blocks of `F`;
/// each panel holds as many.
#[inline(always)]
unsafe fn row_panels<F: Format, const P: usize, const VNNI: bool>(
    wr: &[u8],
    panels: [&[PanelBlock]; P],
) -> [__m256; P] {
    // The four accumulation chains of the common arithmetic (block b feeds chain b % 4), as
    // four separate locals so they can live in registers.
    let zero = [_mm256_setzero_ps(); P];
    let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
    let nb = wr.len() / F::BLOCK_BYTES;
    let mut b = 0;
    // SAFETY (all calls): block indices < nb; features by contract.
    while b + CHAINS <= nb {
        unsafe {
            block::<F, P, VNNI>(wr, b, &panels, &mut a0);
            block::<F, P, VNNI>(wr, b + 1, &panels, &mut a1);
            block::<F, P, VNNI>(wr, b + 2, &panels, &mut a2);
            block::<F, P, VNNI>(wr, b + 3, &panels, &mut a3);
        }
        b += CHAINS;
    }
    if b < nb {
        unsafe { block::<F, P, VNNI>(wr, b, &panels, &mut a0) };
    }
    if b + 1 < nb {
        unsafe { block::<F, P, VNNI>(wr, b + 1, &panels, &mut a1) };
    }
    if b + 2 < nb {
        unsafe { block::<F, P, VNNI>(wr, b + 2, &panels, &mut a2) };
    }
    let mut out = zero;
    for (p, o) in out.iter_mut().enumerate() {
        *o = _mm256_add_ps(_mm256_add_ps(a0[p], a1[p]), _mm256_add_ps(a2[p], a3[p]));
    }
    out
}

/// Block `b` of the weight row against block `b` of each panel, into one chain per panel.
///
/// # Safety
/// As [`row_panels`]; `b` is a block of `wr` and of every panel.
#[inline(always)]
unsafe fn block<F: Format, const P: usize, const VNNI: bool>(
    wr: &[u8],
    b: usize,
    panels: &[&[PanelBlock]; P],
    acc: &mut [__m256; P],
) {
    let ones = _mm256_set1_epi16(1);
    {
        // SAFETY: block b is inside wr.
        let wb = unsafe { wr.as_ptr().add(b * F::BLOCK_BYTES) };
        prefetch::lines(wb.wrapping_add(WEIGHTS_AHEAD), 1);
        // SAFETY: features and bounds by contract.
        let (q, (d, m)) = unsafe { (F::unpack(wb), F::scales_f16c(wb)) };
        // Groups 0..4 live in the low 128 bits, 4..8 in the high: copy each half to both.
        let lo = _mm256_permute2x128_si256::<0x00>(q, q);
        let hi = _mm256_permute2x128_si256::<0x11>(q, q);
        let mut isum = [_mm256_setzero_si256(); P];
        let pb: [&PanelBlock; P] = std::array::from_fn(|p| &panels[p][b]);
        if F::SIGNED {
            // Sign trick per group; i16 pairs reach 2 · 128 · 127, so widen every group.
            let (alo, ahi) = (_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(hi, hi));
            let steps: [(__m256i, __m256i); 8] = [
                (group::<0x00>(lo), group::<0x00>(alo)),
                (group::<0x55>(lo), group::<0x55>(alo)),
                (group::<0xAA>(lo), group::<0xAA>(alo)),
                (group::<0xFF>(lo), group::<0xFF>(alo)),
                (group::<0x00>(hi), group::<0x00>(ahi)),
                (group::<0x55>(hi), group::<0x55>(ahi)),
                (group::<0xAA>(hi), group::<0xAA>(ahi)),
                (group::<0xFF>(hi), group::<0xFF>(ahi)),
            ];
            for (s, (ws, wa)) in steps.into_iter().enumerate() {
                for p in 0..P {
                    let xs = _mm256_sign_epi8(load_group(pb[p], s), ws);
                    isum[p] = if VNNI {
                        _mm256_dpbusd_avx_epi32(isum[p], wa, xs)
                    } else {
                        let prod = _mm256_maddubs_epi16(wa, xs);
                        _mm256_add_epi32(isum[p], _mm256_madd_epi16(prod, ones))
                    };
                }
            }
        } else {
            let steps: [__m256i; 8] = [
                group::<0x00>(lo),
                group::<0x55>(lo),
                group::<0xAA>(lo),
                group::<0xFF>(lo),
                group::<0x00>(hi),
                group::<0x55>(hi),
                group::<0xAA>(hi),
                group::<0xFF>(hi),
            ];
            if VNNI {
                for (s, ws) in steps.into_iter().enumerate() {
                    for p in 0..P {
                        isum[p] = _mm256_dpbusd_avx_epi32(isum[p], ws, load_group(pb[p], s));
                    }
                }
            } else {
                let mut s16 = [_mm256_setzero_si256(); P];
                for (s, ws) in steps.into_iter().enumerate() {
                    for p in 0..P {
                        s16[p] = _mm256_add_epi16(
                            s16[p],
                            _mm256_maddubs_epi16(ws, load_group(pb[p], s)),
                        );
                    }
                }
                for p in 0..P {
                    isum[p] = _mm256_madd_epi16(s16[p], ones);
                }
            }
        }
        let dv = _mm256_set1_ps(d);
        for p in 0..P {
            // SAFETY: d and s are 8 floats each, 32-byte aligned inside the panel block.
            let (pd, ps) = unsafe {
                (
                    _mm256_load_ps(pb[p].d.as_ptr()),
                    _mm256_load_ps(pb[p].s.as_ptr()),
                )
            };
            acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[p]), _mm256_mul_ps(dv, pd), acc[p]);
            if F::HAS_OFFSET {
                acc[p] = _mm256_fmadd_ps(_mm256_set1_ps(m), ps, acc[p]);
            }
        }
    }
}
