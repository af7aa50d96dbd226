//! The AVX-512 build of one (token, KV head) attention task, for head sizes 64 and 128: the
//! AVX2 build's block walk ([`super::avx2`], 8-wide softmax) with 512-bit rows and every K
//! and V row read once for the whole group of query heads:
//!
//! - scores: up to three heads at a time against eight K rows, 24 accumulators; each K vector
//!   is loaded once and multiplied into every head's sum (the AVX2 build reads it once per
//!   head), then each sum is folded to 256 bits and the AVX2 `hadd` tree reduces eight at once;
//! - values: the weighted sum of a block's V rows for up to four heads (two at head size 128)
//!   stays in registers; each V row is loaded once for all of them.
//!
//! Rows are read as the AVX2 build reads them ([`super::avx2::with_rows`]): f32 and f16 where
//! they are in the cache (f16 converted as each vector is loaded: at 16 sequences the
//! attention waits on memory, so the f16 cache's halved bytes count), int8 widened with its
//! per-row scale once per block. The values are the same either way (f16 → f32 is exact).
//!
//! A head's result does not depend on which heads share its pass, nor on the batch: every sum
//! runs in the same order for every head.

use std::arch::x86_64::*;

use super::avx2::{dot1, prefetch_rows, softmax, sum8, with_rows, BlockWork};
use super::{Dims, GroupArgs, Rows, Scratch};
use crate::kv_cache::elem::KvElem;

/// Query heads scored together against one set of eight K rows.
const SCORE_HEADS: usize = 3;

/// Whether [`attend_group`] handles this head size.
pub(super) fn supports(head_dim: usize) -> bool {
    matches!(head_dim, 64 | 128)
}

/// Attention of the group of query heads sharing one KV head, for one query token.
///
/// # Safety
/// AVX-512 F/VL/DQ, AVX2, FMA and F16C available; [`supports`] `args.d.head_dim`; the caller
/// validated the block table and cache sizes (as `paged_attention` does).
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn attend_group<E: KvElem>(
    args: GroupArgs<E>,
    scratch: &mut Scratch,
    out_g: &mut [f32],
) {
    let (d, kvh) = (args.d, args.kvh);
    let bs = d.block_size;
    debug_assert!(supports(d.head_dim));
    let ctx = args.pos + 1;
    // From the first block a window leaves visible.
    let lo = d.first_visible(args.pos);
    let first_block = lo / bs;
    let (scores, rows) = scratch.for_task(d, ctx);
    let n_blocks = ctx.div_ceil(bs);
    let table = args.seq.block_table;
    let block = |b: usize| (b * bs, table[b] as usize, bs.min(ctx - b * bs));
    // The blocks of a sequence are scattered: each loop asks for the next one's rows early.
    let prefetch_next = |cache: &Rows<'_, E>, b: usize| {
        if b + 1 < n_blocks {
            let (_, next, n_next) = block(b + 1);
            prefetch_rows(cache, next, kvh, n_next, d);
        }
    };

    for b in first_block..n_blocks {
        let (first, blk, n) = block(b);
        prefetch_next(&args.k, b);
        let work = ScoreBlock {
            q_g: args.q_g,
            d,
            n,
            out: Scored {
                scores: &mut *scores,
                ctx,
                at: first,
                scale: d.scale,
            },
        };
        // SAFETY: the block is inside the cache (validated by the caller); rows holds bs rows.
        unsafe { with_rows(&args.k, blk, kvh, n, d, rows, work) };
    }

    // A window's partly visible first block: its positions before `lo` weigh nothing.
    for s in scores.chunks_exact_mut(ctx) {
        // SAFETY: features by contract.
        unsafe { softmax(&mut s[lo..]) };
        s[..lo].fill(0.0);
    }

    out_g.fill(0.0);
    for b in first_block..n_blocks {
        let (first, blk, n) = block(b);
        prefetch_next(&args.v, b);
        let weights = Weights {
            scores,
            ctx,
            first,
            n,
        };
        let work = WeighBlock {
            w: &weights,
            d,
            out_g: &mut *out_g,
        };
        // SAFETY: as for K; out_g holds group · head_dim values.
        unsafe { with_rows(&args.v, blk, kvh, n, d, rows, work) };
    }
}

