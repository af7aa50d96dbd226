//! The memory plan against what a load really holds: the plan's matrix bytes equal the loaded
//! model's for every stored type and `--quantize`, its KV cache equals the engine's, and a
//! plan over the device's memory refuses the load with the numbers before anything is read.

mod common;

use candle_core::quantized::GgmlDType;
use tidal_runtime::engine::{Device, EngineConfig};
use tidal_runtime::load::{load_model, LoadError};
use tidal_runtime::memory::MemoryPlan;
use tidal_runtime::model::{write_tiny_gguf, Architecture, Model, ModelFile, QuantizeTo, TinySpec};

fn matrix_bytes(plan: &MemoryPlan) -> usize {
    plan.weight_types.iter().map(|(_, _, bytes)| bytes).sum()
}

fn cpu(kv: usize) -> EngineConfig {
    EngineConfig {
        kv_cache_memory: kv,
        ..EngineConfig::default()
    }
}

#[test]
fn the_plan_counts_what_the_loader_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let specs = [
        (GgmlDType::Q8_0, 64, true, Architecture::Llama),
        (GgmlDType::Q4_0, 64, false, Architecture::Llama),
        (GgmlDType::Q4_1, 64, true, Architecture::Qwen2),
        (GgmlDType::Q5_0, 64, false, Architecture::Llama),
        // Q5_1 becomes Q8_0 by default.
        (GgmlDType::Q5_1, 64, false, Architecture::Llama),
        (GgmlDType::F16, 64, true, Architecture::Llama),
        (GgmlDType::Q4K, 256, false, Architecture::Llama),
        (GgmlDType::Q6K, 256, true, Architecture::Gemma3),
    ];
    for (i, (dtype, hidden, tied, architecture)) in specs.into_iter().enumerate() {
        let path = dir.path().join(format!("tiny-{i}.gguf"));
        write_tiny_gguf(
            &path,
            &TinySpec {
                architecture,
                dtype,
                hidden,
                ffn: 2 * hidden,
                tied_embeddings: tied,
                ..TinySpec::default()
            },
        )
        .unwrap();
        let file = ModelFile::open(&path).unwrap();
        for quantize in [
            None,
            Some(QuantizeTo::Stored),
            Some(QuantizeTo::Q8_0),
            Some(QuantizeTo::Q4_0),
            Some(QuantizeTo::F16),
            Some(QuantizeTo::F32),
        ] {
            let plan = MemoryPlan::for_file(&file, &cpu(1 << 20), quantize).unwrap();
            let model = Model::load(&file, quantize).unwrap();
            assert_eq!(
                matrix_bytes(&plan),
                model.weight_bytes(),
                "{dtype:?} {architecture:?} tied {tied} --quantize {quantize:?}: {plan}"
            );
        }
    }
}

#[test]
fn the_kv_cache_is_the_engines() {
    let path = common::default_model();
    let config = cpu(24 << 20);
    let file = ModelFile::open(&path).unwrap();
    let plan = MemoryPlan::for_file(&file, &config, None).unwrap();
    let loaded = load_model(&path, config.clone(), None).unwrap();
    assert_eq!(plan.kv_tokens, loaded.engine.capacity_tokens());
    assert_eq!(matrix_bytes(&plan), loaded.engine.weight_bytes());
    assert!(plan.kv_cache <= config.kv_cache_memory);
}

#[test]
fn the_default_models_weights_are_the_files_tensors() {
    // Every matrix of SmolLM2 Q8_0 and of Gemma 3 270M Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0) is
    // read in place: resident weights are the file's tensor bytes.
    for name in ["smollm2", "gemma3"] {
        let path = common::fetch_model(name);
        let file = ModelFile::open(&path).unwrap();
        let plan = MemoryPlan::for_file(&file, &cpu(1 << 20), None).unwrap();
        let tensors: usize = file
            .content()
            .tensor_infos
            .values()
            .map(|t| t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size())
            .sum();
        let ratio = plan.weights as f64 / tensors as f64;
        println!(
            "{name}: plan {} bytes of weights, file tensors {tensors} bytes ({ratio:.4}x)",
            plan.weights
        );
        assert!((0.99..1.01).contains(&ratio), "{name}: {ratio}\n{plan}");
    }
}

#[test]
fn a_load_over_the_device_memory_is_refused_with_the_numbers() {
    let path = common::default_model();
    let config = EngineConfig {
        device_memory: Some(256 << 20),
        ..cpu(1 << 30)
    };
    let err = match load_model(&path, config, None) {
        Err(e) => e,
        Ok(_) => panic!("a 1 GiB cache loaded into 256 MiB"),
    };
    assert!(matches!(err, LoadError::DoesNotFit(_)), "{err}");
    let message = err.to_string();
    for says in [
        "memory plan:",
        "weights",
        "KV cache      1023.8 MiB",
        "available      256.0 MiB  (--device-memory)",
        "does not fit cpu: it needs",
        "lower --kv-cache-memory to at most",
    ] {
        assert!(message.contains(says), "missing {says:?} in\n{message}");
    }
    // The same model in a cache that fits is loaded.
    let fits = EngineConfig {
        device_memory: Some(1 << 30),
        ..cpu(16 << 20)
    };
    assert!(load_model(&path, fits, None).is_ok());
}

#[test]
fn a_gpu_plan_needs_no_gpu() {
    // Planning for a GPU reads only the header: it works in a build without CUDA.
    let path = common::default_model();
    let file = ModelFile::open(&path).unwrap();
    let gpu = EngineConfig {
        device: Device::Cuda(0),
        ..cpu(1 << 30)
    };
    let plan = MemoryPlan::for_file(&file, &gpu, None).unwrap();
    let on_cpu = MemoryPlan::for_file(&file, &cpu(1 << 30), None).unwrap();
    // SmolLM2 (Q4_1) ties its Q8_0 embedding to the output: the GPU holds it once, and
    // both types in their blocks.
    let types: Vec<(&str, usize)> = plan
        .weight_types
        .iter()
        .map(|(t, n, _)| (t.as_str(), *n))
        .collect();
    assert_eq!(types, [("Q4_1", 210), ("Q8_0", 1)]);
    assert!(plan.host_weights >= matrix_bytes(&on_cpu), "{plan}");
    assert_eq!(plan.kv_cache, on_cpu.kv_cache);
}
