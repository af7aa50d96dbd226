//! GPU kernel time against the memory-bandwidth limit (`--features cuda`, needs a GPU):
//! `cargo run -p tidal-kernels --release --features cuda --example cuda_bench`.
//!
//! Each kernel is timed with CUDA events over repeated launches (median of 5 rounds); its
//! bytes are what it must read and write at least once. The ceiling is the device-to-device
//! copy bandwidth measured in the same run (read + write), printed beside the datasheet's.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use tidal_kernels::cuda::{AttentionBatch, Gpu, GpuKvBuffer, GpuMatrix};
use tidal_kernels::{KvDtype, QuantType};

const ROUNDS: usize = 5;

fn time_ms(gpu: &Arc<Gpu>, iters: usize, mut f: impl FnMut()) -> f64 {
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            f(); // warm-up
            let start = gpu.stream().record_event(flags).unwrap();
            for _ in 0..iters {
                f();
            }
            let end = gpu.stream().record_event(flags).unwrap();
            end.synchronize().unwrap();
            start.elapsed_ms(&end).unwrap() as f64 / iters as f64
        })
        .collect();
    rounds.sort_by(|a, b| a.total_cmp(b));
    rounds[ROUNDS / 2]
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// Random quantised blocks with small f16 scales (random bytes there could be NaN).
fn blocks(ty: QuantType, rows: usize, cols: usize) -> Vec<u8> {
    let mut b = random_bytes(rows * ty.row_bytes(cols), 1);
    for block in b.chunks_mut(ty.block_bytes()) {
        block[..2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
        if ty == QuantType::Q4_1 {
            block[2..4].copy_from_slice(&half::f16::from_f32(-0.05).to_bits().to_le_bytes());
        }
    }
    b
}

fn report(name: &str, bytes: f64, ms: f64, ceiling_gbs: f64) {
    let gbs = bytes / ms / 1e6;
    println!(
        "{name:<52} {ms:>9.4} ms {gbs:>8.0} GB/s  {:>5.1}% of copy",
        100.0 * gbs / ceiling_gbs
    );
}

fn main() {
    let gpu = Gpu::new(0).expect("a GPU");
    let (free, total) = gpu.memory_info().unwrap();
    println!(
        "{} (sm_{}{}), {} / {} MiB free",
        gpu.name(),
        gpu.capability().0,
        gpu.capability().1,
        free >> 20,
        total >> 20
    );

    // Ceiling: a 2 GiB device-to-device copy.
    let n = 1usize << 29;
    let src = gpu.zeros::<f32>(n).unwrap();
    let mut dst = gpu.zeros::<f32>(n).unwrap();
    let copy_ms = time_ms(&gpu, 10, || {
        gpu.stream().memcpy_dtod(&src, &mut dst).unwrap()
    });
    let copy_gbs = 2.0 * (n * 4) as f64 / copy_ms / 1e6;
    println!("device copy (read + write)                            {copy_ms:>9.4} ms {copy_gbs:>8.0} GB/s  (datasheet 4800)");
    drop((src, dst));

    // Matmuls: decode (1 row), a batch of 16 and a prefill chunk of 256, on an 8B-class FFN
    // matrix and on SmolLM2-135M's.
    for (rows, cols, label) in [(14336, 4096, "8B ffn_up"), (1536, 576, "SmolLM2 ffn_up")] {
        for ty in QuantType::ALL {
            let w = GpuMatrix::from_blocks(&gpu, ty, &blocks(ty, rows, cols), rows, cols).unwrap();
            for m in [1usize, 16, 256] {
                let x = gpu.zeros::<f32>(m * cols).unwrap();
                let mut y = gpu.zeros::<f32>(m * rows).unwrap();
                let ms = time_ms(&gpu, 50, || gpu.matmul(&w, &x, m, &mut y).unwrap());
                let bytes = (w.bytes() + 4 * m * (cols + rows)) as f64;
                report(
                    &format!("matmul {ty:?} {label} [{rows}x{cols}] m={m}"),
                    bytes,
                    ms,
                    copy_gbs,
                );
            }
        }
    }

    // Decode attention: 64 sequences of 2048 tokens, 32 heads / 8 KV heads of 128.
    let (seqs, ctx, nh, nkv, hd, bs) = (64usize, 2048usize, 32usize, 8usize, 128usize, 16usize);
    let blocks_per_seq = ctx / bs;
    let slots = seqs * ctx;
    let tables: Vec<Vec<u32>> = (0..seqs)
        .map(|s| ((s * blocks_per_seq) as u32..((s + 1) * blocks_per_seq) as u32).collect())
        .collect();
    let refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
    let positions: Vec<usize> = vec![ctx - 1; seqs];
    let token_seq: Vec<usize> = (0..seqs).collect();
    let batch = AttentionBatch::new(&gpu, &positions, &token_seq, &refs, bs).unwrap();
    let q = gpu.zeros::<f32>(seqs * nh * hd).unwrap();
    let mut out = gpu.zeros::<f32>(seqs * nh * hd).unwrap();
    for dtype in KvDtype::ALL {
        let k = GpuKvBuffer::new(&gpu, dtype, slots, nkv, hd).unwrap();
        let v = GpuKvBuffer::new(&gpu, dtype, slots, nkv, hd).unwrap();
        let ms = time_ms(&gpu, 20, || {
            gpu.paged_attention(&q, &k, &v, &batch, nh, nkv, hd, bs, 0.088, None, &mut out)
                .unwrap()
        });
        let bytes = (k.memory_bytes() + v.memory_bytes()) as f64;
        report(
            &format!("attention {dtype} decode 64 seqs x 2048 (32/8 heads, 128)"),
            bytes,
            ms,
            copy_gbs,
        );
    }
}
