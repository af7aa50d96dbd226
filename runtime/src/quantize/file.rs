//! Quantising a GGUF file into another: every tensor the mix changes is dequantised to f32
//! and quantised to its new type row by row (rows in parallel), the others are copied; the
//! metadata is copied with `general.file_type` set, as `llama-quantize` does.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use rayon::prelude::*;

use super::ftype::FileType;
use super::mix::{llama_order, plan_types, ModelFacts, NoFallback, TensorDesc};
use crate::model::gguf_write::{self, TensorEntry, DEFAULT_ALIGNMENT};
use crate::model::{dequantize_bytes, optional_uint, own_kernel_type, ModelError, ModelFile};

/// ggml's quantisation format version (`GGML_QNT_VERSION`), stored as
/// `general.quantization_version`.
const QUANTIZATION_VERSION: u32 = 2;

/// Why a file could not be quantised.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    NoFallback(#[from] NoFallback),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("tensor `{name}` has type {dtype:?}, which cannot be requantised to {to:?}")]
    Unsupported {
        name: String,
        dtype: GgmlDType,
        to: GgmlDType,
    },
    #[error("the input and the output are the same file: {0}")]
    SameFile(String),
}

/// What one tensor became.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorOutcome {
    pub name: String,
    pub from: GgmlDType,
    pub to: GgmlDType,
    /// Bytes of its data in the output.
    pub bytes: u64,
}

/// What [`quantize_file`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeSummary {
    pub file_type: FileType,
    /// In llama.cpp's order, as written.
    pub tensors: Vec<TensorOutcome>,
    /// Bytes of tensor data in the input and the output (without alignment padding).
    pub input_tensor_bytes: u64,
    pub output_tensor_bytes: u64,
}

impl QuantizeSummary {
    /// How many tensors ended up in each type.
    pub fn type_counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for t in &self.tensors {
            *counts.entry(format!("{:?}", t.to)).or_insert(0) += 1;
        }
        counts
    }
}

/// The facts the mix reads from the metadata.
fn model_facts(file: &ModelFile) -> Result<ModelFacts, ModelError> {
    let arch = match file.metadata("general.architecture")? {
        Value::String(s) => s.clone(),
        other => {
            return Err(ModelError::BadMetadata {
                key: "general.architecture".into(),
                message: format!("expected a string, found {other:?}"),
            })
        }
    };
    let key = |k: &str| format!("{arch}.{k}");
    let layers = optional_uint(file, &key("block_count"))?
        .ok_or_else(|| ModelError::MissingMetadata(key("block_count")))?;
    let experts = optional_uint(file, &key("expert_count"))?.unwrap_or(0);
    // head_count_kv may be an array (one per layer) in some files: then no GQA facts.
    let heads = optional_uint(file, &key("attention.head_count"))
        .ok()
        .flatten();
    let kv_heads = optional_uint(file, &key("attention.head_count_kv"))
        .ok()
        .flatten();
    let gqa = match (heads, kv_heads) {
        (Some(h), Some(kv)) if kv > 0 => h / kv,
        _ => 1,
    };
    Ok(ModelFacts {
        arch,
        layers,
        experts,
        gqa,
    })
}

/// The input's metadata with `general.file_type` and `general.quantization_version` set, the
/// architecture first and the rest by key (GGUF readers look keys up; the order is only
/// for a stable output).
fn output_metadata(file: &ModelFile, ftype: FileType) -> Vec<(String, Value)> {
    let mut meta: BTreeMap<String, Value> = file.content().metadata.clone().into_iter().collect();
    meta.insert("general.file_type".into(), Value::U32(ftype.id()));
    meta.insert(
        "general.quantization_version".into(),
        Value::U32(QUANTIZATION_VERSION),
    );
    let mut out: Vec<(String, Value)> = Vec::with_capacity(meta.len());
    if let Some(arch) = meta.remove("general.architecture") {
        out.push(("general.architecture".into(), arch));
    }
    out.extend(meta);
    out
}

/// Writes `values` (one tensor's rows of f32) as `to` into `out`.
fn quantize_rows(to: GgmlDType, values: &[f32], out: &mut [u8]) -> Result<(), GgmlDType> {
    // the types our kernels run are the types our quantisers write
    let kernel = own_kernel_type(to);
    if let Some(ty) = kernel {
        ty.quantize(values, out);
        return Ok(());
    }
    match to {
        GgmlDType::Q5_1 => tidal_kernels::quantize_q5_1(values, out),
        GgmlDType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(values) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlDType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(values) {
                o.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
        GgmlDType::BF16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(values) {
                o.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
            }
        }
        other => return Err(other),
    }
    Ok(())
}

/// Rows converted per parallel task: enough work to amortise the hand-off.
const ROWS_PER_TASK: usize = 16;

