//! AVX2 quantised matmul for small batches: eight weight rows at a time, one per 32-bit lane.
//!
//! For each block, the eight rows' `q` are unpacked into bytes and multiplied against the
//! activation block (`maddubs` + `madd`, or AVX-VNNI's `vpdpbusd`; Q8_0's signed weights use
//! ggml's sign trick `|q| · (q8 · sign(q))`); a `hadd` tree turns the eight partial-sum
//! vectors into one vector of eight exact block sums, and one FMA per block applies
//! `d · d8` for all eight rows (their scales gathered into one vector with one F16C
//! conversion). So the horizontal sum and the scale work of ggml's per-row
//! `ggml_vec_dot_*` are shared eight ways, and the per-output arithmetic is exactly that of
//! the portable dot product and the panel GEMM (see [`super::format`]).

use std::arch::x86_64::*;

use super::format::Format;
use super::matmul::OutCols;
use super::q8_1::BlockQ8_1;

/// Weight rows per group (one per lane).
pub(super) const GROUP: usize = 8;

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` and the activation rows `xs`
/// (up to 4 rows share each unpacked weight block).
///
/// # Safety
/// AVX2, FMA and F16C available (and AVX-VNNI for `VNNI = true`, see [`gemv_vnni`]); `w` is
/// `rows` rows of `nb` blocks of `F`; each `xs` row holds `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemv<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[&[BlockQ8_1]],
    out: &mut OutCols,
) {
    // SAFETY: by the caller's contract.
    unsafe { gemv_body::<F, false>(w, rows, nb, xs, out) }
}

/// [`gemv`] with AVX-VNNI's `vpdpbusd`.
///
/// # Safety
/// As [`gemv`], and AVX-VNNI available.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn gemv_vnni<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[&[BlockQ8_1]],
    out: &mut OutCols,
) {
    // SAFETY: by the caller's contract.
    unsafe { gemv_body::<F, true>(w, rows, nb, xs, out) }
}

#[inline(always)]
unsafe fn gemv_body<F: Format, const VNNI: bool>(
    w: &[u8],
    rows: usize,
    nb: usize,
    xs: &[&[BlockQ8_1]],
    out: &mut OutCols,
) {
    let row_bytes = nb * F::BLOCK_BYTES;
    debug_assert_eq!(w.len(), rows * row_bytes);
    for j0 in (0..rows).step_by(GROUP) {
        let valid = GROUP.min(rows - j0);
        // Rows past the end repeat the group's first row: computed, never stored.
        let ptrs: [*const u8; GROUP] = std::array::from_fn(|jj| {
            let j = if jj < valid { j0 + jj } else { j0 };
            w[j * row_bytes..(j + 1) * row_bytes].as_ptr()
        });
        let mut i = 0;
        while i < xs.len() {
            let left = xs.len() - i;
            // SAFETY (all arms): features by contract; every pointer addresses nb blocks and
            // every activation row nb blocks.
            match left {
                1 => unsafe { group::<F, 1, VNNI>(&ptrs, nb, [xs[i]], i, j0, valid, out) },
                2 => unsafe { group::<F, 2, VNNI>(&ptrs, nb, [xs[i], xs[i + 1]], i, j0, valid, out) },
                3 => unsafe {
                    group::<F, 3, VNNI>(&ptrs, nb, [xs[i], xs[i + 1], xs[i + 2]], i, j0, valid, out)
                },
                _ => unsafe {
                    let four = [xs[i], xs[i + 1], xs[i + 2], xs[i + 3]];
                    group::<F, 4, VNNI>(&ptrs, nb, four, i, j0, valid, out)
                },
            }
            i += left.min(4);
        }
    }
}

/// Eight weight rows against `R` activation rows (rows `i0..i0 + R`); stores the `valid`
/// lanes to columns `j0..j0 + valid`.
#[inline(always)]
unsafe fn group<F: Format, const R: usize, const VNNI: bool>(
    ptrs: &[*const u8; GROUP],
    nb: usize,
    xs: [&[BlockQ8_1]; R],
    i0: usize,
    j0: usize,
    valid: usize,
    out: &mut OutCols,
) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let at = b * F::BLOCK_BYTES;
        // SAFETY (whole block): each pointer addresses nb blocks (caller's contract).
        let q: [__m256i; GROUP] = std::array::from_fn(|jj| unsafe { F::unpack(ptrs[jj].add(at)) });
        let (dv, mv) = unsafe { scales8::<F>(ptrs, at) };
        for r in 0..R {
            let xb = &xs[r][b];
            // SAFETY: qs is 32 readable bytes.
            let x = unsafe { _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i) };
            // SAFETY: features by the caller's contract.
            let p: [__m256i; GROUP] = std::array::from_fn(|jj| unsafe {
                let (wa, xv) = if F::SIGNED {
                    (_mm256_sign_epi8(q[jj], q[jj]), _mm256_sign_epi8(x, q[jj]))
                } else {
                    (q[jj], x)
                };
                if VNNI {
                    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), wa, xv)
                } else {
                    _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xv), ones)
                }
            });
            let isum = unsafe { reduce8(p) };
            let dd = _mm256_mul_ps(dv, _mm256_set1_ps(xb.d));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[r]);
            if F::HAS_OFFSET {
                acc[r] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xb.s), acc[r]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        let mut lanes = [0.0f32; GROUP];
        // SAFETY: lanes holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *a) };
        for (jj, &v) in lanes.iter().enumerate().take(valid) {
            out.set(i0 + r, j0 + jj, v);
        }
    }
}

/// `d` and `m` of block `at` of the eight rows, as vectors (one F16C conversion each).
#[inline(always)]
unsafe fn scales8<F: Format>(ptrs: &[*const u8; GROUP], at: usize) -> (__m256, __m256) {
    // SAFETY: each pointer addresses a whole block at `at` (caller's contract).
    let gather = |off: usize| unsafe {
        let h: [i16; GROUP] =
            std::array::from_fn(|jj| (ptrs[jj].add(at + off) as *const i16).read_unaligned());
        _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i))
    };
    let d = gather(0);
    let m = match F::M_AT {
        Some(off) => gather(off),
        None => _mm256_mul_ps(d, _mm256_set1_ps(F::M_PER_D)),
    };
    (d, m)
}

/// Lane `j` of the result is the (exact, i32) sum of the lanes of `p[j]`.
///
/// # Safety
/// AVX2 available.
#[inline(always)]
unsafe fn reduce8(p: [__m256i; GROUP]) -> __m256i {
    let s01 = _mm256_hadd_epi32(p[0], p[1]);
    let s23 = _mm256_hadd_epi32(p[2], p[3]);
    let s45 = _mm256_hadd_epi32(p[4], p[5]);
    let s67 = _mm256_hadd_epi32(p[6], p[7]);
    let s0123 = _mm256_hadd_epi32(s01, s23);
    let s4567 = _mm256_hadd_epi32(s45, s67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(s0123, s4567),
        _mm256_permute2x128_si256::<0x31>(s0123, s4567),
    )
}
