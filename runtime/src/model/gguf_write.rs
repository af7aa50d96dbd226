//! Writing GGUF (version 3) headers: metadata of any value type and tensor infos, with the
//! data offsets each tensor must be written at, so a writer can stream tensors one at a time.

use std::io::{self, Write};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;

/// GGUF's default alignment of tensor data (`general.alignment` overrides it).
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;

/// A tensor's entry in the header.
#[derive(Debug, Clone)]
pub(crate) struct TensorEntry {
    pub name: String,
    /// GGUF order: the row length first.
    pub dims: Vec<u64>,
    pub dtype: GgmlDType,
}

impl TensorEntry {
    /// Bytes of the tensor's data.
    pub fn bytes(&self) -> u64 {
        let elems: u64 = self.dims.iter().product();
        elems / self.dtype.block_size() as u64 * self.dtype.type_size() as u64
    }
}

/// GGML's number for a tensor type (`enum ggml_type`).
pub(crate) fn ggml_type_id(dtype: GgmlDType) -> u32 {
    match dtype {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// GGUF's number for a value type (`enum gguf_type`).
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn value(out: &mut Vec<u8>, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend(x.to_le_bytes()),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => string(out, s),
        Value::Array(items) => {
            // The element type of an empty array is lost on reading; any type reads back empty.
            let ty = items.first().map_or(value_type(&Value::U32(0)), value_type);
            if items.iter().any(|i| value_type(i) != ty) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a GGUF array holds values of one type",
                ));
            }
            out.extend(ty.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for i in items {
                value(out, i)?;
            }
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
    Ok(())
}

/// The header of a GGUF file holding `metadata` and `tensors` (in that order, each tensor's
/// data aligned to `alignment`), padded to where the data starts; and the offset of each
/// tensor's data from there. The data section is `offsets.last() + bytes` long, each tensor
/// followed by zeros up to the next alignment.
pub(crate) fn header(
    metadata: &[(String, Value)],
    tensors: &[TensorEntry],
    alignment: u64,
) -> io::Result<(Vec<u8>, Vec<u64>)> {
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, v) in metadata {
        string(&mut out, key);
        out.extend(value_type(v).to_le_bytes());
        value(&mut out, v)?;
    }
    let mut offsets = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for t in tensors {
        string(&mut out, &t.name);
        out.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(ggml_type_id(t.dtype).to_le_bytes());
        out.extend(offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.bytes()).next_multiple_of(alignment);
    }
    out.resize(out.len().next_multiple_of(alignment as usize), 0);
    Ok((out, offsets))
}

/// Writes zeros from a tensor of `len` bytes up to the next `alignment`.
pub(crate) fn pad(w: &mut impl Write, len: u64, alignment: u64) -> io::Result<()> {
    let padding = len.next_multiple_of(alignment) - len;
    w.write_all(&vec![0u8; padding as usize])
}
