//! GGUF quantised weights: the ggml Q4_0, Q4_1 and Q8_0 block formats, Q8_1 activations,
//! and the quantised matmul (one weight row at a time for decode and small batches, an
//! interleaved-panel GEMM for larger batches, on AMX tiles where the CPU has them; the same arithmetic per output in every path).

pub mod dot;
#[cfg(target_arch = "x86_64")]
mod dot_avx2;
pub mod format;
#[cfg(target_arch = "x86_64")]
mod gemm_amx;
#[cfg(target_arch = "x86_64")]
mod gemm_avx2;
#[cfg(target_arch = "x86_64")]
mod gemm_avx512;
pub mod matmul;
mod panel;
mod panel16;
pub mod q4_0;
pub mod q4_1;
pub mod q8_0;
pub mod q8_1;
