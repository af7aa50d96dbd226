//! Tokenizers built from GGUF metadata, streaming detokenisation and chat templates.
