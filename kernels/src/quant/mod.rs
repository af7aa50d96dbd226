//! GGUF quantised weights: the ggml Q4_0, Q4_1, Q5_0 and Q8_0 block formats against Q8_1
//! activations, the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) against Q8_K activations, and
//! the quantised matmul (one weight row at a time for decode and small batches, an
//! interleaved-panel GEMM for larger batches, on AMX tiles for the 32-weight formats where the
//! CPU has them; the same arithmetic per output in every path), and the quantisers that write
//! every one of these formats from f32 as llama.cpp's reference quantisers do.

pub mod dot;
#[cfg(target_arch = "x86_64")]
mod dot16_avx512;
#[cfg(target_arch = "x86_64")]
mod dot8_avx2;
#[cfg(target_arch = "x86_64")]
mod dot_avx2;
#[cfg(target_arch = "x86_64")]
mod dot_avx512;
#[cfg(target_arch = "x86_64")]
mod dot_lanes_avx512;
pub mod format;
#[cfg(target_arch = "x86_64")]
mod gemm_amx;
#[cfg(target_arch = "x86_64")]
mod gemm_avx2;
#[cfg(target_arch = "x86_64")]
mod gemm_avx512;
#[cfg(target_arch = "x86_64")]
mod kdot16_avx512;
#[cfg(target_arch = "x86_64")]
mod kdot_avx2;
pub mod kformat;
#[cfg(target_arch = "x86_64")]
mod kgemm_amx;
#[cfg(target_arch = "x86_64")]
mod kgemm_avx512;
mod kpanel16;
pub mod matmul;
pub mod matmul_x16;
mod panel;
mod panel16;
mod q2_k;
mod q3_k;
pub mod q4_0;
pub mod q4_1;
mod q4_k;
pub mod q4_k_x16;
pub mod q5_0;
mod q5_k;
mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;
pub mod quantize_32;
pub mod quantize_k;
pub mod quantize_k_low;
mod quantize_search;
#[cfg(test)]
mod tests_cuda_formats;
#[cfg(test)]
mod tests_k;
#[cfg(test)]
mod tests_quantize;
#[cfg(test)]
mod tests_requantize_real;
