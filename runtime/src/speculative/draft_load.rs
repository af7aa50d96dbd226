//! Loading the draft model (`--draft-model`): the same loader as the target's, a vocabulary
//! that must be the target's token for token, and a KV cache of its own on the engine's
//! device.

use std::path::PathBuf;

use tidal_tokenizer::{Tokenizer, TokenizerError};

use super::draft::DraftProposer;
use super::draft_cache::DraftCache;
use crate::engine::{EngineConfig, Executor};
use crate::kv_cache::KvCacheError;
use crate::model::{Model, ModelError, ModelFile};

/// Why the draft model cannot propose for this target.
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    /// `--speculative draft` without `--draft-model`.
    #[error("--speculative draft needs a draft model (--draft-model)")]
    Missing,
    /// The file could not be read, or its weights loaded.
    #[error("draft model {path}: {source}")]
    Model {
        /// The draft's file.
        path: PathBuf,
        /// What went wrong.
        source: ModelError,
    },
    /// The draft's GGUF holds no usable tokenizer.
    #[error("draft model {path}: tokenizer: {source}")]
    Tokenizer {
        /// The draft's file.
        path: PathBuf,
        /// What went wrong.
        source: TokenizerError,
    },
    /// The vocabularies have different sizes.
    #[error(
        "the draft model's vocabulary is not the target's: {draft} tokens in the draft, {target} in the target"
    )]
    VocabularySize {
        /// Tokens of the target's vocabulary.
        target: usize,
        /// Tokens of the draft's.
        draft: usize,
    },
    /// A token id names different tokens.
    #[error(
        "the draft model's vocabulary is not the target's: token {id} is {draft:?} in the draft, {target:?} in the target"
    )]
    VocabularyToken {
        /// The first id that differs.
        id: u32,
        /// Its token in the target.
        target: String,
        /// Its token in the draft.
        draft: String,
    },
    /// The draft's output layer scores a different number of tokens.
    #[error("the draft model scores {draft} tokens, the target {target}")]
    Logits {
        /// Rows of the target's logits.
        target: usize,
        /// Rows of the draft's.
        draft: usize,
    },
    /// The draft's KV cache cannot be built.
    #[error("draft KV cache: {0}")]
    Cache(#[from] KvCacheError),
    /// The draft cannot run on the engine's device.
    #[error("draft model on {device}: {message}")]
    Device {
        /// The engine's device.
        device: String,
        /// Why.
        message: String,
    },
}

/// Checks that `draft` names every token id as `target` does.
pub fn check_vocabulary(target: &Tokenizer, draft: &Tokenizer) -> Result<(), DraftError> {
    if target.vocab_size() != draft.vocab_size() {
        return Err(DraftError::VocabularySize {
            target: target.vocab_size(),
            draft: draft.vocab_size(),
        });
    }
    for id in 0..target.vocab_size() as u32 {
        let (t, d) = (target.token_text(id), draft.token_text(id));
        if t != d {
            return Err(DraftError::VocabularyToken {
                id,
                target: t.unwrap_or_default().to_owned(),
                draft: d.unwrap_or_default().to_owned(),
            });
        }
    }
    Ok(())
}

/// Loads the draft model `config.speculative` names for a target with `tokenizer`, whose
/// forward pass scores `target_vocab` tokens and reads `target_weight_bytes` per step, and
/// whose KV cache has `target_blocks` blocks.
pub(crate) fn load_draft(
    config: &EngineConfig,
    tokenizer: &Tokenizer,
    target_vocab: usize,
    target_weight_bytes: usize,
    target_blocks: usize,
) -> Result<DraftProposer, DraftError> {
    let spec = &config.speculative;
    let path = spec.draft_model.clone().ok_or(DraftError::Missing)?;
    let model_error = |source| DraftError::Model {
        path: path.clone(),
        source,
    };
    let file = ModelFile::open(&path).map_err(model_error)?;
    let draft_tokenizer =
        Tokenizer::from_gguf(file.content()).map_err(|source| DraftError::Tokenizer {
            path: path.clone(),
            source,
        })?;
    check_vocabulary(tokenizer, &draft_tokenizer)?;
    let model = Model::load(&file, spec.draft_quantize).map_err(model_error)?;
    if model.config().vocab_size != target_vocab {
        return Err(DraftError::Logits {
            target: target_vocab,
            draft: model.config().vocab_size,
        });
    }
    // Until measured, a step is assumed to cost what it reads (decode is bound by reading
    // the weights on every device this runs on).
    let assumed_cost = model.weight_bytes() as f64 / target_weight_bytes.max(1) as f64;
    // As many tokens as the target's cache, and one block per sequence for the draft tokens
    // fed beyond the sequence.
    let num_blocks = spec
        .draft_kv_blocks
        .unwrap_or(target_blocks + config.max_num_seqs);
    let executor = Executor::new(model, config, num_blocks).map_err(|e| DraftError::Device {
        device: config.device.to_string(),
        message: e.to_string(),
    })?;
    tracing::info!(
        path = %path.display(),
        blocks = num_blocks,
        kv_mib = executor.kv_memory_bytes() >> 20,
        assumed_cost = format!("{assumed_cost:.3}"),
        "draft model loaded"
    );
    let cache = DraftCache::new(num_blocks, config.block_size)?;
    Ok(DraftProposer::new(
        executor,
        cache,
        config.max_num_batched_tokens,
        spec.draft_cost,
        assumed_cost,
    ))
}
