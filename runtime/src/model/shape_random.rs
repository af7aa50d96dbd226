//! Shape files with weights: a real model's shape ([`ShapeSpec`]) filled with seeded random
//! blocks of its tensor types, and a byte-level vocabulary, so that the whole runtime (the
//! tokenizer, the engine, `tidal bench`) runs on it. They are throughput fixtures: the output
//! is meaningless, correctness comes from the real small models. An 8B-class file is generated
//! in seconds on the machine that needs it (a GPU machine that can reach no download site)
//! instead of fetched.
//!
//! Each block's scale fields are set so that a weight's magnitude is about `1/√cols` (the
//! forward pass stays finite through every layer); every other byte is random.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use rayon::prelude::*;

use tidal_kernels::QuantType;

use super::gguf_write::{pad, DEFAULT_ALIGNMENT};
use super::own_kernel_type;
use super::shape_gguf::{is_norm, ShapeLayout, ShapeSpec};

/// Bytes generated from one random stream: chunks are independent, so the file is the same
/// whatever the number of threads.
const CHUNK_BYTES: usize = 1 << 20;

/// Tokens [`byte_level_vocabulary`] always holds: the 256 bytes, `<s>`, `</s>` and a merge.
const FIXED_TOKENS: usize = 259;

/// Writes `spec` to `path` with random weights from `seed` and a byte-level vocabulary
/// (GPT-2's 256 byte pieces, `<s>` and `</s>`, then unused pieces up to the vocabulary size).
pub fn write_random_shape_gguf(path: &Path, spec: &ShapeSpec, seed: u64) -> io::Result<()> {
    if spec.vocab < FIXED_TOKENS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a vocabulary of {} tokens cannot hold the 256 bytes, <s>, </s> and a merge",
                spec.vocab
            ),
        ));
    }
    let layout = ShapeLayout::new(spec, byte_level_vocabulary(spec.vocab))?;
    let mut out = BufWriter::with_capacity(CHUNK_BYTES, std::fs::File::create(path)?);
    out.write_all(&layout.header)?;
    let mut written = 0u64;
    for (index, t) in layout.tensors.iter().enumerate() {
        // Each tensor starts aligned, after the previous one's padding.
        pad(&mut out, written, DEFAULT_ALIGNMENT)?;
        let encoding = Encoding::of(t.dtype)?;
        let is_norm = is_norm(&t.name);
        let cols = t.dims.first().copied().unwrap_or(1) as usize;
        let unit = encoding.unit_bytes();
        let mut data = vec![0u8; t.bytes() as usize];
        data.par_chunks_mut((CHUNK_BYTES / unit).max(1) * unit)
            .enumerate()
            .try_for_each(|(chunk, bytes)| {
                let mut rng = StdRng::seed_from_u64(stream_seed(seed, index, chunk));
                encoding.fill(is_norm, cols, bytes, &mut rng)
            })?;
        out.write_all(&data)?;
        written = written.next_multiple_of(DEFAULT_ALIGNMENT) + t.bytes();
    }
    pad(&mut out, written, DEFAULT_ALIGNMENT)?;
    out.flush()
}

/// An independent stream per (seed, tensor, chunk): each number is mixed into the hash of
/// the ones before, so no two triples share a stream (XOR-ing them together would: seed 1,
/// chunk 3 and seed 2, chunk 0).
fn stream_seed(seed: u64, tensor: usize, chunk: usize) -> u64 {
    mix(mix(mix(seed) ^ tensor as u64) ^ chunk as u64)
}

/// SplitMix64's step: nearby inputs give unrelated outputs.
fn mix(z: u64) -> u64 {
    let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// GPT-2 byte pieces for bytes 0..=255 (ids 0..=255), `<s>` (256) and `</s>` (257), the
/// merge of two NUL bytes (258), then `<unused_N>` pieces: any text encodes, one token per
/// byte except NUL pairs. (The one merge is there because llama.cpp refuses an empty merge
/// list, whose element type GGUF cannot record.)
fn byte_level_vocabulary(vocab: usize) -> Vec<(String, Value)> {
    let table = tidal_tokenizer::pretokenize::byte_to_char_table();
    let mut tokens: Vec<Value> = table.iter().map(|c| Value::String(c.to_string())).collect();
    tokens.push(Value::String("<s>".into()));
    tokens.push(Value::String("</s>".into()));
    let nul = table[0];
    tokens.push(Value::String(format!("{nul}{nul}")));
    debug_assert_eq!(tokens.len(), FIXED_TOKENS);
    tokens.extend((FIXED_TOKENS..vocab).map(|i| Value::String(format!("<unused_{i}>"))));
    let merges = vec![Value::String(format!("{nul} {nul}"))];
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(256)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(257)),
    ]
}

