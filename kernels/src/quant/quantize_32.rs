//! f32 → the 32-weight block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), as llama.cpp quantises
//! without an importance matrix: `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`,
//! `quantize_row_q5_0_ref`, `quantize_row_q5_1_ref` and `quantize_row_q8_0_ref` of
//! `ggml-quants.c`, including their truncating casts.

use super::q4_1::QK;
use super::quantize_search::f16_bytes;

/// Bytes of one Q5_1 block (`f16 d`, `f16 m`, `u32` fifth bits, 16 nibble bytes). The runtime
/// does not multiply Q5_1 itself, but llama.cpp's Q5_K mixes fall back to it.
pub const Q5_1_BLOCK_BYTES: usize = 24;

/// Splits `x` and `out` into blocks after checking their lengths.
fn blocks<'a>(
    x: &'a [f32],
    out: &'a mut [u8],
    bytes: usize,
) -> impl Iterator<Item = (&'a [f32], &'a mut [u8])> {
    assert!(
        x.len().is_multiple_of(QK),
        "quantize: {} values are not whole blocks of {QK}",
        x.len()
    );
    assert_eq!(out.len(), x.len() / QK * bytes, "quantize: output length");
    x.chunks_exact(QK).zip(out.chunks_exact_mut(bytes))
}

/// The value of largest magnitude (the first of them), as ggml's symmetric formats pick it.
fn signed_max(xb: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xb {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `(min, max)` of a block.
fn min_max(xb: &[f32]) -> (f32, f32) {
    xb.iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// Q4_0 blocks (`d = max / -8`, `q = min(15, trunc(x / d + 8.5))`), as
/// `quantize_row_q4_0_ref`.
///
/// # Panics
/// If `x` is not whole blocks or `out` is not one block per 32 values.
pub fn quantize_q4_0(x: &[f32], out: &mut [u8]) {
    for (xb, yb) in blocks(x, out, 18) {
        let d = signed_max(xb) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f16_bytes(d));
        for j in 0..QK / 2 {
            let lo = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let hi = ((xb[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            yb[2 + j] = lo | (hi << 4);
        }
    }
}

/// Q4_1 blocks (`d = (max − min) / 15`, `m = min`), as `quantize_row_q4_1_ref`.
///
/// # Panics
/// If `x` is not whole blocks or `out` is not one block per 32 values.
pub fn quantize_q4_1(x: &[f32], out: &mut [u8]) {
    for (xb, yb) in blocks(x, out, 20) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f16_bytes(d));
        yb[2..4].copy_from_slice(&f16_bytes(min));
        for j in 0..QK / 2 {
            let lo = (((xb[j] - min) * id + 0.5) as i8).min(15) as u8;
            let hi = (((xb[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            yb[4 + j] = lo | (hi << 4);
        }
    }
}

/// Q5_0 blocks (`d = max / -16`), as `quantize_row_q5_0_ref`.
///
/// # Panics
/// If `x` is not whole blocks or `out` is not one block per 32 values.
pub fn quantize_q5_0(x: &[f32], out: &mut [u8]) {
    for (xb, yb) in blocks(x, out, 22) {
        let d = signed_max(xb) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f16_bytes(d));
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let lo = ((xb[j] * id + 16.5) as i8).min(31) as u8;
            let hi = ((xb[j + QK / 2] * id + 16.5) as i8).min(31) as u8;
            yb[6 + j] = (lo & 0x0F) | ((hi & 0x0F) << 4);
            qh |= u32::from(lo >> 4) << j;
            qh |= u32::from(hi >> 4) << (j + QK / 2);
        }
        yb[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Q5_1 blocks (`d = (max − min) / 31`, `m = min`), as `quantize_row_q5_1_ref`.
///
/// # Panics
/// If `x` is not whole blocks or `out` is not one block per 32 values.
pub fn quantize_q5_1(x: &[f32], out: &mut [u8]) {
    for (xb, yb) in blocks(x, out, Q5_1_BLOCK_BYTES) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f16_bytes(d));
        yb[2..4].copy_from_slice(&f16_bytes(min));
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            // No clamp in ggml here: the largest value lands on 31 by construction.
            let lo = ((xb[j] - min) * id + 0.5) as u8;
            let hi = ((xb[j + QK / 2] - min) * id + 0.5) as u8;
            yb[8 + j] = (lo & 0x0F) | ((hi & 0x0F) << 4);
            qh |= u32::from((lo & 0x10) >> 4) << j;
            qh |= u32::from((hi & 0x10) >> 4) << (j + QK / 2);
        }
        yb[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Q8_0 blocks (`d = amax / 127`, `q = round(x / d)`, ties away from zero), as
/// `quantize_row_q8_0_ref`.
///
/// # Panics
/// If `x` is not whole blocks or `out` is not one block per 32 values.
pub fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, yb) in blocks(x, out, 34) {
        let amax = xb.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f16_bytes(d));
        for (q, &v) in yb[2..].iter_mut().zip(xb) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// Dequantises Q5_1 blocks `w` into `out` (32 values per block), as ggml's
/// `dequantize_row_q5_1`: `d · q + m`.
///
/// # Panics
/// If `w` is not whole blocks or `out` does not hold 32 values per block.
pub fn dequantize_q5_1(w: &[u8], out: &mut [f32]) {
    assert!(
        w.len().is_multiple_of(Q5_1_BLOCK_BYTES),
        "dequantize_q5_1: partial block"
    );
    assert_eq!(
        out.len(),
        w.len() / Q5_1_BLOCK_BYTES * QK,
        "dequantize_q5_1: out length"
    );
    for (b, o) in w
        .chunks_exact(Q5_1_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = super::q4_1::f16_at(b, 0);
        let m = super::q4_1::f16_at(b, 2);
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for j in 0..QK / 2 {
            let lo = (b[8 + j] & 0x0F) as u32 | ((qh >> j) & 1) << 4;
            let hi = (b[8 + j] >> 4) as u32 | ((qh >> (j + QK / 2)) & 1) << 4;
            o[j] = lo as f32 * d + m;
            o[j + QK / 2] = hi as f32 * d + m;
        }
    }
}
