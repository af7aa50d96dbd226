//! CUDA backend (feature `cuda`): the CPU kernels of this crate, on an NVIDIA GPU.
//!
//! Nothing CUDA is needed to build: cudarc loads `libcuda` and `libnvrtc` at run time, and
//! the kernel source (`kernels.cu`) is compiled by NVRTC when a [`Gpu`] is opened, for that
//! device's architecture. Each kernel mirrors the CPU kernel of the same name, which is its
//! oracle in the tests (`tests.rs`, run when a GPU is present, skipped with a message
//! otherwise). Layouts are the CPU ones, so a KV cache or an activation row means the same
//! bytes on both sides:
//! - activations: row-major `f32`;
//! - weights: the raw GGUF blocks of every type the CPU kernels read (Q4_0, Q4_1, Q5_0, Q8_0
//!   and the K-quants), f16 rows for f16, bf16 and f32 matrices;
//! - KV cache: `[num_slots, n_kv_heads, head_dim]` in f32, f16 or int8 with one f32 scale per
//!   (slot, KV head), as [`crate::kv_cache`].

mod buffers;
mod device;
mod ops;
#[cfg(test)]
mod tests;

pub use buffers::{GpuKvBuffer, GpuMatrix, GpuWeightFormat, GPU_BLOCK_TYPES};
pub use cudarc::driver::CudaSlice;
pub use device::{compile_kernels, device_memory, nvrtc_available, CudaError, Gpu};
pub use ops::AttentionBatch;

/// The CUDA C source of every kernel.
pub const KERNEL_SOURCE: &str = include_str!("kernels.cu");
