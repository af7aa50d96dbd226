//! `tidal sim` without the CLI: `cargo run -p tidal-autoscaler --release --example sim -- --help`.

use clap::Parser;
use tidal_autoscaler::sim::SimArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    sim: SimArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tidal_autoscaler::sim::run(&cli.sim)?;
    Ok(())
}
