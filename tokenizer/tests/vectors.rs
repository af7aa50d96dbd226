//! llama.cpp's tokenizer test vectors (`test-tokenizer-0`): every case must give exactly the
//! reference ids. Like `test-tokenizer-0.cpp`, inputs are tokenized with `add_special = false`
//! and `parse_special = false`.

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
