//! AVX2 row dot products for every weight format (see [`super::dot`]): a block's `q` are
//! unpacked into 32 bytes once, then multiplied against each activation row with `maddubs`
//! (unsigned × signed bytes into i16 pairs, no saturation since 15·127·2 and 128·127·2 fit in
//! i16). Q8_0's signed weights use ggml's sign trick: `|q| · (q8 · sign(q))`.

use std::arch::x86_64::*;

use super::format::Format;
use super::q8_1::BlockQ8_1;

/// Horizontal sum of 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// One block of the weight row against block `b` of every activation row.
///
/// # Safety
/// AVX2/FMA/F16C available; `wb` points at one whole block; `b < xs[r].len()` for every row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<F: Format, const R: usize>(
    wb: *const u8,
    xs: &[&[BlockQ8_1]; R],
    b: usize,
    acc: &mut [__m256; R],
    summs: &mut [f32; R],
) {
    // SAFETY: by the caller's contract.
    let (q, (d, m)) = unsafe { (F::unpack(wb), F::scales_f16c(wb)) };
    let qa = if F::SIGNED { _mm256_sign_epi8(q, q) } else { q };
    for r in 0..R {
        // SAFETY: b < xs[r].len() (caller's contract).
        let xb = unsafe { xs[r].get_unchecked(b) };
        // SAFETY: qs is 32 readable bytes.
        let x = unsafe { _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i) };
        let x = if F::SIGNED { _mm256_sign_epi8(x, q) } else { x };
        let p16 = _mm256_maddubs_epi16(qa, x);
        let p32 = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), p32, acc[r]);
        if F::HAS_OFFSET {
            summs[r] += m * xb.s;
        }
    }
}

/// Dot products of weight row `w` against `R` activation rows.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` must be whole blocks and every `xs[r]` must
/// hold `w.len() / F::BLOCK_BYTES` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn row_dots<F: Format, const R: usize>(
    w: &[u8],
    xs: [&[BlockQ8_1]; R],
) -> [f32; R] {
    // Two accumulator sets (even and odd blocks) halve the FMA dependency chain; separate
    // offset sums too, one scalar add chain per block would bound the loop.
    let mut acc0 = [_mm256_setzero_ps(); R];
    let mut acc1 = [_mm256_setzero_ps(); R];
    let mut summs0 = [0.0f32; R];
    let mut summs1 = [0.0f32; R];
    let nb = w.len() / F::BLOCK_BYTES;
    let p = w.as_ptr();
    let mut b = 0;
    while b + 2 <= nb {
        // SAFETY: blocks b and b + 1 are inside w; features by contract.
        unsafe {
            block::<F, R>(p.add(b * F::BLOCK_BYTES), &xs, b, &mut acc0, &mut summs0);
            block::<F, R>(
                p.add((b + 1) * F::BLOCK_BYTES),
                &xs,
                b + 1,
                &mut acc1,
                &mut summs1,
            );
        }
        b += 2;
    }
    if b < nb {
        // SAFETY: as above; b is the last block.
        unsafe { block::<F, R>(p.add(b * F::BLOCK_BYTES), &xs, b, &mut acc0, &mut summs0) };
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r])) + (summs0[r] + summs1[r]);
    }
    out
}
