//! Q4_1 × Q8_1 block dot products, after ggml's `ggml_vec_dot_q4_1_q8_1`: per block
//! `d4 * d8 * Σ q4·q8 + m4 * s8`. The AVX2 path unpacks the 32 nibbles into bytes once and
//! multiplies them against up to `R` activation rows (`maddubs`: unsigned × signed bytes, no
//! overflow since 15 · 127 · 2 < 2¹⁵), so a batch reuses each unpacked weight block.

use super::q4_1::{f16_at, Q4_1_BLOCK_BYTES, QK};
use super::q8_1::BlockQ8_1;

/// Which dot-product implementation a matmul runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotKernel {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2 + FMA + F16C (x86-64 only; runs only where [`DotKernel::is_supported`]).
    Avx2,
}

impl DotKernel {
    /// The fastest kernel this CPU supports (checked at run time).
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return DotKernel::Avx2;
            }
        }
        DotKernel::Portable
    }

    /// Whether this kernel can run on this CPU.
    pub fn is_supported(self) -> bool {
        match self {
            DotKernel::Portable => true,
            DotKernel::Avx2 => DotKernel::detect() == DotKernel::Avx2,
        }
    }

    /// Dot products of one Q4_1 weight row `w` against `R` Q8_1 activation rows.
    ///
    /// # Panics
    /// If a row's block count differs from `w`'s, or this kernel is not supported here.
    #[inline]
    pub fn dot<const R: usize>(self, w: &[u8], xs: [&[BlockQ8_1]; R]) -> [f32; R] {
        assert!(
            self.is_supported(),
            "{self:?} kernel is not supported on this CPU"
        );
        // SAFETY: support checked just above.
        unsafe { self.dot_unchecked(w, xs) }
    }

    /// [`DotKernel::dot`] without the CPU-support check, for inner loops whose caller checked
    /// once.
    ///
    /// # Safety
    /// `self.is_supported()` must be true.
    ///
    /// # Panics
    /// If a row's block count differs from `w`'s.
    #[inline]
    pub(crate) unsafe fn dot_unchecked<const R: usize>(
        self,
        w: &[u8],
        xs: [&[BlockQ8_1]; R],
    ) -> [f32; R] {
        let nb = w.len() / Q4_1_BLOCK_BYTES;
        assert_eq!(
            nb * Q4_1_BLOCK_BYTES,
            w.len(),
            "Q4_1 row is not whole blocks"
        );
        for x in &xs {
            assert_eq!(x.len(), nb, "Q8_1 row and Q4_1 row differ in block count");
        }
        match self {
            DotKernel::Portable => dot_portable(w, xs),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the caller guarantees AVX2/FMA/F16C; lengths checked above.
            DotKernel::Avx2 => unsafe { avx2::dot(w, xs) },
            #[cfg(not(target_arch = "x86_64"))]
            DotKernel::Avx2 => unreachable!("AVX2 is never supported off x86-64"),
        }
    }
}

