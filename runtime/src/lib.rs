//! The inference engine: GGUF models, paged KV cache, continuous batching, serving.
pub mod bench;
pub mod engine;
pub mod kv_cache;
pub mod load;
pub mod logprobs;
pub mod memory;
pub mod model;
pub mod quantize;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod speculative;
pub mod worker;
