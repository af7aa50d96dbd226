//! Flags that configure a model and its engine, shared by `runtime` and `bench`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tidal_kernels::DotKernel;
use tidal_runtime::engine::{Device, EngineConfig};
use tidal_runtime::load::{load_model, Loaded};
use tidal_runtime::model::{KvDtype, QuantizeTo};
use tidal_runtime::speculative::{SpeculativeConfig, SpeculativeMethod};

/// Model and engine flags.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// GGUF model file (required, except by `tidal runtime --pool`, which loads models from
    /// `--model-dir`).
    #[arg(long, env = "TIDAL_MODEL")]
    pub model: Option<PathBuf>,
    /// Re-quantise the weights at load: q4_0, q4_1, q8_0, f16 or f32; `stored` keeps every
    /// matrix as stored. Default: as stored, but Q5_1 matrices become Q8_0 (the CPU kernels run
    /// every other type as stored).
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
    /// KV cache element type: f16 (the default), f32 (2x the bytes per token) or int8
    /// (0.53x the bytes of f16).
    #[arg(long, default_value = "f16")]
    pub kv_cache_dtype: KvDtype,
    /// Where the model runs: cpu, cuda or cuda:N (needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu", env = "TIDAL_DEVICE")]
    pub device: Device,
    /// Memory the model may take on its device, e.g. 22GiB (default: what the device has
    /// free at load: the host's MemAvailable within the cgroup's limit, or the GPU's free
    /// memory). A model whose memory plan (weights, KV cache, activations) exceeds it is
    /// refused, with the numbers, before anything is loaded.
    #[arg(long, env = "TIDAL_DEVICE_MEMORY", value_parser = parse_bytes)]
    pub device_memory: Option<usize>,
    /// Where a load that fails leaves its reason, when the file exists: Kubernetes creates
    /// it in every container and shows it in the pod's status, where the controller reads a
    /// memory plan's verdict (the Model's Ready condition becomes DoesNotFit).
    #[arg(
        long,
        env = "TIDAL_TERMINATION_LOG",
        default_value = "/dev/termination-log",
        value_name = "PATH"
    )]
    pub termination_log: PathBuf,
    /// Speculative decoding: off, ngram (prompt lookup: propose the continuation of the
    /// latest earlier occurrence of the last few tokens) or draft (a smaller model of the same
    /// vocabulary, --draft-model, proposes its greedy continuation); proposals are verified in
    /// the same step as every other sequence's work. The tokens are the same either way;
    /// ngram is faster on answers that quote their prompt (summaries, extraction, code edits).
    #[arg(long, default_value = "off", env = "TIDAL_SPECULATIVE")]
    pub speculative: SpeculativeMethod,
    /// The draft model of `--speculative draft`: a GGUF file whose vocabulary is the
    /// model's, token for token (checked at load).
    #[arg(long, env = "TIDAL_DRAFT_MODEL", value_name = "PATH")]
    pub draft_model: Option<PathBuf>,
    /// Re-quantise the draft model's weights at load, as --quantize does the model's.
    #[arg(long)]
    pub draft_quantize: Option<QuantizeTo>,
    /// Blocks of the draft model's own KV cache (default: the model's number of blocks plus
    /// one per sequence, --max-num-seqs). A sequence the draft cache has no room for gets no
    /// proposal.
    #[arg(long)]
    pub draft_kv_blocks: Option<usize>,
    /// Time of one draft forward pass as a fraction of a one-token step of the model, added
    /// to --speculative-verify-cost for each token the draft proposes (default: measured
    /// when the engine starts). 0 proposes as if drafting were free.
    #[arg(long)]
    pub draft_cost: Option<f64>,
    /// Most tokens proposed for one sequence in one step; each sequence proposes fewer when
    /// few of its proposals are accepted.
    #[arg(long, default_value_t = 8, env = "TIDAL_NUM_SPECULATIVE_TOKENS")]
    pub num_speculative_tokens: usize,
    /// Speculation pauses while more sequences than this are running (the step is then no
    /// longer bound by reading the weights).
    #[arg(long, default_value_t = 8)]
    pub speculative_max_running: usize,
    /// Shortest suffix (in tokens) the ngram proposer looks up.
    #[arg(long, default_value_t = 1)]
    pub prompt_lookup_min: usize,
    /// Longest suffix (in tokens) the ngram proposer looks up; longer matches win.
    #[arg(long, default_value_t = 4)]
    pub prompt_lookup_max: usize,
    /// What one more verified token adds to a step, as a fraction of a one-token step: the
    /// price each sequence's number of proposals is weighed against (default: the engine
    /// times steps of 1 + k tokens when it starts and weighs each k at its measured price).
    #[arg(long)]
    pub speculative_verify_cost: Option<f64>,
    /// CPU matmul kernel: auto (the fastest this CPU has), amx, avx512-vnni, avx2-vnni, avx2,
    /// avx2-rows or portable; to compare kernels on one machine.
    #[arg(long, default_value = "auto", env = "TIDAL_CPU_KERNEL", value_parser = parse_cpu_kernel)]
    pub cpu_kernel: CpuKernel,
}

/// `--cpu-kernel`: a named kernel, or `None` for `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuKernel(pub Option<DotKernel>);

