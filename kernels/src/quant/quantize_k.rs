//! f32 → Q4_K, Q5_K and Q6_K super-blocks, as llama.cpp quantises without an importance
//! matrix (`quantize_q4_K` etc. then call `quantize_row_q4_K_ref`, `quantize_row_q5_K_ref`
//! and `quantize_row_q6_K_ref` of `ggml-quants.c`; ported step for step).

use super::kformat::{scale_min_k4, QK_K};
use super::quantize_search::{
    f16_bytes, f16_round, make_qkx2_quants, make_qx_quants, nearest_int, Qkx2, GROUP_MAX_EPS,
};

/// ggml's `make_qkx2_quants` arguments for Q4_K's 32-weight groups (levels 0..=15).
pub(super) const Q4K_SEARCH: Qkx2 = Qkx2 {
    nmax: 15,
    rmin: -1.0,
    rdelta: 0.1,
    nstep: 20,
    use_mad: false,
};

/// The same for Q5_K (levels 0..=31).
const Q5K_SEARCH: Qkx2 = Qkx2 {
    nmax: 31,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: false,
};

/// Checks the lengths every quantiser shares: whole super-blocks in, one block each out.
fn check(x: &[f32], out: &[u8], block_bytes: usize) {
    assert!(
        x.len().is_multiple_of(QK_K),
        "quantize: {} values are not whole super-blocks of {QK_K}",
        x.len()
    );
    assert_eq!(
        out.len(),
        x.len() / QK_K * block_bytes,
        "quantize: output length"
    );
}

/// The per-32 scales and minimums of Q4_K and Q5_K: `make_qkx2_quants` on each sub-block,
/// weighted by `rms(sub-block) + |x|`. Returns `(scales, mins)`; levels go to `levels`.
fn sub_block_scales(x: &[f32], p: Qkx2, levels: &mut [u8; QK_K]) -> ([f32; 8], [f32; 8]) {
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut weights = [0.0f32; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(p, xs, &weights, &mut levels[32 * j..32 * j + 32]);
    }
    (scales, mins)
}

/// Packs eight 6-bit scales and minimums into Q4_K's / Q5_K's 12 bytes (the inverse of
/// [`scale_min_k4`]), stores `d` and `dmin`, and requantises `x` against the stored values
/// into `levels` (`0..=nmax`). `head` is the block's first 16 bytes.
fn pack_scales_and_requantize(
    x: &[f32],
    scales: &[f32; 8],
    mins: &[f32; 8],
    nmax: i32,
    head: &mut [u8],
    levels: &mut [u8; QK_K],
) {
    let max_scale = scales
        .iter()
        .fold(0.0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0.0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let s = &mut head[4..16];
    for j in 0..8 {
        // ggml stores nearest_int's result in a uint8_t before clamping: wrap as it does.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
    head[..2].copy_from_slice(&f16_bytes(max_scale / 63.0));
    head[2..4].copy_from_slice(&f16_bytes(max_min / 63.0));
    let d = f16_round(max_scale / 63.0);
    let dmin = f16_round(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &head[4..16]);
        let dl = d * sc as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for i in 32 * j..32 * j + 32 {
            levels[i] = nearest_int((x[i] + dm) / dl).clamp(0, nmax) as u8;
        }
    }
}

/// Quantises `x` (whole super-blocks) to Q4_K blocks in `out` (144 bytes each), as
/// `quantize_row_q4_K_ref`.
///
/// # Panics
/// If `x` is not whole super-blocks or `out` is not one block per super-block.
pub fn quantize_q4_k(x: &[f32], out: &mut [u8]) {
    const BYTES: usize = 144;
    check(x, out, BYTES);
    let p = Q4K_SEARCH;
    let mut levels = [0u8; QK_K];
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BYTES)) {
        let (scales, mins) = sub_block_scales(xb, p, &mut levels);
        pack_scales_and_requantize(xb, &scales, &mins, 15, &mut yb[..16], &mut levels);
        for (j, q) in yb[16..].chunks_exact_mut(32).enumerate() {
            for (l, b) in q.iter_mut().enumerate() {
                *b = levels[64 * j + l] | (levels[64 * j + 32 + l] << 4);
            }
        }
    }
}

/// Quantises `x` (whole super-blocks) to Q5_K blocks in `out` (176 bytes each), as
/// `quantize_row_q5_K_ref`.
///
/// # Panics
/// If `x` is not whole super-blocks or `out` is not one block per super-block.
pub fn quantize_q5_k(x: &[f32], out: &mut [u8]) {
    const BYTES: usize = 176;
    check(x, out, BYTES);
    let p = Q5K_SEARCH;
    let mut levels = [0u8; QK_K];
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BYTES)) {
        let (scales, mins) = sub_block_scales(xb, p, &mut levels);
        pack_scales_and_requantize(xb, &scales, &mins, 31, &mut yb[..16], &mut levels);
        let (qh, ql) = yb[16..].split_at_mut(32);
        qh.fill(0);
        for (c, q) in ql.chunks_exact_mut(32).enumerate() {
            // Sub-blocks 2c and 2c + 1 share the nibble bytes; their fifth bits are bits
            // 2c and 2c + 1 of `qh`.
            let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for j in 0..32 {
                let mut l1 = levels[64 * c + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = levels[64 * c + 32 + j];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                q[j] = l1 | (l2 << 4);
            }
        }
    }
}

/// Quantises `x` (whole super-blocks) to Q6_K blocks in `out` (210 bytes each), as
/// `quantize_row_q6_K_ref`: a symmetric 6-bit search per 16 weights, the sixteen scales
/// quantised to signed bytes against the one of largest magnitude.
///
/// # Panics
/// If `x` is not whole super-blocks or `out` is not one block per super-block.
pub fn quantize_q6_k(x: &[f32], out: &mut [u8]) {
    const BYTES: usize = 210;
    check(x, out, BYTES);
    let mut levels = [0i8; QK_K];
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BYTES)) {
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for (g, s) in scales.iter_mut().enumerate() {
            let span = 16 * g..16 * g + 16;
            *s = make_qx_quants(32, &xb[span.clone()], &mut levels[span]);
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = *s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            yb.fill(0);
            continue;
        }
        let iscale = -128.0 / max_scale;
        yb[208..210].copy_from_slice(&f16_bytes(1.0 / iscale));
        let d = f16_round(1.0 / iscale);
        for (g, &s) in scales.iter().enumerate() {
            let sc = nearest_int(iscale * s).min(127) as i8;
            yb[192 + g] = sc as u8;
            let dl = d * sc as f32;
            if dl == 0.0 {
                continue;
            }
            for i in 16 * g..16 * g + 16 {
                levels[i] = (nearest_int(xb[i] / dl).clamp(-32, 31) + 32) as i8;
            }
        }
        let (ql, qh) = yb[..192].split_at_mut(128);
        for h in 0..2 {
            let lv = &levels[128 * h..128 * h + 128];
            for l in 0..32 {
                let q = |k: usize| lv[l + 32 * k] as u8;
                ql[64 * h + l] = (q(0) & 0x0F) | ((q(2) & 0x0F) << 4);
                ql[64 * h + 32 + l] = (q(1) & 0x0F) | ((q(3) & 0x0F) << 4);
                qh[32 * h + l] =
                    (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
    }
}
