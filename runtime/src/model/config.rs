use candle_core::quantized::gguf_file::Value;
use tidal_kernels::KvDtype;

use super::error::ModelError;
use super::file::ModelFile;

/// Model families the forward pass implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, Mistral-style and SmolLM2: rotary pairs are adjacent (llama.cpp's NORM).
    Llama,
    /// Qwen2: biases on Q/K/V, rotary pairs split in halves (llama.cpp's NEOX).
    Qwen2,
    /// Gemma 3 (text): GeGLU FFN, RMS norms on Q and K and after attention and FFN, the
    /// embedding scaled by `sqrt(hidden)`, and local sliding-window layers between global
    /// ones, each kind with its own RoPE base (llama.cpp's `llm_build_gemma3_iswa`).
    Gemma3,
}

impl Architecture {
    fn parse(name: &str) -> Result<Self, ModelError> {
        match name {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "gemma3" => Ok(Self::Gemma3),
            other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// The `general.architecture` name, which also prefixes the hyper-parameter keys.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Gemma3 => "gemma3",
        }
    }

    /// The FFN gate's activation.
    pub fn ffn_activation(self) -> FfnActivation {
        match self {
            Self::Llama | Self::Qwen2 => FfnActivation::Silu,
            Self::Gemma3 => FfnActivation::GeluTanh,
        }
    }

    /// Whether Q and K are RMS-normed per head before RoPE, and the attention and FFN
    /// outputs before they join the residual stream (Gemma 3's four extra norms).
    pub fn gemma_norms(self) -> bool {
        self == Self::Gemma3
    }

    /// The factor the token embeddings are multiplied by before the first layer (Gemma:
    /// `sqrt(hidden)`), `None` for none.
    pub fn embedding_scale(self, hidden_size: usize) -> Option<f32> {
        (self == Self::Gemma3).then(|| (hidden_size as f32).sqrt())
    }
}

/// The activation of the FFN's gate (`act(gate) * up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// SwiGLU.
    Silu,
    /// GeGLU with GELU's tanh approximation.
    GeluTanh,
}

/// Gemma 3's local layers: the window and which layers use it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Positions a local layer's query sees, itself included.
    pub size: usize,
    /// Per layer, whether it is local (windowed); the others attend to the whole context.
    pub local_layers: Vec<bool>,
    /// RoPE base of the local layers (the global ones use `rope_theta`).
    pub rope_theta: f32,
}

/// Rotary position scaling read from `{arch}.rope.scaling.*`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by the factor.
    Linear(f32),
}

/// Hyper-parameters of a model, all read from GGUF metadata.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub architecture: Architecture,
    /// `general.name`, when the file has one.
    pub name: Option<String>,
    pub context_length: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub ffn_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub vocab_size: usize,
    /// Scale of the attention logits, `1/sqrt(head_dim)` but for Gemma 3 27B.
    pub attention_scale: f32,
    /// Local sliding-window layers (Gemma 3); `None`: every layer is global.
    pub sliding_window: Option<SlidingWindow>,
}

