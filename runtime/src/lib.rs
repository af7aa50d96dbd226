//! The inference engine: GGUF models, paged KV cache, continuous batching, serving.
pub mod model;
pub mod kv_cache;
pub mod scheduler;
pub mod sampling;
pub mod engine;
pub mod server;
pub mod bench;
