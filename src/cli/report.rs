//! `tidal report`: a tenant's monthly usage report or invoice from the ledger.

use anyhow::Context;
use clap::{Args, ValueEnum};
use tidal_billing::{Format, Ledger, Month, Principal};

/// Output format.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Json,
    Csv,
}

/// Flags of `tidal report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Ledger database: `postgres://...` or `sqlite:PATH`.
    #[arg(long, env = "TIDAL_DATABASE_URL")]
    pub database: String,
    /// Tenant id.
    #[arg(long)]
    pub tenant: String,
    /// Calendar month, e.g. 2026-11.
    #[arg(long)]
    pub month: String,
    #[arg(long, value_enum, default_value = "json")]
    pub format: OutputFormat,
    /// Print the month's invoice (the issued one, or a draft) instead of the usage report.
    #[arg(long)]
    pub invoice: bool,
}

/// Prints the report.
pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let month = Month::parse(&args.month).with_context(|| format!("--month {}", args.month))?;
    let format = match args.format {
        OutputFormat::Json => Format::Json,
        OutputFormat::Csv => Format::Csv,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    let text = runtime.block_on(async {
        let ledger = Ledger::connect(&args.database)
            .await
            .with_context(|| format!("opening ledger {}", args.database))?;
        // The CLI runs with the operator's rights: whoever can open the database reads it all.
        let principal = Principal::operator();
        let text = if args.invoice {
            tidal_billing::invoice(&ledger, &principal, &args.tenant, month, None, format).await?
        } else {
            tidal_billing::report(&ledger, &principal, &args.tenant, month, format).await?
        };
        anyhow::Ok(text)
    })?;
    println!("{text}");
    Ok(())
}
