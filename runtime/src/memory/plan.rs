//! The plan itself: pure arithmetic over the model's hyper-parameters, the stored type of each
//! tensor and the engine settings. It follows the loader's rules ([`loaded_type`]: which
//! matrices are re-quantised) and the GPU upload's (types without a CUDA block kernel become
//! f16), and a test holds it to the bytes a loaded model really has.

use std::collections::BTreeMap;
use std::fmt;

use candle_core::quantized::GgmlDType;
use tidal_kernels::QuantType;

use crate::engine::{Device, EngineConfig};
use crate::model::{
    loaded_type, matrix_bytes, own_kernel_type, ModelConfig, ModelError, QuantizeTo,
};

/// What one model takes on the device it runs on, before anything is read or allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Where the engine runs.
    pub device: Device,
    /// The model's name (or architecture) and layer count, for the report.
    pub model: String,
    /// Bytes of weights on the device (matrices in their loaded type, norms and biases as f32).
    pub weights: usize,
    /// Matrices on the device by type: (type name, count, bytes), largest first.
    pub weight_types: Vec<(String, usize, usize)>,
    /// Bytes of weights kept in host memory when the model runs on a GPU (the memory-mapped
    /// file's matrices and any re-quantised copies); 0 on the CPU, where they are `weights`.
    pub host_weights: usize,
    /// Bytes of the KV cache: whole blocks within `--kv-cache-memory`.
    pub kv_cache: usize,
    /// Tokens the KV cache holds.
    pub kv_tokens: usize,
    /// Bytes of KV cache one token takes (every layer, K and V).
    pub kv_bytes_per_token: usize,
    /// Bytes of one step's activations at the step budget (`--max-num-batched-tokens` tokens,
    /// logits for `--max-num-seqs` sequences).
    pub activations: usize,
}

/// The memory a plan is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    /// Bytes the model may use.
    pub bytes: usize,
    /// Where the figure comes from, e.g. "MemAvailable" or "NVIDIA L4, free".
    pub source: String,
}

/// A plan whose total exceeds the memory available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoesNotFit {
    /// The plan.
    pub plan: MemoryPlan,
    /// What it was checked against.
    pub available: Available,
}

impl std::error::Error for DoesNotFit {}

impl fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.plan, self.available)?;
        write!(
            f,
            "\nthe model does not fit {}: it needs {} more{}",
            self.plan.device,
            gib(self.plan.total() - self.available.bytes),
            advice(&self.plan, &self.available)
        )
    }
}

impl MemoryPlan {
    /// The plan for a model with hyper-parameters `config` whose tensors are stored as
    /// `stored_type` says, loaded with `quantize` and run with `engine`. A tensor the forward
    /// pass needs and `stored_type` lacks is [`ModelError::MissingTensor`], as at load.
    pub fn new(
        config: &ModelConfig,
        stored_type: impl Fn(&str) -> Option<GgmlDType>,
        engine: &EngineConfig,
        quantize: Option<QuantizeTo>,
    ) -> Result<Self, ModelError> {
        let stored = |name: &str| -> Result<GgmlDType, ModelError> {
            stored_type(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))
        };
        let mut tally = Tally {
            on_gpu: matches!(engine.device, Device::Cuda(_)),
            ..Tally::default()
        };
        let c = config;
        let d = c.hidden_size;
        let q_width = c.num_heads * c.head_dim;
        let kv_width = c.kv_width();
        let shapes = [
            ("attn_q", q_width, d),
            ("attn_k", kv_width, d),
            ("attn_v", kv_width, d),
            ("attn_output", d, q_width),
            ("ffn_gate", c.ffn_size, d),
            ("ffn_up", c.ffn_size, d),
            ("ffn_down", d, c.ffn_size),
        ];
        // Norms and biases: small f32 copies, on the device and (for a GPU) on the host.
        let mut vectors = d; // output_norm
        for layer in 0..c.num_layers {
            for (tensor, rows, cols) in shapes {
                let name = format!("blk.{layer}.{tensor}.weight");
                tally.matrix(loaded_type(stored(&name)?, quantize), rows, cols);
            }
            vectors += 2 * d;
            for (bias, len) in [
                ("attn_q", q_width),
                ("attn_k", kv_width),
                ("attn_v", kv_width),
            ] {
                if stored_type(&format!("blk.{layer}.{bias}.bias")).is_some() {
                    vectors += len;
                }
            }
            if c.architecture.gemma_norms() {
                vectors += 2 * c.head_dim + 2 * d;
            }
        }
        let embedding = stored("token_embd.weight")?;
        match stored_type("output.weight") {
            Some(output) => {
                tally.matrix(loaded_type(output, quantize), c.vocab_size, d);
                // Read a row at a time, in its stored type; on a GPU the host gathers the rows.
                tally.lookup_table(embedding, c.vocab_size, d);
            }
            // Tied: the embedding is the output matrix too.
            None => tally.matrix(loaded_type(embedding, quantize), c.vocab_size, d),
        }
        tally.vectors(vectors);
        let mut weight_types: Vec<(String, usize, usize)> = tally
            .types
            .into_iter()
            .map(|(t, (n, b))| (t, n, b))
            .collect();
        weight_types.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        let kv_bytes_per_token = engine.kv_bytes_per_token(c);
        let kv_tokens = engine.num_blocks(c) * engine.block_size;
        let name = c
            .name
            .clone()
            .unwrap_or_else(|| c.architecture.name().into());
        Ok(Self {
            device: engine.device,
            model: format!(
                "{name} ({}, {} layers)",
                c.architecture.name(),
                c.num_layers
            ),
            weights: tally.device,
            weight_types,
            host_weights: tally.host,
            kv_cache: kv_tokens * kv_bytes_per_token,
            kv_tokens,
            kv_bytes_per_token,
            activations: activation_bytes(c, engine),
        })
    }

    /// Bytes the device must hold: weights, KV cache and activations.
    pub fn total(&self) -> usize {
        self.weights + self.kv_cache + self.activations
    }

    /// `Ok` with the bytes to spare when the plan fits in `available`, else the plan and the
    /// shortfall as an error whose message says what to change.
    pub fn check(&self, available: &Available) -> Result<usize, Box<DoesNotFit>> {
        match available.bytes.checked_sub(self.total()) {
            Some(spare) => Ok(spare),
            None => Err(Box::new(DoesNotFit {
                plan: self.clone(),
                available: available.clone(),
            })),
        }
    }

    /// The largest `--kv-cache-memory` that fits `available` with these weights and
    /// activations (0: not even the weights fit).
    pub fn largest_kv_cache(&self, available: &Available) -> usize {
        available
            .bytes
            .saturating_sub(self.weights + self.activations)
    }
}

