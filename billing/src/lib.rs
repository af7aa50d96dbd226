//! Metering: the per-token ledger, prices, reports and invoices.
