//! Who is calling: tenant API keys (through the ledger, briefly cached) and the admin token.
//!
//! Keys are verified by [`tidal_billing::Ledger::authenticate`] (stored as SHA-256, compared
//! in constant time). A verified key is remembered for `cache_ttl` under the SHA-256 of the
//! presented secret, so the hot path usually skips the database; revoking a key through this
//! gateway's admin API forgets every cached key at once.

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tidal_billing::http::bearer_token;
use tidal_billing::Principal;
use tidal_protocol::ApiError;

use crate::error::Reject;
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
    let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    if let Some(p) = shared.keys.fresh(&digest) {
        return Ok(p);
    }
    match shared.ledger.authenticate(key).await {
        Ok(Some(p)) => {
            shared.keys.put(digest, p.clone());
            Ok(p)
        }
        Ok(None) => Err(ApiError::unauthorized("Incorrect or revoked API key provided.").into()),
        Err(e) if e.is_transient() => match shared.keys.stale(&digest) {
            // The ledger is down: a key verified before keeps working meanwhile.
            Some(p) => Ok(p),
            None => Err(e.into()),
        },
        Err(e) => Err(e.into()),
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