/// Bytes of weights as the plan adds them up, on the device and on the host.
#[derive(Default)]
struct Tally {
    on_gpu: bool,
    /// Device matrices by type name: (count, bytes).
    types: BTreeMap<String, (usize, usize)>,
    device: usize,
    host: usize,
}

impl Tally {
    /// A matrix the forward pass multiplies by, loaded as `dtype`: on the device in that type
    /// (f16 on a GPU without a block kernel for it); on a GPU its host copy stays too.
    fn matrix(&mut self, dtype: GgmlDType, rows: usize, cols: usize) {
        let loaded = matrix_bytes(dtype, rows, cols);
        if !self.on_gpu {
            return self.on_device(format!("{dtype:?}"), loaded);
        }
        self.host += loaded;
        match own_kernel_type(dtype).filter(|t| QuantType::GPU_BLOCKS.contains(t)) {
            Some(_) => self.on_device(format!("{dtype:?}"), loaded),
            None => self.on_device("F16".into(), rows * cols * 2),
        }
    }

    /// A table read a row at a time (the token embedding when the output matrix is its
    /// own): in the CPU's memory wherever the model runs.
    fn lookup_table(&mut self, dtype: GgmlDType, rows: usize, cols: usize) {
        let bytes = matrix_bytes(dtype, rows, cols);
        if self.on_gpu {
            self.host += bytes;
        } else {
            self.on_device(format!("{dtype:?}"), bytes);
        }
    }

    /// `count` f32 values (norms, biases) on the device, and on the host for a GPU.
    fn vectors(&mut self, count: usize) {
        self.device += count * 4;
        if self.on_gpu {
            self.host += count * 4;
        }
    }

    fn on_device(&mut self, type_name: String, bytes: usize) {
        let entry = self.types.entry(type_name).or_default();
        entry.0 += 1;
        entry.1 += bytes;
        self.device += bytes;
    }
}

/// One step's buffers at the step budget, as the forward pass allocates them: the residual
/// stream and its normed copy, Q, K, V, the attention output, the block's output, gate and up
/// (f32 per token); the 8-bit copies the quantised matmuls read (Q8_1 and Q8_K, about 1.14
/// bytes per value each); logits for every sequence of a step.
pub fn activation_bytes(c: &ModelConfig, engine: &EngineConfig) -> usize {
    let tokens = engine.max_num_batched_tokens.max(1);
    let q_width = c.num_heads * c.head_dim;
    let per_token_f32 = 3 * c.hidden_size + 2 * q_width + 2 * c.kv_width() + 2 * c.ffn_size;
    let widest = c.hidden_size.max(c.ffn_size).max(q_width);
    // Q8_1: 36 bytes per 32 values; Q8_K: 292 bytes per 256.
    let quantized = widest * 36 / 32 + widest * 292 / 256;
    // Each logit row also has its hidden state gathered and normed.
    let logits = engine.max_num_seqs.max(1).min(tokens) * (c.vocab_size + 2 * c.hidden_size) * 4;
    tokens * (per_token_f32 * 4 + quantized) + logits
}

/// `bytes` as GiB (or MiB below one GiB), two decimals.
pub fn gib(bytes: usize) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else {
        format!("{:.1} MiB", b / MIB)
    }
}

/// What to change when a plan does not fit.
fn advice(plan: &MemoryPlan, available: &Available) -> String {
    let kv = plan.largest_kv_cache(available);
    if kv >= plan.kv_bytes_per_token * 256 {
        format!(
            "; lower --kv-cache-memory to at most {} ({} tokens), or choose a smaller quantisation or device",
            gib(kv),
            kv / plan.kv_bytes_per_token.max(1)
        )
    } else {
        "; the weights alone leave no room for a useful KV cache: choose a smaller quantisation, a smaller model or a larger device".to_string()
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "memory plan: {} on {}", self.model, self.device)?;
        let types: Vec<String> = self
            .weight_types
            .iter()
            .map(|(t, n, b)| format!("{n} {t} {}", gib(*b)))
            .collect();
        writeln!(
            f,
            "  weights      {:>11}  ({})",
            gib(self.weights),
            types.join(", ")
        )?;
        writeln!(
            f,
            "  KV cache     {:>11}  ({} tokens, {} bytes each)",
            gib(self.kv_cache),
            self.kv_tokens,
            self.kv_bytes_per_token
        )?;
        writeln!(f, "  activations  {:>11}", gib(self.activations))?;
        writeln!(f, "  total        {:>11}", gib(self.total()))?;
        if self.host_weights > 0 {
            writeln!(
                f,
                "  host memory  {:>11}  (the mapped file's weights, besides the device's)",
                gib(self.host_weights)
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for Available {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "  available    {:>11}  ({})",
            gib(self.bytes),
            self.source
        )
    }
}
