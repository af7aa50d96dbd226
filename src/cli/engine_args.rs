//! Flags that configure a model and its engine, shared by `runtime` and `bench`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use tidal_runtime::engine::{Engine, EngineConfig};
use tidal_runtime::model::{Model, ModelFile, QuantizeTo};
use tidal_tokenizer::{ChatTemplate, ChatTemplateError, Tokenizer};

/// Model and engine flags.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// GGUF model file.
    #[arg(long, env = "TIDAL_MODEL")]
    pub model: PathBuf,
    /// Re-quantise the weights at load: q4_0, q4_1, q8_0 or f16.
    #[arg(long)]
    pub quantize: Option<QuantizeTo>,
    /// KV cache memory, e.g. 512MiB or 2GiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub kv_cache_memory: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Token budget of one engine step (prefill chunks + decode tokens).
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Most sequences in one step.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Turn prefix caching off.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Worker threads for the kernels (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// A loaded model: engine, tokenizer and chat template.
pub struct Loaded {
    pub engine: Engine,
    pub chat_template: Option<ChatTemplate>,
    pub load_seconds: f64,
}

impl EngineArgs {
    /// Engine settings from the flags.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            block_size: self.block_size,
            kv_cache_memory: self.kv_cache_memory,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            enable_prefix_caching: !self.no_prefix_caching,
            threads: self.threads,
        }
    }

    /// Maps the model, builds tokenizer and template, and starts the engine.
    pub fn load(&self) -> anyhow::Result<Loaded> {
        let started = std::time::Instant::now();
        let file = ModelFile::open(&self.model)
            .with_context(|| format!("loading {}", self.model.display()))?;
        let tokenizer = Tokenizer::from_gguf(file.content())
            .context("building the tokenizer from GGUF metadata")?;
        let chat_template = match ChatTemplate::from_gguf(file.content()) {
            Ok(t) => Some(t),
            Err(ChatTemplateError::Missing) => {
                tracing::warn!(
                    "the model has no chat template: /v1/chat/completions will answer 400"
                );
                None
            }
            Err(e) => return Err(e).context("compiling the model's chat template"),
        };
        let model = Model::load(&file, self.quantize).context("loading model weights")?;
        let engine = Engine::start(model, Arc::new(tokenizer), self.engine_config())
            .context("starting the engine")?;
        let load_seconds = started.elapsed().as_secs_f64();
        tracing::info!(seconds = format!("{load_seconds:.3}"), "model ready");
        Ok(Loaded {
            engine,
            chat_template,
            load_seconds,
        })
    }
}

/// Parses `123`, `512MiB`, `2GiB`, `1.5GB`, `64k` into bytes.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 512MiB, 2GiB)"))?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "ki" | "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mi" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    Ok((value * factor) as usize)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("MiB").is_err());
    }
}
