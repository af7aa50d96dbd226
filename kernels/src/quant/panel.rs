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

/// Interleaves `m` rows of `nb` Q8_1 blocks into `m.div_ceil(8)` panels of `nb` blocks
/// (panel-major: panel `p`, block `b` at `p * nb + b`). Rows past `m` in the last panel are
/// zero (`d = s = 0`), so they add nothing and their lanes are never stored.
///
/// # Panics
/// If `xq` is not `m` rows of `nb` blocks.
pub(crate) fn build_panels(xq: &[BlockQ8_1], m: usize, nb: usize) -> Vec<PanelBlock> {
    assert_eq!(
        xq.len(),
        m * nb,
        "build_panels: xq is not m rows of nb blocks"
    );
    let panels = m.div_ceil(PANEL_ROWS);
    let mut out = vec![PanelBlock::default(); panels * nb];
    for (p, panel) in out.chunks_exact_mut(nb.max(1)).enumerate().take(panels) {
        for l in 0..PANEL_ROWS.min(m - p * PANEL_ROWS) {
            let row = &xq[(p * PANEL_ROWS + l) * nb..(p * PANEL_ROWS + l + 1) * nb];
            for (pb, xb) in panel.iter_mut().zip(row) {
                for s in 0..QK / 4 {
                    pb.qs[s][4 * l..4 * l + 4].copy_from_slice(&xb.qs[4 * s..4 * s + 4]);
                }
                pb.d[l] = xb.d;
                pb.s[l] = xb.s;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaves_four_bytes_per_row_and_zero_pads() {
        let (m, nb) = (10, 2);
        let xq: Vec<BlockQ8_1> = (0..m * nb)
            .map(|i| BlockQ8_1 {
                d: i as f32,
                s: -(i as f32),
                qs: std::array::from_fn(|j| (i * 3 + j) as i8),
            })
            .collect();
        let p = build_panels(&xq, m, nb);
        assert_eq!(p.len(), 2 * nb);
        for row in 0..16 {
            for b in 0..nb {
                let pb = &p[(row / 8) * nb + b];
                let l = row % 8;
                for v in 0..QK {
                    let got = pb.qs[v / 4][4 * l + v % 4];
                    let want = if row < m { xq[row * nb + b].qs[v] } else { 0 };
                    assert_eq!(got, want, "row {row} block {b} value {v}");
                }
                let (d, s) = if row < m {
                    (xq[row * nb + b].d, xq[row * nb + b].s)
                } else {
                    (0.0, 0.0)
                };
                assert_eq!((pb.d[l], pb.s[l]), (d, s));
            }
        }
    }
}