/// Scores of every head of the group against a block's `n` K rows, written from `out.at` on.
struct ScoreBlock<'a> {
    q_g: &'a [f32],
    d: &'a Dims,
    n: usize,
    out: Scored<'a>,
}

impl BlockWork for ScoreBlock<'_> {
    #[inline(always)]
    unsafe fn run<R: KvElem>(self, base: *const R, stride: usize) {
        let (q_g, n, out) = (self.q_g, self.n, self.out);
        let (hd, group) = (self.d.head_dim, self.d.group);
        let mut g0 = 0;
        while g0 < group {
            let heads = SCORE_HEADS.min(group - g0);
            let mut o = 0;
            while o + 8 <= n {
                let at = Scored {
                    scores: &mut *out.scores,
                    ctx: out.ctx,
                    at: out.at + o,
                    scale: out.scale,
                };
                // SAFETY: rows o..o + 8 are readable at `stride`; each head's q is hd values;
                // scores has 8 places from `at + o` for every head.
                unsafe {
                    let rows = base.add(o * stride);
                    match heads {
                        3 => score8::<3, R>(q_g, g0, hd, rows, stride, at),
                        2 => score8::<2, R>(q_g, g0, hd, rows, stride, at),
                        _ => score8::<1, R>(q_g, g0, hd, rows, stride, at),
                    }
                }
                o += 8;
            }
            for o in o..n {
                for g in g0..g0 + heads {
                    let q = &q_g[g * hd..(g + 1) * hd];
                    // SAFETY: row o is readable.
                    out.scores[g * out.ctx + out.at + o] =
                        unsafe { dot1(q, base.add(o * stride)) } * out.scale;
                }
            }
            g0 += heads;
        }
    }
}

/// Adds a block's weighted V rows to every head of the group in `out_g`.
struct WeighBlock<'a> {
    w: &'a Weights<'a>,
    d: &'a Dims,
    out_g: &'a mut [f32],
}

impl BlockWork for WeighBlock<'_> {
    #[inline(always)]
    unsafe fn run<R: KvElem>(self, base: *const R, stride: usize) {
        let (w, d) = (self.w, self.d);
        let mut g0 = 0;
        while g0 < d.group {
            // SAFETY: by the caller's contract.
            g0 += unsafe {
                match d.head_dim {
                    64 => weigh_heads::<4, R>(w, g0, d.group, base, stride, self.out_g),
                    _ => weigh_heads::<8, R>(w, g0, d.group, base, stride, self.out_g),
                }
            };
        }
    }
}

/// Where [`score8`] writes: head `g`'s 8 scores at `scores[g · ctx + at..]`, times `scale`.
struct Scored<'a> {
    scores: &'a mut [f32],
    ctx: usize,
    at: usize,
    scale: f32,
}

