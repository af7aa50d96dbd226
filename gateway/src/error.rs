//! Refusals as HTTP responses: an OpenAI error body, the status, and `Retry-After` where the
//! client should come back later (429, 503).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tidal_protocol::ApiError;

use crate::metrics;

/// An error response of the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// Status and body.
    pub error: ApiError,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

impl Reject {
    /// A refusal with `Retry-After: secs`.
    pub fn retry(error: ApiError, secs: u64) -> Self {
        Reject {
            error,
            retry_after: Some(secs.max(1)),
        }
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        self.error.status
    }
}

impl From<ApiError> for Reject {
    fn from(error: ApiError) -> Self {
        Reject {
            error,
            retry_after: None,
        }
    }
}

/// 503 + `Retry-After` when the ledger cannot be asked and no bounded cache entry answers.
pub(crate) fn ledger_unavailable() -> Reject {
    Reject::retry(
        ApiError::unavailable("The ledger is unavailable; retry later."),
        1,
    )
}

impl From<tidal_billing::Error> for Reject {
    fn from(e: tidal_billing::Error) -> Self {
        use tidal_billing::Error as E;
        match e {
            E::Invalid(m) => ApiError::bad_request(m).into(),
            E::Conflict(m) => ApiError::new(409, Some("conflict".into()), None, m).into(),
            E::NotFound(m) => ApiError::not_found("not_found", format!("not found: {m}")).into(),
            E::Forbidden(m) => ApiError::forbidden(m).into(),
            e if e.is_transient() => {
                tracing::warn!(error = %e, "ledger unavailable");
                ledger_unavailable()
            }
            e => {
                tracing::error!(error = %e, "ledger failure");
                ApiError::internal("Internal error in the ledger.").into()
            }
        }
    }
}

impl From<tidal_queue::QueueError> for Reject {
    fn from(e: tidal_queue::QueueError) -> Self {
        tracing::warn!(error = %e, "queue unavailable");
        Reject::retry(
            ApiError::unavailable("The request queue is unavailable; retry later."),
            1,
        )
    }
}

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        metrics::error(&self.error);
        let status = StatusCode::from_u16(self.error.status).unwrap_or(StatusCode::BAD_REQUEST);
        let mut resp = (status, Json(self.error.body())).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_errors_map_to_client_or_retry_statuses() {
        use tidal_billing::Error as E;
        let s = |e: E| Reject::from(e);
        assert_eq!(s(E::Invalid("x".into())).status(), 400);
        assert_eq!(s(E::Conflict("x".into())).status(), 409);
        assert_eq!(s(E::NotFound("x".into())).status(), 404);
        assert_eq!(s(E::Forbidden("x".into())).status(), 403);
        assert_eq!(s(E::Corrupt("x".into())).status(), 500);
    }

    #[test]
    fn retry_after_header_is_set() {
        let r = Reject::retry(ApiError::rate_limited("slow down"), 7).into_response();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "7");
        let r = Reject::from(ApiError::bad_request("x")).into_response();
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }
}