/// `bytes` (a tensor of `from` with rows of `cols` values) requantised to `to`.
fn convert(
    name: &str,
    from: GgmlDType,
    to: GgmlDType,
    cols: usize,
    bytes: &[u8],
) -> Result<Vec<u8>, QuantizeError> {
    let unsupported = || QuantizeError::Unsupported {
        name: name.to_string(),
        dtype: from,
        to,
    };
    let in_row = cols / from.block_size() * from.type_size();
    let out_row = cols / to.block_size() * to.type_size();
    let rows = bytes.len() / in_row;
    let mut out = vec![0u8; rows * out_row];
    out.par_chunks_mut(out_row * ROWS_PER_TASK)
        .zip(bytes.par_chunks(in_row * ROWS_PER_TASK))
        .try_for_each(|(o, i)| {
            let mut values = vec![0f32; i.len() / in_row * cols];
            let mut scratch = Vec::new();
            dequantize_bytes(from, i, &mut values, &mut scratch)?;
            quantize_rows(to, &values, o).map_err(|_| unsupported())
        })?;
    Ok(out)
}

/// The file `path` will be written through until it is complete.
fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

/// Quantises the GGUF file `input` to `ftype` into `output` (written beside it under a
/// temporary name, then renamed, so a failed run leaves no half file at `output`).
pub fn quantize_file(
    input: &Path,
    output: &Path,
    ftype: FileType,
) -> Result<QuantizeSummary, QuantizeError> {
    let file = ModelFile::open(input)?;
    if let (Ok(a), Ok(b)) = (input.canonicalize(), output.canonicalize()) {
        if a == b {
            return Err(QuantizeError::SameFile(output.display().to_string()));
        }
    }
    let facts = model_facts(&file)?;
    let mut tensors: Vec<TensorDesc> = file
        .content()
        .tensor_infos
        .iter()
        .map(|(name, info)| TensorDesc {
            name: name.clone(),
            dims: info.shape.dims().iter().rev().copied().collect(),
            dtype: info.ggml_dtype,
        })
        .collect();
    tensors.sort_by(|a, b| llama_order(&a.name, &b.name));
    let types = plan_types(ftype, &facts, &tensors)?;
    let alignment = match file.content().metadata.get("general.alignment") {
        Some(Value::U32(a)) if *a > 0 => u64::from(*a),
        _ => DEFAULT_ALIGNMENT,
    };
    let entries: Vec<TensorEntry> = tensors
        .iter()
        .zip(&types)
        .map(|(t, &dtype)| TensorEntry {
            name: t.name.clone(),
            dims: t.dims.iter().map(|&d| d as u64).collect(),
            dtype,
        })
        .collect();
    let shown = output.display().to_string();
    let write_err = |source| QuantizeError::Write {
        path: shown.clone(),
        source,
    };
    let (header, _) = gguf_write::header(&output_metadata(&file, ftype), &entries, alignment)
        .map_err(write_err)?;
    let partial = partial_path(output);
    let written = write_tensors(
        &file, &tensors, &entries, &header, alignment, &partial, &write_err,
    );
    let outcomes = match written {
        Ok(outcomes) => outcomes,
        Err(e) => {
            // Best effort: the error at hand matters more than a leftover partial file.
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, output).map_err(write_err)?;
    Ok(QuantizeSummary {
        file_type: ftype,
        output_tensor_bytes: outcomes.iter().map(|t| t.outcome.bytes).sum(),
        input_tensor_bytes: outcomes.iter().map(|t| t.in_bytes).sum(),
        tensors: outcomes.into_iter().map(|t| t.outcome).collect(),
    })
}

/// A tensor as written, with its bytes in the input.
struct Written {
    outcome: TensorOutcome,
    in_bytes: u64,
}

/// Writes the header and every tensor (converted where its type changes) to `partial`.
fn write_tensors(
    file: &ModelFile,
    tensors: &[TensorDesc],
    entries: &[TensorEntry],
    header: &[u8],
    alignment: u64,
    partial: &Path,
    write_err: &dyn Fn(std::io::Error) -> QuantizeError,
) -> Result<Vec<Written>, QuantizeError> {
    let mut w = BufWriter::new(File::create(partial).map_err(write_err)?);
    w.write_all(header).map_err(write_err)?;
    let mut outcomes = Vec::with_capacity(tensors.len());
    for (t, e) in tensors.iter().zip(entries) {
        let (_, range) = file.tensor_range(&t.name)?;
        let bytes = &file.mmap()[range];
        let converted;
        let data: &[u8] = if e.dtype == t.dtype {
            bytes
        } else {
            converted = convert(&t.name, t.dtype, e.dtype, t.dims[0], bytes)?;
            &converted
        };
        w.write_all(data).map_err(write_err)?;
        gguf_write::pad(&mut w, data.len() as u64, alignment).map_err(write_err)?;
        outcomes.push(Written {
            outcome: TensorOutcome {
                name: t.name.clone(),
                from: t.dtype,
                to: e.dtype,
                bytes: data.len() as u64,
            },
            in_bytes: bytes.len() as u64,
        });
    }
    w.into_inner()
        .map_err(|e| write_err(e.into_error()))?
        .sync_all()
        .map_err(write_err)?;
    Ok(outcomes)
}
