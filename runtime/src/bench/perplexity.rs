//! Perplexity of a model on a text through the real forward pass and paged KV cache, so the
//! KV cache dtype's rounding shows in the figure; and how many tokens and sequences a KV
//! memory budget holds per dtype.
//!
//! Follows llama.cpp's `perplexity` tool: the tokens are cut into chunks of `context` tokens,
//! each chunk is evaluated from an empty cache, and only the second half of each chunk is
//! scored (every scored token sees at least `context / 2` tokens of context). A chunk runs in
//! forward calls of `batch` tokens; every token reads all earlier positions of its chunk from
//! the KV cache (its own K/V included), exactly as in serving. For a model whose tokenizer
//! adds BOS to prompts, llama.cpp tokenizes the text with its BOS and starts every chunk with
//! BOS in place of the chunk's first token, because such a model (Gemma) predicts far worse
//! without one: the caller encodes so, and [`PerplexityOptions::chunk_start`] does the rest.

use std::time::Instant;

use serde::Serialize;

use crate::model::{ForwardBatch, ForwardSeq, KvDtype, KvStorage, Model, ModelConfig, ModelError};

/// Settings of one perplexity run.
#[derive(Debug, Clone)]
pub struct PerplexityOptions {
    /// KV cache element type.
    pub kv_cache_dtype: KvDtype,
    /// Tokens per chunk (llama.cpp's `n_ctx`); the second half of each chunk is scored.
    pub context: usize,
    /// Tokens per forward call.
    pub batch: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Kernel threads (`None`: one per core).
    pub threads: Option<usize>,
    /// The token every chunk starts with in place of its own first token: the model's BOS
    /// when its tokenizer adds one (as llama.cpp), `None` to evaluate the chunks as cut.
    pub chunk_start: Option<u32>,
}

impl Default for PerplexityOptions {
    fn default() -> Self {
        Self {
            kv_cache_dtype: KvDtype::F32,
            context: 512,
            batch: 128,
            block_size: 16,
            threads: None,
            chunk_start: None,
        }
    }
}

/// Result of one perplexity run.
#[derive(Debug, Clone, Serialize)]
pub struct PerplexityReport {
    pub kv_cache_dtype: String,
    pub context: usize,
    pub chunks: usize,
    pub tokens_scored: usize,
    /// Mean negative log-likelihood (nats) of the scored tokens.
    pub mean_nll: f64,
    /// `exp(mean_nll)`.
    pub perplexity: f64,
    /// Tokens evaluated (scored or not) per second of wall time.
    pub tokens_per_second: f64,
}

/// Perplexity of `model` on `tokens`, on a kernel thread pool of its own (the forward pass
/// runs on one of its workers, as the engine's loop does).
///
/// # Errors
/// If `tokens` does not hold one chunk of `context` tokens (with `context >= 4`), the threads
/// cannot start, or the forward pass fails.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    options: &PerplexityOptions,
) -> Result<PerplexityReport, ModelError> {
    let pool = crate::engine::kernel_pool(options.threads)
        .map_err(|e| ModelError::Kernel(format!("cannot start kernel threads: {e}")))?;
    pool.install(|| evaluate(model, tokens, options))
}

