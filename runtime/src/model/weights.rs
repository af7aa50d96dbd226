use std::cell::RefCell;
use std::collections::BTreeMap;

use super::config::{Architecture, ModelConfig};
use super::error::ModelError;
use super::file::ModelFile;
use super::weight::{loaded_type, QuantizeTo, Weight};

/// Weights of one transformer block (llama.cpp tensor names `blk.N.*`).
pub(crate) struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub wo: Weight,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Weight,
    pub w_up: Weight,
    pub w_down: Weight,
    /// Gemma 3's extra norms (`Architecture::gemma_norms`), `None` elsewhere.
    pub gemma: Option<GemmaNorms>,
}

/// Gemma 3's per-layer norms besides the two pre-norms (llama.cpp names in brackets).
pub(crate) struct GemmaNorms {
    /// Per head, on Q and K before RoPE (`attn_q_norm`, `attn_k_norm`): `head_dim` values.
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    /// On the attention output and on the FFN output, before each joins the residual
    /// stream (`post_attention_norm`, `post_ffw_norm`).
    pub post_attention: Vec<f32>,
    pub post_ffn: Vec<f32>,
}

/// All weights of a model.
pub(crate) struct ModelWeights {
    pub token_embedding: Weight,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// `output.weight`, or the token embedding when the model ties them.
    pub output: Option<Weight>,
}

impl ModelWeights {
    /// Maps every tensor the forward pass needs and checks its shape.
    pub fn load(
        file: &ModelFile,
        config: &ModelConfig,
        quantize: Option<QuantizeTo>,
    ) -> Result<Self, ModelError> {
        let d = config.hidden_size;
        let q_width = config.num_heads * config.head_dim;
        let kv_width = config.kv_width();
        // Matrices re-quantised to Q8_0 because no `quantize` was given, by stored type.
        let made_fast: RefCell<BTreeMap<String, usize>> = RefCell::default();
        let matrix = |name: &str, rows: usize, cols: usize| -> Result<Weight, ModelError> {
            let w = Weight::load(file, name)?;
            expect_shape(&w, rows, cols)?;
            let to = loaded_type(w.dtype(), quantize);
            if quantize.is_none() && to != w.dtype() {
                *made_fast
                    .borrow_mut()
                    .entry(format!("{:?}", w.dtype()))
                    .or_default() += 1;
            }
            w.convert(to)
        };
        let vector = |name: &str, len: usize| -> Result<Vec<f32>, ModelError> {
            let w = Weight::load(file, name)?;
            expect_shape(&w, 1, len)?;
            Ok(w.to_f32())
        };
        let bias = |name: &str, len: usize| -> Result<Option<Vec<f32>>, ModelError> {
            match file.tensor_info(name) {
                Some(_) => vector(name, len).map(Some),
                None if config.architecture == Architecture::Qwen2 => {
                    Err(ModelError::MissingTensor(name.into()))
                }
                None => Ok(None),
            }
        };
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = |t: &str| format!("blk.{i}.{t}");
            layers.push(LayerWeights {
                attn_norm: vector(&p("attn_norm.weight"), d)?,
                wq: matrix(&p("attn_q.weight"), q_width, d)?,
                wk: matrix(&p("attn_k.weight"), kv_width, d)?,
                wv: matrix(&p("attn_v.weight"), kv_width, d)?,
                bq: bias(&p("attn_q.bias"), q_width)?,
                bk: bias(&p("attn_k.bias"), kv_width)?,
                bv: bias(&p("attn_v.bias"), kv_width)?,
                wo: matrix(&p("attn_output.weight"), d, q_width)?,
                ffn_norm: vector(&p("ffn_norm.weight"), d)?,
                w_gate: matrix(&p("ffn_gate.weight"), config.ffn_size, d)?,
                w_up: matrix(&p("ffn_up.weight"), config.ffn_size, d)?,
                w_down: matrix(&p("ffn_down.weight"), d, config.ffn_size)?,
                gemma: if config.architecture.gemma_norms() {
                    Some(GemmaNorms {
                        q: vector(&p("attn_q_norm.weight"), config.head_dim)?,
                        k: vector(&p("attn_k_norm.weight"), config.head_dim)?,
                        post_attention: vector(&p("post_attention_norm.weight"), d)?,
                        post_ffn: vector(&p("post_ffw_norm.weight"), d)?,
                    })
                } else {
                    None
                },
            });
        }
        let output = match file.tensor_info("output.weight") {
            Some(_) => Some(matrix("output.weight", config.vocab_size, d)?),
            None => None,
        };
        // The embedding is only read a row at a time unless it doubles as the output matrix.
        let token_embedding = match output {
            Some(_) => {
                let w = Weight::load(file, "token_embd.weight")?;
                expect_shape(&w, config.vocab_size, d)?;
                w
            }
            None => matrix("token_embd.weight", config.vocab_size, d)?,
        };
        let made_fast = made_fast.into_inner();
        if !made_fast.is_empty() {
            let types: Vec<String> = made_fast.iter().map(|(k, n)| format!("{n} {k}")).collect();
            tracing::info!(
                matrices = %types.join(", "),
                "re-quantised to Q8_0 at load: the CPU kernels run Q4_0, Q4_1, Q5_0, Q8_0 and the K-quants (`--quantize stored` keeps them as stored)"
            );
        }
        Ok(Self {
            token_embedding,
            layers,
            output_norm: vector("output_norm.weight", d)?,
            output,
        })
    }

    /// Every matrix (the large tensors; norms and biases are small f32 copies).
    pub fn matrices(&self) -> impl Iterator<Item = &Weight> {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        std::iter::once(&self.token_embedding)
            .chain(self.output.as_ref())
            .chain(layers)
    }

    /// The matrix that produces logits.
    pub fn lm_head(&self) -> &Weight {
        self.output.as_ref().unwrap_or(&self.token_embedding)
    }
}

fn expect_shape(w: &Weight, rows: usize, cols: usize) -> Result<(), ModelError> {
    if w.rows() != rows || w.cols() != cols {
        return Err(ModelError::BadShape {
            name: w.name().to_string(),
            expected: vec![rows, cols],
            actual: vec![w.rows(), w.cols()],
        });
    }
    Ok(())
}
