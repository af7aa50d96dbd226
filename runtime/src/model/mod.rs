//! Model execution: memory-mapped GGUF weights and our own batched forward pass.
//!
//! Weights stay in the memory-mapped file (quantised blocks are read in place by the matmul
//! kernels), activations are plain `f32` rows. One forward call takes a flat batch of tokens
//! from many sequences — prefill chunks and decode steps mixed — and a block table per
//! sequence into the paged KV cache, the way vLLM's model runner does.

mod batch;
mod config;
#[cfg(feature = "cuda")]
mod cuda;
mod error;
mod file;
mod forward;
pub(crate) mod gguf_write;
mod kv_storage;
mod shape_gguf;
mod shape_random;
mod tiny;
mod weight;
mod weights;

pub(crate) use config::optional_uint;
pub use config::{Architecture, FfnActivation, ModelConfig, RopeScaling, SlidingWindow};
#[cfg(feature = "cuda")]
pub use cuda::CudaModel;
pub use error::ModelError;
pub use file::ModelFile;
pub use forward::{ForwardBatch, ForwardSeq, Model};
pub use kv_storage::KvStorage;
pub use shape_gguf::{write_shape_gguf, QuantMix, ShapeSpec};
pub use shape_random::write_random_shape_gguf;
pub use tidal_kernels::KvDtype;
pub use tiny::{write_tiny_gguf, TinyModelError, TinySpec};
pub(crate) use weight::{dequantize_bytes, loaded_type, matrix_bytes, own_kernel_type};
pub use weight::{Activations, QuantizeTo, Weight};
