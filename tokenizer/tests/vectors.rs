//! llama.cpp's tokenizer test vectors (`test-tokenizer-0`): every case must give exactly the
//! reference ids. Like `test-tokenizer-0.cpp`, inputs are tokenized with `add_special = false`
//! and `parse_special = false`. Decoding the ids must give the input back.

mod common;

use tidal_tokenizer::Tokenizer;

fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let dir = common::shared_dir().join("tokenizer-vectors");
    let inp = std::fs::read_to_string(dir.join(format!("{name}.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap();
    let mut inputs: Vec<String> = inp
        .split("\n__ggml_vocab_test__\n")
        .map(str::to_string)
        .collect();
    if inputs.last().is_some_and(String::is_empty) {
        inputs.pop();
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: case count");
    inputs.into_iter().zip(outputs).collect()
}

fn check(name: &str) {
    let path = common::shared_dir().join("tokenizer-vectors").join(name);
    let tok = Tokenizer::from_gguf_file(&path).unwrap();
    let mut failures = Vec::new();
    let all = cases(name);
    assert!(all.len() >= 40, "{name}: only {} cases", all.len());
    for (text, want) in &all {
        let got = tok.encode_with(text, false, false);
        if &got != want {
            failures.push(format!("{text:?}\n   want {want:?}\n    got {got:?}"));
        }
        // Decoding gives the text back (byte-level BPE and byte-fallback SPM are lossless).
        let back = tok.decode(&got);
        if &back != text {
            failures.push(format!("{text:?}\n   decodes to {back:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn gpt2_vectors() {
    check("ggml-vocab-gpt-2.gguf");
}

#[test]
fn llama_bpe_vectors() {
    check("ggml-vocab-llama-bpe.gguf");
}

#[test]
fn qwen2_vectors() {
    check("ggml-vocab-qwen2.gguf");
}

#[test]
fn llama_spm_vectors() {
    check("ggml-vocab-llama-spm.gguf");
}

/// Deterministic pseudo-random strings: ASCII, whitespace, specials' fragments, and arbitrary
/// code points from the whole Unicode range (unassigned ones included).
fn random_texts(n: usize) -> Vec<String> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let pool: Vec<char> = "aZ09 \t\n\r'sLL<|>/\u{a0}\u{3000}é中🦙▁".chars().collect();
    (0..n)
        .map(|_| {
            let len = (next() % 40) as usize;
            (0..len)
                .map(|_| match next() % 3 {
                    0 => char::from_u32((next() % 0x11_0000) as u32).unwrap_or('?'),
                    _ => pool[(next() % pool.len() as u64) as usize],
                })
                .collect()
        })
        .collect()
}

#[test]
fn arbitrary_text_round_trips_through_every_vocabulary() {
    let texts = random_texts(150);
    for name in [
        "ggml-vocab-gpt-2.gguf",
        "ggml-vocab-llama-bpe.gguf",
        "ggml-vocab-qwen2.gguf",
        "ggml-vocab-llama-spm.gguf",
    ] {
        let path = common::shared_dir().join("tokenizer-vectors").join(name);
        let tok = Tokenizer::from_gguf_file(&path).unwrap();
        for text in &texts {
            let ids = tok.encode_with(text, false, false);
            assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
            // SentencePiece writes spaces as `▁`, so a literal `▁` comes back as a space.
            let want = if name.contains("spm") {
                text.replace('▁', " ")
            } else {
                text.clone()
            };
            assert_eq!(tok.decode(&ids), want, "{name}: {text:?} -> {ids:?}");
            // With special parsing and BOS/EOS the ids stay in range too.
            let ids = tok.encode(text, true);
            assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
        }
    }
}
