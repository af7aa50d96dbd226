//! The batched K-quant matmul on AVX-512 VNNI: [`super::gemm_avx512`]'s panel GEMM for
//! 256-weight super-blocks, one 16-row Q8_K activation panel ([`super::kpanel16`]) per
//! register.
//!
//! Each super-block of a weight row is unpacked once into 256 unsigned bytes, its scales as
//! i32, its offsets as i16 pairs and `d`, `dmin`, stored to a small aligned buffer so that
//! every use below is a broadcast load. Then, per scale span (16 weights, or 32 for Q4_K and
//! Q5_K, whose scales cover 32):
//! - four (or eight) `vpdpbusd`, each a group of four weight bytes broadcast to all lanes
//!   against the panel's matching 64 bytes, give 16 rows' exact i32 dot products of the span;
//! - one `vpmulld` by the span's scale and one add give `isum` for 16 rows.
//!
//! The offsets meet the activations' 16-value sums in eight `vpdpwssd` (two groups per
//! instruction), giving `msum`; then the float steps of [`super::kformat`] run once for
//! all 16 rows. The AVX2 row kernel ([`super::kdot_avx2`]) instead spends a `maddubs`, a
//! `madd`, an add and two horizontal sums per row and super-block.
//!
//! A pass runs four (then two, then one) weight rows against one panel (16 rows, the batched
//! decode step: the rows share the activation loads) or one weight row against two panels
//! (32 rows and more: the panels share the unpacked weights). As in the 32-weight GEMM, a
//! tile holds as many panels as stay in L1 (one at k ≥ 2048).
//!
//! Every output follows the common arithmetic: `isum` and `msum` are exact in i32,
//! super-block `b` feeds chain `b % 4` with the same FMAs as the scalar reference, and the
//! chains are summed as `(a0 + a1) + (a2 + a3)`; so results are bit-identical to the other
//! kernels. No closures wrap intrinsics here (a closure does not get the target features).

use std::arch::x86_64::*;

use super::format::CHAINS;
use super::gemm_avx512::store;
use super::kformat::{KFormat, GROUPS, QK_K};
use super::kpanel16::{KPanel16Block, KPANEL_ROWS};
use super::matmul::OutCols;
use crate::prefetch;

/// Activation bytes per tile (see [`super::gemm_avx512`]'s `TILE_BYTES`).
const TILE_BYTES: usize = 32 << 10;

/// Most panels per tile.
const TILE_PANELS: usize = 4;

