use std::time::Instant;

use rayon::prelude::*;
use tidal_kernels::{
    gelu_mul, paged_attention_windowed, rms_norm, rms_norm_in_place, silu_mul, with_warm_workers,
    write_kv, AttentionSeq, DotKernel, Rope, RopeStyle,
};

use super::batch::{embed, BatchLayout};
use super::config::{Architecture, FfnActivation, ModelConfig, RopeScaling};
use super::error::ModelError;
use super::file::ModelFile;
use super::kv_storage::KvStorage;
use super::weight::{Activations, QuantizeTo, Weight};
use super::weights::{LayerWeights, ModelWeights};

/// One sequence's share of a forward batch.
#[derive(Debug, Clone, Copy)]
pub struct ForwardSeq<'a> {
    /// Tokens to run (a prefill chunk, or one decode token).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; positions before it are already in the KV cache.
    pub start_pos: usize,
    /// Physical KV blocks covering positions `0..start_pos + tokens.len()`.
    pub block_table: &'a [u32],
    /// Logits to return: of the last `num_logits` tokens (0: none; 1: the next token's;
    /// more to verify speculative tokens, one row per position).
    pub num_logits: usize,
}

/// A flat batch of tokens from many sequences.
#[derive(Debug, Clone, Default)]
pub struct ForwardBatch<'a> {
    pub seqs: Vec<ForwardSeq<'a>>,
}

impl<'a> ForwardBatch<'a> {
    /// One whole prompt from position 0, in the KV blocks of `block_table`, asking for the
    /// next token's logits.
    pub fn prompt(tokens: &'a [u32], block_table: &'a [u32]) -> Self {
        Self {
            seqs: vec![ForwardSeq {
                tokens,
                start_pos: 0,
                block_table,
                num_logits: 1,
            }],
        }
    }

    /// Tokens in the batch.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }
}

/// A loaded model (llama family, Qwen2 or Gemma 3).
pub struct Model {
    config: ModelConfig,
    weights: ModelWeights,
    rope: Rope,
    /// The RoPE of the sliding-window layers, where their base differs (Gemma 3).
    rope_local: Option<Rope>,
}

impl Model {
    /// Loads the weights of an opened GGUF file (zero-copy unless `quantize` asks for a
    /// different block type).
    pub fn load(file: &ModelFile, quantize: Option<QuantizeTo>) -> Result<Self, ModelError> {
        let started = Instant::now();
        let config = ModelConfig::from_file(file)?;
        let weights = ModelWeights::load(file, &config, quantize)?;
        let (style, scale) = rope_params(&config);
        let rope = Rope::new(config.head_dim, config.rope_theta, scale, style);
        // llama.cpp scales only the global layers' positions (`rope_freq_scale_train_swa` 1).
        let rope_local = config
            .sliding_window
            .as_ref()
            .map(|w| Rope::new(config.head_dim, w.rope_theta, 1.0, style));
        tracing::info!(
            path = %file.path().display(),
            arch = config.architecture.name(),
            layers = config.num_layers,
            load_ms = started.elapsed().as_millis() as u64,
            "model loaded"
        );
        Ok(Self {
            config,
            weights,
            rope,
            rope_local,
        })
    }

    /// Whether every matrix is read in place from the memory-mapped file.
    pub fn all_weights_mapped(&self) -> bool {
        self.weights.matrices().all(|w| w.is_mapped())
    }