/// How a tensor type stores its values.
#[derive(Clone, Copy)]
enum Encoding {
    /// One float per value: f32, f16 or bf16.
    Float(GgmlDType),
    /// Blocks of a type the kernels read.
    Blocks(QuantType),
}

impl Encoding {
    fn of(dtype: GgmlDType) -> io::Result<Self> {
        match dtype {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => Ok(Self::Float(dtype)),
            other => own_kernel_type(other).map(Self::Blocks).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("no random weights for tensors of type {other:?}"),
                )
            }),
        }
    }

    /// Bytes of a value or block: a random stream covers whole ones.
    fn unit_bytes(self) -> usize {
        match self {
            Self::Float(dtype) => dtype.type_size(),
            Self::Blocks(ty) => ty.block_bytes(),
        }
    }

    /// Fills `bytes` (whole units) with a norm's ones, or with random weights of rows of
    /// `cols`, about `1/√cols` in magnitude.
    fn fill(
        self,
        is_norm: bool,
        cols: usize,
        bytes: &mut [u8],
        rng: &mut StdRng,
    ) -> io::Result<()> {
        let magnitude = 1.0 / (cols.max(1) as f32).sqrt();
        match self {
            Self::Float(dtype) => {
                for v in bytes.chunks_exact_mut(dtype.type_size()) {
                    let x = if is_norm {
                        1.0
                    } else {
                        rng.random_range(-magnitude..magnitude)
                    };
                    match dtype {
                        GgmlDType::F32 => v.copy_from_slice(&x.to_le_bytes()),
                        GgmlDType::F16 => v.copy_from_slice(&f16::from_f32(x).to_le_bytes()),
                        _ => v.copy_from_slice(&bf16::from_f32(x).to_le_bytes()),
                    }
                }
            }
            Self::Blocks(ty) if is_norm => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a norm of {ty:?} blocks: norms are float vectors"),
                ))
            }
            Self::Blocks(ty) => {
                rng.fill_bytes(bytes);
                let (d, second) = scales(ty, magnitude);
                let (d_at, second_at) = ty.f16_fields();
                for b in bytes.chunks_exact_mut(ty.block_bytes()) {
                    b[d_at..d_at + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                    if let Some(at) = second_at {
                        b[at..at + 2].copy_from_slice(&f16::from_f32(second).to_le_bytes());
                    }
                }
            }
        }
        Ok(())
    }
}

