//! Q4_K as stored against Q4_K repacked into groups of sixteen rows (`repack_q4_k_x16`), both
//! on the AVX-512 VNNI kernel (`auto` on such a CPU; the bench exits early elsewhere), on the
//! Llama 3.2 1B shape's Q4_K matrices (q, k, o, gate, up; k = 2,048):
//! - `q4_k_x16_l2_*`: one 2048→512 matrix (0.6 MB, in L2), one row;
//! - `q4_k_x16_4_layers_*`: the Q4_K matrices of four layers (97 MB, streaming from memory),
//!   one row, as a decode step reads them;
//! - `q4_k_x16_m{m}_*`: one 2048→2048 matrix for batches of 4 to 128 rows (the stored
//!   layout's AVX2 rows up to 4, its K-quant GEMM above; the repacked layout's sixteen-row
//!   kernel in passes of four).
//!
//! Each runs on one and on two threads; both layouts sit in huge pages, as the runtime's
//! weights do.

use criterion::{criterion_group, criterion_main, Criterion};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Instant;
use tidal_kernels::{
    matmul_q4_k_x16, matmul_quantized, repack_q4_k_x16, DotKernel, QuantType, QuantizedActivations,
};

/// `blocks` random Q4_K super-blocks with scales like real weights.
fn random_q4_k(r: &mut StdRng, blocks: usize) -> Vec<u8> {
    let mut w = vec![0u8; blocks * 144];
    r.fill(&mut w[..]);
    for b in w.chunks_exact_mut(144) {
        b[0..2].copy_from_slice(&half::f16::from_f32(r.random_range(0.001..0.05)).to_le_bytes());
        b[2..4].copy_from_slice(&half::f16::from_f32(r.random_range(0.001..0.05)).to_le_bytes());
    }
    w
}

/// `bytes` copied into anonymous memory with the huge-page hint (as the runtime maps weight
/// files and repacked matrices): streaming 4 KiB pages costs a TLB miss per page.
fn huge(bytes: Vec<u8>) -> HugeBuf {
    let len = bytes.len().max(1);
    // SAFETY: a fresh private anonymous mapping of `len` bytes, checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "mmap");
    // SAFETY: the mapping just made; a refused hint leaves 4 KiB pages.
    unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) };
    // SAFETY: `len` writable bytes at `ptr`, no other reference to them.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.cast(), bytes.len()) };
    HugeBuf {
        ptr: ptr.cast(),
        len: bytes.len(),
    }
}

/// A buffer from [`huge`].
struct HugeBuf {
    ptr: *mut u8,
    len: usize,
}

impl std::ops::Deref for HugeBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes, mapped until drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

// SAFETY: read-only after construction.
unsafe impl Sync for HugeBuf {}
// SAFETY: as above.
unsafe impl Send for HugeBuf {}

/// A case's name, its matrices' `(k, n)` and its activation rows.
type Case = (String, Vec<(usize, usize)>, usize);

fn bench(c: &mut Criterion) {
    let kernel = DotKernel::Avx512Vnni;
    if !kernel.is_supported() {
        eprintln!("q4_k_x16: no AVX-512 VNNI on this CPU, nothing to compare");
        return;
    }
    let mut r = StdRng::seed_from_u64(1);
    let layer = [
        (2048, 2048),
        (2048, 512),
        (2048, 2048),
        (2048, 8192),
        (2048, 8192),
    ];
    let mut cases: Vec<Case> = vec![
        ("l2_m1".into(), vec![(2048, 512)], 1),
        (
            "4_layers_m1".into(),
            layer.iter().cycle().take(20).copied().collect(),
            1,
        ),
    ];
    for m in [4, 8, 9, 16, 128] {
        cases.push((format!("m{m}"), vec![(2048, 2048)], m));
    }
    for (name, shapes, m) in &cases {
        let stored: Vec<HugeBuf> = shapes
            .iter()
            .map(|&(k, n)| huge(random_q4_k(&mut r, n * k / 256)))
            .collect();
        let packed: Vec<HugeBuf> = stored
            .iter()
            .zip(shapes)
            .map(|(w, &(k, n))| huge(repack_q4_k_x16(w, n, k / 256)))
            .collect();
        let x: Vec<f32> = (0..m * 2048).map(|_| r.random_range(-2.0..2.0)).collect();
        let mut out = vec![0f32; m * 8192];
        for threads in [1usize, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("rayon pool");
            for (layout, mats) in [("stored", &stored), ("x16", &packed)] {
                c.bench_function(&format!("q4_k_x16_{name}_t{threads}/{layout}"), |b| {
                    // Timed on a pool thread, as the forward pass calls the kernels.
                    b.iter_custom(|iters| {
                        pool.install(|| {
                            let start = Instant::now();
                            for _ in 0..iters {
                                for (w, &(k, n)) in mats.iter().zip(shapes) {
                                    let xq = QuantizedActivations::new(black_box(&x), *m, k);
                                    let o = &mut out[..m * n];
                                    if layout == "x16" {
                                        matmul_q4_k_x16(kernel, &xq, w, n, o);
                                    } else {
                                        matmul_quantized(kernel, QuantType::Q4_K, &xq, w, n, o);
                                    }
                                }
                            }
                            start.elapsed()
                        })
                    })
                });
            }
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
