//! The HTTP usage API (axum): tenants read their own usage and invoices with their API key,
//! admins read every tenant and the platform view.
//!
//! Routes (all `GET`, `Authorization: Bearer <key>`):
//! - `/v1/usage?month=2026-11[&tenant=T][&format=json|csv]`: the usage report.
//! - `/v1/invoices/{month}[?tenant=T][&format=json|csv]`: the issued invoice, else a draft.
//! - `/v1/admin/platform?month=2026-11`: the platform view (admin only, JSON).
//! - `/health`: liveness, no key.
//!
//! `tenant` defaults to the key's own tenant. Errors use OpenAI's body
//! (`{"error":{"message","type","param","code"}}`): 401 for a missing, unknown or revoked
//! key, 403 for another tenant's data or an admin route with a tenant key, 400 for a bad
//! month, format or query, 503 while the ledger is unreachable.

mod auth;
mod error;
mod params;
mod routes;

pub use auth::bearer_token;
pub use error::HttpError;
pub use params::{parse_format, parse_month, target_tenant};
pub use routes::router;
