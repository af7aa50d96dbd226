//! Every CUDA kernel against its CPU oracle on random inputs, odd sizes and partially filled
//! blocks included. The GPU tests pass with a message when no GPU is present; the NVRTC test
//! needs only `libnvrtc`.

use std::sync::{Arc, OnceLock};

use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::test_util::{assert_close, random_vec, rng};
use crate::{KvBuffer, KvDtype, QuantType, Rope, RopeStyle};

/// The GPU shared by the tests, or `None` (with a message) when there is none.
fn gpu() -> Option<Arc<Gpu>> {
    static GPU: OnceLock<Option<Arc<Gpu>>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("skipping CUDA kernel tests: no usable GPU ({e})");
            None
        }
    })
    .clone()
}

macro_rules! require_gpu {
    () => {
        match gpu() {
            Some(g) => g,
            None => {
                crate::test_util::skip("no usable GPU");
                return;
            }
        }
    };
}

#[test]
fn kernel_source_compiles_with_nvrtc() {
    if !nvrtc_available() {
        crate::test_util::skip("libnvrtc is not on the library path (scripts/nvrtc.sh fetches it)");
        return;
    }
    for arch in ["compute_75", "compute_80", "compute_90"] {
        if let Err(e) = compile_kernels(Some(arch)) {
            panic!("{arch}: {e}");
        }
    }
}

#[test]
fn rms_norm_matches_cpu() {
    let gpu = require_gpu!();
    let mut r = rng(1);
    for (rows, d) in [(1, 1), (3, 7), (2, 64), (5, 576), (1, 1000)] {
        let x = random_vec(&mut r, rows * d, 3.0);
        let w = random_vec(&mut r, d, 1.0);
        let mut expected = vec![0.0; rows * d];
        crate::rms_norm(&x, &w, 1e-5, &mut expected);
        let (xd, wd) = (gpu.upload(&x).unwrap(), gpu.upload(&w).unwrap());
        let mut out = gpu.zeros::<f32>(rows * d).unwrap();
        gpu.rms_norm(&xd, &wd, 1e-5, rows, &mut out).unwrap();
        assert_close(&gpu.download(&out).unwrap(), &expected, 1e-5, 1e-4);
        // In place, as Gemma 3's per-head Q/K norms run it.
        let mut in_place = x.clone();
        crate::rms_norm_in_place(&mut in_place, &w, 1e-5);
        let mut xd = gpu.upload(&x).unwrap();
        gpu.rms_norm_in_place(&mut xd, &wd, 1e-5, rows).unwrap();
        assert_close(&gpu.download(&xd).unwrap(), &in_place, 1e-5, 1e-4);
    }
    let mut too_short = gpu.zeros::<f32>(3).unwrap();
    let w4 = gpu.upload(&[1.0f32; 4]).unwrap();
    assert!(gpu.rms_norm_in_place(&mut too_short, &w4, 1e-5, 1).is_err());
}

#[test]
fn elementwise_kernels_match_cpu() {
    let gpu = require_gpu!();
    let mut r = rng(2);
    for n in [1, 31, 256, 257, 10_001] {
        let gate = random_vec(&mut r, n, 8.0);
        let up = random_vec(&mut r, n, 2.0);
        let mut expected = gate.clone();
        crate::silu_mul(&mut expected, &up);
        let mut g = gpu.upload(&gate).unwrap();
        let u = gpu.upload(&up).unwrap();
        gpu.silu_mul(&mut g, &u, n).unwrap();
        assert_close(&gpu.download(&g).unwrap(), &expected, 1e-6, 1e-5);

        let mut expected = gate.clone();
        crate::gelu_mul(&mut expected, &up);
        let mut g = gpu.upload(&gate).unwrap();
        gpu.gelu_mul(&mut g, &u, n).unwrap();
        assert_close(&gpu.download(&g).unwrap(), &expected, 1e-6, 1e-5);

        let sum: Vec<f32> = gate.iter().zip(&up).map(|(a, b)| a + b).collect();
        let mut g = gpu.upload(&gate).unwrap();
        gpu.add_into(&mut g, &u, n).unwrap();
        assert_eq!(gpu.download(&g).unwrap(), sum);
    }
    // Bias over rows, and row gathering.
    let (rows, width) = (5, 7);
    let x = random_vec(&mut r, rows * width, 1.0);
    let bias = random_vec(&mut r, width, 1.0);
    let expected: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, v)| v + bias[i % width])
        .collect();
    let mut xd = gpu.upload(&x).unwrap();
    gpu.add_bias(&mut xd, &gpu.upload(&bias).unwrap(), rows)
        .unwrap();
    assert_eq!(gpu.download(&xd).unwrap(), expected);
    let mut out = gpu.zeros::<f32>(3 * width).unwrap();
    gpu.gather_rows(&xd, &[4, 0, 4], width, &mut out).unwrap();
    let got = gpu.download(&out).unwrap();
    assert_eq!(&got[..width], &expected[4 * width..]);
    assert_eq!(&got[width..2 * width], &expected[..width]);
    assert!(gpu.gather_rows(&xd, &[5], width, &mut out).is_err());
}

