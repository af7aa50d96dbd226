//! Ledger errors as HTTP responses with OpenAI-style bodies.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tidal_protocol::ApiError;

use crate::error::Error;

/// An HTTP error response (wraps [`ApiError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError(pub ApiError);

impl HttpError {
    /// 401: missing, unknown or revoked key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        HttpError(ApiError::unauthorized(message))
    }

    /// 403: the key may not read this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        HttpError(ApiError::forbidden(message))
    }

    /// 400 about one query or path parameter.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        HttpError(ApiError::invalid(param, message))
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.0.status
    }
}

impl From<Error> for HttpError {
    fn from(e: Error) -> Self {
        match e {
            Error::Forbidden(m) => HttpError::forbidden(m),
            Error::Invalid(m) => HttpError(ApiError::bad_request(m)),
            Error::Conflict(m) => HttpError(ApiError::new(409, Some("conflict".into()), None, m)),
            Error::NotFound(m) => {
                HttpError(ApiError::not_found("not_found", format!("not found: {m}")))
            }
            e if e.is_transient() => {
                tracing::warn!(error = %e, "ledger unavailable");
                HttpError(ApiError::unavailable(
                    "The ledger is unavailable; retry later.",
                ))
            }
            e => {
                tracing::error!(error = %e, "usage API failure");
                HttpError(ApiError::internal("Internal error reading the ledger."))
            }
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.0.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_errors_map_to_statuses() {
        let s = |e: Error| HttpError::from(e).status();
        assert_eq!(s(Error::Forbidden("x".into())), 403);
        assert_eq!(s(Error::Invalid("x".into())), 400);
        assert_eq!(s(Error::Conflict("x".into())), 409);
        assert_eq!(s(Error::NotFound("x".into())), 404);
        assert_eq!(s(Error::Database(sqlx::Error::PoolTimedOut)), 503);
        assert_eq!(s(Error::Corrupt("x".into())), 500);
        assert_eq!(s(Error::Overflow("x")), 500);
    }

    #[test]
    fn bodies_are_openai_shaped() {
        let b = HttpError::unauthorized("no").0.body();
        assert_eq!(b["error"]["message"], "no");
        assert_eq!(b["error"]["type"], "authentication_error");
        assert_eq!(b["error"]["code"], "invalid_api_key");
        assert!(b["error"]["param"].is_null());
        let b = HttpError::invalid("month", "bad").0.body();
        assert_eq!(b["error"]["param"], "month");
        assert_eq!(b["error"]["type"], "invalid_request_error");
    }
}
