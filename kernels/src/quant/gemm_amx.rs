//! The batched quantised matmul on AMX ([`crate::amx`]): 16 weight rows × 16 activation rows
//! of one block's integer sums in one tile instruction.
//!
//! The AVX-512 GEMM ([`super::gemm_avx512`]) spends eight `vpdpbusd` per weight row and block
//! on a 16-row panel; here one `tdpbssd` (Q8_0) or `tdpbusd` (Q4: unsigned nibbles) makes
//! the sums of a block for 16 weight rows at once, on the matrix unit, while the vector
//! units only scale them: per weight row and block, one load, one conversion, one multiply
//! and one FMA (two for formats with an offset). The tiles:
//!
//! - A (tmm0, tmm3): 16 weight rows × the block's 32 `q` bytes. Q8_0's are loaded straight
//!   from the GGUF rows (the tile load takes a stride); Q4's nibbles are unpacked to bytes
//!   once per group of 16 rows into a small buffer.
//! - B (tmm1, tmm4): the activation panel's block ([`super::panel16`]): 8 rows of 16
//!   activation rows × 4 consecutive values, which is the layout the tile product wants.
//! - C (tmm2, tmm5): `C[n][l]` = Σ q·q8 of weight row n and activation row l, so a row of C
//!   is the 16-lane vector the other kernels hold per weight row.
//!
//! Measured on a 2-core Xeon with AMX (docs/benchmarks.md, "AMX tile products for
//! prefill"): a block's tile work (zero, two loads, product, store) takes ~22 cycles from
//! L1, so with the scaling it pays only when a group of weight rows meets several panels. At 16 activation rows it ran one
//! thread's 576 × 1536 Q8_0 matmul 1.3x as fast as the AVX-512 GEMM but lost with two
//! threads on a whole decode step; at 128 rows it is 1.4-1.5x as fast. So the matmul sends
//! it batches of [`super::matmul::AMX_MIN_ROWS`] rows or more (prefill chunks).
//!
//! Every output follows the common arithmetic ([`super::format`]): the block sum is exact in
//! i32; block `b` feeds chain `b % 4` as `fma(Σ, d · d8, acc)` (then `fma(m, s8, acc)`),
//! in increasing `b`; the chains are summed as `(a0 + a1) + (a2 + a3)`. A group runs one
//! chain at a time (blocks c, c + 4, …), so the 16 rows' accumulators of that chain fit in
//! registers; the order within each chain is unchanged, so results are bit-identical to the
//! other kernels. Weight rows past the last whole group of 16 run on the AVX-512 GEMM.

use std::arch::x86_64::*;

use super::format::{Format, CHAINS};
use super::matmul::{gemm_shape, OutCols};
use super::panel16::{Panel16Block, PANEL16_ROWS};
use crate::amx::{self, TileConfig};
use crate::prefetch;

/// Weight rows per tile product (a tile's 16 rows).
const GROUP: usize = 16;

/// Bytes of a block's values.
const QB: usize = super::q4_1::QK;

/// Two sets of tiles (0-2 and 3-5), each A 16 × 32 bytes, B 8 × 64 bytes, C 16 × 16 i32.
const CONFIG: TileConfig = TileConfig::new()
    .tile(0, GROUP as u8, QB as u16)
    .tile(1, (QB / 4) as u8, 64)
    .tile(2, GROUP as u8, 64)
    .tile(3, GROUP as u8, QB as u16)
    .tile(4, (QB / 4) as u8, 64)
    .tile(5, GROUP as u8, 64);

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` and all `m` activation rows in
/// `panels` (`m.div_ceil(16)` panels of `nb` blocks).
///
/// # Safety
/// [`amx::available`] returned true; AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C available; `w`
/// is `rows` rows of `nb` blocks of `F`; `panels` holds `m.div_ceil(16) * nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn gemm<F: Format>(
    w: &[u8],
    rows: usize,
    nb: usize,
    panels: &[Panel16Block],
    m: usize,
    out: &mut OutCols,
) {
    let (row_bytes, n_panels) = gemm_shape::<F, _>(w, rows, nb, panels, m, PANEL16_ROWS);
    let groups = rows / GROUP;
    if groups > 0 {
        let mut group = Group::new::<F>(nb);
        // SAFETY: AMX available (contract); the configuration is valid.
        unsafe { amx::load_config(&CONFIG) };
        for g in 0..groups {
            let wg = &w[g * GROUP * row_bytes..(g + 1) * GROUP * row_bytes];
            for p in 0..n_panels {
                // SAFETY: wg is 16 rows of nb blocks; each panel nb blocks; features and
                // tiles by the contract and the configuration above.
                let r = unsafe { group.products::<F>(wg, &panels[p * nb..(p + 1) * nb], p == 0) };
                for (n, &v) in r.iter().enumerate() {
                    // SAFETY: AVX-512F by contract.
                    unsafe { super::gemm_avx512::store(out, m, g * GROUP + n, p, v) };
                }
            }
        }
        // SAFETY: AMX available.
        unsafe { amx::release() };
    }
    let done = groups * GROUP;
    if done < rows {
        let mut rest = out.skip(done);
        // SAFETY: features by contract; the remaining rows are whole rows of nb blocks.
        unsafe {
            super::gemm_avx512::gemm::<F>(
                &w[done * row_bytes..],
                rows - done,
                nb,
                panels,
                m,
                &mut rest,
            )
        };
    }
}

