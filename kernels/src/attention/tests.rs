//! Paged attention against naive attention on random shapes, for every KV dtype.

#![allow(clippy::too_many_arguments)]

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

/// Naive causal GQA attention in f64 over contiguous K/V of one sequence; with a window, a
/// query at `p` sees only keys `k` with `p - k < window`.
fn naive(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    start_pos: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    let q_len = q.len() / (nh * hd);
    let mut out = vec![0.0; q.len()];
    for j in 0..q_len {
        for h in 0..nh {
            let kvh = h / (nh / nkv);
            let qv = &q[(j * nh + h) * hd..][..hd];
            let ctx = start_pos + j + 1;
            let seen = |p: usize| window.is_none_or(|w| ctx - 1 - p < w);
            let s: Vec<f64> = (0..ctx)
                .map(|p| {
                    if !seen(p) {
                        return f64::NEG_INFINITY;
                    }
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
        check_batch_dtype(dtype, seed, nh, nkv, hd, bs, shapes, q_scale, None);
    }
}

/// [`check_batch`] with a sliding window.
fn check_windowed(
    seed: u64,
    nh: usize,
    nkv: usize,
    hd: usize,
    bs: usize,
    shapes: &[(usize, usize)],
    window: usize,
) {
    for dtype in KvDtype::ALL {
        check_batch_dtype(dtype, seed, nh, nkv, hd, bs, shapes, 1.0, Some(window));
    }
}

/// The dispatched attention call, with or without a window.
fn dispatched(
    q: &[f32],
    k: KvCache<'_>,
    v: KvCache<'_>,
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
    paged_attention_windowed(
        q, k, v, seqs, n_heads, n_kv_heads, head_dim, block_size, scale, window, out,
    );
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
    window: Option<usize>,
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
        write_kv(
            k_cache.view_mut(),
            v_cache.view_mut(),
            &k,
            &v,
            &slots,
            nkv,
            hd,
        );
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
    let shape = Shape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        block_size: bs,
        scale,
        window,
    };
    let mut out = vec![f32::NAN; q.len()];
    dispatched(&q, k_cache.view(), v_cache.view(), &seqs, shape, &mut out);
    // Every narrower build agrees with the dispatched one (the widest this CPU has).
    let levels = [Simd::Portable, Simd::Avx2, Simd::Avx512];
    for &level in levels.iter().filter(|&&l| l < Simd::detect()) {
        let mut narrower = vec![f32::NAN; q.len()];
        attention(
            level,
            &q,
            k_cache.view(),
            v_cache.view(),
            &seqs,
            shape,
            &mut narrower,
        );
        assert_close(&narrower, &out, 1e-5, 1e-4);
    }
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
        let want = naive(
            qs,
            &held(&k_cache),
            &held(&v_cache),
            s.start_pos,
            nh,
            nkv,
            hd,
            scale,
            window,
        );
        assert_close(got, &want, 1e-5, 1e-4);
        if q_scale <= 1.0 {
            let exact = naive(qs, &s.k, &s.v, s.start_pos, nh, nkv, hd, scale, window);
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
        dispatched(
            qs,
            k_cache.view(),
            v_cache.view(),
            &single,
            shape,
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
fn sliding_window_sees_only_the_last_positions() {
    // Windows shorter than, equal to and longer than a block; prefill chunks that start
    // before and after the window's edge, and decodes far past it (whole blocks skipped).
    check_windowed(47, 4, 1, 256, 16, &[(0, 40), (600, 1), (30, 9)], 32);
    check_windowed(48, 9, 3, 64, 16, &[(0, 20), (47, 1), (5, 12)], 16);
    check_windowed(49, 8, 2, 128, 4, &[(13, 7), (90, 1)], 5);
    check_windowed(50, 3, 1, 12, 3, &[(0, 9), (4, 2), (40, 1)], 1);
    // A window wider than every context is full causal attention.
    check_windowed(51, 4, 2, 16, 4, &[(0, 6), (9, 1)], 1000);
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
        &[0.0; 2],
        &[0.0f32; 16][..],
        &[0.0f32; 16][..],
        &seqs,
        1,
        1,
        2,
        4,
        1.0,
        &mut out,
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
        &[0.0; 4],
        &[0.0f32; 8][..],
        &[0.0f32; 8][..],
        &seqs,
        1,
        1,
        2,
        4,
        1.0,
        &mut out,
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
    paged_attention(
        &[0.0; 2],
        k.view(),
        v.view(),
        &seqs,
        1,
        1,
        2,
        4,
        1.0,
        &mut out,
    );
}