fn dot_portable<const R: usize>(w: &[u8], xs: [&[BlockQ8_1]; R]) -> [f32; R] {
    let mut acc = [0.0f32; R];
    for (b, wb) in w.chunks_exact(Q4_1_BLOCK_BYTES).enumerate() {
        let (d4, m4) = (f16_at(wb, 0), f16_at(wb, 2));
        for (r, x) in xs.iter().enumerate() {
            let xb = &x[b];
            let mut sum = 0i32;
            for j in 0..QK / 2 {
                let q = wb[4 + j];
                sum += (q & 0x0F) as i32 * xb.qs[j] as i32
                    + (q >> 4) as i32 * xb.qs[j + QK / 2] as i32;
            }
            acc[r] += d4 * xb.d * sum as f32 + m4 * xb.s;
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// Horizontal sum of 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// One block of `w` against block `b` of every row: accumulates into `acc` and `summs`.
    ///
    /// # Safety
    /// AVX2/FMA/F16C available; `wb` is one 20-byte block; `b < xs[r].len()` for every row.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block<const R: usize>(
        wb: &[u8],
        xs: &[&[BlockQ8_1]; R],
        b: usize,
        acc: &mut [__m256; R],
        summs: &mut [f32; R],
    ) {
        // d and m are adjacent f16s: convert both with one F16C instruction.
        let dm_bits = i32::from_le_bytes([wb[0], wb[1], wb[2], wb[3]]);
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));
        let d4 = _mm_cvtss_f32(dm);
        let m4 = _mm_cvtss_f32(_mm_movehdup_ps(dm));
        // SAFETY: wb[4..20] is 16 readable bytes; loadu has no alignment requirement.
        let packed = unsafe { _mm_loadu_si128(wb.as_ptr().add(4) as *const __m128i) };
        // Low nibbles are values 0..16, high nibbles 16..32: the same order as Q8_1's qs.
        let hi = _mm_srli_epi16::<4>(packed);
        let q4 = _mm256_and_si256(_mm256_set_m128i(hi, packed), _mm256_set1_epi8(0x0F));
        for r in 0..R {
            // SAFETY: b < xs[r].len() (caller's contract).
            let xb = unsafe { xs[r].get_unchecked(b) };
            // SAFETY: qs is 32 readable bytes.
            let q8 = unsafe { _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i) };
            let p16 = _mm256_maddubs_epi16(q4, q8);
            let p32 = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d4 * xb.d), p32, acc[r]);
            summs[r] += m4 * xb.s;
        }
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; every `xs[r]` must hold `w.len() / 20` blocks.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot<const R: usize>(w: &[u8], xs: [&[BlockQ8_1]; R]) -> [f32; R] {
        // Two accumulator sets (even and odd blocks) halve the FMA dependency chain.
        let mut acc0 = [_mm256_setzero_ps(); R];
        let mut acc1 = [_mm256_setzero_ps(); R];
        // Separate offset sums too: one scalar add chain per block would bound the loop.
        let mut summs0 = [0.0f32; R];
        let mut summs1 = [0.0f32; R];
        let mut blocks = w.chunks_exact(2 * Q4_1_BLOCK_BYTES);
        let mut b = 0;
        for pair in &mut blocks {
            // SAFETY: features guaranteed by the caller; b + 1 < nb.
            unsafe {
                block(&pair[..Q4_1_BLOCK_BYTES], &xs, b, &mut acc0, &mut summs0);
                block(
                    &pair[Q4_1_BLOCK_BYTES..],
                    &xs,
                    b + 1,
                    &mut acc1,
                    &mut summs1,
                );
            }
            b += 2;
        }
        let rest = blocks.remainder();
        if !rest.is_empty() {
            // SAFETY: as above; b is the last block.
            unsafe { block(rest, &xs, b, &mut acc0, &mut summs0) };
        }
        let mut out = [0.0f32; R];
        for r in 0..R {
            out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r])) + (summs0[r] + summs1[r]);
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::quant::q4_1::dequantize_q4_1;
    use crate::quant::q8_1::quantize_q8_1;
    use crate::test_util::{random_vec, rng};
    use rand::rngs::StdRng;
    use rand::Rng;

    /// `n_blocks` random Q4_1 blocks: every nibble value, scales like real weights.
    pub(crate) fn random_q4_1(r: &mut StdRng, n_blocks: usize) -> Vec<u8> {
        let mut w = Vec::with_capacity(n_blocks * Q4_1_BLOCK_BYTES);
        for _ in 0..n_blocks {
            let d: f32 = r.random_range(0.001..0.05);
            let m: f32 = -d * r.random_range(0.0..15.0);
            w.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
            w.extend_from_slice(&half::f16::from_f32(m).to_le_bytes());
            w.extend((0..16).map(|_| r.random::<u8>()));
        }
        w
    }

    /// Exact value (f64) of the Q4_1 · Q8_1 product the kernels compute.
    pub(crate) fn dequantised_dot(w: &[u8], x: &[BlockQ8_1]) -> f64 {
        let mut wf = vec![0.0; w.len() / Q4_1_BLOCK_BYTES * QK];
        dequantize_q4_1(w, &mut wf);
        let xf = x
            .iter()
            .flat_map(|b| b.qs.iter().map(move |q| b.d as f64 * *q as f64));
        wf.iter().zip(xf).map(|(a, b)| *a as f64 * b).sum()
    }

    fn kernels() -> Vec<DotKernel> {
        let mut k = vec![DotKernel::Portable];
        if DotKernel::Avx2.is_supported() {
            k.push(DotKernel::Avx2);
        }
        k
    }

    #[test]
    fn every_kernel_matches_the_dequantised_dot() {
        let mut r = rng(60);
        for nb in [1, 2, 3, 18, 48] {
            let w = random_q4_1(&mut r, nb);
            let rows: Vec<Vec<BlockQ8_1>> = (0..4)
                .map(|_| {
                    let x = random_vec(&mut r, nb * QK, 3.0);
                    let mut q = vec![BlockQ8_1::default(); nb];
                    quantize_q8_1(&x, &mut q);
                    q
                })
                .collect();
            for k in kernels() {
                let four = k.dot(&w, [&rows[0], &rows[1], &rows[2], &rows[3]]);
                for (i, row) in rows.iter().enumerate() {
                    let want = dequantised_dot(&w, row);
                    let one = k.dot(&w, [row.as_slice()])[0];
                    let tol = 1e-5 * (1.0 + want.abs()) + 1e-4 * nb as f64;
                    assert!(
                        (one as f64 - want).abs() <= tol,
                        "{k:?} nb {nb}: {one} vs {want}"
                    );
                    assert_eq!(one, four[i], "{k:?}: batched and single dot differ");
                }
            }
        }
    }

    #[test]
    fn detect_returns_a_supported_kernel() {
        assert!(DotKernel::detect().is_supported());
    }

    #[test]
    #[should_panic(expected = "block count")]
    fn rejects_mismatched_rows() {
        let w = vec![0u8; 2 * Q4_1_BLOCK_BYTES];
        DotKernel::Portable.dot(&w, [&[BlockQ8_1::default()][..]]);
    }
}
