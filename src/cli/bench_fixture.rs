//! `tidal bench fixture`: writes a throughput fixture, a GGUF file of a real model's shape
//! (Llama 3 8B, Llama 3.2 1B) with seeded random weights and a byte-level vocabulary, for
//! `tidal bench` on a machine with no download site (the GPU checks). Its output is
//! meaningless; it has the real model's bytes per token and FLOPs.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use candle_core::quantized::GgmlDType;
use clap::{Args, ValueEnum};
use tidal_runtime::model::{write_random_shape_gguf, QuantMix, ShapeSpec};

/// Flags of `tidal bench fixture`.
#[derive(Args, Debug)]
pub struct FixtureArgs {
    /// The model whose shape the file has.
    #[arg(long, value_enum, default_value_t = FixtureShape::Llama3_8b)]
    pub shape: FixtureShape,
    /// Tensor types: one block type for every matrix, or llama.cpp's Q4_K_M mix.
    #[arg(long, value_enum, default_value_t = FixtureQuant::Q4_0)]
    pub quant: FixtureQuant,
    /// Seed of the weights: the same seed writes the same file.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write the file.
    #[arg(long)]
    pub out: PathBuf,
}

/// Shapes of `tidal bench fixture`.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum FixtureShape {
    /// Llama 3 8B: 32 layers, hidden 4096, FFN 14336, GQA 32/8, 128,256 tokens.
    #[value(name = "llama3-8b")]
    Llama3_8b,
    /// Llama 3.2 1B: 16 layers, hidden 2048, FFN 8192, GQA 32/8, tied embeddings.
    #[value(name = "llama3.2-1b")]
    Llama32_1b,
}

/// Tensor types of `tidal bench fixture`.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum FixtureQuant {
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_k_m")]
    Q4KM,
    #[value(name = "f16")]
    F16,
}

impl FixtureQuant {
    fn mix(self) -> QuantMix {
        match self {
            Self::Q4_0 => QuantMix::Uniform(GgmlDType::Q4_0),
            Self::Q4_1 => QuantMix::Uniform(GgmlDType::Q4_1),
            Self::Q8_0 => QuantMix::Uniform(GgmlDType::Q8_0),
            Self::Q4KM => QuantMix::Q4KM,
            Self::F16 => QuantMix::Uniform(GgmlDType::F16),
        }
    }
}

/// Writes the fixture and prints its path, size and how long it took as JSON.
pub fn run(args: FixtureArgs) -> anyhow::Result<()> {
    let mix = args.quant.mix();
    let spec = match args.shape {
        FixtureShape::Llama3_8b => ShapeSpec::llama3_8b(mix),
        FixtureShape::Llama32_1b => ShapeSpec::llama32_1b(mix),
    };
    let started = Instant::now();
    write_random_shape_gguf(&args.out, &spec, args.seed)
        .with_context(|| format!("writing {}", args.out.display()))?;
    let bytes = std::fs::metadata(&args.out)
        .with_context(|| format!("reading the size of {}", args.out.display()))?
        .len();
    super::bench::print(&serde_json::json!({
        "bench": "fixture",
        "path": args.out.display().to_string(),
        "shape": spec.name,
        "quant": format!("{:?}", args.quant),
        "seed": args.seed,
        "bytes": bytes,
        "seconds": started.elapsed().as_secs_f64(),
    }));
    Ok(())
}
