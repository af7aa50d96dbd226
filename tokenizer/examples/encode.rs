//! Tokenizes test cases with a GGUF tokenizer and prints one line of ids per case, in the
//! format of llama.cpp's `.out` vector files (for comparing against other implementations).
//!
//! `cargo run -p tidal-tokenizer --example encode -- <model.gguf> <cases.inp> [--parse-special]`
//! where cases are separated by `\n__ggml_vocab_test__\n`.

use std::process::ExitCode;
use tidal_tokenizer::Tokenizer;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: encode <model.gguf> <cases.inp> [--parse-special]");
        return ExitCode::FAILURE;
    }
    let parse_special = args.iter().any(|a| a == "--parse-special");
    let tok = match Tokenizer::from_gguf_file(&args[1]) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let text = match std::fs::read_to_string(&args[2]) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", args[2]);
            return ExitCode::FAILURE;
        }
    };
    for case in text.split("\n__ggml_vocab_test__\n") {
        let ids = tok.encode_with(case, false, parse_special);
        let line: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", line.join(" "));
    }
    ExitCode::SUCCESS
}
