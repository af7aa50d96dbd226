//! The ggml `block_q5_K` layout (176 bytes per 256 weights): `f16 d`, `f16 dmin`, 12 bytes of
//! 6-bit scales and minimums as in Q4_K, 32 bytes of fifth bits (bit `c` of byte `l` belongs
//! to weight `32 c + l`), then 128 bytes of nibbles laid out as Q4_K's.
//! Weight = `d · sc · q − dmin · m`.

use super::kformat::{f16_le, scales_k4, KBlock, KFormat};

/// ggml `block_q5_K`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q5K;

impl KFormat for Q5K {
    const BLOCK_BYTES: usize = 176;
    const HAS_DMIN: bool = true;
    const ZERO: i32 = 0;
    const SCALE_SPAN: usize = 32;

    fn unpack(wb: &[u8], out: &mut KBlock) {
        out.d = f16_le(wb, 0);
        out.dmin = f16_le(wb, 2);
        (out.sc, out.mn) = scales_k4(&wb[4..16]);
        let qh = &wb[16..48];
        for (j, run) in wb[48..176].chunks_exact(32).enumerate() {
            for (l, &b) in run.iter().enumerate() {
                out.q[64 * j + l] = (b & 0x0F) | ((qh[l] >> (2 * j)) & 1) << 4;
                out.q[64 * j + 32 + l] = (b >> 4) | ((qh[l] >> (2 * j + 1)) & 1) << 4;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack_avx2(wb: *const u8) -> super::kformat::KBlockAvx2 {
        use super::kformat::{f16_pair_f16c, scales_k4_avx2, KBlockAvx2};
        use std::arch::x86_64::*;
        // SAFETY: the block's 176 bytes are readable (caller's contract); features likewise.
        unsafe {
            let (sc, mn) = scales_k4_avx2(wb.add(4));
            let (d, dmin) = f16_pair_f16c(wb);
            let mask = _mm256_set1_epi8(0x0F);
            let bit4 = _mm256_set1_epi8(0x10);
            // Shifted right one bit per vector: bit 0 of every byte is the next vector's bit
            // (16-bit shifts bring the neighbour byte's bits only into bits 1..8).
            let mut h = _mm256_loadu_si256(wb.add(16) as *const __m256i);
            let mut q = [_mm256_setzero_si256(); 8];
            for j in 0..4 {
                let v = _mm256_loadu_si256(wb.add(48 + 32 * j) as *const __m256i);
                let lo = _mm256_and_si256(v, mask);
                q[2 * j] = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(h), bit4));
                h = _mm256_srli_epi16::<1>(h);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
                q[2 * j + 1] =
                    _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<4>(h), bit4));
                h = _mm256_srli_epi16::<1>(h);
            }
            KBlockAvx2 { q, sc, mn, d, dmin }
        }
    }
}
