//! The forward pass on tiny generated GGUF models: loading, architectures, refusals, and the
//! paged-KV consistency of prefill, chunked prefill and token-by-token decode.

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::GgmlDType;
use tidal_runtime::model::{
    write_tiny_gguf, Architecture, ForwardBatch, ForwardSeq, KvDtype, KvStorage, Model, ModelError,
    ModelFile, QuantizeTo, TinySpec,
};

#[path = "../../tests/skip/mod.rs"]
mod skip;

fn tiny(spec: &TinySpec) -> (tempdir::Dir, ModelFile) {
    let dir = tempdir::Dir::new();
    let path = dir.path.join("tiny.gguf");
    write_tiny_gguf(&path, spec).unwrap();
    let file = ModelFile::open(&path).unwrap();
    (dir, file)
}

mod tempdir {
    /// A temporary directory removed on drop.
    pub struct Dir {
        pub path: std::path::PathBuf,
    }
    impl Dir {
        pub fn new() -> Self {
            let path = std::env::temp_dir().join(format!("tidal-test-{}", uuid::Uuid::now_v7()));
            std::fs::create_dir_all(&path).unwrap();
            Self { path }
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Logits of the last prompt token computed three ways must agree: one prefill, two chunks,
/// and token by token (each step reading earlier positions from the paged cache). Block
/// tables are deliberately scattered so pages are not contiguous. Holds for every KV dtype
/// (each token's K/V is rounded the same way whichever path wrote it), and the f16 and int8
/// caches stay close to f32.
fn check_paths_agree(model: &Model) {
    let c = model.config();
    let prompt: Vec<u32> = (0..37)
        .map(|i| (i * 7 % (c.vocab_size as u32 - 2)) + 2)
        .collect();
    let block_size = 4;
    let table: Vec<u32> = (0..10).map(|i| (i * 3 + 1) % 13).collect();
    let run = |dtype: KvDtype, chunks: &[usize]| -> Vec<f32> {
        let mut kv = KvStorage::new(c, dtype, 13, block_size);
        let mut start = 0;
        let mut logits = Vec::new();
        for &len in chunks {
            let batch = ForwardBatch {
                seqs: vec![ForwardSeq {
                    tokens: &prompt[start..start + len],
                    start_pos: start,
                    block_table: &table,
                    num_logits: usize::from(start + len == prompt.len()),
                }],
            };
            logits = model.forward(&batch, &mut kv).unwrap();
            start += len;
        }
        logits
    };
    let max_diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let reference = run(KvDtype::F32, &[prompt.len()]);
    for dtype in KvDtype::ALL {
        let whole = run(dtype, &[prompt.len()]);
        let chunked = run(dtype, &[20, 17]);
        let stepwise = run(dtype, &vec![1; prompt.len()]);
        assert_eq!(whole.len(), c.vocab_size);
        for (name, other) in [("chunked", &chunked), ("token by token", &stepwise)] {
            let diff = max_diff(&whole, other);
            assert!(
                diff < 1e-3,
                "{dtype}: {name} logits differ from one prefill by {diff}"
            );
        }
        let scale = reference.iter().fold(0f32, |a, v| a.max(v.abs()));
        let diff = max_diff(&whole, &reference);
        // Not tighter: the next matmul quantises its input to Q8_1, so any small change in
        // attention output flips some roundings; f16 and int8 both measure about 2% here
        // (a wrong scale or layout would move logits by the order of the largest one).
        let tolerance = match dtype {
            KvDtype::F32 => 0.0,
            KvDtype::F16 | KvDtype::Int8 => 4e-2 * scale,
        };
        assert!(
            diff <= tolerance,
            "{dtype} KV logits differ from f32 by {diff} (largest logit {scale})"
        );
    }
}

#[test]
fn llama_tied_embeddings_paths_agree() {
    let (_dir, file) = tiny(&TinySpec::default());
    let model = Model::load(&file, None).unwrap();
    assert_eq!(model.config().architecture, Architecture::Llama);
    assert!(
        model.all_weights_mapped(),
        "weights must be read in place from the mmap"
    );
    check_paths_agree(&model);
}

#[test]
fn llama_untied_q4_1_paths_agree() {
    let spec = TinySpec {
        tied_embeddings: false,
        dtype: GgmlDType::Q4_1,
        ..TinySpec::default()
    };
    let (_dir, file) = tiny(&spec);
    let model = Model::load(&file, None).unwrap();
    check_paths_agree(&model);
}

#[test]
fn qwen2_with_biases_paths_agree() {
    let spec = TinySpec {
        architecture: Architecture::Qwen2,
        ..TinySpec::default()
    };
    let (_dir, file) = tiny(&spec);
    let model = Model::load(&file, None).unwrap();
    assert_eq!(model.config().architecture, Architecture::Qwen2);
    check_paths_agree(&model);
}

#[test]
fn gemma3_local_and_global_layers_paths_agree() {
    // Window 8 over a 37-token prompt: the chunked and token-by-token paths read the window's
    // edge from the paged cache (layers 0 and 2 local, layer 1 global).
    let spec = TinySpec {
        architecture: Architecture::Gemma3,
        layers: 3,
        ..TinySpec::default()
    };
    let (_dir, file) = tiny(&spec);
    let model = Model::load(&file, None).unwrap();
    let c = model.config();
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!(
        (0..3).map(|i| c.layer_window(i)).collect::<Vec<_>>(),
        [Some(8), None, Some(8)]
    );
    check_paths_agree(&model);
}

/// The last-token logits of a four-token prompt, from an f32 KV cache of one block.
fn short_prompt_logits(model: &Model) -> Vec<f32> {
    let prompt = [2u32, 5, 9, 11];
    let table = [0u32];
    let batch = ForwardBatch::prompt(&prompt, &table);
    let mut kv = KvStorage::new(model.config(), KvDtype::F32, 1, 16);
    model.forward(&batch, &mut kv).unwrap()
}

#[test]
fn requantised_weights_are_owned_and_close() {
    let (_dir, file) = tiny(&TinySpec {
        dtype: GgmlDType::F32,
        ..TinySpec::default()
    });
    let exact = Model::load(&file, None).unwrap();
    let q8 = Model::load(&file, Some(QuantizeTo::Q8_0)).unwrap();
    assert!(!q8.all_weights_mapped());
    assert!(
        q8.weight_bytes() * 3 < exact.weight_bytes(),
        "Q8_0 should be about a quarter of f32"
    );
    let (a, b) = (short_prompt_logits(&exact), short_prompt_logits(&q8));
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, _)| i)
    };
    assert_eq!(argmax(&a), argmax(&b));
}

