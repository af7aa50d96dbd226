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
                    b.iter(|| {
                        matmul_q4_1_with(kernel, black_box(&x), black_box(&w), m, k, n, &mut out)
                    })
                });
            }
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

criterion_group!(benches, bench);
criterion_main!(benches);