#[test]
fn rope_matches_cpu_for_both_styles() {
    let gpu = require_gpu!();
    let mut r = rng(3);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for (n_tokens, n_heads, hd, scale) in [(1, 1, 2, 1.0), (4, 9, 64, 1.0), (3, 2, 6, 4.0)] {
            let rope = Rope::new(hd, 10_000.0, scale, style);
            let positions: Vec<usize> = (0..n_tokens).map(|_| r.random_range(0..5000)).collect();
            let x = random_vec(&mut r, n_tokens * n_heads * hd, 2.0);
            let mut expected = x.clone();
            rope.apply(&mut expected, &positions, n_heads);
            let pos32: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
            let mut xd = gpu.upload(&x).unwrap();
            gpu.rope(
                &mut xd,
                &gpu.upload(&pos32).unwrap(),
                &gpu.upload(rope.inv_freq()).unwrap(),
                n_tokens,
                n_heads,
                hd,
                style == RopeStyle::Neox,
            )
            .unwrap();
            assert_close(&gpu.download(&xd).unwrap(), &expected, 2e-4, 1e-4);
        }
    }
}

#[test]
fn write_kv_matches_cpu_for_every_dtype() {
    let gpu = require_gpu!();
    let mut r = rng(4);
    for dtype in KvDtype::ALL {
        for (nkv, hd) in [(1, 2), (3, 64), (2, 40)] {
            let num_slots = 37;
            let n = 11;
            let mut slots: Vec<usize> = (0..num_slots).collect();
            for i in 0..n {
                slots.swap(i, r.random_range(i..num_slots));
            }
            slots.truncate(n);
            let mut k = random_vec(&mut r, n * nkv * hd, 3.0);
            let v = random_vec(&mut r, n * nkv * hd, 3.0);
            k[0] = 70_000.0; // saturates in f16
            k[hd * nkv] = 0.0;
            let mut kc = KvBuffer::new(dtype, num_slots, nkv, hd);
            let mut vc = KvBuffer::new(dtype, num_slots, nkv, hd);
            crate::write_kv(kc.view_mut(), vc.view_mut(), &k, &v, &slots, nkv, hd);

            let slots32: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
            let slots_d = gpu.upload(&slots32).unwrap();
            let max_slot = *slots.iter().max().unwrap();
            let mut kg = GpuKvBuffer::new(&gpu, dtype, num_slots, nkv, hd).unwrap();
            let mut vg = GpuKvBuffer::new(&gpu, dtype, num_slots, nkv, hd).unwrap();
            gpu.write_kv(
                &mut kg,
                &gpu.upload(&k).unwrap(),
                &slots_d,
                max_slot,
                nkv,
                hd,
            )
            .unwrap();
            gpu.write_kv(
                &mut vg,
                &gpu.upload(&v).unwrap(),
                &slots_d,
                max_slot,
                nkv,
                hd,
            )
            .unwrap();
            for (cpu, gpu_cache) in [(&kc, &kg), (&vc, &vg)] {
                assert_same_cache(cpu, &gpu_cache.to_host(&gpu).unwrap(), dtype);
            }
        }
    }
}

fn assert_same_cache(cpu: &KvBuffer, gpu: &KvBuffer, dtype: KvDtype) {
    match (cpu, gpu) {
        (KvBuffer::F32(a), KvBuffer::F32(b)) => assert_eq!(a, b),
        (KvBuffer::F16(a), KvBuffer::F16(b)) => assert_eq!(a, b),
        (
            KvBuffer::Int8 {
                values: av,
                scales: as_,
            },
            KvBuffer::Int8 {
                values: bv,
                scales: bs,
            },
        ) => {
            assert_close(bs, as_, 0.0, 1e-6);
            for (i, (a, b)) in av.iter().zip(bv).enumerate() {
                assert!(
                    (*a as i32 - *b as i32).abs() <= 1,
                    "{dtype} value {i}: {a} vs {b}"
                );
            }
        }
        _ => panic!("cache types differ"),
    }
}

