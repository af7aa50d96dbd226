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
    /// Benchmarks (decode speed, concurrency, prefix cache, memory bandwidth, ledger ingest).
    Bench(cli::bench::BenchArgs),
    /// The metering consumer (usage stream → ledger) and the usage API.
    Billing(cli::billing::BillingArgs),
    /// A tenant's monthly usage report or invoice from the ledger.
    Report(cli::report::ReportArgs),
    /// Replay a request trace through the autoscaling policy and the baselines; prints cost
    /// and latency side by side.
    Sim(Box<tidal_autoscaler::sim::SimArgs>),
    /// The Kubernetes controller: Models → Deployments, autoscaled on their queues.
    Controller(cli::controller::ControllerArgs),
    /// Print the `Model` CustomResourceDefinition (YAML).
    Crd(cli::crd::CrdArgs),
    /// The public OpenAI-compatible API: auth, limits, queueing, streaming, admin API.
    Gateway(cli::gateway::GatewayArgs),
    /// Tenants, API keys, budgets and rate limits in the ledger.
    Keys(cli::keys::KeysArgs),
    /// Publish, list and remove the models the gateway serves, without a controller.
    Models(cli::models::ModelsArgs),
    /// The whole platform in one process: API, queue, metering and workers that scale to
    /// zero. No Kubernetes, PostgreSQL or Redis needed.
    Up(cli::up::UpArgs),
    /// Models, workers, backlog and this month's usage of a running `tidal up`.
    Status(cli::status::StatusArgs),
}

fn main() -> anyhow::Result<()> {
    cli::logging::init();
    match Cli::parse().command {
        Command::Runtime(args) => cli::runtime::run(args),
        Command::Bench(args) => cli::bench::run(args),
        Command::Billing(args) => cli::billing::run(args),
        Command::Report(args) => cli::report::run(args),
        Command::Sim(args) => tidal_autoscaler::sim::run(&args).map(|_| ()),
        Command::Controller(args) => cli::controller::run(args),
        Command::Crd(args) => cli::crd::run(args),
        Command::Gateway(args) => cli::gateway::run(args),
        Command::Keys(args) => cli::keys::run(args),
        Command::Models(args) => cli::models::run(args),
        Command::Up(args) => cli::up::run(args),
        Command::Status(args) => cli::status::run(args),
    }
}
