//! The AVX2 build of one (token, KV head) attention task for head sizes that are a multiple
//! of 8, walked one KV block at a time like vLLM's paged attention kernels:
//!
//! - f32 and f16 rows are read in place (f16 converted as each vector is loaded); int8 rows
//!   are widened to f32 once per block (times their per-row scale, so a dequantised row
//!   exists only in this small scratch) and shared by the group's query heads: [`with_rows`],
//!   for both SIMD builds. Widening f16 blocks too cost more than the halved bytes saved
//!   (criterion, batch 8 at 256 tokens: 93 µs widened, 78 read in place, f32 75-88);
//! - scores are computed for eight positions at a time, one accumulator each, and reduced
//!   together (one `hadd` tree for eight sums instead of a horizontal sum per position);
//! - the softmax exponentials are 8-wide ([`crate::vexp`]);
//! - for head sizes 64 and 128 the weighted sum of a block's V rows stays in registers.

use std::arch::x86_64::*;

use super::{GroupArgs, Rows, Scratch};
use crate::kv_cache::elem::KvElem;
use crate::prefetch;
use crate::vexp::exp;

/// Attention of the group of query heads sharing one KV head, for one query token.
///
/// # Safety
/// AVX2, FMA and F16C available; `args.d.head_dim` is a multiple of 8; the caller validated
/// the block table and cache sizes (as `paged_attention` does).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_group<E: KvElem>(
    args: GroupArgs<E>,
    scratch: &mut Scratch,
    out_g: &mut [f32],
) {
    let GroupArgs {
        q_g,
        k,
        v,
        seq,
        pos,
        kvh,
        d,
    } = args;
    let bs = d.block_size;
    debug_assert!(d.head_dim.is_multiple_of(8));
    let ctx = pos + 1;
    let lo = d.first_visible(pos);
    let (scores, rows) = scratch.for_task(d, ctx);
    // From the first block a window leaves visible.
    let blocks = || {
        seq.block_table
            .iter()
            .enumerate()
            .skip(lo / bs)
            .map(move |(b, &blk)| (b * bs, blk as usize))
            .take_while(move |&(first, _)| first < ctx)
            .map(move |(first, blk)| (first, blk, bs.min(ctx - first)))
    };

    let mut k_blocks = blocks().peekable();
    while let Some((first, blk, n)) = k_blocks.next() {
        if let Some(&(_, next, n_next)) = k_blocks.peek() {
            prefetch_rows(&k, next, kvh, n_next, d);
        }
        let work = ScoreBlock {
            q_g,
            d,
            n,
            first,
            ctx,
            scores: &mut scores[..],
        };
        // SAFETY: the block is inside the cache (validated by the caller); rows holds bs rows.
        unsafe { with_rows(&k, blk, kvh, n, d, rows, work) };
    }

    // A window's partly visible first block: its positions before `lo` weigh nothing.
    for s in scores.chunks_exact_mut(ctx) {
        // SAFETY: features by contract.
        unsafe { softmax(&mut s[lo..]) };
        s[..lo].fill(0.0);
    }

    out_g.fill(0.0);
    let mut v_blocks = blocks().peekable();
    while let Some((first, blk, n)) = v_blocks.next() {
        if let Some(&(_, next, n_next)) = v_blocks.peek() {
            prefetch_rows(&v, next, kvh, n_next, d);
        }
        let work = WeighBlock {
            scores: &scores[..],
            d,
            first,
            n,
            ctx,
            out_g: &mut *out_g,
        };
        // SAFETY: as for K.
        unsafe { with_rows(&v, blk, kvh, n, d, rows, work) };
    }
}

/// What a build does with one KV block's rows, whichever way [`with_rows`] reads them.
pub(super) trait BlockWork {
    /// Runs on the block's rows: the first at `base`, the next `stride` values apart.
    ///
    /// # Safety
    /// The block's rows are readable there; the calling build's target features are
    /// available (implementations are `inline(always)`, so they compile with them).
    unsafe fn run<R: KvElem>(self, base: *const R, stride: usize);
}

/// Runs `work` on the `n` rows of block `blk` for KV head `kvh`: where they are for a type
/// without scales (f32; f16 converted as each vector is loaded, the same values as widening
/// the block first without writing and reading it again, which cost more than f16's halved
/// bytes saved), or, for int8, widened once per block with their per-row scales into
/// `scratch` (the group's query heads then share the scaled rows).
///
/// # Safety
/// AVX2/F16C available; the block's `n` rows are inside `cache.values`; `scratch` holds
/// `n * head_dim` values.
#[inline(always)]
pub(super) unsafe fn with_rows<E: KvElem, W: BlockWork>(
    cache: &Rows<'_, E>,
    blk: usize,
    kvh: usize,
    n: usize,
    d: &super::Dims,
    scratch: &mut [f32],
    work: W,
) {
    // SAFETY (both): by the caller's contract.
    if cache.scales.is_none() {
        let (base, stride) = in_place(cache, blk, kvh, d);
        unsafe { work.run(base, stride) }
    } else {
        let (base, stride) = unsafe { widen(cache, blk, kvh, n, d, scratch) };
        unsafe { work.run(base, stride) }
    }
}

