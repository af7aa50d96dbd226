//! `tidal quantize` end to end: a tiny generated f32 model quantised to Q4_K_M and Q6_K loads
//! and runs close to its source, with the types llama.cpp's rules give; and the rules
//! reproduce the types of a real llama.cpp Q4_K_M file (Gemma 3 270M).

mod common;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use tidal_runtime::model::{
    write_tiny_gguf, ForwardBatch, ForwardSeq, KvDtype, KvStorage, Model, ModelFile, QuantizeTo,
    TinySpec,
};
use tidal_runtime::quantize::{
    llama_order, plan_types, quantize_file, FileType, ModelFacts, TensorDesc,
};

/// A llama model whose matrices all have rows of 256 or 512 (K-quants fit everywhere).
fn spec() -> TinySpec {
    TinySpec {
        dtype: GgmlDType::F32,
        layers: 4,
        hidden: 256,
        ffn: 512,
        heads: 4,
        kv_heads: 2,
        vocab: 96,
        ..TinySpec::default()
    }
}

/// Greedy tokens after `prompt` (`steps` of them) and the logits of every step; with
/// `forced`, those tokens are fed instead of the model's own picks (teacher forcing, so two
/// models' logits are compared on the same sequence).
fn greedy(
    model: &Model,
    prompt: &[u32],
    steps: usize,
    forced: Option<&[u32]>,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut kv = KvStorage::new(model.config(), KvDtype::F32, 4, 16);
    let table = [0u32, 1, 2, 3];
    let mut tokens = prompt.to_vec();
    let mut all_logits = Vec::new();
    let mut start = 0;
    for _ in 0..steps {
        let batch = ForwardBatch {
            seqs: vec![ForwardSeq {
                tokens: &tokens[start..],
                start_pos: start,
                block_table: &table,
                num_logits: 1,
            }],
        };
        let logits = model.forward(&batch, &mut kv).unwrap();
        start = tokens.len();
        let next = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .unwrap();
        tokens.push(forced.map_or(next, |f| f[all_logits.len()]));
        all_logits.push(logits);
    }
    (tokens[prompt.len()..].to_vec(), all_logits)
}

/// Largest logit difference relative to the largest logit of `reference`.
fn relative_gap(a: &[Vec<f32>], reference: &[Vec<f32>]) -> f32 {
    let scale = reference.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a
        .iter()
        .flatten()
        .zip(reference.iter().flatten())
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// The largest relative RMS error of a matrix of `quantised` against the same matrix of
/// `source` (both dequantised with candle).
fn worst_weight_error(source: &ModelFile, quantised: &ModelFile) -> f64 {
    let read = |file: &ModelFile, name: &str| -> Vec<f32> {
        let mut f = std::fs::File::open(file.path()).unwrap();
        let t = file
            .content()
            .tensor(&mut f, name, &candle_core::Device::Cpu)
            .unwrap();
        let t = t.dequantize(&candle_core::Device::Cpu).unwrap();
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    };
    let mut worst = 0f64;
    for (name, info) in &source.content().tensor_infos {
        if info.shape.dims().len() < 2 {
            continue;
        }
        let (a, b) = (read(source, name), read(quantised, name));
        let err: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| ((x - y) as f64).powi(2))
            .sum();
        let norm: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
        worst = worst.max((err / norm).sqrt());
    }
    worst
}

fn tensor_bytes(file: &ModelFile) -> u64 {
    file.content()
        .tensor_infos
        .values()
        .map(|t| {
            (t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size()) as u64
        })
        .sum()
}

