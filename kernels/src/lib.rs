//! CPU kernels for the forward pass: the default backend and the oracle for every other one.
//!
//! Every kernel works on plain row-major `f32` slices (weights of the quantised matmul are the
//! raw GGUF bytes) and follows the ggml/llama.cpp definition of the operation, so a model run
//! through these kernels matches llama.cpp. Shapes are checked with `assert!`: a mismatch is a
//! bug in the caller, not a request error, exactly like an out-of-bounds slice index.
//!
//! Threading: kernels split large work across the current rayon pool. Call them from inside
//! `ThreadPool::install` (run the whole forward pass there): a call from a thread outside the
//! pool also pays a cross-thread hand-off each time, which measured 2-5x the cost of a decode
//! step's attention or matmul on the 2-core dev machine.

pub mod activation;
pub mod attention;
pub mod kv_cache;
pub mod norm;
pub mod quant;
pub mod rope;
mod simd;

pub use activation::silu_mul;
pub use attention::{paged_attention, AttentionSeq};
pub use kv_cache::write_kv;
pub use norm::rms_norm;
pub use quant::dot::DotKernel;
pub use quant::matmul::{matmul_q4_1, matmul_q4_1_with};
pub use quant::q4_1::{dequantize_q4_1, q4_1_row_bytes, Q4_1_BLOCK_BYTES, QK};
pub use rope::{Rope, RopeStyle};

/// Work (in elements) below which splitting across rayon threads costs more than it saves.
pub(crate) const PAR_MIN_ELEMS: usize = 1 << 14;

#[cfg(test)]
pub(crate) mod test_util {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Deterministic RNG for a test case.
    pub fn rng(seed: u64) -> StdRng {
        StdRng::seed_from_u64(seed)
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub fn random_vec(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    }

    /// Asserts `|a - b| <= atol + rtol * |b|` element-wise, naming the first offender.
    pub fn assert_close(a: &[f32], b: &[f32], atol: f32, rtol: f32) {
        assert_eq!(a.len(), b.len(), "length mismatch");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let tol = atol + rtol * y.abs();
            assert!(
                (x - y).abs() <= tol && x.is_finite() == y.is_finite(),
                "element {i}: got {x}, expected {y} (tolerance {tol})"
            );
        }
    }
}
