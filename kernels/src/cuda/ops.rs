//! Launches of the kernels in `kernels.cu`, one method of [`Gpu`] per CPU kernel. Each checks
//! the buffer sizes first: a kernel reading past a buffer would not fail, it would corrupt.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use super::buffers::{GpuKvBuffer, GpuMatrix, GpuWeightFormat};
use super::{CudaError, Gpu};

/// Threads of the element-wise and row kernels' blocks.
const THREADS: u32 = 256;
/// Must match `MM_ROWS` and `MM_WARPS` in kernels.cu.
const MM_ROWS: usize = 8;
const MM_WARPS: usize = 4;
/// Weight rows of one block of the tiled kernels (`MM_WARPS * MM_ROWS_PER_WARP`).
const MM_TILED_WEIGHT_ROWS: usize = 16;
/// From this many activation rows on, block weights use the tiled kernels (activations staged
/// in shared memory); below it the row kernels, which stream weights with no barriers.
pub const TILED_MIN_ROWS: usize = 4;
/// Must match `ATTN_WARPS` and `MAX_HEAD_DIM` in kernels.cu.
const ATTN_WARPS: u32 = 4;
/// Largest head dimension of the attention kernel.
pub const MAX_HEAD_DIM: usize = 256;

/// Where each query token of an attention call reads its keys: device copies of the batch's
/// positions and block tables (built once per forward pass, shared by every layer).
pub struct AttentionBatch {
    /// Position of each token in its sequence.
    pub(crate) positions: CudaSlice<i32>,
    /// Offset of each token's block table in `block_tables`.
    pub(crate) table_offsets: CudaSlice<i32>,
    /// Every sequence's block table, concatenated.
    pub(crate) block_tables: CudaSlice<i32>,
    /// Number of query tokens.
    pub(crate) n_tokens: usize,
    /// Largest block id any table names (checked against the cache size).
    max_block: u32,
}

impl AttentionBatch {
    /// Uploads the batch layout: `positions[t]` of token t, and `tables[s]` with
    /// `token_seq[t]` naming token t's sequence.
    pub fn new(
        gpu: &Gpu,
        positions: &[usize],
        token_seq: &[usize],
        tables: &[&[u32]],
        block_size: usize,
    ) -> Result<Self, CudaError> {
        if positions.len() != token_seq.len() || block_size == 0 {
            return Err(CudaError::Shape(
                "attention batch: one sequence per token and a non-zero block size".into(),
            ));
        }
        let mut starts = Vec::with_capacity(tables.len());
        let mut flat = Vec::new();
        for table in tables {
            starts.push(flat.len() as i32);
            flat.extend(table.iter().map(|&b| b as i32));
        }
        let mut offsets = Vec::with_capacity(positions.len());
        for (&pos, &s) in positions.iter().zip(token_seq) {
            let table = tables.get(s).ok_or_else(|| {
                CudaError::Shape(format!("token of sequence {s} of {}", tables.len()))
            })?;
            if pos / block_size >= table.len() {
                return Err(CudaError::Shape(format!(
                    "block table of {} blocks does not cover position {pos}",
                    table.len()
                )));
            }
            offsets.push(starts[s]);
        }
        let mut pos32: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        // A zero-length device buffer cannot be allocated; an empty batch launches nothing.
        for v in [&mut pos32, &mut offsets, &mut flat] {
            if v.is_empty() {
                v.push(0);
            }
        }
        Ok(Self {
            positions: gpu.upload(&pos32)?,
            table_offsets: gpu.upload(&offsets)?,
            block_tables: gpu.upload(&flat)?,
            n_tokens: positions.len(),
            max_block: tables
                .iter()
                .flat_map(|t| t.iter())
                .copied()
                .max()
                .unwrap_or(0),
        })
    }

    /// Number of query tokens.
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }
}

fn blocks_for(n: usize) -> u32 {
    n.div_ceil(THREADS as usize) as u32
}

fn elementwise(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks_for(n), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of [`THREADS`] per row.
fn rows_config(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), CudaError> {
    if ok {
        Ok(())
    } else {
        Err(CudaError::Shape(what()))
    }
}

fn to_i32(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::Shape(format!("{what} {v} exceeds i32")))
}

