//! The ggml `block_q3_K` layout (110 bytes per 256 weights): 32 bytes of third bits (bit `c`
//! of byte `l` belongs to weight `32 c + l`), 64 bytes of 2-bit pairs (in each 128-weight
//! half `n`, bits `2 j..2 j + 2` of byte `l` of the half's 32 are weight `128 n + 32 j + l`),
//! 12 bytes of sixteen 6-bit scales (stored `+ 32`), then `f16 d`.
//! Weight = `d · (sc − 32) · (q − 4)`.

use super::kformat::{f16_le, KBlock, KFormat, GROUPS};

/// ggml `block_q3_K`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q3K;

/// The sixteen signed scales of a block's 12 scale bytes (ggml's `kmask` shuffle): the low
/// four bits of scale `i` are nibble `i / 8` of byte `i % 8`, the high two bits pair `i / 4`
/// of byte `8 + i % 4`.
#[inline(always)]
fn scales(s: &[u8]) -> [i16; GROUPS] {
    std::array::from_fn(|i| {
        let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | high << 4) as i16 - 32
    })
}

impl KFormat for Q3K {
    const BLOCK_BYTES: usize = 110;
    const HAS_DMIN: bool = false;
    const ZERO: i32 = 4;
    const SCALE_SPAN: usize = 16;

    fn unpack(wb: &[u8], out: &mut KBlock) {
        let (hm, qs) = (&wb[..32], &wb[32..96]);
        for c in 0..8 {
            let (n, j) = (c / 4, c % 4);
            for l in 0..32 {
                out.q[32 * c + l] = ((qs[32 * n + l] >> (2 * j)) & 3) | ((hm[l] >> c) & 1) << 2;
            }
        }
        out.sc = scales(&wb[96..108]);
        for g in 0..GROUPS {
            out.mn[g] = Self::ZERO as i16 * out.sc[g];
        }
        out.d = f16_le(wb, 108);
        out.dmin = 0.0;
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack_avx2(wb: *const u8) -> super::kformat::KBlockAvx2 {
        use super::kformat::{load_i16x16, KBlockAvx2};
        use std::arch::x86_64::*;
        // SAFETY: the block's 110 bytes are readable (caller's contract); features likewise.
        unsafe {
            let three = _mm256_set1_epi8(3);
            let four = _mm256_set1_epi8(4);
            // Shifted right one bit per vector; bit 0 of every byte is the current third bit
            // (16-bit shifts bring the neighbour byte's bits only into the bits above).
            let mut h = _mm256_loadu_si256(wb as *const __m256i);
            let mut q = [_mm256_setzero_si256(); 8];
            for n in 0..2 {
                let mut v = _mm256_loadu_si256(wb.add(32 + 32 * n) as *const __m256i);
                for j in 0..4 {
                    q[4 * n + j] = _mm256_or_si256(
                        _mm256_and_si256(v, three),
                        _mm256_and_si256(_mm256_slli_epi16::<2>(h), four),
                    );
                    v = _mm256_srli_epi16::<2>(v);
                    h = _mm256_srli_epi16::<1>(h);
                }
            }
            let sc = scales(std::slice::from_raw_parts(wb.add(96), 12));
            let sc = load_i16x16(&sc);
            let d = f16_le(std::slice::from_raw_parts(wb.add(108), 2), 0);
            KBlockAvx2 {
                q,
                sc,
                mn: _mm256_slli_epi16::<2>(sc),
                d,
                dmin: 0.0,
            }
        }
    }
}
