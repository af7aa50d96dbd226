//! Q4_1 matmul: ours (AVX2 and portable) against candle's `k_quants::matmul::<BlockQ4_1>` on
//! the SmolLM2-135M shapes (k → n: attention q/o 576→576, k/v 576→192, FFN gate/up 576→1536,
//! down 1536→576), for decode (m = 1) and a batch (m = 16).

use candle_core::quantized::k_quants::{self, BlockQ4_1, GgmlType};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use tidal_kernels::{matmul_q4_1_with, DotKernel, Q4_1_BLOCK_BYTES, QK};

fn random_q4_1(r: &mut StdRng, n_blocks: usize) -> Vec<u8> {
    let mut w = Vec::with_capacity(n_blocks * Q4_1_BLOCK_BYTES);
    for _ in 0..n_blocks {
        let d: f32 = r.random_range(0.001..0.05);
        w.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        w.extend_from_slice(&half::f16::from_f32(-8.0 * d).to_le_bytes());
        w.extend((0..16).map(|_| r.random::<u8>()));
    }
    w
}

fn bench(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new().build().expect("rayon pool");
    let mut r = StdRng::seed_from_u64(1);
    let mut group = c.benchmark_group("q4_1_matmul");
    for &(k, n) in &[(576, 576), (576, 192), (576, 1536), (1536, 576)] {
        let w = random_q4_1(&mut r, n * k / QK);
        let mut blocks = vec![BlockQ4_1::zeros(); n * k / QK];
        assert_eq!(std::mem::size_of::<BlockQ4_1>(), Q4_1_BLOCK_BYTES);
        // SAFETY: BlockQ4_1 is #[repr(C)] {f16, f16, [u8; 16]}, the ggml layout of these bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(w.as_ptr(), blocks.as_mut_ptr() as *mut u8, w.len())
        };
        for &m in &[1usize, 16] {
            let x: Vec<f32> = (0..m * k).map(|_| r.random_range(-2.0..2.0)).collect();
            let mut out = vec![0.0f32; m * n];
            let shape = format!("m{m}_k{k}_n{n}");
            group.throughput(Throughput::Bytes(w.len() as u64));
            for kernel in [DotKernel::Avx2, DotKernel::Portable] {
                if !kernel.is_supported() {
                    continue;
                }
                let name = format!("tidal_{kernel:?}").to_lowercase();
                group.bench_function(BenchmarkId::new(name, &shape), |b| {
                    b.iter_custom(|iters| {
                        in_pool(&pool, iters, || {
                            matmul_q4_1_with(
                                kernel,
                                black_box(&x),
                                black_box(&w),
                                m,
                                k,
                                n,
                                &mut out,
                            )
                        })
                    })
                });
            }
            // candle runs on its own thread pool, so it is called from the bench thread.
            group.bench_function(BenchmarkId::new("candle", &shape), |b| {
                b.iter(|| {
                    k_quants::matmul((m, k, n), black_box(&x), black_box(&blocks), &mut out)
                        .unwrap()
                })
            });
        }
    }
    group.finish();
}

/// The Q4_1 matmuls of one SmolLM2-135M decode step: 30 layers of q, k, v, o, gate, up, down
/// (66 MB of weights, more than the L3 cache, so they stream from DRAM as in the real model).
/// The embedding/LM head (Q8_0) and attention are not included.
fn decode_step(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new().build().expect("rayon pool");
    let mut r = StdRng::seed_from_u64(3);
    let shapes = [
        (576, 576),
        (576, 192),
        (576, 192),
        (576, 576),
        (576, 1536),
        (576, 1536),
        (1536, 576),
    ];
    let layers: Vec<Vec<Vec<u8>>> = (0..30)
        .map(|_| {
            shapes
                .iter()
                .map(|&(k, n)| random_q4_1(&mut r, n * k / QK))
                .collect()
        })
        .collect();
    let x: Vec<f32> = (0..1536).map(|_| r.random_range(-2.0..2.0)).collect();
    let mut out = vec![0.0f32; 1536];
    let kernel = DotKernel::detect();
    c.bench_function("q4_1_decode_step_30_layers", |b| {
        b.iter_custom(|iters| {
            in_pool(&pool, iters, || {
                for layer in &layers {
                    for (w, &(k, n)) in layer.iter().zip(&shapes) {
                        matmul_q4_1_with(kernel, black_box(&x[..k]), w, 1, k, n, &mut out[..n]);
                    }
                }
            })
        })
    });
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

criterion_group!(benches, bench, decode_step);
criterion_main!(benches);
