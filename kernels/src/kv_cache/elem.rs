//! Row operations of paged attention over the three KV element types: dot product with a
//! query, `out += w · row`, and (AVX2) eight values widened to f32 lanes. Rows are read in
//! their stored type and widened on the fly, as vLLM's fp8 and llama.cpp's f16 KV caches do,
//! so a quantised cache is never expanded in memory.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// A KV cache element: f32, f16 or i8 (the int8 scale is applied by the caller).
pub(crate) trait KvElem: Copy + Send + Sync + 'static {
    /// The value as f32 (portable path).
    fn to_f32(self) -> f32;

    /// Eight consecutive values as f32 lanes.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `p..p + 8` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;

    /// Sixteen consecutive values as f32 lanes.
    ///
    /// # Safety
    /// AVX-512F available; `p..p + 16` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> __m512;
}

impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: the caller guarantees 8 readable values; loadu has no alignment need.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: the caller guarantees 16 readable values.
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl KvElem for half::f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: 8 readable f16s are 16 bytes; F16C guaranteed by the caller.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: 16 readable f16s are 32 bytes; AVX-512F guaranteed by the caller.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
}

impl KvElem for i8 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: 8 readable bytes; AVX2 guaranteed by the caller.
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: 16 readable bytes; AVX-512F guaranteed by the caller.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))) }
    }
}

/// `Σ q[i] · row[i]`, portable: eight independent accumulators so LLVM vectorises it.
#[inline(always)]
pub(crate) fn dot<E: KvElem>(q: &[f32], row: &[E]) -> f32 {
    debug_assert_eq!(q.len(), row.len());
    let mut acc = [0f32; 8];
    let cq = q.chunks_exact(8);
    let cr = row.chunks_exact(8);
    let tail: f32 = cq
        .remainder()
        .iter()
        .zip(cr.remainder())
        .map(|(a, b)| a * b.to_f32())
        .sum();
    for (a, b) in cq.zip(cr) {
        for i in 0..8 {
            acc[i] += a[i] * b[i].to_f32();
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `out[i] += w · row[i]`, portable.
#[inline(always)]
pub(crate) fn axpy<E: KvElem>(out: &mut [f32], w: f32, row: &[E]) {
    debug_assert_eq!(out.len(), row.len());
    for (o, v) in out.iter_mut().zip(row) {
        *o += w * v.to_f32();
    }
}

/// AVX2 builds of the row operations. Each is `inline(always)` and only called from
/// functions compiled with `#[target_feature(enable = "avx2,fma,f16c")]`.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::*;

    /// Horizontal sum of 8 lanes.
    #[inline(always)]
    pub(crate) unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: AVX guaranteed by the caller.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// `Σ q[i] · row[i]`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `q.len() == row.len()`.
    #[inline(always)]
    pub(crate) unsafe fn dot<E: KvElem>(q: &[f32], row: &[E]) -> f32 {
        debug_assert_eq!(q.len(), row.len());
        let n = q.len();
        let (qp, rp) = (q.as_ptr(), row.as_ptr());
        let mut i = 0;
        // SAFETY: every load below reads indices < n of both slices; features by contract.
        unsafe {
            let mut acc0 = _mm256_setzero_ps();
            let mut acc1 = _mm256_setzero_ps();
            while i + 16 <= n {
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(i)), E::load8(rp.add(i)), acc0);
                acc1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(qp.add(i + 8)),
                    E::load8(rp.add(i + 8)),
                    acc1,
                );
                i += 16;
            }
            if i + 8 <= n {
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(i)), E::load8(rp.add(i)), acc0);
                i += 8;
            }
            let mut sum = hsum(_mm256_add_ps(acc0, acc1));
            while i < n {
                sum += *qp.add(i) * (*rp.add(i)).to_f32();
                i += 1;
            }
            sum
        }
    }

    /// `out[i] += w · row[i]`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `out.len() == row.len()`.
    #[inline(always)]
    pub(crate) unsafe fn axpy<E: KvElem>(out: &mut [f32], w: f32, row: &[E]) {
        debug_assert_eq!(out.len(), row.len());
        let n = out.len();
        let (op, rp) = (out.as_mut_ptr(), row.as_ptr());
        let mut i = 0;
        // SAFETY: indices < n of both slices; features by contract.
        unsafe {
            let wv = _mm256_set1_ps(w);
            while i + 8 <= n {
                let o = _mm256_fmadd_ps(wv, E::load8(rp.add(i)), _mm256_loadu_ps(op.add(i)));
                _mm256_storeu_ps(op.add(i), o);
                i += 8;
            }
            while i < n {
                *op.add(i) += w * (*rp.add(i)).to_f32();
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close, random_vec, rng};

    /// The AVX2 row ops compiled with their features, as attention calls them.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2_ops<E: KvElem>(q: &[f32], row: &[E], out: &mut [f32]) -> f32 {
        // SAFETY: features enabled on this function; the caller checks the CPU.
        unsafe {
            avx2::axpy(out, 0.7, row);
            avx2::dot(q, row)
        }
    }

    fn check<E: KvElem>(make: impl Fn(f32) -> E) {
        let mut r = rng(11);
        for n in 0..70 {
            let q = random_vec(&mut r, n, 1.0);
            let row: Vec<E> = random_vec(&mut r, n, 3.0).into_iter().map(&make).collect();
            let naive: f64 = q
                .iter()
                .zip(&row)
                .map(|(a, b)| *a as f64 * b.to_f32() as f64)
                .sum();
            assert_close(&[dot(&q, &row)], &[naive as f32], 1e-4, 1e-5);
            let base = random_vec(&mut r, n, 1.0);
            let want: Vec<f32> = base
                .iter()
                .zip(&row)
                .map(|(o, v)| o + 0.7 * v.to_f32())
                .collect();
            let mut out = base.clone();
            axpy(&mut out, 0.7, &row);
            assert_close(&out, &want, 1e-6, 1e-6);
            #[cfg(target_arch = "x86_64")]
            if crate::cpu::avx2() {
                let mut out = base.clone();
                // SAFETY: features detected just above; lengths equal.
                let d = unsafe { avx2_ops(&q, &row, &mut out) };
                assert_close(&[d], &[naive as f32], 1e-4, 1e-5);
                assert_close(&out, &want, 1e-6, 1e-6);
            }
        }
    }

    #[test]
    fn row_ops_match_naive_for_every_element_type_and_length() {
        check::<f32>(|v| v);
        check::<half::f16>(half::f16::from_f32);
        check::<i8>(|v| (v * 40.0) as i8);
    }
}
