//! The batched Q4_K and Q5_K matmul on AMX ([`crate::amx`]): for 16 weight rows × 16
//! activation rows, each 32-weight scale span's integer sums in one tile instruction.
//!
//! The AVX-512 K-quant GEMM ([`super::kgemm_avx512`]) spends 64 `vpdpbusd` per weight row and
//! super-block on a 16-row panel; here one `tdpbusd` per span (eight per super-block) makes
//! the span's sums for 16 weight rows at once. The
//! vector units then weigh each span by its scale (one load, `vpmulld` and add per weight
//! row), add the offsets' term (eight `vpdpwssd` per weight row and super-block, as the
//! AVX-512 GEMM) and run the float steps. The tiles:
//!
//! - A: 16 weight rows × the span's `q` bytes, from the super-blocks of the 16 rows unpacked
//!   once per group of rows into a 4 KiB buffer (a row's 256 values, row after row).
//! - B: the Q8_K panel's span ([`super::kpanel16`]): rows of 16 activation rows × 4
//!   consecutive values, the layout the tile product wants.
//! - C: `C[n][l]` = Σ q·q8 of weight row n and activation row l over the span.
//!
//! As in [`super::gemm_amx`], the tile product of a span is made [`LEAD`] spans before the
//! vector units read it back, on alternating tile sets, so neither unit waits on the other.
//!
//! Measured on a 2-core Xeon with AMX (criterion `quant_matmul/tidal_{amx,avx512vnni}/
//! q{4,5}_k_m128_k{1024,2048}_n640`, 2 threads): 0.80-0.92× the AVX-512 GEMM's time. The
//! vector side bounds it: per span a tile store and, per weight row, a load, a `vpmulld` and
//! an add. Formats with 16-weight spans do twice that and gain nothing, so they stay on the
//! AVX-512 GEMM.
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
use super::kpanel16::{KPanel16Block, KPANEL_ROWS};
use super::matmul::OutCols;
use crate::amx::{self, TileConfig};
use crate::prefetch;

/// Weight rows per tile product (a tile's 16 rows).
const GROUP: usize = 16;

/// Weights per scale span: the kernel serves the formats whose scales cover 32 weights
/// (Q4_K, Q5_K; see [`super::matmul`] for why not the others).
const SPAN: usize = 32;

/// Two sets of tiles (0-2 and 3-5), each A 16 × 32 bytes, B 8 × 64 bytes, C 16 × 16 i32.
const CONFIG: TileConfig = TileConfig::new()
    .tile(0, GROUP as u8, SPAN as u16)
    .tile(1, (SPAN / 4) as u8, 64)
    .tile(2, GROUP as u8, 64)
    .tile(3, GROUP as u8, SPAN as u16)
    .tile(4, (SPAN / 4) as u8, 64)
    .tile(5, GROUP as u8, 64);

/// Spans between a tile product and the scaling that reads it (see the module docs).
const LEAD: usize = 2;

/// C buffers in flight: the [`LEAD`] spans ahead and the one being scaled.
const RING: usize = LEAD + 1;

/// `out[i, j] = w_j · x_i` for the `rows` weight rows in `w` and all `m` activation rows in
/// `panels` (`m.div_ceil(16)` panels of `nb` super-blocks).
///
/// # Safety
/// [`amx::available`] returned true; AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C available; `K`'s
/// scales cover 32 weights; `w` is `rows` rows of `nb` super-blocks of `K`; `panels` holds
/// `m.div_ceil(16) * nb` blocks.
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

/// A 16 × 256-byte A buffer: one super-block of 16 weight rows as unsigned bytes.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct QTile([u8; GROUP * QK_K]);

/// A 16 × 16 i32 C tile.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TileI32([i32; GROUP * 16]);

/// One group of 16 weight rows, unpacked once for all panels.
struct Group {
    /// `q[b]`: super-block b of the 16 rows.
    q: Vec<QTile>,
    /// `sc[(16 b + n) · 16 + g]`: row n's scale of group g in super-block b.
    sc: Vec<i32>,
    /// `mn[(16 b + n) · 8 + h]`: row n's offsets of groups 2h and 2h + 1, an i16 pair.
    mn: Vec<i32>,
    /// `d[16 b + n]` and `dmin[16 b + n]`.
    d: Vec<f32>,
    dmin: Vec<f32>,
    /// The tile products waiting to be scaled.
    ring: [TileI32; RING],
}

impl Group {
    fn new(nb: usize) -> Self {
        Self {
            q: vec![QTile([0; GROUP * QK_K]); nb],
            sc: vec![0; nb * GROUP * GROUPS],
            mn: vec![0; nb * GROUP * GROUPS / 2],
            d: vec![0.0; nb * GROUP],
            dmin: vec![0.0; nb * GROUP],
            ring: [TileI32([0; GROUP * 16]); RING],
        }
    }