fn evaluate(
    model: &Model,
    tokens: &[u32],
    options: &PerplexityOptions,
) -> Result<PerplexityReport, ModelError> {
    let context = options.context;
    let chunks = tokens.len() / context.max(1);
    if context < 4 || chunks == 0 || options.batch == 0 || options.block_size == 0 {
        return Err(ModelError::Kernel(format!(
            "perplexity needs at least one chunk of context >= 4 tokens and a batch and block \
             size > 0: {} tokens, context {context}, batch {}, block size {}",
            tokens.len(),
            options.batch,
            options.block_size
        )));
    }
    let vocab = model.config().vocab_size;
    let num_blocks = context.div_ceil(options.block_size);
    let table: Vec<u32> = (0..num_blocks as u32).collect();
    let mut kv = KvStorage::new(
        model.config(),
        options.kv_cache_dtype,
        num_blocks,
        options.block_size,
    );
    let first_scored = context / 2;
    let started = Instant::now();
    let mut nll = 0.0f64;
    let mut scored = 0usize;
    let mut chunk = Vec::with_capacity(context);
    for cut in tokens.chunks_exact(context) {
        chunk.clear();
        chunk.extend_from_slice(cut);
        if let Some(first) = options.chunk_start {
            chunk[0] = first;
        }
        let mut start = 0;
        while start < context {
            let end = (start + options.batch).min(context);
            // One single-token "sequence" per position, all on the chunk's block table: the
            // same K/V writes and causal reads as one prefill, but with logits at every
            // position (only those that are scored ask for them).
            let batch = ForwardBatch {
                seqs: (start..end)
                    .map(|pos| ForwardSeq {
                        tokens: &chunk[pos..pos + 1],
                        start_pos: pos,
                        block_table: &table,
                        num_logits: usize::from(pos >= first_scored && pos + 1 < context),
                    })
                    .collect(),
            };
            let logits = model.forward(&batch, &mut kv)?;
            let targets = (start.max(first_scored)..end.min(context - 1)).map(|pos| chunk[pos + 1]);
            for (row, target) in logits.chunks_exact(vocab).zip(targets) {
                nll += negative_log_likelihood(row, target as usize);
                scored += 1;
            }
            start = end;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let mean_nll = nll / scored.max(1) as f64;
    Ok(PerplexityReport {
        kv_cache_dtype: options.kv_cache_dtype.name().to_string(),
        context,
        chunks,
        tokens_scored: scored,
        mean_nll,
        perplexity: mean_nll.exp(),
        tokens_per_second: (chunks * context) as f64 / seconds.max(1e-9),
    })
}

/// `-log softmax(logits)[target]`, computed in f64 after subtracting the maximum.
fn negative_log_likelihood(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    sum.ln() + max - logits[target] as f64
}

/// What a KV memory budget holds for one dtype.
#[derive(Debug, Clone, Serialize)]
pub struct KvCapacity {
    pub kv_cache_dtype: String,
    pub kv_cache_memory: usize,
    /// K and V bytes per token across all layers, int8 scales included.
    pub bytes_per_token: usize,
    pub blocks: usize,
    pub tokens: usize,
    /// Tokens of each sequence in `sequences`.
    pub sequence_tokens: usize,
    /// Sequences of `sequence_tokens` that fit at once (each holds whole blocks).
    pub sequences: usize,
}

/// How many tokens, and sequences of `sequence_tokens`, fit in `memory` bytes of KV cache.
pub fn kv_capacity(
    model: &ModelConfig,
    dtype: KvDtype,
    memory: usize,
    block_size: usize,
    sequence_tokens: usize,
) -> KvCapacity {
    let bytes_per_token = model.kv_bytes_per_token(dtype);
    let blocks = KvStorage::blocks_for_memory(memory, block_size, bytes_per_token);
    KvCapacity {
        kv_cache_dtype: dtype.name().to_string(),
        kv_cache_memory: memory,
        bytes_per_token,
        blocks,
        tokens: blocks * block_size,
        sequence_tokens,
        sequences: blocks / sequence_tokens.div_ceil(block_size.max(1)).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_is_the_log_softmax() {
        let logits = [1.0f32, 2.0, 3.0];
        let z: f64 = logits.iter().map(|l| (*l as f64).exp()).sum();
        for t in 0..3 {
            let want = -((logits[t] as f64).exp() / z).ln();
            assert!((negative_log_likelihood(&logits, t) - want).abs() < 1e-12);
        }
        // Huge logits do not overflow.
        assert!(negative_log_likelihood(&[1e30, 0.0], 0).abs() < 1e-9);
    }

    fn tiny_model() -> (std::path::PathBuf, Model) {
        use crate::model::{write_tiny_gguf, ModelFile, TinySpec};
        let dir = std::env::temp_dir().join(format!("tidal-ppl-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        write_tiny_gguf(&path, &TinySpec::default()).unwrap();
        let file = ModelFile::open(&path).unwrap();
        (dir, Model::load(&file, None).unwrap())
    }

    /// The batched evaluation equals plain token-by-token decoding of every chunk.
    #[test]
    fn matches_token_by_token_decoding_and_dtypes_stay_close() {
        let (dir, model) = tiny_model();
        let tokens: Vec<u32> = (0..70u32).map(|i| (i * 13 + 5) % 90 + 2).collect();
        let options = PerplexityOptions {
            context: 16,
            batch: 5,
            block_size: 4,
            ..PerplexityOptions::default()
        };
        let report = perplexity(&model, &tokens, &options).unwrap();
        assert_eq!(report.chunks, 4);
        assert_eq!(report.tokens_scored, 4 * 7);

        let vocab = model.config().vocab_size;
        let table: Vec<u32> = (0..4).collect();
        let mut nll = 0.0;
        for chunk in tokens.chunks_exact(16) {
            let mut kv = KvStorage::new(model.config(), KvDtype::F32, 4, 4);
            for pos in 0..16 {
                let batch = ForwardBatch {
                    seqs: vec![ForwardSeq {
                        tokens: &chunk[pos..pos + 1],
                        start_pos: pos,
                        block_table: &table,
                        num_logits: 1,
                    }],
                };
                let logits = model.forward(&batch, &mut kv).unwrap();
                if (8..15).contains(&pos) {
                    nll += negative_log_likelihood(&logits[..vocab], chunk[pos + 1] as usize);
                }
            }
        }
        let want = nll / 28.0;
        assert!(
            (report.mean_nll - want).abs() < 1e-4,
            "{} vs {want}",
            report.mean_nll
        );

        for dtype in [KvDtype::F16, KvDtype::Int8] {
            let other = perplexity(
                &model,
                &tokens,
                &PerplexityOptions {
                    kv_cache_dtype: dtype,
                    ..options.clone()
                },
            )
            .unwrap();
            assert_eq!(other.kv_cache_dtype, dtype.name());
            let rel = (other.perplexity / report.perplexity - 1.0).abs();
            assert!(
                rel < 0.02,
                "{dtype}: {} vs {}",
                other.perplexity,
                report.perplexity
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// With a chunk start, each chunk is evaluated as if its first token were that one, and
    /// only the first token changes: the same as cutting the chunks by hand.
    #[test]
    fn a_chunk_start_replaces_each_chunks_first_token() {
        let (dir, model) = tiny_model();
        let tokens: Vec<u32> = (0..48u32).map(|i| (i * 7 + 3) % 90 + 2).collect();
        let options = PerplexityOptions {
            context: 16,
            batch: 6,
            block_size: 4,
            ..PerplexityOptions::default()
        };
        let with_start = PerplexityOptions {
            chunk_start: Some(1),
            ..options.clone()
        };
        let started = perplexity(&model, &tokens, &with_start).unwrap();
        let mut by_hand = tokens.clone();
        for chunk in by_hand.chunks_exact_mut(16) {
            chunk[0] = 1;
        }
        let want = perplexity(&model, &by_hand, &options).unwrap();
        assert_eq!(started.mean_nll, want.mean_nll);
        let plain = perplexity(&model, &tokens, &options).unwrap();
        assert_ne!(
            plain.mean_nll, started.mean_nll,
            "the start token must matter"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn refuses_text_shorter_than_one_chunk() {
        let (dir, model) = tiny_model();
        let err = perplexity(&model, &[2, 3, 4], &PerplexityOptions::default()).unwrap_err();
        assert!(err.to_string().contains("at least one chunk"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn capacity_grows_with_smaller_dtypes() {
        let c = ModelConfig {
            architecture: crate::model::Architecture::Llama,
            name: None,
            context_length: 8192,
            hidden_size: 576,
            num_layers: 30,
            ffn_size: 1536,
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 1e5,
            rope_scaling: crate::model::RopeScaling::None,
            vocab_size: 49152,
            attention_scale: 0.125,
            sliding_window: None,
        };
        let cap = |d| kv_capacity(&c, d, 1 << 30, 16, 256);
        let (f32c, f16c, i8c) = (cap(KvDtype::F32), cap(KvDtype::F16), cap(KvDtype::Int8));
        assert_eq!(f32c.bytes_per_token, 46080);
        assert_eq!(f32c.blocks, (1 << 30) / (16 * 46080));
        assert_eq!(f32c.sequences, f32c.blocks / 16);
        assert_eq!(f16c.bytes_per_token * 2, f32c.bytes_per_token);
        assert_eq!(i8c.bytes_per_token, 2 * 30 * 3 * 68);
        assert!(f16c.sequences >= 2 * f32c.sequences - 1);
        assert!(i8c.sequences * 100 >= 370 * f32c.sequences);
    }
}
