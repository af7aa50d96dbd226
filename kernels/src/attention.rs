//! Paged attention over a block-table KV cache, after vLLM's `paged_attention` kernels: each
//! sequence's keys and values live in fixed-size blocks scattered through one cache, found
//! through the sequence's block table. One call serves a mixed batch (prefill chunks and decode
//! steps of many sequences). The query heads sharing a KV head (GQA, llama.cpp's
//! `h / (n_heads / n_kv_heads)` mapping) are processed together so each K/V row is read once
//! per group; softmax subtracts the row maximum, so large logits cannot overflow. K/V rows are
//! read in the cache's element type (f32, f16 or int8, see [`crate::kv_cache`]) and widened to
//! f32 in registers; an int8 row's scale multiplies its dot product (K) or its softmax weight
//! (V), so dequantised rows never exist in memory.

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
    let (k_cache, v_cache) = (k_cache.into(), v_cache.into());
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
    };
    let call = Call {
        q,
        seqs,
        owner: &owner,
        dims: &dims,
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
            Rows { values: k, scales: None },
            Rows { values: v, scales: None },
            out,
        ),
        (KvCache::F16(k), KvCache::F16(v)) => call.run(
            Rows { values: k, scales: None },
            Rows { values: v, scales: None },
            out,
        ),
        (
            KvCache::Int8 { values: k, scales: ks },
            KvCache::Int8 { values: v, scales: vs },
        ) => call.run(
            Rows { values: k, scales: scaled(ks) },
            Rows { values: v, scales: scaled(vs) },
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
}

impl Call<'_> {
    /// One task per (token, KV head): the group of query heads sharing that KV head.
    fn run<E: KvElem>(&self, k: Rows<'_, E>, v: Rows<'_, E>, out: &mut [f32]) {
        let d = self.dims;
        let task = d.group * d.head_dim;
        if task == 0 {
            return;
        }
        let avx2 = simd_level_avx2();
        out.par_chunks_mut(task)
            .zip(self.q.par_chunks(task))
            .enumerate()
            .for_each_init(Vec::new, |scores, (idx, (out_g, q_g))| {
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
                if avx2 {
                    // SAFETY: AVX2, FMA and F16C were detected on this CPU.
                    unsafe { attend_group_avx2(args, scores, out_g) };
                    return;
                }
                let _ = avx2;
                attend_group::<E, false>(args, scores, out_g)
            });
    }
}

/// Whether the AVX2 build of the inner loops can run here.
pub(crate) fn simd_level_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
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

/// [`attend_group`] compiled for AVX2 + FMA + F16C with the explicit 8-wide row operations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_group_avx2<E: KvElem>(args: GroupArgs<E>, scores: &mut Vec<f32>, out_g: &mut [f32]) {
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
    let hd = d.head_dim;
    // (position, value offset of its row, index of its scale), walked block by block: no
    // division per position.
    let rows = || {
        seq.block_table
            .iter()
            .enumerate()
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
    for s in scores.chunks_exact_mut(ctx) {
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for v in s.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        crate::simd::scale(s, 1.0 / sum);
    }
    out_g.fill(0.0);
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        match hd {
            // SAFETY: SIMD is true only inside attend_group_avx2.
            64 => return unsafe { weigh_values_avx2::<E, 8>(seq, kvh, ctx, d, v, scores, out_g) },
            // SAFETY: as above.
            128 => return unsafe { weigh_values_avx2::<E, 16>(seq, kvh, ctx, d, v, scores, out_g) },
            _ => {}
        }
    }
    match hd {
        64 if !SIMD => weigh_values::<E, 64>(seq, kvh, ctx, d, v, scores, out_g),
        128 if !SIMD => weigh_values::<E, 128>(seq, kvh, ctx, d, v, scores, out_g),
        _ => {
            for (p, at, si) in rows() {
                let vrow = &v.values[at..at + hd];
                let vs = v.scale(si);
                for g in 0..d.group {
                    axpy::<E, SIMD>(&mut out_g[g * hd..(g + 1) * hd], scores[g * ctx + p] * vs, vrow);
                }
            }
        }
    }
}

