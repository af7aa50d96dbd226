//! Activation panels of 16 rows for the AVX-512 GEMM ([`super::gemm_avx512`]): the layout of
//! [`super::panel`] (rows interleaved four bytes at a time) widened to one row per 32-bit
//! lane of a 512-bit register, so one aligned 64-byte load holds the same four positions of
//! all 16 rows.
//!
//! Each block also carries `c = −128 · Σ q8` per row. The AVX-512 GEMM broadcasts the weight
//! bytes as the unsigned operand of `vpdpbusd`; Q8_0's signed weights go in as `q + 128`
//! (one XOR per block instead of ggml's per-product sign trick), and starting the integer
//! sum at `c` takes the extra `128 · Σ q8` back out exactly. The AVX2 GEMM keeps its 8-row
//! panels (one row per lane of a 256-bit register); a batch builds only the layout its
//! kernel reads.

use super::panel::{build, PanelLayout};
use super::q4_1::QK;
use super::q8_1::BlockQ8_1;

/// Activation rows per panel (one per 32-bit lane of a 512-bit register).
pub(crate) const PANEL16_ROWS: usize = 16;

/// Block `b` of 16 activation rows, interleaved.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(64))]
pub(crate) struct Panel16Block {
    /// `qs[s][4 * l + i]` = value `4 * s + i` of row `l`.
    pub qs: [[i8; 4 * PANEL16_ROWS]; QK / 4],
    /// `d` of each row.
    pub d: [f32; PANEL16_ROWS],
    /// `s` of each row.
    pub s: [f32; PANEL16_ROWS],
    /// `−128 · Σ qs` of each row (the correction for weights biased by 128).
    pub c: [i32; PANEL16_ROWS],
}

impl Default for Panel16Block {
    fn default() -> Self {
        Self {
            qs: [[0; 4 * PANEL16_ROWS]; QK / 4],
            d: [0.0; PANEL16_ROWS],
            s: [0.0; PANEL16_ROWS],
            c: [0; PANEL16_ROWS],
        }
    }
}

impl PanelLayout for Panel16Block {
    const ROWS: usize = PANEL16_ROWS;
    fn set_row(&mut self, l: usize, xb: &BlockQ8_1) {
        for s in 0..QK / 4 {
            self.qs[s][4 * l..4 * l + 4].copy_from_slice(&xb.qs[4 * s..4 * s + 4]);
        }
        self.d[l] = xb.d;
        self.s[l] = xb.s;
        self.c[l] = -128 * xb.qs.iter().map(|&q| q as i32).sum::<i32>();
    }
}

/// The 16-row panels of `m` rows of `nb` blocks (see [`super::panel::build`]); rows past `m`
/// have `d = s = c = 0`.
pub(crate) fn build_panels16(xq: &[BlockQ8_1], m: usize, nb: usize) -> Vec<Panel16Block> {
    build(xq, m, nb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::panel::tests::{check_interleaving, numbered_rows};

    #[test]
    fn interleaves_four_bytes_per_row_and_zero_pads() {
        let (m, nb) = (21, 2);
        let xq = numbered_rows(m, nb);
        let p = build_panels16(&xq, m, nb);
        check_interleaving(&p, &xq, m, nb, |pb: &Panel16Block, l| {
            (
                std::array::from_fn(|v| pb.qs[v / 4][4 * l + v % 4]),
                pb.d[l],
                pb.s[l],
            )
        });
        for (i, pb) in p.iter().enumerate() {
            for l in 0..PANEL16_ROWS {
                let r = (i / nb) * PANEL16_ROWS + l;
                let want = xq
                    .get(r * nb + i % nb)
                    .filter(|_| r < m)
                    .map_or(0, |x| -128 * x.qs.iter().map(|&q| q as i32).sum::<i32>());
                assert_eq!(pb.c[l], want, "row {r}");
            }
        }
    }
}