fn types(file: &ModelFile) -> Vec<(String, GgmlDType)> {
    let mut v: Vec<_> = file
        .content()
        .tensor_infos
        .iter()
        .map(|(n, t)| (n.clone(), t.ggml_dtype))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn a_tiny_model_quantised_to_q4_k_m_and_q6_k_runs_close_to_its_f32_source() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tiny-f32.gguf");
    write_tiny_gguf(&source, &spec()).unwrap();
    let exact = Model::load(&ModelFile::open(&source).unwrap(), None).unwrap();
    let prompt = [2u32, 17, 40, 5, 9, 63, 11];
    let (exact_tokens, exact_logits) = greedy(&exact, &prompt, 8, None);

    // (file type, bound on a matrix's relative RMS error, on the logit gap to the source).
    // Measured: 0.055 and 0.118 for Q4_K_M, 0.013 and 0.030 for Q6_K (uniform weights: a
    // 4-bit step over the range is 6.7% RMS of the values, a 6-bit one 1.6%).
    for (ftype, weight_bound, bound) in [
        (FileType::Q4_K_M, 0.065, 0.18),
        (FileType::Q6_K, 0.016, 0.05),
    ] {
        let path = dir.path().join(format!("tiny-{ftype}.gguf"));
        let summary = quantize_file(&source, &path, ftype).unwrap();
        let file = ModelFile::open(&path).unwrap();
        assert_eq!(summary.output_tensor_bytes, tensor_bytes(&file));
        assert!(matches!(
            file.metadata("general.file_type").unwrap(),
            Value::U32(id) if *id == ftype.id()
        ));
        let t = types(&file);
        let ty = |name: &str| t.iter().find(|(n, _)| n == name).unwrap().1;
        // Tied embeddings are the output matrix: Q6_K in both mixes; norms stay f32.
        assert_eq!(ty("token_embd.weight"), GgmlDType::Q6K);
        assert_eq!(ty("blk.0.attn_norm.weight"), GgmlDType::F32);
        if ftype == FileType::Q4_K_M {
            // use_more_bits(i, 4): layers 0 (i < 4/8 is false, (0 - 0) % 3 != 2) ... only
            // the last layer (i >= 7·4/8 = 3) gets Q6_K.
            assert_eq!(ty("blk.3.attn_v.weight"), GgmlDType::Q6K);
            assert_eq!(ty("blk.3.ffn_down.weight"), GgmlDType::Q6K);
            assert_eq!(ty("blk.0.attn_v.weight"), GgmlDType::Q4K);
            assert_eq!(ty("blk.1.ffn_gate.weight"), GgmlDType::Q4K);
        } else {
            assert!(t
                .iter()
                .all(|(n, d)| *d == GgmlDType::Q6K || n.contains("norm")));
        }

        let model = Model::load(&file, None).unwrap();
        assert!(model.all_weights_mapped(), "{ftype}: K-quants run in place");
        let resident = model.weight_bytes() as f64;
        let on_disk = tensor_bytes(&file) as f64;
        assert!(
            (resident / on_disk - 1.0).abs() < 0.05,
            "{ftype}: {resident} bytes resident for {on_disk} in the file"
        );
        let worst = worst_weight_error(&ModelFile::open(&source).unwrap(), &file);
        eprintln!("{ftype}: worst relative RMS error of a matrix {worst:.4}");
        assert!(
            worst <= weight_bound,
            "{ftype}: a matrix is {worst} off its source"
        );
        // On the source's greedy tokens (a random model's near-ties flip its own picks).
        let (_, logits) = greedy(&model, &prompt, 8, Some(&exact_tokens));
        let gap = relative_gap(&logits, &exact_logits);
        eprintln!("{ftype}: logit gap {gap:.4} of the largest logit");
        assert!(gap <= bound, "{ftype}: logits {gap} off the f32 source's");
        // Our kernels against the same weights dequantised: only the activations' Q8_K
        // rounding separates them, so the greedy tokens agree.
        let dequantised = Model::load(&file, Some(QuantizeTo::F32)).unwrap();
        let (tokens, logits) = greedy(&model, &prompt, 8, None);
        let (ref_tokens, ref_logits) = greedy(&dequantised, &prompt, 8, None);
        assert_eq!(tokens, ref_tokens, "{ftype}: greedy tokens");
        let kernel_gap = relative_gap(&logits, &ref_logits);
        eprintln!("{ftype}: kernels against the dequantised weights {kernel_gap:.4}");
        assert!(kernel_gap < 0.03, "{ftype}: kernels {kernel_gap} off");
    }
}

#[test]
fn unknown_types_and_unreadable_files_are_clear_errors() {
    let err = "q4_k_xl".parse::<FileType>().unwrap_err();
    assert!(
        err.contains("q4_k_m, q4_k_s, q5_k_m, q6_k, q8_0, q4_0, q4_1"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let err = quantize_file(&missing, &dir.path().join("out.gguf"), FileType::Q6_K).unwrap_err();
    assert!(err.to_string().contains("missing.gguf"), "{err}");
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"not a gguf file").unwrap();
    let err = quantize_file(&garbage, &dir.path().join("out.gguf"), FileType::Q6_K).unwrap_err();
    assert!(err.to_string().contains("not a readable GGUF"), "{err}");
    assert!(!dir.path().join("out.gguf").exists());
}

/// The rules on Gemma 3 270M's tensors give the types llama.cpp wrote in its Q4_K_M file.
#[test]
fn the_rules_reproduce_a_llama_cpp_q4_k_m_file() {
    // fetched by `scripts/test.sh` before the tests, as for the other Gemma 3 tests
    let path = common::fetch_model("gemma3");
    let file = ModelFile::open(&path).unwrap();
    let arch = "gemma3";
    let uint = |k: &str| match file.metadata(&format!("{arch}.{k}")).unwrap() {
        Value::U32(v) => *v as usize,
        other => panic!("{k}: {other:?}"),
    };
    let facts = ModelFacts {
        arch: arch.into(),
        layers: uint("block_count"),
        experts: 0,
        gqa: uint("attention.head_count") / uint("attention.head_count_kv"),
    };
    let mut tensors: Vec<TensorDesc> = file
        .content()
        .tensor_infos
        .iter()
        .map(|(n, t)| TensorDesc {
            name: n.clone(),
            dims: t.shape.dims().iter().rev().copied().collect(),
            dtype: t.ggml_dtype,
        })
        .collect();
    tensors.sort_by(|a, b| llama_order(&a.name, &b.name));
    let planned = plan_types(FileType::Q4_K_M, &facts, &tensors).unwrap();
    let mismatches: Vec<String> = tensors
        .iter()
        .zip(&planned)
        .filter(|(t, p)| t.dtype != **p)
        .map(|(t, p)| format!("{}: file {:?}, planned {p:?}", t.name, t.dtype))
        .collect();
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}