/// The state of one task's groups of 16 weight rows: every block's `d` and `m` of the 16
/// rows as f32 (block-major, so one block's 16 scales are adjacent), for Q4 the unpacked
/// values, and the tile products waiting to be scaled.
struct Group {
    /// `d[16 b + n]`: row n's `d` in block b.
    d: Vec<f32>,
    /// `m[16 b + n]` (formats with an offset; empty otherwise).
    m: Vec<f32>,
    /// `q[b]`: block b of the 16 rows as unsigned bytes, row after row (Q4 only).
    q: Vec<TileBytes>,
    /// `sums[b]`: block b's tile product, Σ q·q8 of the 16 rows × 16 activation rows.
    sums: Vec<TileI32>,
    /// The blocks in the order they are scaled: chain 0's (0, 4, 8, …), then chain 1's, …
    order: Vec<usize>,
}

/// A 16 × 32-byte A tile.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TileBytes([u8; GROUP * QB]);

/// A 16 × 16 i32 C tile.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TileI32([i32; GROUP * 16]);

/// How many blocks the tile products run ahead of their scaling: a product's store has long
/// completed when the vector units load it, and the matrix unit works while they scale.
const LEAD: usize = 2;

impl Group {
    fn new<F: Format>(nb: usize) -> Self {
        Self {
            d: vec![0.0; nb * GROUP],
            m: vec![0.0; if F::HAS_OFFSET { nb * GROUP } else { 0 }],
            q: vec![TileBytes([0; GROUP * QB]); if F::SIGNED { 0 } else { nb }],
            sums: vec![TileI32([0; GROUP * 16]); nb],
            order: (0..CHAINS).flat_map(|c| (c..nb).step_by(CHAINS)).collect(),
        }
    }

    /// The 16 rows in `wg` against the 16 activation rows of `panel` (lane l of result n is
    /// weight row n · activation row l). With `first`, reads the group's scales (and Q4
    /// values) on the way, block by block; later panels of the same group reuse them.
    ///
    /// The blocks go in chain order, so the 16 accumulators of one chain stay in registers;
    /// block `order[i + LEAD]`'s tile product is made while block `order[i]` is scaled, so
    /// the vector loads of a block's sums find its tile store done. A tile cannot be loaded
    /// again before the product reading it is done: two sets (tiles 0-2 and 3-5) in turn
    /// let a product start while the previous one finishes.
    ///
    /// # Safety
    /// Tiles configured as [`CONFIG`]; AVX-512F/BW, FMA and F16C available; `wg` is 16 rows
    /// of `nb` blocks of `F`, `panel` `nb` blocks; `first` for the group's first panel.
    #[inline(always)]
    unsafe fn products<F: Format>(
        &mut self,
        wg: &[u8],
        panel: &[Panel16Block],
        first: bool,
    ) -> [__m512; GROUP] {
        let nb = panel.len();
        debug_assert_eq!(wg.len(), GROUP * nb * F::BLOCK_BYTES);
        for i in 0..LEAD.min(nb) {
            // SAFETY: by the caller's contract.
            unsafe { self.stage::<F>(wg, panel, self.order[i], i, first) };
        }
        let mut chains = [[_mm512_setzero_ps(); GROUP]; CHAINS];
        let mut i = 0;
        for (c, chain) in chains.iter_mut().enumerate() {
            let mut acc = [_mm512_setzero_ps(); GROUP];
            // Chain c's blocks: c, c + 4, …
            for _ in 0..nb.saturating_sub(c).div_ceil(CHAINS) {
                if i + LEAD < nb {
                    // SAFETY: by the caller's contract.
                    unsafe { self.stage::<F>(wg, panel, self.order[i + LEAD], i + LEAD, first) };
                }
                // SAFETY: block order[i]'s product and scales were staged LEAD blocks ago.
                unsafe { self.scale::<F>(panel, self.order[i], &mut acc) };
                i += 1;
            }
            *chain = acc;
        }
        std::array::from_fn(|n| {
            _mm512_add_ps(
                _mm512_add_ps(chains[0][n], chains[1][n]),
                _mm512_add_ps(chains[2][n], chains[3][n]),
            )
        })
    }

