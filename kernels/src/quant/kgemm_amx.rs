//! The batched Q4_K and Q5_K matmul on AMX ([`crate::amx`]): a super-block's exact integer
//! sums for 16 weight rows × 16 activation rows in eight tile instructions, with the scales
//! inside the tiles.
//!
//! The scales vary every 32 weights, and a tile product sums over 64, so the products cannot
//! simply be weighed afterwards. Instead each 6-bit scale is split as `sc = 8 · hi + lo`
//! (`hi`, `lo` in 0..8) and the weights are stored twice, once times `lo` and once times `hi`:
//! both fit a byte (at most 31 · 7 = 217), so `tdpbusd` takes them as they are, and
//! `isum = Σ q·lo·x + 8 · Σ q·hi·x` exactly. Per super-block: four products into `C_lo` and
//! four into `C_hi` (64 weights each), two tile stores, and per weight row two loads, a shift
//! and an add; the AVX-512 GEMM ([`super::kgemm_avx512`]) spends 64 `vpdpbusd` and eight
//! `vpmulld` per weight row instead. The offsets meet the activations' 16-value sums in eight
//! `vpdpwssd` per weight row, and the float steps run on the vector units, as there.
//!
//! Measured on a 2-core Xeon with AMX (criterion `quant_matmul/tidal_{amx,avx512vnni}/
//! q{4,5}_k_m128_k{1024,2048}_n640`, 2 threads, which includes quantising and interleaving
//! the activations): 0.68-0.82× the AVX-512 GEMM's time. Weighing each 32-weight span's tile
//! product on the vector units instead (a store, and per weight row a load, `vpmulld` and
//! add) gave 0.80-0.92×; moving the offsets' term into a third tile product gave nothing.
//!
//! The tiles: A (tmm0, tmm1), 16 weight rows × 64 bytes of the `lo` and `hi` copies, unpacked
//! once per group of 16 rows; B (tmm2, tmm3 in turn), the Q8_K panel's 64 values
//! ([`super::kpanel16`]: rows of 16 activation rows × 4 consecutive values, the layout the
//! tile product wants); C (tmm4, tmm5), `C[n][l]` for weight row n and activation row l. A
//! super-block's products are made [`LEAD`] super-blocks before the vector units read them.
//!
//! Every output follows the common arithmetic ([`super::kformat`]): `isum` and `msum` are
//! exact in i32, super-block `b` feeds chain `b % 4` with the scalar reference's FMAs, in
//! increasing `b`, and the chains are summed as `(a0 + a1) + (a2 + a3)`; so results are
//! bit-identical to the other kernels. Weight rows past the last whole group of 16 run on
//! the AVX-512 GEMM.

use std::arch::x86_64::*;

use super::format::CHAINS;
use super::gemm_avx512::store;
use super::kformat::{KFormat, GROUPS, QK_K};
use super::kgemm_avx512::accumulate16;
use super::kpanel16::{KPanel16Block, KPANEL_ROWS};
use super::matmul::OutCols;
use crate::amx::{self, TileConfig};
use crate::prefetch;

/// Weight rows per tile product (a tile's 16 rows).
const GROUP: usize = 16;

/// Weights per tile product (a tile row's 64 bytes).
const TK: usize = 64;

/// Weights per scale in the formats this kernel serves (Q4_K, Q5_K).
const SPAN: usize = 32;

/// A (`lo`, `hi`), B (two, in turn) and C (`lo`, `hi`): all 16 rows × 64 bytes.
const CONFIG: TileConfig = TileConfig::new()
    .tile(0, GROUP as u8, TK as u16)
    .tile(1, GROUP as u8, TK as u16)
    .tile(2, (TK / 4) as u8, 64)
    .tile(3, (TK / 4) as u8, 64)
    .tile(4, GROUP as u8, 64)
    .tile(5, GROUP as u8, 64);

/// Super-blocks between a tile product and the scaling that reads it.
const LEAD: usize = 2;

