//! The ggml `block_q6_K` layout (210 bytes per 256 weights): 128 bytes of low nibbles, 64
//! bytes of high 2-bit pairs, 16 signed 8-bit scales (one per 16 weights), then `f16 d`.
//! In each 128-weight half `h`, byte `l` (0..32) of the half's 64 low bytes holds weights
//! `l` (low nibble) and `64 + l` (high), byte `32 + l` weights `32 + l` and `96 + l`, and
//! high byte `l` the top two bits of weights `l`, `32 + l`, `64 + l` and `96 + l`, two bits
//! each from the bottom. Weight = `d · sc · (q − 32)`.

use super::kformat::{f16_le, KBlock, KFormat, GROUPS};

/// ggml `block_q6_K`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q6K;

impl KFormat for Q6K {
    const BLOCK_BYTES: usize = 210;
    const HAS_DMIN: bool = false;
    const ZERO: i32 = 32;
    const SCALE_SPAN: usize = 16;

    fn unpack(wb: &[u8], out: &mut KBlock) {
        let (ql, qh) = (&wb[..128], &wb[128..192]);
        for h in 0..2 {
            for l in 0..32 {
                let (a, b, hb) = (ql[64 * h + l], ql[64 * h + 32 + l], qh[32 * h + l]);
                let o = &mut out.q[128 * h..128 * h + 128];
                o[l] = (a & 0x0F) | (hb & 3) << 4;
                o[32 + l] = (b & 0x0F) | ((hb >> 2) & 3) << 4;
                o[64 + l] = (a >> 4) | ((hb >> 4) & 3) << 4;
                o[96 + l] = (b >> 4) | ((hb >> 6) & 3) << 4;
            }
        }
        for g in 0..GROUPS {
            out.sc[g] = wb[192 + g] as i8 as i16;
            out.mn[g] = Self::ZERO as i16 * out.sc[g];
        }
        out.d = f16_le(wb, 208);
        out.dmin = 0.0;
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack_avx2(wb: *const u8) -> super::kformat::KBlockAvx2 {
        use super::kformat::KBlockAvx2;
        use std::arch::x86_64::*;
        // SAFETY: the block's 210 bytes are readable (caller's contract); features likewise.
        unsafe {
            let mask = _mm256_set1_epi8(0x0F);
            let top = _mm256_set1_epi8(0x30);
            let mut q = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                let a = _mm256_loadu_si256(wb.add(64 * h) as *const __m256i);
                let b = _mm256_loadu_si256(wb.add(64 * h + 32) as *const __m256i);
                let hb = _mm256_loadu_si256(wb.add(128 + 32 * h) as *const __m256i);
                // Each pair of high bits moved to bits 4..6 of its byte, then masked (the
                // 16-bit shifts only move bits the mask drops across bytes).
                q[4 * h] = _mm256_or_si256(
                    _mm256_and_si256(a, mask),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(hb), top),
                );
                q[4 * h + 1] = _mm256_or_si256(
                    _mm256_and_si256(b, mask),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(hb), top),
                );
                q[4 * h + 2] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(a), mask),
                    _mm256_and_si256(hb, top),
                );
                q[4 * h + 3] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(b), mask),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(hb), top),
                );
            }
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192) as *const __m128i));
            let d = f16_le(std::slice::from_raw_parts(wb.add(208), 2), 0);
            KBlockAvx2 {
                q,
                sc,
                mn: _mm256_slli_epi16::<5>(sc),
                d,
                dmin: 0.0,
            }
        }
    }
}
