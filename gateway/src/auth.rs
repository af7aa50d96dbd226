//! Who is calling: tenant API keys (through the ledger, briefly cached) and the admin token.
//!
//! Keys are verified by [`tidal_billing::Ledger::authenticate`] (stored as SHA-256, compared
//! in constant time). A verified key is remembered under the SHA-256 of the presented secret
//! ([`crate::cache::KeyCache`]), so the hot path usually skips the database:
//!
//! - fresh (checked less than `cache_ttl` ago): used without asking the ledger;
//! - otherwise the ledger is asked; if it refuses the key (unknown, revoked), the key is
//!   forgotten for good; revoking through this gateway's admin API forgets it at once;
//! - if the ledger cannot be asked (breaker open, error, `ledger_timeout`), the key is used
//!   only if its last successful check began less than `max_stale` ago, else 503. Never
//!   fails open: a key never seen valid, or refused since, gets 401 or 503, never 200.

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tidal_billing::http::bearer_token;
use tidal_billing::Principal;
use tidal_protocol::ApiError;

use crate::breaker::LedgerFault;
use crate::cache::KeyDigest;
use crate::error::{ledger_unavailable, Reject};
use crate::gateway::Shared;

fn presented(headers: &HeaderMap) -> Option<&str> {
    bearer_token(
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
}

/// The principal of the request's API key, or 401.
pub(crate) async fn principal(shared: &Shared, headers: &HeaderMap) -> Result<Principal, Reject> {
    let Some(key) = presented(headers) else {
        return Err(ApiError::unauthorized(
            "Missing API key: pass it as `Authorization: Bearer <key>`.",
        )
        .into());
    };
    let digest: KeyDigest = Sha256::digest(key.as_bytes()).into();
    if let Some(p) = shared.keys.fresh(&digest) {
        return Ok(p);
    }
    let check = shared.keys.begin(digest);
    match shared.ask_ledger(shared.ledger.authenticate(key)).await {
        Ok(Some(p)) => {
            check.valid(p.clone());
            Ok(p)
        }
        Ok(None) => {
            check.refused();
            Err(ApiError::unauthorized("Incorrect or revoked API key provided.").into())
        }
        // The ledger cannot be asked: a key verified recently enough keeps working meanwhile.
        Err(LedgerFault::Unavailable) => shared.keys.stale(&digest).ok_or_else(ledger_unavailable),
        Err(LedgerFault::Failed(e)) => Err(e.into()),
    }
}

/// Checks the admin token: 403 when the admin API is disabled, 401 when the token is
/// missing or wrong. Compared as SHA-256 digests in constant time (length leaks nothing).
pub(crate) fn admin(shared: &Shared, headers: &HeaderMap) -> Result<(), Reject> {
    let Some(expected) = shared.config.admin_token.as_deref() else {
        return Err(ApiError::forbidden(
            "The admin API is disabled on this gateway (no admin token configured).",
        )
        .into());
    };
    let Some(given) = presented(headers) else {
        return Err(ApiError::unauthorized(
            "Missing admin token: pass it as `Authorization: Bearer <token>`.",
        )
        .into());
    };
    let a: [u8; 32] = Sha256::digest(expected.as_bytes()).into();
    let b: [u8; 32] = Sha256::digest(given.as_bytes()).into();
    if bool::from(a.ct_eq(&b)) {
        Ok(())
    } else {
        Err(ApiError::unauthorized("Incorrect admin token provided.").into())
    }
}
