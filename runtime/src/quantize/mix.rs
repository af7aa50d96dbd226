//! Which type each tensor gets in a file type: llama.cpp's `llama_tensor_get_type` (with
//! `tensor_allows_quantization`, `tensor_get_category` and `tensor_type_fallback`) for the
//! file types of [`FileType`], without an importance matrix or overrides. The rules count
//! the `attn_v` and `ffn_down` tensors in llama.cpp's tensor order ([`llama_order`]), so a
//! model's first and last layers get more bits.

use std::cmp::Ordering;

use candle_core::quantized::GgmlDType;

use super::ftype::FileType;

/// A tensor as the rules see it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDesc {
    pub name: String,
    /// Dimensions in GGUF order: `dims[0]` is the row length (columns).
    pub dims: Vec<usize>,
    /// The type stored in the input.
    pub dtype: GgmlDType,
}

/// What the rules need of the model besides its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFacts {
    /// `general.architecture`.
    pub arch: String,
    /// `{arch}.block_count`.
    pub layers: usize,
    /// `{arch}.expert_count` (0 for dense models).
    pub experts: usize,
    /// Query heads per KV head (`n_gqa`), 1 without grouped-query attention.
    pub gqa: usize,
}

/// llama.cpp's "more bits here" layers: the first and last eighth, and every third between.
pub fn use_more_bits(layer: usize, layers: usize) -> bool {
    layer < layers / 8 || layer >= 7 * layers / 8 || (layer as i64 - (layers / 8) as i64) % 3 == 2
}

/// llama.cpp's tensor order (`weight_name_comparer`): by layer (tensors outside `blk.N.`
/// first), then by name.
pub fn llama_order(a: &str, b: &str) -> Ordering {
    let layer = |n: &str| -> i64 {
        n.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|d| d.parse().ok())
            .unwrap_or(-1)
    };
    layer(a).cmp(&layer(b)).then_with(|| a.cmp(b))
}

/// The tensor kinds the rules distinguish (`tensor_category`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    /// `attn_v`, and the fused `attn_qkv` / `attn_kv_b` that hold it (llama.cpp tests this
    /// category before its own `attn_qkv` rules, which therefore never apply).
    AttnV,
    AttnK,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        return Category::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Category::TokenEmbd;
    }
    let has = |s: &str| name.contains(s);
    if has("attn_qkv.weight") || has("attn_kv_b.weight") || has("attn_v.weight") {
        Category::AttnV
    } else if has("attn_k.weight") {
        Category::AttnK
    } else if has("attn_q.weight") {
        Category::AttnQ
    } else if has("attn_output.weight") {
        Category::AttnOutput
    } else if has("ffn_up") {
        Category::FfnUp
    } else if has("ffn_gate") {
        Category::FfnGate
    } else if has("ffn_down") {
        Category::FfnDown
    } else {
        Category::Other
    }
}

