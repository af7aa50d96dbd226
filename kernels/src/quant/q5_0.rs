//! The ggml `block_q5_0` layout: 32 weights as `f16 d`, a little-endian `u32` whose bit `i`
//! is the fifth bit of weight `i`, then 16 bytes whose low nibbles hold weights 0..16 and
//! high nibbles weights 16..32; weight = `d * (q - 16)`.

use super::q4_1::{f16_at, QK};

/// Bytes of one Q5_0 block in a GGUF file.
pub const Q5_0_BLOCK_BYTES: usize = 22;

/// Dequantises Q5_0 blocks `w` into `out` (32 values per block), as ggml's
/// `dequantize_row_q5_0`.
///
/// # Panics
/// If `w` is not whole blocks or `out` does not hold 32 values per block.
pub fn dequantize_q5_0(w: &[u8], out: &mut [f32]) {
    assert!(
        w.len().is_multiple_of(Q5_0_BLOCK_BYTES),
        "dequantize_q5_0: partial block"
    );
    assert_eq!(
        out.len(),
        w.len() / Q5_0_BLOCK_BYTES * QK,
        "dequantize_q5_0: out length"
    );
    for (block, o) in w
        .chunks_exact(Q5_0_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = f16_at(block, 0);
        let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
        for (j, &q) in block[6..].iter().enumerate() {
            let lo = (q & 0x0F) as u32 | (qh >> j & 1) << 4;
            let hi = (q >> 4) as u32 | (qh >> (j + 16) & 1) << 4;
            o[j] = (lo as i32 - 16) as f32 * d;
            o[j + QK / 2] = (hi as i32 - 16) as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantises_high_bits_in_ggml_order() {
        let mut block = vec![0u8; Q5_0_BLOCK_BYTES];
        block[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        // High bits on weights 1 and 17 only.
        block[2..6].copy_from_slice(&(1u32 << 1 | 1 << 17).to_le_bytes());
        for j in 0..16 {
            block[6 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0.0; QK];
        dequantize_q5_0(&block, &mut out);
        for j in 0..16 {
            let hi_lo = if j == 1 { 16 } else { 0 };
            assert_eq!(out[j], (j as i32 + hi_lo - 16) as f32 * 0.5);
            assert_eq!(out[j + 16], (15 - j as i32 + hi_lo - 16) as f32 * 0.5);
        }
    }
}
