//! Paged attention decode steps with SmolLM2-135M's heads (9 query, 3 KV, head dim 64) over a
//! shuffled block pool of 16-token blocks: one sequence and a batch of eight, at two context
//! lengths, for each KV cache dtype (f32, f16, int8).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use tidal_kernels::{paged_attention, write_kv, AttentionSeq, KvBuffer, KvDtype};

const N_HEADS: usize = 9;
const N_KV: usize = 3;
const HEAD_DIM: usize = 64;
const BLOCK: usize = 16;

fn bench(c: &mut Criterion) {
    let threads = rayon::ThreadPoolBuilder::new().build().expect("rayon pool");
    let mut r = StdRng::seed_from_u64(2);
    let mut group = c.benchmark_group("paged_attention_decode");
    for &batch in &[1usize, 8] {
        for &ctx in &[256usize, 1024] {
            let blocks_per_seq = ctx.div_ceil(BLOCK);
            let total_blocks = batch * blocks_per_seq;
            let mut pool: Vec<u32> = (0..total_blocks as u32).collect();
            pool.shuffle(&mut r);
            let tables: Vec<Vec<u32>> = pool.chunks(blocks_per_seq).map(|c| c.to_vec()).collect();
            let slots = total_blocks * BLOCK;
            let all: Vec<usize> = (0..slots).collect();
            let k: Vec<f32> = (0..slots * N_KV * HEAD_DIM)
                .map(|_| r.random_range(-1.0..1.0))
                .collect();
            let v: Vec<f32> = (0..slots * N_KV * HEAD_DIM)
                .map(|_| r.random_range(-1.0..1.0))
                .collect();
            let q: Vec<f32> = (0..batch * N_HEADS * HEAD_DIM)
                .map(|_| r.random_range(-1.0..1.0))
                .collect();
            let seqs: Vec<AttentionSeq> = tables
                .iter()
                .enumerate()
                .map(|(i, t)| AttentionSeq {
                    q_start: i,
                    q_len: 1,
                    start_pos: ctx - 1,
                    block_table: t,
                })
                .collect();
            let mut out = vec![0.0f32; q.len()];
            let scale = 1.0 / (HEAD_DIM as f32).sqrt();
            for dtype in KvDtype::ALL {
                let mut k_cache = KvBuffer::new(dtype, slots, N_KV, HEAD_DIM);
                let mut v_cache = KvBuffer::new(dtype, slots, N_KV, HEAD_DIM);
                write_kv(
                    k_cache.view_mut(),
                    v_cache.view_mut(),
                    &k,
                    &v,
                    &all,
                    N_KV,
                    HEAD_DIM,
                );
                group.bench_function(
                    BenchmarkId::new(format!("{dtype}_batch{batch}"), format!("ctx{ctx}")),
                    |b| {
                        b.iter_custom(|iters| {
                            in_pool(&threads, iters, || {
                                paged_attention(
                                    black_box(&q),
                                    k_cache.view(),
                                    v_cache.view(),
                                    &seqs,
                                    N_HEADS,
                                    N_KV,
                                    HEAD_DIM,
                                    BLOCK,
                                    scale,
                                    &mut out,
                                )
                            })
                        })
                    },
                );
            }
        }
    }
    group.finish();
}

/// Times `iters` calls of `f` on a rayon worker thread, as the forward pass runs them (inside
/// `ThreadPool::install`); called from outside the pool, every kernel call would also pay a
/// cross-thread hand-off that is not the kernel's cost.
fn in_pool(
    pool: &rayon::ThreadPool,
    iters: u64,
    mut f: impl FnMut() + Send,
) -> std::time::Duration {
    pool.install(move || {
        let start = std::time::Instant::now();
        for _ in 0..iters {
            f();
        }
        start.elapsed()
    })
}

criterion_group!(benches, bench);
criterion_main!(benches);
