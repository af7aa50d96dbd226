//! Paged attention over a block-table KV cache, after vLLM's `paged_attention` kernels: each
//! sequence's keys and values live in fixed-size blocks scattered through one cache, found
//! through the sequence's block table. One call serves a mixed batch (prefill chunks and decode
//! steps of many sequences). The query heads sharing a KV head (GQA, llama.cpp's
//! `h / (n_heads / n_kv_heads)` mapping) are processed together so each K/V row is read once
//! per group; softmax subtracts the row maximum, so large logits cannot overflow. K/V rows are
//! read in the cache's element type (f32, f16 or int8, see [`crate::kv_cache`]) and widened to
//! f32 in registers; an int8 row's scale multiplies its dot product (K) or its softmax weight
//! (V), so dequantised rows never exist in memory.
//!
//! Builds: portable, AVX2 (`avx2`) and, for head sizes 64 and 128, AVX-512 (`avx512`);
//! the widest this CPU runs is used for every call, so a token's result never depends on the
//! batch it is in.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use rayon::prelude::*;

use crate::kv_cache::elem::{self, KvElem};
use crate::kv_cache::KvCache;

/// The query tokens of one sequence in a batched attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionSeq<'a> {
    /// Index of the sequence's first query token in the batch.
    pub q_start: usize,
    /// Number of consecutive query tokens of this sequence (1 for a decode step).
    pub q_len: usize,
    /// Position of the first query token; earlier positions are already in the cache.
    pub start_pos: usize,
    /// Physical KV block of each logical block of the sequence.
    pub block_table: &'a [u32],
}

/// Shapes shared by every task of one call.
struct Dims {
    head_dim: usize,
    group: usize,
    n_kv_heads: usize,
    block_size: usize,
    scale: f32,
    window: Option<usize>,
}

impl Dims {
    /// The first position a query at `pos` attends to (0 without a window).
    #[inline(always)]
    fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// One layer's K or V cache in element type `E`, with int8's per-(slot, head) scales.
#[derive(Clone, Copy)]
struct Rows<'a, E> {
    values: &'a [E],
    scales: Option<&'a [f32]>,
}

impl<E> Rows<'_, E> {
    /// Scale of the row of (slot, head) index `si` (1 for unscaled types).
    #[inline(always)]
    fn scale(&self, si: usize) -> f32 {
        self.scales.map_or(1.0, |s| s[si])
    }
}

/// q: `[n_tokens, n_heads, head_dim]`; token j of a sequence (at position start_pos + j)
/// attends causally to positions `0..=start_pos + j` read through the block table; GQA
/// (n_heads a multiple of n_kv_heads). K and V caches are `[num_slots, n_kv_heads, head_dim]`
/// in one element type ([`KvCache`]). Writes out: `[n_tokens, n_heads, head_dim]`; rows of
/// tokens that belong to no sequence are zeroed.
///
/// # Panics
/// On inconsistent shapes, K and V caches of different types or sizes, overlapping or
/// out-of-range sequences, a block table too short for the sequence's positions, or a block
/// outside the cache.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<'a>(
    q: &[f32],
    k_cache: impl Into<KvCache<'a>>,
    v_cache: impl Into<KvCache<'a>>,
    seqs: &[AttentionSeq],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    scale: f32,
    out: &mut [f32],
) {
    paged_attention_windowed(
        q, k_cache, v_cache, seqs, n_heads, n_kv_heads, head_dim, block_size, scale, None, out,
    );
}

/// [`paged_attention`] with an optional sliding window (Gemma's local layers, Mistral): with
/// `Some(window)` the token at position `p` attends to the `window` positions
/// `p + 1 - window..=p` only (llama.cpp's `LLAMA_SWA_TYPE_STANDARD`: a key `p - k >= window`
/// behind is masked), and KV blocks wholly behind the window are not read; `None` is
/// [`paged_attention`].
///
/// # Panics
/// As [`paged_attention`], and on a window of 0.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_windowed<'a>(
    q: &[f32],
    k_cache: impl Into<KvCache<'a>>,
    v_cache: impl Into<KvCache<'a>>,
    seqs: &[AttentionSeq],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    scale: f32,
    window: Option<usize>,
    out: &mut [f32],
) {
    assert!(window != Some(0), "paged_attention: zero window");
    let shape = Shape {
        n_heads,
        n_kv_heads,
        head_dim,
        block_size,
        scale,
        window,
    };
    attention(
        Simd::detect(),
        q,
        k_cache.into(),
        v_cache.into(),
        seqs,
        shape,
        out,
    );
}

