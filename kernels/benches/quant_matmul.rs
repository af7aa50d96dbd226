//! Quantised matmuls, ours against candle's `k_quants::matmul`, for every format we run:
//! the 32-weight formats (Q4_0, Q4_1, Q5_0, Q8_0) on the SmolLM2-135M shapes (k → n: attention q/o 576→576, FFN gate/up
//! 576→1536, down 1536→576, and the Q8_0 LM head 576→49152), for decode (m = 1) and a batch
//! of 16 rows (m = 16, as 16 concurrent decodes). Ours runs as `avx2` (row dot products at
//! m = 1, the panel GEMM at m = 16), `avx2vnni` (the GEMM with AVX-VNNI, where the CPU has it),
//! `avx512vnni` (the 16-row GEMM with AVX-512 VNNI, where the CPU has it) and `avx2rows` (row
//! dot products at every m, the batched path before the GEMM). The K-quants (and Q8_0 beside
//! them) run on the Gemma 3 270M shapes of its K-quant matrices (attention output 1024→640,
//! FFN down 2048→640). One run holds every figure, so ratios are comparable on a noisy
//! machine.

use candle_core::quantized::k_quants::{
    self, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ6K,
    BlockQ8_0, GgmlType,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use tidal_kernels::{matmul_with, DotKernel, QuantType};

/// `n_blocks` random blocks of `ty` with scales like real weights.
fn random_blocks(r: &mut StdRng, ty: QuantType, n_blocks: usize) -> Vec<u8> {
    let mut w = Vec::with_capacity(n_blocks * ty.block_bytes());
    for _ in 0..n_blocks {
        let d: f32 = r.random_range(0.001..0.05);
        let start = w.len();
        w.extend((0..ty.block_bytes()).map(|_| r.random::<u8>()));
        // Where the format keeps its f16 scale (the rest stays random bits).
        let (d_at, _) = ty.f16_fields();
        w[start + d_at..start + d_at + 2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        if ty == QuantType::Q4_1 {
            w[start + 2..start + 4].copy_from_slice(&half::f16::from_f32(-8.0 * d).to_le_bytes());
        }
    }
    w
}

/// The same bytes as candle blocks.
fn candle_blocks<T: GgmlType>(w: &[u8]) -> Vec<T> {
    let n = w.len() / std::mem::size_of::<T>();
    assert_eq!(n * std::mem::size_of::<T>(), w.len());
    let mut blocks = vec![T::zeros(); n];
    // SAFETY: candle's blocks are #[repr(C)] structs of f16/u8/i8 in the ggml layout (size
    // checked above); any bit pattern is a valid value.
    unsafe { std::ptr::copy_nonoverlapping(w.as_ptr(), blocks.as_mut_ptr() as *mut u8, w.len()) };
    blocks
}

/// A matmul `(m, k, n), x, out` over weights it holds.
type Matmul = Box<dyn Fn((usize, usize, usize), &[f32], &mut [f32])>;

/// candle's matmul of `ty` on `w`, as a closure over the converted blocks.
fn candle_matmul(ty: QuantType, w: &[u8]) -> Matmul {
    fn boxed<T: GgmlType + 'static>(w: &[u8]) -> Matmul {
        let blocks = candle_blocks::<T>(w);
        Box::new(move |mkn, x, out| k_quants::matmul(mkn, x, &blocks, out).unwrap())
    }
    match ty {
        QuantType::Q4_0 => boxed::<BlockQ4_0>(w),
        QuantType::Q4_1 => boxed::<BlockQ4_1>(w),
        QuantType::Q5_0 => boxed::<BlockQ5_0>(w),
        QuantType::Q8_0 => boxed::<BlockQ8_0>(w),
        QuantType::Q4_K => boxed::<BlockQ4K>(w),
        QuantType::Q5_K => boxed::<BlockQ5K>(w),
        QuantType::Q6_K => boxed::<BlockQ6K>(w),
        QuantType::Q3_K => boxed::<BlockQ3K>(w),
        QuantType::Q2_K => boxed::<BlockQ2K>(w),
    }
}

fn bench(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new().build().expect("rayon pool");
    let mut r = StdRng::seed_from_u64(1);
    let mut group = c.benchmark_group("quant_matmul");
    let cases = QuantType::BLOCK32.into_iter().flat_map(|ty| {
        let mut shapes = vec![(576, 576), (576, 1536), (1536, 576)];
        if ty == QuantType::Q8_0 {
            // The LM heads of SmolLM2 and Gemma 3 (178 MB: most of Gemma 3's decode step).
            shapes.extend([(576, 49152), (640, 262144)]);
        }
        shapes
            .into_iter()
            .map(move |s| (ty, s, &[1usize, 16, 128][..]))
    });
    // Four and eight rows too: both sides of the K-quant GEMM's smallest batch (`KPANEL16_MIN_ROWS`).
    let k_cases = [QuantType::Q8_0]
        .into_iter()
        .chain(QuantType::K_QUANTS)
        .flat_map(|ty| [(1024, 640), (2048, 640)].map(|s| (ty, s, &[1usize, 4, 8, 16, 128][..])));
    for (ty, (k, n), ms) in cases.chain(k_cases) {
        let w = random_blocks(&mut r, ty, n * k / ty.block_elems());
        let theirs = candle_matmul(ty, &w);
        // Decode alone, a decode batch, a prefill chunk.
        for &m in ms {
            let x: Vec<f32> = (0..m * k).map(|_| r.random_range(-2.0..2.0)).collect();
            let mut out = vec![0.0f32; m * n];
            let shape = format!("{ty:?}_m{m}_k{k}_n{n}").to_lowercase();
            group.throughput(Throughput::Bytes(w.len() as u64));
            let kernels: &[DotKernel] = if m == 1 {
                &[DotKernel::Avx512Vnni, DotKernel::Avx2]
            } else {
                &[
                    DotKernel::Amx,
                    DotKernel::Avx512Vnni,
                    DotKernel::Avx2Vnni,
                    DotKernel::Avx2,
                    DotKernel::Avx2Rows,
                ]
            };
            for &kernel in kernels.iter().filter(|k| k.is_supported()) {
                let name = format!("tidal_{kernel:?}").to_lowercase();
                group.bench_function(BenchmarkId::new(name, &shape), |b| {
                    b.iter_custom(|iters| {
                        in_pool(&pool, iters, || {
                            matmul_with(kernel, ty, black_box(&x), &w, m, k, n, &mut out)
                        })
                    })
                });
            }
            // candle runs on its own thread pool, so it is called from the bench thread.
            group.bench_function(BenchmarkId::new("candle", &shape), |b| {
                b.iter(|| theirs((m, k, n), black_box(&x), &mut out))
            });
        }
    }
    group.finish();
}

/// The weight matmuls of one SmolLM2-135M decode step in each format: 30 layers of q, k, v,
/// o, gate, up, down (66 MB of weights in Q4_1, more than the L3 cache, so they stream from
/// DRAM on most machines, as in the real model). The LM head and attention are not included.
/// At m = 1 to 12 (decode, small batches and the verify steps of speculative decoding)
/// `/avx512vnni`, `/avx2vnni` and `/avx2` as `auto` would run them (the row kernels; from
/// `PANEL16_MIN_ROWS` rows the GEMMs); at m = 16 each batched GEMM this CPU has (`/amx`,
/// `/avx512vnni`, `/avx2vnni`); the detected kernel where the CPU has none of them.
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
    for ty in QuantType::BLOCK32 {
        let layers: Vec<Vec<Vec<u8>>> = (0..30)
            .map(|_| {
                shapes
                    .iter()
                    .map(|&(k, n)| random_blocks(&mut r, ty, n * k / ty.block_elems()))
                    .collect()
            })
            .collect();
        for m in [1usize, 2, 3, 4, 5, 6, 9, 12, 16] {
            let x: Vec<f32> = (0..m * 1536).map(|_| r.random_range(-2.0..2.0)).collect();
            let mut out = vec![0.0f32; m * 1536];
            // Below 16 rows AMX runs the AVX-512 kernels, so it is not listed there.
            let candidates: &[DotKernel] = if m < 16 {
                &[DotKernel::Avx512Vnni, DotKernel::Avx2Vnni, DotKernel::Avx2]
            } else {
                &[DotKernel::Amx, DotKernel::Avx512Vnni, DotKernel::Avx2Vnni]
            };
            let mut kernels: Vec<DotKernel> = candidates
                .iter()
                .copied()
                .filter(|k| k.is_supported())
                .collect();
            if kernels.is_empty() {
                kernels = vec![DotKernel::detect()];
            }
            for kernel in kernels {
                let name = format!("{ty:?}_step_30_layers_m{m}/{kernel:?}").to_lowercase();
                c.bench_function(&name, |b| {
                    b.iter_custom(|iters| {
                        in_pool(&pool, iters, || {
                            for layer in &layers {
                                for (w, &(k, n)) in layer.iter().zip(&shapes) {
                                    let x = black_box(&x[..m * k]);
                                    matmul_with(kernel, ty, x, w, m, k, n, &mut out[..m * n]);
                                }
                            }
                        })
                    })
                });
            }
        }
    }
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
