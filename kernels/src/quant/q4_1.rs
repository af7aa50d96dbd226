//! The ggml `block_q4_1` layout: 32 weights as `f16 d`, `f16 m`, then 16 bytes whose low
//! nibbles hold weights 0..16 and high nibbles weights 16..32; weight = `d * q + m`.

/// Weights per Q4_1 (and Q8_1) block.
pub const QK: usize = 32;
/// Bytes of one Q4_1 block in a GGUF file.
pub const Q4_1_BLOCK_BYTES: usize = 20;

/// Reads a little-endian f16 at `bytes[at..at + 2]` as f32.
#[inline]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Dequantises Q4_1 blocks `w` into `out` (32 values per block), as ggml's
/// `dequantize_row_q4_1`; also serves an embedding lookup of a Q4_1 token table.
///
/// # Panics
/// If `w` is not whole blocks or `out` does not hold 32 values per block.
pub fn dequantize_q4_1(w: &[u8], out: &mut [f32]) {
    assert!(
        w.len().is_multiple_of(Q4_1_BLOCK_BYTES),
        "dequantize_q4_1: partial block"
    );
    assert_eq!(
        out.len(),
        w.len() / Q4_1_BLOCK_BYTES * QK,
        "dequantize_q4_1: out length"
    );
    for (block, o) in w
        .chunks_exact(Q4_1_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let (d, m) = (f16_at(block, 0), f16_at(block, 2));
        for (j, &q) in block[4..].iter().enumerate() {
            o[j] = (q & 0x0F) as f32 * d + m;
            o[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantises_nibbles_in_ggml_order() {
        let mut block = vec![0u8; Q4_1_BLOCK_BYTES];
        block[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        block[2..4].copy_from_slice(&half::f16::from_f32(-1.0).to_le_bytes());
        for j in 0..16 {
            block[4 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0.0; QK];
        dequantize_q4_1(&block, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 0.5 - 1.0);
            assert_eq!(out[j + 16], (15 - j) as f32 * 0.5 - 1.0);
        }
    }
}
