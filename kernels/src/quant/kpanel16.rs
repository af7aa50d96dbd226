//! Q8_K activation panels of 16 rows for the AVX-512 K-quant GEMM ([`super::kgemm_avx512`]):
//! the layout of [`super::panel16`] for 256-value blocks. One aligned 64-byte load holds the
//! same four positions of all 16 rows (one row per 32-bit lane), so a weight's four unsigned
//! bytes broadcast to every lane meet 16 rows in one `vpdpbusd`.
//!
//! The 16-value sums go in pairs: lane `l` of `bsums[h]` holds row `l`'s sums of groups
//! `2h` and `2h + 1` as two i16, so one `vpdpwssd` against the weight's offsets of the same
//! two groups (one i16 pair broadcast) adds both of their `mn_g · bsum_g` terms.
//! K-quant weights are unsigned (0..=63), so unlike [`super::panel16`] no bias correction is
//! needed.

use super::kformat::{GROUPS, QK_K};
use super::q8_k::BlockQ8K;

/// Activation rows per panel (one per 32-bit lane of a 512-bit register).
pub(crate) const KPANEL_ROWS: usize = 16;

/// Block `b` of 16 Q8_K activation rows, interleaved.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(64))]
pub(crate) struct KPanel16Block {
    /// `qs[s][4 * l + i]` = value `4 * s + i` of row `l`.
    pub qs: [[i8; 4 * KPANEL_ROWS]; QK_K / 4],
    /// `bsums[h][2 * l + e]` = `bsums[2 * h + e]` of row `l`.
    pub bsums: [[i16; 2 * KPANEL_ROWS]; GROUPS / 2],
    /// `d` of each row.
    pub d: [f32; KPANEL_ROWS],
}

impl Default for KPanel16Block {
    fn default() -> Self {
        Self {
            qs: [[0; 4 * KPANEL_ROWS]; QK_K / 4],
            bsums: [[0; 2 * KPANEL_ROWS]; GROUPS / 2],
            d: [0.0; KPANEL_ROWS],
        }
    }
}

impl KPanel16Block {
    /// Writes activation block `xb` as row `l` of this panel block.
    fn set_row(&mut self, l: usize, xb: &BlockQ8K) {
        for (s, qs) in self.qs.iter_mut().enumerate() {
            qs[4 * l..4 * l + 4].copy_from_slice(&xb.qs[4 * s..4 * s + 4]);
        }
        for (h, bs) in self.bsums.iter_mut().enumerate() {
            bs[2 * l..2 * l + 2].copy_from_slice(&xb.bsums[2 * h..2 * h + 2]);
        }
        self.d[l] = xb.d;
    }
}

/// Interleaves `m` rows of `nb` Q8_K blocks into `m.div_ceil(16)` panels of `nb` blocks
/// (panel `p`, block `b` at `p * nb + b`). Rows past `m` in the last panel stay all zero, so
/// they add nothing and their lanes are never stored.
///
/// # Panics
/// If `xq` is not `m * nb` blocks.
pub(crate) fn build_kpanels16(xq: &[BlockQ8K], m: usize, nb: usize) -> Vec<KPanel16Block> {
    assert_eq!(xq.len(), m * nb, "Q8_K panels: activations are not [m, nb]");
    let n_panels = m.div_ceil(KPANEL_ROWS);
    let mut panels = vec![KPanel16Block::default(); n_panels * nb];
    for (i, row) in xq.chunks_exact(nb.max(1)).take(m).enumerate() {
        let (p, l) = (i / KPANEL_ROWS, i % KPANEL_ROWS);
        for (b, xb) in row.iter().enumerate() {
            panels[p * nb + b].set_row(l, xb);
        }
    }
    panels
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row `r`, block `b`: every value, sum and scale says where it came from.
    fn numbered(m: usize, nb: usize) -> Vec<BlockQ8K> {
        (0..m * nb)
            .map(|i| {
                let mut x = BlockQ8K {
                    d: i as f32 + 0.5,
                    ..BlockQ8K::default()
                };
                for (v, q) in x.qs.iter_mut().enumerate() {
                    *q = ((i * 7 + v) % 251) as i8;
                }
                for (g, s) in x.bsums.iter_mut().enumerate() {
                    *s = (i * 100 + g) as i16;
                }
                x
            })
            .collect()
    }

    #[test]
    fn interleaves_values_and_sum_pairs_and_zero_pads() {
        let (m, nb) = (21, 3);
        let xq = numbered(m, nb);
        let p = build_kpanels16(&xq, m, nb);
        assert_eq!(p.len(), 2 * nb);
        for (pi, pb) in p.iter().enumerate() {
            let (panel, b) = (pi / nb, pi % nb);
            for l in 0..KPANEL_ROWS {
                let r = panel * KPANEL_ROWS + l;
                let want = if r < m {
                    xq[r * nb + b]
                } else {
                    BlockQ8K::default()
                };
                for v in 0..QK_K {
                    assert_eq!(pb.qs[v / 4][4 * l + v % 4], want.qs[v], "row {r} value {v}");
                }
                for g in 0..GROUPS {
                    assert_eq!(
                        pb.bsums[g / 2][2 * l + g % 2],
                        want.bsums[g],
                        "row {r} g {g}"
                    );
                }
                assert_eq!(pb.d[l], want.d, "row {r}");
            }
        }
    }
}
