//! Activation panels for the batched GEMM: eight Q8_1 activation rows interleaved four bytes
//! at a time, so one 32-byte load holds the same four positions of all eight rows. Against a
//! weight block's four values broadcast to every lane, one `maddubs` then computes a partial
//! dot product for eight rows at once, one row per 32-bit lane. This is the activation side of
//! llama.cpp's repacked GEMMs (`ggml-cpu/repack.cpp`, `block_q8_0x4` and
//! `ggml_gemm_q4_0_8x8_q8_0`), turned around: our weights stay untouched in the memory-mapped
//! file, so the activations (small, quantised once per matmul) are the side that is repacked.

use super::q4_1::QK;
use super::q8_1::BlockQ8_1;

/// Activation rows per panel (one per 32-bit lane of an AVX2 register).
pub(crate) const PANEL_ROWS: usize = 8;

/// Block `b` of eight activation rows, interleaved.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(32))]
pub(crate) struct PanelBlock {
    /// `qs[s][4 * l + i]` = value `4 * s + i` of row `l`.
    pub qs: [[i8; QK]; QK / 4],
    /// `d` of each row.
    pub d: [f32; PANEL_ROWS],
    /// `s` of each row.
    pub s: [f32; PANEL_ROWS],
}

impl Default for PanelBlock {
    fn default() -> Self {
        Self {
            qs: [[0; QK]; QK / 4],
            d: [0.0; PANEL_ROWS],
            s: [0.0; PANEL_ROWS],
        }
    }
}

/// A block of interleaved activation rows, as a panel layout fills it (8-row panels here,
/// 16-row ones in [`super::panel16`]).
pub(crate) trait PanelLayout: Default + Clone {
    /// Activation rows per panel.
    const ROWS: usize;
    /// Writes activation block `xb` as row `l` of this panel block.
    fn set_row(&mut self, l: usize, xb: &BlockQ8_1);
}

impl PanelLayout for PanelBlock {
    const ROWS: usize = PANEL_ROWS;
    fn set_row(&mut self, l: usize, xb: &BlockQ8_1) {
        for s in 0..QK / 4 {
            self.qs[s][4 * l..4 * l + 4].copy_from_slice(&xb.qs[4 * s..4 * s + 4]);
        }
        self.d[l] = xb.d;
        self.s[l] = xb.s;
    }
}

/// Interleaves `m` rows of `nb` Q8_1 blocks into `m.div_ceil(P::ROWS)` panels of `nb` blocks
/// (panel-major: panel `p`, block `b` at `p * nb + b`). Rows past `m` in the last panel are
/// left at `P::default()` (all zero), so they add nothing and their lanes are never stored.
///
/// # Panics
/// If `xq` is not `m` rows of `nb` blocks.
pub(crate) fn build<P: PanelLayout>(xq: &[BlockQ8_1], m: usize, nb: usize) -> Vec<P> {
    assert_eq!(xq.len(), m * nb, "panels: xq is not m rows of nb blocks");
    let panels = m.div_ceil(P::ROWS);
    let mut out = vec![P::default(); panels * nb];
    for (p, panel) in out.chunks_exact_mut(nb.max(1)).enumerate().take(panels) {
        for l in 0..P::ROWS.min(m - p * P::ROWS) {
            let row = &xq[(p * P::ROWS + l) * nb..(p * P::ROWS + l + 1) * nb];
            for (pb, xb) in panel.iter_mut().zip(row) {
                pb.set_row(l, xb);
            }
        }
    }
    out
}

/// The 8-row panels of `m` rows of `nb` blocks (see [`build`]).
pub(crate) fn build_panels(xq: &[BlockQ8_1], m: usize, nb: usize) -> Vec<PanelBlock> {
    build(xq, m, nb)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `m` rows of `nb` blocks whose every value tells where it came from.
    pub(crate) fn numbered_rows(m: usize, nb: usize) -> Vec<BlockQ8_1> {
        (0..m * nb)
            .map(|i| BlockQ8_1 {
                d: i as f32,
                s: -(i as f32),
                qs: std::array::from_fn(|j| (i * 3 + j) as i8),
            })
            .collect()
    }

    /// Checks that `panels` interleave `xq` (`m` rows of `nb` blocks) four bytes per row and
    /// zero the rows past `m`, reading row `l` of a block back through `row`.
    pub(crate) fn check_interleaving<P: PanelLayout>(
        panels: &[P],
        xq: &[BlockQ8_1],
        m: usize,
        nb: usize,
        row: impl Fn(&P, usize) -> ([i8; QK], f32, f32),
    ) {
        assert_eq!(panels.len(), m.div_ceil(P::ROWS) * nb);
        for r in 0..m.div_ceil(P::ROWS) * P::ROWS {
            for b in 0..nb {
                let got = row(&panels[(r / P::ROWS) * nb + b], r % P::ROWS);
                let want = match xq.get(r * nb + b).filter(|_| r < m) {
                    Some(x) => (x.qs, x.d, x.s),
                    None => ([0; QK], 0.0, 0.0),
                };
                assert_eq!(got, want, "row {r} block {b}");
            }
        }
    }

    #[test]
    fn interleaves_four_bytes_per_row_and_zero_pads() {
        let (m, nb) = (10, 2);
        let xq = numbered_rows(m, nb);
        let p = build_panels(&xq, m, nb);
        check_interleaving(&p, &xq, m, nb, |pb: &PanelBlock, l| {
            (
                std::array::from_fn(|v| pb.qs[v / 4][4 * l + v % 4]),
                pb.d[l],
                pb.s[l],
            )
        });
    }
}
