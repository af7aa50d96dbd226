use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tidal_protocol::ApiError;

/// An [`ApiError`] as an axum response.
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::warn!(status = self.0.status, message = %self.0.message, "request failed");
        }
        (status, Json(self.0.body())).into_response()
    }
}
