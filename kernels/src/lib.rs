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
#[cfg(target_arch = "x86_64")]
mod amx;
pub mod attention;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod kv_cache;
pub mod norm;
mod prefetch;
pub mod quant;
pub mod rope;
mod simd;
#[cfg(target_arch = "x86_64")]
mod vexp;
pub mod warm;

pub use activation::{gelu_mul, silu_mul};
pub use attention::{paged_attention, paged_attention_windowed, AttentionSeq};
pub use kv_cache::{write_kv, KvBuffer, KvCache, KvCacheMut, KvDtype};
pub use norm::{rms_norm, rms_norm_in_place};
pub use quant::dot::DotKernel;
pub use quant::format::QuantType;
pub use quant::kformat::QK_K;
pub use quant::matmul::{
    matmul, matmul_quantized, matmul_with, QuantizedActivations, AMX_MIN_ROWS, KPANEL16_MIN_ROWS,
    PANEL16_MIN_ROWS, PANEL_MIN_ROWS,
};
pub use quant::matmul_x16::{matmul_q4_k_x16, reads_q4_k_x16};
pub use quant::q4_0::{dequantize_q4_0, Q4_0_BLOCK_BYTES};
pub use quant::q4_1::{dequantize_q4_1, Q4_1_BLOCK_BYTES, QK};
pub use quant::q4_k_x16::{
    repack as repack_q4_k_x16, repack_into as repack_q4_k_x16_into, row as q4_k_x16_row,
    GROUP_ROWS as Q4_K_X16_GROUP_ROWS,
};
pub use quant::q5_0::{dequantize_q5_0, Q5_0_BLOCK_BYTES};
pub use quant::q8_0::{dequantize_q8_0, Q8_0_BLOCK_BYTES};
pub use quant::quantize_32::{dequantize_q5_1, quantize_q5_1, Q5_1_BLOCK_BYTES};
pub use rope::{Rope, RopeStyle};
pub use warm::with_warm_workers;

/// Work (in elements) below which splitting across rayon threads costs more than it saves.
pub(crate) const PAR_MIN_ELEMS: usize = 1 << 14;

#[cfg(test)]
pub(crate) mod test_util {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Records that the calling test skips (no GPU, no NVRTC, no oracle program):
    /// `scripts/test.sh` counts the lines of `$TIDAL_SKIP_LOG` as skipped, not passed.
    pub fn skip(why: &str) {
        use std::io::Write;
        let test = std::thread::current().name().unwrap_or("?").to_owned();
        eprintln!("skipped {test}: {why}");
        if let Some(path) = std::env::var_os("TIDAL_SKIP_LOG") {
            if let Ok(mut log) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = writeln!(log, "{test}: {why}");
            }
        }
    }

    /// Deterministic RNG for a test case.
    pub fn rng(seed: u64) -> StdRng {
        StdRng::seed_from_u64(seed)
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub fn random_vec(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    }

    /// Row `slot` of a KV cache widened to f32 (int8 rows times their scales).
    pub fn read_row(
        cache: crate::KvCache<'_>,
        slot: usize,
        n_kv_heads: usize,
        hd: usize,
    ) -> Vec<f32> {
        let w = n_kv_heads * hd;
        match cache {
            crate::KvCache::F32(c) => c[slot * w..(slot + 1) * w].to_vec(),
            crate::KvCache::F16(c) => c[slot * w..(slot + 1) * w]
                .iter()
                .map(|v| v.to_f32())
                .collect(),
            crate::KvCache::Int8 { values, scales } => {
                let mut out = vec![0.0; w];
                for h in 0..n_kv_heads {
                    crate::kv_cache::dequantize_int8(
                        &values[slot * w + h * hd..slot * w + (h + 1) * hd],
                        scales[slot * n_kv_heads + h],
                        &mut out[h * hd..(h + 1) * hd],
                    );
                }
                out
            }
        }
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