/// `out_g[g] += Σ_p scores[g][p] · V[p]` for a head size known at compile time: the sum over
/// one KV block stays in registers (`HD / 8` vectors) and is added to `out_g` once per block,
/// instead of a load and store of `out_g` per position.
#[inline(always)]
fn weigh_values<E: KvElem, const HD: usize>(
    seq: &AttentionSeq,
    kvh: usize,
    ctx: usize,
    d: &Dims,
    v: Rows<'_, E>,
    scores: &[f32],
    out_g: &mut [f32],
) {
    for (b, &blk) in seq.block_table.iter().enumerate() {
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

/// [`weigh_values`] with explicit AVX2 vectors: `NV` vectors of 8 per head (head dim 8·NV).
///
/// # Safety
/// AVX2, FMA and F16C available; `d.head_dim == 8 * NV`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weigh_values_avx2<E: KvElem, const NV: usize>(
    seq: &AttentionSeq,
    kvh: usize,
    ctx: usize,
    d: &Dims,
    v: Rows<'_, E>,
    scores: &[f32],
    out_g: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hd = 8 * NV;
    debug_assert_eq!(hd, d.head_dim);
    for (b, &blk) in seq.block_table.iter().enumerate() {
        let first = b * d.block_size;
        if first >= ctx {
            break;
        }
        let n = d.block_size.min(ctx - first);
        let slot0 = blk as usize * d.block_size;
        for g in 0..d.group {
            let w = &scores[g * ctx + first..g * ctx + first + n];
            // SAFETY: rows are `hd` values inside `v.values` (bounds-checked slices below);
            // out_g[g] is `hd` values; features by contract.
            unsafe {
                let mut acc = [_mm256_setzero_ps(); NV];
                for (o, &wo) in w.iter().enumerate() {
                    let si = (slot0 + o) * d.n_kv_heads + kvh;
                    let row = &v.values[si * hd..(si + 1) * hd];
                    let wv = _mm256_set1_ps(wo * v.scale(si));
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(wv, E::load8(row.as_ptr().add(8 * j)), *a);
                    }
                }
                let out = &mut out_g[g * hd..(g + 1) * hd];
                for (j, a) in acc.iter().enumerate() {
                    let p = out.as_mut_ptr().add(8 * j);
                    _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), *a));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::too_many_arguments)]
mod tests {
    use super::*;
    use crate::kv_cache::{KvBuffer, KvDtype};
    use crate::test_util::{assert_close, random_vec, read_row, rng};
    use crate::write_kv;
    use rand::seq::SliceRandom;
    use rand::Rng;

    /// A sequence of the test batch: its full K/V history (contiguous) and its query chunk.
    struct TestSeq {
        k: Vec<f32>,
        v: Vec<f32>,
        blocks: Vec<u32>,
        start_pos: usize,
        q_len: usize,
    }