/// The head layout and scale of one call.
#[derive(Debug, Clone, Copy)]
struct Shape {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    scale: f32,
    /// Sliding window in positions, `None` for full causal attention.
    window: Option<usize>,
}

/// The instruction set an attention call runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Simd {
    Portable,
    /// AVX2 + FMA + F16C ([`avx2`]).
    Avx2,
    /// AVX-512 F/VL/DQ besides those ([`avx512`], for head sizes 64 and 128; AVX2 otherwise).
    Avx512,
}

impl Simd {
    /// The widest level this CPU runs.
    fn detect() -> Self {
        if !crate::cpu::avx2() {
            return Self::Portable;
        }
        if crate::cpu::avx512_float() {
            return Self::Avx512;
        }
        Self::Avx2
    }
}

/// [`paged_attention`] with the SIMD level chosen by the caller (tests run every level).
fn attention<'a>(
    simd: Simd,
    q: &[f32],
    k_cache: KvCache<'a>,
    v_cache: KvCache<'a>,
    seqs: &[AttentionSeq],
    shape: Shape,
    out: &mut [f32],
) {
    let Shape {
        n_heads,
        n_kv_heads,
        head_dim,
        block_size,
        scale,
        window,
    } = shape;
    assert!(
        n_kv_heads > 0 && head_dim > 0 && block_size > 0,
        "paged_attention: zero dimension"
    );
    assert!(
        n_heads.is_multiple_of(n_kv_heads),
        "paged_attention: n_heads not a multiple of n_kv_heads"
    );
    let row = n_heads * head_dim;
    assert!(
        q.len().is_multiple_of(row.max(1)),
        "paged_attention: q is not [n_tokens, n_heads, head_dim]"
    );
    assert_eq!(
        out.len(),
        q.len(),
        "paged_attention: out and q differ in length"
    );
    let kv_width = n_kv_heads * head_dim;
    assert_eq!(
        k_cache.len(),
        v_cache.len(),
        "paged_attention: caches differ in length"
    );
    assert!(
        k_cache.len().is_multiple_of(kv_width),
        "paged_attention: cache is not rows of kv_width"
    );
    let n_tokens = q.len() / row.max(1);
    let num_slots = k_cache.len() / kv_width;

    // token -> (sequence, index within it); checked up front so the workers cannot fail.
    let mut owner: Vec<Option<(usize, usize)>> = vec![None; n_tokens];
    for (s, seq) in seqs.iter().enumerate() {
        let end = seq.q_start.checked_add(seq.q_len);
        assert!(
            end.is_some_and(|e| e <= n_tokens),
            "paged_attention: sequence {s} out of the batch"
        );
        let ctx = seq.start_pos + seq.q_len;
        assert!(
            seq.q_len == 0 || seq.block_table.len() * block_size >= ctx,
            "paged_attention: block table of sequence {s} too short for {ctx} positions"
        );
        let used_blocks = ctx.div_ceil(block_size);
        for &b in &seq.block_table[..used_blocks.min(seq.block_table.len())] {
            assert!(
                (b as usize + 1) * block_size <= num_slots,
                "paged_attention: block {b} of sequence {s} outside the cache"
            );
        }
        for j in 0..seq.q_len {
            let slot = &mut owner[seq.q_start + j];
            assert!(
                slot.is_none(),
                "paged_attention: sequences overlap at token {}",
                seq.q_start + j
            );
            *slot = Some((s, j));
        }
    }

    let dims = Dims {
        head_dim,
        group: n_heads / n_kv_heads,
        n_kv_heads,
        block_size,
        scale,
        window,
    };
    let call = Call {
        q,
        seqs,
        owner: &owner,
        dims: &dims,
        simd,
    };
    let scaled = |scales: &'a [f32]| {
        assert_eq!(
            scales.len(),
            num_slots * n_kv_heads,
            "paged_attention: int8 scales are not one per slot and head"
        );
        Some(scales)
    };
    match (k_cache, v_cache) {
        (KvCache::F32(k), KvCache::F32(v)) => call.run(
            Rows {
                values: k,
                scales: None,
            },
            Rows {
                values: v,
                scales: None,
            },
            out,
        ),
        (KvCache::F16(k), KvCache::F16(v)) => call.run(
            Rows {
                values: k,
                scales: None,
            },
            Rows {
                values: v,
                scales: None,
            },
            out,
        ),
        (
            KvCache::Int8 {
                values: k,
                scales: ks,
            },
            KvCache::Int8 {
                values: v,
                scales: vs,
            },
        ) => call.run(
            Rows {
                values: k,
                scales: scaled(ks),
            },
            Rows {
                values: v,
                scales: scaled(vs),
            },
            out,
        ),
        (k, v) => panic!(
            "paged_attention: K cache is {} but V cache is {}",
            k.dtype(),
            v.dtype()
        ),
    }
}

