//! Tokenizers built from GGUF metadata, streaming detokenisation, stop strings and chat
//! templates.
//!
//! The tokenizers reproduce llama.cpp (`llama-vocab.cpp`, `unicode.cpp`) exactly: byte-level
//! BPE with the `default`, `gpt-2`, `llama3`, `qwen2` and `smollm` pre-tokenizers, and
//! SentencePiece with byte fallback. They are checked against llama.cpp's own test vectors.
//!
//! ```no_run
//! use tidal_tokenizer::{StreamDecoder, Tokenizer};
//! let tok = Tokenizer::from_gguf_file("model.gguf")?;
//! let ids = tok.encode("<|im_start|>user\nHi<|im_end|>\n", false);
//! let mut dec = StreamDecoder::new();
//! let text: String = ids.iter().map(|&id| dec.push(&tok, id)).collect();
//! # Ok::<(), tidal_tokenizer::TokenizerError>(())
//! ```

mod bpe;
pub mod chat_template;
mod error;
pub mod pretokenize;
mod special;
mod spm;
pub mod stop;
pub mod stream;
mod strftime;
mod tokenizer;
mod vocab;

pub use chat_template::{ChatMessage, ChatTemplate};
pub use error::{ChatTemplateError, TokenizerError};
pub use stop::{StopMatcher, StopOutput};
pub use stream::StreamDecoder;
pub use tokenizer::{Kind, Tokenizer};
