//! The ggml `block_q4_0` layout: 32 weights as `f16 d`, then 16 bytes whose low nibbles hold
//! weights 0..16 and high nibbles weights 16..32; weight = `d * (q - 8)`.

use super::q4_1::{f16_at, QK};

/// Bytes of one Q4_0 block in a GGUF file.
pub const Q4_0_BLOCK_BYTES: usize = 18;

/// Dequantises Q4_0 blocks `w` into `out` (32 values per block), as ggml's
/// `dequantize_row_q4_0`.
///
/// # Panics
/// If `w` is not whole blocks or `out` does not hold 32 values per block.
pub fn dequantize_q4_0(w: &[u8], out: &mut [f32]) {
    assert!(
        w.len().is_multiple_of(Q4_0_BLOCK_BYTES),
        "dequantize_q4_0: partial block"
    );
    assert_eq!(
        out.len(),
        w.len() / Q4_0_BLOCK_BYTES * QK,
        "dequantize_q4_0: out length"
    );
    for (block, o) in w
        .chunks_exact(Q4_0_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = f16_at(block, 0);
        for (j, &q) in block[2..].iter().enumerate() {
            o[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
            o[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantises_nibbles_in_ggml_order() {
        let mut block = vec![0u8; Q4_0_BLOCK_BYTES];
        block[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        for j in 0..16 {
            block[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0.0; QK];
        dequantize_q4_0(&block, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(out[j + 16], (7.0 - j as f32) * 0.5);
        }
    }
}
