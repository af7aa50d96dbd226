//! `tidal`: one binary, many roles. This file only parses the command line and dispatches.

mod cli;

use clap::{Parser, Subcommand};

/// Tidal: serverless elastic LLM inference.
#[derive(Parser)]
#[command(name = "tidal", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve one GGUF model: OpenAI-compatible HTTP server with continuous batching.
    Runtime(cli::runtime::RuntimeArgs),
    /// Benchmarks (decode speed, concurrency, prefix cache, memory bandwidth).
    Bench(cli::bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    cli::logging::init();
    match Cli::parse().command {
        Command::Runtime(args) => cli::runtime::run(args),
        Command::Bench(args) => cli::bench::run(args),
    }
}