impl ModelConfig {
    /// Reads the configuration of a GGUF file; unknown architectures are refused by name.
    pub fn from_file(file: &ModelFile) -> Result<Self, ModelError> {
        let arch_name = string(file, "general.architecture")?;
        let architecture = Architecture::parse(arch_name)?;
        let key = |k: &str| format!("{}.{k}", architecture.name());
        let hidden_size = uint(file, &key("embedding_length"))?;
        let num_heads = uint(file, &key("attention.head_count"))?;
        let num_kv_heads =
            optional_uint(file, &key("attention.head_count_kv"))?.unwrap_or(num_heads);
        let head_dim = match optional_uint(file, &key("attention.key_length"))? {
            Some(d) => d,
            None => hidden_size / num_heads.max(1),
        };
        let rope_dims = optional_uint(file, &key("rope.dimension_count"))?.unwrap_or(head_dim);
        if rope_dims != head_dim {
            return Err(ModelError::BadMetadata {
                key: key("rope.dimension_count"),
                message: format!(
                    "partial rotary embeddings ({rope_dims} of {head_dim}) are not supported"
                ),
            });
        }
        let rope_scaling = match optional_string(file, &key("rope.scaling.type"))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => {
                let factor = optional_float(file, &key("rope.scaling.factor"))?.unwrap_or(1.0);
                RopeScaling::Linear(factor)
            }
            Some(other) => return Err(ModelError::UnsupportedRopeScaling(other.to_string())),
        };
        if file.tensor_info("rope_freqs.weight").is_some() {
            // Llama 3.1-style per-dimension frequency factors: refusing beats silently wrong output.
            return Err(ModelError::UnsupportedRopeScaling(
                "llama3 (rope_freqs.weight)".into(),
            ));
        }
        let vocab_size = match optional_uint(file, &key("vocab_size"))? {
            Some(v) => v,
            None => match file.metadata("tokenizer.ggml.tokens")? {
                Value::Array(tokens) => tokens.len(),
                _ => {
                    return Err(ModelError::BadMetadata {
                        key: "tokenizer.ggml.tokens".into(),
                        message: "expected an array".into(),
                    })
                }
            },
        };
        if let Some(v) = optional_uint(file, &key("attention.value_length"))? {
            if v != head_dim {
                return Err(ModelError::BadMetadata {
                    key: key("attention.value_length"),
                    message: format!("value heads of {v} beside key heads of {head_dim}"),
                });
            }
        }
        let num_layers = uint(file, &key("block_count"))?;
        let sliding_window = match architecture {
            Architecture::Gemma3 => Some(gemma3_window(file, num_layers)?),
            Architecture::Llama | Architecture::Qwen2 => None,
        };
        // llama.cpp: Gemma 3 27B (62 layers) scales by the hidden size per head, not head_dim.
        let attention_scale = if architecture == Architecture::Gemma3 && num_layers == 62 {
            1.0 / ((hidden_size / num_heads.max(1)) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let config = Self {
            architecture,
            name: optional_string(file, "general.name")?.map(str::to_string),
            context_length: uint(file, &key("context_length"))?,
            hidden_size,
            num_layers,
            ffn_size: uint(file, &key("feed_forward_length"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: optional_float(file, &key("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5),
            rope_theta: optional_float(file, &key("rope.freq_base"))?.unwrap_or(10_000.0),
            rope_scaling,
            vocab_size,
            attention_scale,
            sliding_window,
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ModelError> {
        let bad = |key: &str, message: String| ModelError::BadMetadata {
            key: key.to_string(),
            message,
        };
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return Err(bad(
                "attention.head_count_kv",
                format!(
                    "{} query heads cannot share {} KV heads",
                    self.num_heads, self.num_kv_heads
                ),
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return Err(bad(
                "attention.key_length",
                format!("head dim {} must be even", self.head_dim),
            ));
        }
        if self.num_layers == 0 || self.hidden_size == 0 || self.vocab_size == 0 {
            return Err(bad("block_count", "empty model".into()));
        }
        Ok(())
    }

    /// The sliding window of layer `index`, `None` for a global layer.
    pub fn layer_window(&self, index: usize) -> Option<usize> {
        let w = self.sliding_window.as_ref()?;
        w.local_layers
            .get(index)
            .copied()
            .unwrap_or(false)
            .then_some(w.size)
    }

    /// Width of one token's K (or V) in one layer: KV heads × head dim.
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Bytes of K and V that one token occupies across all layers in a KV cache of `dtype`
    /// (int8 scales included).
    pub fn kv_bytes_per_token(&self, dtype: KvDtype) -> usize {
        dtype.bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim)
    }
}

/// Every sixth Gemma 3 layer is global (llama.cpp's `set_swa_pattern(6)`), or every `n`th
/// where the file gives `gemma3.attention.sliding_window_pattern` as a period; local layers
/// use RoPE base 10,000 unless `gemma3.rope.freq_base_swa` says otherwise.
fn gemma3_window(file: &ModelFile, num_layers: usize) -> Result<SlidingWindow, ModelError> {
    const PERIOD: usize = 6;
    const LOCAL_ROPE_THETA: f32 = 10_000.0;
    let bad = |key: &str, message: &str| ModelError::BadMetadata {
        key: key.into(),
        message: message.into(),
    };
    let size = uint(file, "gemma3.attention.sliding_window")?;
    if size == 0 {
        return Err(bad(
            "gemma3.attention.sliding_window",
            "a window of 0 positions",
        ));
    }
    let pattern_key = "gemma3.attention.sliding_window_pattern";
    let period = optional_uint(file, pattern_key)?.unwrap_or(PERIOD);
    if period == 0 {
        return Err(bad(pattern_key, "a period of 0"));
    }
    Ok(SlidingWindow {
        size,
        local_layers: (0..num_layers).map(|i| (i + 1) % period != 0).collect(),
        rope_theta: optional_float(file, "gemma3.rope.freq_base_swa")?.unwrap_or(LOCAL_ROPE_THETA),
    })
}

fn string<'a>(file: &'a ModelFile, key: &str) -> Result<&'a str, ModelError> {
    optional_string(file, key)?.ok_or_else(|| ModelError::MissingMetadata(key.to_string()))
}

fn optional_string<'a>(file: &'a ModelFile, key: &str) -> Result<Option<&'a str>, ModelError> {
    match file.content().metadata.get(key) {
        None => Ok(None),
        Some(v) => v
            .to_string()
            .map(|s| Some(s.as_str()))
            .map_err(|e| ModelError::BadMetadata {
                key: key.to_string(),
                message: e.to_string(),
            }),
    }
}

fn uint(file: &ModelFile, key: &str) -> Result<usize, ModelError> {
    optional_uint(file, key)?.ok_or_else(|| ModelError::MissingMetadata(key.to_string()))
}

pub(crate) fn optional_uint(file: &ModelFile, key: &str) -> Result<Option<usize>, ModelError> {
    let Some(value) = file.content().metadata.get(key) else {
        return Ok(None);
    };
    let n = match value {
        Value::U8(v) => *v as u64,
        Value::U16(v) => *v as u64,
        Value::U32(v) => *v as u64,
        Value::U64(v) => *v,
        Value::I8(v) if *v >= 0 => *v as u64,
        Value::I16(v) if *v >= 0 => *v as u64,
        Value::I32(v) if *v >= 0 => *v as u64,
        Value::I64(v) if *v >= 0 => *v as u64,
        other => {
            return Err(ModelError::BadMetadata {
                key: key.to_string(),
                message: format!("expected a non-negative integer, found {other:?}"),
            })
        }
    };
    Ok(Some(n as usize))
}

fn optional_float(file: &ModelFile, key: &str) -> Result<Option<f32>, ModelError> {
    match file.content().metadata.get(key) {
        None => Ok(None),
        Some(Value::F32(v)) => Ok(Some(*v)),
        Some(Value::F64(v)) => Ok(Some(*v as f32)),
        Some(other) => Err(ModelError::BadMetadata {
            key: key.to_string(),
            message: format!("expected a float, found {other:?}"),
        }),
    }
}
