//! The inference engine: GGUF models, paged KV cache, continuous batching, serving.