/// Largest logit difference between two runs, and the scale of the second.
fn logit_gap(a: &[f32], b: &[f32]) -> (f32, f32) {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    (diff, scale)
}

/// Q5_1 has no kernel of ours: by default it becomes Q8_0 at load (close to the stored
/// values), and `QuantizeTo::Stored` keeps it in place. Q5_0 and the K-quants run on our
/// kernels as stored, close to the same weights dequantised to f32.
#[test]
fn slow_block_types_become_q8_0_unless_kept_as_stored() {
    let (_dir, file) = tiny(&TinySpec {
        dtype: GgmlDType::Q5_1,
        hidden: 64,
        ffn: 128,
        ..TinySpec::default()
    });
    let fast = Model::load(&file, None).unwrap();
    let stored = Model::load(&file, Some(QuantizeTo::Stored)).unwrap();
    assert!(!fast.all_weights_mapped(), "Q5_1 was not re-quantised");
    assert!(stored.all_weights_mapped(), "Q5_1 stored was copied");
    assert!(fast.weight_bytes() > stored.weight_bytes());
    let (diff, scale) = logit_gap(&short_prompt_logits(&fast), &short_prompt_logits(&stored));
    assert!(
        diff < 0.05 * scale,
        "Q5_1: Q8_0 moved logits by {diff} of {scale}"
    );

    for (dtype, hidden) in [
        (GgmlDType::Q5_0, 64),
        (GgmlDType::Q2K, 256),
        (GgmlDType::Q3K, 256),
        (GgmlDType::Q4K, 256),
        (GgmlDType::Q5K, 256),
        (GgmlDType::Q6K, 256),
    ] {
        let (_dir, file) = tiny(&TinySpec {
            dtype,
            hidden,
            ffn: 2 * hidden,
            ..TinySpec::default()
        });
        let default = Model::load(&file, None).unwrap();
        assert!(default.all_weights_mapped(), "{dtype:?} was re-quantised");
        let exact = Model::load(&file, Some(QuantizeTo::F32)).unwrap();
        assert!(exact.weight_bytes() > default.weight_bytes());
        let (diff, scale) = logit_gap(&short_prompt_logits(&default), &short_prompt_logits(&exact));
        assert!(
            diff < 0.05 * scale,
            "{dtype:?}: our kernels are {diff} off the f32 weights' logits (scale {scale})"
        );
    }
    // A type our kernels run stays in place either way.
    let (_dir, file) = tiny(&TinySpec::default());
    assert!(Model::load(&file, None).unwrap().all_weights_mapped());
}

