//! The two blocking steps of a pool worker's load. First the file is checked against its
//! expected SHA-256 and the memory it will take is worked out from its header (its memory
//! plan: weights, KV cache and one step's activations); the loop then checks that against
//! the memory left, so a model that does not fit is refused before anything is allocated.
//! Then the model is loaded into an engine.

use std::path::Path;

use super::model_dir::{ModelDir, ModelEntry};
use super::PoolError;
use crate::engine::EngineConfig;
use crate::load::{load_model, Loaded};
use crate::memory::MemoryPlan;
use crate::model::{ModelFile, QuantizeTo};

/// Bytes the model in `path` takes with `engine` and `quantize`: its memory plan's total
/// (weights, KV cache, activations). Reads the file's header only.
pub fn footprint(
    model: &str,
    path: &Path,
    engine: &EngineConfig,
    quantize: Option<QuantizeTo>,
) -> Result<u64, PoolError> {
    let failed = |reason: String| PoolError::Load {
        model: model.to_owned(),
        reason,
    };
    let file = ModelFile::open(path).map_err(|e| failed(e.to_string()))?;
    let plan = MemoryPlan::for_file(&file, engine, quantize)
        .map_err(|e| failed(format!("planning its memory: {e}")))?;
    Ok(u64::try_from(plan.total()).unwrap_or(u64::MAX))
}

/// The first step: the checksum (before anything else reads the file), then the footprint.
pub fn plan(
    dir: &ModelDir,
    entry: &ModelEntry,
    engine: &EngineConfig,
    quantize: Option<QuantizeTo>,
) -> Result<u64, PoolError> {
    dir.verify(entry)?;
    footprint(&entry.model, &entry.path, engine, quantize)
}

/// The second step: the model in an engine.
pub fn load(
    entry: &ModelEntry,
    engine: EngineConfig,
    quantize: Option<QuantizeTo>,
) -> Result<Loaded, PoolError> {
    load_model(&entry.path, engine, quantize).map_err(|e| PoolError::Load {
        model: entry.model.clone(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{write_tiny_gguf, TinySpec};

    #[test]
    fn the_footprint_counts_the_kv_cache_and_activations() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.gguf");
        write_tiny_gguf(&path, &TinySpec::default()).unwrap();
        let engine = |kv_cache_memory| EngineConfig {
            kv_cache_memory,
            ..EngineConfig::default()
        };
        let small = footprint("m", &path, &engine(4 << 20), None).unwrap();
        let large = footprint("m", &path, &engine(64 << 20), None).unwrap();
        let file =
            MemoryPlan::for_file(&ModelFile::open(&path).unwrap(), &engine(4 << 20), None).unwrap();
        assert_eq!(small, file.total() as u64);
        assert!(file.kv_cache > 0 && file.activations > 0, "{file}");
        assert_eq!(
            small,
            (file.weights + file.kv_cache + file.activations) as u64
        );
        // A larger KV cache is a larger footprint, by about the difference.
        assert!(large > small + (50 << 20), "{small} {large}");
        let e = footprint("m", &d.path().join("none.gguf"), &engine(4 << 20), None).unwrap_err();
        assert!(matches!(e, PoolError::Load { .. }), "{e}");
    }
}
