//! The ggml `block_q8_0` layout: 32 weights as `f16 d`, then 32 signed bytes; weight =
//! `d * q`.

use super::q4_1::{f16_at, QK};

/// Bytes of one Q8_0 block in a GGUF file.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// Dequantises Q8_0 blocks `w` into `out` (32 values per block), as ggml's
/// `dequantize_row_q8_0`.
///
/// # Panics
/// If `w` is not whole blocks or `out` does not hold 32 values per block.
pub fn dequantize_q8_0(w: &[u8], out: &mut [f32]) {
    assert!(
        w.len().is_multiple_of(Q8_0_BLOCK_BYTES),
        "dequantize_q8_0: partial block"
    );
    assert_eq!(
        out.len(),
        w.len() / Q8_0_BLOCK_BYTES * QK,
        "dequantize_q8_0: out length"
    );
    for (block, o) in w
        .chunks_exact(Q8_0_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = f16_at(block, 0);
        for (v, &q) in o.iter_mut().zip(&block[2..]) {
            *v = q as i8 as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantises_signed_bytes() {
        let mut block = vec![0u8; Q8_0_BLOCK_BYTES];
        block[..2].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
        for j in 0..QK {
            block[2 + j] = ((j as i32) * 8 - 128) as i8 as u8;
        }
        let mut out = [0.0; QK];
        dequantize_q8_0(&block, &mut out);
        for (j, v) in out.iter().enumerate() {
            assert_eq!(*v, (j as f32 * 8.0 - 128.0) * 0.25);
        }
    }
}
