//! `/health`, `/metrics` and `/openapi.json` (no key needed).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tidal_protocol::ApiError;

use crate::error::Reject;
use crate::gateway::Shared;

/// Liveness: the process serves HTTP.
pub(super) async fn health() -> Response {
    Json(serde_json::json!({"status": "ok"})).into_response()
}

/// Prometheus text format.
pub(super) async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    match &shared.config.prometheus {
        Some(h) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            h.render(),
        )
            .into_response(),
        None => Reject::from(ApiError::not_found(
            "metrics_disabled",
            "metrics are not enabled in this process",
        ))
        .into_response(),
    }
}

/// The OpenAPI document of the public API.
pub(super) async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::OPENAPI_JSON,
    )
        .into_response()
}