#[test]
fn paged_attention_matches_cpu_for_every_dtype() {
    let gpu = require_gpu!();
    let mut r = rng(5);
    // (heads, KV heads, head dim, block size)
    for (nh, nkv, hd, bs) in [(9, 3, 64, 16), (4, 4, 40, 5), (2, 1, 128, 16), (3, 1, 2, 3)] {
        for dtype in KvDtype::ALL {
            attention_case(&gpu, &mut r, dtype, nh, nkv, hd, bs, None);
        }
    }
    // Sliding windows (Gemma 3's local layers): shorter than a block, a block's length, and
    // longer than some contexts, so queries see whole, partial and no blocks behind them.
    for window in [1, 3, 16, 45] {
        for dtype in KvDtype::ALL {
            attention_case(&gpu, &mut r, dtype, 8, 2, 64, 16, Some(window));
        }
    }
    let mut r = rng(6);
    let q = gpu.upload(&random_vec(&mut r, 4, 1.0)).unwrap();
    let kv = GpuKvBuffer::new(&gpu, KvDtype::F32, 4, 1, 4).unwrap();
    let batch = AttentionBatch::new(&gpu, &[0], &[0], &[&[0]], 4).unwrap();
    let mut out = gpu.zeros::<f32>(4).unwrap();
    let zero_window = gpu.paged_attention(&q, &kv, &kv, &batch, 1, 1, 4, 4, 0.5, Some(0), &mut out);
    assert!(zero_window.is_err());
}

#[allow(clippy::too_many_arguments)]
fn attention_case(
    gpu: &Gpu,
    r: &mut StdRng,
    dtype: KvDtype,
    nh: usize,
    nkv: usize,
    hd: usize,
    bs: usize,
    window: Option<usize>,
) {
    let num_blocks = 256;
    let width = nkv * hd;
    // A prefill chunk that continues a prefix, a decode step in a partly filled block, a
    // fresh prompt, and a long decode.
    let shapes: [(usize, usize); 4] = [(13, 5), (40, 1), (0, 7), (150, 1)];
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    for i in 0..free.len() {
        free.swap(i, r.random_range(i..num_blocks));
    }
    let mut kc = KvBuffer::new(dtype, num_blocks * bs, nkv, hd);
    let mut vc = KvBuffer::new(dtype, num_blocks * bs, nkv, hd);
    let mut tables: Vec<Vec<u32>> = Vec::new();
    for &(start, q_len) in &shapes {
        let total = start + q_len;
        let table: Vec<u32> = free.drain(..total.div_ceil(bs)).collect();
        let slots: Vec<usize> = (0..total)
            .map(|p| table[p / bs] as usize * bs + p % bs)
            .collect();
        let k = random_vec(r, total * width, 2.0);
        let v = random_vec(r, total * width, 2.0);
        crate::write_kv(kc.view_mut(), vc.view_mut(), &k, &v, &slots, nkv, hd);
        tables.push(table);
    }
    let n_tokens: usize = shapes.iter().map(|s| s.1).sum();
    let q = random_vec(r, n_tokens * nh * hd, 1.0);
    let mut seqs = Vec::new();
    let (mut positions, mut token_seq) = (Vec::new(), Vec::new());
    let mut q_start = 0;
    for (s, &(start, q_len)) in shapes.iter().enumerate() {
        seqs.push(crate::AttentionSeq {
            q_start,
            q_len,
            start_pos: start,
            block_table: &tables[s],
        });
        positions.extend(start..start + q_len);
        token_seq.extend(std::iter::repeat_n(s, q_len));
        q_start += q_len;
    }
    let scale = 1.0 / (hd as f32).sqrt();
    let mut expected = vec![0.0; q.len()];
    crate::paged_attention_windowed(
        &q,
        kc.view(),
        vc.view(),
        &seqs,
        nh,
        nkv,
        hd,
        bs,
        scale,
        window,
        &mut expected,
    );
    let table_refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
    let batch = AttentionBatch::new(gpu, &positions, &token_seq, &table_refs, bs).unwrap();
    let kg = GpuKvBuffer::from_host(gpu, &kc).unwrap();
    let vg = GpuKvBuffer::from_host(gpu, &vc).unwrap();
    let mut out = gpu.zeros::<f32>(q.len()).unwrap();
    gpu.paged_attention(
        &gpu.upload(&q).unwrap(),
        &kg,
        &vg,
        &batch,
        nh,
        nkv,
        hd,
        bs,
        scale,
        window,
        &mut out,
    )
    .unwrap();
    let got = gpu.download(&out).unwrap();
    let tol = if dtype == KvDtype::F32 { 1e-5 } else { 1e-3 };
    assert_close(&got, &expected, tol, 1e-4);
}

