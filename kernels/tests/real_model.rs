//! The quantised kernels on the real weights of the default model (SmolLM2-135M Q4_1), fetched and
//! verified by `scripts/fetch-model.sh` on first use (TIDAL_MODEL overrides the path).

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::k_quants::{self, BlockQ4_1, GgmlType};
use candle_core::quantized::GgmlDType;
use rand::{Rng, SeedableRng};
use std::io::{Read, Seek, SeekFrom};
use tidal_kernels::{dequantize_q4_1, matmul, QuantType, Q4_1_BLOCK_BYTES, QK};

fn model_path() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("TIDAL_MODEL") {
        return p.into();
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/fetch-model.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .output()
        .expect("run fetch-model.sh");
    assert!(
        out.status.success(),
        "fetch-model.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8 path")
        .trim()
        .into()
}

#[test]
fn q4_1_kernels_match_candle_on_real_weights() {
    let mut f = std::fs::File::open(model_path()).expect("model file");
    let content = Content::read(&mut f).unwrap();
    let mut names: Vec<&String> = content
        .tensor_infos
        .iter()
        .filter(|(n, t)| {
            t.ggml_dtype == GgmlDType::Q4_1 && (n.starts_with("blk.0.") || n.starts_with("blk.29."))
        })
        .map(|(n, _)| n)
        .collect();
    names.sort();
    let mut others: Vec<String> = content
        .tensor_infos
        .iter()
        .filter(|(_, t)| t.ggml_dtype != GgmlDType::Q4_1)
        .map(|(n, t)| format!("{n}: {:?} {:?}", t.ggml_dtype, t.shape.dims()))
        .collect();
    others.sort();
    eprintln!("tensors not in Q4_1 (excluding norms of every layer past 0):");
    for o in others
        .iter()
        .filter(|o| !o.starts_with("blk.") || o.starts_with("blk.0."))
    {
        eprintln!("  {o}");
    }
    assert!(
        names.len() >= 7,
        "expected the Q4_1 matrices of two layers, found {names:?}"
    );
    let mut r = rand::rngs::StdRng::seed_from_u64(3);
    for name in names {
        let info = &content.tensor_infos[name];
        let dims = info.shape.dims();
        let k = dims[dims.len() - 1];
        let n = info.shape.elem_count() / k;
        let mut w = vec![0u8; n * k / QK * Q4_1_BLOCK_BYTES];
        f.seek(SeekFrom::Start(content.tensor_data_offset + info.offset))
            .unwrap();
        f.read_exact(&mut w).unwrap();
        let mut blocks = vec![BlockQ4_1::zeros(); n * k / QK];
        // SAFETY: BlockQ4_1 is #[repr(C)] {f16, f16, [u8; 16]} (20 bytes), the ggml layout.
        assert_eq!(std::mem::size_of::<BlockQ4_1>(), Q4_1_BLOCK_BYTES);
        unsafe {
            std::ptr::copy_nonoverlapping(w.as_ptr(), blocks.as_mut_ptr() as *mut u8, w.len())
        };

        // Dequantisation agrees bit for bit with candle's (= ggml's).
        let mut ours = vec![0.0; n * k];
        dequantize_q4_1(&w, &mut ours);
        let mut theirs = vec![0.0; n * k];
        BlockQ4_1::to_float(&blocks, &mut theirs);
        assert_eq!(ours, theirs, "{name}: dequantisation differs");

        // The matmul agrees with candle's within f16 rounding of candle's Q8_1 scales.
        for m in [1usize, 5, 16] {
            let x: Vec<f32> = (0..m * k).map(|_| r.random_range(-3.0..3.0)).collect();
            let mut out = vec![0.0; m * n];
            matmul(QuantType::Q4_1, &x, &w, m, k, n, &mut out);
            let mut cand = vec![0.0; m * n];
            k_quants::matmul((m, k, n), &x, &blocks, &mut cand).unwrap();
            check_close(name, m, k, n, &x, &ours, &out, &cand);
        }
    }
}

/// The model's LM head (`token_embd.weight`, Q8_0): the first 4,096 vocabulary rows through
/// our matmul and candle's, for decode and batched shapes (the panel GEMM).
#[test]
fn q8_0_lm_head_matches_candle_on_real_weights() {
    use candle_core::quantized::k_quants::BlockQ8_0;
    let mut f = std::fs::File::open(model_path()).expect("model file");
    let content = Content::read(&mut f).unwrap();
    let info = &content.tensor_infos["token_embd.weight"];
    assert_eq!(info.ggml_dtype, GgmlDType::Q8_0);
    let k = info.shape.dims()[1];
    let n = 4096;
    let ty = QuantType::Q8_0;
    let mut w = vec![0u8; n * ty.row_bytes(k)];
    f.seek(SeekFrom::Start(content.tensor_data_offset + info.offset))
        .unwrap();
    f.read_exact(&mut w).unwrap();
    assert_eq!(std::mem::size_of::<BlockQ8_0>(), ty.block_bytes());
    let mut blocks = vec![BlockQ8_0::zeros(); n * k / QK];
    // SAFETY: BlockQ8_0 is #[repr(C)] {f16, [i8; 32]} (34 bytes), the ggml layout.
    unsafe { std::ptr::copy_nonoverlapping(w.as_ptr(), blocks.as_mut_ptr() as *mut u8, w.len()) };
    let mut wf = vec![0.0; n * k];
    ty.dequantize(&w, &mut wf);
    let mut r = rand::rngs::StdRng::seed_from_u64(4);
    for m in [1usize, 7, 16] {
        let x: Vec<f32> = (0..m * k).map(|_| r.random_range(-3.0..3.0)).collect();
        let mut out = vec![0.0; m * n];
        matmul(ty, &x, &w, m, k, n, &mut out);
        let mut cand = vec![0.0; m * n];
        k_quants::matmul((m, k, n), &x, &blocks, &mut cand).unwrap();
        check_close("token_embd.weight", m, k, n, &x, &wf, &out, &cand);
    }
}

/// Ours and candle's outputs agree within `2e-3 · Σ_k |w_jk · x_ik|` per output: candle keeps
/// the Q8 activation scales (and Q8_1 sums) as f16, a relative error of 2⁻¹¹ on each block's
/// terms, which Q4_1's offset term can make large next to a small output.
#[allow(clippy::too_many_arguments)]
fn check_close(
    name: &str,
    m: usize,
    k: usize,
    n: usize,
    x: &[f32],
    wf: &[f32],
    ours: &[f32],
    theirs: &[f32],
) {
    let mut worst = 0.0f32;
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        for j in 0..n {
            let magnitude: f32 = xr
                .iter()
                .zip(&wf[j * k..(j + 1) * k])
                .map(|(a, b)| (a * b).abs())
                .sum();
            let diff = (ours[i * n + j] - theirs[i * n + j]).abs();
            assert!(
                diff <= 2e-3 * magnitude + 1e-5,
                "{name} m={m} [{i},{j}]: ours {} candle {} (Σ|w·x| {magnitude})",
                ours[i * n + j],
                theirs[i * n + j]
            );
            worst = worst.max(diff);
        }
    }
    eprintln!("{name} [{n}x{k}] m={m}: max |ours - candle| = {worst:.2e}");
}
