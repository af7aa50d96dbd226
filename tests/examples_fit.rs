//! Every example Model that names a GPU type fits it: the worker command line the controller
//! builds for it, parsed by `tidal runtime` itself, gives a memory plan (weights as the GPU
//! path keeps them, KV cache, activations) within the GPU's memory. The weights come from a
//! file with the example's shape and tensor types and no data (`write_shape_gguf`), so no
//! download is needed.

use clap::Parser;
use tidal::cli::{Cli, Command};
use tidal_controller::deployment::{worker_args, WorkerConfig};
use tidal_crds::Model;
use tidal_queue::CapacityType;
use tidal_runtime::memory::{Available, MemoryPlan};
use tidal_runtime::model::{write_shape_gguf, ModelFile, QuantMix, ShapeSpec};

const GIB: usize = 1 << 30;

/// Memory a worker may use on each GPU type the examples name (the `nvidia.com/gpu.product`
/// label): the card's memory less what a CUDA context and the driver keep (about 0.5 GiB).
fn gpu_memory(product: &str) -> Option<usize> {
    match product {
        // 23,034 MiB
        "NVIDIA-L4" => Some(22 * GIB),
        _ => None,
    }
}

/// The shape of the GGUF file an example downloads, by file name.
fn shape(file_name: &str) -> Option<ShapeSpec> {
    match file_name {
        "Meta-Llama-3-8B-Instruct-Q4_K_M.gguf" => Some(ShapeSpec::llama3_8b(QuantMix::Q4KM)),
        _ => None,
    }
}

#[test]
fn every_example_fits_the_gpu_it_names() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/examples");
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        // ModelPools run no Model's worker of their own
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        if doc["kind"].as_str() != Some("Model") {
            continue;
        }
        let model: Model = serde_yaml::from_str(&text).unwrap();
        let Some(product) = model.spec.resources.gpu_type.clone() else {
            continue;
        };
        let name = path.display().to_string();
        let memory = gpu_memory(&product)
            .unwrap_or_else(|| panic!("{name}: add {product}'s memory to gpu_memory()"));
        let source = model.spec.source().unwrap();
        let file_name = source.file_name().to_string();
        let spec = shape(&file_name)
            .unwrap_or_else(|| panic!("{name}: add {file_name}'s shape to shape()"));
        let gguf = dir.path().join(&file_name);
        write_shape_gguf(&gguf, &spec).unwrap();

        let config = WorkerConfig {
            queue_url: "redis://redis:6379".into(),
            key_prefix: None,
        };
        let mut args = worker_args(&model, &source, CapacityType::Spot, &config);
        let at = args.iter().position(|a| a == "--model").unwrap() + 1;
        args[at] = gguf.display().to_string();
        let cli = Cli::try_parse_from(std::iter::once("tidal".to_string()).chain(args)).unwrap();
        let Command::Runtime(runtime) = cli.command else {
            panic!("{name}: the worker command is not `tidal runtime`");
        };
        let engine = runtime.engine.engine_config();
        assert!(
            matches!(engine.device, tidal_runtime::engine::Device::Cuda(0)),
            "{name}: a GPU model's workers run on the GPU"
        );
        let file = ModelFile::open(&gguf).unwrap();
        let plan = MemoryPlan::for_file(&file, &engine, runtime.engine.quantize).unwrap();
        let available = Available {
            bytes: memory,
            source: product.clone(),
        };
        match plan.check(&available) {
            Ok(spare) => println!("{name}:\n{plan}{available}\nfits, {spare} bytes to spare"),
            Err(e) => panic!("{name}:\n{e}"),
        }
        // The pod's memory (`resources.memory`, its request and limit) holds the host's copy
        // of the weights.
        let pod_memory = model
            .spec
            .resources
            .memory
            .as_deref()
            .map(parse_quantity)
            .unwrap_or(usize::MAX);
        assert!(
            plan.host_weights < pod_memory,
            "{name}: {} of host weights in a {pod_memory}-byte pod",
            plan.host_weights
        );
        checked += 1;
    }
    assert!(checked >= 1, "no example names a GPU type");
}

/// Bytes of a Kubernetes memory quantity such as `24Gi` or `512Mi`.
fn parse_quantity(q: &str) -> usize {
    let (number, unit) = q.split_at(q.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(q.len()));
    let n: usize = number.parse().unwrap();
    n * match unit {
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "" => 1,
        other => panic!("unit {other}"),
    }
}
