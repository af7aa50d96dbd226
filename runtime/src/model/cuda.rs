//! The forward pass on an NVIDIA GPU (feature `cuda`, `--device cuda`): the same steps as
//! [`Model::forward`] with every tensor on the device and the kernels of
//! `tidal_kernels::cuda`. The host prepares the batch layout and the embedding rows
//! (a few KB per token) and reads back only the logits. Every architecture the CPU runs runs
//! here: Gemma 3's per-head Q/K norms, post-attention and post-FFN norms, GeGLU, sliding-window
//! local layers with their own RoPE base, and scaled embeddings included.

use std::sync::Arc;

use tidal_kernels::cuda::{
    AttentionBatch, CudaError, CudaSlice, Gpu, GpuKvBuffer, GpuMatrix, GPU_BLOCK_TYPES,
};
use tidal_kernels::{KvDtype, RopeStyle};

use super::batch::{embed, BatchLayout};
use super::config::{FfnActivation, ModelConfig};
use super::error::ModelError;
use super::forward::{ForwardBatch, Model};
use super::weight::{own_kernel_type, Weight};
use super::weights::GemmaNorms;

impl From<CudaError> for ModelError {
    fn from(e: CudaError) -> Self {
        ModelError::Kernel(e.to_string())
    }
}

struct GpuLayer {
    attn_norm: CudaSlice<f32>,
    wq: GpuMatrix,
    wk: GpuMatrix,
    wv: GpuMatrix,
    bq: Option<CudaSlice<f32>>,
    bk: Option<CudaSlice<f32>>,
    bv: Option<CudaSlice<f32>>,
    wo: GpuMatrix,
    ffn_norm: CudaSlice<f32>,
    w_gate: GpuMatrix,
    w_up: GpuMatrix,
    w_down: GpuMatrix,
    /// Gemma 3's extra norms, `None` elsewhere.
    gemma: Option<GpuGemmaNorms>,
    k_cache: GpuKvBuffer,
    v_cache: GpuKvBuffer,
}

/// [`GemmaNorms`] on the device.
struct GpuGemmaNorms {
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    post_attention: CudaSlice<f32>,
    post_ffn: CudaSlice<f32>,
}

impl GpuGemmaNorms {
    fn upload(gpu: &Gpu, norms: &GemmaNorms) -> Result<Self, CudaError> {
        Ok(Self {
            q: gpu.upload(&norms.q)?,
            k: gpu.upload(&norms.k)?,
            post_attention: gpu.upload(&norms.post_attention)?,
            post_ffn: gpu.upload(&norms.post_ffn)?,
        })
    }
}

/// Activations of one forward pass for up to `tokens` tokens, grown to the largest batch seen
/// and then reused.
struct ScratchBuffers {
    tokens: usize,
    x: CudaSlice<f32>,
    normed: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    out: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
}

impl ScratchBuffers {
    fn new(gpu: &Gpu, c: &ModelConfig, n: usize) -> Result<Self, CudaError> {
        let q_width = c.num_heads * c.head_dim;
        Ok(Self {
            tokens: n,
            x: gpu.zeros(n * c.hidden_size)?,
            normed: gpu.zeros(n * c.hidden_size)?,
            q: gpu.zeros(n * q_width)?,
            k: gpu.zeros(n * c.kv_width())?,
            v: gpu.zeros(n * c.kv_width())?,
            attn: gpu.zeros(n * q_width)?,
            out: gpu.zeros(n * c.hidden_size)?,
            gate: gpu.zeros(n * c.ffn_size)?,
            up: gpu.zeros(n * c.ffn_size)?,
        })
    }
}

/// A model whose weights and KV cache live on one GPU.
pub struct CudaModel {
    gpu: Arc<Gpu>,
    host: Model,
    layers: Vec<GpuLayer>,
    output_norm: CudaSlice<f32>,
    lm_head: GpuMatrix,
    inv_freq: CudaSlice<f32>,
    /// The sliding-window layers' RoPE frequencies where their base differs (Gemma 3).
    inv_freq_local: Option<CudaSlice<f32>>,
    block_size: usize,
    num_blocks: usize,
    scratch: Option<ScratchBuffers>,
}

fn upload_matrix(gpu: &Gpu, w: &Weight) -> Result<GpuMatrix, ModelError> {
    // The GPU has block kernels for every one of the CPU's own types (Q4_0, Q4_1, Q5_0, Q8_0
    // and the K-quants; Q5_1 matrices arrive here as Q8_0, see `loaded_type`).
    let matrix = match own_kernel_type(w.dtype()).filter(|t| GPU_BLOCK_TYPES.contains(t)) {
        Some(ty) => GpuMatrix::from_blocks(gpu, ty, w.bytes(), w.rows(), w.cols()),
        // f16, bf16 and f32 matrices: kept as f16.
        None => GpuMatrix::from_f32(gpu, &w.to_f32(), w.rows(), w.cols()),
    };
    matrix.map_err(|e| ModelError::Kernel(format!("uploading {}: {e}", w.name())))
}