    /// Unpacks the `nb` super-blocks of the 16 rows in `wg`.
    ///
    /// # Safety
    /// AVX2, AVX-512F/BW and F16C available; `wg` is 16 rows of `nb` super-blocks of `K`.
    #[inline(always)]
    unsafe fn prepare<K: KFormat>(&mut self, wg: &[u8], nb: usize) {
        let row_bytes = nb * K::BLOCK_BYTES;
        debug_assert_eq!(wg.len(), GROUP * row_bytes);
        // SAFETY (whole body): every super-block read is inside wg; every store stays inside
        // the buffers sized by `new(nb)` (q: 32 bytes at 256 n + 32 c of a 4 KiB tile; sc: 16
        // i32 at 16 (16 b + n); mn: 8 i32 at 8 (16 b + n)).
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
                    let q = self.q.get_unchecked_mut(b).0.as_mut_ptr().add(QK_K * n);
                    for (c, v) in k.q.iter().enumerate() {
                        _mm256_store_si256(q.add(32 * c) as *mut __m256i, *v);
                    }
                    let at = GROUP * b + n;
                    _mm512_storeu_si512(
                        self.sc.as_mut_ptr().add(GROUPS * at) as *mut __m512i,
                        _mm512_cvtepi16_epi32(k.sc),
                    );
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
        let spans = QK_K / SPAN;
        let total = nb * spans;
        for i in 0..LEAD.min(total) {
            // SAFETY: by the caller's contract.
            unsafe { self.stage::<K>(panel, i, spans) };
        }
        let mut chains = [[_mm512_setzero_ps(); GROUP]; CHAINS];
        let mut isum = [_mm512_setzero_si512(); GROUP];
        for i in 0..total {
            if i + LEAD < total {
                // SAFETY: by the caller's contract.
                unsafe { self.stage::<K>(panel, i + LEAD, spans) };
            }
            let (b, t) = (i / spans, i % spans);
            // SAFETY: span i's product was staged LEAD spans ago into its ring slot; sc holds
            // super-block b's scales.
            unsafe {
                let c = self.ring.get_unchecked(i % RING).0.as_ptr();
                // The span's first group's scale: for 32-weight spans both groups share it.
                let g = t * SPAN / 16;
                let sc = self.sc.as_ptr().add(GROUPS * GROUP * b + g);
                for (n, s) in isum.iter_mut().enumerate() {
                    let dot = _mm512_load_si512(c.add(16 * n) as *const __m512i);
                    let scale = _mm512_set1_epi32(*sc.add(GROUPS * n));
                    *s = _mm512_add_epi32(*s, _mm512_mullo_epi32(dot, scale));
                }
            }
            if t + 1 == spans {
                // SAFETY: b is a block of the panel and of the prepared group.
                unsafe {
                    self.finish::<K>(panel.get_unchecked(b), b, &isum, &mut chains[b % CHAINS])
                };
                isum = [_mm512_setzero_si512(); GROUP];
            }
        }
        std::array::from_fn(|n| {
            _mm512_add_ps(
                _mm512_add_ps(chains[0][n], chains[1][n]),
                _mm512_add_ps(chains[2][n], chains[3][n]),
            )
        })
    }

    /// Span `i` (super-block `i / spans`, span `i % spans`): its tile product into ring slot
    /// `i % RING`, on tile set `i % 2`.
    ///
    /// # Safety
    /// As [`Group::products`]; `i < panel.len() · spans`.
    #[inline(always)]
    unsafe fn stage<K: KFormat>(&mut self, panel: &[KPanel16Block], i: usize, spans: usize) {
        let (b, t) = (i / spans, i % spans);
        // SAFETY: the A rows are 16 rows of 256 bytes (span bytes from t · span); the B rows
        // are span / 4 rows of 64 bytes inside the panel block's qs; the ring slot is 1 KiB.
        unsafe {
            let a = self.q.get_unchecked(b).0.as_ptr().add(t * SPAN);
            let bq = panel.get_unchecked(b).qs[t * SPAN / 4].as_ptr() as *const u8;
            let c = self.ring.get_unchecked_mut(i % RING).0.as_mut_ptr() as *mut u8;
            if i.is_multiple_of(2) {
                tile_span::<0, 1, 2>(a, bq, c);
            } else {
                tile_span::<3, 4, 5>(a, bq, c);
            }
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
                // The scalar reference's steps ([`super::kformat::accumulate`]): `fnmadd` is
                // `fma(−msum, dmin · d8, acc)` with the same single rounding.
                if K::HAS_DMIN {
                    let dm = _mm512_set1_ps(*self.dmin.get_unchecked(at));
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[n]), _mm512_mul_ps(dv, d8), *a);
                    *a = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dm, d8), *a);
                } else {
                    let diff = _mm512_sub_epi32(isum[n], msum);
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(diff), _mm512_mul_ps(dv, d8), *a);
                }
            }
        }
    }
}

/// One span's tile product into `c`: tile `C` = tile `A` (16 weight rows at `a`, 256 bytes
/// apart) · tile `B` (the panel's span at `b`).
///
/// # Safety
/// Tiles configured as [`CONFIG`]; the tile rows readable (A, B) and
/// writable (C).
#[inline(always)]
unsafe fn tile_span<const A: u8, const B: u8, const C: u8>(a: *const u8, b: *const u8, c: *mut u8) {
    // SAFETY: by the caller's contract.
    unsafe {
        amx::zero::<C>();
        amx::load::<A>(a, QK_K);
        amx::load::<B>(b, 64);
        amx::dot::<C, A, B>(false);
        amx::store::<C>(c, 64);
    }
}
