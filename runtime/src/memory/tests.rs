//! The plan's arithmetic on a Llama 3 8B-shaped model in llama.cpp's Q4_K_M mix (its shape
//! and tensor types, no weights): the file's bytes on the CPU and (but for the embedding) on
//! a GPU, the f16 widening of float matrices on a GPU, and what the refusal says.

use candle_core::quantized::GgmlDType;

use super::*;
use crate::engine::Device;
use crate::model::{Architecture, KvDtype, QuantMix, RopeScaling};

const GIB: usize = 1 << 30;

fn llama3_8b() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        name: Some("Meta-Llama-3-8B-Instruct".into()),
        context_length: 8192,
        hidden_size: 4096,
        num_layers: 32,
        ffn_size: 14336,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
        rms_norm_eps: 1e-5,
        rope_theta: 500_000.0,
        rope_scaling: RopeScaling::None,
        vocab_size: 128_256,
        attention_scale: 1.0 / (128f32).sqrt(),
        sliding_window: None,
    }
}

/// llama.cpp's Q4_K_M mix for Llama 3 8B (no biases).
fn q4_k_m(name: &str) -> Option<GgmlDType> {
    (!name.ends_with(".bias")).then(|| QuantMix::Q4KM.type_of(name, 32))
}

fn engine(device: Device, kv: usize) -> EngineConfig {
    EngineConfig {
        kv_cache_memory: kv,
        max_num_batched_tokens: 2048,
        max_num_seqs: 64,
        device,
        ..EngineConfig::default()
    }
}

#[test]
fn on_the_cpu_k_quants_stay_as_stored() {
    let plan = MemoryPlan::new(&llama3_8b(), q4_k_m, &engine(Device::Cpu, 8 * GIB), None).unwrap();
    // The file's tensor bytes (4.92 GB file, of which a few MB are metadata and vocabulary).
    let within = |x: usize, target: f64, tol: f64| ((x as f64) / target - 1.0).abs() < tol;
    assert!(within(plan.weights, 4.913e9, 0.005), "{}", plan.weights);
    assert_eq!(plan.host_weights, 0);
    let types: Vec<&str> = plan.weight_types.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(types, ["Q4K", "Q6K"]);
    // 32 layers × 8 KV heads × 128 × K and V × f16.
    assert_eq!(plan.kv_bytes_per_token, 131_072);
    assert_eq!(plan.kv_tokens, 65_536);
    assert_eq!(plan.kv_cache, 8 * GIB);
    assert!(plan.total() > plan.weights + plan.kv_cache);
}

#[test]
fn requantising_counts_the_new_type() {
    let cpu = engine(Device::Cpu, GIB);
    let q8 = MemoryPlan::new(&llama3_8b(), q4_k_m, &cpu, Some(QuantizeTo::Q8_0)).unwrap();
    let stored = MemoryPlan::new(&llama3_8b(), q4_k_m, &cpu, None).unwrap();
    // Every matrix but the embedding (kept as stored beside an output matrix) becomes Q8_0.
    assert_eq!(q8.weight_types[0].0, "Q8_0");
    assert_eq!(q8.weight_types[0].1, 32 * 7 + 1);
    let ratio = q8.weights as f64 / stored.weights as f64;
    assert!((1.6..1.9).contains(&ratio), "{ratio}");
}

#[test]
fn on_a_gpu_k_quants_stay_as_stored_and_the_embedding_stays_on_the_host() {
    let gpu = |kv: usize| {
        MemoryPlan::new(&llama3_8b(), q4_k_m, &engine(Device::Cuda(0), kv), None).unwrap()
    };
    let plan = gpu(8 * GIB);
    let cpu = MemoryPlan::new(&llama3_8b(), q4_k_m, &engine(Device::Cpu, 8 * GIB), None).unwrap();
    let types: Vec<&str> = plan.weight_types.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(types, ["Q4K", "Q6K"]);
    // The device holds every matrix but the embedding (a Q4_K lookup table beside the output
    // matrix, read on the host); the host maps the whole file.
    let embedding = 128_256 * 4096 / 256 * 144;
    assert_eq!(plan.weights + embedding, cpu.weights);
    assert_eq!(plan.host_weights, cpu.weights);
    // An NVIDIA L4 (23,034 MiB, about 22 GiB free once a context exists) holds them with an
    // 8 GiB cache, and with up to about 17 GiB.
    let l4 = Available {
        bytes: 22 * GIB,
        source: "NVIDIA L4".into(),
    };
    assert!(plan.check(&l4).is_ok(), "{plan}");
    let largest = plan.largest_kv_cache(&l4);
    assert!(largest > 16 * GIB && largest < 18 * GIB, "{largest}");
    let message = gpu(18 * GIB).check(&l4).unwrap_err().to_string();
    assert!(message.contains("does not fit cuda:0"), "{message}");
    assert!(
        message.contains("lower --kv-cache-memory to at most"),
        "{message}"
    );
}