/// Parses `--cpu-kernel`.
fn parse_cpu_kernel(s: &str) -> Result<CpuKernel, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(CpuKernel(None));
    }
    DotKernel::from_name(s)
        .map(|k| CpuKernel(Some(k)))
        .ok_or_else(|| {
            let names: Vec<&str> = DotKernel::NAMED.iter().map(|(n, _)| *n).collect();
            format!(
                "unknown CPU kernel {s:?}; one of auto, {}",
                names.join(", ")
            )
        })
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
            kv_cache_dtype: self.kv_cache_dtype,
            device: self.device,
            device_memory: self.device_memory,
            speculative: self.speculative_config(),
        }
    }

    /// Speculative decoding settings from the flags.
    pub fn speculative_config(&self) -> SpeculativeConfig {
        SpeculativeConfig {
            method: self.speculative,
            num_speculative_tokens: self.num_speculative_tokens,
            ngram_min: self.prompt_lookup_min,
            ngram_max: self.prompt_lookup_max,
            max_running: self.speculative_max_running,
            verify_cost: self.speculative_verify_cost,
            draft_model: self.draft_model.clone(),
            draft_quantize: self.draft_quantize,
            draft_kv_blocks: self.draft_kv_blocks,
            draft_cost: self.draft_cost,
        }
    }

    /// The `--model` file; an error naming the flag when it is missing.
    pub fn model_path(&self) -> anyhow::Result<&Path> {
        self.model
            .as_deref()
            .context("--model (or TIDAL_MODEL) is required: the GGUF model file")
    }

    /// Checks the speculative settings and selects the CPU kernel: what every load needs
    /// first.
    pub fn prepare(&self) -> anyhow::Result<()> {
        self.speculative_config().validate().map_err(anyhow::Error::msg).context(
            "speculative decoding settings (--speculative, --draft-model, --prompt-lookup-min, --prompt-lookup-max, --speculative-verify-cost, --draft-cost, --draft-kv-blocks)",
        )?;
        if let CpuKernel(Some(kernel)) = self.cpu_kernel {
            kernel.select().map_err(anyhow::Error::msg)?;
        }
        tracing::info!(
            cpu_kernel = DotKernel::selected().name(),
            "CPU matmul kernel"
        );
        Ok(())
    }

    /// Maps the model, builds tokenizer and template, and starts the engine.
    pub fn load(&self) -> anyhow::Result<Loaded> {
        let model = self.model_path()?;
        self.prepare()?;
        load_model(model, self.engine_config(), self.quantize)
            .inspect_err(|e| self.leave_termination_message(&e.to_string()))
            .with_context(|| format!("loading {}", model.display()))
    }

    /// Writes `message` to `--termination-log` if that file exists (in a Kubernetes
    /// container; never created here), at most the 4 KiB Kubernetes keeps.
    fn leave_termination_message(&self, message: &str) {
        if !self.termination_log.exists() {
            return;
        }
        // The verdict is the last line: keep the end of a long message.
        let start = message.len().saturating_sub(4096);
        let start = (start..message.len())
            .find(|&i| message.is_char_boundary(i))
            .unwrap_or(message.len());
        if let Err(e) = std::fs::write(&self.termination_log, &message[start..]) {
            tracing::warn!(error = %e, path = %self.termination_log.display(), "writing the termination message failed");
        }
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

/// Parses `30s`, `500ms`, `2m`, `1h` or a plain number of seconds (`1.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 30s, 500ms, 2m)"))?;
    let seconds = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1e3,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("unknown duration unit `{other}` (use ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("`{s}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3 weeks").is_err());
    }

    #[test]
    fn cpu_kernels() {
        assert_eq!(parse_cpu_kernel("auto"), Ok(CpuKernel(None)));
        assert_eq!(
            parse_cpu_kernel("AVX2-VNNI"),
            Ok(CpuKernel(Some(DotKernel::Avx2Vnni)))
        );
        for (name, k) in DotKernel::NAMED {
            assert_eq!(parse_cpu_kernel(name), Ok(CpuKernel(Some(k))));
        }
        let e = parse_cpu_kernel("sse9").unwrap_err();
        assert!(e.contains("avx512-vnni") && e.contains("auto"), "{e}");
    }

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    #[test]
    fn flags_parse_through_clap() {
        use clap::Parser;
        let parse =
            |args: &[&str]| Cli::try_parse_from([&["tidal", "--model", "m.gguf"], args].concat());
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.engine.cpu_kernel, CpuKernel(None));
        // The flags' defaults are the engine's.
        let defaults = SpeculativeConfig {
            method: SpeculativeMethod::Off,
            ..SpeculativeConfig::default()
        };
        assert_eq!(cli.engine.speculative_config(), defaults);
        let cli = parse(&["--speculative", "ngram", "--num-speculative-tokens", "3"]).unwrap();
        let spec = cli.engine.speculative_config();
        assert_eq!(
            (spec.method, spec.num_speculative_tokens),
            (SpeculativeMethod::Ngram, 3)
        );
        assert!(parse(&["--speculative", "medusa"]).is_err());
        let cli = parse(&[
            "--speculative",
            "draft",
            "--draft-model",
            "small.gguf",
            "--draft-quantize",
            "q8_0",
            "--draft-kv-blocks",
            "64",
            "--draft-cost",
            "0.2",
        ])
        .unwrap();
        let spec = cli.engine.speculative_config();
        assert_eq!(spec.method, SpeculativeMethod::Draft);
        assert_eq!(spec.draft_model, Some(PathBuf::from("small.gguf")));
        assert_eq!(spec.draft_quantize, Some(QuantizeTo::Q8_0));
        assert_eq!(
            (spec.draft_kv_blocks, spec.draft_cost),
            (Some(64), Some(0.2))
        );
        assert_eq!(spec.validate(), Ok(()));
        let cli = parse(&["--speculative", "draft"]).unwrap();
        let e = cli.engine.speculative_config().validate().unwrap_err();
        assert!(e.contains("--draft-model"), "{e}");
        let cli = parse(&["--cpu-kernel", "avx2"]).unwrap();
        assert_eq!(cli.engine.cpu_kernel, CpuKernel(Some(DotKernel::Avx2)));
        assert!(parse(&["--cpu-kernel", "sse9"]).is_err());
    }

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
