//! GGUF quantised weights: the ggml Q4_0, Q4_1 and Q8_0 block formats, Q8_1 activations,
//! and the quantised matmul (row dot products for decode, an interleaved-panel GEMM for
//! batches).

pub mod dot;
#[cfg(target_arch = "x86_64")]
mod dot_avx2;
pub mod format;
#[cfg(target_arch = "x86_64")]
mod gemm_avx2;
pub mod matmul;
mod panel;
pub mod q4_0;
pub mod q4_1;
pub mod q8_0;
pub mod q8_1;
