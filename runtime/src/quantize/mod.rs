//! `tidal quantize`: GGUF files requantised into llama.cpp's quantisation mixes (Q4_K_M,
//! Q6_K, ...) with our own quantisers (`tidal_kernels`' ports of ggml's reference ones), so
//! a model can be produced from any file the runtime reads, and tests can make K-quant
//! fixtures from generated models.

mod file;
mod ftype;
mod mix;

pub use file::{quantize_file, QuantizeError, QuantizeSummary, TensorOutcome};
pub use ftype::FileType;
pub use mix::{llama_order, plan_types, use_more_bits, ModelFacts, NoFallback, TensorDesc};

#[cfg(test)]
mod tests;