/// Scores of every head of the group against a block's `n` K rows, into
/// `scores[g · ctx + first..]`.
struct ScoreBlock<'a> {
    q_g: &'a [f32],
    d: &'a super::Dims,
    n: usize,
    first: usize,
    ctx: usize,
    scores: &'a mut [f32],
}

impl BlockWork for ScoreBlock<'_> {
    #[inline(always)]
    unsafe fn run<R: KvElem>(self, base: *const R, stride: usize) {
        let (d, n, first, ctx) = (self.d, self.n, self.first, self.ctx);
        let hd = d.head_dim;
        for g in 0..d.group {
            let q = &self.q_g[g * hd..(g + 1) * hd];
            let s = &mut self.scores[g * ctx + first..g * ctx + first + n];
            let mut o = 0;
            while o + 8 <= n {
                // SAFETY: rows o..o + 8 are readable at `stride`; s has 8 values from o.
                unsafe {
                    let dots = dot8(q, base.add(o * stride), stride);
                    _mm256_storeu_ps(
                        s.as_mut_ptr().add(o),
                        _mm256_mul_ps(dots, _mm256_set1_ps(d.scale)),
                    );
                }
                o += 8;
            }
            while o < n {
                // SAFETY: row o is readable.
                s[o] = unsafe { dot1(q, base.add(o * stride)) } * d.scale;
                o += 1;
            }
        }
    }
}

/// Adds a block's `n` weighted V rows (weights `scores[g · ctx + first..]`) to every head of
/// the group in `out_g`.
struct WeighBlock<'a> {
    scores: &'a [f32],
    d: &'a super::Dims,
    first: usize,
    n: usize,
    ctx: usize,
    out_g: &'a mut [f32],
}

impl BlockWork for WeighBlock<'_> {
    #[inline(always)]
    unsafe fn run<R: KvElem>(self, base: *const R, stride: usize) {
        let (hd, ctx, first, n) = (self.d.head_dim, self.ctx, self.first, self.n);
        for g in 0..self.d.group {
            let w = &self.scores[g * ctx + first..g * ctx + first + n];
            let out = &mut self.out_g[g * hd..(g + 1) * hd];
            // SAFETY: n rows of hd values at `stride`; out is hd values.
            unsafe {
                match hd {
                    64 => weigh::<8, R>(w, base, stride, out),
                    128 => weigh::<16, R>(w, base, stride, out),
                    _ => weigh_any(w, base, stride, out),
                }
            }
        }
    }
}

/// The rows of block `blk` for KV head `kvh` where they are: `(first row, stride)`.
///
/// # Panics
/// If the block is not inside the cache.
#[inline(always)]
fn in_place<E>(cache: &Rows<'_, E>, blk: usize, kvh: usize, d: &super::Dims) -> (*const E, usize) {
    let kv_width = d.n_kv_heads * d.head_dim;
    let at0 = (blk * d.block_size * d.n_kv_heads + kvh) * d.head_dim;
    assert!(at0 + (d.block_size - 1) * kv_width + d.head_dim <= cache.values.len());
    (cache.values[at0..].as_ptr(), kv_width)
}

/// Prefetches the `n` rows of KV head `kvh` in block `blk` (the next block to read: the
/// blocks of a sequence are scattered, so the hardware prefetcher cannot follow them).
#[inline(always)]
pub(super) fn prefetch_rows<E: KvElem>(
    cache: &Rows<'_, E>,
    blk: usize,
    kvh: usize,
    n: usize,
    d: &super::Dims,
) {
    let size = std::mem::size_of::<E>();
    let kv_width = d.n_kv_heads * d.head_dim;
    let at0 = (blk * d.block_size * d.n_kv_heads + kvh) * d.head_dim;
    let base = cache.values.as_ptr() as *const u8;
    for o in 0..n {
        prefetch::range(
            base.wrapping_add((at0 + o * kv_width) * size),
            d.head_dim * size,
        );
    }
}

/// The `n` rows of block `blk` for KV head `kvh` times their scales, widened into `scratch`:
/// `(first row, stride)`.
///
/// # Safety
/// AVX2/F16C available; the block's `n` rows are inside `cache.values`; `scratch` holds
/// `n * head_dim` values.
#[inline(always)]
unsafe fn widen<E: KvElem>(
    cache: &Rows<'_, E>,
    blk: usize,
    kvh: usize,
    n: usize,
    d: &super::Dims,
    scratch: &mut [f32],
) -> (*const f32, usize) {
    let hd = d.head_dim;
    let kv_width = d.n_kv_heads * hd;
    let si0 = blk * d.block_size * d.n_kv_heads + kvh;
    let at0 = si0 * hd;
    assert!(at0 + (n.max(1) - 1) * kv_width + hd <= cache.values.len());
    for o in 0..n {
        let sv = _mm256_set1_ps(cache.scale(si0 + o * d.n_kv_heads));
        for j in (0..hd).step_by(8) {
            // SAFETY: bounds asserted above and by the caller's scratch size.
            unsafe {
                let x = E::load8(cache.values.as_ptr().add(at0 + o * kv_width + j));
                _mm256_storeu_ps(scratch.as_mut_ptr().add(o * hd + j), _mm256_mul_ps(x, sv));
            }
        }
    }
    (scratch.as_ptr(), hd)
}

