//! API-key authentication of HTTP requests.

use axum::http::{header, HeaderMap};

use super::error::HttpError;
use crate::access::Principal;
use crate::ledger::Ledger;

/// The key of an `Authorization: Bearer <key>` header value (pure). The scheme is matched
/// case-insensitively, as RFC 7235 asks; an empty key counts as none.
pub fn bearer_token(value: Option<&str>) -> Option<&str> {
    let value = value?.trim();
    let (scheme, rest) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let key = rest.trim();
    (!key.is_empty()).then_some(key)
}

/// The principal of the request's key, or 401.
pub(crate) async fn authenticate(
    ledger: &Ledger,
    headers: &HeaderMap,
) -> Result<Principal, HttpError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let Some(key) = bearer_token(value) else {
        metrics::counter!("tidal_billing_http_auth_failures_total", "reason" => "missing")
            .increment(1);
        return Err(HttpError::unauthorized(
            "Missing API key: pass it as `Authorization: Bearer <key>`.",
        ));
    };
    match ledger.authenticate(key).await? {
        Some(p) => Ok(p),
        None => {
            metrics::counter!("tidal_billing_http_auth_failures_total", "reason" => "invalid")
                .increment(1);
            Err(HttpError::unauthorized(
                "Incorrect or revoked API key provided.",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_forms() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("BEARER abc")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(Some("Bearer")), None);
        assert_eq!(bearer_token(Some("abc")), None);
        assert_eq!(bearer_token(Some("")), None);
        assert_eq!(bearer_token(None), None);
    }
}
