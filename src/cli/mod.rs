//! One module per subcommand; shared flag groups and parsing helpers. [`Cli`] is the whole
//! command line, [`run`] dispatches a parsed one to its subcommand.

pub mod bench;
pub mod bench_fixture;
pub mod bench_profile;
pub mod bench_speculative;
pub mod bench_swap;
pub mod billing;
pub mod controller;
pub mod crd;
pub mod engine_args;
pub mod gateway;
pub mod keys;
pub mod logging;
pub mod models;
pub mod quantize;
pub mod report;
pub mod runtime;
pub mod signals;
pub mod status;
pub mod up;

use clap::{Parser, Subcommand};

/// Tidal: serverless elastic LLM inference.
#[derive(Parser)]
#[command(name = "tidal", version, about)]
pub struct Cli {
    /// The role to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands, one per role.
#[derive(Subcommand)]
pub enum Command {
    /// Serve one GGUF model: OpenAI-compatible HTTP server with continuous batching.
    Runtime(Box<runtime::RuntimeArgs>),
    /// Benchmarks (decode speed, concurrency, prefix cache, memory bandwidth, ledger ingest).
    Bench(bench::BenchArgs),
    /// The metering consumer (usage stream → ledger) and the usage API.
    Billing(billing::BillingArgs),
    /// A tenant's monthly usage report or invoice from the ledger.
    Report(report::ReportArgs),
    /// Replay a request trace through the autoscaling policy and the baselines; prints cost
    /// and latency side by side.
    Sim(Box<tidal_autoscaler::sim::SimArgs>),
    /// The Kubernetes controller: Models → Deployments, autoscaled on their queues.
    Controller(controller::ControllerArgs),
    /// Print the `Model` (or with `--pool` the `ModelPool`) CustomResourceDefinition (YAML).
    Crd(crd::CrdArgs),
    /// The public OpenAI-compatible API: auth, limits, queueing, streaming, admin API.
    Gateway(gateway::GatewayArgs),
    /// Tenants, API keys, budgets and rate limits in the ledger.
    Keys(keys::KeysArgs),
    /// Publish, list and remove the models the gateway serves, without a controller.
    Models(models::ModelsArgs),
    /// Write a GGUF file in one of llama.cpp's quantisation mixes (q4_k_m, q6_k, ...).
    Quantize(quantize::QuantizeArgs),
    /// The whole platform in one process: API, queue, metering and workers that scale to
    /// zero. No Kubernetes, PostgreSQL or Redis needed.
    Up(up::UpArgs),
    /// Models, workers, backlog and this month's usage of a running `tidal up`.
    Status(status::StatusArgs),
}

/// Runs the parsed command line's subcommand.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Runtime(args) => runtime::run(*args),
        Command::Bench(args) => bench::run(args),
        Command::Billing(args) => billing::run(args),
        Command::Report(args) => report::run(args),
        Command::Sim(args) => tidal_autoscaler::sim::run(&args).map(|_| ()),
        Command::Controller(args) => controller::run(args),
        Command::Crd(args) => crd::run(args),
        Command::Gateway(args) => gateway::run(args),
        Command::Keys(args) => keys::run(args),
        Command::Models(args) => models::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Up(args) => up::run(args),
        Command::Status(args) => status::run(args),
    }
}