impl CudaModel {
    /// Uploads `model`'s weights to `gpu` and allocates a KV cache of `num_blocks` blocks of
    /// `block_size` tokens in `kv_dtype` for every layer.
    pub fn new(
        gpu: Arc<Gpu>,
        model: Model,
        kv_dtype: KvDtype,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, ModelError> {
        let c = model.config().clone();
        let slots = num_blocks * block_size;
        let weights = model.weights();
        let mut layers = Vec::with_capacity(weights.layers.len());
        for l in &weights.layers {
            let bias = |b: &Option<Vec<f32>>| -> Result<Option<CudaSlice<f32>>, ModelError> {
                Ok(match b {
                    Some(v) => Some(gpu.upload(v)?),
                    None => None,
                })
            };
            layers.push(GpuLayer {
                attn_norm: gpu.upload(&l.attn_norm)?,
                wq: upload_matrix(&gpu, &l.wq)?,
                wk: upload_matrix(&gpu, &l.wk)?,
                wv: upload_matrix(&gpu, &l.wv)?,
                bq: bias(&l.bq)?,
                bk: bias(&l.bk)?,
                bv: bias(&l.bv)?,
                wo: upload_matrix(&gpu, &l.wo)?,
                ffn_norm: gpu.upload(&l.ffn_norm)?,
                w_gate: upload_matrix(&gpu, &l.w_gate)?,
                w_up: upload_matrix(&gpu, &l.w_up)?,
                w_down: upload_matrix(&gpu, &l.w_down)?,
                gemma: l
                    .gemma
                    .as_ref()
                    .map(|norms| GpuGemmaNorms::upload(&gpu, norms))
                    .transpose()?,
                k_cache: GpuKvBuffer::new(&gpu, kv_dtype, slots, c.num_kv_heads, c.head_dim)?,
                v_cache: GpuKvBuffer::new(&gpu, kv_dtype, slots, c.num_kv_heads, c.head_dim)?,
            });
        }
        let output_norm = gpu.upload(&weights.output_norm)?;
        let lm_head = upload_matrix(&gpu, weights.lm_head())?;
        let inv_freq = gpu.upload(model.rope().inv_freq())?;
        let inv_freq_local = model
            .rope_local()
            .map(|rope| gpu.upload(rope.inv_freq()))
            .transpose()?;
        gpu.synchronize()?;
        let (free, total) = gpu.memory_info()?;
        tracing::info!(
            gpu = gpu.name(),
            weights_mib =
                (layers.iter().map(GpuLayer::weight_bytes).sum::<usize>() + lm_head.bytes()) >> 20,
            kv_mib = (layers
                .iter()
                .map(|l| l.k_cache.memory_bytes() + l.v_cache.memory_bytes())
                .sum::<usize>())
                >> 20,
            free_mib = free >> 20,
            total_mib = total >> 20,
            "model uploaded to the GPU"
        );
        Ok(Self {
            gpu,
            host: model,
            layers,
            output_norm,
            lm_head,
            inv_freq,
            inv_freq_local,
            block_size,
            num_blocks,
            scratch: None,
        })
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        self.host.config()
    }

    /// Bytes of KV cache on the device.
    pub fn kv_memory_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.k_cache.memory_bytes() + l.v_cache.memory_bytes())
            .sum()
    }

    /// Runs the batch as [`Model::forward`] does, writing K/V into the GPU cache, and returns
    /// logits `[r, vocab]`: the rows each sequence's `num_logits` asks for, in batch and
    /// position order.
    pub fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<Vec<f32>, ModelError> {
        // Fields borrowed apart: the host model is read while the layers' caches are written.
        let c = self.host.config();
        let n = batch.num_tokens();
        let d = c.hidden_size;
        if n == 0 {
            return Ok(Vec::new());
        }
        let layout = BatchLayout::new(batch, self.block_size, self.num_blocks)?;
        let mut x_host = embed(batch, &self.host.weights().token_embedding, c.vocab_size, d)?;
        if let Some(scale) = c.architecture.embedding_scale(d) {
            x_host.iter_mut().for_each(|v| *v *= scale);
        }
        let gpu = &self.gpu;
        let b = match &mut self.scratch {
            Some(b) if b.tokens >= n => b,
            // Grow to the next power of two so that a ramping batch reallocates rarely.
            slot => slot.insert(ScratchBuffers::new(gpu, c, n.next_power_of_two())?),
        };
        gpu.stream()
            .memcpy_htod(&x_host, &mut b.x.slice_mut(..n * d))
            .map_err(CudaError::from)?;
        let pos32: Vec<i32> = layout.positions.iter().map(|&p| p as i32).collect();
        let slot32: Vec<i32> = layout.slots.iter().map(|&s| s as i32).collect();
        let positions = gpu.upload(&pos32)?;
        let slots = gpu.upload(&slot32)?;
        let max_slot = layout.slots.iter().copied().max().unwrap_or(0);
        let tables: Vec<&[u32]> = batch.seqs.iter().map(|s| s.block_table).collect();
        let attention = AttentionBatch::new(
            gpu,
            &layout.positions,
            &layout.token_seq,
            &tables,
            self.block_size,
        )?;
        let neox = self.host.rope().style() == RopeStyle::Neox;
        let eps = c.rms_norm_eps;
        for (index, l) in self.layers.iter_mut().enumerate() {
            gpu.rms_norm(&b.x, &l.attn_norm, eps, n, &mut b.normed)?;
            gpu.matmul(&l.wq, &b.normed, n, &mut b.q)?;
            gpu.matmul(&l.wk, &b.normed, n, &mut b.k)?;
            gpu.matmul(&l.wv, &b.normed, n, &mut b.v)?;
            for (out, bias) in [(&mut b.q, &l.bq), (&mut b.k, &l.bk), (&mut b.v, &l.bv)] {
                if let Some(bias) = bias {
                    gpu.add_bias(out, bias, n)?;
                }
            }
            if let Some(g) = &l.gemma {
                gpu.rms_norm_in_place(&mut b.q, &g.q, eps, n * c.num_heads)?;
                gpu.rms_norm_in_place(&mut b.k, &g.k, eps, n * c.num_kv_heads)?;
            }
            let window = c.layer_window(index);
            let inv_freq = match (window, &self.inv_freq_local) {
                (Some(_), Some(local)) => local,
                _ => &self.inv_freq,
            };
            gpu.rope(
                &mut b.q,
                &positions,
                inv_freq,
                n,
                c.num_heads,
                c.head_dim,
                neox,
            )?;
            gpu.rope(
                &mut b.k,
                &positions,
                inv_freq,
                n,
                c.num_kv_heads,
                c.head_dim,
                neox,
            )?;
            gpu.write_kv(
                &mut l.k_cache,
                &b.k,
                &slots,
                max_slot,
                c.num_kv_heads,
                c.head_dim,
            )?;
            gpu.write_kv(
                &mut l.v_cache,
                &b.v,
                &slots,
                max_slot,
                c.num_kv_heads,
                c.head_dim,
            )?;
            gpu.paged_attention(
                &b.q,
                &l.k_cache,
                &l.v_cache,
                &attention,
                c.num_heads,
                c.num_kv_heads,
                c.head_dim,
                self.block_size,
                c.attention_scale,
                window,
                &mut b.attn,
            )?;
            gpu.matmul(&l.wo, &b.attn, n, &mut b.out)?;
            if let Some(g) = &l.gemma {
                gpu.rms_norm_in_place(&mut b.out, &g.post_attention, eps, n)?;
            }
            gpu.add_into(&mut b.x, &b.out, n * d)?;

            gpu.rms_norm(&b.x, &l.ffn_norm, eps, n, &mut b.normed)?;
            gpu.matmul(&l.w_gate, &b.normed, n, &mut b.gate)?;
            gpu.matmul(&l.w_up, &b.normed, n, &mut b.up)?;
            match c.architecture.ffn_activation() {
                FfnActivation::Silu => gpu.silu_mul(&mut b.gate, &b.up, n * c.ffn_size)?,
                FfnActivation::GeluTanh => gpu.gelu_mul(&mut b.gate, &b.up, n * c.ffn_size)?,
            }
            gpu.matmul(&l.w_down, &b.gate, n, &mut b.out)?;
            if let Some(g) = &l.gemma {
                gpu.rms_norm_in_place(&mut b.out, &g.post_ffn, eps, n)?;
            }
            gpu.add_into(&mut b.x, &b.out, n * d)?;
        }
        let r = layout.logit_rows.len();
        if r == 0 {
            gpu.synchronize()?;
            return Ok(Vec::new());
        }
        // Reuse `out` for the gathered rows and `normed` for their norm.
        gpu.gather_rows(&b.x, &layout.logit_rows, d, &mut b.out)?;
        gpu.rms_norm(&b.out, &self.output_norm, eps, r, &mut b.normed)?;
        let mut logits = gpu.zeros::<f32>(r * c.vocab_size)?;
        gpu.matmul(&self.lm_head, &b.normed, r, &mut logits)?;
        Ok(gpu.download(&logits)?)
    }
}

impl GpuLayer {
    fn weight_bytes(&self) -> usize {
        [
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.w_gate,
            &self.w_up,
            &self.w_down,
        ]
        .iter()
        .map(|m| m.bytes())
        .sum()
    }
}
