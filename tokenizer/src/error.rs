//! Typed errors of the crate.

use thiserror::Error;

/// Why a tokenizer could not be built from a GGUF file.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// The GGUF file could not be opened or parsed.
    #[error("cannot read GGUF file {path}: {reason}")]
    Read {
        /// The file that was read.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A required metadata key is absent.
    #[error("GGUF metadata key `{0}` is missing")]
    MissingKey(&'static str),
    /// A metadata key has the wrong type or an impossible value.
    #[error("GGUF metadata key `{key}` is invalid: {reason}")]
    BadMetadata {
        /// The offending key.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer family this crate does not implement.
    #[error("unsupported tokenizer model `{0}` (supported: `gpt2` BPE, `llama` SentencePiece)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error(
        "unsupported BPE pre-tokenizer `{0}` (supported: default, gpt-2, llama3/llama-bpe, qwen2, smollm)"
    )]
    UnsupportedPreTokenizer(String),
}

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, Error)]
pub enum ChatTemplateError {
    /// The model carries no `tokenizer.chat_template` (callers answer chat requests with a 400).
    #[error("the model has no chat template (GGUF key `tokenizer.chat_template`)")]
    Missing,
    /// The template does not parse.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`: the message is the template's own
    /// complaint about the conversation (e.g. roles not alternating), so it is a client error.
    #[error("{0}")]
    Raised(String),
    /// Rendering failed for another reason (undefined filter, type error, ...).
    #[error("chat template failed to render: {0}")]
    Render(String),
}
