//! `tidal report`: a tenant's monthly usage report or invoice from the ledger.

use anyhow::Context;
use clap::{Args, ValueEnum};
use tidal_billing::{Format, Ledger, Month, Principal};

/// Output format.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    /// The report as JSON.
    Json,
    /// The report's lines as CSV.
    Csv,
}

/// Flags of `tidal report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Ledger database: `postgres://...` or `sqlite:PATH` (default: the ledger of `tidal up`
    /// in its data directory).
    #[arg(long, env = "TIDAL_DATABASE_URL")]
    pub database: Option<String>,
    /// Tenant id (default: `local`, the tenant `tidal up` creates).
    #[arg(long, default_value = tidal_local::credentials::LOCAL_TENANT)]
    pub tenant: String,
    /// Calendar month, e.g. 2026-11 (default: this month, UTC).
    #[arg(long)]
    pub month: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "json")]
    pub format: OutputFormat,
    /// Print the month's invoice (the issued one, or a draft) instead of the usage report.
    #[arg(long)]
    pub invoice: bool,
}

/// Prints the report.
pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let month = match &args.month {
        Some(m) => Month::parse(m).with_context(|| format!("--month {m}"))?,
        None => Month::of_instant(chrono::Utc::now()),
    };
    let database = args.database.clone().unwrap_or_else(|| {
        tidal_local::paths::local_ledger_url(&tidal_local::paths::default_data_dir())
    });
    let format = match args.format {
        OutputFormat::Json => Format::Json,
        OutputFormat::Csv => Format::Csv,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    let text = runtime.block_on(async {
        let ledger = Ledger::connect(&database)
            .await
            .with_context(|| format!("opening ledger {database}"))?;
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