/// Dot products of `q` with the 8 rows at `rows`, `rows + stride`, ...
///
/// # Safety
/// AVX2/FMA; 8 rows of `q.len()` (a multiple of 8) values readable.
#[inline(always)]
unsafe fn dot8<R: KvElem>(q: &[f32], rows: *const R, stride: usize) -> __m256 {
    // SAFETY: by the caller's contract.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 8];
        for j in (0..q.len()).step_by(8) {
            let qv = _mm256_loadu_ps(q.as_ptr().add(j));
            for (p, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qv, R::load8(rows.add(p * stride + j)), *a);
            }
        }
        sum8(acc)
    }
}

/// Transpose-and-add: lane `p` of the result is the sum of the lanes of `acc[p]` (one `hadd`
/// tree for eight sums instead of a horizontal sum each).
///
/// # Safety
/// AVX available.
#[inline(always)]
pub(super) unsafe fn sum8(acc: [__m256; 8]) -> __m256 {
    // SAFETY: by the caller's contract.
    unsafe {
        let s01 = _mm256_hadd_ps(acc[0], acc[1]);
        let s23 = _mm256_hadd_ps(acc[2], acc[3]);
        let s45 = _mm256_hadd_ps(acc[4], acc[5]);
        let s67 = _mm256_hadd_ps(acc[6], acc[7]);
        let s0123 = _mm256_hadd_ps(s01, s23);
        let s4567 = _mm256_hadd_ps(s45, s67);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(s0123, s4567),
            _mm256_permute2f128_ps::<0x31>(s0123, s4567),
        )
    }
}

/// Dot product of `q` with the row at `row`.
///
/// # Safety
/// AVX2/FMA; `q.len()` (a multiple of 8) values readable at `row`.
#[inline(always)]
pub(super) unsafe fn dot1<E: KvElem>(q: &[f32], row: *const E) -> f32 {
    // SAFETY: by the caller's contract.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for j in (0..q.len()).step_by(8) {
            acc = _mm256_fmadd_ps(
                _mm256_loadu_ps(q.as_ptr().add(j)),
                E::load8(row.add(j)),
                acc,
            );
        }
        crate::kv_cache::elem::avx2::hsum(acc)
    }
}

/// `out += Σ_o w[o] · row_o` for a head of `8 · NV` values, the sum kept in registers.
///
/// # Safety
/// AVX2/FMA; `w.len()` rows of `8 · NV` values at `stride`; `out` is `8 · NV` values.
#[inline(always)]
unsafe fn weigh<const NV: usize, R: KvElem>(
    w: &[f32],
    rows: *const R,
    stride: usize,
    out: &mut [f32],
) {
    // SAFETY: by the caller's contract.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); NV];
        for (o, &wo) in w.iter().enumerate() {
            let wv = _mm256_set1_ps(wo);
            let row = rows.add(o * stride);
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(wv, R::load8(row.add(8 * j)), *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            let p = out.as_mut_ptr().add(8 * j);
            _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), *a));
        }
    }
}

/// [`weigh`] for any head size that is a multiple of 8 (accumulates in `out`).
///
/// # Safety
/// As [`weigh`] with `out.len()` values per row.
#[inline(always)]
unsafe fn weigh_any<R: KvElem>(w: &[f32], rows: *const R, stride: usize, out: &mut [f32]) {
    // SAFETY: by the caller's contract.
    unsafe {
        for (o, &wo) in w.iter().enumerate() {
            let wv = _mm256_set1_ps(wo);
            let row = rows.add(o * stride);
            for j in (0..out.len()).step_by(8) {
                let p = out.as_mut_ptr().add(j);
                _mm256_storeu_ps(
                    p,
                    _mm256_fmadd_ps(wv, R::load8(row.add(j)), _mm256_loadu_ps(p)),
                );
            }
        }
    }
}

/// `s = softmax(s)` in place: subtract the maximum, exponentiate, normalise.
///
/// # Safety
/// AVX2/FMA available.
#[inline(always)]
pub(super) unsafe fn softmax(s: &mut [f32]) {
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mv = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    let mut tail = 0.0f32;
    let mut chunks = s.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: c is 8 floats.
        unsafe {
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv));
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            sum = _mm256_add_ps(sum, e);
        }
    }
    for v in chunks.into_remainder() {
        *v = (*v - max).exp();
        tail += *v;
    }
    // SAFETY: features by contract.
    let inv = 1.0 / (unsafe { crate::kv_cache::elem::avx2::hsum(sum) } + tail);
    crate::simd::scale(s, inv);
}