    /// Repacks, in parallel, the matrices that the CPU kernel `kernel` reads in another
    /// layout ([`Weight::prepare_cpu`]), so that the first forward pass does not; returns
    /// how many it repacked.
    pub fn prepare_cpu(&self, kernel: DotKernel) -> usize {
        // Not `matrices()`: an embedding that is not also the LM head is only read by rows.
        let w = &self.weights;
        let matrices: Vec<&Weight> = std::iter::once(w.lm_head())
            .chain(
                w.layers
                    .iter()
                    .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]),
            )
            .collect();
        matrices
            .par_iter()
            .filter(|w| w.prepare_cpu(kernel))
            .count()
    }

    /// Bytes of weight matrices a decode step reads.
    pub fn weight_bytes(&self) -> usize {
        self.weights.matrices().map(|w| w.bytes().len()).sum()
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The weights (other backends upload them).
    #[cfg(feature = "cuda")]
    pub(crate) fn weights(&self) -> &ModelWeights {
        &self.weights
    }

    /// The rotary embedding's tables.
    #[cfg(feature = "cuda")]
    pub(crate) fn rope(&self) -> &Rope {
        &self.rope
    }

    /// The rotary embedding of the sliding-window layers where their base differs (Gemma 3).
    #[cfg(feature = "cuda")]
    pub(crate) fn rope_local(&self) -> Option<&Rope> {
        self.rope_local.as_ref()
    }

    /// Runs the batch, writing its K/V into `kv`, and returns logits `[r, vocab]`, the rows
    /// each sequence's `num_logits` asks for, in batch and position order. The pool's other
    /// threads spin for the length of the pass ([`with_warm_workers`]) instead of sleeping
    /// between its kernels.
    pub fn forward(
        &self,
        batch: &ForwardBatch<'_>,
        kv: &mut KvStorage,
    ) -> Result<Vec<f32>, ModelError> {
        with_warm_workers(|| self.run_batch(batch, kv))
    }

    fn run_batch(
        &self,
        batch: &ForwardBatch<'_>,
        kv: &mut KvStorage,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let n = batch.num_tokens();
        let d = c.hidden_size;
        if n == 0 {
            return Ok(Vec::new());
        }
        if kv.num_layers() != c.num_layers || kv.kv_width() != c.kv_width() {
            return Err(ModelError::Kernel(format!(
                "KV storage of {} layers × {} values does not fit a model of {} layers × {}",
                kv.num_layers(),
                kv.kv_width(),
                c.num_layers,
                c.kv_width()
            )));
        }
        let bs = kv.block_size();
        let layout = BatchLayout::new(batch, bs, kv.num_blocks())?;
        let mut attn_seqs = Vec::with_capacity(batch.seqs.len());
        let mut q_start = 0;
        for seq in &batch.seqs {
            attn_seqs.push(AttentionSeq {
                q_start,
                q_len: seq.tokens.len(),
                start_pos: seq.start_pos,
                block_table: seq.block_table,
            });
            q_start += seq.tokens.len();
        }
        let mut x = embed(batch, &self.weights.token_embedding, c.vocab_size, d)?;
        if let Some(scale) = c.architecture.embedding_scale(d) {
            x.iter_mut().for_each(|v| *v *= scale);
        }

        let mut buffers = LayerBuffers::new(c, n);
        for (index, layer) in self.weights.layers.iter().enumerate() {
            self.layer(
                layer,
                &mut x,
                &layout.positions,
                &layout.slots,
                &attn_seqs,
                kv,
                index,
                &mut buffers,
            )?;
        }

        // Only the rows that are sampled go through the final norm and the vocabulary matmul.
        let mut last_rows = Vec::with_capacity(layout.logit_rows.len() * d);
        for &row in &layout.logit_rows {
            last_rows.extend_from_slice(&x[row * d..(row + 1) * d]);
        }
        let r = last_rows.len() / d;
        if r == 0 {
            return Ok(Vec::new());
        }
        let mut normed = vec![0f32; r * d];
        rms_norm(
            &last_rows,
            &self.weights.output_norm,
            c.rms_norm_eps,
            &mut normed,
        );
        let mut logits = vec![0f32; r * c.vocab_size];
        self.weights
            .lm_head()
            .matmul(&Activations::new(&normed, r), &mut logits)?;
        Ok(logits)
    }

    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        w: &LayerWeights,
        x: &mut [f32],
        positions: &[usize],
        slots: &[usize],
        seqs: &[AttentionSeq<'_>],
        kv: &mut KvStorage,
        index: usize,
        b: &mut LayerBuffers,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let n = positions.len();
        rms_norm(x, &w.attn_norm, c.rms_norm_eps, &mut b.normed);
        let normed = Activations::new(&b.normed, n);
        w.wq.matmul(&normed, &mut b.q)?;
        w.wk.matmul(&normed, &mut b.k)?;
        w.wv.matmul(&normed, &mut b.v)?;
        add_bias(&mut b.q, w.bq.as_deref());
        add_bias(&mut b.k, w.bk.as_deref());
        add_bias(&mut b.v, w.bv.as_deref());
        if let Some(g) = &w.gemma {
            rms_norm_in_place(&mut b.q, &g.q, c.rms_norm_eps);
            rms_norm_in_place(&mut b.k, &g.k, c.rms_norm_eps);
        }
        let window = c.layer_window(index);
        let rope = match window {
            Some(_) => self.rope_local.as_ref().unwrap_or(&self.rope),
            None => &self.rope,
        };
        rope.apply(&mut b.q, positions, c.num_heads);
        rope.apply(&mut b.k, positions, c.num_kv_heads);
        let (k_cache, v_cache) = kv.layer_mut(index);
        write_kv(
            k_cache,
            v_cache,
            &b.k,
            &b.v,
            slots,
            c.num_kv_heads,
            c.head_dim,
        );
        let (k_cache, v_cache) = kv.layer(index);
        paged_attention_windowed(
            &b.q,
            k_cache,
            v_cache,
            seqs,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            kv.block_size(),
            c.attention_scale,
            window,
            &mut b.attn,
        );
        w.wo.matmul(&Activations::new(&b.attn, n), &mut b.out)?;
        let post_attention = w.gemma.as_ref().map(|g| g.post_attention.as_slice());
        add_residual(x, &mut b.out, post_attention, c.rms_norm_eps);

        rms_norm(x, &w.ffn_norm, c.rms_norm_eps, &mut b.normed);
        let normed = Activations::new(&b.normed, n);
        w.w_gate.matmul(&normed, &mut b.gate)?;
        w.w_up.matmul(&normed, &mut b.up)?;
        match c.architecture.ffn_activation() {
            FfnActivation::Silu => silu_mul(&mut b.gate, &b.up),
            FfnActivation::GeluTanh => gelu_mul(&mut b.gate, &b.up),
        }
        w.w_down.matmul(&Activations::new(&b.gate, n), &mut b.out)?;
        let post_ffn = w.gemma.as_ref().map(|g| g.post_ffn.as_slice());
        add_residual(x, &mut b.out, post_ffn, c.rms_norm_eps);
        Ok(())
    }
}