    /// Block `b`'s scales and values (with `first`), then its tile product into `sums[b]`,
    /// on tile set `i % 2`.
    ///
    /// # Safety
    /// As [`Group::products`]; `b < nb`.
    #[inline(always)]
    unsafe fn stage<F: Format>(
        &mut self,
        wg: &[u8],
        panel: &[Panel16Block],
        b: usize,
        i: usize,
        first: bool,
    ) {
        let row_bytes = panel.len() * F::BLOCK_BYTES;
        let block = wg.as_ptr().wrapping_add(b * F::BLOCK_BYTES);
        // SAFETY (whole body): block b of each of the 16 rows is inside wg; d and m hold 16
        // floats at 16 b; q[b] (Q4) and sums[b] are whole tiles; the panel block is 8 × 64
        // readable bytes.
        unsafe {
            if first {
                // The first dword of block b of the 16 rows: d in its low half, Q4_1's m in
                // the high half.
                let rows = _mm512_mullo_epi32(
                    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                    _mm512_set1_epi32(row_bytes as i32),
                );
                let head = _mm512_i32gather_epi32::<1>(rows, block as *const i32);
                let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
                _mm512_storeu_ps(self.d.as_mut_ptr().add(GROUP * b), d);
                if F::HAS_OFFSET {
                    // The same f32 product as the scalar `d * M_PER_D` of the other kernels.
                    let m = match F::M_AT {
                        Some(_) => {
                            _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(head)))
                        }
                        None => _mm512_mul_ps(d, _mm512_set1_ps(F::M_PER_D)),
                    };
                    _mm512_storeu_ps(self.m.as_mut_ptr().add(GROUP * b), m);
                }
                for n in 0..GROUP {
                    let wb = block.add(n * row_bytes);
                    // The task's rows are contiguous: the same block of the next group is 16
                    // rows ahead (every line of it is some block's first).
                    prefetch::lines(wb.wrapping_add(GROUP * row_bytes), 1);
                    if !F::SIGNED {
                        let q = self.q.get_unchecked_mut(b).0.as_mut_ptr();
                        _mm256_store_si256(q.add(n * QB) as *mut __m256i, F::unpack(wb));
                    }
                }
            }
            let (a, stride) = if F::SIGNED {
                (block.add(2), row_bytes)
            } else {
                (self.q.get_unchecked(b).0.as_ptr(), QB)
            };
            let bq = panel.get_unchecked(b).qs.as_ptr() as *const u8;
            let c = self.sums.get_unchecked_mut(b).0.as_mut_ptr() as *mut u8;
            if i.is_multiple_of(2) {
                tile_block::<F, 0, 1, 2>(a, stride, bq, c);
            } else {
                tile_block::<F, 3, 4, 5>(a, stride, bq, c);
            }
        }
    }

    /// Adds block `b`'s scaled sums to the chain accumulators `acc`.
    ///
    /// # Safety
    /// As [`Group::products`]; block `b` staged.
    #[inline(always)]
    unsafe fn scale<F: Format>(&self, panel: &[Panel16Block], b: usize, acc: &mut [__m512; GROUP]) {
        // SAFETY: d and s are 16 floats each, 64-byte aligned in the panel block; sums[b]
        // holds 16 rows of 16 i32; d and m hold block b's 16 scales.
        unsafe {
            let pb = panel.get_unchecked(b);
            let pd = _mm512_load_ps(pb.d.as_ptr());
            let ps = _mm512_load_ps(pb.s.as_ptr());
            let isum = self.sums.get_unchecked(b).0.as_ptr();
            let d = self.d.as_ptr().add(GROUP * b);
            // Empty without an offset: only read when F::HAS_OFFSET.
            let m = self.m.as_ptr().wrapping_add(GROUP * b);
            for (n, a) in acc.iter_mut().enumerate() {
                let s = _mm512_cvtepi32_ps(_mm512_load_si512(isum.add(16 * n) as *const __m512i));
                *a = _mm512_fmadd_ps(s, _mm512_mul_ps(_mm512_set1_ps(*d.add(n)), pd), *a);
                if F::HAS_OFFSET {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*m.add(n)), ps, *a);
                }
            }
        }
    }
}

/// One block's tile product into `c`: tile `C` = tile `A` (16 weight rows at `a`, `stride`
/// apart) · tile `B` (the panel block at `b`).
///
/// # Safety
/// Tiles configured as [`CONFIG`]; the tile rows readable (A, B) and writable (C).
#[inline(always)]
unsafe fn tile_block<F: Format, const A: u8, const B: u8, const C: u8>(
    a: *const u8,
    stride: usize,
    b: *const u8,
    c: *mut u8,
) {
    // SAFETY: by the caller's contract.
    unsafe {
        amx::zero::<C>();
        amx::load::<A>(a, stride);
        amx::load::<B>(b, 64);
        amx::dot::<C, A, B>(F::SIGNED);
        amx::store::<C>(c, 64);
    }
}
