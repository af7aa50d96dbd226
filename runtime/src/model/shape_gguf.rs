//! GGUF files with a real model's shape and tensor types but no weights: the header of, say,
//! Llama 3 8B in llama.cpp's Q4_K_M mix, and a data section of the right length that is never
//! written (a sparse file: no disk space, nothing to download). What reads only the header (the
//! memory plan, `tidal runtime --dry-run`) sees the real model; anything that reads a weight
//! reads zeros.

use std::io::Write;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;

use super::gguf_write::{self, TensorEntry, DEFAULT_ALIGNMENT};
use crate::quantize::use_more_bits;

/// The tensor types of a generated file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMix {
    /// Every matrix in one type (norms f32).
    Uniform(GgmlDType),
    /// llama.cpp's Q4_K_M: Q6_K for `attn_v` and `ffn_down` in the first and last eighth of
    /// the layers and every third layer between (`use_more_bits`), and for `output`; Q4_K
    /// for every other matrix.
    Q4KM,
}

impl QuantMix {
    /// The type of tensor `name` in a model of `layers` layers.
    pub fn type_of(self, name: &str, layers: usize) -> GgmlDType {
        if is_norm(name) {
            return GgmlDType::F32;
        }
        match self {
            QuantMix::Uniform(t) => t,
            QuantMix::Q4KM => {
                let more_bits = |i: usize| use_more_bits(i, layers);
                let layer = name
                    .strip_prefix("blk.")
                    .and_then(|r| r.split('.').next())
                    .and_then(|n| n.parse::<usize>().ok());
                let wide = name == "output.weight"
                    || ((name.contains(".attn_v.") || name.contains(".ffn_down."))
                        && layer.is_some_and(more_bits));
                if wide {
                    GgmlDType::Q6K
                } else {
                    GgmlDType::Q4K
                }
            }
        }
    }
}

/// Whether tensor `name` is a norm's weight vector (always f32).
pub(super) fn is_norm(name: &str) -> bool {
    name.ends_with("_norm.weight")
}

/// The shape of a llama-architecture model.
#[derive(Debug, Clone)]
pub struct ShapeSpec {
    /// `general.name`.
    pub name: String,
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub vocab: usize,
    pub context: usize,
    /// No `output.weight`: the embedding is the output matrix.
    pub tied_embeddings: bool,
    pub mix: QuantMix,
}

impl ShapeSpec {
    /// Meta Llama 3 8B (GQA 32/8, 128,256 tokens) in `mix`.
    pub fn llama3_8b(mix: QuantMix) -> Self {
        Self {
            name: "Meta-Llama-3-8B-Instruct".into(),
            layers: 32,
            hidden: 4096,
            ffn: 14336,
            heads: 32,
            kv_heads: 8,
            vocab: 128_256,
            context: 8192,
            tied_embeddings: false,
            mix,
        }
    }

    /// Meta Llama 3.2 1B (GQA 32/8, 128,256 tokens, tied embeddings) in `mix`.
    pub fn llama32_1b(mix: QuantMix) -> Self {
        Self {
            name: "Llama-3.2-1B-Instruct".into(),
            layers: 16,
            hidden: 2048,
            ffn: 8192,
            heads: 32,
            kv_heads: 8,
            vocab: 128_256,
            context: 8192,
            tied_embeddings: true,
            mix,
        }
    }

    /// Every tensor the forward pass reads: (name, dims in GGUF order (columns first), type).
    fn tensors(&self) -> Vec<(String, Vec<u64>, GgmlDType)> {
        let (d, f) = (self.hidden as u64, self.ffn as u64);
        let head_dim = d / self.heads as u64;
        let (q, kv) = (
            self.heads as u64 * head_dim,
            self.kv_heads as u64 * head_dim,
        );
        let mut names: Vec<(String, Vec<u64>)> =
            vec![("token_embd.weight".into(), vec![d, self.vocab as u64])];
        for i in 0..self.layers {
            let p = |t: &str| format!("blk.{i}.{t}.weight");
            names.extend([
                (p("attn_norm"), vec![d]),
                (p("attn_q"), vec![d, q]),
                (p("attn_k"), vec![d, kv]),
                (p("attn_v"), vec![d, kv]),
                (p("attn_output"), vec![q, d]),
                (p("ffn_norm"), vec![d]),
                (p("ffn_gate"), vec![d, f]),
                (p("ffn_up"), vec![d, f]),
                (p("ffn_down"), vec![f, d]),
            ]);
        }
        names.push(("output_norm.weight".into(), vec![d]));
        if !self.tied_embeddings {
            names.push(("output.weight".into(), vec![d, self.vocab as u64]));
        }
        names
            .into_iter()
            .map(|(name, dims)| {
                let t = self.mix.type_of(&name, self.layers);
                (name, dims, t)
            })
            .collect()
    }
}

/// Writes `spec`'s header to `path` and sizes the file to hold every tensor, without writing
/// the data (it reads as zeros).
pub fn write_shape_gguf(path: &Path, spec: &ShapeSpec) -> std::io::Result<()> {
    let layout = ShapeLayout::new(spec, Vec::new())?;
    let mut file = std::fs::File::create(path)?;
    file.write_all(&layout.header)?;
    file.set_len(layout.header.len() as u64 + layout.data_bytes())
}

/// A shape file's header and its tensors, in the order their data follows it.
pub(super) struct ShapeLayout {
    /// The header, padded to where the data starts.
    pub header: Vec<u8>,
    pub tensors: Vec<TensorEntry>,
}

impl ShapeLayout {
    /// The layout of `spec` with `extra` metadata (a tokenizer, say) after the model's own.
    pub fn new(spec: &ShapeSpec, extra: Vec<(String, Value)>) -> std::io::Result<Self> {
        let arch = "llama";
        let uints = [
            ("context_length", spec.context),
            ("embedding_length", spec.hidden),
            ("block_count", spec.layers),
            ("feed_forward_length", spec.ffn),
            ("attention.head_count", spec.heads),
            ("attention.head_count_kv", spec.kv_heads),
            ("vocab_size", spec.vocab),
        ];
        let mut metadata = vec![
            (
                "general.architecture".to_owned(),
                Value::String(arch.into()),
            ),
            ("general.name".to_owned(), Value::String(spec.name.clone())),
        ];
        metadata.extend(
            uints
                .iter()
                .map(|(key, v)| (format!("{arch}.{key}"), Value::U32(*v as u32))),
        );
        // Llama 3's, so llama.cpp loads the file too (it needs the norm epsilon).
        metadata.extend([
            (
                format!("{arch}.attention.layer_norm_rms_epsilon"),
                Value::F32(1e-5),
            ),
            (format!("{arch}.rope.freq_base"), Value::F32(500_000.0)),
        ]);
        metadata.extend(extra);
        let tensors: Vec<TensorEntry> = spec
            .tensors()
            .into_iter()
            .map(|(name, dims, dtype)| TensorEntry { name, dims, dtype })
            .collect();
        let (header, _) = gguf_write::header(&metadata, &tensors, DEFAULT_ALIGNMENT)?;
        Ok(Self { header, tensors })
    }

    /// Length of the data section: every tensor padded to the alignment.
    pub fn data_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.bytes().next_multiple_of(DEFAULT_ALIGNMENT))
            .sum()
    }
}