/// Whether llama.cpp quantises the tensor at all (`tensor_allows_quantization`, the rules
/// that concern text models): matrices named `*weight`, not norms, expert routers or
/// position tables.
fn allows_quantization(t: &TensorDesc) -> bool {
    let n = t.name.as_str();
    let is_float = matches!(t.dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
    let quantisable_input = is_float || t.dtype.block_size() > 1;
    t.dims.len() >= 2
        && quantisable_input
        && n.ends_with("weight")
        && !n.contains("_norm.weight")
        && !n.contains("ffn_gate_inp.weight")
        && !n.contains("position_embd")
        && n != "token_types.weight"
        && !n.contains("attn_rel_b.weight")
        && !n.contains("ssm_conv1d")
}

/// Why a tensor cannot be written in any type the rules allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tensor `{name}`: rows of {cols} values fit no fallback of {target:?}")]
pub struct NoFallback {
    pub name: String,
    pub cols: usize,
    pub target: GgmlDType,
}

/// llama.cpp's `tensor_type_fallback`: a type whose blocks divide the row length.
fn fallback(t: &TensorDesc, target: GgmlDType) -> Result<GgmlDType, NoFallback> {
    let cols = t.dims[0];
    if cols.is_multiple_of(target.block_size()) {
        return Ok(target);
    }
    let fb = match target {
        GgmlDType::Q2K | GgmlDType::Q3K => GgmlDType::Q4_0,
        GgmlDType::Q4K => GgmlDType::Q5_0,
        GgmlDType::Q5K => GgmlDType::Q5_1,
        GgmlDType::Q6K => GgmlDType::Q8_0,
        _ => {
            return Err(NoFallback {
                name: t.name.clone(),
                cols,
                target,
            })
        }
    };
    Ok(if cols.is_multiple_of(fb.block_size()) {
        fb
    } else {
        GgmlDType::F16
    })
}

/// The type of every tensor of `tensors` (given in llama.cpp's order, [`llama_order`]) in
/// file type `ftype`: the stored type for tensors kept as they are.
pub fn plan_types(
    ftype: FileType,
    model: &ModelFacts,
    tensors: &[TensorDesc],
) -> Result<Vec<GgmlDType>, NoFallback> {
    let cats: Vec<Category> = tensors.iter().map(|t| category(&t.name)).collect();
    let n_attention_wv = cats.iter().filter(|&&c| c == Category::AttnV).count();
    let tied = !cats.contains(&Category::Output);
    let mut rules = Rules {
        ftype,
        model,
        tied,
        n_attention_wv,
        i_attention_wv: 0,
        i_ffn_down: 0,
    };
    tensors
        .iter()
        .zip(cats)
        .map(|(t, cat)| {
            if !allows_quantization(t) {
                return Ok(t.dtype);
            }
            let target = rules.type_of(t, cat, ftype.default_type());
            fallback(t, target)
        })
        .collect()
}

/// The counters of `quantize_state_impl` and the facts the rules read.
struct Rules<'a> {
    ftype: FileType,
    model: &'a ModelFacts,
    tied: bool,
    n_attention_wv: usize,
    i_attention_wv: usize,
    i_ffn_down: usize,
}

impl Rules<'_> {
    /// `llama_tensor_get_type_impl` for the file types of [`FileType`].
    fn type_of(&mut self, t: &TensorDesc, cat: Category, default: GgmlDType) -> GgmlDType {
        use FileType as F;
        use GgmlDType as G;
        let ftype = self.ftype;
        let falcon = self.model.arch == "falcon";
        let experts8 = self.model.experts == 8;
        match cat {
            Category::Output | Category::TokenEmbd if cat == Category::Output || self.tied => {
                if !t.dims[0].is_multiple_of(default.block_size()) || falcon {
                    G::Q8_0
                } else if default != G::Q8_0 {
                    G::Q6K
                } else {
                    default
                }
            }
            Category::AttnV => {
                let i = self.i_attention_wv;
                self.i_attention_wv += 1;
                let mut ty = default;
                if matches!(ftype, F::Q4_K_M | F::Q5_K_M) && use_more_bits(i, self.n_attention_wv) {
                    ty = G::Q6K;
                } else if ftype == F::Q4_K_S && i < 4 {
                    ty = G::Q5K;
                }
                // LLM_TYPE_70B: Llama 2/3 70B, whose 8 query heads per KV head make attn_v
                // small enough to widen cheaply.
                let is_70b =
                    self.model.arch == "llama" && self.model.layers == 80 && self.model.gqa > 1;
                if is_70b && matches!(ty, G::Q3K | G::Q4K) {
                    ty = G::Q5K;
                }
                if experts8 {
                    ty = G::Q8_0;
                }
                ty
            }
            Category::AttnK if experts8 => G::Q8_0,
            Category::FfnDown => {
                let i = if self.model.experts > 1 {
                    layer_of(&t.name).unwrap_or(self.i_ffn_down)
                } else {
                    self.i_ffn_down
                };
                self.i_ffn_down += 1;
                let n = self.model.layers;
                match ftype {
                    F::Q4_K_M if falcon => {
                        if i < n / 16 {
                            G::Q6K
                        } else if use_more_bits(i, n) {
                            G::Q5K
                        } else {
                            G::Q4K
                        }
                    }
                    F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => G::Q6K,
                    F::Q4_K_S if !falcon && i < n / 8 => G::Q5K,
                    _ => default,
                }
            }
            Category::AttnOutput
                if !falcon && experts8 && matches!(ftype, F::Q4_K_S | F::Q4_K_M) =>
            {
                G::Q5K
            }
            _ => default,
        }
    }
}

/// `N` of a `blk.N.` tensor name.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}
