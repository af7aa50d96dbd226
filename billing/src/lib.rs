//! Metering and billing for Tidal: the exact per-token ledger, prices, budgets, reports and
//! invoices (design: "Metering and billing").
//!
//! - [`Ledger`]: one type over PostgreSQL and SQLite; idempotent batch ingest
//!   ([`Ledger::record_batch`]), tenants and API keys, budgets, price versions (with
//!   [`Ledger::reprice_unpriced`] for usage that came before its price), fleet usage,
//!   reports, invoices and the platform view.
//! - [`consumer`]: the metering loop over a [`consumer::UsageSource`] (ack after commit);
//!   [`queue_source::QueueSource`] is the source over the broker's usage stream (Redis
//!   Streams consumer group `billing`, or the in-process broker), [`memory_source`] a
//!   self-contained one for tests.
//! - [`http`]: the usage API (axum): tenants read their own usage and invoices with their
//!   API key, admins every tenant and the platform view. `tidal billing` serves it next to
//!   the consumer.
//! - Pure logic with its own tests: [`money`] (units and the rounding rule), [`price`],
//!   [`usage`], [`report`](mod@report), [`invoice`](mod@invoice), [`platform`], [`access`], [`keys`].
//! - [`bench::bench_ingest`] for `tidal bench billing`; [`bench_stream::bench_stream_ingest`]
//!   for the whole path (usage stream → consumer → ledger → ack).

pub mod access;
pub mod bench;
pub mod bench_stream;
pub mod consumer;
pub mod error;
pub mod http;
pub mod invoice;
pub mod keys;
pub mod ledger;
pub mod memory_source;
pub mod money;
pub mod period;
pub mod platform;
pub mod price;
pub mod queue_source;
pub mod report;
pub mod scratch;
pub mod usage;

pub use access::{Principal, Role};
pub use error::{Error, Result};
pub use invoice::{Invoice, InvoiceLine, InvoiceStatus};
pub use ledger::{
    BudgetStatus, FleetUsage, HoldOutcome, HoldRequest, IngestOutcome, IssuedKey, KeyInfo, Ledger,
    LedgerOptions, Tenant,
};
pub use money::TokenKind;
pub use period::{Month, Period};
pub use platform::PlatformReport;
pub use price::{PriceVersion, Prices};
pub use report::{UsageReport, UsageRow};
pub use usage::{CapacityType, UsageRecord};

use chrono::{DateTime, Utc};

/// Output format of [`report()`] and [`invoice()`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Pretty JSON.
    Json,
    /// CSV with a header row.
    Csv,
}

/// `tidal report --tenant T --month M [--format csv]`: the tenant's usage report for the
/// month, rendered. The CLI runs as the operator ([`Principal::operator`]).
pub async fn report(
    ledger: &Ledger,
    principal: &Principal,
    tenant: &str,
    month: Month,
    format: Format,
) -> Result<String> {
    let r = ledger.report(principal, tenant, month.period()).await?;
    match format {
        Format::Json => report::render_json(&r),
        Format::Csv => report::render_csv(&r),
    }
}

/// The tenant's invoice for `month`, rendered: the issued one if it exists, else a draft;
/// with `issue_at`, issues it first (admin only; the month must be over at that time).
pub async fn invoice(
    ledger: &Ledger,
    principal: &Principal,
    tenant: &str,
    month: Month,
    issue_at: Option<DateTime<Utc>>,
    format: Format,
) -> Result<String> {
    let inv = match issue_at {
        Some(now) => ledger.issue_invoice(principal, tenant, month, now).await?,
        None => ledger.invoice(principal, tenant, month).await?,
    };
    match format {
        Format::Json => invoice::render_json(&inv),
        Format::Csv => invoice::render_csv(&inv),
    }
}