impl Gpu {
    fn launch<'a>(
        &'a self,
        f: &'a CudaFunction,
        cfg: LaunchConfig,
        args: impl FnOnce(&mut cudarc::driver::LaunchArgs<'a>),
    ) -> Result<(), CudaError> {
        if cfg.grid_dim.0 == 0 || cfg.grid_dim.1 == 0 || cfg.grid_dim.2 == 0 {
            return Ok(()); // nothing to do; a zero grid is a launch error
        }
        let mut builder = self.stream().launch_builder(f);
        args(&mut builder);
        // SAFETY: each caller passes the kernel's exact parameter list (types and order as in
        // kernels.cu) and has checked that every index the kernel computes is in bounds.
        unsafe { builder.launch(cfg) }?;
        Ok(())
    }

    /// `out = x / sqrt(mean(x²) + eps) * w` for each of the `rows` rows of `w.len()` values.
    pub fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        eps: f32,
        rows: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let d = w.len();
        check(x.len() >= rows * d && out.len() >= rows * d, || {
            format!("rms_norm: {rows} rows of {d} do not fit x/out")
        })?;
        let d32 = to_i32(d, "rms_norm width")?;
        self.launch(&self.functions.rms_norm, rows_config(rows), |b| {
            b.arg(x).arg(w).arg(out).arg(&d32).arg(&eps);
        })
    }

    /// [`Gpu::rms_norm`] in place: each of the `rows` rows of `w.len()` values of `x`
    /// (an attention head for Gemma 3's Q/K norms) is normalised and scaled by `w`.
    pub fn rms_norm_in_place(
        &self,
        x: &mut CudaSlice<f32>,
        w: &CudaSlice<f32>,
        eps: f32,
        rows: usize,
    ) -> Result<(), CudaError> {
        let d = w.len();
        check(d > 0 && x.len() >= rows * d, || {
            format!("rms_norm_in_place: {rows} rows of {d} do not fit x")
        })?;
        let d32 = to_i32(d, "rms_norm width")?;
        self.launch(&self.functions.rms_norm_in_place, rows_config(rows), |b| {
            b.arg(x).arg(w).arg(&d32).arg(&eps);
        })
    }

    /// `gate[i] = gelu(gate[i]) * up[i]` (tanh approximation, as [`crate::gelu_mul`]) for the
    /// first `n` values.
    pub fn gelu_mul(
        &self,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        self.in_place_binary(&self.functions.gelu_mul, "gelu_mul", gate, up, n)
    }

    /// `gate[i] = silu(gate[i]) * up[i]` for the first `n` values.
    pub fn silu_mul(
        &self,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        self.in_place_binary(&self.functions.silu_mul, "silu_mul", gate, up, n)
    }

    /// `x[i] += y[i]` for the first `n` values.
    pub fn add_into(
        &self,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        self.in_place_binary(&self.functions.add_into, "add_into", x, y, n)
    }

    /// Launches `f(x, y, n)`, an elementwise kernel that updates `x` from `y`, after checking
    /// that both hold `n` values.
    fn in_place_binary<'a>(
        &'a self,
        f: &'a CudaFunction,
        what: &str,
        x: &'a mut CudaSlice<f32>,
        y: &'a CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        check(x.len() >= n && y.len() >= n, || {
            format!("{what}: {n} values")
        })?;
        let n32 = to_i32(n, "elementwise length")?;
        self.launch(f, elementwise(n), |b| {
            b.arg(x).arg(y).arg(&n32);
        })
    }

    /// Adds `bias` to each of the `rows` rows of `x`.
    pub fn add_bias(
        &self,
        x: &mut CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        rows: usize,
    ) -> Result<(), CudaError> {
        let width = bias.len();
        let n = rows * width;
        check(x.len() >= n && width > 0, || {
            format!("add_bias: {rows} rows of {width}")
        })?;
        let (n32, w32) = (to_i32(n, "add_bias length")?, to_i32(width, "bias width")?);
        self.launch(&self.functions.add_bias, elementwise(n), |b| {
            b.arg(x).arg(bias).arg(&n32).arg(&w32);
        })
    }

    /// `out[r] = x[rows[r]]` for rows of `d` values.
    pub fn gather_rows(
        &self,
        x: &CudaSlice<f32>,
        rows: &[usize],
        d: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let x_rows = x.len() / d.max(1);
        check(
            rows.iter().all(|&r| r < x_rows) && out.len() >= rows.len() * d,
            || format!("gather_rows: rows {rows:?} of {x_rows}"),
        )?;
        let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        if idx.is_empty() {
            return Ok(());
        }
        let idx = self.upload(&idx)?;
        let d32 = to_i32(d, "row width")?;
        self.launch(&self.functions.gather_rows, rows_config(rows.len()), |b| {
            b.arg(x).arg(&idx).arg(out).arg(&d32);
        })
    }

    /// Rotary embedding in place on `x` `[n_tokens, n_heads, head_dim]` at `positions`
    /// (device, one per token), with `inv_freq` (device, `head_dim / 2` values) as
    /// [`crate::Rope`]. `neox` picks pairs `(i, i + d/2)` instead of `(2i, 2i + 1)`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        positions: &CudaSlice<i32>,
        inv_freq: &CudaSlice<f32>,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        neox: bool,
    ) -> Result<(), CudaError> {
        check(
            head_dim.is_multiple_of(2)
                && inv_freq.len() == head_dim / 2
                && positions.len() >= n_tokens
                && x.len() >= n_tokens * n_heads * head_dim,
            || format!("rope: {n_tokens} tokens × {n_heads} heads × {head_dim}"),
        )?;
        let pairs = n_tokens * n_heads * head_dim / 2;
        let args = (
            to_i32(n_tokens, "tokens")?,
            to_i32(n_heads, "heads")?,
            to_i32(head_dim, "head dim")?,
            neox as i32,
        );
        self.launch(&self.functions.rope, elementwise(pairs), |b| {
            b.arg(x)
                .arg(positions)
                .arg(inv_freq)
                .arg(&args.0)
                .arg(&args.1)
                .arg(&args.2)
                .arg(&args.3);
        })
    }

    /// Writes token t's row of `x` (`n_kv_heads * head_dim` values) into cache slot
    /// `slots[t]`, converting to the cache's type (as [`crate::write_kv`] for one cache).
    pub fn write_kv(
        &self,
        cache: &mut GpuKvBuffer,
        x: &CudaSlice<f32>,
        slots: &CudaSlice<i32>,
        max_slot: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<(), CudaError> {
        let width = n_kv_heads * head_dim;
        let n_tokens = slots.len();
        check(
            width > 0
                && x.len() >= n_tokens * width
                && cache.len() >= (max_slot + 1) * width
                && head_dim <= MAX_HEAD_DIM,
            || format!("write_kv: {n_tokens} rows of {width} into slot ≤ {max_slot}"),
        )?;
        let cfg = LaunchConfig {
            grid_dim: (n_tokens as u32, n_kv_heads as u32, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (nkv, hd) = (
            to_i32(n_kv_heads, "KV heads")?,
            to_i32(head_dim, "head dim")?,
        );
        match cache {
            GpuKvBuffer::F32(c) => self.launch(&self.functions.write_kv_f32, cfg, |b| {
                b.arg(c).arg(x).arg(slots).arg(&nkv).arg(&hd);
            }),
            GpuKvBuffer::F16(c) => self.launch(&self.functions.write_kv_f16, cfg, |b| {
                b.arg(c).arg(x).arg(slots).arg(&nkv).arg(&hd);
            }),
            GpuKvBuffer::Int8 { values, scales } => {
                self.launch(&self.functions.write_kv_int8, cfg, |b| {
                    b.arg(values)
                        .arg(scales)
                        .arg(x)
                        .arg(slots)
                        .arg(&nkv)
                        .arg(&hd);
                })
            }
        }
    }

    /// Causal paged attention of the batch's query tokens `q` `[n_tokens, n_heads,
    /// head_dim]` over K/V caches of `block_size`-token blocks, with an optional sliding
    /// window (as [`crate::paged_attention_windowed`]: the token at position `p` attends to
    /// `p + 1 - window..=p`).
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        q: &CudaSlice<f32>,
        k: &GpuKvBuffer,
        v: &GpuKvBuffer,
        batch: &AttentionBatch,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        scale: f32,
        window: Option<usize>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let n = batch.n_tokens;
        let width = n_kv_heads * head_dim;
        let slots = (batch.max_block as usize + 1) * block_size;
        check(
            n_kv_heads > 0
                && window != Some(0)
                && n_heads.is_multiple_of(n_kv_heads)
                && head_dim <= MAX_HEAD_DIM
                && k.dtype() == v.dtype()
                && k.len() >= slots * width
                && v.len() >= slots * width
                && q.len() >= n * n_heads * head_dim
                && out.len() >= n * n_heads * head_dim,
            || {
                format!(
                    "paged_attention: {n} tokens × {n_heads} heads × {head_dim} over caches \
                     of {} values, block {} of {block_size}, window {window:?}",
                    k.len(),
                    batch.max_block
                )
            },
        )?;
        let cfg = LaunchConfig {
            grid_dim: (n as u32, n_heads as u32, 1),
            block_dim: (32 * ATTN_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let dims = (
            to_i32(n_heads, "heads")?,
            to_i32(n_kv_heads, "KV heads")?,
            to_i32(head_dim, "head dim")?,
            to_i32(block_size, "block size")?,
        );
        // 0: no window (the kernel's convention).
        let window32 = to_i32(window.unwrap_or(0), "window")?;
        let f = match k {
            GpuKvBuffer::F32(_) => &self.functions.attention_f32,
            GpuKvBuffer::F16(_) => &self.functions.attention_f16,
            GpuKvBuffer::Int8 { .. } => &self.functions.attention_int8,
        };
        self.launch(f, cfg, |b| {
            // The cache parameters come first; their types were checked equal above.
            match (k, v) {
                (GpuKvBuffer::F32(kc), GpuKvBuffer::F32(vc)) => {
                    b.arg(kc).arg(vc);
                }
                (GpuKvBuffer::F16(kc), GpuKvBuffer::F16(vc)) => {
                    b.arg(kc).arg(vc);
                }
                (
                    GpuKvBuffer::Int8 {
                        values: kc,
                        scales: ks,
                    },
                    GpuKvBuffer::Int8 {
                        values: vc,
                        scales: vs,
                    },
                ) => {
                    b.arg(kc).arg(ks).arg(vc).arg(vs);
                }
                _ => {}
            }
            b.arg(q)
                .arg(&batch.positions)
                .arg(&batch.table_offsets)
                .arg(&batch.block_tables)
                .arg(out)
                .arg(&dims.0)
                .arg(&dims.1)
                .arg(&dims.2)
                .arg(&dims.3)
                .arg(&scale)
                .arg(&window32);
        })
    }

    /// `y[m, w.rows] = x[m, w.cols] · Wᵀ`.
    pub fn matmul(
        &self,
        w: &GpuMatrix,
        x: &CudaSlice<f32>,
        m: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let (n, k) = (w.rows, w.cols);
        check(x.len() >= m * k && y.len() >= m * n, || {
            format!("matmul: [{m}, {k}] · [{n}, {k}]ᵀ does not fit x/y")
        })?;
        let tiled = m >= TILED_MIN_ROWS;
        let fs = &self.functions;
        let f = match w.format {
            GpuWeightFormat::F16 => &fs.matmul_f16,
            GpuWeightFormat::Blocks(ty) => {
                // `GpuMatrix::from_blocks` accepts only the types with kernels.
                let Some((_, rows, tiles)) = fs.matmul_blocks.iter().find(|f| f.0 == ty) else {
                    return Err(CudaError::Shape(format!("{ty:?} has no GPU block kernel")));
                };
                if tiled {
                    tiles
                } else {
                    rows
                }
            }
        };
        let weight_rows_per_block = match (w.format, tiled) {
            (GpuWeightFormat::Blocks(_), true) => MM_TILED_WEIGHT_ROWS,
            _ => MM_WARPS,
        };
        let cfg = LaunchConfig {
            grid_dim: (
                n.div_ceil(weight_rows_per_block) as u32,
                m.div_ceil(MM_ROWS) as u32,
                1,
            ),
            block_dim: (32 * MM_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let dims = (
            to_i32(m, "rows")?,
            to_i32(n, "rows of W")?,
            to_i32(k, "columns")?,
        );
        self.launch(f, cfg, |b| {
            b.arg(&w.data)
                .arg(x)
                .arg(y)
                .arg(&dims.0)
                .arg(&dims.1)
                .arg(&dims.2);
        })
    }
}