    /// Naive causal GQA attention in f64 over contiguous K/V of one sequence.
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        start_pos: usize,
        nh: usize,
        nkv: usize,
        hd: usize,
        scale: f32,
    ) -> Vec<f32> {
        let q_len = q.len() / (nh * hd);
        let mut out = vec![0.0; q.len()];
        for j in 0..q_len {
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let qv = &q[(j * nh + h) * hd..][..hd];
                let ctx = start_pos + j + 1;
                let s: Vec<f64> = (0..ctx)
                    .map(|p| {
                        let kr = &k[(p * nkv + kvh) * hd..][..hd];
                        qv.iter()
                            .zip(kr)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for i in 0..hd {
                    let acc: f64 = (0..ctx)
                        .map(|p| e[p] / z * v[(p * nkv + kvh) * hd + i] as f64)
                        .sum();
                    out[(j * nh + h) * hd + i] = acc as f32;
                }
            }
        }
        out
    }

    /// Builds a mixed batch over a shared, shuffled block pool and checks every token, for
    /// every KV dtype: against naive attention over the values the cache holds (widened to
    /// f32), and for f16/int8 also against the original f32 values within their rounding.
    fn check_batch(
        seed: u64,
        nh: usize,
        nkv: usize,
        hd: usize,
        bs: usize,
        shapes: &[(usize, usize)],
        q_scale: f32,
    ) {
        for dtype in KvDtype::ALL {
            check_batch_dtype(dtype, seed, nh, nkv, hd, bs, shapes, q_scale);
        }
    }

    fn check_batch_dtype(
        dtype: KvDtype,
        seed: u64,
        nh: usize,
        nkv: usize,
        hd: usize,
        bs: usize,
        shapes: &[(usize, usize)],
        q_scale: f32,
    ) {
        let mut r = rng(seed);
        let kvw = nkv * hd;
        let total_blocks: usize = shapes
            .iter()
            .map(|(s, l)| (s + l).div_ceil(bs))
            .sum::<usize>()
            + 3;
        let mut pool: Vec<u32> = (0..total_blocks as u32).collect();
        pool.shuffle(&mut r);
        let num_slots = total_blocks * bs;
        let mut k_cache = KvBuffer::new(dtype, num_slots, nkv, hd);
        let mut v_cache = KvBuffer::new(dtype, num_slots, nkv, hd);
        // Garbage in every slot: only the block tables decide what is read.
        let all: Vec<usize> = (0..num_slots).collect();
        write_kv(
            k_cache.view_mut(),
            v_cache.view_mut(),
            &random_vec(&mut r, num_slots * kvw, 9.0),
            &random_vec(&mut r, num_slots * kvw, 9.0),
            &all,
            nkv,
            hd,
        );
        let mut seqs_data = Vec::new();
        for &(start_pos, q_len) in shapes {
            let ctx = start_pos + q_len;
            let blocks: Vec<u32> = (0..ctx.div_ceil(bs)).map(|_| pool.pop().unwrap()).collect();
            let k = random_vec(&mut r, ctx * kvw, 1.0);
            let v = random_vec(&mut r, ctx * kvw, 1.0);
            let slots: Vec<usize> = (0..ctx)
                .map(|p| blocks[p / bs] as usize * bs + p % bs)
                .collect();
            write_kv(k_cache.view_mut(), v_cache.view_mut(), &k, &v, &slots, nkv, hd);
            seqs_data.push(TestSeq {
                k,
                v,
                blocks,
                start_pos,
                q_len,
            });
        }
        let n_tokens: usize = shapes.iter().map(|s| s.1).sum();
        let q = random_vec(&mut r, n_tokens * nh * hd, q_scale);
        let mut q_start = 0;
        let seqs: Vec<AttentionSeq> = seqs_data
            .iter()
            .map(|s| {
                let a = AttentionSeq {
                    q_start,
                    q_len: s.q_len,
                    start_pos: s.start_pos,
                    block_table: &s.blocks,
                };
                q_start += s.q_len;
                a
            })
            .collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![f32::NAN; q.len()];
        paged_attention(
            &q,
            k_cache.view(),
            v_cache.view(),
            &seqs,
            nh,
            nkv,
            hd,
            bs,
            scale,
            &mut out,
        );
        let row = nh * hd;
        for (s, a) in seqs_data.iter().zip(&seqs) {
            let qs = &q[a.q_start * row..(a.q_start + a.q_len) * row];
            let got = &out[a.q_start * row..(a.q_start + a.q_len) * row];
            // What the cache holds, position by position.
            let held = |c: &KvBuffer| -> Vec<f32> {
                (0..s.start_pos + s.q_len)
                    .flat_map(|p| {
                        let slot = s.blocks[p / bs] as usize * bs + p % bs;
                        read_row(c.view(), slot, nkv, hd)
                    })
                    .collect()
            };
            let want = naive(qs, &held(&k_cache), &held(&v_cache), s.start_pos, nh, nkv, hd, scale);
            assert_close(got, &want, 1e-5, 1e-4);
            if q_scale <= 1.0 {
                let exact = naive(qs, &s.k, &s.v, s.start_pos, nh, nkv, hd, scale);
                let atol = match dtype {
                    KvDtype::F32 => 1e-5,
                    KvDtype::F16 => 2e-3,
                    KvDtype::Int8 => 2e-2,
                };
                assert_close(got, &exact, atol, 0.0);
            }
            // The same sequence alone in a batch gives bit-identical output.
            let mut alone = vec![0.0; qs.len()];
            let single = [AttentionSeq { q_start: 0, ..*a }];
            paged_attention(
                qs,
                k_cache.view(),
                v_cache.view(),
                &single,
                nh,
                nkv,
                hd,
                bs,
                scale,
                &mut alone,
            );
            assert_eq!(alone, got, "{dtype}");
        }
    }

    #[test]
    fn single_decode_step() {
        check_batch(40, 9, 3, 64, 16, &[(37, 1)], 1.0);
    }

    #[test]
    fn single_prefill_from_zero() {
        check_batch(41, 4, 4, 8, 4, &[(0, 13)], 1.0);
    }

    #[test]
    fn mixed_batch_of_prefill_chunks_and_decodes() {
        check_batch(
            42,
            9,
            3,
            64,
            16,
            &[(0, 5), (31, 1), (16, 16), (3, 1), (47, 9), (0, 1)],
            1.0,
        );
    }

    #[test]
    fn random_shapes_with_odd_sizes_and_partial_blocks() {
        let mut r = rng(43);
        for case in 0..20 {
            let nkv = r.random_range(1..4);
            let nh = nkv * r.random_range(1..4);
            let hd = r.random_range(1..20);
            let bs = r.random_range(1..9);
            let shapes: Vec<(usize, usize)> = (0..r.random_range(1..5))
                .map(|_| (r.random_range(0..30), r.random_range(1..7)))
                .collect();
            check_batch(1000 + case, nh, nkv, hd, bs, &shapes, 1.0);
        }
    }

    #[test]
    fn head_dim_128_and_odd_group_sizes() {
        // 128 takes the other compile-time head size; 8 / 2 gives groups of 4.
        check_batch(45, 8, 2, 128, 16, &[(0, 3), (40, 1), (17, 2)], 1.0);
        check_batch(46, 5, 5, 128, 3, &[(9, 4)], 1.0);
    }

    #[test]
    fn huge_logits_stay_finite() {
        check_batch(44, 2, 1, 16, 4, &[(20, 3)], 1000.0);
    }

    #[test]
    fn tokens_outside_every_sequence_are_zeroed() {
        let (nh, hd, bs) = (1, 2, 2);
        let kc = vec![1.0; 4 * hd];
        let vc = vec![2.0; 4 * hd];
        let blocks = [1u32];
        let seqs = [AttentionSeq {
            q_start: 1,
            q_len: 1,
            start_pos: 0,
            block_table: &blocks,
        }];
        let mut out = vec![f32::NAN; 2 * nh * hd];
        paged_attention(&[1.0; 4], &kc, &vc, &seqs, nh, 1, hd, bs, 1.0, &mut out);
        assert_eq!(out, vec![0.0, 0.0, 2.0, 2.0]);
    }

    #[test]
    #[should_panic(expected = "too short")]
    fn rejects_short_block_table() {
        let blocks = [0u32];
        let seqs = [AttentionSeq {
            q_start: 0,
            q_len: 1,
            start_pos: 4,
            block_table: &blocks,
        }];
        let mut out = vec![0.0; 2];
        paged_attention(
            &[0.0; 2], &[0.0f32; 16][..], &[0.0f32; 16][..], &seqs, 1, 1, 2, 4, 1.0, &mut out,
        );
    }

    #[test]
    #[should_panic(expected = "overlap")]
    fn rejects_overlapping_sequences() {
        let blocks = [0u32];
        let seqs = [
            AttentionSeq {
                q_start: 0,
                q_len: 2,
                start_pos: 0,
                block_table: &blocks,
            },
            AttentionSeq {
                q_start: 1,
                q_len: 1,
                start_pos: 0,
                block_table: &blocks,
            },
        ];
        let mut out = vec![0.0; 4];
        paged_attention(
            &[0.0; 4], &[0.0f32; 8][..], &[0.0f32; 8][..], &seqs, 1, 1, 2, 4, 1.0, &mut out,
        );
    }

    #[test]
    #[should_panic(expected = "K cache is f16 but V cache is int8")]
    fn rejects_mixed_dtypes() {
        let blocks = [0u32];
        let seqs = [AttentionSeq {
            q_start: 0,
            q_len: 1,
            start_pos: 0,
            block_table: &blocks,
        }];
        let k = KvBuffer::new(KvDtype::F16, 4, 1, 2);
        let v = KvBuffer::new(KvDtype::Int8, 4, 1, 2);
        let mut out = vec![0.0; 2];
        paged_attention(&[0.0; 2], k.view(), v.view(), &seqs, 1, 1, 2, 4, 1.0, &mut out);
    }
}