/// Sums in flight: the [`LEAD`] super-blocks ahead and the one being scaled.
const RING: usize = LEAD + 1;

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` and all `m` activation rows in
/// `panels` (`m.div_ceil(16)` panels of `nb` super-blocks).
///
/// # Safety
/// [`amx::available`] returned true; AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C available; `K`
/// is Q4_K or Q5_K (6-bit scales over 32 weights, values below 32); `w` is `rows` rows of
/// `nb` super-blocks of `K`; `panels` holds `m.div_ceil(16) * nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn gemm<K: KFormat>(
    w: &[u8],
    rows: usize,
    nb: usize,
    panels: &[KPanel16Block],
    m: usize,
    out: &mut OutCols,
) {
    let row_bytes = nb * K::BLOCK_BYTES;
    let n_panels = m.div_ceil(KPANEL_ROWS);
    debug_assert_eq!(K::SCALE_SPAN, SPAN);
    debug_assert_eq!(w.len(), rows * row_bytes);
    debug_assert_eq!(panels.len(), n_panels * nb);
    let groups = rows / GROUP;
    if groups > 0 && nb > 0 {
        let mut group = Group::new(nb);
        // SAFETY: AMX available (contract); the configuration is valid.
        unsafe { amx::load_config(&CONFIG) };
        for g in 0..groups {
            let wg = &w[g * GROUP * row_bytes..(g + 1) * GROUP * row_bytes];
            // SAFETY: wg is 16 rows of nb super-blocks; features by contract.
            unsafe { group.prepare::<K>(wg, nb) };
            for p in 0..n_panels {
                // SAFETY: the group is prepared; the panel is nb blocks; tiles configured.
                let r = unsafe { group.products::<K>(&panels[p * nb..(p + 1) * nb]) };
                for (n, &v) in r.iter().enumerate() {
                    // SAFETY: AVX-512F by contract.
                    unsafe { store(out, m, g * GROUP + n, p, v) };
                }
            }
        }
        // SAFETY: AMX available.
        unsafe { amx::release() };
    }
    let done = groups * GROUP;
    if done < rows {
        let mut rest = out.skip(done);
        // SAFETY: features by contract; the remaining rows are whole rows of nb super-blocks.
        unsafe {
            super::kgemm_avx512::gemm::<K>(
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

/// A 16 × 256-byte A buffer: one super-block of 16 weight rows, row after row.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct QTile([u8; GROUP * QK_K]);

/// A 16 × 16 i32 C tile.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TileI32([i32; GROUP * 16]);

/// One super-block's two tile products.
#[derive(Clone, Copy)]
struct Sums {
    lo: TileI32,
    hi: TileI32,
}

/// One group of 16 weight rows, unpacked once for all panels.
struct Group {
    /// `lo[b]`, `hi[b]`: super-block b of the 16 rows, each value times its scale's low and
    /// high three bits.
    lo: Vec<QTile>,
    hi: Vec<QTile>,
    /// `mn[(16 b + n) · 8 + h]`: row n's offsets of groups 2h and 2h + 1, an i16 pair.
    mn: Vec<i32>,
    /// `d[16 b + n]` and `dmin[16 b + n]`.
    d: Vec<f32>,
    dmin: Vec<f32>,
    /// The tile products waiting to be scaled.
    ring: [Sums; RING],
}

impl Group {
    fn new(nb: usize) -> Self {
        let tile = QTile([0; GROUP * QK_K]);
        let sums = TileI32([0; GROUP * 16]);
        Self {
            lo: vec![tile; nb],
            hi: vec![tile; nb],
            mn: vec![0; nb * GROUP * GROUPS / 2],
            d: vec![0.0; nb * GROUP],
            dmin: vec![0.0; nb * GROUP],
            ring: [Sums { lo: sums, hi: sums }; RING],
        }
    }

    /// Unpacks the `nb` super-blocks of the 16 rows in `wg`.
    ///
    /// # Safety
    /// AVX2 and F16C available; `wg` is 16 rows of `nb` super-blocks of `K` (Q4_K or Q5_K).
    #[inline(always)]
    unsafe fn prepare<K: KFormat>(&mut self, wg: &[u8], nb: usize) {
        let row_bytes = nb * K::BLOCK_BYTES;
        debug_assert_eq!(wg.len(), GROUP * row_bytes);
        // SAFETY (whole body): every super-block read is inside wg; every store stays inside
        // the buffers sized by `new(nb)` (lo, hi: 32 bytes at 256 n + 32 c of a 4 KiB tile;
        // mn: 8 i32 at 8 (16 b + n)).
        unsafe {
            for b in 0..nb {
                for n in 0..GROUP {
                    let wb = wg.as_ptr().add(n * row_bytes + b * K::BLOCK_BYTES);
                    // The next group's rows follow this one's (a task's rows are contiguous).
                    prefetch::lines(
                        wb.wrapping_add(GROUP * row_bytes),
                        K::BLOCK_BYTES.div_ceil(prefetch::LINE),
                    );
                    let k = K::unpack_avx2(wb);
                    let mut sc = [0i16; GROUPS];
                    _mm256_storeu_si256(sc.as_mut_ptr() as *mut __m256i, k.sc);
                    let lo = self.lo.get_unchecked_mut(b).0.as_mut_ptr().add(QK_K * n);
                    let hi = self.hi.get_unchecked_mut(b).0.as_mut_ptr().add(QK_K * n);
                    // k.q[c] is span c (weights 32c..32c + 32), whose scale is sc[2c]. A
                    // 16-bit multiply by a factor below 8 multiplies each byte: the low
                    // byte's product stays below 256, so nothing carries into the high one.
                    for (c, q) in k.q.iter().enumerate() {
                        let s = sc[SPAN / 16 * c];
                        let (l, h) = (_mm256_set1_epi16(s & 7), _mm256_set1_epi16(s >> 3));
                        _mm256_store_si256(
                            lo.add(SPAN * c) as *mut __m256i,
                            _mm256_mullo_epi16(*q, l),
                        );
                        _mm256_store_si256(
                            hi.add(SPAN * c) as *mut __m256i,
                            _mm256_mullo_epi16(*q, h),
                        );
                    }
                    let at = GROUP * b + n;
                    _mm256_storeu_si256(
                        self.mn.as_mut_ptr().add(GROUPS / 2 * at) as *mut __m256i,
                        k.mn,
                    );
                    *self.d.get_unchecked_mut(at) = k.d;
                    *self.dmin.get_unchecked_mut(at) = k.dmin;
                }
            }
        }
    }

    /// The prepared 16 rows against the 16 activation rows of `panel`: lane l of result n is
    /// weight row n · activation row l.
    ///
    /// # Safety
    /// Tiles configured as [`CONFIG`]; AVX-512F/BW/VNNI and FMA available; prepared for
    /// `panel.len()` super-blocks of `K`.
    #[inline(always)]
    unsafe fn products<K: KFormat>(&mut self, panel: &[KPanel16Block]) -> [__m512; GROUP] {
        let nb = panel.len();
        for b in 0..LEAD.min(nb) {
            // SAFETY: by the caller's contract.
            unsafe { self.stage(panel, b) };
        }
        let mut chains = [[_mm512_setzero_ps(); GROUP]; CHAINS];
        for b in 0..nb {
            if b + LEAD < nb {
                // SAFETY: by the caller's contract.
                unsafe { self.stage(panel, b + LEAD) };
            }
            // SAFETY: super-block b's products were staged LEAD super-blocks ago into its
            // ring slot.
            let isum: [__m512i; GROUP] = unsafe {
                let sums = self.ring.get_unchecked(b % RING);
                let (lo, hi) = (sums.lo.0.as_ptr(), sums.hi.0.as_ptr());
                std::array::from_fn(|n| {
                    let l = _mm512_load_si512(lo.add(16 * n) as *const __m512i);
                    let h = _mm512_load_si512(hi.add(16 * n) as *const __m512i);
                    _mm512_add_epi32(l, _mm512_slli_epi32::<3>(h))
                })
            };
            // SAFETY: b is a block of the panel and of the prepared group.
            unsafe { self.finish::<K>(panel.get_unchecked(b), b, &isum, &mut chains[b % CHAINS]) };
        }
        std::array::from_fn(|n| {
            _mm512_add_ps(
                _mm512_add_ps(chains[0][n], chains[1][n]),
                _mm512_add_ps(chains[2][n], chains[3][n]),
            )
        })
    }

    /// Super-block `b`'s two tile products, over its four 64-weight parts, into ring slot
    /// `b % RING`.
    ///
    /// # Safety
    /// As [`Group::products`]; `b < panel.len()`.
    #[inline(always)]
    unsafe fn stage(&mut self, panel: &[KPanel16Block], b: usize) {
        // SAFETY: the A rows are 16 rows of 256 bytes (64 from 64 c); the B rows are 16 rows
        // of 64 bytes inside the panel block's qs; the ring slot's tiles are 1 KiB each.
        unsafe {
            let lo = self.lo.get_unchecked(b).0.as_ptr();
            let hi = self.hi.get_unchecked(b).0.as_ptr();
            let qs = &panel.get_unchecked(b).qs;
            amx::zero::<4>();
            amx::zero::<5>();
            for c in 0..QK_K / TK {
                let bq = qs[TK / 4 * c].as_ptr() as *const u8;
                if c % 2 == 0 {
                    parts::<2>(lo.add(TK * c), hi.add(TK * c), bq);
                } else {
                    parts::<3>(lo.add(TK * c), hi.add(TK * c), bq);
                }
            }
            let sums = self.ring.get_unchecked_mut(b % RING);
            amx::store::<4>(sums.lo.0.as_mut_ptr() as *mut u8, 64);
            amx::store::<5>(sums.hi.0.as_mut_ptr() as *mut u8, 64);
        }
    }

    /// Super-block `b`'s offsets term and float steps for the 16 rows, into `acc`.
    ///
    /// # Safety
    /// AVX-512F/BW/VNNI and FMA available; `b` is prepared and `pb` is the panel's block `b`.
    #[inline(always)]
    unsafe fn finish<K: KFormat>(
        &self,
        pb: &KPanel16Block,
        b: usize,
        isum: &[__m512i; GROUP],
        acc: &mut [__m512; GROUP],
    ) {
        // SAFETY: bsums[h] and d are 64 readable, 64-byte aligned bytes; mn, d and dmin hold
        // super-block b's values of the 16 rows.
        unsafe {
            let d8 = _mm512_load_ps(pb.d.as_ptr());
            let mut bs = [_mm512_setzero_si512(); GROUPS / 2];
            for (h, v) in bs.iter_mut().enumerate() {
                *v = _mm512_load_si512(pb.bsums[h].as_ptr() as *const __m512i);
            }
            for (n, a) in acc.iter_mut().enumerate() {
                let at = GROUP * b + n;
                let mn = self.mn.as_ptr().add(GROUPS / 2 * at);
                let mut msum = _mm512_setzero_si512();
                for (h, v) in bs.iter().enumerate() {
                    msum = _mm512_dpwssd_epi32(msum, _mm512_set1_epi32(*mn.add(h)), *v);
                }
                let dv = _mm512_set1_ps(*self.d.get_unchecked(at));
                let dm = _mm512_set1_ps(*self.dmin.get_unchecked(at));
                *a = accumulate16::<K>(*a, isum[n], msum, dv, dm, d8);
            }
        }
    }
}

/// One 64-weight part of a super-block: `C_lo += A_lo · B` and `C_hi += A_hi · B`, with the
/// 16 weight rows at `lo` and `hi` (256 bytes apart) and the panel's part at `b`, in tile `B`.
///
/// # Safety
/// Tiles configured as [`CONFIG`]; the tile rows readable.
#[inline(always)]
unsafe fn parts<const B: u8>(lo: *const u8, hi: *const u8, b: *const u8) {
    // SAFETY: by the caller's contract.
    unsafe {
        amx::load::<B>(b, 64);
        amx::load::<0>(lo, QK_K);
        amx::dot::<4, 0, B>(false);
        amx::load::<1>(hi, QK_K);
        amx::dot::<5, 1, B>(false);
    }
}