/// The validated inputs of one [`paged_attention`] call.
struct Call<'a> {
    q: &'a [f32],
    seqs: &'a [AttentionSeq<'a>],
    owner: &'a [Option<(usize, usize)>],
    dims: &'a Dims,
    /// The build to run (the CPU supports it).
    simd: Simd,
}

impl Call<'_> {
    /// One task per (token, KV head): the group of query heads sharing that KV head.
    fn run<E: KvElem>(&self, k: Rows<'_, E>, v: Rows<'_, E>, out: &mut [f32]) {
        let d = self.dims;
        let task = d.group * d.head_dim;
        if task == 0 {
            return;
        }
        let simd = self.simd;
        out.par_chunks_mut(task)
            .zip(self.q.par_chunks(task))
            .enumerate()
            .for_each_init(Scratch::default, |scratch, (idx, (out_g, q_g))| {
                let token = idx / d.n_kv_heads;
                let Some((s, j)) = self.owner[token] else {
                    out_g.fill(0.0);
                    return;
                };
                let seq = &self.seqs[s];
                let args = GroupArgs {
                    q_g,
                    k,
                    v,
                    seq,
                    pos: seq.start_pos + j,
                    kvh: idx % d.n_kv_heads,
                    d,
                };
                #[cfg(target_arch = "x86_64")]
                if simd == Simd::Avx512 && avx512::supports(d.head_dim) {
                    // SAFETY: AVX-512 F/VL/DQ, AVX2, FMA and F16C were detected on this CPU;
                    // the head size is supported; sequences and blocks were validated above.
                    unsafe { avx512::attend_group(args, scratch, out_g) };
                    return;
                }
                #[cfg(target_arch = "x86_64")]
                if simd != Simd::Portable {
                    if d.head_dim.is_multiple_of(8) {
                        // SAFETY: AVX2, FMA and F16C were detected on this CPU; the head size
                        // is a multiple of 8; sequences and blocks were validated above.
                        unsafe { avx2::attend_group(args, scratch, out_g) };
                    } else {
                        // SAFETY: as above.
                        unsafe { attend_group_avx2(args, &mut scratch.scores, out_g) };
                    }
                    return;
                }
                let _ = simd;
                attend_group::<E, false>(args, &mut scratch.scores, out_g)
            });
    }
}

/// Per-worker scratch: scores (group × context) and, for the SIMD builds, one KV block of
/// rows widened to f32.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    rows: Vec<f32>,
}

impl Scratch {
    /// Zeroed scores for the group's heads over `ctx` positions, and room for one KV block of
    /// rows widened to f32.
    fn for_task(&mut self, d: &Dims, ctx: usize) -> (&mut Vec<f32>, &mut Vec<f32>) {
        self.scores.clear();
        self.scores.resize(d.group * ctx, 0.0);
        self.rows.resize(d.block_size * d.head_dim, 0.0);
        (&mut self.scores, &mut self.rows)
    }
}

/// Inputs of one (token, KV head) task.
struct GroupArgs<'a, E> {
    /// Queries of the `group` heads sharing the KV head.
    q_g: &'a [f32],
    k: Rows<'a, E>,
    v: Rows<'a, E>,
    seq: &'a AttentionSeq<'a>,
    /// Position of the query token.
    pos: usize,
    /// The KV head.
    kvh: usize,
    d: &'a Dims,
}

/// [`attend_group`] compiled for AVX2 + FMA + F16C with the explicit 8-wide row operations
/// (head sizes that are not a multiple of 8; the others take [`avx2::attend_group`]).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_group_avx2<E: KvElem>(
    args: GroupArgs<E>,
    scores: &mut Vec<f32>,
    out_g: &mut [f32],
) {
    attend_group::<E, true>(args, scores, out_g)
}