/// Weight rows per pass against a single panel.
const R4: usize = 4;

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` (the columns of `out`) and all
/// `m` activation rows in `panels` (`m.div_ceil(16)` panels of `nb` super-blocks).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C available; `w` is `rows` rows of `nb`
/// super-blocks of `K`; `panels` holds `m.div_ceil(16) * nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn gemm<K: KFormat>(
    w: &[u8],
    rows: usize,
    nb: usize,
    panels: &[KPanel16Block],
    m: usize,
    out: &mut OutCols,
) {
    let row_bytes = nb * K::BLOCK_BYTES;
    let n_panels = m.div_ceil(KPANEL_ROWS);
    debug_assert_eq!(w.len(), rows * row_bytes);
    debug_assert_eq!(panels.len(), n_panels * nb);
    let panel = |p: usize| &panels[p * nb..(p + 1) * nb];
    let tile = (TILE_BYTES / (nb * std::mem::size_of::<KPanel16Block>())).clamp(1, TILE_PANELS);
    let wrow = |j: usize| &w[j * row_bytes..(j + 1) * row_bytes];
    let (mut prep4, mut prep2, mut prep1) = (
        [Prepared::EMPTY; R4],
        [Prepared::EMPTY; 2],
        [Prepared::EMPTY; 1],
    );
    for t0 in (0..n_panels).step_by(tile) {
        let t1 = (t0 + tile).min(n_panels);
        let mut j = 0;
        // SAFETY (all calls): features by contract; every weight row is nb super-blocks,
        // every panel nb blocks.
        if t1 - t0 == 1 {
            while j + R4 <= rows {
                let r = unsafe {
                    pass::<K, R4, 1>(
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
                let r = unsafe { pass::<K, 2, 1>([wrow(j), wrow(j + 1)], [panel(t0)], &mut prep2) };
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
                let r = unsafe { pass::<K, 1, 2>([wrow(j)], [panel(p), panel(p + 1)], &mut prep1) };
                unsafe {
                    store(out, m, j, p, r[0][0]);
                    store(out, m, j, p + 1, r[0][1]);
                }
                p += 2;
            }
            if p < t1 {
                let r = unsafe { pass::<K, 1, 1>([wrow(j)], [panel(p)], &mut prep1) };
                unsafe { store(out, m, j, p, r[0][0]) };
            }
        }
    }
}

/// One weight super-block made ready for [`block`], in memory so that every use is a
/// broadcast load (no shuffle).
#[repr(C, align(64))]
struct Prepared {
    /// `q` of every weight, in weight order.
    q: [u8; QK_K],
    /// `sc_g` of every group.
    sc: [i32; GROUPS],
    /// `(mn_2h, mn_2h+1)` as an i16 pair in dword `h`.
    mn: [i32; GROUPS / 2],
    d: f32,
    dmin: f32,
}

impl Prepared {
    /// Nothing unpacked yet.
    const EMPTY: Self = Self {
        q: [0; QK_K],
        sc: [0; GROUPS],
        mn: [0; GROUPS / 2],
        d: 0.0,
        dmin: 0.0,
    };
}

/// `R` weight rows against `P` panels: lane `l` of result `[r][p]` is the dot product of
/// weight row `r` with activation row `16p + l`.
///
/// # Safety
/// As [`gemm`]; every `wr` is the same number of whole super-blocks of `K`; each panel holds
/// as many.
#[inline(always)]
unsafe fn pass<K: KFormat, const R: usize, const P: usize>(
    wr: [&[u8]; R],
    panels: [&[KPanel16Block]; P],
    prep: &mut [Prepared; R],
) -> [[__m512; P]; R] {
    let mut acc = [[[_mm512_setzero_ps(); P]; R]; CHAINS];
    let nb = wr[0].len() / K::BLOCK_BYTES;
    // The same super-block of the rows of the next pass lies R rows ahead (a task's weight
    // rows are contiguous).
    let ahead = R * wr[0].len();
    for b in 0..nb {
        // SAFETY: super-block b is inside every weight row and every panel; features by
        // contract.
        unsafe {
            for (wr, prep) in wr.iter().zip(prep.iter_mut()) {
                let wb = wr.as_ptr().add(b * K::BLOCK_BYTES);
                prefetch::lines(wb.wrapping_add(ahead), K::BLOCK_BYTES.div_ceil(64));
                prepare::<K>(wb, prep);
            }
            // Keeps the stores above as stores: otherwise the compiler forwards them and
            // broadcasts each group with shuffles (port 5) instead of loads.
            let prep = std::hint::black_box(&*prep);
            block::<K, R, P>(prep, b, &panels, &mut acc[b % CHAINS]);
        }
    }
    let mut out = acc[0];
    for r in 0..R {
        for p in 0..P {
            out[r][p] = _mm512_add_ps(
                _mm512_add_ps(acc[0][r][p], acc[1][r][p]),
                _mm512_add_ps(acc[2][r][p], acc[3][r][p]),
            );
        }
    }
    out
}

/// Unpacks the super-block at `wb` into `prep`.
///
/// # Safety
/// As [`gemm`]; the super-block's bytes are readable.
#[inline(always)]
unsafe fn prepare<K: KFormat>(wb: *const u8, prep: &mut Prepared) {
    // SAFETY: the super-block is readable (caller's contract); the stores stay inside prep
    // (q: 256 bytes, sc: 64 bytes, both 64-byte aligned; mn: 32 bytes).
    unsafe {
        let k = K::unpack_avx2(wb);
        for (c, q) in k.q.iter().enumerate() {
            _mm256_store_si256(prep.q.as_mut_ptr().add(32 * c) as *mut __m256i, *q);
        }
        _mm512_store_si512(
            prep.sc.as_mut_ptr() as *mut __m512i,
            _mm512_cvtepi16_epi32(k.sc),
        );
        _mm256_storeu_si256(prep.mn.as_mut_ptr() as *mut __m256i, k.mn);
        prep.d = k.d;
        prep.dmin = k.dmin;
    }
}

/// Prepared super-block `b` of each weight row against block `b` of each panel, into one
/// chain per output.
///
/// # Safety
/// As [`pass`]; `b` is a block of every panel.
#[inline(always)]
unsafe fn block<K: KFormat, const R: usize, const P: usize>(
    prep: &[Prepared; R],
    b: usize,
    panels: &[&[KPanel16Block]; P],
    acc: &mut [[__m512; P]; R],
) {
    // SAFETY: b is a block of every panel (caller's contract).
    let pb: [&KPanel16Block; P] = std::array::from_fn(|p| unsafe { panels[p].get_unchecked(b) });
    let zero = [[_mm512_setzero_si512(); P]; R];
    let mut isum = zero;
    // Four weights per vpdpbusd, so a span is 4 (or 8) of them.
    let steps = K::SCALE_SPAN / 4;
    for span in 0..QK_K / K::SCALE_SPAN {
        let mut dot = zero;
        for s in span * steps..(span + 1) * steps {
            let mut ws = [_mm512_setzero_si512(); R];
            for r in 0..R {
                // SAFETY: bytes 4s..4s + 4 of q are readable (s < 64).
                let g = unsafe { (prep[r].q.as_ptr().add(4 * s) as *const i32).read() };
                ws[r] = _mm512_set1_epi32(g);
            }
            for p in 0..P {
                // SAFETY: qs[s] is 64 readable, 64-byte aligned bytes.
                let xs = unsafe { _mm512_load_si512(pb[p].qs[s].as_ptr() as *const __m512i) };
                for r in 0..R {
                    dot[r][p] = _mm512_dpbusd_epi32(dot[r][p], ws[r], xs);
                }
            }
        }
        // The span's first group's scale: for 32-weight spans both groups share it.
        let g = span * K::SCALE_SPAN / 16;
        for r in 0..R {
            let sc = _mm512_set1_epi32(prep[r].sc[g]);
            for p in 0..P {
                isum[r][p] = _mm512_add_epi32(isum[r][p], _mm512_mullo_epi32(dot[r][p], sc));
            }
        }
    }
    let mut msum = zero;
    for h in 0..GROUPS / 2 {
        let mut mn = [_mm512_setzero_si512(); R];
        for r in 0..R {
            mn[r] = _mm512_set1_epi32(prep[r].mn[h]);
        }
        for p in 0..P {
            // SAFETY: bsums[h] is 64 readable, 64-byte aligned bytes.
            let bs = unsafe { _mm512_load_si512(pb[p].bsums[h].as_ptr() as *const __m512i) };
            for r in 0..R {
                msum[r][p] = _mm512_dpwssd_epi32(msum[r][p], mn[r], bs);
            }
        }
    }
    for r in 0..R {
        let dv = _mm512_set1_ps(prep[r].d);
        let dm = _mm512_set1_ps(prep[r].dmin);
        for p in 0..P {
            // SAFETY: d is 16 floats, 64-byte aligned inside the panel block.
            let d8 = unsafe { _mm512_load_ps(pb[p].d.as_ptr()) };
            // SAFETY: AVX-512F and FMA by the caller's contract.
            acc[r][p] = unsafe { accumulate16::<K>(acc[r][p], isum[r][p], msum[r][p], dv, dm, d8) };
        }
    }
}

/// One super-block's float steps for 16 outputs, as the scalar reference's
/// ([`super::kformat::accumulate`]): `fnmadd` is `fma(−msum, dmin · d8, acc)` with the same
/// single rounding. `d` and `dmin` are the weight row's, broadcast; `d8` the activations'.
///
/// # Safety
/// AVX-512F and FMA available.
#[inline(always)]
pub(super) unsafe fn accumulate16<K: KFormat>(
    acc: __m512,
    isum: __m512i,
    msum: __m512i,
    d: __m512,
    dmin: __m512,
    d8: __m512,
) -> __m512 {
    if K::HAS_DMIN {
        let a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, d8), acc);
        _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, d8), a)
    } else {
        let diff = _mm512_sub_epi32(isum, msum);
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(diff), _mm512_mul_ps(d, d8), acc)
    }
}