/// A block type's f16 scale `d` and second field ([`QuantType::f16_fields`]) for weights of
/// about `magnitude`: `d` is `magnitude` over the spread of what it multiplies when the other
/// bytes are uniformly random (e.g. Q4_0's `q - 8` has a standard deviation of 4.6), and the
/// minimum (Q4_1) or `dmin` (K-quants) centres the weights on zero.
fn scales(ty: QuantType, magnitude: f32) -> (f32, f32) {
    let m = magnitude;
    match ty {
        QuantType::Q4_0 => (m / 4.6, 0.0),
        QuantType::Q4_1 => (m / 4.6, -7.5 * m / 4.6),
        QuantType::Q5_0 => (m / 9.2, 0.0),
        QuantType::Q8_0 => (m / 74.0, 0.0),
        // d · sc · q − dmin · mn with 4-bit sc, mn and 2-bit q.
        QuantType::Q2_K => (m / 11.3, 1.5 * m / 11.3),
        // d · (sc − 32) · q with q in −4..=3.
        QuantType::Q3_K => (m / 42.5, 0.0),
        // d · sc · q − dmin · mn with 6-bit sc, mn and 4-bit (Q4_K) or 5-bit (Q5_K) q.
        QuantType::Q4_K => (m / 202.0, 7.5 * m / 202.0),
        QuantType::Q5_K => (m / 427.0, 15.5 * m / 427.0),
        // d · sc · (q − 32) with i8 sc and 6-bit q.
        QuantType::Q6_K => (m / 1367.0, 0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ForwardBatch, KvDtype, KvStorage, Model, ModelFile, QuantMix};
    use tidal_tokenizer::Tokenizer;

    #[test]
    fn random_blocks_dequantise_to_finite_weights_of_the_asked_magnitude() {
        let cols = 512;
        let want = 1.0 / (cols as f32).sqrt();
        for dtype in [
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q5_0,
            GgmlDType::Q8_0,
            GgmlDType::Q2K,
            GgmlDType::Q3K,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
        ] {
            let ty = own_kernel_type(dtype).unwrap();
            let rows = 64;
            let mut bytes = vec![0u8; rows * ty.row_bytes(cols)];
            let mut rng = StdRng::seed_from_u64(3);
            let encoding = Encoding::of(dtype).unwrap();
            encoding.fill(false, cols, &mut bytes, &mut rng).unwrap();
            let mut w = vec![f32::NAN; rows * cols];
            ty.dequantize(&bytes, &mut w);
            assert!(w.iter().all(|v| v.is_finite()), "{dtype:?}");
            let rms = (w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32).sqrt();
            let mean = w.iter().sum::<f32>() / w.len() as f32;
            // A scale read from the wrong bytes would be a random f16: off by orders of
            // magnitude, or not finite.
            assert!(
                (0.5 * want..2.0 * want).contains(&rms),
                "{dtype:?}: rms {rms}, want about {want}"
            );
            assert!(mean.abs() < 0.25 * want, "{dtype:?}: mean {mean}");
        }
        assert!(Encoding::of(GgmlDType::Q8K).is_err());
    }

    fn small(mix: QuantMix) -> ShapeSpec {
        ShapeSpec {
            name: "small".into(),
            layers: 2,
            hidden: 256,
            ffn: 512,
            heads: 4,
            kv_heads: 2,
            vocab: 300,
            context: 512,
            tied_embeddings: false,
            mix,
        }
    }

    #[test]
    fn a_random_shape_file_tokenizes_loads_and_runs() {
        let dir = tempfile::tempdir().unwrap();
        for mix in [QuantMix::Q4KM, QuantMix::Uniform(GgmlDType::Q4_0)] {
            let spec = small(mix);
            let path = dir.path().join("model.gguf");
            write_random_shape_gguf(&path, &spec, 5).unwrap();
            let file = ModelFile::open(&path).unwrap();
            let tok = Tokenizer::from_gguf(file.content()).unwrap();
            let text = "The capital of France is é";
            let ids = tok.encode(text, false);
            assert_eq!(ids.len(), text.len(), "one token per byte: {ids:?}");
            assert_eq!(tok.decode(&ids), text);
            assert_eq!(tok.encode("a\0\0", false), [u32::from(b'a'), 258]);
            let model = Model::load(&file, None).unwrap();
            let table: Vec<u32> = (0..4).collect();
            let batch = ForwardBatch::prompt(&ids, &table);
            let mut kv = KvStorage::new(model.config(), KvDtype::F32, 4, 16);
            let logits = model.forward(&batch, &mut kv).unwrap();
            assert_eq!(logits.len(), spec.vocab);
            assert!(logits.iter().all(|v| v.is_finite()), "{mix:?}");
            let spread = logits.iter().fold(f32::MIN, |a, &b| a.max(b))
                - logits.iter().fold(f32::MAX, |a, &b| a.min(b));
            assert!(spread > 1e-3, "{mix:?}: logits all alike");
        }
    }

    #[test]
    fn the_same_seed_writes_the_same_file_and_another_seed_another() {
        let dir = tempfile::tempdir().unwrap();
        let spec = small(QuantMix::Q4KM);
        let write = |name: &str, seed| {
            let path = dir.path().join(name);
            write_random_shape_gguf(&path, &spec, seed).unwrap();
            std::fs::read(path).unwrap()
        };
        let (a, b, c) = (write("a", 1), write("b", 1), write("c", 2));
        assert_eq!(a, b);
        assert_eq!(a.len(), c.len());
        assert_ne!(a, c);
        let too_small = ShapeSpec {
            vocab: 100,
            ..small(QuantMix::Q4KM)
        };
        assert!(write_random_shape_gguf(&dir.path().join("d"), &too_small, 1).is_err());
    }

    #[test]
    fn stream_seeds_differ_between_neighbours() {
        let seeds: std::collections::HashSet<u64> = (0..4)
            .flat_map(|t| (0..4).map(move |c| stream_seed(1, t, c)))
            .chain((0..4).map(|c| stream_seed(2, 0, c)))
            .collect();
        assert_eq!(seeds.len(), 20);
    }
}
