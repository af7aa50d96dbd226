//! The ggml `block_q2_K` layout (84 bytes per 256 weights): 16 bytes of scales (low nibble)
//! and minimums (high nibble), one per 16 weights, 64 bytes of 2-bit values (in each
//! 128-weight half `n`, bits `2 j..2 j + 2` of byte `l` of the half's 32 are weight
//! `128 n + 32 j + l`), then `f16 d` and `f16 dmin`. Weight = `d · sc · q − dmin · m`.

use super::kformat::{f16_le, KBlock, KFormat, GROUPS};

/// ggml `block_q2_K`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q2K;

impl KFormat for Q2K {
    const BLOCK_BYTES: usize = 84;
    const HAS_DMIN: bool = true;
    const ZERO: i32 = 0;
    const SCALE_SPAN: usize = 16;

    fn unpack(wb: &[u8], out: &mut KBlock) {
        for (g, &s) in wb[..GROUPS].iter().enumerate() {
            out.sc[g] = (s & 0x0F) as i16;
            out.mn[g] = (s >> 4) as i16;
        }
        let qs = &wb[16..80];
        for c in 0..8 {
            let (n, j) = (c / 4, c % 4);
            for l in 0..32 {
                out.q[32 * c + l] = (qs[32 * n + l] >> (2 * j)) & 3;
            }
        }
        out.d = f16_le(wb, 80);
        out.dmin = f16_le(wb, 82);
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack_avx2(wb: *const u8) -> super::kformat::KBlockAvx2 {
        use super::kformat::{f16_pair_f16c, KBlockAvx2};
        use std::arch::x86_64::*;
        // SAFETY: the block's 84 bytes are readable (caller's contract); features likewise.
        unsafe {
            let three = _mm256_set1_epi8(3);
            let mut q = [_mm256_setzero_si256(); 8];
            for n in 0..2 {
                let mut v = _mm256_loadu_si256(wb.add(16 + 32 * n) as *const __m256i);
                for j in 0..4 {
                    q[4 * n + j] = _mm256_and_si256(v, three);
                    v = _mm256_srli_epi16::<2>(v);
                }
            }
            let s = _mm_loadu_si128(wb as *const __m128i);
            let nib = _mm_set1_epi8(0x0F);
            let (d, dmin) = f16_pair_f16c(wb.add(80));
            KBlockAvx2 {
                q,
                sc: _mm256_cvtepu8_epi16(_mm_and_si128(s, nib)),
                mn: _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(s), nib)),
                d,
                dmin,
            }
        }
    }
}
