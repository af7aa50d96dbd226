use candle_core::quantized::GgmlDType;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot open model file {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a readable GGUF file: {message}")]
    Gguf { path: String, message: String },
    #[error("unsupported model architecture `{0}` (supported: llama, qwen2, gemma3)")]
    UnsupportedArchitecture(String),
    #[error("missing GGUF metadata key `{0}`")]
    MissingMetadata(String),
    #[error("GGUF metadata key `{key}` has an unexpected type: {message}")]
    BadMetadata { key: String, message: String },
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{name}` has type {dtype:?}, which the runtime does not support")]
    UnsupportedTensorType { name: String, dtype: GgmlDType },
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    BadShape {
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("tensor `{name}` lies outside the file (needs bytes {start}..{end}, file has {len})")]
    TruncatedTensor {
        name: String,
        start: usize,
        end: usize,
        len: usize,
    },
    #[error("unsupported rope scaling `{0}` (supported: none, linear)")]
    UnsupportedRopeScaling(String),
    #[error("cannot re-quantise to {0:?}: {1}")]
    Quantize(GgmlDType, String),
    #[error("{0}")]
    Unsupported(String),
    #[error("kernel error: {0}")]
    Kernel(String),
}
