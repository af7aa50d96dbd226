//! Encoding and streaming-decoding speed on a ~1,200-token prompt, for each tokenizer family.
//!
//! `cargo bench -p tidal-tokenizer --bench encode`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::path::PathBuf;
use tidal_tokenizer::{StreamDecoder, Tokenizer};

fn shared_dir() -> PathBuf {
    match std::env::var_os("TIDAL_SHARED_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    }
}

fn default_model() -> Option<PathBuf> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-model.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Mixed English, code, numbers and non-ASCII text, repeated to about 1,200 tokens.
fn prompt() -> String {
    let para = "<|im_start|>user\nTidal is a serverless inference platform: requests wait in a \
        Redis stream while workers scale from zero. In 2024 it served 1,234,567 requests at \
        $0.15 per million tokens. Ünïcödé, 中文字符, emoji 🚀🦙!\n\
        fn main() { let x: Vec<u32> = (0..10).map(|i| i * 2).collect(); println!(\"{x:?}\"); }\n\
        <|im_end|>\n";
    para.repeat(12)
}

/// `n` words unique to `seed`: letters spelled from a counter, separated by spaces.
fn fresh_words(seed: u64, n: u64) -> String {
    let mut out = String::new();
    for i in 0..n {
        let mut k = seed * 1_000_003 + i;
        out.push(' ');
        while k > 0 {
            out.push(char::from(b'a' + (k % 26) as u8));
            k /= 26;
        }
    }
    out
}

fn bench(c: &mut Criterion) {
    let text = prompt();
    let mut models: Vec<(String, PathBuf)> = ["llama-bpe", "qwen2", "gpt-2", "llama-spm"]
        .iter()
        .map(|n| {
            (
                n.to_string(),
                shared_dir().join(format!("tokenizer-vectors/ggml-vocab-{n}.gguf")),
            )
        })
        .collect();
    if let Some(p) = default_model() {
        models.insert(0, ("smollm2".into(), p));
    }
    let mut group = c.benchmark_group("encode_1200_tokens");
    for (name, path) in &models {
        let Ok(tok) = Tokenizer::from_gguf_file(path) else {
            eprintln!("skipping {name}: cannot load {}", path.display());
            continue;
        };
        let n = tok.encode(&text, true).len();
        eprintln!("{name}: {n} tokens for {} bytes", text.len());
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(name.as_str(), |b| {
            b.iter(|| tok.encode(black_box(&text), true))
        });
        // Cold words: every iteration encodes words never seen before, so the word cache
        // never hits (pessimistic: made-up words also merge less than real ones).
        let mut counter = 0u64;
        group.bench_function(format!("{name}/uncached_words"), |b| {
            b.iter_batched(
                || {
                    counter += 1;
                    fresh_words(counter, 600)
                },
                |t| tok.encode(&t, true),
                criterion::BatchSize::SmallInput,
            )
        });
        let ids = tok.encode(&text, true);
        group.bench_function(format!("{name}/stream_decode"), |b| {
            b.iter(|| {
                let mut dec = StreamDecoder::new();
                let mut out = String::new();
                for &id in &ids {
                    out.push_str(&dec.push(&tok, black_box(id)));
                }
                out
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
