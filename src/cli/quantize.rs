//! `tidal quantize`: writes a GGUF file in one of llama.cpp's quantisation mixes (Q4_K_M,
//! Q6_K, ...) from any GGUF file the runtime reads, with our own quantisers. Prints a JSON
//! summary: the tensors per type and the bytes before and after.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde_json::json;
use tidal_runtime::quantize::{quantize_file, FileType};

/// Flags of `tidal quantize`.
#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The mix to write: q4_k_m, q4_k_s, q5_k_m, q6_k, q8_0, q4_0 or q4_1 (llama.cpp's
    /// per-tensor rules for each, without an importance matrix).
    #[arg(long = "type", value_name = "TYPE", value_parser = parse_file_type)]
    pub file_type: FileType,
    /// The GGUF file to read (any tensor type the runtime reads; quantised tensors are
    /// dequantised to f32 first).
    pub input: PathBuf,
    /// The GGUF file to write (replaced if it exists).
    pub output: PathBuf,
}

fn parse_file_type(s: &str) -> Result<FileType, String> {
    s.parse()
}

/// Quantises the file and prints the summary.
pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let summary = quantize_file(&args.input, &args.output, args.file_type).with_context(|| {
        format!(
            "quantising {} to {} as {}",
            args.input.display(),
            args.output.display(),
            args.file_type
        )
    })?;
    let out = json!({
        "input": args.input.display().to_string(),
        "output": args.output.display().to_string(),
        "type": summary.file_type.name(),
        "tensors": summary.tensors.len(),
        "tensor_types": summary.type_counts(),
        "input_tensor_bytes": summary.input_tensor_bytes,
        "output_tensor_bytes": summary.output_tensor_bytes,
        "seconds": (started.elapsed().as_secs_f64() * 100.0).round() / 100.0,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&out).context("printing the summary")?
    );
    Ok(())
}
