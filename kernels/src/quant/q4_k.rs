//! The ggml `block_q4_K` layout (144 bytes per 256 weights): `f16 d`, `f16 dmin`, 12 bytes of
//! 6-bit scales and minimums for the eight 32-weight sub-blocks, then 128 bytes of nibbles;
//! byte `l` of each 32-byte run `j` holds weight `64 j + l` (low) and `64 j + 32 + l` (high).
//! Weight = `d · sc · q − dmin · m`.

use super::kformat::{f16_le, scales_k4, KBlock, KFormat};

/// ggml `block_q4_K`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q4K;

impl KFormat for Q4K {
    const BLOCK_BYTES: usize = 144;
    const HAS_DMIN: bool = true;
    const ZERO: i32 = 0;
    const SCALE_SPAN: usize = 32;

    fn unpack(wb: &[u8], out: &mut KBlock) {
        out.d = f16_le(wb, 0);
        out.dmin = f16_le(wb, 2);
        (out.sc, out.mn) = scales_k4(&wb[4..16]);
        for (j, run) in wb[16..144].chunks_exact(32).enumerate() {
            for (l, &b) in run.iter().enumerate() {
                out.q[64 * j + l] = b & 0x0F;
                out.q[64 * j + 32 + l] = b >> 4;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack_avx2(wb: *const u8) -> super::kformat::KBlockAvx2 {
        use super::kformat::{f16_pair_f16c, scales_k4_avx2, KBlockAvx2};
        use std::arch::x86_64::*;
        // SAFETY: the block's 144 bytes are readable (caller's contract); features likewise.
        unsafe {
            let (sc, mn) = scales_k4_avx2(wb.add(4));
            let (d, dmin) = f16_pair_f16c(wb);
            let mask = _mm256_set1_epi8(0x0F);
            let mut q = [_mm256_setzero_si256(); 8];
            for j in 0..4 {
                let v = _mm256_loadu_si256(wb.add(16 + 32 * j) as *const __m256i);
                q[2 * j] = _mm256_and_si256(v, mask);
                q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
            }
            KBlockAvx2 { q, sc, mn, d, dmin }
        }
    }
}