#[test]
fn on_a_gpu_f32_matrices_upload_as_f16() {
    let f32_matrices = |name: &str| q4_k_m(name).map(|_| GgmlDType::F32);
    let plan = MemoryPlan::new(
        &llama3_8b(),
        f32_matrices,
        &engine(Device::Cuda(0), GIB),
        None,
    )
    .unwrap();
    let f16 = plan
        .weight_types
        .iter()
        .find(|t| t.0 == "F16")
        .expect("f16 matrices");
    // 7 matrices × 32 layers + the output matrix, two bytes a weight.
    let matrices = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096) + 128_256 * 4096;
    assert_eq!(f16.2, 2 * matrices);
}

#[test]
fn block_kernel_types_stay_in_blocks_on_a_gpu() {
    let q4_0 = |name: &str| {
        q4_k_m(name).map(|t| {
            if t == GgmlDType::F32 {
                t
            } else {
                GgmlDType::Q4_0
            }
        })
    };
    let gpu = engine(Device::Cuda(0), GIB);
    let plan = MemoryPlan::new(&llama3_8b(), q4_0, &gpu, None).unwrap();
    assert_eq!(plan.weight_types.len(), 1);
    assert_eq!(plan.weight_types[0].0, "Q4_0");
    let cpu = MemoryPlan::new(&llama3_8b(), q4_0, &engine(Device::Cpu, GIB), None).unwrap();
    // The CPU also holds the embedding; the GPU only the matrices it multiplies by.
    let embedding = 128_256 * 4096 / 32 * 18;
    assert_eq!(cpu.weights, plan.weights + embedding);
}

#[test]
fn a_weightless_cache_is_no_advice() {
    let plan = MemoryPlan::new(&llama3_8b(), q4_k_m, &engine(Device::Cpu, GIB), None).unwrap();
    let tiny = Available {
        bytes: 4 * GIB,
        source: "test".into(),
    };
    let message = plan.check(&tiny).unwrap_err().to_string();
    assert!(
        message.contains("leave no room for a useful KV cache"),
        "{message}"
    );
    assert_eq!(plan.largest_kv_cache(&tiny), 0);
}

#[test]
fn int8_kv_holds_more_tokens_in_the_same_memory() {
    let f16 = MemoryPlan::new(&llama3_8b(), q4_k_m, &engine(Device::Cpu, GIB), None).unwrap();
    let int8 = MemoryPlan::new(
        &llama3_8b(),
        q4_k_m,
        &EngineConfig {
            kv_cache_dtype: KvDtype::Int8,
            ..engine(Device::Cpu, GIB)
        },
        None,
    )
    .unwrap();
    assert!(
        int8.kv_tokens > f16.kv_tokens * 18 / 10,
        "{} {}",
        int8.kv_tokens,
        f16.kv_tokens
    );
    assert!(int8.kv_cache <= GIB);
}

#[test]
fn a_missing_tensor_is_named() {
    let without_q = |name: &str| {
        (name != "blk.3.attn_q.weight")
            .then(|| q4_k_m(name))
            .flatten()
    };
    let err = MemoryPlan::new(&llama3_8b(), without_q, &engine(Device::Cpu, GIB), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("blk.3.attn_q.weight"), "{err}");
}

#[test]
fn activations_grow_with_the_step_budget() {
    let c = llama3_8b();
    // One sequence's logits: the rest scales with the tokens of a step.
    let at = |tokens: usize| {
        activation_bytes(
            &c,
            &EngineConfig {
                max_num_batched_tokens: tokens,
                max_num_seqs: 1,
                ..EngineConfig::default()
            },
        )
    };
    let (small, large) = (at(256), at(2048));
    assert!(large > 7 * small && large < 8 * small, "{small} {large}");
    // Logits for 64 sequences of Llama 3's 128,256 tokens: 33 MiB more.
    let many = activation_bytes(&c, &EngineConfig::default());
    assert_eq!(many - at(512), 63 * (128_256 + 2 * 4096) * 4);
}
