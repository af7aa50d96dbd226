//! Tiny GGUF models with random weights, written from code: the shape of a real model in a
//! few kilobytes, for tests that need a model but not its quality (they load in milliseconds
//! and make scheduler, cache and worker tests fast and deterministic).

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::config::Architecture;

/// Shape and type of a generated model.
#[derive(Debug, Clone)]
pub struct TinySpec {
    pub architecture: Architecture,
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub vocab: usize,
    pub context: usize,
    /// Block type of the matrices (norms are always f32).
    pub dtype: GgmlDType,
    /// Share the embedding as the output matrix (no `output.weight`).
    pub tied_embeddings: bool,
    /// Gemma 3 only: the local layers' window, and the period of the global layers
    /// (`gemma3.attention.sliding_window_pattern`: every `n`th layer is global).
    pub sliding_window: usize,
    pub sliding_window_pattern: usize,
    pub seed: u64,
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            architecture: Architecture::Llama,
            layers: 2,
            hidden: 64,
            ffn: 128,
            heads: 4,
            kv_heads: 2,
            vocab: 96,
            context: 256,
            dtype: GgmlDType::Q8_0,
            tied_embeddings: true,
            sliding_window: 8,
            sliding_window_pattern: 2,
            seed: 7,
        }
    }
}

/// Errors writing a tiny model.
#[derive(Debug, thiserror::Error)]
pub enum TinyModelError {
    #[error("cannot write {0}: {1}")]
    Io(String, std::io::Error),
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Writes a random model of `spec` to `path`, with a byte-level vocabulary
/// (`tokenizer.ggml.*`, gpt2 model) so the runtime's tokenizer loads it too.
pub fn write_tiny_gguf(path: &Path, spec: &TinySpec) -> Result<(), TinyModelError> {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let head_dim = spec.hidden / spec.heads;
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut matrix = |name: String,
                      rows: usize,
                      cols: usize,
                      dtype: GgmlDType,
                      rng: &mut StdRng|
     -> Result<(), TinyModelError> {
        let scale = 1.0 / (cols as f32).sqrt();
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-scale..scale))
            .collect();
        let shape: &[usize] = if rows == 1 { &[cols] } else { &[rows, cols] };
        let t = Tensor::from_vec(data, shape, &Device::Cpu)?;
        tensors.push((name, QTensor::quantize(&t, dtype)?));
        Ok(())
    };
    let norm =
        |name: String, len: usize, rng: &mut StdRng| -> Result<(String, QTensor), TinyModelError> {
            let data: Vec<f32> = (0..len).map(|_| rng.random_range(0.8..1.2)).collect();
            Ok((
                name,
                QTensor::quantize(
                    &Tensor::from_vec(data, &[len][..], &Device::Cpu)?,
                    GgmlDType::F32,
                )?,
            ))
        };
    let q_width = spec.heads * head_dim;
    let kv_width = spec.kv_heads * head_dim;
    matrix(
        "token_embd.weight".into(),
        spec.vocab,
        spec.hidden,
        spec.dtype,
        &mut rng,
    )?;
    if !spec.tied_embeddings {
        matrix(
            "output.weight".into(),
            spec.vocab,
            spec.hidden,
            spec.dtype,
            &mut rng,
        )?;
    }
    let mut norms = vec![norm("output_norm.weight".into(), spec.hidden, &mut rng)?];
    for i in 0..spec.layers {
        let p = |t: &str| format!("blk.{i}.{t}");
        norms.push(norm(p("attn_norm.weight"), spec.hidden, &mut rng)?);
        norms.push(norm(p("ffn_norm.weight"), spec.hidden, &mut rng)?);
        matrix(
            p("attn_q.weight"),
            q_width,
            spec.hidden,
            spec.dtype,
            &mut rng,
        )?;
        matrix(
            p("attn_k.weight"),
            kv_width,
            spec.hidden,
            spec.dtype,
            &mut rng,
        )?;
        matrix(
            p("attn_v.weight"),
            kv_width,
            spec.hidden,
            spec.dtype,
            &mut rng,
        )?;
        matrix(
            p("attn_output.weight"),
            spec.hidden,
            q_width,
            spec.dtype,
            &mut rng,
        )?;
        matrix(
            p("ffn_gate.weight"),
            spec.ffn,
            spec.hidden,
            spec.dtype,
            &mut rng,
        )?;
        matrix(
            p("ffn_up.weight"),
            spec.ffn,
            spec.hidden,
            spec.dtype,
            &mut rng,
        )?;
        matrix(
            p("ffn_down.weight"),
            spec.hidden,
            spec.ffn,
            spec.dtype,
            &mut rng,
        )?;
        if spec.architecture.gemma_norms() {
            norms.push(norm(p("attn_q_norm.weight"), head_dim, &mut rng)?);
            norms.push(norm(p("attn_k_norm.weight"), head_dim, &mut rng)?);
            norms.push(norm(
                p("post_attention_norm.weight"),
                spec.hidden,
                &mut rng,
            )?);
            norms.push(norm(p("post_ffw_norm.weight"), spec.hidden, &mut rng)?);
        }
        if spec.architecture == Architecture::Qwen2 {
            matrix(p("attn_q.bias"), 1, q_width, GgmlDType::F32, &mut rng)?;
            matrix(p("attn_k.bias"), 1, kv_width, GgmlDType::F32, &mut rng)?;
            matrix(p("attn_v.bias"), 1, kv_width, GgmlDType::F32, &mut rng)?;
        }
    }
    tensors.extend(norms);

    let arch = spec.architecture.name();
    let key = |k: &str| format!("{arch}.{k}");
    // A byte-level vocabulary: the 256 byte pieces would not fit a tiny vocab, so tokens are
    // printable ASCII characters plus bos/eos.
    let mut tokens = vec![Value::String("<s>".into()), Value::String("</s>".into())];
    tokens.extend((0..spec.vocab - 2).map(|i| {
        Value::String(
            char::from(b'!' + (i % 94) as u8)
                .to_string()
                .repeat(1 + i / 94),
        )
    }));
    let mut metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String(format!("tiny-{arch}"))),
        (key("context_length"), Value::U32(spec.context as u32)),
        (key("embedding_length"), Value::U32(spec.hidden as u32)),
        (key("block_count"), Value::U32(spec.layers as u32)),
        (key("feed_forward_length"), Value::U32(spec.ffn as u32)),
        (key("attention.head_count"), Value::U32(spec.heads as u32)),
        (
            key("attention.head_count_kv"),
            Value::U32(spec.kv_heads as u32),
        ),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        // Gemma 3's global base; its local layers keep the default 10,000.
        (
            key("rope.freq_base"),
            Value::F32(match spec.architecture {
                Architecture::Gemma3 => 1_000_000.0,
                Architecture::Llama | Architecture::Qwen2 => 10_000.0,
            }),
        ),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.merges".into(), Value::Array(vec![])),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(0)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
    ];
    if spec.architecture == Architecture::Gemma3 {
        metadata.extend([
            (key("attention.key_length"), Value::U32(head_dim as u32)),
            (key("attention.value_length"), Value::U32(head_dim as u32)),
            (
                key("attention.sliding_window"),
                Value::U32(spec.sliding_window as u32),
            ),
            (
                key("attention.sliding_window_pattern"),
                Value::U32(spec.sliding_window_pattern as u32),
            ),
        ]);
    }
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let shown = path.display().to_string();
    let mut file = std::fs::File::create(path).map_err(|e| TinyModelError::Io(shown.clone(), e))?;
    gguf_file::write(&mut file, &meta_refs, &tensor_refs)?;
    Ok(())
}
