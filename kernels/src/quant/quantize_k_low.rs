//! f32 → Q2_K and Q3_K super-blocks, as llama.cpp quantises without an importance matrix
//! (`quantize_q2_K` / `quantize_q3_K` then call `quantize_row_q2_K_ref` and
//! `quantize_row_q3_K_ref` of `ggml-quants.c`; ported step for step).

use super::kformat::QK_K;
use super::quantize_search::{
    f16_bytes, f16_round, make_q3_quants, make_qkx2_quants, nearest_int, Qkx2,
};

/// Packs 256 two-bit levels as Q2_K and Q3_K store them: in each 128-weight half, byte `l`
/// of the half's 32 holds weights `l`, `32 + l`, `64 + l`, `96 + l` from the bottom bits.
fn pack_2bit(levels: &[u8; QK_K], qs: &mut [u8]) {
    for h in 0..2 {
        for l in 0..32 {
            let at = |k: usize| levels[128 * h + 32 * k + l];
            qs[32 * h + l] = at(0) | (at(1) << 2) | (at(2) << 4) | (at(3) << 6);
        }
    }
}

/// Quantises `x` (whole super-blocks) to Q2_K blocks in `out` (84 bytes each), as
/// `quantize_row_q2_K_ref`: `make_qkx2_quants` per 16 weights (weighted by `|x|`, absolute
/// error), the scales and minimums as 4-bit multiples of their largest.
///
/// # Panics
/// If `x` is not whole super-blocks or `out` is not one block per super-block.
pub fn quantize_q2_k(x: &[f32], out: &mut [u8]) {
    const BYTES: usize = 84;
    assert!(
        x.len().is_multiple_of(QK_K),
        "quantize: partial super-block"
    );
    assert_eq!(out.len(), x.len() / QK_K * BYTES, "quantize: output length");
    let p = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let mut levels = [0u8; QK_K];
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BYTES)) {
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        let mut weights = [0.0f32; 16];
        for j in 0..16 {
            let xs = &xb[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            (scales[j], mins[j]) =
                make_qkx2_quants(p, xs, &weights, &mut levels[16 * j..16 * j + 16]);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let sc = &mut yb[..16];
        if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for (s, &v) in sc.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * v) as u8;
            }
        } else {
            sc.fill(0);
        }
        let d = if max_scale > 0.0 {
            max_scale / 15.0
        } else {
            0.0
        };
        if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for (s, &m) in sc.iter_mut().zip(&mins) {
                *s |= (nearest_int(iscale * m) as u8) << 4;
            }
        }
        let dmin = if max_min > 0.0 { max_min / 15.0 } else { 0.0 };
        yb[80..82].copy_from_slice(&f16_bytes(d));
        yb[82..84].copy_from_slice(&f16_bytes(dmin));
        let (d, dmin) = (f16_round(d), f16_round(dmin));
        let mut packed = [0u8; 16];
        packed.copy_from_slice(&yb[..16]);
        for (j, &s) in packed.iter().enumerate() {
            let dl = d * (s & 0x0F) as f32;
            if dl == 0.0 {
                continue;
            }
            let dm = dmin * (s >> 4) as f32;
            for i in 16 * j..16 * j + 16 {
                levels[i] = nearest_int((xb[i] + dm) / dl).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&levels, &mut yb[16..80]);
    }
}

/// Quantises `x` (whole super-blocks) to Q3_K blocks in `out` (110 bytes each), as
/// `quantize_row_q3_K_ref`: `make_q3_quants` per 16 weights, the sixteen signed scales as
/// 6-bit multiples of the one of largest magnitude.
///
/// # Panics
/// If `x` is not whole super-blocks or `out` is not one block per super-block.
pub fn quantize_q3_k(x: &[f32], out: &mut [u8]) {
    const BYTES: usize = 110;
    assert!(
        x.len().is_multiple_of(QK_K),
        "quantize: partial super-block"
    );
    assert_eq!(out.len(), x.len() / QK_K * BYTES, "quantize: output length");
    let mut signed = [0i8; QK_K];
    let mut levels = [0u8; QK_K];
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BYTES)) {
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for (j, s) in scales.iter_mut().enumerate() {
            let span = 16 * j..16 * j + 16;
            *s = make_q3_quants(4, &xb[span.clone()], &mut signed[span]);
            if s.abs() > amax {
                amax = s.abs();
                max_scale = *s;
            }
        }
        let (hmask, rest) = yb.split_at_mut(32);
        let (qs, rest) = rest.split_at_mut(64);
        let (sc, d_bytes) = rest.split_at_mut(12);
        sc.fill(0);
        let d = if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                // An int8_t in ggml: wrap, clamp, then store with the +32 bias.
                let l = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    sc[j] = l & 0x0F;
                } else {
                    sc[j - 8] |= (l & 0x0F) << 4;
                }
                sc[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
            }
            1.0 / iscale
        } else {
            0.0
        };
        d_bytes.copy_from_slice(&f16_bytes(d));
        let d = f16_round(d);
        for (l, &s) in levels.iter_mut().zip(&signed) {
            *l = s as u8;
        }
        for j in 0..16 {
            let low = if j < 8 { sc[j] & 0x0F } else { sc[j - 8] >> 4 };
            let high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
            let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
            if dl == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                levels[i] = (nearest_int(xb[i] / dl).clamp(-4, 3) + 4) as u8;
            }
        }
        hmask.fill(0);
        for (j, l) in levels.iter_mut().enumerate() {
            if *l > 3 {
                hmask[j % 32] |= 1 << (j / 32);
                *l -= 4;
            }
        }
        pack_2bit(&levels, qs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_bit_packing_matches_the_dequantiser_layout() {
        let mut levels = [0u8; QK_K];
        for (i, l) in levels.iter_mut().enumerate() {
            *l = (i % 4) as u8;
        }
        let mut qs = [0u8; 64];
        pack_2bit(&levels, &mut qs);
        for h in 0..2 {
            for l in 0..32 {
                for k in 0..4 {
                    assert_eq!(
                        (qs[32 * h + l] >> (2 * k)) & 3,
                        levels[128 * h + 32 * k + l]
                    );
                }
            }
        }
    }
}