/// Q4_K matrices of whole groups of sixteen rows are repacked for the AVX-512 VNNI kernels;
/// the logits are the stored layout's, bit for bit, for prompts of one row and of several
/// passes of four rows with every tail.
#[test]
fn repacked_q4_k_gives_the_stored_layouts_logits_bit_for_bit() {
    let kernel = tidal_kernels::DotKernel::selected();
    if !tidal_kernels::reads_q4_k_x16(kernel) {
        skip::skip(&format!(
            "the {kernel:?} kernel does not read repacked Q4_K (no AVX-512 VNNI)"
        ));
        return;
    }
    let (_dir, file) = tiny(&TinySpec {
        dtype: GgmlDType::Q4K,
        hidden: 256,
        ffn: 512,
        ..TinySpec::default()
    });
    let repacked = Model::load(&file, None).unwrap();
    // Every matrix: q, k, v, o, gate, up, down in two layers, and the tied LM head.
    assert_eq!(repacked.prepare_cpu(kernel), 15);
    let stored = Model::load(&file, None).unwrap();
    assert_eq!(stored.prepare_cpu(tidal_kernels::DotKernel::Portable), 0);
    assert!(repacked.all_weights_mapped() && stored.all_weights_mapped());
    assert_eq!(repacked.weight_bytes(), stored.weight_bytes());
    for len in [1usize, 4, 7, 20] {
        let prompt: Vec<u32> = (0..len as u32).map(|t| (t * 7 + 3) % 96).collect();
        let logits = |model: &Model| {
            let table = [0u32, 1];
            let batch = ForwardBatch::prompt(&prompt, &table);
            let mut kv = KvStorage::new(model.config(), KvDtype::F32, 2, 16);
            model.forward(&batch, &mut kv).unwrap()
        };
        let (a, b) = (logits(&repacked), logits(&stored));
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{len}-token prompt: repacked {a:?} stored {b:?}"
        );
    }
}

#[test]
fn unknown_architecture_is_refused_by_name() {
    let dir = tempdir::Dir::new();
    let path = dir.path.join("odd.gguf");
    let arch = Value::String("gptj".into());
    let mut f = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut f, &[("general.architecture", &arch)], &[]).unwrap();
    let file = ModelFile::open(&path).unwrap();
    let err = Model::load(&file, None).err().unwrap();
    assert!(
        matches!(err, ModelError::UnsupportedArchitecture(ref a) if a == "gptj"),
        "{err}"
    );
    assert!(err.to_string().contains("gptj"));
}

#[test]
fn unsupported_tensor_type_is_refused_by_name() {
    let (_dir, file) = tiny(&TinySpec {
        dtype: GgmlDType::Q8_1,
        ..TinySpec::default()
    });
    let err = Model::load(&file, None).err().unwrap();
    let text = err.to_string();
    assert!(
        matches!(err, ModelError::UnsupportedTensorType { .. }),
        "{text}"
    );
    assert!(text.contains("Q8_1") && text.contains("weight"), "{text}");
}

#[test]
fn missing_file_and_garbage_give_clear_errors() {
    let err = ModelFile::open("/nonexistent/model.gguf").err().unwrap();
    assert!(err.to_string().contains("/nonexistent/model.gguf"));
    let dir = tempdir::Dir::new();
    let path = dir.path.join("garbage.gguf");
    std::fs::write(&path, b"definitely not a gguf file").unwrap();
    let err = ModelFile::open(&path).err().unwrap();
    assert!(
        err.to_string().contains("not a readable GGUF file"),
        "{err}"
    );
}
