//! `tidal`: one binary, many roles. This file only parses the command line and dispatches.

use clap::Parser;
use tidal::cli::{self, Cli};

fn main() -> anyhow::Result<()> {
    cli::logging::init();
    cli::run(Cli::parse())
}