/// `x += out`, with `out` RMS-normed first where the model norms a block's output before
/// the residual add (Gemma 3's post-attention and post-FFN norms).
fn add_residual(x: &mut [f32], out: &mut [f32], post_norm: Option<&[f32]>, eps: f32) {
    if let Some(weight) = post_norm {
        rms_norm_in_place(out, weight, eps);
    }
    add_into(x, out);
}

/// Scratch activations of one layer, reused across layers.
struct LayerBuffers {
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    out: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl LayerBuffers {
    fn new(c: &ModelConfig, n: usize) -> Self {
        let q_width = c.num_heads * c.head_dim;
        Self {
            normed: vec![0.0; n * c.hidden_size],
            q: vec![0.0; n * q_width],
            k: vec![0.0; n * c.kv_width()],
            v: vec![0.0; n * c.kv_width()],
            attn: vec![0.0; n * q_width],
            out: vec![0.0; n * c.hidden_size],
            gate: vec![0.0; n * c.ffn_size],
            up: vec![0.0; n * c.ffn_size],
        }
    }
}

fn rope_params(c: &ModelConfig) -> (RopeStyle, f32) {
    let style = match c.architecture {
        Architecture::Llama => RopeStyle::Normal,
        Architecture::Qwen2 | Architecture::Gemma3 => RopeStyle::Neox,
    };
    let scale = match c.rope_scaling {
        RopeScaling::None => 1.0,
        RopeScaling::Linear(factor) => factor,
    };
    (style, scale)
}

fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(bias) = bias {
        for row in x.chunks_mut(bias.len()) {
            add_into(row, bias);
        }
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
