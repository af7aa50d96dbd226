//! The scale searches of ggml's K-quant quantisers (`ggml-quants.c`), ported operation for
//! operation: the same single-precision arithmetic in the same order and ggml's
//! `nearest_int` rounding, so a block quantised here matches one written by llama.cpp's
//! reference quantiser up to the compiler's freedom there to fuse a multiply and an add.

/// ggml's largest magnitude still treated as a group of zeros (`GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: rounds to the nearest integer, ties to even, by adding 1.5 · 2^23
/// and reading the mantissa (exact for `|x| <= 2^22`, the range every caller stays in).
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// An f32 rounded through f16 and back (ggml stores every block scale as f16 and quantises
/// against the stored value).
#[inline(always)]
pub(crate) fn f16_round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// The bytes of `x` as a little-endian f16.
#[inline(always)]
pub(crate) fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// The value of `x` with the largest magnitude (the first of equals, as ggml's loops keep),
/// or `None` when every value is below [`GROUP_MAX_EPS`] (the group quantises to zeros).
fn largest_magnitude(x: &[f32]) -> Option<f32> {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax >= GROUP_MAX_EPS).then_some(max)
}

/// ggml's `make_qx_quants` with `rmse_type == 1` and no importance weights (the only way the
/// reference quantisers call it): symmetric levels `l ∈ [-nmax, nmax)` stored as `l + nmax`
/// in `levels`, the scale chosen among 19 candidates around `max / -nmax` to minimise the
/// `x²`-weighted squared error. Returns the scale.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let Some(max) = largest_magnitude(x) else {
        levels.fill(0);
        return 0.0;
    };
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = quant(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let iscale = -(nmax as f32) / max;
    for (l, &v) in levels.iter_mut().zip(x) {
        *l = (quant(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l, &v) in levels.iter_mut().zip(x) {
                *l = (quant(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse`: levels in `[-nmax, nmax)` from `max / -nmax`, then
/// up to five passes that move single levels while that lowers the `x²`-weighted error.
/// Levels are stored as `l + nmax`. Returns the scale.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let Some(max) = largest_magnitude(x) else {
        levels.fill(0);
        return 0.0;
    };
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (l, &v) in levels.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *l = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (l, &v) in levels.iter_mut().zip(x) {
            let w = v * v;
            let cur = *l as f32;
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *l as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *l = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for l in levels.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The search parameters of ggml's `make_qkx2_quants` (its trailing arguments).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Qkx2 {
    /// Highest level (`nmax`): 3, 15 or 31.
    pub nmax: i32,
    /// First candidate's offset from `nmax` (`rmin`).
    pub rmin: f32,
    /// Step between candidates (`rdelta`).
    pub rdelta: f32,
    /// Candidates after the first (`nstep`).
    pub nstep: i32,
    /// Minimise the weighted absolute error rather than the squared one.
    pub use_mad: bool,
}

/// ggml's `make_qkx2_quants`: asymmetric levels `0..=nmax` for `x ≈ scale · l − min` with
/// `min >= 0`, the scale and minimum refitted by weighted least squares for each of
/// `nstep + 1` candidate scales and kept when the weighted error drops. Returns
/// `(scale, min)`; the levels go to `levels`.
pub(crate) fn make_qkx2_quants(
    p: Qkx2,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let nmax = p.nmax as f32;
    let err = |d: f32, w: f32| if p.use_mad { w * d.abs() } else { w * (d * d) };
    let mut iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for ((l, &v), &w) in levels.iter_mut().zip(x).zip(weights) {
        *l = nearest_int(iscale * (v - min)).clamp(0, p.nmax) as u8;
        best_error += err(scale * *l as f32 + min - v, w);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    let mut aux = [0u8; 32];
    let aux = &mut aux[..x.len()];
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((a, &v), &w) in aux.iter_mut().zip(x).zip(weights) {
            let l = nearest_int(iscale * (v - min)).clamp(0, p.nmax);
            *a = l as u8;
            let l = l as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for ((&a, &v), &w) in aux.iter().zip(x).zip(weights) {
                cur_error += err(this_scale * a as f32 + this_min - v, w);
            }
            if cur_error < best_error {
                levels.copy_from_slice(aux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.4), -2);
        assert_eq!(nearest_int(31.6), 32);
        assert_eq!(nearest_int(-4_194_303.0), -4_194_303);
    }

    #[test]
    fn searches_return_zero_for_zero_groups() {
        let x = [0.0f32; 16];
        let mut l = [5i8; 16];
        assert_eq!(make_qx_quants(32, &x, &mut l), 0.0);
        assert_eq!(l, [0; 16]);
        assert_eq!(make_q3_quants(4, &x, &mut l), 0.0);
        let mut u = [5u8; 16];
        let p = crate::quant::quantize_k::Q4K_SEARCH;
        assert_eq!(make_qkx2_quants(p, &x, &[1.0; 16], &mut u), (0.0, 0.0));
        assert_eq!(u, [0; 16]);
    }

    #[test]
    fn qx_levels_reconstruct_the_group() {
        let x: Vec<f32> = (0..16).map(|i| (i as f32 - 7.3) * 0.01).collect();
        let mut l = [0i8; 16];
        let d = make_qx_quants(32, &x, &mut l);
        for (&v, &q) in x.iter().zip(&l) {
            assert!((d * (q as f32 - 32.0) - v).abs() <= d.abs() * 0.5 + 1e-6);
        }
    }
}