/// Scores of heads `g0..g0 + H` of `q_g` against the 8 rows at `rows`, `rows + stride`, ...
///
/// # Safety
/// AVX-512F/DQ and AVX2; 8 rows of `hd` (a multiple of 16) values readable; `q_g` holds heads
/// `g0..g0 + H`; `out.scores` holds 8 values from `(g0 + h) · ctx + at` for each of them.
#[inline(always)]
unsafe fn score8<const H: usize, R: KvElem>(
    q_g: &[f32],
    g0: usize,
    hd: usize,
    rows: *const R,
    stride: usize,
    out: Scored<'_>,
) {
    // SAFETY: by the caller's contract.
    unsafe {
        // acc[p][h]: row p times head h.
        let mut acc = [[_mm512_setzero_ps(); H]; 8];
        let q = q_g.as_ptr().add(g0 * hd);
        for j in (0..hd).step_by(16) {
            let mut qv = [_mm512_setzero_ps(); H];
            for (h, x) in qv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(q.add(h * hd + j));
            }
            for (p, acc_p) in acc.iter_mut().enumerate() {
                let kv = R::load16(rows.add(p * stride + j));
                for (a, qh) in acc_p.iter_mut().zip(&qv) {
                    *a = _mm512_fmadd_ps(*qh, kv, *a);
                }
            }
        }
        for h in 0..H {
            // 512 → 256 bits per row, then the AVX2 transpose-and-add: lane p = Σ acc[p][h].
            let mut f = [_mm256_setzero_ps(); 8];
            for (fp, acc_p) in f.iter_mut().zip(&acc) {
                let a = acc_p[h];
                *fp = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps::<1>(a));
            }
            let dots = sum8(f);
            let dst = out.scores.as_mut_ptr().add((g0 + h) * out.ctx + out.at);
            _mm256_storeu_ps(dst, _mm256_mul_ps(dots, _mm256_set1_ps(out.scale)));
        }
    }
}

/// The softmax weights of one block: `scores[g · ctx + first + o]` for its `n` rows.
struct Weights<'a> {
    scores: &'a [f32],
    ctx: usize,
    first: usize,
    n: usize,
}

/// `out_g[g] += Σ_o w[g][o] · row_o` for as many heads from `g0` as fit in registers with a
/// head of `16 · NV` values (`16 / NV` heads); returns how many it did.
///
/// # Safety
/// AVX-512F; `w.n` rows of `16 · NV` values at `stride`; `out_g` holds `group` heads.
#[inline(always)]
unsafe fn weigh_heads<const NV: usize, R: KvElem>(
    w: &Weights<'_>,
    g0: usize,
    group: usize,
    rows: *const R,
    stride: usize,
    out_g: &mut [f32],
) -> usize {
    // SAFETY (all arms): by the caller's contract.
    unsafe {
        match (16 / NV).min(group - g0) {
            4 => weigh::<NV, 4, R>(w, g0, rows, stride, out_g),
            3 => weigh::<NV, 3, R>(w, g0, rows, stride, out_g),
            2 => weigh::<NV, 2, R>(w, g0, rows, stride, out_g),
            _ => weigh::<NV, 1, R>(w, g0, rows, stride, out_g),
        }
    }
}

/// [`weigh_heads`] for `H` heads: each row is loaded once and weighed into all of them.
///
/// # Safety
/// As [`weigh_heads`], with heads `g0..g0 + H` in `out_g`.
#[inline(always)]
unsafe fn weigh<const NV: usize, const H: usize, R: KvElem>(
    w: &Weights<'_>,
    g0: usize,
    rows: *const R,
    stride: usize,
    out_g: &mut [f32],
) -> usize {
    let hd = 16 * NV;
    // SAFETY: by the caller's contract.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NV]; H];
        for o in 0..w.n {
            let row = rows.add(o * stride);
            let mut vr = [_mm512_setzero_ps(); NV];
            for (j, x) in vr.iter_mut().enumerate() {
                *x = R::load16(row.add(16 * j));
            }
            for (h, acc_h) in acc.iter_mut().enumerate() {
                let wv = _mm512_set1_ps(w.scores[(g0 + h) * w.ctx + w.first + o]);
                for (a, x) in acc_h.iter_mut().zip(vr) {
                    *a = _mm512_fmadd_ps(wv, x, *a);
                }
            }
        }
        for (h, acc_h) in acc.iter().enumerate() {
            let out = out_g.as_mut_ptr().add((g0 + h) * hd);
            for (j, a) in acc_h.iter().enumerate() {
                let p = out.add(16 * j);
                _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), *a));
            }
        }
    }
    H
}