/// `Σ q·row` with the SIMD level of the caller.
#[inline(always)]
fn dot<E: KvElem, const SIMD: bool>(q: &[f32], row: &[E]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        // SAFETY: SIMD is true only inside attend_group_avx2, whose features are enabled.
        return unsafe { elem::avx2::dot(q, row) };
    }
    elem::dot(q, row)
}

/// `out += w · row` with the SIMD level of the caller.
#[inline(always)]
fn axpy<E: KvElem, const SIMD: bool>(out: &mut [f32], w: f32, row: &[E]) {
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        // SAFETY: as in `dot`.
        return unsafe { elem::avx2::axpy(out, w, row) };
    }
    elem::axpy(out, w, row)
}

/// Attention of the `group` query heads sharing KV head `kvh`, for one token at `pos`.
#[inline(always)]
fn attend_group<E: KvElem, const SIMD: bool>(
    args: GroupArgs<E>,
    scores: &mut Vec<f32>,
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
    let ctx = pos + 1;
    let lo = d.first_visible(pos);
    let hd = d.head_dim;
    // (position, value offset of its row, index of its scale), walked block by block from the
    // first visible one: no division per position.
    let rows = || {
        seq.block_table
            .iter()
            .enumerate()
            .skip(lo / d.block_size)
            .flat_map(move |(b, &blk)| {
                let first = b * d.block_size;
                let slot0 = blk as usize * d.block_size;
                (0..d.block_size.min(ctx.saturating_sub(first))).map(move |o| {
                    let si = (slot0 + o) * d.n_kv_heads + kvh;
                    (first + o, si * hd, si)
                })
            })
    };
    scores.clear();
    scores.resize(d.group * ctx, 0.0);
    for (p, at, si) in rows() {
        let krow = &k.values[at..at + hd];
        let ks = k.scale(si) * d.scale;
        for g in 0..d.group {
            scores[g * ctx + p] = dot::<E, SIMD>(&q_g[g * hd..(g + 1) * hd], krow) * ks;
        }
    }
    // A window's partly visible first block: its positions before `lo` weigh nothing.
    for s in scores.chunks_exact_mut(ctx) {
        let (hidden, s) = s.split_at_mut(lo);
        hidden.fill(0.0);
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for v in s.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        crate::simd::scale(s, 1.0 / sum);
    }
    out_g.fill(0.0);
    match hd {
        64 => weigh_values::<E, 64>(seq, kvh, ctx, lo, d, v, scores, out_g),
        128 => weigh_values::<E, 128>(seq, kvh, ctx, lo, d, v, scores, out_g),
        _ => {
            for (p, at, si) in rows() {
                let vrow = &v.values[at..at + hd];
                let vs = v.scale(si);
                for g in 0..d.group {
                    axpy::<E, SIMD>(
                        &mut out_g[g * hd..(g + 1) * hd],
                        scores[g * ctx + p] * vs,
                        vrow,
                    );
                }
            }
        }
    }
}

/// `out_g[g] += Σ_p scores[g][p] · V[p]` for a head size known at compile time: the sum over
/// one KV block stays in registers (`HD / 8` vectors) and is added to `out_g` once per block,
/// instead of a load and store of `out_g` per position.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn weigh_values<E: KvElem, const HD: usize>(
    seq: &AttentionSeq,
    kvh: usize,
    ctx: usize,
    lo: usize,
    d: &Dims,
    v: Rows<'_, E>,
    scores: &[f32],
    out_g: &mut [f32],
) {
    for (b, &blk) in seq.block_table.iter().enumerate().skip(lo / d.block_size) {
        let first = b * d.block_size;
        if first >= ctx {
            break;
        }
        let n = d.block_size.min(ctx - first);
        let slot0 = blk as usize * d.block_size;
        for g in 0..d.group {
            let w = &scores[g * ctx + first..g * ctx + first + n];
            let mut acc = [0.0f32; HD];
            for (o, &wo) in w.iter().enumerate() {
                let si = (slot0 + o) * d.n_kv_heads + kvh;
                let row = &v.values[si * HD..(si + 1) * HD];
                let wo = wo * v.scale(si);
                for i in 0..HD {
                    acc[i] += wo * row[i].to_f32();
                }
            }
            for (out, a) in out_g[g * HD..(g + 1) * HD].iter_mut().zip(acc) {
                *out += a;
            }
        }
    }
}

#[cfg(test)]
mod tests;