/// Random GGUF blocks of `ty` for a `[rows, cols]` matrix with sane f16 scales.
fn random_blocks(r: &mut StdRng, ty: QuantType, rows: usize, cols: usize) -> Vec<u8> {
    crate::quant::dot::tests::random_blocks(r, ty, rows * cols / ty.block_elems())
}

/// `y = x · Wᵀ` in f64 over dequantised weights.
fn reference_matmul(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k)
                .map(|c| x[i * k + c] as f64 * w[j * k + c] as f64)
                .sum();
            y[i * n + j] = s as f32;
        }
    }
    y
}

#[test]
fn quantised_matmul_matches_dequantised_reference() {
    let gpu = require_gpu!();
    let mut r = rng(6);
    for ty in crate::cuda::GPU_BLOCK_TYPES {
        // m below and from TILED_MIN_ROWS: both kernels; k not a multiple of the tile width
        // too (the 32-weight formats), one to several super-blocks and rows (the K-quants).
        let shapes: &[(usize, usize, usize)] = if ty.is_k_quant() {
            &[
                (1, 1, 256),
                (3, 5, 512),
                (4, 17, 768),
                (9, 130, 256),
                (17, 33, 2048),
            ]
        } else {
            &[
                (1, 1, 32),
                (3, 5, 96),
                (4, 17, 288),
                (8, 64, 576),
                (9, 130, 64),
                (17, 33, 1536),
            ]
        };
        for &(m, n, k) in shapes {
            let bytes = random_blocks(&mut r, ty, n, k);
            let mut w = vec![0.0; n * k];
            ty.dequantize(&bytes, &mut w);
            let x = random_vec(&mut r, m * k, 1.0);
            let expected = reference_matmul(&w, &x, m, n, k);
            let matrix = GpuMatrix::from_blocks(&gpu, ty, &bytes, n, k).unwrap();
            let mut y = gpu.zeros::<f32>(m * n).unwrap();
            gpu.matmul(&matrix, &gpu.upload(&x).unwrap(), m, &mut y)
                .unwrap();
            assert_close(&gpu.download(&y).unwrap(), &expected, 1e-4, 1e-4);
        }
    }
}

#[test]
fn f16_matmul_matches_reference_for_any_width() {
    let gpu = require_gpu!();
    let mut r = rng(7);
    for (m, n, k) in [(1, 3, 1), (2, 7, 33), (9, 40, 577)] {
        let w: Vec<f32> = random_vec(&mut r, n * k, 0.5)
            .into_iter()
            .map(|v| f16::from_f32(v).to_f32())
            .collect();
        let x = random_vec(&mut r, m * k, 1.0);
        let expected = reference_matmul(&w, &x, m, n, k);
        let matrix = GpuMatrix::from_f32(&gpu, &w, n, k).unwrap();
        let mut y = gpu.zeros::<f32>(m * n).unwrap();
        gpu.matmul(&matrix, &gpu.upload(&x).unwrap(), m, &mut y)
            .unwrap();
        assert_close(&gpu.download(&y).unwrap(), &expected, 1e-4, 1e-4);
    }
}

#[test]
fn shape_errors_are_reported_before_launch() {
    let gpu = require_gpu!();
    let x = gpu.zeros::<f32>(10).unwrap();
    let mut y = gpu.zeros::<f32>(10).unwrap();
    let w = GpuMatrix::from_f32(&gpu, &[0.0; 64], 2, 32).unwrap();
    assert!(matches!(
        gpu.matmul(&w, &x, 1, &mut y),
        Err(CudaError::Shape(_))
    ));
    assert!(GpuMatrix::from_blocks(&gpu, QuantType::Q4_1, &[0; 19], 1, 32).is_err());
    assert!(AttentionBatch::new(&gpu, &[20], &[0], &[&[0]], 16).is_err());
}
